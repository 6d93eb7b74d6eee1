"""``serve-full``: start an engine on its blessed cache, or refuse with a reason. Fail closed.

:func:`plan` makes every decision and every refusal before anything is created: runtime
reachable, image present, GPU memory (where the profile states a need), no unsafe debug
settings, the serving container name free, the profile resolved to its config hash, a
valid unique manifest for that hash, and every blessed file verified (size and sha256,
nothing extra, no symlinks). :func:`start` then starts the engine with the blessed tree as
the read-only lower layer of an overlay (or a read-only bind where the adapter allows), at
the same path and with the same HOME as when it was blessed, waits until it is ready,
re-checks the blessed files, and sends the canary: every golden prompt of the manifest
must reproduce its golden token ids exactly. :func:`follow` streams the engine's log and
:func:`finish` stops it gracefully, removes the container and discards (or keeps) the
overlay's upper layer.

What is and is not guaranteed between verify and mount
------------------------------------------------------

serve-full hashes every blessed file, then hands the *directory* to the container runtime,
which mounts it a moment later. Nothing can make those two steps one atomic operation, so
the guarantee rests on three things:

* **The blessed directory is read-only and owned as published.** ``bless run`` publishes
  every blessed tree with files ``0444`` and directories ``0555``, owned by the user who
  blessed it, and nothing in bless ever writes there again. A process that is neither that
  user nor root cannot change, add, remove or rename anything in it. serve-full warns when
  it finds a write bit set.
* **A cheap identity re-check after the container is up.** Before hashing, serve-full
  records each blessed file's and directory's device, inode, size, mtime, ctime, mode and
  owner. It compares them again right after verification and again once the engine is
  ready (before the canary). Any difference (a file rewritten, replaced by a rename,
  truncated, re-moded, an entry added or removed in a directory) stops the container and
  fails with exit 43, naming the files. ``ctime`` cannot be set back from user space, so
  restoring an mtime with ``touch`` does not hide a rewrite.
* **The canary.** The served engine must reproduce the blessed golden token ids exactly
  before serve-full reports success.

What is *not* guaranteed:

* **root on the host can still swap files** between the hash and the mount in ways the
  re-check cannot see (for instance by writing the block device directly, or by changing
  a file and resetting the clock). bless protects against accidents and against other
  users, not against the machine's administrator.
* **The overlay's lower layer is not copied.** The engine reads the blessed files in
  place, through the overlay. A change to the blessed tree *after* the re-check (while the
  engine runs) is not detected by serve-full; re-run ``bless verify`` to audit a running
  blessing. The engine's own writes never reach the blessed tree: they land in the
  upper layer, which is discarded when serving ends (kept with ``--keep-upper`` or after a
  canary failure, as evidence of what the engine tried to write).
* ``--debug`` starts are not blessed at all: no manifest is looked up, no cache is
  mounted, the engine runs eager, and the result says ``"blessed": false``.

This module is library code: it never prints or exits; progress goes to an event sink and
every refusal is a :class:`~bless.errors.BlessError` with its own exit code.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bless import labels
from bless.engines.base import EngineAdapter
from bless.errors import (
    BlessError,
    CacheChangedError,
    CacheNotUsedError,
    CanaryFailedError,
    ContainerConflictError,
    EngineFailedError,
    EngineHttpError,
    InputInvalidError,
    InsufficientGpuError,
    NotReadyError,
    VerifyFailedError,
)
from bless.evidence import UpperEntry
from bless.factors import REDACTED, GpuInfo, ResolvedConfig
from bless.flows.events import Event, EventSink, ignore_events, new_run_id
from bless.flows.resolve import no_manifest_error, resolve_profile
from bless.flows.safety import check_unsafe
from bless.flows.session import EngineSession, engine_spec, log_tail
from bless.manifest import Manifest, load_manifest
from bless.probes import hardware_factor, probe_gpus
from bless.profile import HardwareSpec, Profile
from bless.runtime.base import ContainerSpec, Mount, Runtime, Started, StopResult
from bless.store import Store
from bless.text import shown
from bless.trials import EngineClient, golden_token_map
from bless.verify import ROOT_PATH, VerifyResult, verify_tree

SERVE_PREFIX = "bless-serve-"
SERVE_DIR = "serve"
ENGINE_LOG = "engine.log"
CANARY_FILE = "canary.json"
# Characters that would break Docker's overlay option string (lowerdir=...,upperdir=...).
_OVERLAY_UNSAFE = frozenset(",:\n")
_MAX_PROBLEMS_IN_MESSAGE = 8
_MAX_UPPER_REPORTED = 200
_LOOPBACK_FOR = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}

DEBUG_BANNER = (
    "DEBUG START, NOT BLESSED: no manifest was checked, no compiled cache is mounted, the engine runs "
    "eager (compile off). Outputs and performance are not what a blessed start serves."
)
NO_CANARY_BANNER = (
    "CANARY SKIPPED (--no-canary): the engine was not checked against the blessed golden outputs; "
    "the cache was verified, the served outputs were not."
)


def serve_container_name(profile: Profile) -> str:
    """The serving container's stable name: one serving container per profile name."""
    return f"{SERVE_PREFIX}{profile.name}"


# --------------------------------------------------------------------------------------------
# Snapshot: the cheap identity re-check


@dataclass(frozen=True)
class Stamp:
    """``lstat`` facts of one blessed entry; ``None`` fields mean it did not exist."""

    path: str
    dev: int | None
    ino: int | None
    size: int | None
    mtime_ns: int | None
    ctime_ns: int | None
    mode: int | None
    uid: int | None

    @classmethod
    def of(cls, root: Path, path: str, lstat: Callable[[Path], os.stat_result] = os.lstat) -> Stamp:
        """Stamp ``root/path`` (``path`` ``"."`` is the root itself) without following links."""
        target = root if path == ROOT_PATH else root / path
        try:
            st = lstat(target)
        except FileNotFoundError:
            return cls(path, None, None, None, None, None, None, None)
        except NotADirectoryError:
            # A parent became a file: the entry is gone as far as we are concerned.
            return cls(path, None, None, None, None, None, None, None)
        return cls(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid)


@dataclass(frozen=True)
class StampChange:
    """One blessed entry that differs from its snapshot, and how."""

    path: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "detail": self.detail}


def describe_change(before: Stamp, after: Stamp) -> str | None:
    """How ``after`` differs from ``before`` in words, or None when they are the same."""
    if before == after:
        return None
    if before.ino is None:
        return "appeared after the snapshot"
    if after.ino is None or after.mode is None:
        return "vanished"
    assert before.mode is not None
    if stat.S_IFMT(before.mode) != stat.S_IFMT(after.mode):
        kind = "a symbolic link" if stat.S_ISLNK(after.mode) else stat.filemode(after.mode)[0] + "-type entry"
        return f"is now {kind}"
    reasons: list[str] = []
    if (before.dev, before.ino) != (after.dev, after.ino):
        reasons.append("replaced (device/inode changed)")
    if before.size != after.size:
        reasons.append(f"size {before.size} -> {after.size}")
    if before.mtime_ns != after.mtime_ns:
        reasons.append("modified (mtime changed)")
    if before.mode != after.mode:
        reasons.append(f"mode {stat.filemode(before.mode)} -> {stat.filemode(after.mode)}")
    if before.uid != after.uid:
        reasons.append(f"owner uid {before.uid} -> {after.uid}")
    if before.ctime_ns != after.ctime_ns and not reasons:
        # ctime moves on any content or metadata change and cannot be set back from user space.
        reasons.append("changed (ctime moved: rewritten, re-linked or metadata changed)")
    return ", ".join(reasons)


@dataclass(frozen=True)
class Snapshot:
    """Stamps of the blessed root, every listed directory and every listed file."""

    root: Path
    stamps: tuple[Stamp, ...]

    @classmethod
    def take(
        cls,
        root: Path,
        files: Sequence[str],
        dirs: Sequence[str],
        lstat: Callable[[Path], os.stat_result] = os.lstat,
    ) -> Snapshot:
        """Stamp ``root``, its ``dirs`` (entries added or removed move a directory's mtime) and ``files``."""
        paths = [ROOT_PATH, *dirs, *files]
        return cls(root, tuple(Stamp.of(root, path, lstat) for path in paths))

    def changes(self, lstat: Callable[[Path], os.stat_result] = os.lstat) -> list[StampChange]:
        """Every entry whose stamp differs now (empty: nothing changed)."""
        found: list[StampChange] = []
        for before in self.stamps:
            detail = describe_change(before, Stamp.of(self.root, before.path, lstat))
            if detail is not None:
                found.append(StampChange(before.path, detail))
        return found

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "entries": len(self.stamps)}


def cache_changed_error(changes: Sequence[StampChange], *, when: str, blessed_dir: Path) -> CacheChangedError:
    """The refusal for blessed files that changed after they were hashed."""
    shown = "; ".join(f"{change.path}: {change.detail}" for change in changes[:_MAX_PROBLEMS_IN_MESSAGE])
    more = f" and {len(changes) - _MAX_PROBLEMS_IN_MESSAGE} more" if len(changes) > _MAX_PROBLEMS_IN_MESSAGE else ""
    return CacheChangedError(
        f"{len(changes)} blessed entr{'y' if len(changes) == 1 else 'ies'} in {blessed_dir} changed {when}: "
        f"{shown}{more}",
        hint="something writes to the read-only blessed dir: find it and stop it, then run bless verify; "
        "do not serve this cache until it verifies",
        details={"blessed_dir": str(blessed_dir), "changes": [change.to_dict() for change in changes]},
    )


# --------------------------------------------------------------------------------------------
# Preflight checks that are pure enough to test alone


def check_gpu_memory(spec: HardwareSpec, gpus: Sequence[GpuInfo]) -> None:
    """Refuse (52) unless the first ``gpu_count`` GPUs each have ``min_gpu_memory_gib`` free."""
    if spec.accelerator != "cuda" or spec.min_gpu_memory_gib is None:
        return
    count = spec.gpu_count or 1
    need_mib = spec.min_gpu_memory_gib * 1024
    if len(gpus) < count:
        raise InsufficientGpuError(
            f"the profile needs {count} GPU(s) with {spec.min_gpu_memory_gib:g} GiB free each; "
            f"this machine has {len(gpus)} GPU(s)",
            hint="run on a host with enough GPUs (nvidia-smi lists them)",
            details={"needed_gpus": count, "found_gpus": len(gpus)},
        )
    short = [(index, gpu) for index, gpu in enumerate(gpus[:count]) if gpu.memory_free_mib < need_mib]
    if short:
        listed = ", ".join(
            f"GPU {index} ({gpu.name}): {gpu.memory_free_mib / 1024:.1f} GiB free of {gpu.memory_total_mib / 1024:.1f}"
            for index, gpu in short
        )
        raise InsufficientGpuError(
            f"the profile needs {spec.min_gpu_memory_gib:g} GiB of free GPU memory per GPU; {listed}",
            hint="stop what uses the GPU memory (nvidia-smi shows the processes), or lower "
            "hardware.min_gpu_memory_gib if the engine really needs less",
            details={
                "min_gpu_memory_gib": spec.min_gpu_memory_gib,
                "short": [
                    {
                        "index": index,
                        "name": gpu.name,
                        "free_mib": gpu.memory_free_mib,
                        "total_mib": gpu.memory_total_mib,
                    }
                    for index, gpu in short
                ],
            },
        )


def check_name_free(runtime: Runtime, profile: Profile, name: str) -> None:
    """Refuse (12) when the serving container name is taken: ours (serving already) or foreign (never touched)."""
    holder = runtime.name_holder(name)
    if holder == "free":
        return
    if holder == "foreign":
        raise ContainerConflictError(
            f"a container without our labels holds the name {name!r}; never touched: bless does not stop or "
            "remove containers it did not create",
            hint=f"rename or remove that container yourself if it is safe (docker rm {name}), or serve this "
            "profile under another name (the profile's name field)",
            details={"name": name, "holder": "foreign"},
        )
    status = next(
        (info.status for info in runtime.list_ours({labels.PROFILE: profile.name}) if info.name == name), "unknown"
    )
    if status == "running":
        message = f"{profile.label} is already running: container {name!r} of ours is up"
        hint = f"use the running engine, or stop it first (docker stop {name} && docker rm {name})"
    else:
        message = f"container {name!r} of ours already exists ({status}): a stopped serve-full --detach left it"
        hint = f"remove it (docker rm {name}), then retry"
    raise ContainerConflictError(message, hint=hint, details={"name": name, "holder": "ours", "status": status})


def _client_host(serving_host: str) -> str:
    """Where we reach the published port: loopback for wildcard binds, brackets around IPv6."""
    host = _LOOPBACK_FOR.get(serving_host, serving_host)
    return f"[{host}]" if ":" in host else host


def redact_env(env: Mapping[str, str], is_secret: Callable[[str], bool]) -> dict[str, str]:
    """``env`` with the values of secret names replaced by ``<redacted>``."""
    return {name: (REDACTED if is_secret(name) else value) for name, value in sorted(env.items())}


def redact_command(command: Sequence[str], is_secret: Callable[[str], bool]) -> list[str]:
    """argv with the value of secret-looking flags (``--api-key X``, ``--hf-token=X``) redacted.

    Adapters keep secrets out of argv; this is the belt to their braces, since plans are printed.
    """

    def secret_flag(token: str) -> bool:
        return token.startswith("--") and is_secret(token[2:].split("=", 1)[0].replace("-", "_").upper())

    shown: list[str] = []
    redact_next = False
    for token in command:
        if redact_next:
            shown.append(REDACTED)
            redact_next = False
        elif secret_flag(token) and "=" in token:
            shown.append(token.split("=", 1)[0] + "=" + REDACTED)
        else:
            shown.append(token)
            redact_next = secret_flag(token)
    return shown


# --------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class LaunchPlan:
    """Everything decided before a container exists. ``manifest`` is None for ``--debug``."""

    profile: Profile
    debug: bool
    config_hash: str
    resolved: ResolvedConfig
    run_id: str
    spec: ContainerSpec
    serve_dir: Path
    mount: Mount | None
    client_host: str
    manifest: Manifest | None
    manifest_path: Path | None
    blessed_dir: Path | None
    verification: VerifyResult | None
    snapshot: Snapshot | None
    secret_env: frozenset[str]
    adapter: EngineAdapter
    allowed_unsafe: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)

    @property
    def blessed(self) -> bool:
        """True for a blessed start (a verified manifest), False for ``--debug``."""
        return not self.debug

    @property
    def container_name(self) -> str:
        return self.spec.name

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plan; secret env values are ``<redacted>``."""
        spec = self.spec
        return {
            "blessed": self.blessed,
            "debug": self.debug,
            "banner": DEBUG_BANNER if self.debug else None,
            "profile": self.profile.label,
            "profile_name": self.profile.name,
            "config_hash": self.config_hash,
            "run_id": self.run_id,
            "manifest_path": str(self.manifest_path) if self.manifest_path else None,
            "blessed_dir": str(self.blessed_dir) if self.blessed_dir else None,
            "golden_prompts": len(self.manifest.golden) if self.manifest else 0,
            "serve_dir": str(self.serve_dir),
            "mount": (
                {
                    "kind": self.mount.kind,
                    "source": str(self.mount.source),
                    "target": self.mount.target,
                    "upper_dir": str(self.mount.scratch / "upper") if self.mount.scratch else None,
                }
                if self.mount
                else None
            ),
            "container": {
                "name": spec.name,
                "image": spec.image,
                "command": redact_command(spec.command, self.adapter.env_policy.is_secret),
                "env": redact_env(spec.env, lambda name: name in self.secret_env),
                "labels": dict(spec.labels),
                "home": spec.home,
                "port": spec.port,
                "host_ip": spec.host_ip,
                "host_port": spec.host_port,
                "gpus": spec.gpus,
            },
            "verification": self.verification.to_dict() if self.verification else None,
            "snapshot": self.snapshot.to_dict() if self.snapshot else None,
            "allowed_unsafe": list(self.allowed_unsafe),
            "warnings": list(self.warnings),
            "timings": {key: round(value, 4) for key, value in self.timings.items()},
        }


def _serve_dir(store: Store, profile: Profile, now: datetime | None) -> Path:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    # The token keeps two starts within one second apart (the second is refused by name anyway).
    return store.root / SERVE_DIR / f"{profile.name}-{stamp}-{secrets.token_hex(3)}"


def _verify_failed(result: VerifyResult, blessed_dir: Path, config_hash: str) -> VerifyFailedError:
    named = "; ".join(
        f"{shown(problem.path)} ({problem.kind}: {problem.detail})"
        for problem in result.problems[:_MAX_PROBLEMS_IN_MESSAGE]
    )
    count = len(result.problems)
    more = f" and {count - _MAX_PROBLEMS_IN_MESSAGE} more" if count > _MAX_PROBLEMS_IN_MESSAGE else ""
    return VerifyFailedError(
        f"{count} problem(s) in {shown(str(blessed_dir))}: {named}{more}",
        hint="do not serve this cache: re-bless the configuration (bless run --profile ... --rebless) and find "
        "out what changed the read-only blessed files (bless verify lists every problem)",
        details={
            "config_hash": config_hash,
            "blessed_dir": str(blessed_dir),
            "problems": [problem.to_dict() for problem in result.problems],
        },
    )


def plan(
    profile: Profile,
    *,
    store: Store,
    runtime: Runtime,
    adapter: EngineAdapter,
    debug: bool = False,
    allow_unknown_engine_version: bool = False,
    gpu_probe: Callable[[], list[GpuInfo]] = probe_gpus,
    now: datetime | None = None,
    allow_test_knobs: bool = False,
) -> LaunchPlan:
    """Decide how to serve ``profile``; every refusal happens here, before any container exists.

    Order: runtime reachable (50), image present (51), GPU memory where the profile states a need
    (52), unsafe debug settings (30, allowed with ``debug``), serving container name free (12),
    factors and config hash, manifest (20 with the nearest blessing's diff, 22, 23), blessed
    files verified (21) and unchanged while verified (43). With ``debug`` no manifest is
    looked up and no cache is mounted. ``allow_test_knobs`` lets the reference engine's test knobs
    through (bless's own tests; the serve-full command never sets it).
    """
    clock = time.perf_counter
    t0 = clock()
    runtime.ping()
    image_id: str | None = None
    if profile.runtime_kind == "docker":
        image_id = runtime.resolve_image(profile.image or "")
    gpus: list[GpuInfo] | None = None
    if profile.hardware.accelerator == "cuda":
        gpus = gpu_probe()
        check_gpu_memory(profile.hardware, gpus)
    warnings: list[str] = []
    # --debug runs unsafe settings on purpose (no blessed cache is used); everything else refuses them.
    allowed = (
        [u.describe() for u in adapter.unsafe_settings(profile)]
        if debug
        else check_unsafe(profile, adapter, allow_test_knobs=allow_test_knobs)
    )
    if allowed:
        warnings.append("unsafe settings allowed: " + "; ".join(allowed))
    name = serve_container_name(profile)
    check_name_free(runtime, profile, name)
    t1 = clock()

    resolved = resolve_profile(
        profile,
        # The ID read above, not the tag again: the container is started from this ID, so a tag
        # moved after this point cannot change what runs.
        image_resolver=lambda _reference: image_id or "",
        adapter=adapter,
        hardware_probe=lambda spec: hardware_factor(spec, gpus=gpus),
    )
    # The rules of the resolved engine version (vLLM: its markers and force-load switch); unknown
    # versions are refused here, before anything starts, unless allowed.
    adapter = adapter.for_factors(resolved.factors)
    adapter.require_known_version(allow_unknown=allow_unknown_engine_version)
    warnings.extend(f"{adapter.name} adapter: {note}" for note in adapter.notes() if "no entry" in note)
    manifest: Manifest | None = None
    manifest_path: Path | None = None
    if not debug:
        manifest_path = store.manifest_path(resolved.config_hash)
        if manifest_path is None:
            raise no_manifest_error(store, resolved)
        manifest = load_manifest(manifest_path)
        if manifest.config_hash != resolved.config_hash:
            # Replaced between the lookup and the read (a concurrent rebless of another hash into
            # this file name): look again rather than guess.
            raise no_manifest_error(store, resolved)
    t2 = clock()

    verification: VerifyResult | None = None
    snapshot: Snapshot | None = None
    blessed_dir: Path | None = None
    if manifest is not None:
        blessed_dir = store.blessed_dir(manifest)
        store.check_permissions(manifest)
        files = [entry.path for entry in manifest.cache.files]
        # Stamped BEFORE hashing: whatever changes from here on (even during hashing) is caught.
        snapshot = Snapshot.take(blessed_dir, files, manifest.cache.dirs)
        verification = verify_tree(blessed_dir, manifest.cache.files, manifest.cache.dirs, expect_read_only=True)
        if not verification.ok:
            raise _verify_failed(verification, blessed_dir, resolved.config_hash)
        changes = snapshot.changes()
        if changes:
            raise cache_changed_error(changes, when="while it was being verified", blessed_dir=blessed_dir)
        owners = sorted({stamp.uid for stamp in snapshot.stamps if stamp.uid is not None})
        if len(owners) > 1:
            warnings.append(
                f"blessed entries have mixed owners (uids {', '.join(map(str, owners))}): a published tree is "
                "owned by the one user who blessed it"
            )
        if verification.notices:
            warnings.append(
                f"{len(verification.notices)} blessed entr{'y is' if len(verification.notices) == 1 else 'ies are'} "
                "writable (blessed caches are read-only): "
                + ", ".join(notice.path for notice in verification.notices[:5])
            )
    t3 = clock()

    serve_dir = _serve_dir(store, profile, now)
    mount: Mount | None = None
    if blessed_dir is not None:
        if profile.cache_mount == "ro-bind" and adapter.readonly_bind_ok:
            mount = Mount("ro", blessed_dir, adapter.cache_mount_path)
        else:
            if profile.cache_mount == "ro-bind":
                warnings.append(
                    f"cache.mount = 'ro-bind' but the {adapter.name} engine writes while loading: using an overlay"
                )
            for path in (blessed_dir, serve_dir):
                if _OVERLAY_UNSAFE & set(str(path)):
                    raise InputInvalidError(
                        f"{path} contains ',' ':' or a newline, which the overlay mount options cannot carry",
                        hint="move the store root (--root / BLESS_ROOT) to a plain path",
                    )
            mount = Mount("overlay", blessed_dir, adapter.cache_mount_path, scratch=serve_dir)
    run_id = new_run_id()
    spec = engine_spec(
        profile,
        adapter,
        runtime,
        name=name,
        labels=labels.labels_for(
            run_id=run_id, phase=labels.PHASE_SERVE, config_hash=resolved.config_hash, profile=profile.name
        ),
        cache_mount=mount,
        image=image_id,
        # Serving must load the blessed cache: a failed load fails the start instead of recompiling.
        extra_env=adapter.replay_env() if not debug else None,
        debug=debug,
        host_ip=profile.serving_host,
        host_port=profile.serving_port,
        log_path=serve_dir / ENGINE_LOG,
    )
    secret = frozenset(key for key in spec.env if adapter.env_policy.is_secret(key))
    return LaunchPlan(
        profile=profile,
        debug=debug,
        config_hash=resolved.config_hash,
        resolved=resolved,
        run_id=run_id,
        spec=spec,
        serve_dir=serve_dir,
        mount=mount,
        client_host=_client_host(profile.serving_host),
        manifest=manifest,
        manifest_path=manifest_path,
        blessed_dir=blessed_dir,
        verification=verification,
        snapshot=snapshot,
        secret_env=secret,
        adapter=adapter,
        allowed_unsafe=tuple(allowed),
        warnings=tuple(warnings),
        timings={"preflight_s": t1 - t0, "resolve_s": t2 - t1, "verify_s": t3 - t2},
    )


# --------------------------------------------------------------------------------------------
# Start, canary


@dataclass(frozen=True)
class CanaryCheck:
    """One golden prompt replayed against the served engine."""

    prompt: str
    max_tokens: int
    expected_token_ids: tuple[int, ...]
    got_token_ids: tuple[int, ...]
    expected_text: str
    got_text: str

    @property
    def match(self) -> bool:
        # Both: an engine that returns no token ids (vLLM's completions) must still match on text.
        return self.expected_token_ids == self.got_token_ids and self.expected_text == self.got_text

    def describe(self) -> str:
        """Expected vs got, in token ids when they differ, else in text."""
        if self.expected_token_ids != self.got_token_ids:
            return f"expected {list(self.expected_token_ids)} got {list(self.got_token_ids)}"
        return f"expected text {self.expected_text!r} got {self.got_text!r}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "match": self.match,
            "expected_token_ids": list(self.expected_token_ids),
            "got_token_ids": list(self.got_token_ids),
            "expected_text": self.expected_text,
            "got_text": self.got_text,
        }


@dataclass(frozen=True)
class CanaryResult:
    """``status``: passed, failed, or skipped (with ``reason``)."""

    status: str
    checks: tuple[CanaryCheck, ...] = ()
    seconds: float = 0.0
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "seconds": round(self.seconds, 4),
            "checks": [check.to_dict() for check in self.checks],
        }


def run_canary(client: EngineClient, golden: Sequence[Mapping[str, Any]]) -> CanaryResult:
    """Each golden prompt with its max_tokens; passed only when every text and token id sequence is identical."""
    started = time.monotonic()
    expected = golden_token_map(golden)
    checks: list[CanaryCheck] = []
    for item in golden:
        prompt = str(item["prompt"])
        max_tokens = int(item["max_tokens"])
        completion = client.complete(prompt, max_tokens)
        checks.append(
            CanaryCheck(
                prompt=prompt,
                max_tokens=max_tokens,
                expected_token_ids=expected[prompt],
                got_token_ids=completion.token_ids,
                expected_text=str(item.get("text", "")),
                got_text=completion.text,
            )
        )
    passed = bool(checks) and all(check.match for check in checks)
    return CanaryResult("passed" if passed else "failed", tuple(checks), time.monotonic() - started)


@dataclass(frozen=True)
class LaunchResult:
    """A started, ready, canary-checked engine. ``started`` is the runtime's handle for follow/finish."""

    plan: LaunchPlan
    started: Started
    url: str
    canary: CanaryResult
    recheck: str
    timings: Mapping[str, float]
    detached: bool
    warnings: tuple[str, ...] = ()

    @property
    def container_name(self) -> str:
        return self.started.name

    @property
    def container_id(self) -> str:
        return self.started.id

    @property
    def host_port(self) -> int | None:
        return self.started.host_port

    @property
    def upper_dir(self) -> Path | None:
        """Where the engine's writes land (the overlay's upper layer), while it runs."""
        mount = self.plan.mount
        return mount.scratch / "upper" if mount is not None and mount.scratch is not None else None

    def to_dict(self) -> dict[str, Any]:
        warnings = list(self.plan.warnings) + list(self.warnings)
        if self.canary.status == "skipped" and self.plan.blessed:
            warnings.append(NO_CANARY_BANNER)
        return {
            "blessed": self.plan.blessed,
            "debug": self.plan.debug,
            "config_hash": self.plan.config_hash,
            "container": {"name": self.container_name, "id": self.container_id},
            "host_ip": self.plan.spec.host_ip,
            "host_port": self.host_port,
            "url": self.url,
            "detached": self.detached,
            "canary": self.canary.to_dict(),
            "recheck": self.recheck,
            "serve_dir": str(self.plan.serve_dir),
            "upper_dir": str(self.upper_dir) if self.upper_dir else None,
            "notes": list(self.started.notes),
            "warnings": warnings,
            "timings": {key: round(value, 4) for key, value in self.timings.items()},
        }


def _save_evidence(serve_dir: Path, log: str, extra: Mapping[str, Any] | None = None) -> None:
    """Keep the engine log (and the canary outcome) next to the upper layer. Best effort."""
    with contextlib.suppress(OSError):
        serve_dir.mkdir(parents=True, exist_ok=True)
        (serve_dir / ENGINE_LOG).write_text(log, encoding="utf-8", errors="replace")
        if extra is not None:
            (serve_dir / CANARY_FILE).write_text(json.dumps(extra, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _upper_summary(entries: Sequence[UpperEntry]) -> list[dict[str, Any]]:
    return [{"path": e.path, "kind": e.kind, "size": e.size} for e in entries[:_MAX_UPPER_REPORTED]]


def _session(plan_: LaunchPlan, runtime: Runtime, *, started: Started | None = None) -> EngineSession:
    trials = plan_.profile.trials
    return EngineSession(
        runtime,
        plan_.spec,
        ready_timeout_s=trials.ready_timeout_s,
        request_timeout_s=trials.request_timeout_s,
        stop_timeout_s=trials.stop_timeout_s,
        started=started,
        client_host=plan_.client_host,
    )


def start(
    plan_: LaunchPlan,
    *,
    runtime: Runtime,
    no_canary: bool = False,
    detach: bool = False,
    keep_upper_on_interrupt: bool = False,
    events: EventSink = ignore_events,
) -> LaunchResult:
    """Start the planned engine, wait until ready, re-check the blessed files, run the canary.

    Failures stop the container and remove it, keep the serve dir (upper layer + ``engine.log``)
    as evidence and raise: EngineFailedError (44) when it never became ready, CacheChangedError
    (43) when a blessed file changed, CanaryFailedError (42) when an output differs from the
    golden one. On success the engine is left running (foreground or detached alike): the
    caller follows it and calls :func:`finish`, or leaves it to the operator (``--detach``).
    """
    timings = dict(plan_.timings)
    session = _session(plan_, runtime)
    try:
        plan_.serve_dir.mkdir(parents=True, exist_ok=False)
    except OSError as exc:
        raise InputInvalidError(
            f"cannot create the serve dir {plan_.serve_dir}: {exc.strerror or exc}",
            hint="check that the store root is writable",
        ) from None
    try:
        with ExitStack() as stack:
            events(Event("phase", f"starting container {plan_.spec.name}"))
            t0 = time.perf_counter()
            stack.enter_context(session)
            started = session.started
            assert started is not None
            timings["create_s"] = time.perf_counter() - t0
            if started.host_port is None:
                session.stop()
                raise EngineFailedError(
                    f"container {started.name} published no port; engine log tail:\n{log_tail(session.log)}",
                    hint="read the engine log; check the image and the command",
                )
            client = session.client
            events(Event("phase", "waiting for the engine to become ready"))
            try:
                session.wait_ready()
            except NotReadyError as exc:
                message = session.not_ready_message(exc)
                session.stop()
                _save_evidence(plan_.serve_dir, session.log)
                raise EngineFailedError(
                    message,
                    hint=f"read the engine log (kept in {plan_.serve_dir / ENGINE_LOG}); the serve dir is kept",
                    details={"serve_dir": str(plan_.serve_dir)},
                ) from None
            timings["start_to_ready_s"] = time.perf_counter() - t0
            events(
                Event(
                    "ready", f"ready in {timings['start_to_ready_s']:.1f} s", {"seconds": timings["start_to_ready_s"]}
                )
            )

            recheck = "skipped (debug: no blessed cache)"
            if plan_.snapshot is not None:
                t_check = time.perf_counter()
                changes = plan_.snapshot.changes()
                timings["recheck_s"] = time.perf_counter() - t_check
                if changes:
                    session.stop()
                    _save_evidence(plan_.serve_dir, session.log)
                    assert plan_.blessed_dir is not None
                    raise cache_changed_error(
                        changes,
                        when="between verification and the engine becoming ready",
                        blessed_dir=plan_.blessed_dir,
                    )
                recheck = f"unchanged ({len(plan_.snapshot.stamps)} entries)"
                events(
                    Event("note", f"blessed files unchanged since verification ({len(plan_.snapshot.stamps)} entries)")
                )

            if plan_.manifest is not None:
                not_used = _cache_not_used(plan_, session)
                if not_used:
                    session.stop()
                    _save_evidence(plan_.serve_dir, session.log)
                    raise CacheNotUsedError(
                        "; ".join(not_used),
                        hint=f"the engine log is kept in {plan_.serve_dir / ENGINE_LOG}; a config the config hash "
                        "considers equal made the engine compile or key its cache differently: report it, and bless "
                        "this machine's configuration (bless run --rebless)",
                        details={"serve_dir": str(plan_.serve_dir), "reasons": not_used},
                    )
            canary = _canary(plan_, session, client, no_canary=no_canary, events=events)
            timings["canary_s"] = canary.seconds
            # Success: the engine stays up; follow()/finish() or the operator take over.
            stack.pop_all()
    except BaseException as exc:
        # The session's exit stopped and removed the container. Nothing to keep when no container
        # ever ran, or when the user interrupted the start (unless asked to keep it).
        interrupted = isinstance(exc, KeyboardInterrupt) and not keep_upper_on_interrupt
        if session.started is None or interrupted:
            discard_serve_dir(plan_.serve_dir, runtime=runtime, image=plan_.spec.image)
        raise
    return LaunchResult(
        plan=plan_,
        started=started,
        url=f"http://{plan_.client_host}:{started.host_port}",
        canary=canary,
        recheck=recheck,
        timings=timings,
        detached=detach,
    )


def _cache_not_used(plan_: LaunchPlan, session: EngineSession) -> list[str]:
    """Why the boot log says the engine did not serve from the blessed artifact (empty: it did).

    The same reuse signals as a trial's: a load marker, no compile/save marker, and the engine's own
    cache key equal to the blessing's. Fail closed: a compile here means the served artifact is not
    the one the trials proved, whatever the canary says.
    """
    assert plan_.manifest is not None
    signals = plan_.adapter.read_log(session.current_log())
    reasons: list[str] = []
    if signals.compile_markers:
        reasons.append(
            f"the engine log shows {len(signals.compile_markers)} compile/save marker(s): it did not use the blessed "
            f"artifact as is ({signals.compile_markers[0].strip()[:200]})"
        )
    if not signals.load_markers:
        reasons.append("the engine log shows no load marker: it did not load the blessed artifact")
    blessed_keys = plan_.manifest.artifacts.get("engine_keys", {})
    reasons.extend(plan_.adapter.drift_reasons(blessed_keys, signals.engine_keys))
    return reasons


def _canary(
    plan_: LaunchPlan, session: EngineSession, client: EngineClient, *, no_canary: bool, events: EventSink
) -> CanaryResult:
    """Run the canary (or say loudly why not); failures stop the engine and raise 42 or 44."""
    if plan_.manifest is None:
        reason = "debug start: no golden outputs (not a blessed start)"
        events(Event("warning", f"canary skipped: {reason}"))
        return CanaryResult("skipped", reason=reason)
    if no_canary:
        events(Event("warning", NO_CANARY_BANNER))
        return CanaryResult("skipped", reason="--no-canary")
    events(Event("phase", f"canary: {len(plan_.manifest.golden)} golden prompt(s)"))
    try:
        result = run_canary(client, plan_.manifest.golden)
    except EngineHttpError as exc:
        alive = session.is_alive()
        session.stop()
        _save_evidence(plan_.serve_dir, session.log)
        if not alive:
            raise EngineFailedError(
                f"the engine exited during the canary ({exc.message}); engine log tail:\n{log_tail(session.log)}",
                hint=f"read the engine log (kept in {plan_.serve_dir / ENGINE_LOG})",
                details={"serve_dir": str(plan_.serve_dir)},
            ) from None
        raise CanaryFailedError(
            f"a canary request failed: {exc.message}",
            hint=f"read the engine log (kept in {plan_.serve_dir / ENGINE_LOG}); the engine was stopped",
            details={"serve_dir": str(plan_.serve_dir)},
        ) from None
    if result.status == "passed":
        events(Event("note", f"canary passed: {len(result.checks)} prompt(s) reproduced the golden token ids"))
        return result
    session.stop()
    upper = session.upper
    upper_dir = plan_.mount.scratch / "upper" if plan_.mount is not None and plan_.mount.scratch else None
    _save_evidence(plan_.serve_dir, session.log, {"canary": result.to_dict(), "upper": _upper_summary(upper)})
    bad = [check for check in result.checks if not check.match]
    lines = [
        f"  {check.prompt!r} (max_tokens {check.max_tokens}): {check.describe()}"
        for check in bad[:_MAX_PROBLEMS_IN_MESSAGE]
    ]
    if not result.checks:
        lines = ["  the manifest has no golden outputs"]
    written = f"{len(upper)} path(s) written" if upper else "nothing written"
    raise CanaryFailedError(
        f"{len(bad)} of {len(result.checks)} golden prompt(s) differ from the blessed output; the container "
        f"was stopped and removed\n" + "\n".join(lines) + f"\nupper layer kept: {upper_dir} ({written})",
        hint=f"do not serve this engine: the blessed cache verified but its outputs differ. Evidence in "
        f"{plan_.serve_dir} ({ENGINE_LOG}, {CANARY_FILE}, upper/); re-bless if the image or hardware changed",
        details={
            "canary": result.to_dict(),
            "serve_dir": str(plan_.serve_dir),
            "upper_dir": str(upper_dir) if upper_dir else None,
            "upper_kept": True,
            "upper_entries": _upper_summary(upper),
        },
    )


# --------------------------------------------------------------------------------------------
# Foreground: follow the log, then stop


def follow(
    runtime: Runtime,
    started: Started,
    sink: Callable[[str], None],
    *,
    stop: threading.Event,
    poll_s: float = 0.5,
) -> int | None:
    """Stream the engine's log to ``sink`` until it exits (returns its exit code) or ``stop`` is set (None).

    The runtime protocol has no log stream, so this polls the log and passes on what is new;
    ``stop`` is set by the caller's signal handler, so a signal never interrupts a runtime call.
    """
    offset = 0
    while True:
        running = runtime.is_running(started)
        text = runtime.logs(started)
        if len(text) < offset:
            offset = 0  # the runtime returned a shorter log (rotated): start over rather than lose lines
        if len(text) > offset:
            sink(text[offset:])
            offset = len(text)
        if not running:
            code = runtime.exit_code(started)
            return code if code is not None else -1
        if stop.wait(poll_s):
            return None


@dataclass(frozen=True)
class FinishResult:
    """How serving ended: the stop, and what became of the upper layer."""

    stop: StopResult | None
    upper_kept: bool
    upper_dir: str | None
    upper_entries: tuple[UpperEntry, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "stopped_gracefully": self.stop.graceful if self.stop else None,
            "exit_code": self.stop.exit_code if self.stop else None,
            "stop_seconds": round(self.stop.seconds, 3) if self.stop else None,
            "upper_kept": self.upper_kept,
            "upper_dir": self.upper_dir,
            "upper_written": len(self.upper_entries),
            "upper_entries": _upper_summary(self.upper_entries),
            "notes": list(self.notes),
        }


def discard_serve_dir(serve_dir: Path, *, runtime: Runtime, image: str | None) -> str | None:
    """Remove a serve dir (upper layer, work dir, log); returns why it could not be, or None."""
    if not os.path.lexists(serve_dir):
        return None
    try:
        shutil.rmtree(serve_dir)
        return None
    except OSError:
        pass
    # Files the engine wrote as root in its container; a helper container of ours makes them ours.
    try:
        runtime.normalize_ownership(serve_dir, image=image)
        shutil.rmtree(serve_dir)
        return None
    except (OSError, BlessError) as exc:
        return f"could not remove {serve_dir}: {exc}"


def finish(
    plan_: LaunchPlan, result: LaunchResult, *, runtime: Runtime, keep_upper: bool, failed: bool
) -> FinishResult:
    """Stop gracefully, remove the container, then discard the serve dir (kept with ``keep_upper`` or ``failed``)."""
    session = _session(plan_, runtime, started=result.started)
    notes: list[str] = []
    try:
        stop = session.stop()
    finally:
        runtime.remove(result.started)
    upper = tuple(session.upper)
    kept = keep_upper or failed
    if kept:
        _save_evidence(plan_.serve_dir, session.log)
    else:
        problem = discard_serve_dir(plan_.serve_dir, runtime=runtime, image=plan_.spec.image)
        if problem:
            notes.append(problem)
            kept = True
    upper_dir = result.upper_dir
    return FinishResult(
        stop=stop,
        upper_kept=kept,
        upper_dir=str(upper_dir) if kept and upper_dir else None,
        upper_entries=upper,
        notes=tuple(notes),
    )


__all__ = [
    "DEBUG_BANNER",
    "NO_CANARY_BANNER",
    "CanaryResult",
    "FinishResult",
    "LaunchPlan",
    "LaunchResult",
    "Snapshot",
    "Stamp",
    "StampChange",
    "check_gpu_memory",
    "check_name_free",
    "discard_serve_dir",
    "finish",
    "follow",
    "plan",
    "redact_command",
    "redact_env",
    "run_canary",
    "serve_container_name",
    "start",
]
