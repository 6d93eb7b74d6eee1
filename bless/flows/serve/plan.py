"""Preflight and plan: every decision and every refusal of serve-full, before anything is created."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from bless import container_labels as labels
from bless.core.factors import GpuInfo, ResolvedConfig
from bless.core.manifest import Manifest
from bless.core.profile import HardwareSpec, Profile
from bless.core.verify import VerifyResult, verify_tree
from bless.engines.base import EngineAdapter
from bless.errors import ContainerConflictError, InsufficientGpuError, VerifyFailedError
from bless.flows.engine_start import EngineSession, engine_spec
from bless.flows.events import new_run_id
from bless.flows.resolve import no_manifest_error, resolve_profile
from bless.flows.safety import check_unsafe
from bless.flows.serve.names import serve_container_name, stop_command
from bless.flows.serve.serve_dir import ENGINE_LOG, PRIVATE_DIR, new_serve_dir
from bless.flows.serve.snapshot import Snapshot, cache_changed_error
from bless.probes import hardware_factor, probe_gpus
from bless.replay.devices import has_free_memory, required_free_mib
from bless.runtime.base import ContainerSpec, Mount, Runtime, Started
from bless.runtime.upper import check_overlay_path
from bless.store import Store

_LOOPBACK_FOR = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}

DEBUG_BANNER = (
    "DEBUG START, NOT BLESSED: no manifest was checked, no compiled cache is mounted, the engine runs "
    "eager (compile off). Outputs and performance are not what a blessed start serves."
)


def verify_copy(manifest: Manifest, blessed_dir: Path, copy: Path) -> None:
    """Refuse (21) unless ``copy`` holds exactly the blessed files: the runtime copied ``blessed_dir`` there.

    A runtime without mounts (the local runtime's copy mode, e.g. serve-full in a pod without
    CAP_SYS_ADMIN) serves a writable copy of the blessed tree; this is the check that the engine starts
    on what was verified. Write bits are not judged: the copy is writable on purpose (the engine writes
    where an overlay would have taken its writes).
    """
    result = verify_tree(copy, manifest.cache.files, manifest.cache.dirs, expect_read_only=False)
    if not result.ok:
        found = VerifyFailedError.from_result(result, copy, config_hash=manifest.config_hash)
        raise VerifyFailedError(
            f"the copy the engine would read is not the verified blessing: {found.message}",
            hint=f"something changed the copy at {copy} or the blessed tree {blessed_dir} while it was copied; "
            "nothing was started: run serve-full again, and bless verify to audit the store",
            details={**found.details, "original": str(blessed_dir)},
        )


def check_gpu_memory(spec: HardwareSpec, gpus: Sequence[GpuInfo]) -> None:
    """Refuse (52) unless the first ``gpu_count`` GPUs each have ``min_gpu_memory_gib`` free."""
    need_mib = required_free_mib(spec)
    if need_mib is None:
        return
    count = spec.gpu_count or 1
    if len(gpus) < count:
        raise InsufficientGpuError(
            f"the profile needs {count} GPU(s) with {spec.min_gpu_memory_gib:g} GiB free each; "
            f"this machine has {len(gpus)} GPU(s)",
            hint="run on a host with enough GPUs (nvidia-smi lists them)",
            details={"needed_gpus": count, "found_gpus": len(gpus)},
        )
    short = [(index, gpu) for index, gpu in enumerate(gpus[:count]) if not has_free_memory(gpu, need_mib)]
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


def check_name_free(runtime: Runtime, profile: Profile, name: str, *, root: Path | None = None) -> None:
    """Refuse (12) when the serving container name is taken: ours (serving already) or foreign (never touched).

    ``root``: the store root, named in the stop command of the hint (see :func:`stop_command`).
    """
    holder = runtime.name_holder(name)
    if holder == "free":
        # What else a real start would refuse (a volume in the overlay's place): a --dry-run says it too.
        conflict = runtime.overlay_conflict(name)
        if conflict is not None:
            raise ContainerConflictError(
                f"{conflict}; it holds the overlay of {name!r}, so a start would be refused",
                hint=f"remove it yourself if it is safe (docker volume rm {name}-overlay), or serve this profile "
                "under another name (the profile's name field)",
                details={"name": name, "holder": "foreign-volume"},
            )
        return
    if holder == "foreign":
        raise ContainerConflictError(
            f"a container without our labels holds the name {name!r}; never touched: bless does not stop or "
            "remove containers it did not create",
            hint=f"rename or remove that container yourself if it is safe (docker rm {name}), or serve this "
            "profile under another name (the profile's name field)",
            details={"name": name, "holder": "foreign"},
        )
    info = next((info for info in runtime.list_ours({labels.PROFILE: profile.name}) if info.name == name), None)
    status = info.status if info is not None else "unknown"
    owner_root = labels.other_store_root(info.labels, root) if info is not None and root is not None else None
    if owner_root is not None:
        # Its lease and serve dir live under the owner's root: only a stop run there cleans them up.
        raise ContainerConflictError(
            f"container {name!r} ({status}) is the serve of another store root, {owner_root}",
            hint=f"serve this profile under a name of this root (serve-full --name-per-root), or stop that "
            f"serve from its own root ({stop_command(profile.name, Path(owner_root))})",
            details={"name": name, "holder": "ours", "status": status, "store_root": owner_root},
        )
    if status == "running":
        message = f"{profile.label} is already running: container {name!r} of ours is up"
        hint = f"use the running engine, or stop it first ({stop_command(profile.name, root)})"
    else:
        message = f"container {name!r} of ours already exists ({status}): a stopped serve-full --detach left it"
        hint = f"remove it ({stop_command(profile.name, root)}), then retry"
    raise ContainerConflictError(message, hint=hint, details={"name": name, "holder": "ours", "status": status})


@dataclass(frozen=True)
class LaunchPlan:
    """Everything decided before a container exists. ``manifest`` is None for ``--debug``.

    What can be derived is a property, not a field: the profile and config hash come from
    ``resolved``, the blessed dir from the snapshot, the run id from the container's labels.
    """

    debug: bool
    resolved: ResolvedConfig
    spec: ContainerSpec
    serve_dir: Path
    mount: Mount | None
    manifest: Manifest | None
    manifest_path: Path | None
    verification: VerifyResult | None
    snapshot: Snapshot | None
    adapter: EngineAdapter
    #: The store the blessing is served from: the serving flow holds its lease there while it serves.
    store: Store
    #: The manifest file's bytes as parsed (what a signature covers); None for ``--debug``.
    manifest_bytes: bytes | None = field(default=None, repr=False)
    allowed_unsafe: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)

    @property
    def blessed(self) -> bool:
        """True for a blessed start (a verified manifest), False for ``--debug``."""
        return not self.debug

    @property
    def profile(self) -> Profile:
        return self.resolved.profile

    @property
    def config_hash(self) -> str:
        return self.resolved.config_hash

    @property
    def run_id(self) -> str:
        return self.spec.labels[labels.RUN_ID]

    @property
    def blessed_dir(self) -> Path | None:
        """The verified blessed tree (None for ``--debug``)."""
        return self.snapshot.root if self.snapshot is not None else None

    @property
    def container_name(self) -> str:
        return self.spec.name

    @property
    def presented_as(self) -> str | None:
        """How the engine sees the blessed tree, in words for the plan and the log (None: no cache)."""
        if self.mount is None:
            return None
        if self.mount.check_copy is not None:
            return (
                "verified copy: no mount namespace here (a pod without CAP_SYS_ADMIN, or not root), so the blessed "
                "tree is copied to the cache path and the copy hashed against the manifest before the engine "
                "starts; read-only is not enforced on the copy"
            )
        if self.mount.kind == "overlay":
            return "overlay: the blessed tree is the read-only lower layer; the engine's writes go to an upper layer"
        return "read-only bind of the blessed tree"

    @property
    def store_root(self) -> Path:
        """The store root this serve uses: the serve dir is ``<root>/serve/<dir>``."""
        return self.serve_dir.parent.parent

    @property
    def client_host(self) -> str:
        """Where we reach the published port: loopback for wildcard binds, brackets around IPv6."""
        serving_host = self.profile.serving_host
        host = _LOOPBACK_FOR.get(serving_host, serving_host)
        return f"[{host}]" if ":" in host else host

    def session(self, runtime: Runtime, *, started: Started | None = None) -> EngineSession:
        """The engine session for this plan (``started``: attach to an engine already running)."""
        trials = self.profile.trials
        return EngineSession(
            runtime,
            self.spec,
            ready_timeout_s=trials.ready_timeout_s,
            request_timeout_s=trials.request_timeout_s,
            stop_timeout_s=trials.stop_timeout_s,
            started=started,
            client_host=self.client_host,
            completion_fields=self.adapter.completion_fields,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plan; secret env values (and secret-looking flags) are ``<redacted>``."""
        spec = self.spec
        policy = self.adapter.env_policy
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
                    "presented_as": self.presented_as,
                }
                if self.mount
                else None
            ),
            "container": {
                "name": spec.name,
                "image": spec.image,
                "command": policy.redact_command(spec.command),
                "env": policy.redact_env(spec.env),
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
    name_per_root: bool = False,
) -> LaunchPlan:
    """Decide how to serve ``profile``; every refusal happens here, before any container exists.

    The order of the refusals is written down once, in docs/concepts/serve-full.md ("Refusals, in
    order"); unsafe debug settings are allowed with ``debug``. With ``debug`` no manifest is
    looked up and no cache is mounted. ``allow_test_knobs`` lets the reference engine's test knobs
    through (bless's own tests; the serve-full command never sets it). ``name_per_root``: the container
    name carries a tag of the store root (:func:`serve_container_name`).
    """
    t0 = time.perf_counter()
    image_id, gpus = _preflight(profile, runtime, gpu_probe)
    t1 = time.perf_counter()
    resolved = _resolve(profile, adapter, image_id, gpus)
    warnings: list[str] = []
    allowed = _allowed_unsafe(resolved, adapter, debug=debug, allow_test_knobs=allow_test_knobs)
    if allowed:
        warnings.append("unsafe settings allowed: " + "; ".join(allowed))
    name = serve_container_name(profile.name, per_root=store.root if name_per_root else None)
    check_name_free(runtime, profile, name, root=store.root)
    # The rules of the resolved engine version (vLLM: its markers and force-load switch); unknown
    # versions are refused here, before anything starts, unless allowed.
    adapter = adapter.for_factors(resolved.factors)
    adapter.require_known_version(allow_unknown=allow_unknown_engine_version)
    warnings.extend(f"{adapter.name} adapter: {note}" for note in adapter.notes() if "no entry" in note)
    manifest_path, manifest, manifest_bytes = (None, None, None) if debug else _live_manifest(store, resolved)
    t2 = time.perf_counter()
    verification, snapshot = _verify_blessed(store, manifest, warnings) if manifest is not None else (None, None)
    t3 = time.perf_counter()
    serve_dir = new_serve_dir(store.paths.serve, profile.name, now)
    mount = _cache_mount(profile, adapter, runtime, store, manifest, serve_dir, warnings)
    spec = _serve_spec(
        resolved, adapter, runtime, store, name=name, image_id=image_id, mount=mount, serve_dir=serve_dir, debug=debug
    )
    return LaunchPlan(
        debug=debug,
        resolved=resolved,
        spec=spec,
        serve_dir=serve_dir,
        mount=mount,
        manifest=manifest,
        manifest_path=manifest_path,
        verification=verification,
        snapshot=snapshot,
        adapter=adapter,
        store=store,
        manifest_bytes=manifest_bytes,
        allowed_unsafe=tuple(allowed),
        warnings=tuple(warnings),
        timings={"preflight_s": t1 - t0, "resolve_s": t2 - t1, "verify_s": t3 - t2},
    )


def _preflight(
    profile: Profile, runtime: Runtime, gpu_probe: Callable[[], list[GpuInfo]]
) -> tuple[str | None, list[GpuInfo] | None]:
    """The runtime reachable, the image present (its ID), the GPUs with the memory the profile states."""
    runtime.ping()
    image_id = runtime.resolve_image(profile.image or "") if profile.runtime_kind == "docker" else None
    gpus: list[GpuInfo] | None = None
    if profile.hardware.accelerator == "cuda":
        gpus = gpu_probe()
        check_gpu_memory(profile.hardware, gpus)
    return image_id, gpus


def _resolve(
    profile: Profile, adapter: EngineAdapter, image_id: str | None, gpus: list[GpuInfo] | None
) -> ResolvedConfig:
    """The factors and config hash of ``profile`` on the image and GPUs the preflight found."""
    return resolve_profile(
        profile,
        # The ID read above, not the tag again: the container is started from this ID, so a tag
        # moved after this point cannot change what runs.
        image_resolver=lambda _reference: image_id or "",
        adapter=adapter,
        hardware_probe=lambda spec: hardware_factor(spec, gpus=gpus),
    )


def _allowed_unsafe(
    resolved: ResolvedConfig, adapter: EngineAdapter, *, debug: bool, allow_test_knobs: bool
) -> list[str]:
    """The unsafe settings of the resolved factors and env let through: --debug runs them, all else refuses them."""
    if debug:  # no blessed cache is used
        return [u.describe() for u in adapter.unsafe_settings(resolved)]
    return check_unsafe(resolved, adapter, allow_test_knobs=allow_test_knobs)


def _serve_spec(
    resolved: ResolvedConfig,
    adapter: EngineAdapter,
    runtime: Runtime,
    store: Store,
    *,
    name: str,
    image_id: str | None,
    mount: Mount | None,
    serve_dir: Path,
    debug: bool,
) -> ContainerSpec:
    """The serving container: labelled as a serve of this store, its log and private dir in the serve dir."""
    return engine_spec(
        resolved,
        adapter,
        runtime,
        name=name,
        labels=labels.labels_for(
            run_id=new_run_id(),
            phase=labels.PHASE_SERVE,
            config_hash=resolved.config_hash,
            profile=resolved.profile.name,
            store_root=store.root,
        ),
        cache_mount=mount,
        image=image_id,
        # Serving must load the blessed cache: a failed load fails the start instead of recompiling.
        extra_env=adapter.replay_env() if not debug else None,
        debug=debug,
        host_ip=resolved.profile.serving_host,
        host_port=resolved.profile.serving_port,
        log_path=serve_dir / ENGINE_LOG,
        private_dir=serve_dir / PRIVATE_DIR,
        # A compile the blessing does not hold is reported by the engine the moment Triton looks it up.
        seal=not debug,
    )


def _live_manifest(store: Store, resolved: ResolvedConfig) -> tuple[Path, Manifest, bytes]:
    """The live manifest of the config hash, and the bytes it was parsed from (NoManifestError: none)."""
    live = store.live(resolved.config_hash)
    if live is None:
        raise no_manifest_error(store, resolved)
    return live.path, live.manifest, live.document


def _verify_blessed(store: Store, manifest: Manifest, warnings: list[str]) -> tuple[VerifyResult, Snapshot]:
    """Every blessed file verified, with an identity snapshot stamped before hashing (21, 43 otherwise)."""
    blessed_dir = store.blessed_dir(manifest)
    files = [entry.path for entry in manifest.cache.files]
    snapshots: list[Snapshot] = []

    def stamp(tree: Path) -> None:
        # Stamped BEFORE hashing: whatever changes from here on (even during hashing) is caught.
        # blessed/<hash>/ in full, blessed/ and the store root by identity: the mounted path cannot be
        # re-pointed by swapping an ancestor away and back (snapshot's docstring says why not more).
        above = list(tree.parents)
        top = above.index(store.root) if store.root in above else 0
        snapshots.append(
            Snapshot.take(tree, files, manifest.cache.dirs, ancestors=above[:1], identity_only=above[1 : top + 1])
        )

    verification = store.verify_blessing(manifest, before_hashing=stamp)
    snapshot = snapshots[0]
    if not verification.ok:
        raise VerifyFailedError.from_result(verification, blessed_dir, config_hash=manifest.config_hash)
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
            "writable (blessed caches are read-only): " + ", ".join(notice.path for notice in verification.notices[:5])
        )
    return verification, snapshot


def _cache_mount(
    profile: Profile,
    adapter: EngineAdapter,
    runtime: Runtime,
    store: Store,
    manifest: Manifest | None,
    serve_dir: Path,
    warnings: list[str],
) -> Mount | None:
    """How the engine sees the blessed tree: a read-only bind, an overlay, or (no mounts) a verified copy."""
    if manifest is None:  # --debug: no cache
        return None
    blessed_dir = store.blessed_dir(manifest)
    if profile.cache_mount == "ro-bind" and adapter.readonly_bind_ok:
        mount = Mount("ro", blessed_dir, adapter.cache_mount_path)
    else:
        if profile.cache_mount == "ro-bind":
            warnings.append(
                f"cache.mount = 'ro-bind' but the {adapter.name} engine writes while loading: using an overlay"
            )
        move_root = "move the store root (--root / BLESS_ROOT) to a plain path"
        check_overlay_path(blessed_dir, "lower dir", hint=move_root)
        check_overlay_path(serve_dir, "scratch dir", hint=move_root)
        mount = Mount("overlay", blessed_dir, adapter.cache_mount_path, scratch=serve_dir)
    if runtime.copies_mounts:
        # The engine will read a copy, not the tree verified above: verify the copy too, before it starts.
        mount = dataclasses.replace(mount, check_copy=partial(verify_copy, manifest, blessed_dir))
    return mount
