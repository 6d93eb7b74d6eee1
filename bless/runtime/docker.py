"""The Docker runtime: engines in containers through the Docker SDK.

This is the only module of bless that imports ``docker``; it does so lazily, so
importing bless (or using the local runtime) never needs a Docker Engine or pays for
the SDK's import. Every SDK failure becomes a :class:`~bless.errors.BlessError`:
an unreachable daemon is :class:`RuntimeUnavailableError`, an absent image
:class:`ImageMissingError`, a taken name :class:`ContainerConflictError`.

Rules this module keeps (DESIGN.md §5):

* every container and overlay volume we create carries our labels; we refuse to
  create one without the owner label, and we only ever stop or remove labeled ones;
* the engine port is published on ``spec.host_ip`` (loopback by default) and read
  back from the daemon; we never talk to a container IP;
* ``stop`` is ``docker stop`` (SIGTERM, then SIGKILL after the timeout) and ``remove``
  is never forced;
* an ``overlay`` mount is a local-driver volume of type overlay: the host directory is
  the read-only lower layer, writes land in ``scratch/upper`` on the host, where
  :meth:`DockerRuntime.upper_entries` reads them. The volume is made by the container's
  own create (the mount carries its driver options and our labels), so it never exists
  unlabelled nor unused: a stop racing the start cannot remove it between a
  ``volume create`` and the container's create (the daemon would then make an empty,
  unlabelled one of that name, which every later start refuses). The create's result
  is checked: a volume that is not this start's overlay fails the start.

The graceful-stop rule (see :meth:`DockerRuntime.stop`): a stop is graceful when the
container's final state is not ``OOMKilled`` and its exit code is not 137
(128 + SIGKILL). ``docker stop`` only sends SIGKILL once the timeout expired, so a
container that exited on SIGTERM (0, 143, or whatever its handler returned) was
graceful; a 137 means it was killed, by the timeout or by someone else.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from bless import container_labels as bless_labels
from bless.errors import (
    BlessError,
    ContainerConflictError,
    EngineFailedError,
    ImageMissingError,
    InputInvalidError,
    RuntimeUnavailableError,
)
from bless.evidence_types import OutsideEntry, UpperEntry
from bless.runtime import upper as upper_layer
from bless.runtime.base import (
    ContainerInfo,
    ContainerSpec,
    ContainerStop,
    Mount,
    NameHolder,
    Started,
    rank_order_env,
)
from bless.system.log_follow import CHUNK_BYTES, LogChunk, LogFollower

if TYPE_CHECKING:
    from types import ModuleType

    from docker import DockerClient
    from docker.models.containers import Container
    from docker.models.volumes import Volume

_HINT_DAEMON = (
    "start the Docker Engine (scripts/ensure-docker.sh, or `sudo systemctl start docker`), "
    "check DOCKER_HOST (now: {docker_host}), and that your user may use the Docker socket "
    "(root or the docker group)"
)
_HINT_IMAGE = (
    "build it (scripts/images/build-reference-image.sh for the reference engine) or `docker pull {ref}`, then retry"
)

# 128 + SIGKILL: what Docker reports for a container killed by `docker stop` after its timeout.
_KILLED_EXIT_CODE = 137
# Where Docker puts the init process of a container started with ``init`` (its diff lists the file as added).
DOCKER_INIT = "/usr/sbin/docker-init"
# Where normalize_ownership's helper container sees the tree.
_HELPER_TARGET = "/t"
_HELPER_WAIT_S = 600


def _docker_module() -> ModuleType:
    """Import the SDK on first use; a missing SDK is an unusable runtime, not a traceback."""
    try:
        import docker  # lazy on purpose: only the docker runtime needs it
    except ImportError as exc:  # pragma: no cover - docker is a declared dependency
        raise RuntimeUnavailableError(
            f"the Docker SDK for Python is not importable: {exc}",
            hint="install bless with its dependencies (pip install 'docker>=7.1,<8')",
        ) from exc
    return docker


def _unavailable(what: str, exc: BaseException) -> NoReturn:
    docker_host = os.environ.get("DOCKER_HOST") or "unset (default unix:///var/run/docker.sock)"
    raise RuntimeUnavailableError(
        f"Docker Engine: {what} failed: {exc}",
        hint=_HINT_DAEMON.format(docker_host=docker_host),
        details={"operation": what, "cause": str(exc)},
    ) from exc


@contextlib.contextmanager
def _daemon(what: str) -> Iterator[None]:
    """Turn any SDK or connection failure inside the block into RuntimeUnavailableError.

    Callers catch the specific cases they understand (NotFound, 409 Conflict) inside
    the block first; whatever reaches here is an engine we cannot use. ``OSError``
    covers requests' connection errors and timeouts (they subclass IOError).
    """
    docker = _docker_module()
    try:
        yield
    except BlessError:
        raise
    except (docker.errors.DockerException, OSError) as exc:
        _unavailable(what, exc)


def _image_missing(reference: str) -> ImageMissingError:
    return ImageMissingError(
        f"image {reference!r} is not present in the Docker Engine", hint=_HINT_IMAGE.format(ref=reference)
    )


def _status_code(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    return code if isinstance(code, int) else None


def _require_owner(mapping: Mapping[str, str], what: str) -> None:
    """We never create anything we would not later recognize as ours (and be allowed to remove)."""
    if not bless_labels.is_ours(dict(mapping)):
        raise BlessError(
            f"refusing to create {what} without the owner label {bless_labels.OWNER}={bless_labels.OWNER_VALUE}",
            hint="this is a bug in the caller: build labels with bless.container_labels.labels_for()",
        )


# How the daemon says the published host port is taken: by another container's publish, or by a host listener.
_PORT_TAKEN = ("port is already allocated", "address already in use")
#: Lists every non-directory under the engine's /dev/shm: ``<type>\t<size>\t<path>\0`` per entry (find's ``%y``).
_SHM_FIND = ["find", "/dev/shm", "-mindepth", "1", "!", "-type", "d", "-printf", "%y\t%s\t%p\\0"]
_SHM_PYTHON = [
    "python3",
    "-c",
    "import os, stat, sys\n"
    "for d, ds, fs in os.walk('/dev/shm'):\n"
    "    for n in fs + [x for x in ds if os.path.islink(os.path.join(d, x))]:\n"
    "        p = os.path.join(d, n)\n"
    "        try: m = os.lstat(p)\n"
    "        except OSError: continue\n"
    "        t = 'f' if stat.S_ISREG(m.st_mode) else 'l' if stat.S_ISLNK(m.st_mode) else "
    "'s' if stat.S_ISSOCK(m.st_mode) else 'o'\n"
    "        sys.stdout.buffer.write(f'{t}\\t{m.st_size}\\t{p}\\0'.encode('utf-8', 'surrogateescape'))\n",
]
_SHM_PLAIN_FIND = ["find", "/dev/shm", "-mindepth", "1", "!", "-type", "d"]
_SHM_KINDS: dict[str, Literal["file", "link", "socket"]] = {"f": "file", "l": "link", "s": "socket"}


def _parse_shm_listing(raw: bytes) -> list[OutsideEntry]:
    """``<type>\t<size>\t<path>\0`` records (:data:`_SHM_FIND`) as entries under /dev/shm, sorted by path."""
    entries: list[OutsideEntry] = []
    for record in raw.split(b"\0"):
        kind, _, rest = record.decode("utf-8", "replace").partition("\t")
        size, _, path = rest.partition("\t")
        if not path.startswith("/dev/shm/"):
            continue
        entries.append(
            OutsideEntry(
                where="container",
                path=path,
                size=int(size) if size.isdigit() else None,
                kind=_SHM_KINDS.get(kind, "other"),
            )
        )
    return sorted(entries, key=lambda entry: entry.path)


def _start_failed(spec: ContainerSpec, exc: Any) -> BlessError:
    """The daemon answered but could not start the container: say which side is at fault.

    GPU requests the daemon cannot satisfy are the environment's problem, and so is a host port that
    something else holds (its own hint: the engine and mounts are fine); anything else
    (an executable missing from the image, a bad mount, an overlay the kernel refuses)
    is this engine failing to start.
    """
    explanation = str(getattr(exc, "explanation", None) or exc)
    if any(marker in explanation for marker in _PORT_TAKEN):
        # Not the engine's fault, and nothing to look for in the image or the mounts: say what holds the port.
        where = f"{spec.host_ip or '0.0.0.0'}:{spec.host_port}" if spec.host_port else "the published port"
        return EngineFailedError(
            f"Docker could not start container {spec.name!r}: the host port {where} is already in use ({explanation})",
            hint="stop what holds the port (stop the detached serve if it is one of ours, bless-serve-NAME-<tag> "
            "in docker ps; ss -ltnp shows other listeners), or serve on another port (serving.port)",
            remedy="port_in_use",
            details={"daemon_error": explanation, "host_ip": spec.host_ip, "host_port": spec.host_port},
        )
    if "could not select device driver" in explanation:
        return RuntimeUnavailableError(
            f"Docker cannot give container {spec.name!r} GPUs: {explanation}",
            hint="install and configure the NVIDIA Container Toolkit, or run on a GPU host with the local runtime",
        )
    return EngineFailedError(
        f"Docker could not start container {spec.name!r}: {explanation}",
        hint="check the engine command exists in the image, and the mounts (sources, overlay dirs)",
        details={"daemon_error": explanation},
    )


def overlay_volume_name(container_name: str, index: int) -> str:
    """The volume holding a container's ``index``-th overlay mount (first: ``<name>-overlay``)."""
    return f"{container_name}-overlay" if index == 0 else f"{container_name}-overlay-{index}"


def _bind_mounts(docker: ModuleType, spec: ContainerSpec) -> list[Any]:
    """The SDK mounts of ``spec``'s binds (its overlays become volumes: ``_prepare_overlay``)."""
    sdk_mounts: list[Any] = []
    for mount in spec.mounts:
        if mount.kind == "overlay":
            continue
        source = mount.source.resolve()
        if not source.exists():
            raise InputInvalidError(f"mount source {source} does not exist", hint="check the mount source")
        sdk_mounts.append(
            docker.types.Mount(
                target=mount.target,
                source=str(source),
                type="bind",
                read_only=mount.kind == "ro",
            )
        )
    return sdk_mounts


def _overlay_options(source: Path, upper: Path, work: Path) -> dict[str, str]:
    """The local driver's options of an overlay volume over ``source``."""
    return {"type": "overlay", "device": "overlay", "o": f"lowerdir={source},upperdir={upper},workdir={work}"}


def _same_store(found: Mapping[str, str], owner: Mapping[str, str]) -> bool:
    """Whether an object labelled ``found`` is ours and of the store ``owner`` (a start's labels) names.

    A start without a store label (a test's, a helper's) accepts any object of ours.
    """
    if not bless_labels.is_ours(dict(found)):
        return False
    store = owner.get(bless_labels.STORE)
    return store is None or found.get(bless_labels.STORE) == store


def _overlay_mounts(spec: ContainerSpec) -> list[tuple[int, Mount]]:
    return [(i, m) for i, m in enumerate(m for m in spec.mounts if m.kind == "overlay")]


def _overlay_scratch(mount: Mount) -> Path:
    if mount.scratch is None:
        raise InputInvalidError(
            f"overlay mount at {mount.target} has no scratch directory for its upper layer",
            hint="set Mount.scratch to a host directory (the runtime creates upper/ and work/ in it)",
        )
    return mount.scratch


def _remove(thing: Container | Volume, *, in_use: BlessError | Literal["keep"] | None = None) -> bool:
    """Remove a container or volume: True when removed, False when it was gone already (NotFound).

    A 409 (a running container, a volume in use) raises ``in_use`` when that is an error, is kept
    (False) with ``"keep"``, and otherwise is raised as it is (``_daemon`` makes it unavailable).
    """
    docker = _docker_module()
    try:
        thing.remove()
    except docker.errors.NotFound:
        return False
    except docker.errors.APIError as exc:
        if _status_code(exc) != 409 or in_use is None:
            raise
        if in_use == "keep":
            return False
        raise in_use from exc
    return True


def _stop_and_remove(container: Container, timeout_s: int = 10) -> bool:
    """Stop ``container`` if it runs (SIGTERM, SIGKILL after ``timeout_s``), then remove it.

    False when it was gone already: NotFound while stopping or removing.
    """
    docker = _docker_module()
    try:
        container.reload()
        if container.attrs.get("State", {}).get("Running"):
            container.stop(timeout=timeout_s)
    except docker.errors.NotFound:
        return False
    return _remove(container)


def device_requests(spec: ContainerSpec) -> list[Any]:
    """The GPUs a container gets (SDK ``DeviceRequest`` values).

    Exactly ``spec.gpu_ids`` when given (a trial's slot, a serve's bound GPUs), else the first
    ``spec.gpus`` (Docker's ``count``), else none. Docker hands them over as a set: the container's env
    (:func:`~bless.runtime.base.rank_order_env`) puts them in rank order.
    """
    docker = _docker_module()
    if spec.gpu_ids:
        return [docker.types.DeviceRequest(device_ids=list(spec.gpu_ids), capabilities=[["gpu"]])]
    if spec.gpus:
        return [docker.types.DeviceRequest(count=spec.gpus, capabilities=[["gpu"]])]
    return []


class DockerRuntime:
    """Engines as Docker containers (implements :class:`bless.runtime.base.Runtime`).

    ``base_url`` selects the daemon (``unix:///var/run/docker.sock``, ``tcp://...``);
    without it the environment decides (``DOCKER_HOST`` and friends, like the CLI).
    The connection is made on first use, so constructing the runtime never fails.

    ``init`` (default True) runs Docker's init (tini) as PID 1 in front of the engine.
    Without it the engine *is* PID 1, and PID 1 ignores every signal it installed no
    handler for: an engine without a SIGTERM handler (plain Python has none) could then
    only be killed after the timeout. With it, SIGTERM is forwarded, default-action
    deaths report 143 like on a host, and zombies of compile workers are reaped.
    """

    # The protocol's attribute type, so DockerRuntime is a Runtime (attributes are invariant).
    kind: Literal["docker", "local"] = "docker"
    copies_mounts = False  # Docker mounts: read-only and overlay are enforced by the kernel

    def __init__(self, base_url: str | None = None, *, timeout_s: int = 120, init: bool = True) -> None:
        self._base_url = base_url
        self._timeout_s = timeout_s
        self._init = init
        self._client_obj: DockerClient | None = None

    # -- connection -----------------------------------------------------------------

    @property
    def _client(self) -> DockerClient:
        if self._client_obj is None:
            docker = _docker_module()
            # The SDK asks the daemon for its API version while constructing the client,
            # so this is where an absent daemon shows up.
            with _daemon("connecting"):
                if self._base_url is None:
                    self._client_obj = docker.from_env(timeout=self._timeout_s)
                else:
                    self._client_obj = docker.DockerClient(base_url=self._base_url, timeout=self._timeout_s)
        return self._client_obj

    def ping(self) -> None:
        """Raise RuntimeUnavailableError unless the daemon answers."""
        with _daemon("ping"):
            self._client.ping()

    # -- images and ports -----------------------------------------------------------

    def resolve_image(self, reference: str) -> str:
        """Image reference -> image ID (``sha256:...``). Never pulls."""
        docker = _docker_module()
        client = self._client
        with _daemon(f"inspecting image {reference}"):
            try:
                image = client.images.get(reference)
            except docker.errors.ImageNotFound as exc:
                raise _image_missing(reference) from exc
            except docker.errors.APIError as exc:
                if _status_code(exc) == 400:
                    raise InputInvalidError(
                        f"{reference!r} is not a valid image reference: {exc.explanation or exc}",
                        hint="use name:tag or an image ID (sha256:...)",
                    ) from exc
                raise
            image_id = image.id
        if not image_id:
            raise ImageMissingError(f"image {reference!r} has no ID", hint=_HINT_IMAGE.format(ref=reference))
        return str(image_id)

    def engine_port(self, preferred: int) -> int:
        """The container port is fixed; the host side is published separately."""
        return preferred

    # -- start ----------------------------------------------------------------------

    def _conflict(self, name: str, holder: NameHolder) -> ContainerConflictError:
        if holder == "foreign":
            return ContainerConflictError(
                f"a container named {name!r} exists WITHOUT our labels ({bless_labels.OWNER}); "
                "it is not ours, so bless will not stop or remove it",
                hint=f"rename or remove it yourself (docker rm {name}) if you know it is safe, then retry",
                details={"name": name, "holder": holder},
            )
        return ContainerConflictError(
            f"a container of ours named {name!r} already exists (running or not yet removed)",
            hint=f"wait for it to finish, or stop it (docker stop {name}) and clean up leftovers of ours, then retry",
            details={"name": name, "holder": holder},
        )

    def _prepare_overlay(self, spec: ContainerSpec, index: int, mount: Mount) -> tuple[str, Any]:
        """The SDK mount that makes one overlay volume with the container; returns (volume name, SDK mount).

        A stale volume of this name (a crashed start of this store's) is removed first: the create would
        otherwise reuse it with its old layers.
        """
        docker = _docker_module()
        scratch = _overlay_scratch(mount)
        source = mount.source.resolve()
        scratch = scratch.resolve()
        upper_layer.check_overlay_path(source, "lower dir", absolute=True)
        upper_layer.check_overlay_path(scratch, "scratch dir", absolute=True)
        if not source.is_dir():
            raise InputInvalidError(
                f"overlay lower dir {source} does not exist or is not a directory",
                hint="check the mount source",
            )
        upper, work = upper_layer.make_overlay_dirs(scratch)
        volume_name = overlay_volume_name(spec.name, index)
        with _daemon(f"checking overlay volume {volume_name}"):
            self._clear_stale_volume(volume_name, spec.labels)
        sdk_mount = docker.types.Mount(
            target=mount.target,
            source=volume_name,
            type="volume",
            # Without no_copy Docker would copy the image's files at the target into the
            # (seemingly empty) volume, i.e. into our upper layer, before the engine runs.
            no_copy=True,
            labels=dict(spec.labels),
            driver_config=docker.types.DriverConfig("local", options=_overlay_options(source, upper, work)),
        )
        return volume_name, sdk_mount

    def _check_overlays(self, spec: ContainerSpec, container: Container) -> None:
        """Each overlay volume the create made or found must be this start's: our labels, these layers.

        Raises:
            ContainerConflictError: a volume of that name that is not (made between the stale check and the
                create by someone else); the start is undone, that volume left alone.
        """
        docker = _docker_module()
        for index, mount in _overlay_mounts(spec):
            volume_name = overlay_volume_name(spec.name, index)
            scratch = _overlay_scratch(mount).resolve()
            wanted = _overlay_options(mount.source.resolve(), scratch / "upper", scratch / "work")
            with _daemon(f"checking overlay volume {volume_name}"):
                try:
                    attrs = self._client.volumes.get(volume_name).attrs
                except docker.errors.NotFound:
                    attrs = {}
            volume_labels = attrs.get("Labels") or {}
            if _same_store(volume_labels, spec.labels) and (attrs.get("Options") or {}) == wanted:
                continue
            raise ContainerConflictError(
                f"the Docker volume {volume_name!r} container {container.name!r} would mount is not its overlay "
                "(made by something else meanwhile); nothing was started",
                hint=f"if it is not in use, remove it (docker volume rm {volume_name}) and retry",
                details={"name": spec.name, "holder": "foreign-volume", "volume": volume_name},
            )

    def _clear_stale_volume(self, volume_name: str, owner: Mapping[str, str]) -> None:
        """A volume of ours (this store's) left by a crash is removed; anything else with the name is a conflict.

        Reusing it is not an option: the daemon would keep its old lower/upper dirs.
        """
        docker = _docker_module()
        try:
            volume = self._client.volumes.get(volume_name)
        except docker.errors.NotFound:
            return
        if not _same_store(volume.attrs.get("Labels") or {}, owner):
            raise ContainerConflictError(
                f"a Docker volume named {volume_name!r} exists WITHOUT our labels (or another store root's); "
                "bless will not touch it",
                hint=f"remove it yourself (docker volume rm {volume_name}) if it is safe, then retry",
            )
        in_use = ContainerConflictError(
            f"overlay volume {volume_name!r} of ours is still used by a container",
            hint="stop and remove that container first (leftovers of ours can be cleaned up)",
        )
        _remove(volume, in_use=in_use)

    def _remove_volumes(self, names: list[str]) -> None:
        """Remove overlay volumes we created; never one without our labels. Best effort."""
        docker = _docker_module()
        client = self._client
        for name in names:
            with _daemon(f"removing overlay volume {name}"):
                try:
                    volume = client.volumes.get(name)
                except docker.errors.NotFound:
                    continue
                if bless_labels.is_ours(volume.attrs.get("Labels") or {}):
                    _remove(volume)

    def start(self, spec: ContainerSpec) -> Started:
        """Create and start a container for ``spec``; see the module docstring for the rules.

        ``spec.command`` is the full argv: its first item replaces the image's entrypoint,
        so a command means the same under both runtimes whatever ENTRYPOINT the image has.
        """
        docker = _docker_module()
        if spec.image is None:
            raise InputInvalidError(
                f"container {spec.name!r}: the docker runtime needs an image", hint="set the profile's image"
            )
        if not spec.command:
            raise InputInvalidError(f"container {spec.name!r}: empty command", hint="this is a bug in the caller")
        _require_owner(spec.labels, f"container {spec.name!r}")
        holder = self.name_holder(spec.name)
        if holder != "free":
            raise self._conflict(spec.name, holder)

        volumes: list[str] = []
        container: Container | None = None
        try:
            sdk_mounts = _bind_mounts(docker, spec)
            for index, mount in _overlay_mounts(spec):
                volume_name, sdk_mount = self._prepare_overlay(spec, index, mount)
                volumes.append(volume_name)
                sdk_mounts.append(sdk_mount)
            container = self._create(docker, spec.image, spec, self._create_kwargs(spec, sdk_mounts))
            self._check_overlays(spec, container)
            with _daemon(f"starting container {spec.name}"):
                try:
                    container.start()
                except docker.errors.APIError as exc:
                    raise _start_failed(spec, exc) from exc
                container.reload()
        except BaseException:
            self._undo_start(container, volumes)
            raise
        return self._started(spec, container)

    def _create_kwargs(self, spec: ContainerSpec, sdk_mounts: list[Any]) -> dict[str, Any]:
        """The SDK's ``containers.create`` arguments for ``spec`` (all but the image)."""
        env = dict(spec.env)
        if spec.python_path:
            before = env.get("PYTHONPATH") or self._image_env(spec.image).get("PYTHONPATH")
            env["PYTHONPATH"] = ":".join([*spec.python_path, *filter(None, [before])])
        if spec.home is not None:
            # Same HOME in bootstrap, trials and serving (vLLM hashes HOME-derived paths).
            env["HOME"] = spec.home
        # The devices Docker hands over appear in CUDA's own order inside the container; named by UUID they
        # appear in rank order (rank r on the r-th of spec.gpu_ids), as the local runtime presents them.
        env.update(rank_order_env(spec, container=True))
        kwargs: dict[str, Any] = {
            "name": spec.name,
            "entrypoint": [spec.command[0]],
            "command": list(spec.command[1:]),
            "environment": env,
            "labels": dict(spec.labels),
            "mounts": sdk_mounts,
            "detach": True,
            "init": self._init,
        }
        if spec.port is not None:
            kwargs["ports"] = {f"{spec.port}/tcp": (spec.host_ip, spec.host_port)}
        requests = device_requests(spec)
        if requests:
            kwargs["device_requests"] = requests
        if spec.shm_size is not None:
            kwargs["shm_size"] = spec.shm_size
        if spec.ipc_host:
            kwargs["ipc_mode"] = "host"
        if spec.workdir is not None:
            kwargs["working_dir"] = spec.workdir
        return kwargs

    def _image_env(self, image: str | None) -> dict[str, str]:
        """The image's own ENV (``Config.Env``): what a container gets unless its env says otherwise."""
        if image is None:
            return {}
        docker = _docker_module()
        with _daemon(f"inspecting image {image}"):
            try:
                attrs = self._client.images.get(image).attrs
            except docker.errors.ImageNotFound as exc:
                raise _image_missing(image) from exc
        config = attrs.get("Config") if isinstance(attrs, dict) else None
        entries = config.get("Env") if isinstance(config, dict) else None
        return dict(str(entry).split("=", 1) for entry in entries or () if "=" in str(entry))

    def _create(self, docker: ModuleType, image: str, spec: ContainerSpec, kwargs: dict[str, Any]) -> Container:
        """The container created, not started: refused when the image is missing or the name was taken meanwhile."""
        with _daemon(f"creating container {spec.name}"):
            try:
                return self._client.containers.create(image, **kwargs)
            except docker.errors.ImageNotFound as exc:
                raise _image_missing(image) from exc
            except docker.errors.APIError as exc:
                if _status_code(exc) == 409:
                    # Someone took the name between our check and the create.
                    raise self._conflict(spec.name, self.name_holder(spec.name)) from exc
                raise

    def _started(self, spec: ContainerSpec, container: Container) -> Started:
        host_port = self._published_port(container.attrs, spec)
        notes: tuple[str, ...] = ()
        if spec.port is not None and host_port is None:
            notes = ("the engine exited before its published port could be read",)
        return Started(
            id=str(container.id),
            name=spec.name,
            spec=spec,
            host_port=host_port,
            enforced_read_only=True,
            notes=notes,
        )

    def _undo_start(self, container: Container | None, volumes: list[str]) -> None:
        """A failed start leaves nothing behind: the container we created, then its volumes.

        The container was never (successfully) started, so plain remove is enough; we do
        not mask the original error if the cleanup itself fails.
        """
        with contextlib.suppress(BlessError):
            if container is not None:
                with _daemon("removing a container that failed to start"):
                    _stop_and_remove(container)
        with contextlib.suppress(BlessError):
            self._remove_volumes(volumes)

    @staticmethod
    def _published_port(attrs: Mapping[str, Any], spec: ContainerSpec) -> int | None:
        """The host port the daemon bound for ``spec.port`` on ``spec.host_ip``."""
        if spec.port is None:
            return None
        ports = (attrs.get("NetworkSettings") or {}).get("Ports") or {}
        for binding in ports.get(f"{spec.port}/tcp") or []:
            if binding.get("HostIp") in (spec.host_ip, "") and binding.get("HostPort"):
                return int(binding["HostPort"])
        return spec.host_port

    # -- watching -------------------------------------------------------------------

    def _container(self, started: Started) -> Container | None:
        docker = _docker_module()
        client = self._client
        with _daemon(f"inspecting container {started.name}"):
            try:
                return client.containers.get(started.id)
            except docker.errors.NotFound:
                return None

    @staticmethod
    def _state(container: Container) -> dict[str, Any]:
        state = container.attrs.get("State")
        return state if isinstance(state, dict) else {}

    def is_running(self, started: Started) -> bool:
        container = self._container(started)
        return container is not None and bool(self._state(container).get("Running"))

    def exit_code(self, started: Started) -> int | None:
        """The exit code once the container has exited; None while created or running, or if gone."""
        container = self._container(started)
        if container is None:
            return None
        state = self._state(container)
        if state.get("Status") in ("exited", "dead"):
            code = state.get("ExitCode")
            return int(code) if isinstance(code, int) else None
        return None

    def logs(self, started: Started) -> str:
        """stdout and stderr, interleaved as the daemon recorded them; empty if the container is gone."""
        container = self._container(started)
        if container is None:
            return ""
        docker = _docker_module()
        with _daemon(f"reading logs of {started.name}"):
            try:
                raw = container.logs(stdout=True, stderr=True)
            except docker.errors.NotFound:  # removed between the lookup and the read: gone, like above
                return ""
        return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)

    def follow_log(self, started: Started) -> LogFollower:
        """The container's log, one following stream from the daemon (which handles its own rotation), bounded."""
        return _DockerLogFollower(self, started)

    # -- stopping -------------------------------------------------------------------

    def stop(self, started: Started, timeout_s: int) -> ContainerStop:
        """``docker stop -t timeout_s``: SIGTERM, then SIGKILL once the timeout expired. Never removes.

        ``graceful`` is True when the final state is not OOMKilled and the exit code is
        not 137 (128 + SIGKILL): the engine exited by itself or on SIGTERM rather than
        being killed. A container that had already exited is reported as it exited
        (seconds 0). A container that vanished reports ``exit_code=None, graceful=False``
        (fail closed: we cannot say it stopped cleanly).

        A SIGTERM that reaches PID 1 (init, or the engine with ``init=False``) before it
        installed its handlers is ignored by the kernel, so a stop issued within moments
        of the start can end in a kill; stop after readiness.
        """
        container = self._container(started)
        if container is None:
            return ContainerStop(exit_code=None, graceful=False, seconds=0.0)
        began = time.monotonic()
        docker = _docker_module()
        with _daemon(f"stopping container {started.name}"):
            try:
                if self._state(container).get("Running"):
                    container.stop(timeout=timeout_s)
                seconds = time.monotonic() - began
                container.reload()
            except docker.errors.NotFound:  # removed by someone else meanwhile: vanished, not a dead daemon
                return ContainerStop(exit_code=None, graceful=False, seconds=time.monotonic() - began)
        state = self._state(container)
        code = state.get("ExitCode")
        # A container that never ran ("created") has ExitCode 0 too: that is no clean exit.
        exited = state.get("Status") in ("exited", "dead")
        exit_code = int(code) if exited and isinstance(code, int) else None
        graceful = not state.get("OOMKilled") and exit_code is not None and exit_code != _KILLED_EXIT_CODE
        return ContainerStop(exit_code=exit_code, graceful=graceful, seconds=seconds)

    def remove(self, started: Started) -> None:
        """Remove the stopped container (never forced), then its overlay volumes of ours.

        The upper layers on the host stay: the caller keeps them as evidence or deletes them.
        A running container is a ContainerConflictError: stop it first.
        """
        container = self._container(started)
        if container is not None:
            in_use = ContainerConflictError(
                f"container {started.name!r} is still running; it must be stopped before removal",
                hint="stop it first (bless never force-removes)",
            )
            with _daemon(f"removing container {started.name}"):
                _remove(container, in_use=in_use)
        self._remove_volumes(
            [overlay_volume_name(started.spec.name, index) for index, _ in _overlay_mounts(started.spec)]
        )

    # -- evidence -------------------------------------------------------------------

    def upper_entries(self, started: Started) -> list[UpperEntry]:
        """Writes recorded in each overlay mount's upper layer on the host (see upper.scan_upper)."""
        per_mount = [
            (
                mount.target,
                upper_layer.scan_upper(_overlay_scratch(mount).resolve() / "upper", mount.source.resolve()),
            )
            for _, mount in _overlay_mounts(started.spec)
        ]
        return upper_layer.combine(per_mount) if per_mount else []

    def filesystem_changes(self, started: Started) -> list[OutsideEntry]:
        """The container's own filesystem changes (``docker diff``), outside every mount, leaves only.

        Docker lists the mount points it created (and their parents) and every directory whose content
        changed: those say nothing by themselves, so only paths that are neither a mount point, nor
        under or above one, nor the parent of another listed path are kept. Call it before :meth:`remove`.
        """
        container = self._container(started)
        if container is None:
            return []
        docker = _docker_module()
        with _daemon(f"listing filesystem changes of {started.name}"):
            try:
                raw = container.diff() or []
            except docker.errors.NotFound:
                return []
        changed = sorted({str(item.get("Path")) for item in raw if isinstance(item, dict) and item.get("Path")})
        targets = [PurePosixPath(mount.target) for mount in started.spec.mounts]
        kept: list[OutsideEntry] = []
        for index, path in enumerate(changed):
            pure = PurePosixPath(path)
            if any(pure == t or pure in t.parents or t in pure.parents for t in targets):
                continue
            following = changed[index + 1] if index + 1 < len(changed) else ""
            if following.startswith(path.rstrip("/") + "/"):
                continue  # a directory whose content is listed after it
            if self._init and path == DOCKER_INIT:
                continue  # Docker itself puts its init binary into every container started with --init (ours are)
            kept.append(OutsideEntry(where="container", path=path))
        return kept

    def shm_entries(self, started: Started) -> list[OutsideEntry]:
        """The running container's ``/dev/shm`` (a tmpfs: not in ``docker diff``), listed by an exec in it.

        GNU ``find`` where the image has it, else the image's ``python3`` (an engine image has one), else a
        plain ``find`` (busybox: paths only, each a ``file``). A container that is gone or stopped has no
        shared memory left: empty. A listing that fails otherwise raises RuntimeUnavailableError (the seal
        watcher counts a watcher that cannot look as an event).
        """
        container = self._container(started)
        if container is None or self._state(container).get("Running") is not True:
            return []
        docker = _docker_module()
        with _daemon(f"listing /dev/shm of {started.name}"):
            try:
                for command in (_SHM_FIND, _SHM_PYTHON, _SHM_PLAIN_FIND):
                    result = container.exec_run(command, stdout=True, stderr=False)
                    if result.exit_code in (0, None):
                        break
            except docker.errors.NotFound:
                return []
            except docker.errors.APIError as exc:
                if not self.is_running(started):
                    return []  # it stopped between the look and the exec
                raise RuntimeUnavailableError(f"cannot list /dev/shm of {started.name}: {exc}") from None
        if result.exit_code not in (0, None):
            raise RuntimeUnavailableError(
                f"cannot list /dev/shm of {started.name}: the listing exited with {result.exit_code}",
                hint="the engine image needs GNU find or python3 for sealed serving to watch its shared memory",
            )
        output = result.output if isinstance(result.output, bytes) else b""
        if command is _SHM_PLAIN_FIND:
            output = b"".join(b"f\t\t" + line + b"\0" for line in output.splitlines() if line)
        return _parse_shm_listing(output)

    # -- ownership of names ---------------------------------------------------------

    def name_holder(self, name: str) -> NameHolder:
        """``free``, ``ours`` (owner label set) or ``foreign``, by exact container name."""
        client = self._client
        # The name filter is a regular expression over "/<name>"; container names may
        # contain '.', so escape it, and compare exactly afterwards anyway.
        pattern = "^/" + name.replace(".", r"\.") + "$"
        with _daemon(f"looking up container name {name}"):
            found = client.containers.list(all=True, filters={"name": pattern}, ignore_removed=True)
        for container in found:
            if container.name == name:
                return "ours" if bless_labels.is_ours(container.labels) else "foreign"
        return "free"

    def overlay_conflict(self, name: str) -> str | None:
        """Why a start of container ``name`` would be refused by a volume in its overlay's place, or None.

        A volume named like its overlay without our labels blocks the start (start never touches it),
        so a --dry-run must see it too. One of ours is a half-created start's leftover, which start
        removes: no conflict.
        """
        docker = _docker_module()
        volume_name = overlay_volume_name(name, 0)
        with _daemon(f"looking up volume {volume_name}"):
            try:
                volume = self._client.volumes.get(volume_name)
            except docker.errors.NotFound:
                return None
        if bless_labels.is_ours(volume.attrs.get("Labels") or {}):
            return None
        return f"a Docker volume named {volume_name!r} exists WITHOUT our labels; bless will not touch it"

    def _ours(self, labels: Mapping[str, str]) -> list[Container]:
        client = self._client
        filters = [f"{bless_labels.OWNER}={bless_labels.OWNER_VALUE}"]
        filters += [f"{key}={value}" for key, value in labels.items()]
        with _daemon("listing containers of ours"):
            found = client.containers.list(all=True, filters={"label": filters}, ignore_removed=True)
        # The daemon filtered already; checking again costs nothing and guards the one rule
        # that must never break: only labeled containers are ever touched.
        return [
            c for c in found if bless_labels.is_ours(c.labels) and all(c.labels.get(k) == v for k, v in labels.items())
        ]

    def list_ours(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        return [
            ContainerInfo(id=str(c.id), name=str(c.name), status=str(c.status), labels=dict(c.labels))
            for c in self._ours(labels)
        ]

    def cleanup_ours(self, labels: Mapping[str, str]) -> list[str]:
        """Stop (timeout 10 s) and remove our containers matching ``labels``, then our unused volumes.

        Returns the names of the containers removed. Unlabeled containers and volumes are
        never touched, whatever their names.
        """
        removed: list[str] = []
        for container in self._ours(labels):
            with _daemon(f"cleaning up container {container.name}"):
                if not _stop_and_remove(container):
                    continue
            removed.append(str(container.name))
        client = self._client
        filters: dict[str, Any] = {
            "label": [f"{bless_labels.OWNER}={bless_labels.OWNER_VALUE}"]
            + [f"{key}={value}" for key, value in labels.items()],
            "dangling": True,
        }
        with _daemon("listing volumes of ours"):
            volumes = client.volumes.list(filters=filters)
        for volume in volumes:
            volume_labels = volume.attrs.get("Labels") or {}
            if not bless_labels.is_ours(volume_labels) or any(volume_labels.get(k) != v for k, v in labels.items()):
                continue
            with _daemon(f"removing volume {volume.name}"):
                _remove(volume, in_use="keep")  # in use after all (a racing start): not a leftover
        return removed

    # -- permissions ----------------------------------------------------------------

    def normalize_ownership(self, path: Path, *, image: str | None) -> None:
        """Make a tree written by a container owned by us and readable (u+rwX, go+rX).

        As root the files are already ours, so a chmod in Python is enough. Otherwise the
        files belong to the container's (root) user and we may not change them, so a
        short-lived helper container of ours (phase ``helper``) chowns and chmods them.
        """
        path = path.resolve()
        if os.geteuid() == 0:
            upper_layer.normalize_own_tree(path)
            return
        if image is None:
            raise InputInvalidError(
                "normalizing ownership as a non-root user needs an image for the helper container",
                hint="this is a bug in the caller: pass the engine image",
            )
        self._run_helper(path, image)

    def _run_helper(self, path: Path, image: str) -> None:
        docker = _docker_module()
        client = self._client
        uid, gid = os.getuid(), os.getgid()
        name = f"bless-helper-{uuid.uuid4().hex[:12]}"
        helper_labels = {
            bless_labels.OWNER: bless_labels.OWNER_VALUE,
            bless_labels.PHASE: bless_labels.PHASE_HELPER,
        }
        script = f"chown -R {uid}:{gid} {_HELPER_TARGET} && chmod -R u+rwX,go+rX {_HELPER_TARGET}"
        container: Container | None = None
        try:
            with _daemon("running the ownership helper container"):
                try:
                    container = client.containers.create(
                        image,
                        name=name,
                        entrypoint=["sh", "-c"],
                        command=[script],
                        user="0:0",
                        labels=helper_labels,
                        mounts=[docker.types.Mount(target=_HELPER_TARGET, source=str(path), type="bind")],
                        network_disabled=True,
                    )
                except docker.errors.ImageNotFound as exc:
                    raise ImageMissingError(
                        f"image {image!r} for the ownership helper is not present",
                        hint=_HINT_IMAGE.format(ref=image),
                    ) from exc
                container.start()
                result = container.wait(timeout=_HELPER_WAIT_S)
                code = int(result.get("StatusCode", -1))
                if code != 0:
                    log = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
                    raise RuntimeUnavailableError(
                        f"the ownership helper container exited with {code} on {path}: {log.strip()}",
                        hint="check that the image has sh, chown and chmod, and the path is on the host",
                        details={"log": log},
                    )
        finally:
            if container is not None:
                with contextlib.suppress(BlessError), _daemon("removing the ownership helper"):
                    _stop_and_remove(container)


def _stamp_ns(stamp: bytes) -> int | None:
    """An RFC 3339 time stamp with nanoseconds (``2026-11-28T05:10:00.123456789Z``, as the daemon writes it) in ns."""
    try:
        text = stamp.decode("ascii")
        whole, _, fraction = text.rstrip("Z").partition(".")
        seconds = int(datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp())
        return seconds * 1_000_000_000 + int((fraction or "0")[:9].ljust(9, "0"))
    except (UnicodeDecodeError, ValueError):
        return None


def lines_after(lines: list[bytes], since_ns: int, seen_at_since: int) -> tuple[list[bytes], int, int]:
    """The time-stamped log lines not handed out yet, without their stamps; the new (since_ns, seen_at_since).

    The daemon's ``since`` includes lines stamped at that very time, so those already handed out (``seen_at_since``
    of them) are skipped; a line without a readable stamp is kept (it can only be new output).
    """
    out: list[bytes] = []
    handed_out_ns, handed_out = since_ns, seen_at_since
    for line in lines:
        stamp, _, payload = line.partition(b" ")
        ns = _stamp_ns(stamp)
        if ns is None:
            out.append(line)
            continue
        if ns < handed_out_ns:
            continue
        if ns == handed_out_ns and handed_out > 0:
            handed_out -= 1
            continue
        if ns == since_ns:
            seen_at_since += 1
        else:
            since_ns, seen_at_since = ns, 1
        out.append(payload)
    return out, since_ns, seen_at_since


class _DockerLogFollower:
    """:meth:`DockerRuntime.follow_log`: one following stream of the container's log, read by a thread of its own.

    The daemon hands every line once, in the order it logged them (stdout and stderr are stamped by two copiers,
    so their stamps need not be in order: asking again "since" a stamp could skip a line). The thread keeps at
    most :data:`_BUFFER_BYTES` unread (then waits: the daemon holds the rest). A stream that ends while the
    container still runs (the daemon restarted) is opened again from the last stamp handed out.
    """

    def __init__(self, runtime: DockerRuntime, started: Started) -> None:
        self._runtime = runtime
        self._started = started
        self._since_ns = 0
        self._seen_at_since = 0
        self._buffer = bytearray()
        self._ended = True
        self._closed = False
        self._stream: Any = None
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            stream = self._stream
        close = getattr(stream, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()

    def _open(self) -> None:
        container = self._runtime._container(self._started)
        if container is None:
            return
        since = max(self._since_ns / 1e9 - 1e-6, 0.0) if self._since_ns else None
        with _daemon(f"reading logs of {self._started.name}"):
            stream = container.logs(stdout=True, stderr=True, timestamps=True, stream=True, follow=True, since=since)
        with self._lock:
            self._stream, self._ended = stream, False
            self._buffer.clear()  # only a cut last line of the old stream: the new one starts with it whole
        self._thread = threading.Thread(target=self._pump, args=(stream,), name="bless-docker-log", daemon=True)
        self._thread.start()

    def _pump(self, stream: Any) -> None:
        try:
            for frame in stream:
                data = frame if isinstance(frame, bytes) else str(frame).encode()
                with self._lock:
                    while len(self._buffer) >= _BUFFER_BYTES and not self._closed:
                        self._lock.wait(1.0)
                    if self._closed:
                        return
                    self._buffer += data
        except Exception:  # the daemon went away mid-stream: opened again on the next read  # noqa: S110
            pass
        finally:
            with self._lock:
                self._ended = True

    def read(self, max_bytes: int = CHUNK_BYTES) -> LogChunk:
        with self._lock:
            # Reopened only once every complete line of the old stream was handed out (none twice).
            ended = self._ended and not self._closed and b"\n" not in self._buffer
        if ended:
            self._open()  # the first read, or the stream ended (the container stopped, the daemon restarted)
        with self._lock:
            end = self._buffer.rfind(b"\n", 0, max_bytes) + 1
            taken = bytes(self._buffer[:end])
            del self._buffer[:end]
            more = b"\n" in self._buffer
            self._lock.notify_all()
        lines, self._since_ns, self._seen_at_since = lines_after(
            taken.splitlines(), self._since_ns, self._seen_at_since
        )
        return LogChunk(b"".join(line + b"\n" for line in lines), more=more)


#: What a container log stream's reader keeps unread at most.
_BUFFER_BYTES = 8 << 20
