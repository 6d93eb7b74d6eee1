"""Reading what a vLLM start left behind: log markers, the artifact layout, and upper-layer rewrite rules.

Everything here was derived from a real vLLM 0.20.0 run (torch 2.11, triton 3.6, an H200, a tiny
random Llama, offline): cold, warm, read-only, overlay and relocated starts. Facts that differ per
release (marker texts, timings, layout switches) are data, one entry per release, in
:mod:`bless.engines.vllm.versions`; what is here holds for every known release:

* A compile writes a "backbone" dir ``torch_compile_cache/<10 hex>/rank_<R>_<D>/backbone/``
  (Inductor standalone ``artifact_*`` files, ``cache_key_factors.json``, ``vllm_compile_cache.py``)
  and an AOT dir ``torch_compile_cache/torch_aot_compile/<64 hex>/`` (``rank_<R>_<D>/model`` plus an
  ``inductor_cache/`` that vLLM forces ``TORCHINDUCTOR_CACHE_DIR`` to). The 10-hex and 64-hex names
  are vLLM's own keys.
* A warm load REWRITES existing entries of that ``inductor_cache/`` (3 aotautograd, 3 fxgraph,
  6 ``.best_config`` for the tiny model): a plain read-only mount dies with EROFS, an overlay works.
  Hence the adapter's ``readonly_bind_ok = False`` and :class:`UpperRules`.
* All load/save markers are INFO or WARNING lines, so the default log level shows them. vLLM logs a
  benign ``Traceback`` at DEBUG (no chat template on the tokenizer), so a traceback is not fatal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bless.core.verify import TreeListing
from bless.engines.base import COMPILED_SUFFIXES, SHARED_MEMORY_RULE, OutsideRule
from bless.engines.vllm.versions import VllmVersionRules
from bless.errors import BootstrapFailedError
from bless.evidence_types import ArtifactSummary, LogSignals, UpperEntry, UpperVerdict

# --- log markers (exact text from the recorded vLLM 0.20 logs) -----------------------------------

#: A warm start that reused the cache logs these (INFO, compilation/decorators.py and backends.py).
LOAD_MARKERS: tuple[str, ...] = (
    "Directly load AOT compilation from path",
    "Directly load the compiled graph(s) for compile range",
)
#: Any of these means vLLM compiled (or tried to save) instead of only loading.
COMPILE_MARKERS: tuple[str, ...] = (
    "saved AOT compiled function to",
    "Compiling model again due to a load failure",
    "Compiling a graph for compile range",
    "Cache the graph of compile range",
    "unable to save AOT compiled function",
)
#: The engine did not start. The second line is the API server's RuntimeError after the first one;
#: both were recorded in the read-only failure. A bare ``Traceback`` is NOT here: vLLM logs a
#: benign one at DEBUG level on every start of a model without a chat template.
FATAL_MARKERS: tuple[str, ...] = (
    "EngineCore failed to start",
    "Engine core initialization failed",
)

_AOT_LOAD_PATH = re.compile(r"Directly load AOT compilation from path (?P<path>\S+)")
_USING_CACHE_DIR = re.compile(r"Using cache directory: (?P<path>\S+) for vLLM's torch\.compile")
_BACKBONE_IN_PATH = re.compile(r"torch_compile_cache/(?P<key>[0-9a-f]{10})/(?P<rank>rank_\d+_\d+)/")
_RANK_IN_PATH = re.compile(r"/(?P<rank>rank_\d+_\d+)(?:/|$)")
_AOT_IN_PATH = re.compile(r"torch_compile_cache/torch_aot_compile/(?P<key>[0-9a-f]{64})/(?P<rank>rank_\d+_\d+)/model")

# --- artifact layout -------------------------------------------------------------------------------

_AOT_MODEL = re.compile(r"^torch_compile_cache/torch_aot_compile/(?P<key>[0-9a-f]{64})/(?P<rank>rank_\d+_\d+)/model$")
# ``artifact_*`` is a file in the default "binary" save format and a directory in "unpacked".
_COMPONENT_ARTIFACT = re.compile(
    r"^torch_compile_cache/(?P<key>[0-9a-f]{10})/(?P<rank>rank_\d+_\d+)/(?P<component>[^/]+)/artifact_[^/]+(/.*)?$"
)
_KEY_FACTORS = re.compile(
    r"^torch_compile_cache/(?P<key>[0-9a-f]{10})/(?P<rank>rank_\d+_\d+)/(?P<component>[^/]+)/cache_key_factors\.json$"
)
_COMPILE_INDEX = re.compile(r"^torch_compile_cache/[0-9a-f]{10}/rank_\d+_\d+/[^/]+/vllm_compile_cache\.py$")
_INDUCTOR_CACHE = r"^torch_compile_cache/torch_aot_compile/[0-9a-f]{64}/inductor_cache/"
_INDUCTOR_ANY = re.compile(_INDUCTOR_CACHE)
_TORCH_COMPILE_CACHE = re.compile(r"^torch_compile_cache/")
_CUBIN = re.compile(_INDUCTOR_CACHE + r"triton/.*\.cubin$")
_BACKBONE = "backbone"
_EXPECTED_LAYOUT = (
    "torch_compile_cache/torch_aot_compile/<64 hex>/rank_<R>_<D>/model, "
    "torch_compile_cache/<10 hex>/rank_<R>_<D>/backbone/artifact_* and "
    "torch_compile_cache/<10 hex>/rank_<R>_<D>/backbone/cache_key_factors.json"
)
_EXPECTED_LAYOUT_WITHOUT_AOT = "torch_compile_cache/<10 hex>/rank_<R>_<D>/backbone/cache_key_factors.json"


# --- upper-layer rules, per vLLM version -----------------------------------------------------------


@dataclass(frozen=True)
class UpperRules:
    """What a warm load of one vLLM minor version may rewrite over the blessed tree (and nothing else)."""

    vllm_version: str
    expected_rewrites: tuple[re.Pattern[str], ...]
    evidence: str


#: Rewrites a warm load makes inside the AOT dir's ``inductor_cache/`` (which vLLM forces
#: ``TORCHINDUCTOR_CACHE_DIR`` to). Only rewrites of EXISTING paths are ever expected: a new path
#: under ``torch_compile_cache/`` is a compile or a re-keyed entry, never part of a plain load.
_INDUCTOR_REWRITES: tuple[re.Pattern[str], ...] = (
    # Loading the standalone artifacts re-populates Inductor's caches through write_atomic
    # (tmp file + rename), so each entry is rewritten in place with the same key.
    re.compile(_INDUCTOR_CACHE + r"aotautograd/[a-z0-9]+/[a-z0-9]+$"),
    re.compile(_INDUCTOR_CACHE + r"fxgraph/[a-z0-9]{2}/[a-z0-9]+/[a-z0-9]+$"),
    # Autotune results (their timings differ run to run; the chosen config is the key).
    re.compile(_INDUCTOR_CACHE + r"[a-z0-9]{2}/[0-9a-f]{64}\.best_config$"),
)
_REWRITES_SEEN = (
    "vLLM 0.20.0, torch 2.11, H200, tiny random Llama: two overlay starts (different cache paths) "
    "each wrote exactly 12 rewrites: 3 aotautograd, 3 fxgraph, 6 .best_config, no new paths"
)


def upper_rules_for(entry: VllmVersionRules) -> UpperRules:
    """The expected rewrites of one vLLM release: the observed Inductor set, where its source forces that dir.

    Every release from 0.20 on forces ``TORCHINDUCTOR_CACHE_DIR`` into the AOT dir (its entry's
    ``layout.inductor_cache_forced``, read from source), so a warm load's Inductor rewrites land at
    the same paths. The set itself was observed on GPUs (see ``gpu_proven``); any other write fails a trial.
    """
    evidence = f"observed: {_REWRITES_SEEN}"
    if entry.gpu_proven:
        evidence += f"; vLLM {entry.version} on a GPU: {entry.gpu_proven}"
    else:
        evidence += f"; vLLM {entry.version}: the same inductor_cache layout, from source only"
    return UpperRules(vllm_version=entry.version, expected_rewrites=_INDUCTOR_REWRITES, evidence=evidence)


#: Kept for callers that name a minor version: vLLM 0.20's rules.
UPPER_RULES: dict[str, UpperRules] = {
    "0.20": UpperRules(vllm_version="0.20", expected_rewrites=_INDUCTOR_REWRITES, evidence=_REWRITES_SEEN)
}


#: Where bless points the declared compile locations (``jit/<name>`` under the cache root): a new file
#: there during a trial or a serve is a compile the blessing does not hold.
_JIT = re.compile(r"^jit/")

# --- writes outside the blessed tree ------------------------------------------------------------------

#: How vLLM's writes outside the blessed tree read (first match wins; anything unnamed counts as compiled).
#: Every compile location vLLM's source shows is pointed into the tree, so a compiled file here means a
#: writer nobody declared: the trial fails naming it, and the adapter learns a new location.
OUTSIDE_RULES: tuple[OutsideRule, ...] = (
    OutsideRule(
        re.compile(r"/__pycache__/[^/]+\.pyc$"),
        noise=True,
        reason="Python bytecode of imported modules",
        while_serving=False,
    ),
    # Seen at every start of vLLM 0.26 (H200): three sockets named by a UUID, left in the temp dir
    # after a clean stop (its ZeroMQ IPC endpoints between the API server and the engine core).
    OutsideRule(
        re.compile(r"^TMPDIR/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"),
        noise=True,
        reason="a ZeroMQ IPC socket of vLLM's processes (a socket holds no content)",
        kinds=frozenset({"socket"}),
    ),
    OutsideRule(COMPILED_SUFFIXES, noise=False, reason="compiled code or a kernel"),
    OutsideRule(re.compile(r"^HOME/\.triton/"), noise=False, reason="Triton's default cache under HOME"),
    OutsideRule(re.compile(r"^HOME/\.nv/"), noise=False, reason="CUDA's default PTX JIT cache under HOME"),
    OutsideRule(re.compile(r"^TMPDIR/torchinductor_"), noise=False, reason="Inductor's default cache dir"),
    SHARED_MEMORY_RULE,
)

# --- reading evidence -----------------------------------------------------------------------------


def summarize_artifacts(listing: TreeListing, *, require_aot: bool = True, why: str | None = None) -> ArtifactSummary:
    """Require the AOT model, the backbone artifacts and ``cache_key_factors.json`` for the same ranks.

    ``require_aot`` False (vLLM compiles this model without AOT, or that cannot be known: ``why``
    says which): the AOT model and the backbone's ``artifact_*`` (vLLM writes those only with AOT)
    are not required, the backbone's ``cache_key_factors.json`` still is; whatever AOT model and
    artifacts are there are recorded all the same, so trials must load them.

    ``engine_keys`` records vLLM's own keys: ``backbone_keys`` (10 hex), ``aot_keys`` (64 hex)
    and ``ranks`` (``rank_<R>_<D>``), in the shape :func:`read_log` returns them.
    """
    models: dict[str, set[str]] = {}
    backbone: dict[str, set[str]] = {}
    factors: set[tuple[str, str]] = set()
    artifacts: list[str] = []
    for entry in listing.files:
        path = entry.path
        if match := _AOT_MODEL.fullmatch(path):
            models.setdefault(match["rank"], set()).add(match["key"])
            artifacts.append(path)
        elif match := _COMPONENT_ARTIFACT.fullmatch(path):
            if match["component"] == _BACKBONE:
                backbone.setdefault(match["rank"], set()).add(match["key"])
            artifacts.append(path)
        elif match := _KEY_FACTORS.fullmatch(path):
            if match["component"] == _BACKBONE:
                factors.add((match["key"], match["rank"]))
            artifacts.append(path)
        elif _COMPILE_INDEX.fullmatch(path):
            artifacts.append(path)
    missing: list[str] = []
    if require_aot and not models:
        missing.append("torch_compile_cache/torch_aot_compile/<64 hex>/rank_<R>_<D>/model (the AOT-compiled model)")
    if require_aot and not backbone:
        missing.append("torch_compile_cache/<10 hex>/rank_<R>_<D>/backbone/artifact_* (Inductor artifacts)")
    if not require_aot:
        # Without artifacts, the key dir vLLM compiled into is known by its cache_key_factors.json.
        for key, rank in factors:
            backbone.setdefault(rank, set()).add(key)
        if not factors:
            missing.append("torch_compile_cache/<10 hex>/rank_<R>_<D>/backbone/cache_key_factors.json")
    for rank, keys in sorted(backbone.items()):
        missing.extend(
            f"torch_compile_cache/{key}/{rank}/backbone/cache_key_factors.json"
            for key in sorted(keys)
            if (key, rank) not in factors
        )
    if models and backbone and set(models) != set(backbone):
        missing.append(
            f"the same ranks in both trees (AOT models for {sorted(models)}, backbone artifacts for {sorted(backbone)})"
        )
    if missing:
        expected = (
            _EXPECTED_LAYOUT
            if require_aot
            else f"{_EXPECTED_LAYOUT_WITHOUT_AOT} (no AOT model required: {why or 'AOT compile is off'})"
        )
        raise BootstrapFailedError(
            f"the bootstrap did not write vLLM's compile artifacts: missing {'; '.join(missing)}. "
            f"Expected {expected}; found {_describe_found(listing)}",
            hint="read the bootstrap log in the rejected evidence: vLLM must compile with "
            "compilation mode VLLM_COMPILE and VLLM_USE_AOT_COMPILE on (the default with torch >= 2.10)",
            details={"missing": missing},
        )
    engine_keys = {
        "backbone_keys": sorted(set().union(*backbone.values())),
        "aot_keys": sorted(set().union(*models.values())),
        "ranks": sorted(set(models) | set(backbone)),
    }
    return ArtifactSummary(artifacts=tuple(sorted(artifacts)), engine_keys=engine_keys)


def read_log(rules: VllmVersionRules, log: str) -> LogSignals:
    """Markers (whole lines), timings (seconds) and vLLM's keys from a vLLM server log, by ``rules``.

    ``engine_keys``: ``cache_dirs`` (every ``Using cache directory:`` path), ``backbone_keys``
    (the 10-hex dirs in them), ``aot_keys`` (64-hex dirs named by load/save lines) and ``ranks``.
    """
    load: list[str] = []
    compile_: list[str] = []
    fatal: list[str] = []
    sums: dict[str, float] = {}
    cache_dirs: list[str] = []
    backbone_keys: set[str] = set()
    aot_keys: set[str] = set()
    ranks: set[str] = set()
    compiled_ranks: set[str] = set()
    aot_load_paths: list[str] = []
    for line in log.splitlines():
        marked = False
        if any(marker in line for marker in rules.load_markers):
            load.append(line.strip())
            marked = True
            if aot_load := _AOT_LOAD_PATH.search(line):
                aot_load_paths.append(aot_load["path"])
        elif any(marker in line for marker in rules.compile_markers):
            compile_.append(line.strip())
            marked = True
            compiled_ranks.update(match["rank"] for match in _RANK_IN_PATH.finditer(line))
        elif any(marker in line for marker in rules.fatal_markers):
            fatal.append(line.strip())
        if marked:
            for match in _AOT_IN_PATH.finditer(line):
                aot_keys.add(match["key"])
                ranks.add(match["rank"])
        if using := _USING_CACHE_DIR.search(line):
            cache_dirs.append(using["path"])
            if backbone := _BACKBONE_IN_PATH.search(using["path"] + "/"):
                backbone_keys.add(backbone["key"])
                ranks.add(backbone["rank"])
        for timing_rule in rules.timings:
            if timing := next((m for p in timing_rule.patterns if (m := p.search(line))), None):
                seconds = float(timing["s"])
                name = timing_rule.name
                sums[name] = sums.get(name, 0.0) + seconds if timing_rule.combine == "sum" else seconds
    timings = {name: round(value, 6) for name, value in sums.items()}
    keys: dict[str, Any] = {
        "cache_dirs": list(dict.fromkeys(cache_dirs)),
        "backbone_keys": sorted(backbone_keys),
        "aot_keys": sorted(aot_keys),
        "ranks": sorted(ranks),
        "aot_load_paths": list(dict.fromkeys(aot_load_paths)),
        "compiled_ranks": sorted(compiled_ranks),
        "ranks_loaded": sorted({m["rank"] for path in aot_load_paths if (m := _RANK_IN_PATH.search(path))}),
    }
    return LogSignals(tuple(load), tuple(compile_), tuple(fatal), timings, keys)


def drift_reasons(cache_mount_path: str, blessed_keys: Mapping[str, Any], log_keys: Mapping[str, Any]) -> list[str]:
    """Why a trial's or a serve's log shows vLLM using other keys than the blessing (empty: none).

    ``blessed_keys``: the manifest's ``artifacts.engine_keys`` (from :func:`summarize_artifacts`);
    ``log_keys``: :func:`read_log`'s ``engine_keys``. A key the blessing does not hold means
    vLLM hashed something differently (env, HOME, config, code, compiler) and compiled into a
    new directory: a silent recompile under a config bless considers equal.
    """
    reasons: list[str] = []
    blessed_backbone = set(_strings(blessed_keys.get("backbone_keys")))
    logged_backbone = _strings(log_keys.get("backbone_keys"))
    cache_dirs = _strings(log_keys.get("cache_dirs"))
    if not logged_backbone:
        reasons.append(
            "the engine log has no 'Using cache directory:' line with a vLLM cache key: "
            "cannot confirm vLLM used the blessed cache"
        )
    foreign = [key for key in logged_backbone if key not in blessed_backbone]
    if foreign:
        reasons.append(
            f"vLLM used cache key(s) {', '.join(foreign)} (Using cache directory: {', '.join(cache_dirs)}), "
            f"the blessing holds {', '.join(sorted(blessed_backbone)) or 'none'}: vLLM hashed this start "
            "differently (env, HOME, config, code or compiler) and compiled into a new directory"
        )
    blessed_aot = set(_strings(blessed_keys.get("aot_keys")))
    foreign_aot = [key for key in _strings(log_keys.get("aot_keys")) if key not in blessed_aot]
    if foreign_aot:
        reasons.append(
            f"vLLM named AOT key(s) {', '.join(foreign_aot)}, the blessing holds "
            f"{', '.join(sorted(blessed_aot)) or 'none'}: a different AOT compile key"
        )
    root = cache_mount_path.rstrip("/") + "/"
    outside = [path for path in cache_dirs if not path.startswith(root)]
    if outside:
        reasons.append(f"vLLM's cache directory {', '.join(outside)} is not under {cache_mount_path}")
    # The AOT artifact is what a replay must load, from the blessed tree and nowhere else.
    aot_loads = _strings(log_keys.get("aot_load_paths"))
    foreign_loads = [path for path in aot_loads if not path.startswith(root)]
    if foreign_loads:
        reasons.append(
            f"vLLM loaded its AOT compilation from {', '.join(foreign_loads)}, outside the blessed tree "
            f"at {cache_mount_path}"
        )
    if blessed_aot and not aot_loads:
        reasons.append(
            "the blessing holds an AOT-compiled model but the engine log has no 'Directly load AOT "
            "compilation from path' line under the blessed tree: the AOT artifact was not loaded"
        )
    elif blessed_aot:
        reasons.extend(
            rank_reasons(_strings(blessed_keys.get("ranks")), aot_loads, _strings(log_keys.get("compiled_ranks")))
        )
    return reasons


def rank_reasons(blessed_ranks: Sequence[str], aot_loads: Sequence[str], compiled_ranks: Sequence[str]) -> list[str]:
    """Per-rank reuse: every rank the blessing holds must load its own AOT model, and no rank may compile.

    Under tensor (or pipeline) parallelism vLLM writes one AOT model per rank (``rank_<R>_<D>/model``), and
    each rank's worker logs the load of its own path; most other markers come from rank 0 alone, so a rank
    is judged by the load line that names its directory and by any compile or save line that names it.
    """
    loaded = {match["rank"] for path in aot_loads if (match := _RANK_IN_PATH.search(path))}
    reasons = [
        f"rank {rank}: no 'Directly load AOT compilation' line for its {rank}/model: this rank's blessed AOT model "
        "was not loaded"
        for rank in blessed_ranks
        if rank not in loaded
    ]
    reasons += [f"rank {rank}: a compile or save marker names this rank's directory" for rank in compiled_ranks]
    return reasons


def classify_upper(rules: UpperRules, entries: Sequence[UpperEntry]) -> UpperVerdict:
    """Split overlay upper-layer writes into expected rewrites, new compiled artifacts and the rest.

    * expected: a *rewrite of an existing path* matching this vLLM version's rules
      (``rules``);
    * new artifacts (a recompile or a re-keyed cache): any new path under ``torch_compile_cache/``
      (inductor entries, kernels, a new key dir) or under a declared compile location (``jit/``: a
      Triton kernel, a CUDA JIT entry), any written ``artifact_*`` or ``rank_*/model``,
      any written Triton ``.cubin``;
    * unexpected: everything else (other rewrites, deletions, writes outside the compile cache).
    """
    expected: list[str] = []
    new: list[str] = []
    unexpected: list[str] = []
    for entry in entries:
        path = entry.path
        if entry.kind == "deleted":
            unexpected.append(path)
        elif entry.kind == "rewritten" and any(rule.match(path) for rule in rules.expected_rewrites):
            expected.append(path)
        elif (
            (entry.kind == "new" and (_TORCH_COMPILE_CACHE.match(path) or _JIT.match(path)))
            or _COMPONENT_ARTIFACT.fullmatch(path)
            or _AOT_MODEL.fullmatch(path)
            or _CUBIN.fullmatch(path)
        ):
            new.append(path)
        else:
            unexpected.append(path)
    return UpperVerdict(expected_rewrites=tuple(expected), new_artifacts=tuple(new), unexpected=tuple(unexpected))


def _strings(value: Any) -> list[str]:
    if isinstance(value, list | tuple):
        return [item for item in value if isinstance(item, str)]
    return []


def _describe_found(listing: TreeListing) -> str:
    """A short account of what a failed bootstrap left: file count and top-level entries."""
    tops = sorted({entry.path.split("/", 1)[0] for entry in listing.files})
    compile_dirs = sorted(
        {
            "/".join(entry.path.split("/")[:3])
            for entry in listing.files
            if entry.path.startswith("torch_compile_cache/")
        }
    )
    text = f"{len(listing.files)} file(s)"
    if tops:
        text += f" under {', '.join(tops[:8])}"
    if compile_dirs:
        text += f"; compile dirs: {', '.join(compile_dirs[:8])}"
    return text
