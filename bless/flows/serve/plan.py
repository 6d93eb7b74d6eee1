"""The launch plan: every decision of serve-full, built from what its checks found, before anything is created.

:func:`plan` runs the checks of the world (:func:`bless.flows.serve.checks.check_world`: every refusal but
one, in order) and builds the plan from their facts with :func:`build_plan`, which reads nothing of the world.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from bless import container_labels as labels
from bless.core.factors import GpuInfo, ResolvedConfig
from bless.core.manifest import Manifest
from bless.core.profile import Profile
from bless.core.verify import TreeCheck
from bless.engines.base import EngineAdapter
from bless.flows.engine_start import EngineSession, engine_spec
from bless.flows.serve.checks import ServeFacts, VerifiedBlessing, check_world, verify_copy
from bless.flows.serve.serve_dir import ENGINE_LOG, PRIVATE_DIR
from bless.flows.serve.snapshot import Snapshot
from bless.probes import probe_gpus
from bless.replay.devices import GpuRank
from bless.runtime.base import ContainerSpec, Mount, Runtime, Started
from bless.runtime.upper import check_overlay_path
from bless.store import Store

_LOOPBACK_FOR = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}

DEBUG_BANNER = (
    "DEBUG START, NOT BLESSED: no manifest was checked, no compiled cache is mounted, the engine runs "
    "eager (compile off). Outputs and performance are not what a blessed start serves."
)


class PlanMount(TypedDict):
    """How the blessed tree reaches the engine."""

    kind: str
    source: str
    target: str
    upper_dir: str | None
    presented_as: str | None


class PlanContainer(TypedDict):
    """The engine's container or process, secrets redacted."""

    name: str
    image: str | None
    command: list[str]
    env: dict[str, str]
    #: Dirs put first on the engine's PYTHONPATH (bless's seal module, in a sealed start).
    python_path: list[str]
    labels: dict[str, str]
    home: str | None
    port: int | None
    host_ip: str
    host_port: int | None
    gpus: int | None


#: A serve's plan as ``serve-full --dry-run --json`` prints it: every check made, what would start. ``trust`` is
#: there for a blessed plan, ``from`` when the blessing was pulled first (a keyword: hence this spelling).
#: ``ranks``: the GPUs the engine runs on, ``{"rank", "index", "uuid", "name"}`` each, rank 0 first (empty on a
#: CPU profile).
ServePlan = TypedDict(
    "ServePlan",
    {
        "blessed": bool,
        "debug": bool,
        "banner": str | None,
        "profile": str,
        "profile_name": str,
        "config_hash": str,
        "run_id": str,
        "manifest_path": str | None,
        "blessed_dir": str | None,
        "golden_prompts": int,
        "serve_dir": str,
        "mount": PlanMount | None,
        "container": PlanContainer,
        "ranks": list[dict[str, Any]],
        "verification": dict[str, Any] | None,
        "snapshot": dict[str, Any] | None,
        "allowed_unsafe": list[str],
        "warnings": list[str],
        "timings": dict[str, float],
        "trust": NotRequired[dict[str, Any]],
        "from": NotRequired[dict[str, Any]],
    },
)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything decided before a container exists. ``manifest`` is None for ``--debug``.

    What can be derived is a property, not a field: the profile and config hash come from
    ``resolved``, the manifest, its file and bytes, the verification and the blessed dir from
    ``blessing``, the run id from the container's labels.
    """

    debug: bool
    resolved: ResolvedConfig
    spec: ContainerSpec
    serve_dir: Path
    mount: Mount | None
    #: The verified blessing served (None for ``--debug``).
    blessing: VerifiedBlessing | None
    adapter: EngineAdapter
    #: The store the blessing is served from: the serving flow holds its lease there while it serves.
    store: Store
    allowed_unsafe: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)
    #: The GPUs the engine runs on, rank 0 first (the spec's ``gpu_ids`` in this order); empty on a CPU profile.
    ranks: tuple[GpuRank, ...] = ()

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
    def manifest(self) -> Manifest | None:
        return self.blessing.manifest if self.blessing is not None else None

    @property
    def manifest_path(self) -> Path | None:
        return self.blessing.live.path if self.blessing is not None else None

    @property
    def manifest_bytes(self) -> bytes | None:
        """The manifest file's bytes as parsed (what a signature covers); None for ``--debug``."""
        return self.blessing.live.document if self.blessing is not None else None

    @property
    def verification(self) -> TreeCheck | None:
        return self.blessing.verification if self.blessing is not None else None

    @property
    def snapshot(self) -> Snapshot | None:
        return self.blessing.snapshot if self.blessing is not None else None

    @property
    def blessed_dir(self) -> Path | None:
        """The verified blessed tree (None for ``--debug``)."""
        return self.blessing.blessed_dir if self.blessing is not None else None

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

    def to_dict(self) -> ServePlan:
        """JSON-ready plan; secret env values (and secret-looking flags) are ``<redacted>``."""
        # By hand (not JsonForm): a redacted view of the profile, the mount and the container spec.
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
                "python_path": list(spec.python_path),
                "labels": dict(spec.labels),
                "home": spec.home,
                "port": spec.port,
                "host_ip": spec.host_ip,
                "host_port": spec.host_port,
                "gpus": spec.gpus,
            },
            "ranks": [rank.to_dict() for rank in self.ranks],
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
    cuda_visible_devices: str | None = None,
) -> LaunchPlan:
    """Decide how to serve ``profile``; every refusal happens here, before any container exists.

    The order of the refusals is written down once, in docs/concepts/serve-full.md ("Refusals, in
    order"); unsafe debug settings are allowed with ``debug``. With ``debug`` no manifest is
    looked up and no cache is mounted. ``allow_test_knobs`` lets the reference engine's test knobs
    through (bless's own tests; the serve-full command never sets it). The container's name carries a tag of
    the store root (:func:`serve_container_name`). ``adapter``: the engine's adapter before resolution
    specialises it. ``cuda_visible_devices``: the operator's ``CUDA_VISIBLE_DEVICES`` (None: unset), which selects
    and orders the GPUs the engine's ranks run on (docs/concepts/serve-full.md, "Device binding").
    """
    facts = check_world(
        profile,
        store=store,
        runtime=runtime,
        adapter=adapter,
        debug=debug,
        allow_unknown_engine_version=allow_unknown_engine_version,
        gpu_probe=gpu_probe,
        now=now,
        allow_test_knobs=allow_test_knobs,
        cuda_visible_devices=cuda_visible_devices,
    )
    return build_plan(facts, store=store, runtime=runtime)


def build_plan(facts: ServeFacts, *, store: Store, runtime: Runtime) -> LaunchPlan:
    """The launch plan from the checks' facts alone: how the blessed tree is presented, and the container.

    Reads nothing of the world: of the runtime it asks only the engine's port (:func:`engine_spec`: Docker's
    is fixed, the local runtime hands out a free one). Its one refusal: a store path the overlay's mount
    options cannot carry (3).
    """
    resolved, adapter = facts.resolution.resolved, facts.resolution.adapter
    warnings = list(facts.warnings)
    mount = _cache_mount(resolved.profile, adapter, facts, warnings)
    spec = _serve_spec(resolved, adapter, runtime, store, facts, mount=mount)
    return LaunchPlan(
        debug=facts.debug,
        resolved=resolved,
        spec=spec,
        serve_dir=facts.serve_dir,
        mount=mount,
        blessing=facts.blessing,
        adapter=adapter,
        store=store,
        allowed_unsafe=facts.allowed_unsafe,
        warnings=tuple(warnings),
        timings=facts.timings,
        ranks=facts.slot.ranks,
    )


def _serve_spec(
    resolved: ResolvedConfig,
    adapter: EngineAdapter,
    runtime: Runtime,
    store: Store,
    facts: ServeFacts,
    *,
    mount: Mount | None,
) -> ContainerSpec:
    """The serving container: labelled as a serve of this store, its log and private dir in the serve dir."""
    return engine_spec(
        resolved,
        adapter,
        runtime,
        name=facts.container_name,
        labels=labels.labels_for(
            run_id=facts.run_id,
            phase=labels.PHASE_SERVE,
            config_hash=resolved.config_hash,
            profile=resolved.profile.name,
            store_root=store.root,
        ),
        cache_mount=mount,
        image=facts.image_id,
        # Serving must load the blessed cache: a failed load fails the start instead of recompiling.
        extra_env=adapter.replay_env() if not facts.debug else None,
        debug=facts.debug,
        host_ip=resolved.profile.serving_host,
        # Port 0 (serve-full --port 0): any free port, read back once the engine is published.
        host_port=resolved.profile.serving_port or None,
        log_path=facts.serve_dir / ENGINE_LOG,
        private_dir=facts.serve_dir / PRIVATE_DIR,
        # A compile the blessing does not hold is reported by the engine the moment Triton looks it up.
        seal=not facts.debug,
        # Rank r on the r-th GPU bound: the runtime presents them to the engine in this order.
        gpu_ids=facts.slot.device_ids or None,
    )


def _cache_mount(profile: Profile, adapter: EngineAdapter, facts: ServeFacts, warnings: list[str]) -> Mount | None:
    """How the engine sees the blessed tree: a read-only bind, an overlay, or (no mounts) a verified copy."""
    blessing = facts.blessing
    if blessing is None:  # --debug: no cache
        return None
    blessed_dir, serve_dir = blessing.blessed_dir, facts.serve_dir
    if profile.cache_mount == "ro-bind" and adapter.readonly_bind_ok:
        mount = Mount("ro", blessed_dir, adapter.cache_mount_path)
    else:
        if profile.cache_mount == "ro-bind":
            warnings.append(
                f"cache.mount = 'ro-bind' but the {adapter.name} engine writes while loading: using an overlay"
            )
        for path, role in ((blessed_dir, "lower dir"), (serve_dir, "scratch dir")):
            check_overlay_path(path, role, hint="move the store root to a plain path", remedy="plain_store_root")
        mount = Mount("overlay", blessed_dir, adapter.cache_mount_path, scratch=serve_dir)
    if facts.copies_mounts:
        # The engine will read a copy, not the tree verified: verify the copy too, before it starts.
        mount = dataclasses.replace(mount, check_copy=partial(verify_copy, blessing.manifest, blessed_dir))
    return mount
