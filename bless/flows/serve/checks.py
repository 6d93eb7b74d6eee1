"""serve-full's checks of the world, in the order of its refusals (docs/concepts/serve-full.md).

Each check reads the runtime, the GPUs or the store and refuses, or returns what it found;
:func:`check_world` runs them in order and hands their facts (:class:`ServeFacts`) to
:func:`bless.flows.serve.plan.build_plan`, which decides from those alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bless import container_labels as labels
from bless.core.factors import GpuInfo, ResolvedConfig
from bless.core.manifest import Manifest
from bless.core.profile import HardwareSpec, Profile
from bless.core.verify import TreeCheck, verify_tree
from bless.engines.base import EngineAdapter
from bless.errors import ContainerConflictError, InsufficientGpuError, VerifyFailedError
from bless.flows.events import new_run_id
from bless.flows.resolve import ProfileResolution, no_manifest_error, resolve_for_command
from bless.flows.safety import check_unsafe
from bless.flows.serve.names import serve_container_name
from bless.flows.serve.serve_dir import new_serve_dir
from bless.flows.serve.snapshot import Snapshot, cache_changed_error
from bless.probes import probe_gpus
from bless.replay.devices import GpuSlot, has_free_memory, required_free_mib, serving_slot
from bless.runtime.base import Runtime
from bless.store import LiveManifest, Store


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
            "nothing was started: serve again, and verify the blessing to audit the store",
            details={**found.details, "original": str(blessed_dir), "copy": str(copy)},
            remedy="serve_again_and_verify",
        )


def check_gpu_memory(spec: HardwareSpec, gpus: Sequence[GpuInfo]) -> None:
    """Refuse (52) unless the first ``gpu_count`` GPUs (the engine's, in rank order) each have
    ``min_gpu_memory_gib`` free."""
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
    short = [(rank, gpu) for rank, gpu in enumerate(gpus[:count]) if not has_free_memory(gpu, need_mib)]
    if short:
        listed = ", ".join(
            f"rank {rank} on GPU {gpu.index} ({gpu.name}): {gpu.memory_free_mib / 1024:.1f} GiB free of "
            f"{gpu.memory_total_mib / 1024:.1f}"
            for rank, gpu in short
        )
        raise InsufficientGpuError(
            f"the profile needs {spec.min_gpu_memory_gib:g} GiB of free GPU memory per GPU; {listed}",
            hint="stop what uses the GPU memory (nvidia-smi shows the processes), or lower "
            "hardware.min_gpu_memory_gib if the engine really needs less",
            details={
                "min_gpu_memory_gib": spec.min_gpu_memory_gib,
                "short": [
                    {
                        "rank": rank,
                        "index": gpu.index,
                        "uuid": gpu.uuid,
                        "name": gpu.name,
                        "free_mib": gpu.memory_free_mib,
                        "total_mib": gpu.memory_total_mib,
                    }
                    for rank, gpu in short
                ],
            },
        )


def check_name_free(runtime: Runtime, profile: Profile, name: str, *, root: Path | None = None) -> None:
    """Refuse (12) when the serving container name is taken: ours (serving already) or foreign (never touched).

    ``root``: the store root, recorded in the refusal's details (the command line's stop command names it).
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
            hint="stop that serve from its own root",
            details={
                "name": name,
                "holder": "ours",
                "status": status,
                "store_root": owner_root,
                "profile_name": profile.name,
            },
            remedy="stop_from_own_root",
        )
    if status == "running":
        message = f"{profile.label} is already running: container {name!r} of ours is up"
        hint, remedy = "use the running engine, or stop its detached serve first", "use_or_stop_serve"
    else:
        message = f"container {name!r} of ours already exists ({status}): a stopped serve-full --detach left it"
        hint, remedy = "remove it (stop its detached serve), then retry", "stop_serve_then_retry"
    raise ContainerConflictError(
        message,
        hint=hint,
        details={
            "name": name,
            "holder": "ours",
            "status": status,
            "profile_name": profile.name,
            "store_root": str(root) if root is not None else None,
        },
        remedy=remedy,
    )


@dataclass(frozen=True)
class Preflight:
    """What the runtime and the GPUs say before anything is resolved."""

    #: The image's ID (Docker), read once: the container starts from it, so a tag moved later changes nothing.
    image_id: str | None
    #: The GPUs the engine will run on, in rank order (CUDA profiles): checked for memory, the hardware factor's,
    #: and handed to the runtime by UUID.
    gpus: tuple[GpuInfo, ...] | None

    @property
    def slot(self) -> GpuSlot:
        """The engine's GPUs as a slot: rank r on the r-th (no GPUs for a CPU profile)."""
        return GpuSlot(0, self.gpus or ())


def preflight(
    profile: Profile,
    runtime: Runtime,
    gpu_probe: Callable[[], list[GpuInfo]],
    cuda_visible_devices: str | None = None,
) -> Preflight:
    """The runtime reachable (50), the image present (51), the engine's GPUs bound to its ranks (53, 52, 32), those
    GPUs with the memory the profile states (52).

    ``cuda_visible_devices``: the operator's ``CUDA_VISIBLE_DEVICES`` (None: unset), which selects and orders the
    probed GPUs (:func:`bless.replay.devices.serving_slot`).
    """
    runtime.ping()
    image_id = runtime.resolve_image(profile.image or "") if profile.runtime_kind == "docker" else None
    if profile.hardware.accelerator != "cuda":
        return Preflight(image_id, None)
    slot = serving_slot(profile.hardware, gpu_probe(), cuda_visible_devices)
    check_gpu_memory(profile.hardware, slot.gpus)
    return Preflight(image_id, slot.gpus)


def resolve_here(profile: Profile, adapter: EngineAdapter, found: Preflight) -> ProfileResolution:
    """The factors and config hash of ``profile`` on the image and GPUs the preflight found."""
    return resolve_for_command(
        profile,
        # The ID read above, not the tag again: the container is started from this ID, so a tag
        # moved after this point cannot change what runs.
        image_resolver=lambda _reference: found.image_id or "",
        hardware="probe",
        gpus=found.gpus,
        adapter=adapter,
    )


def live_manifest(store: Store, resolved: ResolvedConfig) -> LiveManifest:
    """The live manifest of the config hash, with the bytes it was parsed from (20 with the drift: none)."""
    live = store.live(resolved.config_hash)
    if live is None:
        raise no_manifest_error(store, resolved)
    return live


@dataclass(frozen=True)
class VerifiedBlessing:
    """The live manifest served, its blessed tree verified, and the identity snapshot stamped before hashing."""

    live: LiveManifest
    verification: TreeCheck
    snapshot: Snapshot
    #: What the verification noticed without refusing (mixed owners, writable entries).
    warnings: tuple[str, ...] = ()

    @property
    def manifest(self) -> Manifest:
        return self.live.manifest

    @property
    def blessed_dir(self) -> Path:
        """The verified blessed tree: the one the store verified and the snapshot stamped."""
        return self.snapshot.root


def verify_blessing(store: Store, live: LiveManifest) -> VerifiedBlessing:
    """Every blessed file verified, with an identity snapshot stamped before hashing (21, 43 otherwise)."""
    manifest = live.manifest
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

    verification = store.verify_blessing(manifest, before_hashing=stamp, live=live)
    snapshot = snapshots[0]
    blessed_dir = snapshot.root
    if not verification.ok:
        raise VerifyFailedError.from_result(verification, blessed_dir, config_hash=manifest.config_hash)
    changes = snapshot.changes()
    if changes:
        raise cache_changed_error(changes, when="while it was being verified", blessed_dir=blessed_dir)
    warnings: list[str] = []
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
    return VerifiedBlessing(live, verification, snapshot, tuple(warnings))


@dataclass(frozen=True)
class ServeFacts:
    """What :func:`check_world` found, every refusal passed: all the plan is built from."""

    debug: bool
    #: The factors and config hash, and the adapter specialised for them (its version allowed).
    resolution: ProfileResolution
    image_id: str | None
    container_name: str
    #: The blessing served (None for ``--debug``: no manifest is looked up).
    blessing: VerifiedBlessing | None
    #: This start's serve dir (not created yet) and run id: fresh for each start.
    serve_dir: Path
    run_id: str
    #: The runtime presents mounts as writable copies (:attr:`Runtime.copies_mounts`).
    copies_mounts: bool
    #: The GPUs the engine runs on, in rank order (no GPUs for a CPU profile).
    slot: GpuSlot
    allowed_unsafe: tuple[str, ...]
    warnings: tuple[str, ...]
    timings: Mapping[str, float]


def check_world(
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
    cuda_visible_devices: str | None = None,
) -> ServeFacts:
    """Run serve-full's checks in the order of its refusals; every refusal happens here (parameters: as ``plan``)."""
    t0 = time.perf_counter()
    found = preflight(profile, runtime, gpu_probe, cuda_visible_devices)
    t1 = time.perf_counter()
    resolution = resolve_here(profile, adapter, found)
    warnings: list[str] = []
    allowed = _allowed_unsafe(resolution, debug=debug, allow_test_knobs=allow_test_knobs)
    if allowed:
        warnings.append("unsafe settings allowed: " + "; ".join(allowed))
    name = serve_container_name(profile.name, per_root=store.root)
    check_name_free(runtime, profile, name, root=store.root)
    # The rules of the resolved engine version (vLLM: its markers and force-load switch); unknown
    # versions are refused here, before anything starts, unless allowed.
    engine = resolution.adapter
    engine.require_known_version(allow_unknown=allow_unknown_engine_version)
    warnings.extend(f"{engine.name} adapter: {note}" for note in engine.notes() if "no entry" in note)
    live = None if debug else live_manifest(store, resolution.resolved)
    t2 = time.perf_counter()
    blessing = verify_blessing(store, live) if live is not None else None
    t3 = time.perf_counter()
    return ServeFacts(
        debug=debug,
        resolution=resolution,
        image_id=found.image_id,
        container_name=name,
        blessing=blessing,
        serve_dir=new_serve_dir(store.paths.serve, profile.name, now),
        run_id=new_run_id(),
        copies_mounts=runtime.copies_mounts,
        slot=found.slot,
        allowed_unsafe=tuple(allowed),
        warnings=(*warnings, *(blessing.warnings if blessing is not None else ())),
        timings={"preflight_s": t1 - t0, "resolve_s": t2 - t1, "verify_s": t3 - t2},
    )


def _allowed_unsafe(resolution: ProfileResolution, *, debug: bool, allow_test_knobs: bool) -> list[str]:
    """The unsafe settings of the resolved factors and env let through: --debug runs them, all else refuses them."""
    if debug:  # no blessed cache is used
        return [u.describe() for u in resolution.adapter.unsafe_settings(resolution.resolved)]
    return check_unsafe(resolution.resolved, resolution.adapter, allow_test_knobs=allow_test_knobs)
