"""serve-full's flow without Docker: refusal order, GPU memory, redaction, the snapshot re-check, start paths.

The fake :class:`~bless.runtime.base.Runtime` (``tests.support.fakes.FakeRuntime``) records the calls made,
so each refusal can be shown to happen before anything is created. A real store holds real published
blessings (small trees). The start tests run a ``tests.support.fakes.FakeEngineServer`` as the "engine" (an
OpenAI-style /v1 subset) and point the runtime's containers at it.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bless import container_labels as labels
from bless.cli.error_hints import command_line_hint
from bless.core.factors import REDACTED, GpuInfo
from bless.core.manifest import Manifest
from bless.core.profile import HardwareSpec, Profile, profile_from_dict
from bless.engines.base import ENGINE_HOME, ENGINE_TMP, EnvPolicy
from bless.engines.reference import ReferenceAdapter
from bless.engines.reference_engine import markers
from bless.errors import (
    BlessError,
    CacheChangedError,
    CacheNotUsedError,
    CanaryFailedError,
    ContainerConflictError,
    EngineFailedError,
    ExitCode,
    ImageMissingError,
    InsufficientGpuError,
    RuntimeUnavailableError,
    StoreUnavailableError,
    UnknownEngineVersionError,
)
from bless.evidence_types import UpperEntry
from bless.flows import serve
from bless.flows.events import Event
from bless.flows.serve import Snapshot, Stamp, check_gpu_memory, describe_change
from bless.runtime.base import ContainerSpec, ContainerStop, Started
from bless.store import Store
from bless.system.trees import remove_tree
from tests.support.fakes import (
    ARTIFACT_KEY,
    IMAGE,
    IMAGE_ID,
    Behavior,
    FakeEngineServer,
    FakeRuntime,
    UnknownVersionAdapter,
    openai_engine,
)
from tests.unit.store_helpers import make_manifest, write_tree

FORMER_OVERRIDE = "BLESS_ALLOW_UNSAFE_ENV_FOR_TESTS"
GIB = 1024
H100 = GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 80 * GIB, 70 * GIB)


def serving_runtime(
    *, reachable: bool = True, images: Mapping[str, str] | None = None, host_port: int | None = None
) -> FakeRuntime:
    """The fake runtime of serve-full's plan and start, which never clean up containers (only stop does)."""
    return FakeRuntime(
        reachable=reachable,
        images=images,
        host_port=host_port,
        forbidden={"cleanup_ours": "serve-full never cleans up containers"},
    )


def serve_labels(profile: str = "unit", root: Path | None = None) -> dict[str, str]:
    """The labels of a serve container of ours for ``profile`` (one that was running before the test).

    ``root``: the store root that started it (None: one from before serves recorded their root)."""
    return labels.labels_for(
        run_id="serve-before", phase=labels.PHASE_SERVE, config_hash="0" * 64, profile=profile, store_root=root
    )


def make_profile(
    *,
    accelerator: str = "cpu",
    env: Mapping[str, str] | None = None,
    min_gib: float | None = None,
    layers: int = 2,
    image: str = IMAGE,
    port: int = 18000,
) -> Profile:
    hardware: dict[str, Any] = {"accelerator": accelerator}
    if min_gib is not None:
        hardware["min_gpu_memory_gib"] = min_gib
    document = {
        "profile_version": 1,
        "name": "unit",
        "engine": {"name": "reference"},
        "runtime": {"kind": "docker", "image": image},
        "model": {"source": "builtin", "id": "reference-tiny"},
        "serve": {"layers": layers},
        "env": dict(env or {}),
        "hardware": hardware,
        "trials": {"ready_timeout_s": 10, "request_timeout_s": 5, "stop_timeout_s": 5},
        "serving": {"host": "127.0.0.1", "port": port},
    }
    return profile_from_dict(document)


def do_plan(profile: Profile, store: Store, runtime: FakeRuntime, **kwargs: Any) -> serve.LaunchPlan:
    return serve.plan(
        profile, store=store, runtime=runtime, adapter=ReferenceAdapter(), gpu_probe=lambda: [H100], **kwargs
    )


def bless(store: Store, profile: Profile, work: Path, golden: Sequence[Mapping[str, Any]] | None = None) -> Manifest:
    """Publish a real blessing whose factors are what ``profile`` resolves to through the fake runtime."""
    resolved = do_plan(profile, store, serving_runtime(), debug=True).resolved
    tree = write_tree(work / f"tree-{resolved.config_hash[:8]}")
    manifest = make_manifest(tree, resolved.factors)
    # What a real reference bootstrap records: the engine's artifact key, checked against its serve-time log.
    manifest = Manifest(
        **{
            **manifest.__dict__,
            "artifacts": {"items": ["artifact.bin"], "engine_keys": {"artifact_keys": [ARTIFACT_KEY]}},
        }
    )
    if golden is not None:
        manifest = Manifest(**{**manifest.__dict__, "golden": list(golden)})
    store.publish(tree, manifest)
    return manifest


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "root")


def code_of(excinfo: pytest.ExceptionInfo[BlessError]) -> int:
    return int(excinfo.value.exit_code)


# --------------------------------------------------------------------------------------------- order


def test_refusals_happen_in_order_and_never_create_anything(store: Store, tmp_path: Path) -> None:
    """Each refusal wins over every later one, and none of them starts a container."""
    # Everything wrong at once: unreachable runtime, no image, too little GPU memory, unsafe env,
    # a foreign container on the name, no blessing. Fix one at a time; the next refusal shows.
    unsafe = make_profile(accelerator="cuda", min_gib=100, env={"TORCH_LOGS": "+dynamo"})
    runtime = serving_runtime(reachable=False, images={})
    name = serve.serve_container_name("unit", per_root=store.root)
    foreign = runtime.plant(name, {})  # no labels: not ours
    with pytest.raises(RuntimeUnavailableError) as excinfo:
        do_plan(unsafe, store, runtime)
    assert code_of(excinfo) == 50 and runtime.calls == ["ping"]

    runtime.reachable = True
    with pytest.raises(ImageMissingError) as excinfo2:
        do_plan(unsafe, store, runtime)
    assert code_of(excinfo2) == 51 and "name_holder" not in runtime.calls

    runtime.images = {IMAGE: IMAGE_ID}
    with pytest.raises(InsufficientGpuError) as excinfo3:
        do_plan(unsafe, store, runtime)
    assert code_of(excinfo3) == 52 and "name_holder" not in runtime.calls

    enough = make_profile(accelerator="cuda", min_gib=40, env={"TORCH_LOGS": "+dynamo"})
    with pytest.raises(BlessError) as excinfo4:
        do_plan(enough, store, runtime)
    assert code_of(excinfo4) == ExitCode.UNSAFE_ENV and "TORCH_LOGS" in excinfo4.value.message
    assert "name_holder" not in runtime.calls

    clean = make_profile(accelerator="cuda", min_gib=40)
    with pytest.raises(ContainerConflictError) as excinfo5:
        do_plan(clean, store, runtime)
    assert "without our labels" in excinfo5.value.message and "never touched" in excinfo5.value.message

    foreign.removed = True  # its owner removed it; a serve of ours holds the name now
    ours = runtime.plant(name, serve_labels(root=store.root))
    with pytest.raises(ContainerConflictError) as excinfo6:
        do_plan(clean, store, runtime)
    assert "already running" in excinfo6.value.message

    ours.removed = True
    with pytest.raises(BlessError) as excinfo7:
        do_plan(clean, store, runtime)
    assert code_of(excinfo7) == ExitCode.NO_MANIFEST
    assert "start" not in runtime.calls


def test_no_manifest_names_the_drifted_factor(store: Store, tmp_path: Path) -> None:
    bless(store, make_profile(layers=2), tmp_path)
    with pytest.raises(BlessError) as excinfo:
        do_plan(make_profile(layers=3), store, serving_runtime())
    assert code_of(excinfo) == ExitCode.NO_MANIFEST
    assert "serve.layers: 2 -> 3" in excinfo.value.message


def test_invalid_and_duplicate_manifests_refuse(store: Store, tmp_path: Path) -> None:
    profile = make_profile()
    manifest = bless(store, profile, tmp_path)
    live = store.manifests_dir / f"{manifest.config_hash}.json"
    duplicate = store.manifests_dir / "copy.json"
    duplicate.write_bytes(live.read_bytes())
    with pytest.raises(BlessError) as excinfo:
        do_plan(profile, store, serving_runtime())
    assert code_of(excinfo) == ExitCode.MANIFEST_DUPLICATE
    duplicate.write_text("{ not json")
    with pytest.raises(BlessError) as excinfo2:
        do_plan(profile, store, serving_runtime())
    assert code_of(excinfo2) == ExitCode.MANIFEST_INVALID


def test_verify_failure_names_the_file_and_how(store: Store, tmp_path: Path) -> None:
    profile = make_profile()
    manifest = bless(store, profile, tmp_path)
    target = store.blessed_dir(manifest) / "nested" / "index.json"
    target.chmod(0o644)
    target.write_text('{"variant": "b"}\n')  # same size, other bytes
    runtime = serving_runtime()
    with pytest.raises(BlessError) as excinfo:
        do_plan(profile, store, runtime)
    assert code_of(excinfo) == ExitCode.VERIFY_FAILED
    assert "nested/index.json (sha256" in excinfo.value.message
    assert "start" not in runtime.calls


def test_debug_needs_no_manifest_and_mounts_no_cache(store: Store) -> None:
    profile = make_profile(env={"TORCH_LOGS": "+dynamo"})  # unsafe: allowed in a debug start, and said so
    plan = do_plan(profile, store, serving_runtime(), debug=True)
    # No cache: only the engine's own fresh HOME and temp dir, as at every start.
    assert plan.mount is None
    assert [(m.kind, m.target) for m in plan.spec.mounts] == [("private", ENGINE_HOME), ("private", ENGINE_TMP)]
    assert "--no-compile" in plan.spec.command
    data = plan.to_dict()
    assert data["blessed"] is False and data["banner"] == serve.DEBUG_BANNER
    assert data["manifest_path"] is None and any("TORCH_LOGS" in w for w in data["warnings"])


def test_plan_of_a_blessing(store: Store, tmp_path: Path) -> None:
    profile = make_profile(port=18123)
    manifest = bless(store, profile, tmp_path)
    plan = do_plan(profile, store, serving_runtime())
    assert plan.config_hash == manifest.config_hash
    assert plan.mount is not None and plan.mount.kind == "overlay"
    assert plan.mount.source == store.blessed_dir(manifest)
    assert plan.mount.target == ReferenceAdapter.cache_mount_path
    assert plan.serve_dir.parent == store.root / "serve" and plan.serve_dir.name.startswith("unit-")
    assert not plan.serve_dir.exists(), "planning creates nothing"
    assert plan.spec.name == f"bless-serve-unit-{labels.store_tag(store.root)}" and plan.spec.image == IMAGE_ID
    assert plan.spec.host_port == 18123 and plan.spec.host_ip == "127.0.0.1"
    assert plan.spec.labels[labels.PHASE] == labels.PHASE_SERVE
    assert plan.spec.labels[labels.CONFIG_HASH] == manifest.config_hash
    assert plan.spec.env["HOME"] == ReferenceAdapter.home
    assert set(plan.timings) == {"preflight_s", "resolve_s", "verify_s"}
    json.dumps(plan.to_dict())  # JSON-ready


def test_unknown_engine_version_is_refused_unless_allowed_and_serving_forces_the_load(
    store: Store, tmp_path: Path
) -> None:
    profile = make_profile(port=18124)
    bless(store, profile, tmp_path)
    runtime = serving_runtime()
    plan_with = partial(serve.plan, profile, store=store, runtime=runtime, gpu_probe=lambda: [H100])
    with pytest.raises(UnknownEngineVersionError) as excinfo:
        plan_with(adapter=UnknownVersionAdapter())
    assert code_of(excinfo) == 33
    plan = plan_with(adapter=UnknownVersionAdapter(), allow_unknown_engine_version=True)
    assert plan.spec.env["FAKE_FORCE_LOAD"] == "1"
    debug = plan_with(adapter=UnknownVersionAdapter(), allow_unknown_engine_version=True, debug=True)
    assert "FAKE_FORCE_LOAD" not in debug.spec.env  # a debug start loads nothing


def test_ro_bind_when_the_profile_asks_and_the_adapter_allows(store: Store, tmp_path: Path) -> None:
    profile = make_profile()
    bless(store, profile, tmp_path)
    ro = Profile(**{**profile.__dict__, "cache_mount": "ro-bind"})
    plan = do_plan(ro, store, serving_runtime())
    assert plan.mount is not None and plan.mount.kind == "ro" and plan.mount.scratch is None


def test_unsafe_env_test_override(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profile = make_profile(env={"BLESS_REFERENCE_NONDETERMINISTIC": "1"})
    with pytest.raises(BlessError) as excinfo:
        do_plan(profile, store, serving_runtime())
    assert code_of(excinfo) == ExitCode.UNSAFE_ENV
    monkeypatch.setenv(FORMER_OVERRIDE, "1")  # no environment variable weakens a start
    with pytest.raises(BlessError) as still:
        do_plan(profile, store, serving_runtime())
    assert code_of(still) == ExitCode.UNSAFE_ENV
    with pytest.raises(BlessError) as excinfo2:  # allowed now: the next refusal is the missing blessing
        do_plan(profile, store, serving_runtime(), allow_test_knobs=True)
    assert code_of(excinfo2) == ExitCode.NO_MANIFEST
    debug_setting = make_profile(env={"TORCH_LOGS": "+dynamo"})
    with pytest.raises(BlessError) as never:  # the test seam lets test knobs through, nothing else
        do_plan(debug_setting, store, serving_runtime(), allow_test_knobs=True)
    assert code_of(never) == ExitCode.UNSAFE_ENV


# --------------------------------------------------------------------------------------------- GPU


def test_gpu_memory_refusal() -> None:
    spec = HardwareSpec(accelerator="cuda", gpu_count=2, min_gpu_memory_gib=40)
    busy = GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 80 * GIB, 12 * GIB, 3, "GPU-3")
    check_gpu_memory(spec, [H100, H100])
    with pytest.raises(InsufficientGpuError) as excinfo:
        check_gpu_memory(spec, [H100, busy])
    assert "rank 1 on GPU 3" in excinfo.value.message and "12.0 GiB free" in excinfo.value.message
    assert excinfo.value.exit_code == ExitCode.INSUFFICIENT_GPU
    with pytest.raises(InsufficientGpuError, match="has 1 GPU"):
        check_gpu_memory(spec, [H100])
    # No stated need, or a CPU profile: nothing to check.
    check_gpu_memory(HardwareSpec(accelerator="cuda"), [])
    check_gpu_memory(HardwareSpec(accelerator="cpu", min_gpu_memory_gib=1000), [])


def test_gpu_memory_refusal_through_the_planner(store: Store) -> None:
    profile = make_profile(accelerator="cuda", min_gib=75)
    runtime = serving_runtime()
    with pytest.raises(InsufficientGpuError):
        do_plan(profile, store, runtime)
    assert "name_holder" not in runtime.calls and "start" not in runtime.calls


# --------------------------------------------------------------------------------------------- redaction


def test_secrets_are_redacted_in_the_plan_but_reach_the_engine(store: Store) -> None:
    profile = make_profile(env={"HF_TOKEN": "hf_very_secret", "MY_API_KEY": "k-123", "PLAIN": "visible"})
    plan = do_plan(profile, store, serving_runtime(), debug=True)
    data = plan.to_dict()
    env = data["container"]["env"]
    assert env["HF_TOKEN"] == REDACTED and env["MY_API_KEY"] == REDACTED and env["PLAIN"] == "visible"
    text = json.dumps(data)
    assert "hf_very_secret" not in text and "k-123" not in text
    assert plan.spec.env["HF_TOKEN"] == "hf_very_secret"


# --------------------------------------------------------------------------------------------- snapshot


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = write_tree(tmp_path / "t")
    return root


def _snapshot(tree: Path) -> Snapshot:
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
    dirs = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_dir())
    return Snapshot.take(tree, files, dirs)


def test_snapshot_unchanged(tree: Path) -> None:
    snap = _snapshot(tree)
    (tree / "artifact.bin").read_bytes()  # reading changes nothing we look at
    assert snap.changes() == []


def test_a_snapshot_of_entries_it_cannot_stat_is_taken_and_reads_them_as_absent(tree: Path) -> None:
    """A link loop or a directory it may not search is no servable entry: no crash (the verification after
    the snapshot names it, exit 21), and the stamp cannot match a readable entry later."""

    def lstat(path: Path) -> os.stat_result:
        if path.name == "artifact.bin":
            raise OSError(errno.ELOOP, "Too many levels of symbolic links", str(path))
        if path.name == "nested":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return os.lstat(path)

    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
    dirs = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_dir())
    snap = Snapshot.take(tree, files, dirs, lstat)
    absent = {stamp.path for stamp in snap.stamps if stamp.ino is None}
    assert {"artifact.bin", "nested"} <= absent
    assert _changes(snap)["artifact.bin"] == "appeared after the snapshot"


def _changes(snap: Snapshot) -> dict[str, str]:
    return {change.path: change.detail for change in snap.changes()}


def test_snapshot_sees_truncation(tree: Path) -> None:
    snap = _snapshot(tree)
    with (tree / "artifact.bin").open("r+b") as handle:
        handle.truncate(10)
    assert "size" in _changes(snap)["artifact.bin"]


def test_snapshot_sees_a_rewrite_with_the_mtime_put_back(tree: Path) -> None:
    target = tree / "nested" / "deep" / "kernel.so"
    snap = _snapshot(tree)
    st = target.stat()
    time.sleep(0.01)
    target.write_bytes(b"b" * st.st_size)  # same size
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime restored: only ctime tells
    assert "ctime" in _changes(snap)["nested/deep/kernel.so"]


def test_snapshot_sees_a_swap_by_rename(tree: Path) -> None:
    snap = _snapshot(tree)
    replacement = tree.parent / "swap"
    replacement.write_bytes((tree / "artifact.bin").read_bytes())
    os.replace(replacement, tree / "artifact.bin")
    changes = _changes(snap)
    assert "inode" in changes["artifact.bin"]
    assert "." in changes  # the root directory's entries changed too


def test_snapshot_sees_a_symlink_an_extra_file_a_deletion_and_a_chmod(tree: Path) -> None:
    snap = _snapshot(tree)
    (tree / "nested" / "index.json").unlink()
    (tree / "nested" / "index.json").symlink_to("/etc/hostname")
    (tree / "empty" / "extra").write_text("x")
    (tree / "nested" / "zero.txt").unlink()
    (tree / "artifact.bin").chmod(0o600)
    changes = _changes(snap)
    assert changes["nested/index.json"] == "is now a symbolic link"
    assert "empty" in changes  # an entry appeared in a blessed directory
    assert changes["nested/zero.txt"] == "vanished"
    assert "mode" in changes["artifact.bin"]


def test_describe_change_is_pure() -> None:
    base = Stamp("f", 1, 2, 10, 100, 100, 0o100444, 0)
    assert describe_change(base, base) is None
    assert describe_change(base, Stamp("f", 1, 3, 10, 100, 100, 0o100444, 0)) == "replaced (device/inode changed)"
    assert (
        describe_change(base, Stamp("f", 1, 2, 11, 101, 101, 0o100444, 0)) == "size 10 -> 11, modified (mtime changed)"
    )
    assert describe_change(base, Stamp("f", 1, 2, 10, 100, 100, 0o100444, 1000)) == "owner uid 0 -> 1000"
    missing = Stamp("f", None, None, None, None, None, None, None)
    assert describe_change(missing, base) == "appeared after the snapshot"
    assert describe_change(base, missing) == "vanished"


# --------------------------------------------------------------------------------------------- start


GOLDEN: list[dict[str, Any]] = [
    {"prompt": "hello", "max_tokens": 3, "text": "abc", "token_ids": [97, 98, 99]},
    {"prompt": "world", "max_tokens": 2, "text": "xy", "token_ids": [120, 121]},
]


@pytest.fixture
def engine() -> Iterator[tuple[int, dict[str, list[int]]]]:
    """A running engine that answers the golden prompts (a test may change its replies) and [0] otherwise."""
    replies: dict[str, list[int]] = {str(g["prompt"]): list(g["token_ids"]) for g in GOLDEN}
    with FakeEngineServer(openai_engine(lambda prompt, max_tokens: replies.get(prompt, [0])[:max_tokens])) as server:
        yield server.port, replies


def _blessed_plan(
    store: Store, tmp_path: Path, port: int, behavior: Behavior | None = None
) -> tuple[serve.LaunchPlan, FakeRuntime]:
    """A plan of a published blessing; its engine is reached on ``port``, and starts as ``behavior`` says."""
    profile = make_profile()
    bless(store, profile, tmp_path, golden=GOLDEN)
    runtime = serving_runtime(host_port=port)
    if behavior is not None:
        runtime.scenario = lambda phase, candidate, trial: behavior
    return do_plan(profile, store, runtime), runtime


def test_start_runs_the_canary_and_leaves_the_engine_up(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]
) -> None:
    plan, runtime = _blessed_plan(store, tmp_path, engine[0])
    result = serve.start(plan, runtime=runtime, detach=True)
    assert result.canary.status == "passed" and len(result.canary.checks) == 2
    assert result.recheck.startswith("unchanged")
    assert "stop" not in runtime.calls and "remove" not in runtime.calls
    assert set(result.timings) >= {"preflight_s", "resolve_s", "verify_s", "create_s", "start_to_ready_s", "canary_s"}
    finished = serve.finish(plan, result, runtime=runtime, keep_upper=False, failed=False)
    assert finished.stop is not None and finished.stop.graceful and not finished.upper_kept
    assert runtime.calls[-2:] == ["stop", "remove"]
    assert not plan.serve_dir.exists(), "the upper layer is discarded"


def test_keep_upper_reports_what_the_engine_wrote(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]
) -> None:
    plan, runtime = _blessed_plan(store, tmp_path, engine[0])
    result = serve.start(plan, runtime=runtime)
    runtime.container(result.started.name).upper = [UpperEntry("dummy_cache/x", "new", 3)]
    finished = serve.finish(plan, result, runtime=runtime, keep_upper=True, failed=False)
    assert finished.upper_kept and finished.upper_dir == str(plan.serve_dir / "upper")
    assert finished.to_dict()["upper_entries"] == [{"path": "dummy_cache/x", "kind": "new", "size": 3}]
    assert (plan.serve_dir / serve.ENGINE_LOG).exists()


def test_canary_mismatch_stops_keeps_the_upper_layer_and_fails_42(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]
) -> None:
    port, replies = engine
    replies["world"] = [120, 122]
    plan, runtime = _blessed_plan(store, tmp_path, port)
    with pytest.raises(CanaryFailedError) as excinfo:
        serve.start(plan, runtime=runtime, detach=True)
    assert excinfo.value.exit_code == ExitCode.CANARY_FAILED
    assert "expected [120, 121] got [120, 122]" in excinfo.value.message
    assert runtime.calls[-2:] == ["stop", "remove"]
    assert excinfo.value.details["upper_kept"] is True
    assert (plan.serve_dir / serve.CANARY_FILE).exists()


def test_no_canary_is_reported_loudly(store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]) -> None:
    port, replies = engine
    replies["world"] = [1, 2]  # would fail the canary
    plan, runtime = _blessed_plan(store, tmp_path, port)
    events: list[Event] = []
    result = serve.start(plan, runtime=runtime, no_canary=True, events=events.append)
    assert result.canary.status == "skipped" and result.canary.reason == "--no-canary"
    assert serve.NO_CANARY_BANNER in result.to_dict()["warnings"]
    assert any(e.kind == "warning" and "CANARY SKIPPED" in e.message for e in events)


def test_cache_changed_after_ready_fails_43(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]
) -> None:
    plan, runtime = _blessed_plan(store, tmp_path, engine[0])
    assert plan.blessed_dir is not None
    victim = plan.blessed_dir / "artifact.bin"
    original_start = runtime.start

    def start_then_tamper(spec: ContainerSpec) -> Started:
        started = original_start(spec)
        victim.chmod(0o644)  # someone changes a blessed file while the engine boots
        return started

    runtime.start = start_then_tamper  # type: ignore[method-assign]
    with pytest.raises(CacheChangedError) as excinfo:
        serve.start(plan, runtime=runtime)
    assert excinfo.value.exit_code == ExitCode.CACHE_CHANGED
    assert "artifact.bin: mode" in excinfo.value.message
    assert runtime.calls[-2:] == ["stop", "remove"]


def test_an_ancestor_swapped_around_the_mount_and_back_fails_43(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]
) -> None:
    """blessed/<hash>/ renamed away while the engine mounts another tree there, then put back (issue: ancestor swap)."""
    import shutil

    plan, runtime = _blessed_plan(store, tmp_path, engine[0])
    assert plan.blessed_dir is not None
    version = plan.blessed_dir.parent  # blessed/<hash>/
    original_start = runtime.start

    def start_on_a_swapped_tree(spec: ContainerSpec) -> Started:
        away = version.with_name(version.name + ".away")
        version.rename(away)
        forged = version / plan.blessed_dir.name  # type: ignore[union-attr]
        shutil.copytree(away / plan.blessed_dir.name, forged)  # type: ignore[union-attr]
        (forged / "artifact.bin").chmod(0o644)
        (forged / "artifact.bin").write_bytes(b"other bytes")
        started = original_start(spec)  # the engine mounts the forged tree here
        shutil.rmtree(version)
        away.rename(version)  # and back: every stamp of the tree itself is as it was
        return started

    runtime.start = start_on_a_swapped_tree  # type: ignore[method-assign]
    with pytest.raises(CacheChangedError) as excinfo:
        serve.start(plan, runtime=runtime)
    assert f"{version}: changed (ctime moved" in excinfo.value.message
    assert runtime.calls[-2:] == ["stop", "remove"]


def test_ancestors_above_the_version_are_stamped_by_identity(store: Store, tmp_path: Path) -> None:
    """Other publishes (blessed/) and new serve dirs (the root) move their times: not a change; a swap is."""
    plan, _ = _blessed_plan(store, tmp_path, 9)
    assert plan.snapshot is not None and plan.blessed_dir is not None
    blessed, root = plan.blessed_dir.parent.parent, store.root
    assert {str(blessed), str(root)} == plan.snapshot.identity_only
    (blessed / ("f" * 64)).mkdir()  # another hash published meanwhile
    (root / "newdir").mkdir()
    assert plan.snapshot.changes() == []
    blessed.rename(root / "blessed.away")
    (root / "blessed").mkdir()  # a look-alike in its place
    changed = {change.path: change.detail for change in plan.snapshot.changes()}
    assert changed[str(blessed)] == "replaced (device/inode changed)"


def test_engine_never_ready_fails_44_with_the_log(store: Store, tmp_path: Path) -> None:
    crashing = Behavior(log=["Traceback: engine crashed"])
    plan, runtime = _blessed_plan(store, tmp_path, 9, crashing)  # nothing listens on port 9
    original_start = runtime.start

    def start_dead(spec: ContainerSpec) -> Started:
        started = original_start(spec)
        runtime.container(spec.name).exit_code = 0  # exits at once
        return started

    runtime.start = start_dead  # type: ignore[method-assign]
    with pytest.raises(EngineFailedError) as excinfo:
        serve.start(plan, runtime=runtime)
    assert "engine crashed" in excinfo.value.message
    assert runtime.calls[-1] == "remove"
    assert (plan.serve_dir / serve.ENGINE_LOG).read_text() == "Traceback: engine crashed\n"


def test_follow_streams_new_log_text_until_stopped() -> None:
    runtime = serving_runtime(host_port=9)  # follow only reads the log: nothing is asked over HTTP
    spec = ContainerSpec(name="bless-serve-unit", command=("x",), env={}, labels=serve_labels())
    started = runtime.start(spec)
    container = runtime.container(spec.name)
    chunks: list[str] = []
    stop = threading.Event()
    container.log = "one\n"

    def sink(text: str) -> None:
        chunks.append(text)
        if len(chunks) == 1:
            container.log += "two\n"
        else:
            stop.set()

    assert serve.follow(runtime, started, sink, stop=stop, poll_s=0.01) is None
    assert chunks == ["one\n", "two\n"]
    container.exit_code = 0
    container.log += "three\n"
    assert serve.follow(runtime, started, chunks.append, stop=threading.Event(), poll_s=0.01) == 0


def test_secret_flags_in_argv_are_redacted() -> None:
    policy = EnvPolicy(secret=("API_KEY", "HF_TOKEN"))
    command = ["serve", "--api-key", "k1", "--hf-token=t1", "--port", "8000", "--max-num-batched-tokens", "8"]
    assert policy.redact_command(command) == [
        "serve", "--api-key", REDACTED, f"--hf-token={REDACTED}", "--port", "8000", "--max-num-batched-tokens", "8",
    ]  # fmt: skip


def test_canary_compares_text_too() -> None:
    """An engine that returns no token ids must still reproduce the golden text."""

    class NoIds:
        def complete(self, prompt: str, max_tokens: int) -> Any:
            from bless.replay.engine_client import Completion

            return Completion(prompt, "abd", (), 0.0)

    golden = [{"prompt": "p", "max_tokens": 3, "text": "abc", "token_ids": []}]
    result = serve.run_canary(NoIds(), golden)  # type: ignore[arg-type]
    assert result.status == "failed"
    assert result.checks[0].describe() == "expected text 'abc' got 'abd'"


@pytest.mark.parametrize(
    ("log", "reason"),
    [
        (
            f"{markers.ARTIFACT_KEY}{ARTIFACT_KEY} (engine 1)\n{markers.compiling('no usable artifact')}\n",
            "compile/save",
        ),
        (f"{markers.ARTIFACT_KEY}{ARTIFACT_KEY} (engine 1)\nready\n", "no load marker"),
        (f"{markers.ARTIFACT_KEY}{'f' * 16} (engine 1)\n{markers.loaded('/c/x')}\n", "keyed its artifact"),
    ],
    ids=["compiled", "no-load-marker", "engine-key-drift"],
)
def test_engine_not_using_the_blessed_cache_fails_45_before_the_canary(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]], log: str, reason: str
) -> None:
    """A blessed start that compiled, loaded nothing, or keyed its cache differently is not the proven artifact."""
    plan, runtime = _blessed_plan(store, tmp_path, engine[0], Behavior(log=log.splitlines()))
    with pytest.raises(CacheNotUsedError) as excinfo:
        serve.start(plan, runtime=runtime, detach=True)
    assert int(excinfo.value.exit_code) == 45
    assert reason in excinfo.value.message
    assert runtime.calls[-2:] == ["stop", "remove"]
    assert (plan.serve_dir / serve.ENGINE_LOG).read_text() == log  # kept as evidence


def test_an_engine_that_compiled_outside_the_blessing_fails_45_and_keeps_the_files(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]
) -> None:
    """The boot log says "loaded", but a kernel landed in the engine's private HOME: served code nobody proved."""
    kernel = ".triton/cache/ABC/kernel.cubin"
    plan, runtime = _blessed_plan(store, tmp_path, engine[0], Behavior(outside={("HOME", kernel): b"\x7fELF"}))
    with pytest.raises(CacheNotUsedError) as excinfo:
        serve.start(plan, runtime=runtime, detach=True)
    assert int(excinfo.value.exit_code) == 45
    assert f"compiled outside the blessing: HOME/{kernel}" in excinfo.value.message
    assert runtime.calls[-2:] == ["stop", "remove"]
    assert (plan.serve_dir / serve.PRIVATE_DIR / "home" / kernel).read_bytes() == b"\x7fELF", "kept as evidence"


# ------------------------------------------------------------------------------- serving lease


def test_the_serving_lease_keeps_gc_off_the_served_tree_until_serving_ends(store: Store, tmp_path: Path) -> None:
    profile = make_profile()
    served = bless(store, profile, tmp_path)
    plan = do_plan(profile, store, serving_runtime())
    with serve.serving_lease(store, plan) as held:
        assert held.lease is not None and held.lease.serve_dir == str(plan.serve_dir)
        newer = write_tree(tmp_path / "newer", "newer")  # a rebless supersedes the served version
        store.publish(newer, make_manifest(newer, served.factors, dir_id="29990101T000000Z-000000000001"))
        report = store.gc(keep=0)
        assert store.blessed_dir(served).is_dir(), report
        assert any(plan.container_name in note for note in report.notes)
    assert store.leases.leases() == []
    assert store.blessed_dir(served) in {action.path for action in store.gc(keep=0).actions}


def test_the_library_serving_flow_holds_the_lease_from_start_to_finish(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]
) -> None:
    """A library caller of serve.start (no CLI around it) gets its served tree kept from gc until finish."""
    plan, runtime = _blessed_plan(store, tmp_path, engine[0])
    result = serve.start(plan, runtime=runtime)
    assert plan.manifest is not None
    (lease,) = store.leases.leases()
    assert lease.name == plan.container_name and lease.dir_id == plan.manifest.cache.dir_id
    served = store.records()[0].manifest
    assert served is not None
    newer = write_tree(tmp_path / "newer", "newer")
    store.publish(newer, make_manifest(newer, served.factors, dir_id="29990101T000000Z-000000000001"))
    store.gc(keep=0)
    assert store.blessed_dir(served).is_dir(), "a superseded version being served survives gc"
    serve.finish(plan, result, runtime=runtime, keep_upper=False, failed=False)
    assert store.leases.leases() == []
    assert store.blessed_dir(served) in {action.path for action in store.gc(keep=0).actions}


def test_a_failed_start_releases_its_lease(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]
) -> None:
    plan, runtime = _blessed_plan(store, tmp_path, engine[0], Behavior(outside={("HOME", ".triton/k.cubin"): b"x"}))
    with pytest.raises(CacheNotUsedError):
        serve.start(plan, runtime=runtime)
    assert store.leases.leases() == []


def test_a_tree_removed_before_the_lease_was_taken_is_refused(store: Store, tmp_path: Path) -> None:
    profile = make_profile()
    served = bless(store, profile, tmp_path)
    plan = do_plan(profile, store, serving_runtime())
    remove_tree(store.blessed_dir(served))  # what a gc racing the plan would have done
    with pytest.raises(CacheChangedError) as info, serve.serving_lease(store, plan):
        pytest.fail("the lease must not be held on a tree that is gone")
    assert code_of(info) == 43
    assert store.leases.leases() == []


def test_a_detached_serves_lease_stays_with_its_container_until_stop_releases_it(store: Store, tmp_path: Path) -> None:
    profile = make_profile()
    served = bless(store, profile, tmp_path)
    plan = do_plan(profile, store, serving_runtime())
    with serve.serving_lease(store, plan) as held:
        held.hand_over(Started(id="c0ffee", name=plan.container_name, spec=plan.spec, host_port=8000), "docker")
    (lease,) = store.leases.leases()
    assert lease.holder is not None and lease.holder["container"] == "c0ffee"
    assert lease.alive is None  # not a process gc can judge: honoured (fail safe)
    newer = write_tree(tmp_path / "newer", "newer")
    store.publish(newer, make_manifest(newer, served.factors, dir_id="29990101T000000Z-000000000001"))
    store.gc(keep=0)
    assert store.blessed_dir(served).is_dir()
    assert [released.path for released in store.leases.release_named(plan.container_name)] == [lease.path]
    assert store.blessed_dir(served) in {action.path for action in store.gc(keep=0).actions}


def test_a_detached_start_whose_lease_cannot_be_handed_over_stops_the_engine(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk at the hand-over: the engine must not keep serving under a lease that names serve-full."""
    plan, runtime = _blessed_plan(store, tmp_path, engine[0])

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(store.paths.leases))

    monkeypatch.setattr(store.leases, "hand_over", full)
    with pytest.raises(BlessError) as info:
        serve.start(plan, runtime=runtime, detach=True)
    assert code_of(info) == ExitCode.NO_SPACE and "handing the serving lease" in info.value.message
    assert runtime.calls[-2:] == ["stop", "remove"]
    assert not store.paths.ready_file(plan.profile.name).exists(), "no probe may pass for a stopped engine"
    assert store.leases.leases() == []


def test_a_lease_that_cannot_be_released_never_hides_why_serving_failed(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = make_profile()
    bless(store, profile, tmp_path)
    plan = do_plan(profile, store, serving_runtime())

    def stuck(*args: object) -> None:
        raise OSError(errno.EACCES, "Permission denied", str(store.paths.leases))

    monkeypatch.setattr(store.leases, "release", stuck)
    with pytest.raises(CanaryFailedError), serve.serving_lease(store, plan):
        raise CanaryFailedError("the canary differs")  # what serving failed with, not the lease
    with (
        pytest.raises(StoreUnavailableError, match="releasing the serving lease") as info,
        serve.serving_lease(store, plan),
    ):
        pass  # served, and ended well
    assert code_of(info) == ExitCode.STORE_UNAVAILABLE


# --------------------------------------------------------------------------------------------- serve-full stop


def _no_docker() -> FakeRuntime:
    raise AssertionError("stopping a local engine must not need Docker")


def _docker_down() -> FakeRuntime:
    raise RuntimeUnavailableError("Docker Engine unreachable")


def test_stop_ends_a_detached_local_engine_and_removes_its_serve_dir_and_lease(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]
) -> None:
    """serve-full stop NAME on the local runtime: the engine's process group, the serve dir, the lease."""
    import signal
    import subprocess

    from bless.system.procid import process_identity

    plan, runtime = _blessed_plan(store, tmp_path, engine[0])
    result = serve.start(plan, runtime=runtime, detach=True)
    # The store root is named: a stop against the default root would leave this lease and serve dir behind.
    assert result.to_dict()["stop_command"] == f"serve-full stop unit --root {store.root}"
    # start handed its lease to the (fake, Docker-kind) container; this test's engine is a local process.
    assert len(store.leases.release_named(plan.container_name)) == 1
    # The engine that outlives serve-full --detach: its own session, as the local runtime starts it.
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert plan.manifest is not None
        store.leases.acquire(
            plan.manifest.config_hash,
            plan.manifest.cache.dir_id,
            name=plan.container_name,
            holder=process_identity(child.pid),
            serve_dir=plan.serve_dir,
        )
        (plan.serve_dir / "upper").mkdir(parents=True, exist_ok=True)
        outcome = serve.stop_serving("unit", store=store, docker=_no_docker, timeout_s=5)
        assert child.wait(timeout=10) == -signal.SIGTERM, "a graceful stop: SIGTERM to the process group"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert outcome.stopped == (f"pid {child.pid}",) and outcome.leases_released == 1 and not outcome.notes
    assert outcome.serve_dirs_removed == (str(plan.serve_dir),) and not plan.serve_dir.exists()
    assert [lease for lease in store.leases.leases() if lease.name == plan.container_name] == []
    again = serve.stop_serving("unit", store=store, docker=_docker_down, timeout_s=5)
    assert not again.found and "no Docker serve checked" in again.notes[0]


def test_stop_never_removes_a_dir_a_lease_names_outside_the_serve_dirs(store: Store, tmp_path: Path) -> None:
    bless(store, make_profile(), tmp_path)
    manifest = store.records()[0].manifest
    assert manifest is not None
    victim = tmp_path / "precious"
    victim.mkdir()
    store.leases.acquire(
        manifest.config_hash, manifest.cache.dir_id, name="bless-serve-unit", holder={}, serve_dir=victim
    )
    outcome = serve.stop_serving("unit", store=store, docker=FakeRuntime, timeout_s=5)
    assert victim.is_dir() and "left alone" in outcome.notes[0] and outcome.leases_released == 1


def test_stop_says_when_a_lease_cannot_be_released(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bless(store, make_profile(), tmp_path)
    manifest = store.records()[0].manifest
    assert manifest is not None
    store.leases.acquire(manifest.config_hash, manifest.cache.dir_id, name="bless-serve-unit", holder={})

    def stuck(*args: object) -> None:
        raise OSError(errno.EACCES, "Permission denied", str(store.paths.leases))

    monkeypatch.setattr(store.leases, "release", stuck)
    with pytest.raises(StoreUnavailableError, match="releasing the serving leases") as info:
        serve.stop_serving("unit", store=store, docker=FakeRuntime, timeout_s=5)
    assert code_of(info) == ExitCode.STORE_UNAVAILABLE


def test_detached_serve_names_its_stop_command_not_docker(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]
) -> None:
    from rich.console import Console

    from bless.cli.serve_views import render_detached

    plan, runtime = _blessed_plan(store, tmp_path, engine[0])
    result = serve.start(plan, runtime=runtime, detach=True)
    console = Console(record=True, width=200)
    render_detached(console, {"result": result.to_dict()})
    text = console.export_text()
    assert f"serve-full stop unit --root {store.root}" in text and "docker" not in text
    with pytest.raises(ContainerConflictError) as refused:  # the detached serve's container holds the name
        do_plan(plan.profile, store, runtime)
    assert f"serve-full stop unit --root {store.root}" in (command_line_hint(refused.value) or "")
    assert "docker" not in (command_line_hint(refused.value) or "")


def test_the_plan_says_where_a_local_engine_listens_and_what_it_imports_first(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]
) -> None:
    """A local engine publishes nothing: it listens on the serving address itself, from the host's python."""
    from rich.console import Console

    from bless.cli.serve_views import render_plan

    plan, _runtime = _blessed_plan(store, tmp_path, engine[0])
    shown = plan.to_dict()
    docker = Console(record=True, width=300)
    render_plan(docker, shown)
    assert f"-> {shown['container']['port']}" in docker.export_text()
    container = {**shown["container"], "image": None, "host_port": None, "python_path": ["/seal", "/checkout"]}
    local = Console(record=True, width=300)
    render_plan(local, {**shown, "container": container})
    text = local.export_text()
    assert f"{container['host_ip']}:{container['port']} (the engine listens there itself)" in text
    assert "None" not in text and "/seal /checkout" in text


def test_stop_command_names_a_non_default_root_quoted_for_a_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """The printed stop command must reach the serve's lease and serve dir: the store root is named, quoted."""
    import shlex

    monkeypatch.setenv("BLESS_ROOT", "/elsewhere")  # a later shell may not have it: named anyway
    assert serve.stop_command("reference-cpu") == "serve-full stop reference-cpu"
    assert serve.stop_command("reference-cpu", Path.home() / ".cache" / "bless") == "serve-full stop reference-cpu"
    command = serve.stop_command("reference-cpu", Path("/tmp/my host"))
    assert shlex.split(command) == ["serve-full", "stop", "reference-cpu", "--root", "/tmp/my host"]
    assert serve.stop_command("a b", Path("/elsewhere")) == "serve-full stop 'a b' --root /elsewhere"


# --------------------------------------------------------------------------------------------- one start per name


def test_a_start_in_progress_refuses_a_second_start_and_a_dry_run(tmp_path: Path) -> None:
    """Two serve-full of one profile at the same moment: the second (or a --dry-run) is refused 12 at once."""
    from typer.testing import CliRunner

    import bless.cli.serve

    store = Store(tmp_path / "root")
    profile = Path(__file__).resolve().parents[2] / "profiles" / "reference-cpu.toml"
    runner = CliRunner()
    with serve.StartingLock(store, "reference-cpu"):
        for extra in (["--dry-run"], ["--detach"]):
            result = runner.invoke(
                bless.cli.serve.app, ["--profile", str(profile), "--root", str(store.root), "--json", *extra]
            )
            assert result.exit_code == ExitCode.CONTAINER_CONFLICT, result.output
            assert "another serve-full is starting (or stopping) 'reference-cpu'" in result.output
    with serve.StartingLock(store, "reference-cpu") as again:  # released: the next start may go ahead
        assert again.path == store.paths.serve_start_lock("reference-cpu")
        again.release()
        again.release()  # idempotent


def test_a_foreign_volume_in_the_overlays_place_is_refused_before_anything_starts(store: Store, tmp_path: Path) -> None:
    """What a real start would refuse, the plan (so --dry-run) refuses too: 12, naming the volume."""
    plan, runtime = _blessed_plan(store, tmp_path, 9)
    runtime.volume_conflicts = {plan.container_name: "a Docker volume named 'x-overlay' exists WITHOUT our labels"}
    with pytest.raises(ContainerConflictError) as excinfo:
        do_plan(plan.profile, store, runtime)
    assert excinfo.value.exit_code == ExitCode.CONTAINER_CONFLICT and "x-overlay" in excinfo.value.message
    assert "start" not in runtime.calls


def test_stop_gives_a_docker_serve_the_callers_timeout_before_cleaning_up(store: Store) -> None:
    """serve-full stop NAME --timeout S: the graceful stop first (with S), then our container and volume go."""
    stops: list[int] = []

    class Recording(FakeRuntime):
        def stop(self, started: Started, timeout_s: int) -> ContainerStop:
            stops.append(timeout_s)
            return super().stop(started, timeout_s)

    runtime = Recording()
    runtime.plant(serve.serve_container_name("unit", per_root=store.root), serve_labels(root=store.root))
    outcome = serve.stop_serving("unit", store=store, docker=lambda: runtime, timeout_s=77)
    assert stops == [77] and runtime.calls[-2:] == ["stop", "cleanup_ours"]
    assert outcome.leases_released == 0 and not outcome.notes


# --------------------------------------------------------------------------------------------- Docker start errors


@pytest.mark.parametrize(
    "explanation",
    [
        "driver failed programming external connectivity on endpoint bless-serve-unit: "
        "Bind for 127.0.0.1:8000 failed: port is already allocated",
        "Error starting userland proxy: listen tcp4 127.0.0.1:8000: bind: address already in use",
    ],
)
def test_a_taken_host_port_is_named_with_what_to_do(explanation: str) -> None:
    """A port held by something else is no missing command or bad mount: the hint says to free or change it."""
    from types import SimpleNamespace

    from bless.runtime.docker import _start_failed

    spec = ContainerSpec(
        name="bless-serve-unit", command=("serve",), env={}, labels={}, port=8000, host_ip="127.0.0.1", host_port=8000
    )
    err = _start_failed(spec, SimpleNamespace(explanation=explanation))
    assert int(err.exit_code) == 44  # the documented ENGINE_FAILED: the engine could not be started
    assert "127.0.0.1:8000 is already in use" in str(err)
    assert err.hint is not None and "serving.port" in err.hint
    assert "serve-full stop NAME" in (command_line_hint(err) or "")
    assert "engine command" not in err.hint
    other = _start_failed(spec, SimpleNamespace(explanation='exec: "vllm": executable file not found in $PATH'))
    assert other.hint is not None and "engine command exists in the image" in other.hint


def test_a_serve_dir_that_cannot_be_created_is_store_unavailable(
    store: Store, tmp_path: Path, engine: tuple[int, dict[str, list[int]]]
) -> None:
    plan, runtime = _blessed_plan(store, tmp_path, engine[0])
    plan.serve_dir.parent.mkdir(parents=True, exist_ok=True)
    plan.serve_dir.write_text("a file where the serve dir goes\n")
    with pytest.raises(StoreUnavailableError, match="serve dir") as excinfo:
        serve.start(plan, runtime=runtime, detach=True)
    assert code_of(excinfo) == ExitCode.STORE_UNAVAILABLE
    assert "create" not in runtime.calls, "nothing was started"


# --------------------------------------------------------------------------------------------- other store roots


def _other_roots_serve(runtime: FakeRuntime, other_root: Path, name: str = "bless-serve-unit") -> None:
    """Another root's serve of profile ``unit``: by default under the untagged name serves had before tags."""
    runtime.plant(
        name,
        labels.labels_for(
            run_id="serve-before", phase=labels.PHASE_SERVE, config_hash="0" * 64, profile="unit", store_root=other_root
        ),
    )


def test_port_0_publishes_the_engine_on_a_free_port(store: Store) -> None:
    """serve-full --port 0: no fixed port to collide on when serves run side by side on a shared host."""
    import dataclasses

    plan = do_plan(dataclasses.replace(make_profile(), serving_port=0), store, serving_runtime(), debug=True)
    assert plan.spec.host_port is None, "the runtime picks a free host port and reads it back"
    assert plan.spec.port is not None


def test_a_serve_records_its_store_root_on_the_container(store: Store) -> None:
    plan = do_plan(make_profile(), store, serving_runtime(), debug=True)
    assert plan.spec.labels[labels.STORE_ROOT] == str(store.root)


def test_a_name_held_by_another_roots_serve_names_that_root_and_its_stop(store: Store, tmp_path: Path) -> None:
    """Only if two roots' tags collide (or a label lies) does another root's serve hold this root's name."""
    runtime = serving_runtime()
    _other_roots_serve(runtime, tmp_path / "other root", serve.serve_container_name("unit", per_root=store.root))
    with pytest.raises(ContainerConflictError) as excinfo:
        do_plan(make_profile(), store, runtime, debug=True)
    assert code_of(excinfo) == ExitCode.CONTAINER_CONFLICT
    assert str(tmp_path / "other root") in excinfo.value.message
    assert f"--root '{tmp_path / 'other root'}'" in (command_line_hint(excinfo.value) or "")
    assert excinfo.value.details["store_root"] == str((tmp_path / "other root").resolve())


def test_stop_refuses_a_container_another_root_owns(store: Store, tmp_path: Path) -> None:
    runtime = FakeRuntime()
    _other_roots_serve(runtime, tmp_path / "other")
    with pytest.raises(ContainerConflictError, match="another store root") as excinfo:
        serve.stop_serving("unit", store=store, docker=lambda: runtime, timeout_s=5)
    assert code_of(excinfo) == ExitCode.CONTAINER_CONFLICT
    assert f"--root {tmp_path / 'other'}" in (command_line_hint(excinfo.value) or "")
    assert "stop" not in runtime.calls and "cleanup_ours" not in runtime.calls


def test_a_per_root_name_tells_store_roots_apart_and_one_root_by_any_spelling(store: Store, tmp_path: Path) -> None:
    store.root.mkdir(parents=True)
    (tmp_path / "alias").symlink_to(store.root)
    plain = serve.serve_container_name("unit")
    mine = serve.serve_container_name("unit", per_root=store.root)
    assert plain == "bless-serve-unit" and mine.startswith("bless-serve-unit-") and len(mine) == len(plain) + 9
    assert serve.serve_container_name("unit", per_root=tmp_path / "alias") == mine
    assert serve.serve_container_name("unit", per_root=tmp_path / "other") not in (plain, mine)


def test_another_roots_serve_of_the_profile_does_not_block_a_start(store: Store, tmp_path: Path) -> None:
    """Names are per store root by default: neither another root's serve (under its own tagged name) nor an
    old untagged one blocks this root's start."""
    runtime = serving_runtime()
    _other_roots_serve(runtime, tmp_path / "old root")
    _other_roots_serve(
        runtime, tmp_path / "other root", serve.serve_container_name("unit", per_root=tmp_path / "other root")
    )
    plan = do_plan(make_profile(), store, runtime, debug=True)
    assert plan.spec.name == serve.serve_container_name("unit", per_root=store.root)
    assert plan.spec.labels[labels.STORE] == labels.store_tag(store.root)


def test_stop_with_two_roots_serving_a_profile_stops_only_its_own(store: Store, tmp_path: Path) -> None:
    runtime = FakeRuntime()
    _other_roots_serve(runtime, tmp_path / "other")
    mine = serve.serve_container_name("unit", per_root=store.root)
    own_labels = labels.labels_for(
        run_id="serve-mine", phase=labels.PHASE_SERVE, config_hash="0" * 64, profile="unit", store_root=store.root
    )
    runtime.plant(mine, own_labels)
    outcome = serve.stop_serving("unit", store=store, docker=lambda: runtime, timeout_s=5)
    assert outcome.stopped == (mine,)
    assert runtime.container(mine).removed and not runtime.container("bless-serve-unit").stopped
    assert runtime.cleanups == [
        {labels.PROFILE: "unit", labels.PHASE: labels.PHASE_SERVE, labels.STORE: labels.store_tag(store.root)}
    ], "this root's serves and volumes only, by its tag: another root's are never cleaned up from here"


def test_stop_takes_its_own_roots_container_named_by_another_path(store: Store, tmp_path: Path) -> None:
    store.root.mkdir(parents=True)
    (tmp_path / "alias").symlink_to(store.root)
    runtime = FakeRuntime()
    _other_roots_serve(runtime, tmp_path / "alias")
    serve.stop_serving("unit", store=store, docker=lambda: runtime, timeout_s=5)
    assert runtime.calls[-2:] == ["stop", "cleanup_ours"]
