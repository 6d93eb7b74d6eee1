"""What differs per serving engine: the adapter protocol and the data it returns.

An adapter is pure policy and parsing: it builds argv/env, says where the cache lives
in the container, which env vars are cache-affecting, ignored, secret or unsafe, which
files prove a bootstrap wrote its artifacts, and how to read load/save markers from
logs and writes from an overlay's upper layer. It starts nothing itself.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bless.evidence import ArtifactSummary, LogSignals, UpperEntry, UpperVerdict
from bless.factors import REDACTED
from bless.profile import Profile
from bless.verify import TreeListing


@dataclass(frozen=True)
class EnvPolicy:
    """How profile env vars enter the config hash. Patterns are fnmatch globs on the name."""

    ignored: tuple[str, ...] = ()
    # Suffix match on TOKEN: *TOKEN* would also swallow cache-affecting names like *_MAX_TOKENS_*.
    secret: tuple[str, ...] = ("*TOKEN", "*SECRET*", "*PASSWORD*", "*API_KEY*", "*_KEY", "*CREDENTIALS*")

    def is_secret(self, name: str) -> bool:
        """Secrets are never hashed and never written anywhere (their name only)."""
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.secret)

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

    def for_factors(self, factors: Mapping[str, Any]) -> EngineAdapter:
        """This adapter for a resolved configuration (vLLM: the rewrite rules of the resolved vLLM version)."""
        ...

    def notes(self) -> tuple[str, ...]:
        """What the adapter's rules rest on, for run output and provenance (e.g. an unknown engine version)."""
        ...

    def require_known_version(self, *, allow_unknown: bool) -> None:
        """Refuse (UnknownEngineVersionError) an engine version the adapter has no rules for, unless allowed."""
        ...

    def engine_factors(self, runtime: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
        """Engine switches that change what is compiled to disk, resolved for a runtime factor and the env."""
        ...

    def replay_env(self) -> dict[str, str]:
        """Env of a start that must load the blessed cache (trials, serving): e.g. fail loudly on a cache miss."""
        ...

    def normalize_serve(self, serve: Mapping[str, Any], *, where: str) -> dict[str, Any]:
        """Validate serve arguments and return their canonical form (raises InputInvalidError)."""
        ...

    def unsafe_settings(self, profile: Profile) -> list[UnsafeSetting]:
        """Settings that disable the cache or make a start undeterministic or a debug start."""
        ...

    def launch(self, profile: Profile, *, port: int, debug: bool = False) -> EngineLaunch:
        """argv + env that start the engine with its cache at ``cache_mount_path``."""
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
