"""Per-version vLLM knowledge, as data: one entry per vLLM release, derived from that release's source.

The entries live in ``versions.json`` beside this module. ``scripts/vllm_rules.py`` writes them:
it reads each release's wheel from the package index, keeps trimmed excerpts of the source files
it needs as test fixtures (``tests/fixtures/vllm/source/<version>/``) and derives from them

* the env names vLLM hashes into its compile key (``envs.compile_factors``: every known name but
  its ``ignored_factors``, plus the Ray "noset" names) and the names it ignores;
* the torch versions from which AOT compile and the "mega" AOT artifact are on by default
  (``use_aot_compile`` / ``use_mega_aot_artifact``), and the force-AOT-load switch;
* the model code that compiles without AOT (``use_aot_compile=False``: 0.33's Transformers backend)
  and, where that is the backend, the registry's architectures (which ones vLLM implements itself);
* the exact logger format strings of the load / compile / fatal markers and of the timings;
* the cache layout (backbone and AOT dirs, the forced ``inductor_cache``, ``dummy_cache``);
* the ``CompilationConfig`` fields (with their defaults as written) that enter vLLM's key;
* the places the release, or a library it loads, writes compiled state (``compile_locations``: an
  env var each, pointed into the blessed tree), each shown by a line of the release's source, and
  every place the release sets one of those env vars itself (``env_set_by_vllm``) with what the
  value is built from (vLLM's cache root, its compile cache dir, the caller's own value, HOME, ...).

Entries with ``gpu_proven`` were also run on a GPU through bless (``docs/evidence/``); the others
come from source only. Nothing here is imported by the core: the vLLM adapter reads it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

from bless.engines.base import CompileLocation

__all__ = [
    "AotOptOut",
    "AotSwitches",
    "ModelAot",
    "TimingRule",
    "VllmVersionRules",
    "all_rules",
    "format_pattern",
    "known_versions",
    "nearest_older",
    "release_of",
    "rules_for",
]

_DATA_FILE = "versions.json"
_RELEASE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class TimingRule:
    """A timing vLLM logs: the seconds are the last number of any of ``formats``."""

    name: str
    patterns: tuple[re.Pattern[str], ...]
    combine: Literal["sum", "last"]


@dataclass(frozen=True)
class AotSwitches:
    """What vLLM will effectively do about AOT compile for a torch version and an env (it changes what is on disk)."""

    aot_compile: bool
    mega_artifact: bool
    force_load_env: str | None

    def to_factor(self) -> dict[str, bool]:
        """The factor form: the effective switches (the force-load switch is bless's own, not a factor)."""
        return {"aot_compile": self.aot_compile, "mega_artifact": self.mega_artifact}


@dataclass(frozen=True)
class AotOptOut:
    """Model code of a release that compiles without AOT: the file, its verbatim ``use_aot_compile=False``
    line, and what it applies to (``model_impl=transformers``, a model class name, or ``unknown``)."""

    file: str
    line: str
    applies_to: str


#: What an opt-out in the Transformers backend applies to: every model vLLM serves through it.
TRANSFORMERS_BACKEND = "model_impl=transformers"


@dataclass(frozen=True)
class ModelAot:
    """Whether vLLM compiles one model AOT, as far as the model decides it (torch and the env decide the rest).

    ``uses_aot``: True, False, or None when it cannot be known here; ``reason`` says why (None
    when nothing in the release turns AOT off for a model).
    """

    uses_aot: bool | None
    reason: str | None = None


@dataclass(frozen=True)
class VllmVersionRules:
    """Everything bless knows about one vLLM release."""

    version: str
    torch: str
    hashed_env: frozenset[str]
    ignored_env: frozenset[str]
    load_markers: tuple[str, ...]
    compile_markers: tuple[str, ...]
    fatal_markers: tuple[str, ...]
    marker_formats: Mapping[str, tuple[str, ...]]
    timings: tuple[TimingRule, ...]
    cache_dir_patterns: tuple[re.Pattern[str], ...]
    aot_compile_default_from_torch: str
    mega_artifact_default_from_torch: str
    force_load_env: str | None
    layout: Mapping[str, bool]
    compilation_hashed_fields: Mapping[str, str]
    #: Where this release or a library it loads writes compiled state, as bless points it into the tree.
    compile_locations: tuple[CompileLocation, ...]
    #: env var -> every ``file:line: statement`` of the release that sets it itself.
    env_set_by_vllm: Mapping[str, tuple[str, ...]]
    #: The release's model code that compiles without AOT.
    aot_disabled_for: tuple[AotOptOut, ...]
    #: Registry architectures vLLM implements itself / serves through the Transformers backend
    #: (kept only where the backend opts out of AOT; empty otherwise).
    native_architectures: frozenset[str]
    transformers_architectures: frozenset[str]
    wheel: str
    wheel_sha256: str
    gpu_proven: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def provenance(self) -> str:
        """Where this entry's rules come from, in words."""
        if self.gpu_proven:
            return f"source ({self.wheel}) and a GPU run: {self.gpu_proven}"
        return f"source only ({self.wheel})"

    def aot_switches(self, torch_version: str | None, env: Mapping[str, str]) -> AotSwitches:
        """The effective AOT-compile and mega-artifact switches, computed as this release's ``envs.py`` does.

        ``use_aot_compile``: ``VLLM_USE_AOT_COMPILE`` if set, else on when torch >= the threshold and
        the compile cache is not disabled. ``use_mega_aot_artifact``: ``VLLM_USE_MEGA_AOT_ARTIFACT`` if
        set, else on when torch >= its threshold and AOT compile is on. An unknown torch version
        (Docker: not probed) counts as this release's pinned torch.
        """
        torch_key = _version_tuple(torch_version or self.torch)
        cache_disabled = env.get("VLLM_DISABLE_COMPILE_CACHE", "0").strip() not in ("", "0")
        aot_default = torch_key >= _version_tuple(self.aot_compile_default_from_torch) and not cache_disabled
        aot = env.get("VLLM_USE_AOT_COMPILE", "1" if aot_default else "0") == "1"
        mega_default = torch_key >= _version_tuple(self.mega_artifact_default_from_torch) and aot
        mega = env.get("VLLM_USE_MEGA_AOT_ARTIFACT", "1" if mega_default else "0") == "1"
        return AotSwitches(aot_compile=aot, mega_artifact=mega, force_load_env=self.force_load_env if aot else None)

    def model_aot(self, model_impl: str | None, architectures: Sequence[str] | None) -> ModelAot:
        """Whether this release compiles a model AOT, judged by its implementation.

        ``model_impl``: the serve argument (None: vLLM's default ``auto``). ``architectures``: the
        model's ``config.json`` ``architectures`` (None: not readable here). Under ``auto`` vLLM takes
        the first architecture its registry knows, and falls back to the Transformers backend when
        it knows none (``inspect_model_cls``).
        """
        if not self.aot_disabled_for:
            return ModelAot(True)
        where = "; ".join(f"{opt_out.file}: {opt_out.line}" for opt_out in self.aot_disabled_for)
        others = sorted({o.applies_to for o in self.aot_disabled_for} - {TRANSFORMERS_BACKEND})
        if others:
            return ModelAot(
                None,
                f"vLLM {self.version} turns AOT compile off for {', '.join(others)} ({where}): "
                "whether this model is one of them is not known",
            )
        backend = f"vLLM {self.version} turns AOT compile off for the Transformers backend ({where})"
        impl = model_impl or "auto"
        if impl == "transformers":
            return ModelAot(False, f"{backend}, which serve.model_impl = 'transformers' selects")
        if impl != "auto":
            return ModelAot(True)
        if not architectures:
            return ModelAot(
                None,
                f"{backend}; under model_impl 'auto' that depends on the architecture in the model's "
                "config.json, which cannot be read here (only a local model directory is)",
            )
        known = [arch for arch in architectures if arch in self.native_architectures | self.transformers_architectures]
        if not known:
            return ModelAot(
                False,
                f"{backend}: vLLM implements none of {', '.join(architectures)}, so 'auto' falls back to the backend",
            )
        if known[0] in self.transformers_architectures:
            return ModelAot(False, f"{backend}: vLLM's registry serves {known[0]} through the backend")
        return ModelAot(True)


def _version_tuple(version: str) -> tuple[int, ...]:
    """``2.12.0.dev`` -> (2, 12, 0, -1): a dev release sorts before the release (what packaging does)."""
    base = re.fullmatch(r"^(\d+)\.(\d+)(?:\.(\d+))?(.*)$", version.split("+", 1)[0])
    if not base:
        return (0,)
    numbers = tuple(int(part or 0) for part in base.groups()[:3])
    return (*numbers, -1 if "dev" in base[4] else 0)


def format_pattern(fmt: str, *, capture_last_number: bool = False) -> re.Pattern[str]:
    """A regex matching what ``logger.x(fmt, ...)`` prints (``%s`` any text, ``%d``/``%.2f`` a number).

    With ``capture_last_number`` the last numeric placeholder is the group ``s`` (a timing's seconds).
    A leading ``%s`` (newer vLLM prefixes some messages) matches any text, so the pattern is searched.
    """
    parts = re.split(r"(%(?:\.\d+)?[sdf])", fmt)
    numeric = [i for i, part in enumerate(parts) if part in ("%d",) or re.fullmatch(r"%(\.\d+)?f", part)]
    out: list[str] = []
    for index, part in enumerate(parts):
        if part == "%s":
            out.append(r".*?")
        elif index in numeric:
            out.append(r"(?P<s>[0-9.]+)" if capture_last_number and index == numeric[-1] else r"[0-9.]+")
        else:
            out.append(re.escape(part))
    return re.compile("".join(out).rstrip())


def release_of(version: str | None) -> str | None:
    """``0.26.0+cu130`` -> ``0.26.0``; anything that is not a release number -> None."""
    if not version:
        return None
    match = _RELEASE.match(version.strip())
    return f"{match[1]}.{match[2]}.{match[3]}" if match else None


def _entry(raw: Mapping[str, Any]) -> VllmVersionRules:
    markers = raw["markers"]
    formats = {item["marker"]: tuple(item["formats"]) for role in markers.values() for item in role}
    timings = tuple(
        TimingRule(
            name=name,
            patterns=tuple(format_pattern(fmt, capture_last_number=True) for fmt in spec["formats"]),
            combine="sum" if spec["combine"] == "sum" else "last",
        )
        for name, spec in raw["timings"].items()
    )
    return VllmVersionRules(
        version=raw["version"],
        torch=raw["torch"],
        hashed_env=frozenset(raw["env"]["hashed"]),
        ignored_env=frozenset(raw["env"]["ignored_by_vllm"]),
        load_markers=tuple(item["marker"] for item in markers["load"]),
        compile_markers=tuple(item["marker"] for item in markers["compile"]),
        fatal_markers=tuple(item["marker"] for item in markers["fatal"]),
        marker_formats=formats,
        timings=timings,
        cache_dir_patterns=tuple(format_pattern(fmt) for fmt in raw["cache_dir_line"]["formats"]),
        aot_compile_default_from_torch=raw["aot"]["aot_compile_default_from_torch"],
        mega_artifact_default_from_torch=raw["aot"]["mega_artifact_default_from_torch"],
        force_load_env=raw["aot"]["force_load_env"],
        layout=dict(raw["layout"]),
        compilation_hashed_fields=dict(raw["compilation_config"]["hashed_fields"]),
        compile_locations=tuple(
            CompileLocation(env=item["env"], subdir=item["subdir"], what=item["what"])
            for item in raw["compile_locations"]
        ),
        env_set_by_vllm={
            env: tuple(f"{item['file']}:{item['line_no']}: {item['line']}" for item in items)
            for env, items in raw["env_set_by_vllm"].items()
        },
        aot_disabled_for=tuple(
            AotOptOut(file=item["file"], line=item["line"], applies_to=item["applies_to"])
            for item in raw["aot"]["disabled_for"]
        ),
        native_architectures=frozenset(raw["aot"].get("architectures", {}).get("native", ())),
        transformers_architectures=frozenset(raw["aot"].get("architectures", {}).get("transformers", ())),
        wheel=raw["source"]["wheel"],
        wheel_sha256=raw["source"]["wheel_sha256"],
        gpu_proven=raw.get("gpu_proven"),
        raw=raw,
    )


@functools.cache
def _all() -> dict[str, VllmVersionRules]:
    text = resources.files(__package__).joinpath(_DATA_FILE).read_text(encoding="utf-8")
    return {version: _entry(raw) for version, raw in json.loads(text)["versions"].items()}


def all_rules() -> Mapping[str, VllmVersionRules]:
    """Every entry, by release."""
    return _all()


def known_versions() -> tuple[str, ...]:
    """Every vLLM release bless has an entry for, oldest first."""
    return tuple(sorted(_all(), key=_version_tuple))


def rules_for(version: str | None) -> VllmVersionRules | None:
    """The entry of exactly this release (a local build suffix such as ``+cu130`` is ignored), or None."""
    release = release_of(version)
    return _all().get(release) if release else None


def nearest_older(version: str | None) -> VllmVersionRules | None:
    """The entry of the newest known release not newer than ``version`` (unknown or unparsable: the newest)."""
    versions = known_versions()
    release = release_of(version)
    if release is None:
        return _all()[versions[-1]]
    older = [known for known in versions if _version_tuple(known) <= _version_tuple(release)]
    return _all()[older[-1]] if older else None
