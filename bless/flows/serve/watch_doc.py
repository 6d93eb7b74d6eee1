"""The watch document of a detached serve's seal watcher: ``seal-watch.json`` in the serve dir.

Everything the watcher process (:mod:`.detached`) needs to watch one running engine, written once by
``serve-full --detach`` before the watcher starts and read back by it: never a second plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from bless.core.profile import UnprovenCompilePolicy
from bless.errors import InputInvalidError
from bless.flows.serve.start import LaunchResult
from bless.runtime.base import ContainerSpec, Mount, MountKind, Runtime, Started
from bless.runtime.local import LocalRuntime
from bless.store.layout import StorePaths
from bless.system.json_files import UnreadableJsonError, load_json_object
from bless.system.procid import process_identity

__all__ = ["WATCH_DOC_FORMAT", "WatchDoc", "load_watch_doc", "watch_doc"]

#: What a watch document says it is (a document of another format is refused, not guessed at).
WATCH_DOC_FORMAT = "bless-seal-watch/1"
_POLICIES: tuple[UnprovenCompilePolicy, ...] = ("refuse", "record", "stop")
_MOUNT_KINDS: tuple[MountKind, ...] = ("rw", "ro", "overlay", "private")


@dataclass(frozen=True)
class WatchDoc:
    """Everything the watcher of one detached serve needs (``seal-watch.json``, see the module docstring).

    ``started`` keeps what watching and stopping read (its id and name, the mounts, the log path, the
    port); the engine's command and environment are left out: nothing reads them, and the environment may
    hold secrets. ``engine_holder``: a local engine's process identity (how it is told alive); None for a
    container, which the runtime is asked about.
    """

    store_root: Path
    manifests_dir: Path
    name: str
    serve_dir: Path
    policy: UnprovenCompilePolicy
    runtime_kind: Literal["docker", "local"]
    engine: str
    factors: Mapping[str, Any]
    started: Started
    stop_timeout_s: int
    engine_holder: Mapping[str, Any] | None = None
    #: Local runtime only: whether the engine's mounts live in a mount namespace (False: verified copies).
    local_mount_namespace: bool | None = None

    @property
    def path(self) -> Path:
        return StorePaths.seal_watch_doc(self.serve_dir)

    def to_dict(self) -> dict[str, Any]:
        # By hand (not JsonForm): a file format (read back by load_watch_doc), the runtime and the start nested.
        started = self.started
        spec = started.spec
        return {
            "format": WATCH_DOC_FORMAT,
            "store_root": str(self.store_root),
            "manifests_dir": str(self.manifests_dir),
            "name": self.name,
            "serve_dir": str(self.serve_dir),
            "policy": self.policy,
            "runtime": {"kind": self.runtime_kind, "local_mount_namespace": self.local_mount_namespace},
            "engine": self.engine,
            "factors": dict(self.factors),
            "stop_timeout_s": self.stop_timeout_s,
            "engine_holder": dict(self.engine_holder) if self.engine_holder is not None else None,
            "started": {
                "id": started.id,
                "name": started.name,
                "host_port": started.host_port,
                "spec": {
                    "name": spec.name,
                    "labels": dict(spec.labels),
                    "image": spec.image,
                    "port": spec.port,
                    "host_ip": spec.host_ip,
                    "host_port": spec.host_port,
                    "home": spec.home,
                    "log_path": str(spec.log_path) if spec.log_path is not None else None,
                    "mounts": [
                        {
                            "kind": mount.kind,
                            "source": str(mount.source),
                            "target": mount.target,
                            "scratch": str(mount.scratch) if mount.scratch is not None else None,
                        }
                        for mount in spec.mounts
                    ],
                },
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WatchDoc:
        """Read a document back; anything malformed is a ValueError (the caller refuses it)."""
        if data.get("format") != WATCH_DOC_FORMAT:
            raise ValueError(f"not a seal watch document (format {str(data.get('format'))[:60]!r})")
        try:
            runtime = _mapping(data["runtime"])
            kind = runtime["kind"]
            policy = data["policy"]
            if kind not in ("docker", "local") or policy not in _POLICIES:
                raise ValueError(f"runtime {kind!r} or policy {policy!r} unknown")
            namespace = runtime.get("local_mount_namespace")
            holder = data.get("engine_holder")
            return cls(
                store_root=_path(data["store_root"]),
                manifests_dir=_path(data["manifests_dir"]),
                name=_text(data["name"]),
                serve_dir=_path(data["serve_dir"]),
                policy=cast(UnprovenCompilePolicy, policy),
                runtime_kind=cast(Literal["docker", "local"], kind),
                engine=_text(data["engine"]),
                factors=_mapping(data["factors"]),
                started=_started(_mapping(data["started"])),
                stop_timeout_s=_int(data["stop_timeout_s"]),
                engine_holder=_mapping(holder) if holder is not None else None,
                local_mount_namespace=namespace if isinstance(namespace, bool) else None,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed seal watch document: {exc!r}"[:300]) from None


def _mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return dict(value)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError("expected a non-empty string")
    return value


def _path(value: Any) -> Path:
    path = Path(_text(value))
    if not path.is_absolute():
        raise TypeError(f"expected an absolute path, got {value!r}")
    return path


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError("expected an integer")
    return value


def _optional_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _mount(data: Mapping[str, Any]) -> Mount:
    kind = data["kind"]
    if kind not in _MOUNT_KINDS:
        raise TypeError(f"mount kind {kind!r}")
    scratch = data.get("scratch")
    return Mount(
        cast(MountKind, kind), _path(data["source"]), _text(data["target"]), _path(scratch) if scratch else None
    )


def _started(data: Mapping[str, Any]) -> Started:
    spec_data = _mapping(data["spec"])
    log_path = spec_data.get("log_path")
    home, image = spec_data.get("home"), spec_data.get("image")
    spec = ContainerSpec(
        name=_text(spec_data["name"]),
        command=(),
        env={},
        labels={str(k): str(v) for k, v in _mapping(spec_data["labels"]).items()},
        mounts=tuple(_mount(_mapping(mount)) for mount in spec_data["mounts"]),
        image=image if isinstance(image, str) else None,
        port=_optional_int(spec_data.get("port")),
        host_ip=_text(spec_data["host_ip"]),
        host_port=_optional_int(spec_data.get("host_port")),
        home=home if isinstance(home, str) else None,
        log_path=_path(log_path) if log_path else None,
    )
    return Started(
        id=_text(data["id"]), name=_text(data["name"]), spec=spec, host_port=_optional_int(data.get("host_port"))
    )


def watch_doc(result: LaunchResult, runtime: Runtime) -> WatchDoc:
    """The watch document of a detached, blessed start (its plan's store, serve dir, policy and factors)."""
    plan_ = result.plan
    if plan_.manifest is None:
        raise ValueError("a --debug start serves nothing blessed: nothing to seal")
    local = runtime.kind == "local" and result.started.id.isdigit()
    return WatchDoc(
        store_root=plan_.store.root,
        manifests_dir=plan_.store.manifests_dir,
        name=plan_.profile.name,
        serve_dir=plan_.serve_dir,
        policy=plan_.profile.unproven_compile,
        runtime_kind=runtime.kind,
        engine=plan_.profile.engine,
        factors=plan_.manifest.factors,
        started=result.started,
        stop_timeout_s=plan_.profile.trials.stop_timeout_s,
        engine_holder=process_identity(int(result.started.id)) if local else None,
        local_mount_namespace=runtime.uses_mount_namespace if isinstance(runtime, LocalRuntime) else None,
    )


def load_watch_doc(path: Path) -> WatchDoc:
    """The watch document at ``path`` (InputInvalidError when it is missing or malformed)."""
    try:
        data = load_json_object(path)
        if data is None:
            raise InputInvalidError(f"no seal watch document at {path}")
        return WatchDoc.from_dict(data)
    except (UnreadableJsonError, ValueError) as exc:
        raise InputInvalidError(f"the seal watch document {path} is unreadable: {exc}") from None
