"""bless: bless, verify and serve compiled torch.compile / CUDA-graph caches, fail closed.

The public Python API is what ``__all__`` names (docs/reference/python-api.md shows each call): open a
store, load and resolve a profile, bless it, verify a blessing, serve it, pull, push and sign it; every
refusal is a :class:`BlessError` carrying an :class:`ExitCode`. Every other module (``bless.core``,
``bless.flows``, ``bless.store``, ...) is internal: it may change in any release.

Each call is a thin wrapper over the entry point the command line uses. The heavy parts (the Docker SDK,
the registry client, python-tuf) are imported inside the calls that need them, so ``import bless`` stays
as cheap as the CLI's start.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from bless._version import __version__
from bless.errors import BlessError, ExitCode

if TYPE_CHECKING:
    from bless.core.factors import ResolvedConfig
    from bless.core.profile import Profile
    from bless.flows.events import EventSink
    from bless.flows.inspect import VerifyOutcome
    from bless.flows.pull import PullResult
    from bless.flows.push import PushResult
    from bless.flows.run import RunResult
    from bless.flows.serve.serve_full import ServeHooks, ServeOutcome
    from bless.flows.sign import SignOutcome
    from bless.runtime.base import Runtime
    from bless.store import Store

__all__ = [
    "BlessError",
    "ExitCode",
    "__version__",
    "load_profile",
    "open_store",
    "pull",
    "push",
    "resolve_profile",
    "run_blessing",
    "serve",
    "sign",
    "verify",
]

#: A file system path as the calls accept it.
StrPath = str | os.PathLike[str]


def open_store(root: StrPath | None = None, manifests_dir: StrPath | None = None) -> Store:
    """The store under ``root`` (None: ``$BLESS_ROOT``, else ``~/.cache/bless``). Touches nothing on disk.

    ``manifests_dir``: where its live manifests are (None: ``<root>/manifests``), e.g. a git checkout.
    """
    from bless.store import Store, default_root

    return Store(
        Path(root) if root is not None else default_root(),
        Path(manifests_dir) if manifests_dir is not None else None,
    )


def load_profile(path: StrPath) -> Profile:
    """Read and validate a profile TOML file (:class:`~bless.errors.InputInvalidError`, exit 3, when it is not one)."""
    from bless.core.profile import load_profile as load

    return load(Path(path))


def _profile(profile: Profile | StrPath) -> Profile:
    from bless.core.profile import Profile

    return profile if isinstance(profile, Profile) else load_profile(profile)


def resolve_profile(
    profile: Profile | StrPath, *, offline: bool = False, runtime: Runtime | None = None
) -> ResolvedConfig:
    """Resolve a profile on this machine to its factors and config hash (what ``bless hash`` prints).

    An image given by tag is resolved to its ID through the profile's runtime (``runtime``: another one);
    a pinned ``sha256:`` ID needs none. ``offline`` forbids network lookups (model revisions must be pinned).
    """
    from bless.flows.resolve import RUNTIME_WHEN_NEEDED, resolve_for_command

    loaded = _profile(profile)
    resolver = runtime.resolve_image if runtime is not None else RUNTIME_WHEN_NEEDED
    return resolve_for_command(loaded, image_resolver=resolver, offline=offline).resolved


def run_blessing(
    profile: Profile | StrPath,
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

    ``trials``: K (None: the profile's ``[trials] count``). ``rebless`` replaces an existing blessing
    (else :class:`~bless.errors.AlreadyBlessedError`, 10); ``allow_weaker`` lets it have a weaker
    failure-rate bound; ``wait`` queues behind another writer of the config instead of refusing (11).
    Nothing published is no error: ``result.published`` is False and ``result.candidates`` say why.
    ``events``: called with each progress event. Runs on the GPUs ``$CUDA_VISIBLE_DEVICES`` leaves.
    """
    from bless.core.profile import Profile
    from bless.flows.events import ignore_events
    from bless.flows.run import RunOptions, bless_profile
    from bless.flows.run.results import DEFAULT_CONFIDENCE

    options = RunOptions(
        trials=trials,
        confidence=DEFAULT_CONFIDENCE if confidence is None else confidence,
        candidates=candidates,
        rebless=rebless,
        wait_lock=wait,
        allow_weaker=allow_weaker,
        allow_unknown_engine_version=allow_unknown_engine_version,
        parallel=parallel,
    )
    return bless_profile(
        profile if isinstance(profile, Profile) else Path(profile),
        options,
        store=store or open_store(),
        runtime=runtime,
        events=events or ignore_events,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )


def verify(config_hash: str, *, store: Store | None = None, trust_dir: StrPath | None = None) -> VerifyOutcome:
    """Check a blessing's files byte for byte against its manifest (``bless verify``).

    ``config_hash``: the hash or a unique prefix of at least 8 hex digits. A mismatch is no exception:
    ``outcome.ok`` is False and ``outcome.problems`` lists every difference. ``trust_dir``: the manifest
    must also be a validly signed, fresh, current TUF target (a :class:`BlessError`, 60-66, otherwise).
    """
    from bless.flows.inspect import verify_blessing

    return verify_blessing(store or open_store(), config_hash, trust_dir=Path(trust_dir) if trust_dir else None)


def serve(
    profile: Profile | StrPath,
    *,
    store: Store | None = None,
    dry_run: bool = False,
    detach: bool = False,
    trust_dir: StrPath | None = None,
    no_canary: bool = False,
    allow_unknown_engine_version: bool = False,
    runtime: Runtime | None = None,
    hooks: ServeHooks | None = None,
) -> ServeOutcome:
    """Serve a profile on its blessed cache, fail closed (``serve-full``).

    ``dry_run`` returns the plan (every check made, nothing started); ``detach`` returns once the engine
    is ready and canary-checked; otherwise the call serves until ``hooks.stop`` is set or the engine ends.
    Every refusal before serving is a :class:`BlessError`; a failure once serving began is
    ``outcome.failure``.
    """
    from bless.flows.serve.serve_full import ServeRequest, serve_full

    loaded = _profile(profile)
    request = ServeRequest(
        profile=loaded,
        store=store or open_store(),
        detach=detach,
        dry_run=dry_run,
        no_canary=no_canary,
        allow_unknown_engine_version=allow_unknown_engine_version,
        trust_dir=Path(trust_dir) if trust_dir else None,
    )
    return serve_full(request, runtime=runtime, hooks=hooks)


def pull(
    reference: str,
    *,
    store: Store | None = None,
    trust_dir: StrPath | None = None,
    plain_http: bool | None = None,
    wait: bool = True,
    allow_downgrade: bool = False,
) -> PullResult:
    """Pull a blessing from an OCI registry into the store (``bless pull``); one already present is a no-op.

    ``reference``: ``REGISTRY/REPOSITORY:TAG`` or ``...@sha256:DIGEST``. ``trust_dir``: it must be a validly
    signed, fresh, current TUF target before any file is downloaded. ``wait`` False refuses at once (11)
    when another writer holds the config; ``allow_downgrade`` replaces a newer live blessing (else 16).
    """
    from bless.flows.pull import pull_blessing
    from bless.oci.client import parse_reference

    return pull_blessing(
        store or open_store(),
        parse_reference(reference),
        trust_dir=Path(trust_dir) if trust_dir else None,
        plain_http=plain_http,
        wait=wait,
        allow_downgrade=allow_downgrade,
    )


def push(
    config_hash: str,
    reference: str,
    *,
    store: Store | None = None,
    metadata_dir: StrPath | None = None,
    plain_http: bool | None = None,
) -> PushResult:
    """Push a blessing (hash or unique prefix) to an OCI registry (``bless push``); it is verified first.

    ``metadata_dir``: the signing repository's ``DIR/metadata``, whose TUF metadata is attached.
    Credentials come from the docker config (``docker login``).
    """
    from bless.flows.push import push_blessing
    from bless.oci.client import parse_reference

    the_store = store or open_store()
    return push_blessing(
        the_store,
        the_store.live_prefix(config_hash).manifest,
        parse_reference(reference),
        metadata_dir=Path(metadata_dir) if metadata_dir else None,
        plain_http=plain_http,
    )


def sign(
    config_hash: str,
    keys_dir: StrPath,
    *,
    store: Store | None = None,
    passphrase: bytes | None = None,
    expires: timedelta | None = None,
    keep_previous: bool = False,
) -> SignOutcome:
    """Sign a blessing (hash or unique prefix) with the signing repository ``keys_dir`` (``bless sign``).

    ``passphrase``: of its encrypted file keys. ``expires``: how long the new metadata is valid (None: bless
    sign's default). A
    re-blessed config's older signed versions are delisted unless ``keep_previous``.
    """
    from bless.flows.sign import sign_stored_blessing
    from bless.trust import DEFAULT_EXPIRES
    from bless.trust.keys import KeySources

    the_store = store or open_store()
    return sign_stored_blessing(
        the_store,
        the_store.live_prefix(config_hash),
        Path(keys_dir),
        expires=expires or DEFAULT_EXPIRES,
        sources=KeySources(passphrase=passphrase),
        keep_previous=keep_previous,
    )
