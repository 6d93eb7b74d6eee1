"""What differs per serving engine: the adapter protocol and the data it returns.

An adapter is pure policy and parsing: it builds argv/env, says where the cache lives
in the container, which env vars are cache-affecting, ignored, secret or unsafe, which
files prove a bootstrap wrote its artifacts, and how to read load/save markers from
logs and writes from an overlay's upper layer. It starts nothing itself.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bless.core.coverage import CoveragePlan
from bless.core.factors import REDACTED, ResolvedConfig
from bless.core.profile import Profile
from bless.core.verify import TreeListing
from bless.errors import InputInvalidError
from bless.evidence_types import (
    ArtifactSummary,
    LogSignals,
    OutsideEntry,
    OutsideKind,
    OutsideVerdict,
    UpperEntry,
    UpperVerdict,
)

#: Words that mark an env name as a secret, compared case-insensitively with the name's parts (split
#: at every character that is not a letter: ``hf_token``, ``HF_TOKEN_1``, ``GITHUB_PAT``, ``DB_PASS``,
#: ``AUTH_HEADER``, ``AWS_SECRET_ACCESS_KEY``). Whole parts, not substrings: ``VLLM_MAX_TOKENS`` (part
#: ``TOKENS``), ``TOKENIZERS_PARALLELISM`` or ``KEYS_DIR`` are tuning knobs and paths that must be hashed,
#: or two configs the engine tells apart would hash alike. Engines list their own hashed names that a
#: word matches (vLLM: ``VLLM_NOT_SECRETS``) so that they stay hashed.
SECRET_WORDS = frozenset(
    {
        "TOKEN", "SECRET", "SECRETS", "PASS", "PASSWORD", "PASSWD", "PASSPHRASE", "KEY", "APIKEY", "AUTH",
        "AUTHORIZATION", "BEARER", "CREDENTIAL", "CREDENTIALS", "CREDS", "PAT", "COOKIE", "DSN",
    }
)  # fmt: skip
#: A part that ends with one of these is a secret too: words glued together (``HFTOKEN``, ``hfToken``, ``MYAPIKEY``).
SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "ACCESSKEY", "CREDENTIALS")
_NAME_PARTS = re.compile(r"[^A-Za-z]+")

#: The engine's HOME and temp dir at every start (bootstrap, trials, serving; every runtime). bless makes
#: both fresh and empty for each start and presents them at these fixed paths: nothing of the host's or
#: the image's HOME reaches the engine, and the paths never change (vLLM hashes HOME-derived paths into
#: its cache key). What the engine leaves in them is judged after the start (:meth:`EngineAdapter.classify_outside`).
ENGINE_HOME = "/var/lib/bless-engine/home"
ENGINE_TMP = "/var/lib/bless-engine/tmp"


def looks_secret(name: str) -> bool:
    """Whether an env name names a secret by :data:`SECRET_WORDS` / :data:`SECRET_SUFFIXES` (any case)."""
    parts = [part for part in _NAME_PARTS.split(name.upper()) if part]
    return any(part in SECRET_WORDS or part.endswith(SECRET_SUFFIXES) for part in parts)


@dataclass(frozen=True)
class EnvPolicy:
    """How profile env vars enter the config hash. ``ignored`` are fnmatch globs on the name.

    Secrets are recognised by :func:`looks_secret`, plus ``secret`` (extra fnmatch globs, any case).
    """

    ignored: tuple[str, ...] = ()
    secret: tuple[str, ...] = ()

    def is_secret(self, name: str) -> bool:
        """Secrets are never hashed and never written anywhere (their name only)."""
        return looks_secret(name) or any(fnmatch.fnmatch(name.upper(), pattern.upper()) for pattern in self.secret)

    def is_ignored(self, name: str) -> bool:
        """Ignored names are recorded in the manifest but do not change the config hash."""
        return self.is_secret(name) or any(fnmatch.fnmatchcase(name, pattern) for pattern in self.ignored)

    def redact_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` (sorted by name) with the values of secret names replaced by ``<redacted>``."""
        return {name: (REDACTED if self.is_secret(name) else value) for name, value in sorted(env.items())}

    def redact_command(self, command: Sequence[str]) -> list[str]:
        """argv with the value of secret-looking flags (``--api-key X``, ``--hf-token=X``) redacted.

        Adapters keep secrets out of argv; this is the belt to their braces, since plans are printed.
        """

        def secret_flag(token: str) -> bool:
            return token.startswith("--") and self.is_secret(token[2:].split("=", 1)[0].replace("-", "_").upper())

        redacted: list[str] = []
        redact_next = False
        for token in command:
            if redact_next:
                redacted.append(REDACTED)
                redact_next = False
            elif secret_flag(token) and "=" in token:
                redacted.append(token.split("=", 1)[0] + "=" + REDACTED)
            else:
                redacted.append(token)
                redact_next = secret_flag(token)
        return redacted


CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def argv_value(where: str, value: str) -> str:
    """``value`` as one argv word of an engine's command line; refuses what the engine would misread.

    A leading ``-`` would make a model id, revision or path a flag (``model.id = "--enforce-eager"``
    would start an eager engine that no unsafe check saw), and control characters have no place in
    an id or path. Raises InputInvalidError (exit 3) naming ``where``.
    """
    if not value or value.startswith("-"):
        raise InputInvalidError(
            f"{where}: {value!r} is not a valid value: it would be read as a command-line flag",
            hint="an id, revision or path never starts with '-' (a local path can be written ./-name)",
        )
    if CONTROL_CHARACTERS.search(value):
        raise InputInvalidError(f"{where}: {value!r} contains a control character")
    return value


@dataclass(frozen=True)
class UnsafeSetting:
    """A profile setting that must not reach a blessed start (debug, cache disabled, test knobs).

    ``test_knob`` marks the knobs that exist only to test bless itself (the reference engine's
    ``BLESS_REFERENCE_*``); everything else is a debug or cache-disabling setting of the engine, and
    the refusal says what to do about each kind.
    """

    name: str
    value: str
    reason: str
    test_knob: bool = False
    #: A setting that moves where compiled state is written (:func:`relocating_settings`).
    relocates: bool = False

    def describe(self) -> str:
        """``NAME=value (why)``, as refusals and warnings print it."""
        return f"{self.name}={self.value} ({self.reason})"


@dataclass(frozen=True)
class EngineLaunch:
    """How to start the engine: argv, env, and the port it listens on inside its container."""

    command: tuple[str, ...]
    env: Mapping[str, str]
    port: int
    workdir: str | None = None


@dataclass(frozen=True)
class CompileLocation:
    """A place the engine, or a library it loads, writes compiled state, pointed into the blessed tree.

    bless sets ``env`` to ``<cache mount>/<subdir>`` at every start, so the bootstrap writes that state
    into the staged tree (and so into the blessing), trials and serving find it there (a read-only
    lower layer: any new file lands in the overlay's upper layer, where it is judged), and nothing
    of it reaches the engine's HOME or temp dir. ``what`` says who writes what there, for people.
    """

    env: str
    subdir: str
    what: str


#: Env names that move where an engine, or a library it loads, writes compiled state, or the HOME and temp dir
#: those default to. bless sets each itself at every start (every declared compile location into the blessed
#: tree, HOME and the temp dir to the start's own private dirs, which are watched): a profile that sets one would
#: put kernels where nothing blesses or watches them (``TORCHINDUCTOR_CACHE_DIR = "/dev/shm/x"``), or be
#: silently overridden. Refused whatever the value (:func:`relocating_settings`), with every declared compile
#: location of the engine (:meth:`EngineAdapter.compile_locations`) and the names :data:`RELOCATING_PATTERNS` match.
RELOCATING_ENV = frozenset(
    {
        "HOME", "TMPDIR", "TMP", "TEMP", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
        "TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR", "TRITON_CACHE_MANAGER",
        "CUDA_CACHE_PATH", "TORCH_EXTENSIONS_DIR", "PYTHONPYCACHEPREFIX",
        "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH",
    }
)  # fmt: skip
#: fnmatch patterns (exact case) of further such names: Inductor's cache and scratch dirs, and its remote caches
#: (compiled artifacts fetched from, and written to, a server outside the blessing).
RELOCATING_PATTERNS = ("TORCHINDUCTOR_*DIR", "TORCHINDUCTOR_*REMOTE_CACHE*", "TRITON_*CACHE_DIR")


def relocating_settings(
    env: Mapping[str, str], declared: Sequence[CompileLocation], *, already: Sequence[UnsafeSetting] = ()
) -> list[UnsafeSetting]:
    """The env settings that move a compile location, HOME or the temp dir (by name, sorted; see
    :data:`RELOCATING_ENV`), less the names ``already`` refuses for a reason of its own."""
    named = RELOCATING_ENV | {location.env for location in declared}
    taken = {setting.name for setting in already}
    return [
        UnsafeSetting(
            name,
            value,
            "moves where compiled state is written out of what bless blesses and watches (bless points every "
            "compile location into the blessed tree and gives each start its own HOME and temp dir)",
            relocates=True,
        )
        for name, value in sorted(env.items())
        if name not in taken and (name in named or any(fnmatch.fnmatchcase(name, p) for p in RELOCATING_PATTERNS))
    ]


@dataclass(frozen=True)
class OutsideRule:
    """How an adapter names one kind of write outside the blessed tree (first matching rule wins).

    ``pattern`` is searched in :attr:`OutsideEntry.shown` (``HOME/...``, ``TMPDIR/...`` or an absolute
    container path). ``noise`` True: expected and harmless, for ``reason``; False: compiled state the
    blessing does not hold (``reason`` says what it is).

    ``while_serving`` (noise only): whether the write stays noise when it appears while serving, after the
    start was judged. Inductor's scratch dir, Python's bytecode and shared-memory segments are written by a
    start (its load, its imports); the same write later is a compile nobody proved, and the seal reports
    it (:func:`classify_outside`'s ``serving``). Sockets hold no content: noise whenever they appear.
    """

    pattern: re.Pattern[str]
    noise: bool
    reason: str
    #: Only entries of these kinds match (None: any kind).
    kinds: frozenset[OutsideKind] | None = None
    while_serving: bool = True

    def matches(self, entry: OutsideEntry) -> bool:
        """Whether this rule names ``entry``."""
        return (self.kinds is None or entry.kind in self.kinds) and bool(self.pattern.search(entry.shown))


#: Suffixes of compiled code and kernels: such a file outside the blessing is compiled state wherever it is.
COMPILED_SUFFIXES = re.compile(r"\.(so|cubin|ptx|fatbin|hsaco|o|pyd|dll|ptxas|llir|ttir|ttgir|json\.best_config)$")


#: A flat entry of the engine's /dev/shm at its start: a shared-memory segment or a named semaphore (vLLM's
#: message queues, NCCL, Python's multiprocessing), made by the start. Anything in a directory there is not a
#: segment, and anything new there while serving is reported (``while_serving`` False). Both adapters list it.
SHARED_MEMORY_RULE = OutsideRule(
    re.compile(r"^/dev/shm/(?![^/]*" + COMPILED_SUFFIXES.pattern + r")[^/]+$"),  # a flat name, not a kernel's
    noise=True,
    reason="a shared-memory segment the start made (no compiled content)",
    while_serving=False,
)


def classify_outside(
    rules: Sequence[OutsideRule], entries: Sequence[OutsideEntry], *, serving: bool = False
) -> OutsideVerdict:
    """Apply ``rules`` (first match wins); a write no rule names counts as compiled (fail closed).

    ``serving``: the entries are new since the start was judged (the seal watcher's polls after its first):
    a noise rule that holds only for a start (``while_serving`` False) names a compile the blessing does
    not hold.
    """
    noise: list[str] = []
    compiled: list[str] = []
    for entry in entries:
        shown = entry.shown
        rule = next((rule for rule in rules if rule.matches(entry)), None)
        if rule is not None and rule.noise and serving and not rule.while_serving:
            compiled.append(
                f"{shown}: written while serving, after the start was judged (noise only at a start: {rule.reason})"
            )
        elif rule is not None and rule.noise:
            noise.append(f"{shown}: {rule.reason}")
        elif rule is not None:
            compiled.append(f"{shown}: {rule.reason}")
        else:
            compiled.append(f"{shown}: written outside the blessed tree and named by no rule of the adapter")
    return OutsideVerdict(noise=tuple(noise), compiled=tuple(compiled))


@dataclass(frozen=True)
class ModelMount:
    """A host path (weights, HF cache) the runtime presents read-only at ``target``."""

    source: str
    target: str
    why: str


class EngineAdapter(Protocol):
    """The per-engine policy. Implementations: ``reference`` and ``vllm``."""

    name: str
    adapter_version: str
    cache_mount_path: str
    home: str
    readonly_bind_ok: bool
    env_policy: EnvPolicy
    environment_packages: tuple[str, ...]
    #: Fields every completion request carries so the reply holds the generated token ids (the trials and
    #: the canary compare token ids, not only text): vLLM answers with them only when asked.
    completion_fields: Mapping[str, Any]

    def for_factors(self, factors: Mapping[str, Any]) -> EngineAdapter:
        """This adapter for a resolved configuration (vLLM: the rewrite rules of the resolved vLLM version)."""
        ...

    def notes(self) -> tuple[str, ...]:
        """What the adapter's rules rest on, for run output and provenance (e.g. an unknown engine version)."""
        ...

    def require_known_version(self, *, allow_unknown: bool) -> None:
        """Refuse (UnknownEngineVersionError) an engine version the adapter has no rules for, unless allowed."""
        ...

    def engine_factors(
        self,
        runtime: Mapping[str, Any],
        env: Mapping[str, str],
        *,
        serve: Mapping[str, Any] | None = None,
        model: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Engine switches that change what is compiled to disk, resolved for a runtime factor, the env,
        the canonical serve arguments and the model factor."""
        ...

    def replay_env(self) -> dict[str, str]:
        """Env of a start that must load the blessed cache (trials, serving): e.g. fail loudly on a cache miss."""
        ...

    def normalize_serve(self, serve: Mapping[str, Any], *, where: str) -> dict[str, Any]:
        """Validate serve arguments and return their canonical form (raises InputInvalidError)."""
        ...

    def unsafe_settings(self, resolved: ResolvedConfig) -> list[UnsafeSetting]:
        """Settings that disable the cache or make a start undeterministic or a debug start.

        Read from the resolved factors (canonical serve arguments) and the env resolution captured:
        the same values :meth:`launch` starts the engine with.
        """
        ...

    def launch(
        self, resolved: ResolvedConfig, *, port: int, debug: bool = False, host: str = "127.0.0.1"
    ) -> EngineLaunch:
        """argv + env that start the engine with its cache at ``cache_mount_path``.

        ``host``: the address a local-runtime engine listens on (serve-full in a pod listens on the pod's
        addresses, ``0.0.0.0``); a Docker engine always listens on ``0.0.0.0`` inside its container.
        Never hashed: where an engine listens changes nothing it compiles.

        Built from ``resolved.factors`` (serve arguments, model, runtime) and ``resolved.engine_env()``,
        never from the profile's raw values, so what runs is what was hashed.
        """
        ...

    def model_mounts(self, profile: Profile) -> tuple[ModelMount, ...]:
        """Read-only mounts the engine needs besides its cache (weights); none on the local runtime."""
        ...

    def drift_reasons(self, blessed_keys: Mapping[str, Any], log_keys: Mapping[str, Any]) -> list[str]:
        """Why a start's log shows the engine keying its cache differently than the blessing (empty: none)."""
        ...

    def prepare_cache_dir(self, staged: Path) -> None:
        """Create what the engine expects in a fresh or staged cache dir (e.g. vLLM's dummy_cache/)."""
        ...

    def summarize_artifacts(self, listing: TreeListing) -> ArtifactSummary:
        """The artifacts a bootstrap must have produced; raises BootstrapFailedError naming what is missing."""
        ...

    def read_log(self, log: str) -> LogSignals:
        """Load / compile / fatal markers, timings and engine-native keys found in a log."""
        ...

    def classify_upper(self, entries: Sequence[UpperEntry]) -> UpperVerdict:
        """Split upper-layer writes into expected rewrites, new compiled artifacts and the rest."""
        ...

    def compile_locations(self) -> tuple[CompileLocation, ...]:
        """Every place outside its cache root where the engine (or a library it loads) writes compiled state.

        bless points each into the blessed tree at every start (the ``engine.compile_locations``
        factor); what is not declared and still written lands in the private HOME or temp dir and is
        judged by :meth:`classify_outside`.
        """
        ...

    def classify_outside(self, entries: Sequence[OutsideEntry], *, serving: bool = False) -> OutsideVerdict:
        """Name each write outside the blessed tree (private HOME, temp dir, container filesystem, /dev/shm).

        ``serving``: written while serving, after the start was judged (:func:`classify_outside`).
        """
        ...

    def coverage_plan(self, resolved: ResolvedConfig) -> CoveragePlan:
        """The kernel families this configuration compiles lazily after startup and one request per class.

        Pure over the resolved factors (and the local model's hashed ``config.json``): what the
        bootstrap sends, the manifest records and every trial replays (:mod:`bless.core.coverage`).
        """
        ...
