"""bless: bless, verify and serve compiled torch.compile / CUDA-graph caches, fail closed.

The public Python API is what ``__all__`` names (docs/reference/python-api.md shows each call): open a
store, load and resolve a profile, bless it, verify a blessing, serve it, pull, push and sign it, list, show,
diff and collect garbage; every type a call takes or returns; every refusal, a :class:`BlessError` carrying
an :class:`ExitCode`, in families a caller can catch by who is at fault (:class:`ConfigError`,
:class:`TrustError`, ...). Every other module (``bless.core``, ``bless.flows``, ``bless.store``, ...) is
internal: it may change in any release.

Each call checks its options first (a bad one is a :class:`UsageError`, exit code 2, before any engine,
key, registry or store is touched), then makes one call of the flow the command line uses. The Docker SDK and
the registry client (oras, requests) are imported only by the calls that need them.
"""

from __future__ import annotations

import collections.abc
import importlib
import logging
import os
import typing
import warnings
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from bless._version import __version__
from bless.core import arguments as check
from bless.core.arguments import BlessOptions, ServeOptions
from bless.core.factors import ResolvedConfig
from bless.core.manifest import CacheTree, Manifest
from bless.core.profile import Profile
from bless.core.verify import FileEntry, Notice, Problem, TreeCheck
from bless.errors import (
    AlreadyBlessedError,
    ArtifactInvalidError,
    ArtifactNotFoundError,
    BelowThresholdError,
    BlessError,
    BlessingError,
    BootstrapFailedError,
    CacheChangedError,
    CacheNotUsedError,
    CanaryFailedError,
    ConfigError,
    ConflictError,
    ContainerConflictError,
    CoverageIncompleteError,
    DigestMismatchError,
    DowngradeError,
    EngineError,
    EngineFailedError,
    EnvironmentMismatchError,
    ExitCode,
    GateFailedError,
    GpuSelectionError,
    HardwareMismatchError,
    HostError,
    ImageMissingError,
    InputInvalidError,
    InsufficientGpuError,
    InterruptedByUserError,
    LockHeldError,
    ManifestDuplicateError,
    ManifestInvalidError,
    MetadataExpiredError,
    NoManifestError,
    NoSpaceError,
    NotServingError,
    RegistryError,
    RegistryUnavailableError,
    ResolutionError,
    RollbackError,
    RuntimeUnavailableError,
    SignatureUntrustedError,
    StoreUnavailableError,
    TargetMismatchError,
    TransferIncompleteError,
    TrialsFailedError,
    TrustError,
    TrustExistsError,
    TrustInvalidError,
    UnknownEngineVersionError,
    UnprovenCompileError,
    UnsafeEnvError,
    UnsignedError,
    UsageError,
    VerificationError,
    VerifyFailedError,
    WeakerBlessingError,
)
from bless.flows.events import Event, EventSink
from bless.flows.gate.check import GateReport, GateRow
from bless.flows.gate.outcome import GateOutcome
from bless.flows.gc import GcOutcome
from bless.flows.inspect import VerifyOutcome
from bless.flows.inspect.diff import BlessingDiff
from bless.flows.inspect.listing import BlessingList
from bless.flows.inspect.show import ShownBlessing
from bless.flows.run import RunResult
from bless.flows.run.results import CandidateResult, TrialResult
from bless.flows.serve.plan import PlanContainer, PlanMount, ServePlan
from bless.flows.serve.ready import ReadyRecord
from bless.flows.serve.serve_full import ServeHooks, ServeOutcome
from bless.flows.serve.stop import StopOutcome
from bless.flows.sign import SignOutcome
from bless.k8s.documents import K8sOptions, K8sRendered
from bless.replay.devices import GpuRank
from bless.runtime.base import Runtime
from bless.store import Store as _StoreImpl
from bless.store.gc import GcAction, GcReport
from bless.store.layout import require_manifests_dir as _require_manifests_dir
from bless.trust import TrustSigning
from bless.trust.client import TrustVerdict
from bless.trust.repository import RoleKeys, TrustInitResult

if TYPE_CHECKING:
    import bless.flows.pull as _pull_flow
    import bless.flows.push as _push_flow
    import bless.flows.serve as _serve_flow
    from bless.flows.pull import PullResult
    from bless.flows.push import PushResult
else:

    class _Deferred:
        """A flow module imported on first use: pull and push bring the registry client (oras, requests),
        which neither ``import bless`` nor the command line's start loads. Their result types resolve through
        it for ``typing.get_type_hints``, and ``bless.PullResult`` / ``bless.PushResult`` through
        :func:`__getattr__`."""

        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, attribute: str) -> typing.Any:
            return getattr(importlib.import_module(self._name), attribute)

    _pull_flow = _Deferred("bless.flows.pull")
    _serve_flow = _Deferred("bless.flows.serve")
    _push_flow = _Deferred("bless.flows.push")


def __getattr__(name: str) -> typing.Any:
    if name == "PullResult":
        return _pull_flow.PullResult
    if name == "PushResult":
        return _push_flow.PushResult
    raise AttributeError(f"module 'bless' has no attribute {name!r}")


@typing.runtime_checkable
class Store(typing.Protocol):
    """A store as a caller holds it (:func:`open_store`): where it is, and where a blessing's manifest is.

    What it holds is read through :func:`list_blessings`, :func:`show` and :func:`verify`, and changed only by
    the calls (:func:`run_blessing`, :func:`pull`, :func:`collect_garbage`): publishing, rejecting, locking and
    collecting garbage directly are not a caller's to do, so this type does not offer them.
    """

    @property
    def root(self) -> Path:
        """The store's root directory."""
        ...

    @property
    def manifests_dir(self) -> Path:
        """Where its live manifests are (``<root>/manifests`` unless given)."""
        ...

    def manifest_path(self, config_hash: str) -> Path | None:
        """The live manifest file of ``config_hash`` (the full hash), or None when it is not blessed."""
        ...


#: A file system path as the calls accept it.
StrPath = str | os.PathLike[str]
#: Progress of a transfer or a check: called with the bytes done since the last call.
Progress = collections.abc.Callable[[int], None]

#: One name per kind of result: each call returns a ``*Result`` (the older ``*Outcome`` names stay).
VerifyResult = VerifyOutcome
ServeResult = ServeOutcome
SignResult = SignOutcome
GcResult = GcOutcome
GateResult = GateOutcome
StopResult = StopOutcome

#: What the command line shows as progress is logged here too (INFO; warnings at WARNING) when a call is
#: given no ``events=``: configure ``logging`` to see it. The library itself never prints.
logger = logging.getLogger("bless")
logger.addHandler(logging.NullHandler())

__all__ = [
    "AlreadyBlessedError",
    "ArtifactInvalidError",
    "ArtifactNotFoundError",
    "BelowThresholdError",
    "BlessError",
    "BlessOptions",
    "BlessingDiff",
    "BlessingError",
    "BlessingList",
    "BootstrapFailedError",
    "CacheChangedError",
    "CacheNotUsedError",
    "CacheTree",
    "CanaryFailedError",
    "CandidateResult",
    "ConfigError",
    "ConflictError",
    "ContainerConflictError",
    "CoverageIncompleteError",
    "DigestMismatchError",
    "DowngradeError",
    "EngineError",
    "EngineFailedError",
    "EnvironmentMismatchError",
    "Event",
    "EventSink",
    "ExitCode",
    "FileEntry",
    "GateFailedError",
    "GateOutcome",
    "GateReport",
    "GateResult",
    "GateRow",
    "GcAction",
    "GcOutcome",
    "GcReport",
    "GcResult",
    "GpuRank",
    "GpuSelectionError",
    "HardwareMismatchError",
    "HostError",
    "ImageMissingError",
    "InputInvalidError",
    "InsufficientGpuError",
    "InterruptedByUserError",
    "K8sOptions",
    "K8sRendered",
    "LockHeldError",
    "Manifest",
    "ManifestDuplicateError",
    "ManifestInvalidError",
    "MetadataExpiredError",
    "NoManifestError",
    "NoSpaceError",
    "NotServingError",
    "Notice",
    "PlanContainer",
    "PlanMount",
    "Problem",
    "Profile",
    "Progress",
    "PullResult",
    "PushResult",
    "ReadyRecord",
    "RegistryError",
    "RegistryUnavailableError",
    "ResolutionError",
    "ResolvedConfig",
    "RoleKeys",
    "RollbackError",
    "RunResult",
    "Runtime",
    "RuntimeUnavailableError",
    "ServeHooks",
    "ServeOptions",
    "ServeOutcome",
    "ServePlan",
    "ServeResult",
    "ShownBlessing",
    "SignOutcome",
    "SignResult",
    "SignatureUntrustedError",
    "StopOutcome",
    "StopResult",
    "Store",
    "StoreUnavailableError",
    "StrPath",
    "TargetMismatchError",
    "TransferIncompleteError",
    "TreeCheck",
    "TrialResult",
    "TrialsFailedError",
    "TrustError",
    "TrustExistsError",
    "TrustInitResult",
    "TrustInvalidError",
    "TrustSigning",
    "TrustVerdict",
    "UnknownEngineVersionError",
    "UnprovenCompileError",
    "UnsafeEnvError",
    "UnsignedError",
    "UsageError",
    "VerificationError",
    "VerifyFailedError",
    "VerifyOutcome",
    "VerifyResult",
    "WeakerBlessingError",
    "__version__",
    "collect_garbage",
    "diff",
    "gate",
    "init_trust",
    "k8s_render",
    "list_blessings",
    "load_profile",
    "logger",
    "open_store",
    "pull",
    "push",
    "resolve_profile",
    "rotate_trust",
    "run_blessing",
    "serve",
    "serve_ready",
    "serve_stop",
    "show",
    "sign",
    "verify",
]


def _log_event(event: Event) -> None:
    """The sink of a call given no ``events=``: each event to the ``bless`` logger."""
    level = logging.WARNING if event.kind == "warning" else logging.INFO
    logger.log(level, "%s", event.message, extra={"bless_event": event})


def _store(store: object) -> _StoreImpl:
    """The store a call was given (what :func:`open_store` returned), or the default one."""
    given = check.optional_instance("store", store, _StoreImpl, "a Store (bless.open_store())")
    return given if given is not None else _open_store(None, None)


def _open_store(root: Path | None, manifests_dir: Path | None) -> _StoreImpl:
    from bless.store import default_root

    return _StoreImpl(root if root is not None else default_root(), manifests_dir)


def _runtime(runtime: object) -> Runtime | None:
    if runtime is not None and not callable(getattr(runtime, "resolve_image", None)):
        raise UsageError(
            f"runtime must be a bless.Runtime, not {type(runtime).__name__}", hint="pass runtime=None (the profile's)"
        )
    return runtime  # type: ignore[return-value]  # checked: it has the Runtime interface's calls


def _trust_metadata(name: str, value: object) -> Path | None:
    """A trust repository given to a verifying call: the ``bless trust init`` directory or its ``metadata/``."""
    directory = check.optional_path(name, value)
    if directory is not None and (directory / "metadata").is_dir():
        return directory / "metadata"
    return directory


def _profile_argument(profile: object) -> Profile:
    if isinstance(profile, Profile):
        return profile
    return load_profile(check.path("profile", profile))


def open_store(root: StrPath | None = None, manifests_dir: StrPath | None = None) -> Store:
    """The store under ``root`` (None: ``$BLESS_ROOT``, else ``~/.cache/bless``). Touches nothing on disk.

    ``manifests_dir``: where its live manifests are (None: ``<root>/manifests``), e.g. a git checkout.
    """
    return _open_store(check.optional_path("root", root), check.optional_path("manifests_dir", manifests_dir))


def load_profile(path: StrPath) -> Profile:
    """Read and validate a profile TOML file (:class:`InputInvalidError`, exit 3, when it is not one)."""
    from bless.core.profile import load_profile as load

    return load(check.path("path", path))


def resolve_profile(
    profile: Profile | StrPath, *, offline: bool = False, runtime: Runtime | None = None
) -> ResolvedConfig:
    """Resolve a profile on this machine to its factors and config hash (what ``bless hash`` prints).

    An image given by tag is resolved to its ID through the profile's runtime (``runtime``: another one);
    a pinned ``sha256:`` ID needs none. ``offline`` forbids network lookups (model revisions must be pinned).
    As ``bless hash``, a complete ``[hardware]`` declaration and the ``[runtime]`` and ``[model]`` ones are
    taken as written, so a GPU profile resolves on any machine (its hash is the serving host's).
    """
    from bless.flows.resolve import RUNTIME_WHEN_NEEDED, resolve_for_command

    check.flag("offline", offline)
    the_runtime = _runtime(runtime)
    loaded = _profile_argument(profile)
    resolver = the_runtime.resolve_image if the_runtime is not None else RUNTIME_WHEN_NEEDED
    return resolve_for_command(loaded, image_resolver=resolver, hardware="judge", offline=offline).resolved


def run_blessing(
    profile: Profile | StrPath,
    options: BlessOptions | None = None,
    *,
    store: Store | None = None,
    trials: int | None = None,
    confidence: float | None = None,
    candidates: int = 1,
    rebless: bool = False,
    allow_weaker: bool = False,
    wait: bool = False,
    allow_unknown_engine_version: bool = False,
    parallel: int | None = None,
    runtime: Runtime | None = None,
    events: EventSink | None = None,
) -> RunResult:
    """Bless a profile (``bless run``): compile its cache, prove it with K trials, publish or reject it.

    The options come as ``options`` (a :class:`BlessOptions`) or as the keywords of the same names, not both.
    ``trials``: K, 1 to 1000 (None: the profile's ``[trials] count``). ``confidence``: of the failure-rate
    bound, strictly between 0 and 1 (None: 0.95). ``candidates``: bootstraps to try, 1 to 20. ``rebless``
    replaces an existing blessing (else :class:`AlreadyBlessedError`, 10); ``allow_weaker`` lets it have a
    weaker failure-rate bound; ``wait`` queues behind another writer of the config instead of refusing (11).
    ``parallel``: trials at once, at least 1 (None: as many as the GPUs fit).
    Nothing published is no error: ``result.published`` is False and ``result.candidates`` say why.
    ``events``: called with each progress event (None: logged to the ``bless`` logger).
    Runs on the GPUs ``$CUDA_VISIBLE_DEVICES`` leaves.
    """
    from bless.flows.run import RunOptions, bless_profile
    from bless.flows.run.results import DEFAULT_CONFIDENCE

    keywords = BlessOptions(
        trials=trials,
        confidence=confidence,
        candidates=candidates,
        rebless=rebless,
        allow_weaker=allow_weaker,
        wait=wait,
        allow_unknown_engine_version=allow_unknown_engine_version,
        parallel=parallel,
    )
    asked = check.one_of("options", options, BlessOptions, keywords)
    the_store = _store(store)
    the_runtime = _runtime(runtime)
    sink = check.callback("events", events)
    run_options = RunOptions(
        trials=check.optional_count("trials", asked.trials, maximum=1000),
        confidence=DEFAULT_CONFIDENCE if asked.confidence is None else check.fraction("confidence", asked.confidence),
        candidates=check.count("candidates", asked.candidates, maximum=20),
        rebless=check.flag("rebless", asked.rebless),
        wait_lock=check.flag("wait", asked.wait),
        allow_weaker=check.flag("allow_weaker", asked.allow_weaker),
        allow_unknown_engine_version=check.flag("allow_unknown_engine_version", asked.allow_unknown_engine_version),
        parallel=check.optional_count("parallel", asked.parallel),
    )
    return bless_profile(
        profile if isinstance(profile, Profile) else check.path("profile", profile),
        run_options,
        store=the_store,
        runtime=the_runtime,
        events=sink or _log_event,  # type: ignore[arg-type]  # checked callable
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )


def verify(
    config_hash: str,
    *,
    store: Store | None = None,
    trust_dir: StrPath | None = None,
    progress: Progress | None = None,
    max_workers: int | None = None,
) -> VerifyOutcome:
    """Check a blessing's files byte for byte against its manifest (``bless verify``).

    ``config_hash``: the hash or a unique prefix of at least 8 hex digits. A mismatch is a result, not an
    exception: ``result.ok`` is False and ``result.problems`` lists every difference. ``trust_dir``: the
    trust repository (``bless trust init``'s directory, or its ``metadata/``); the manifest must also be a
    validly signed, fresh, current TUF target (a :class:`TrustError`, 60-66, otherwise). ``progress``:
    called with the bytes hashed since its last call; ``max_workers``: hashing threads (None: the default).
    """
    from contextlib import nullcontext

    from bless.flows.inspect import verify_blessing

    text = check.text("config_hash", config_hash)
    the_store = _store(store)
    trust = _trust_metadata("trust_dir", trust_dir)
    report = check.callback("progress", progress)
    factory = (lambda total: nullcontext(report)) if report is not None else None
    workers = check.optional_count("max_workers", max_workers, maximum=256)
    return verify_blessing(the_store, text, trust_dir=trust, progress=factory, workers=workers)  # type: ignore[arg-type]


def serve(
    profile: Profile | StrPath,
    options: ServeOptions | None = None,
    *,
    store: Store | None = None,
    dry_run: bool = False,
    detach: bool = False,
    trust_dir: StrPath | None = None,
    canary: bool = True,
    allow_unknown_engine_version: bool = False,
    from_reference: str | None = None,
    plain_http: bool | None = None,
    runtime: Runtime | None = None,
    hooks: ServeHooks | None = None,
    no_canary: bool | None = None,
) -> ServeOutcome:
    """Serve a profile on its blessed cache, fail closed (``serve-full``).

    The options come as ``options`` (a :class:`ServeOptions`) or as the keywords of the same names, not both.
    ``dry_run`` returns the plan (every check made, nothing started); ``detach`` returns once the engine
    is ready and canary-checked; otherwise the call serves until ``hooks.stop`` is set or the engine ends.
    ``canary`` False skips the canary (``no_canary=True`` is its older spelling; not both).
    Every refusal before serving raises a :class:`BlessError` (a blessed file that differs:
    :class:`VerifyFailedError`, 21); a failure once serving began is ``result.failure``.
    ``from_reference``: pull the blessing from this registry reference first (as :func:`pull`, under
    ``trust_dir``; a no-op when present), as ``serve-full --from`` does.
    Runs on the GPUs ``$CUDA_VISIBLE_DEVICES`` names, rank 0 on the first (``result.plan["ranks"]`` says which).
    """
    from bless.flows.serve.serve_full import ServeRequest, serve_full

    if no_canary is not None:
        if canary is not True:
            raise UsageError(
                "canary and no_canary are one option in two spellings: give one of them",
                hint="pass canary=False to skip the canary (no_canary is its older spelling)",
            )
        warnings.warn("serve(no_canary=True) is now serve(canary=False)", DeprecationWarning, stacklevel=2)
        canary = not check.flag("no_canary", no_canary)
    keywords = ServeOptions(
        dry_run=dry_run,
        detach=detach,
        canary=canary,
        allow_unknown_engine_version=allow_unknown_engine_version,
        trust_dir=trust_dir,
        from_reference=from_reference,
        plain_http=plain_http,
    )
    asked = check.one_of("options", options, ServeOptions, keywords)
    the_store = _store(store)
    for name, value in (
        ("dry_run", asked.dry_run),
        ("detach", asked.detach),
        ("canary", asked.canary),
        ("allow_unknown_engine_version", asked.allow_unknown_engine_version),
    ):
        check.flag(name, value)
    trust = _trust_metadata("trust_dir", asked.trust_dir)
    the_runtime = _runtime(runtime)
    the_hooks = check.optional_instance("hooks", hooks, ServeHooks, "a bless.ServeHooks") or ServeHooks(
        events=_log_event
    )
    fetch = _fetcher(asked.from_reference, trust, check.optional_flag("plain_http", asked.plain_http))
    loaded = _profile_argument(profile)
    request = ServeRequest(
        profile=loaded,
        store=the_store,
        fetch=fetch,
        detach=asked.detach,
        dry_run=asked.dry_run,
        no_canary=not asked.canary,
        allow_unknown_engine_version=asked.allow_unknown_engine_version,
        trust_dir=trust,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    return serve_full(request, runtime=the_runtime, hooks=the_hooks)


def _fetcher(
    reference: object, trust: Path | None, plain_http: bool | None
) -> collections.abc.Callable[[_StoreImpl], _serve_flow.Fetched] | None:
    """``serve(from_reference=)``: the pull the serve flow makes before its checks; None without one."""
    if reference is None:
        return None
    text = check.text("from_reference", reference)

    def fetch(store: _StoreImpl) -> _serve_flow.Fetched:
        from bless.flows.pull import pull_blessing
        from bless.flows.serve import Fetched

        pulled = pull_blessing(store, text, trust_dir=trust, plain_http=plain_http)
        return Fetched(reference=text, config_hash=pulled.config_hash, dir_id=pulled.dir_id, report=pulled.to_dict())

    return fetch


def serve_stop(name: str, *, store: Store | None = None, timeout_s: int = 30) -> StopOutcome:
    """Stop the detached serve ``name`` (``serve-full stop``): gracefully (SIGKILL after ``timeout_s``), then
    remove its container or process group, serve dir and serving lease. Nothing found is no error:
    ``result.found`` is False."""
    from functools import partial

    from bless.flows.serve.stop import stop_serving
    from bless.runtime import get_runtime

    text = check.text("name", name)
    the_store = _store(store)
    seconds = check.count("timeout_s", timeout_s, maximum=3600)
    return stop_serving(text, store=the_store, docker=partial(get_runtime, "docker"), timeout_s=seconds)


def serve_ready(name: str, *, store: Store | None = None, accept_skipped_canary: bool = False) -> ReadyRecord:
    """The readiness of the serve ``name`` (``serve-full ready``): its record while a canary-checked engine
    serves it; a probe, so anything else raises :class:`NotServingError` (46)."""
    from functools import partial

    from bless.flows.serve.ready import check_ready
    from bless.runtime import get_runtime

    text = check.text("name", name)
    the_store = _store(store)
    accept = check.flag("accept_skipped_canary", accept_skipped_canary)
    return check_ready(the_store, text, accept_skipped_canary=accept, docker=partial(get_runtime, "docker"))


def pull(
    reference: str,
    *,
    store: Store | None = None,
    trust_dir: StrPath | None = None,
    plain_http: bool | None = None,
    wait: bool = False,
    allow_downgrade: bool = False,
    progress: Progress | None = None,
    max_workers: int | None = None,
) -> _pull_flow.PullResult:
    """Pull a blessing from an OCI registry into the store (``bless pull``); one already present is a no-op.

    ``reference``: ``REGISTRY/REPOSITORY:TAG`` or ``...@sha256:DIGEST``. ``trust_dir``: the trust repository
    (or its ``metadata/``); the blessing must be a validly signed, fresh, current TUF target before any file
    is downloaded. ``wait`` True queues behind another writer of the config, False (as every call) refuses at
    once (:class:`LockHeldError`, 11); ``allow_downgrade`` replaces a newer live blessing (else 16).
    ``progress``: called with the bytes downloaded since its last call; ``max_workers``: parallel downloads.
    """
    from bless.flows.pull import pull_blessing
    from bless.flows.pull.download import DOWNLOAD_WORKERS

    text = check.text("reference", reference)
    the_store = _store(store)
    trust = _trust_metadata("trust_dir", trust_dir)
    report = check.callback("progress", progress)
    workers = check.optional_count("max_workers", max_workers, maximum=64)
    return pull_blessing(
        the_store,
        text,
        trust_dir=trust,
        plain_http=check.optional_flag("plain_http", plain_http),
        wait=check.flag("wait", wait),
        allow_downgrade=check.flag("allow_downgrade", allow_downgrade),
        progress=report,  # type: ignore[arg-type]  # checked callable
        workers=workers if workers is not None else DOWNLOAD_WORKERS,
    )


def push(
    config_hash: str,
    reference: str,
    *,
    store: Store | None = None,
    trust_dir: StrPath | None = None,
    plain_http: bool | None = None,
    progress: Progress | None = None,
    max_workers: int | None = None,
    metadata_dir: StrPath | None = None,
) -> _push_flow.PushResult:
    """Push a blessing (hash or unique prefix) to an OCI registry (``bless push``); it is verified first
    (a blessed file that differs: :class:`VerifyFailedError`, 21).

    ``trust_dir``: the trust repository (or its ``metadata/``), whose TUF metadata is attached
    (``metadata_dir``: its older name). ``progress``: called with the bytes uploaded since its last call;
    ``max_workers``: parallel uploads.
    Credentials come from the docker config (``docker login``).
    """
    from bless.flows.push import UPLOAD_WORKERS, push_blessing

    text = check.text("config_hash", config_hash)
    target = check.text("reference", reference)
    the_store = _store(store)
    if metadata_dir is not None:
        warnings.warn("push(metadata_dir=) is now trust_dir=", DeprecationWarning, stacklevel=2)
        if trust_dir is not None:
            raise UsageError("give trust_dir or its older name metadata_dir, not both")
        trust_dir = metadata_dir
    trust = _trust_metadata("trust_dir", trust_dir)
    flag = check.optional_flag("plain_http", plain_http)
    report = check.callback("progress", progress)
    workers = check.optional_count("max_workers", max_workers, maximum=64)
    return push_blessing(
        the_store,
        the_store.live_prefix(text).manifest,
        target,
        metadata_dir=trust,
        plain_http=flag,
        progress=report,  # type: ignore[arg-type]  # checked callable
        workers=workers if workers is not None else UPLOAD_WORKERS,
    )


def sign(
    config_hash: str,
    trust_dir: StrPath,
    *,
    store: Store | None = None,
    passphrase: bytes | None = None,
    expires: timedelta | None = None,
    keep_previous: bool = False,
) -> SignOutcome:
    """Sign a blessing (hash or unique prefix) with the trust repository ``trust_dir`` (``bless sign``,
    made by :func:`init_trust` or ``bless trust init``).

    The blessed files are verified first: a tree that differs from its manifest is never signed
    (:class:`VerifyFailedError`, 21). ``passphrase``: of its encrypted file keys. ``expires``: how long the
    new metadata is valid (None: bless sign's default). A re-blessed config's older signed versions are
    delisted unless ``keep_previous``.
    """
    from bless.flows.sign import sign_stored_blessing
    from bless.trust import DEFAULT_EXPIRES
    from bless.trust.keys import KeySources

    text = check.text("config_hash", config_hash)
    repository = check.path("trust_dir", trust_dir)
    the_store = _store(store)
    secret = check.secret("passphrase", passphrase)
    valid_for = DEFAULT_EXPIRES if expires is None else check.duration("expires", expires)
    keep = check.flag("keep_previous", keep_previous)
    return sign_stored_blessing(
        the_store,
        the_store.live_prefix(text),
        repository,
        expires=valid_for,
        sources=KeySources(passphrase=secret),
        keep_previous=keep,
    )


def init_trust(trust_dir: StrPath, *, passphrase: bytes | None = None, unencrypted: bool = False) -> TrustInitResult:
    """Create a trust repository in ``trust_dir`` (``bless trust init``): the four TUF roles, one Ed25519
    file key each under ``keys/`` (0600) and their signed metadata under ``metadata/``.

    File keys are encrypted with ``passphrase``; ``unencrypted=True`` writes them in the clear (an explicit
    choice). An existing repository is never overwritten (:class:`TrustExistsError`, 14). Keep it outside
    any checkout: its ``keys/`` are private.
    """
    from bless.trust.keys import KeySources
    from bless.trust.repository import init_repository

    directory = check.path("trust_dir", trust_dir)
    secret = check.secret("passphrase", passphrase)
    if check.flag("unencrypted", unencrypted) == (secret is not None):
        raise UsageError(
            "give either passphrase= (encrypted file keys) or unencrypted=True, exactly one",
            hint="pass passphrase=b'...' to encrypt the private keys, or unencrypted=True to write them in the clear",
        )
    return init_repository(directory, sources=KeySources(passphrase=secret, unencrypted=unencrypted))


def rotate_trust(
    trust_dir: StrPath, role: str, *, passphrase: bytes | None = None, expires: timedelta | None = None
) -> TrustSigning:
    """Replace ``role``'s keys with a fresh file key in a new root version and re-sign (``bless trust rotate``).

    ``passphrase``: of the repository's encrypted file keys, and for the new one (None: unencrypted keys).
    ``expires``: how long the re-signed metadata is valid (None: the default).
    """
    from bless.flows.trust import rotate_trust as rotate
    from bless.trust import DEFAULT_EXPIRES
    from bless.trust.keys import KeyAccess

    directory = check.path("trust_dir", trust_dir)
    which = check.text("role", role)
    secret = check.secret("passphrase", passphrase)
    valid_for = DEFAULT_EXPIRES if expires is None else check.duration("expires", expires)
    access = KeyAccess(passphrase=lambda needed, confirm: secret, unencrypted=secret is None)
    seconds = max(1, int(valid_for.total_seconds()))
    unit = next((unit for unit, size in (("d", 86400), ("h", 3600), ("m", 60)) if seconds % size == 0), "s")
    count = seconds // {"d": 86400, "h": 3600, "m": 60, "s": 1}[unit]
    return rotate(directory, which, access=access, expires=f"{count}{unit}")


def gate(
    profiles: collections.abc.Sequence[StrPath] = (),
    *,
    store: Store | None = None,
    verify: bool = False,
    junit: StrPath | None = None,
) -> GateOutcome:
    """Gate ``profiles`` (none: ``profiles/*.toml`` here) against the store's manifests (``bless gate``).

    A profile that is not blessed is a result: ``result.report.ok`` is False and ``result.failure`` is the
    :class:`GateFailedError` (24) the command exits with. ``verify`` also checks the cache files where they
    are present; ``junit`` writes the JUnit report there. A manifests dir that does not exist is a
    :class:`UsageError` (2), not "nothing is blessed".
    """
    from bless.flows.gate.outcome import gate_profiles

    if isinstance(profiles, str | os.PathLike) or not isinstance(profiles, collections.abc.Sequence):
        raise UsageError("profiles must be a list of profile paths", hint="pass profiles=['profiles/a.toml']")
    paths = [check.path("profiles[]", item) for item in profiles]
    the_store = _store(store)
    _require_manifests_dir(the_store.manifests_dir)  # as bless gate: a typo must not read as "nothing is blessed"
    return gate_profiles(
        paths, the_store, verify=check.flag("verify", verify), junit=check.optional_path("junit", junit)
    )


def k8s_render(
    profile: StrPath,
    options: K8sOptions,
    *,
    store: Store | None = None,
    trust_dir: StrPath | None = None,
    plain_http: bool | None = None,
    dry_run: bool = False,
) -> K8sRendered:
    """The Kubernetes documents that serve ``options.artifact`` (a digest) with ``profile`` (``bless k8s render``).

    The blessing's manifest is read from ``store`` when it holds that digest, else from the registry; ``trust_dir``
    renders its ``root.json`` as the trust ConfigMap; ``dry_run`` reads no blessing (the profile's declarations
    only). ``result.documents`` are the Deployment, Service, PodDisruptionBudget and ConfigMaps; ``result.warnings``
    what an operator must know (a loopback reference, where Pod Security "restricted" cannot hold).
    """
    from bless.flows.k8s import render_blessing

    given = check.optional_instance("options", options, K8sOptions, "a bless.K8sOptions(...)")
    if given is None:
        raise UsageError("options is required", hint="pass options=bless.K8sOptions(artifact=..., ...)")
    path = check.path("profile", profile)
    trust = check.optional_path("trust_dir", trust_dir)
    http = None if plain_http is None else check.flag("plain_http", plain_http)
    return render_blessing(
        path, given, trust_dir=trust, store=_store(store), plain_http=http, dry_run=check.flag("dry_run", dry_run)
    )


def list_blessings(*, store: Store | None = None) -> BlessingList:
    """Every manifest of the store (``bless list``): valid ones summarized, invalid ones with their error."""
    from bless.flows.inspect.listing import list_blessings as listing

    return listing(_store(store))


def show(config_hash: str, *, store: Store | None = None) -> ShownBlessing:
    """One blessing (``bless show``): its whole manifest, its file and its blessed dir."""
    from bless.flows.inspect.show import show_blessing

    text = check.text("config_hash", config_hash)
    return show_blessing(_store(store), text)


def diff(
    config_hash: str,
    other: str | None = None,
    *,
    profile: StrPath | None = None,
    store: Store | None = None,
    offline: bool = False,
) -> BlessingDiff:
    """The factors that differ (``bless diff``) between the blessing ``config_hash`` and the blessing
    ``other``, or the ``profile`` file resolved here: exactly one of the two."""
    from bless.flows.inspect.diff import diff_profile

    text = check.text("config_hash", config_hash)
    second = None if other is None else check.text("other", other)
    path = check.optional_path("profile", profile)
    return diff_profile(_store(store), text, second, profile=path, offline=check.flag("offline", offline))


def collect_garbage(*, store: Store | None = None, keep: int = 0, dry_run: bool = False) -> GcOutcome:
    """Remove what no blessing needs (``bless gc``); ``dry_run`` only lists it; ``keep``: also keep the N
    newest unreferenced versions and evidence dirs per config."""
    from bless.flows.gc import collect_garbage as collect

    return collect(_store(store), keep=check.count("keep", keep, minimum=0), dry_run=check.flag("dry_run", dry_run))
