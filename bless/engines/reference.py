"""Adapter for the reference engine (``bless/engines/reference_engine``), ours, used to test bless for real."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bless.core.coverage import CoverageFamily, CoveragePlan, group_token_counts
from bless.core.factors import ResolvedConfig
from bless.core.profile import Profile
from bless.core.verify import TreeListing
from bless.engines.base import (
    ENGINE_HOME,
    SHARED_MEMORY_RULE,
    CompileLocation,
    EngineLaunch,
    EnvPolicy,
    ModelMount,
    OutsideRule,
    UnsafeSetting,
    argv_value,
    classify_outside,
    relocating_settings,
)
from bless.engines.reference_engine import markers
from bless.errors import BootstrapFailedError, InputInvalidError
from bless.evidence_types import ArtifactSummary, LogSignals, OutsideEntry, OutsideVerdict, UpperEntry, UpperVerdict

#: The artifact's files: the Mega-Cache, its meta.json, and the C++ kernel libraries kept beside them.
ARTIFACT = re.compile(r"^reference/[0-9a-f]{16}/(megacache\.bin|meta\.json|kernels/[A-Za-z0-9_]+/[A-Za-z0-9_.-]+\.so)$")
COMPILE_TIME = re.compile(re.escape(markers.COMPILE_TIME) + r"([0-9.]+) s")

# name -> (type, default, bounds or choices)
SERVE_ARGS: dict[str, tuple[type, Any, Any]] = {
    "seed": (int, 0, (0, 2**31 - 1)),
    "layers": (int, 2, (1, 16)),
    "d_model": (int, 64, (8, 2048)),
    "heads": (int, 4, (1, 64)),
    "max_seq_len": (int, 64, (8, 1024)),
    "device": (str, "cpu", ("cpu", "cuda")),
    "compile": (bool, True, None),
    "served_model_name": (str, "reference-tiny", None),
}

TRITON_LOCATION = CompileLocation(
    "TRITON_CACHE_DIR", "jit/triton", "Triton's JIT cache: shape-bucket kernels, and Triton's launchers on CUDA"
)
CUDA_LOCATION = CompileLocation("CUDA_CACHE_PATH", "jit/cuda", "the CUDA driver's PTX JIT cache")
#: Token ids of the byte-level vocabulary (0..255) that coverage prompts use.
REFERENCE_PROMPT_TOKENS = (0, 256)
MAX_BUCKETS = 64
NO_BUCKETS = "no shape buckets configured (serve.shape_buckets)"

# Test knobs of the reference engine: each makes a start unfit to bless or serve.
KNOBS = {
    "BLESS_REFERENCE_NONDETERMINISTIC": "adds random noise to logits (outputs are not reproducible)",
    "BLESS_REFERENCE_IGNORE_CACHE": "ignores the compiled artifact and recompiles at every start",
    "BLESS_REFERENCE_POISON_CANDIDATES": "marks artifacts of some candidates as bad compiles",
    "BLESS_REFERENCE_CRASH_AT_BOOT": "makes the engine crash at boot",
    "BLESS_REFERENCE_NEVER_READY": "makes the engine never become ready",
    "BLESS_REFERENCE_JIT_OUTSIDE": "writes a kernel into a JIT cache under HOME, outside the blessed tree",
}
#: How the reference engine's writes outside its cache dir read (first match wins; the rest is compiled).
OUTSIDE_RULES: tuple[OutsideRule, ...] = (
    OutsideRule(
        re.compile(r"^TMPDIR/bless-inductor-[^/]+/"),
        noise=True,
        reason="Inductor's scratch dir, which the engine makes per start and fills from the blessed Mega-Cache "
        "and its kernel libraries when it loads (its markers and Inductor's cache-hit counters prove the load); "
        "deleted at a clean stop",
        while_serving=False,  # the engine compiles and warms up before it listens: a later file is a compile
    ),
    # Inductor's C++ backend (CPU) compiles ATen's own vectorization headers once per process into
    # <temp>/torchinductor_<user>/precompiled_headers, whatever TORCHINDUCTOR_CACHE_DIR says: the same
    # headers for every model, no kernel of this one (the wrapper that includes them is rebuilt on CPU).
    OutsideRule(
        re.compile(r"^TMPDIR/torchinductor_[^/]+/precompiled_headers/"),
        noise=True,
        reason="ATen's C++ headers precompiled by Inductor's CPU backend (the same for every model)",
        while_serving=False,
    ),
    OutsideRule(
        re.compile(r"/__pycache__/[^/]+\.pyc$"),
        noise=True,
        reason="Python bytecode of imported modules",
        while_serving=False,
    ),
    OutsideRule(re.compile(r"^HOME/\.triton/"), noise=False, reason="a Triton-style JIT cache under HOME"),
    SHARED_MEMORY_RULE,
)
DEBUG_ENV = {
    "TORCH_COMPILE_DEBUG": "torch.compile debug output (slow, writes debug trees)",
    "TORCH_LOGS": "torch trace logging (a debug start)",
    "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "disables every Inductor cache (forces recompiles)",
}

#: What a local start runs: the engine package's launcher, which imports nothing of bless (see its docstring).
LAUNCHER = Path(__file__).resolve().parent / "reference_engine" / "launch.py"


class ReferenceAdapter:
    """Policy for the reference engine: one Mega-Cache artifact under ``reference/<key>/``."""

    name = "reference"
    adapter_version = "1"
    cache_mount_path = "/var/cache/bless-engine"
    home = ENGINE_HOME
    readonly_bind_ok = True
    env_policy = EnvPolicy(ignored=("*LOG_LEVEL*", "PYTHONUNBUFFERED"))
    environment_packages: tuple[str, ...] = ("torch",)
    completion_fields: Mapping[str, Any] = MappingProxyType({})  # its replies always hold the token ids

    def for_factors(self, factors: Mapping[str, Any]) -> ReferenceAdapter:
        """One engine, one policy: nothing depends on the resolved versions."""
        return self

    def notes(self) -> tuple[str, ...]:
        return ()

    def require_known_version(self, *, allow_unknown: bool) -> None:
        """The reference engine ships with bless: its version is always the one these rules describe."""

    def engine_factors(
        self,
        runtime: Mapping[str, Any],
        env: Mapping[str, str],
        *,
        serve: Mapping[str, Any] | None = None,
        model: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Where the engine compiles besides its artifact: a Triton-style JIT cache on CUDA or with shape buckets.

        Declared only then, so a CPU profile without buckets hashes as it always did.
        """
        serve = serve or {}
        locations = {}
        if serve.get("device") == "cuda" or serve.get("shape_buckets"):
            locations[TRITON_LOCATION.env] = TRITON_LOCATION.subdir
        if serve.get("device") == "cuda":
            locations[CUDA_LOCATION.env] = CUDA_LOCATION.subdir
        return {"compile_locations": locations} if locations else {}

    def replay_env(self) -> dict[str, str]:
        """No force-load switch: the reference engine's markers and the upper layer say whether it loaded."""
        return {}

    def normalize_serve(self, serve: Mapping[str, Any], *, where: str) -> dict[str, Any]:
        unknown = sorted(set(serve) - set(SERVE_ARGS) - {"shape_buckets"})
        if unknown:
            raise InputInvalidError(
                f"{where}: serve.{unknown[0]}: not an argument of the reference engine",
                hint=f"known arguments: {', '.join(sorted([*SERVE_ARGS, 'shape_buckets']))}",
            )
        normalized: dict[str, Any] = {}
        for key, (kind, default, bounds) in SERVE_ARGS.items():
            value = serve.get(key, default)
            if type(value) is not kind:
                raise InputInvalidError(f"{where}: serve.{key}: expected {kind.__name__}, got {value!r}")
            if kind is int and bounds and not bounds[0] <= value <= bounds[1]:
                raise InputInvalidError(f"{where}: serve.{key}: {value} is outside {bounds[0]}..{bounds[1]}")
            if kind is str and bounds and value not in bounds:
                raise InputInvalidError(f"{where}: serve.{key}: {value!r} is not one of {', '.join(bounds)}")
            if isinstance(value, str):
                argv_value(f"{where}: serve.{key}", value)  # the word after its flag: never a flag itself
            normalized[key] = value
        if normalized["d_model"] % normalized["heads"]:
            raise InputInvalidError(f"{where}: serve.d_model must be a multiple of serve.heads")
        buckets = _shape_buckets(serve.get("shape_buckets", []), normalized["max_seq_len"], where=where)
        if buckets:  # absent when empty: the same configuration hashes alike written or not
            normalized["shape_buckets"] = buckets
        return normalized

    def unsafe_settings(self, resolved: ResolvedConfig) -> list[UnsafeSetting]:
        """Test knobs, debug env, ``compile = false`` and env that moves a compile location, read from what
        :meth:`launch` starts with."""
        found = [
            UnsafeSetting(name, value, reason, test_knob=table is KNOBS)
            for name, value in sorted(resolved.engine_env().items())
            for table in (KNOBS, DEBUG_ENV)
            if name in table and value not in ("", "0")
            for reason in [table[name]]
        ]
        if _serve_factor(resolved).get("compile") is False:
            found.append(UnsafeSetting("serve.compile", "false", "compile is off: there is no cache to bless"))
        return found + relocating_settings(resolved.engine_env(), self.compile_locations(), already=found)

    def launch(
        self, resolved: ResolvedConfig, *, port: int, debug: bool = False, host: str = "127.0.0.1"
    ) -> EngineLaunch:
        """argv + env from the hashed serve arguments and the env resolution captured (never the raw profile)."""
        profile = resolved.profile
        serve = _serve_factor(resolved)
        if profile.runtime_kind == "docker":
            prefix: tuple[str, ...] = ("python3", "-m", "bless_reference", "--host", "0.0.0.0")
        else:
            prefix = (profile.python or "python3", str(LAUNCHER), "--host", host)
        command = [
            *prefix,
            "--port", str(port),
            "--cache-dir", self.cache_mount_path,
            "--device", serve["device"],
            "--seed", str(serve["seed"]),
            "--layers", str(serve["layers"]),
            "--d-model", str(serve["d_model"]),
            "--heads", str(serve["heads"]),
            "--max-seq-len", str(serve["max_seq_len"]),
            "--served-model-name", serve["served_model_name"],
        ]  # fmt: skip
        if debug or not serve["compile"]:
            command.append("--no-compile")
        if serve.get("shape_buckets"):
            command += ["--shape-buckets", ",".join(str(b) for b in serve["shape_buckets"])]
        env = {"PYTHONUNBUFFERED": "1", **resolved.engine_env()}
        return EngineLaunch(command=tuple(command), env=env, port=port)

    def model_mounts(self, profile: Profile) -> tuple[ModelMount, ...]:
        """The reference model is built from its seed: no weights to mount."""
        return ()

    def drift_reasons(self, blessed_keys: Mapping[str, Any], log_keys: Mapping[str, Any]) -> list[str]:
        """The engine logs its artifact key; one the blessing does not hold means another artifact was keyed."""
        logged = log_keys.get("artifact_key")
        blessed = blessed_keys.get("artifact_keys") or []
        if logged is None:
            return ["the engine log has no artifact key line: cannot confirm it used the blessed artifact"]
        if logged not in blessed:
            return [f"the engine keyed its artifact {logged}, the blessing holds {', '.join(blessed) or 'none'}"]
        return []

    def prepare_cache_dir(self, staged: Path) -> None:
        """The reference engine creates what it needs; nothing to pre-create."""

    def summarize_artifacts(self, listing: TreeListing) -> ArtifactSummary:
        artifacts = tuple(entry.path for entry in listing.files if ARTIFACT.fullmatch(entry.path))
        if not any(path.endswith("megacache.bin") for path in artifacts):
            raise BootstrapFailedError(
                "the bootstrap wrote no compiled artifact: expected reference/<16 hex>/megacache.bin and meta.json "
                f"in the cache, found {len(listing.files)} file(s)",
                hint="read the bootstrap log in the rejected evidence; the engine must compile and save",
            )
        keys = sorted({path.split("/")[1] for path in artifacts})
        return ArtifactSummary(artifacts=artifacts, engine_keys={"artifact_keys": keys})

    def read_log(self, log: str) -> LogSignals:
        load, compile_, fatal = [], [], []
        timings: dict[str, float] = {}
        keys: dict[str, Any] = {}
        for line in log.splitlines():
            if line.startswith(markers.LOADED):
                load.append(line)
            elif line.startswith(
                (markers.COMPILING, markers.SAVED, markers.UNABLE_TO_SAVE, markers.LAZY_COMPILING, markers.LAZY_UNSAVED)
            ):
                compile_.append(line)
            elif line.startswith(markers.FATAL):
                fatal.append(line)
            elif line.startswith(markers.USING_CACHE_DIR):
                keys["cache_dir"] = line[len(markers.USING_CACHE_DIR) :].strip()
            elif line.startswith(markers.ARTIFACT_KEY):
                keys["artifact_key"] = line[len(markers.ARTIFACT_KEY) :].split()[0]
            match = COMPILE_TIME.match(line)
            if match:
                timings["torch_compile_s"] = float(match.group(1))
        return LogSignals(tuple(load), tuple(compile_), tuple(fatal), timings, keys)

    def compile_locations(self) -> tuple[CompileLocation, ...]:
        """Triton's JIT cache (shape-bucket kernels, Triton's launchers on CUDA) and CUDA's PTX cache.

        Which of them a configuration uses is its ``engine.compile_locations`` factor
        (:meth:`engine_factors`). Inductor's own cache is per-start scratch in the temp dir by design
        (:data:`OUTSIDE_RULES`): the Mega-Cache artifact is what is blessed.
        """
        return (TRITON_LOCATION, CUDA_LOCATION)

    def classify_outside(self, entries: Sequence[OutsideEntry], *, serving: bool = False) -> OutsideVerdict:
        """Inductor's per-start scratch and bytecode are noise at a start, a compile while serving; a kernel under
        HOME (or anything unnamed) is never noise."""
        return classify_outside(OUTSIDE_RULES, entries, serving=serving)

    def coverage_plan(self, resolved: ResolvedConfig) -> CoveragePlan:
        """One class per shape bucket (:func:`reference_coverage`)."""
        model = resolved.factors.get("model")
        model_id = str(model.get("id", "")) if isinstance(model, Mapping) else ""
        return reference_coverage(_serve_factor(resolved), model_id)

    def classify_upper(self, entries: Sequence[UpperEntry]) -> UpperVerdict:
        """The reference engine never writes while loading: any write is suspect, an artifact a recompile."""
        new_artifacts = tuple(
            e.path
            for e in entries
            if ARTIFACT.fullmatch(e.path) or e.path.endswith(".bin") or e.path.startswith(f"{TRITON_LOCATION.subdir}/")
        )
        unexpected = tuple(e.path for e in entries if e.path not in new_artifacts)
        return UpperVerdict(expected_rewrites=(), new_artifacts=new_artifacts, unexpected=unexpected)


def _shape_buckets(raw: Any, max_seq_len: int, *, where: str) -> list[int]:
    """``serve.shape_buckets``: positive, strictly ascending prompt lengths below ``max_seq_len`` (at most 64)."""
    if not isinstance(raw, list) or not all(type(b) is int for b in raw):
        raise InputInvalidError(f"{where}: serve.shape_buckets: expected a list of integers, got {raw!r}")
    if len(raw) > MAX_BUCKETS or raw != sorted(set(raw)) or any(not 1 <= b < max_seq_len for b in raw):
        raise InputInvalidError(
            f"{where}: serve.shape_buckets: {raw!r} must be strictly ascending, each 1..{max_seq_len - 1} "
            f"(below serve.max_seq_len), at most {MAX_BUCKETS}"
        )
    return list(raw)


def reference_coverage(serve: Mapping[str, Any], model_id: str) -> CoveragePlan:
    """The reference engine's one lazy family: a kernel per shape bucket of the prompt length.

    A prompt of length L runs the kernel of the smallest bucket >= L (else the largest), compiled on
    its first use in a process; the smallest length of each bucket reaches it. Prompts must leave one
    position to generate, so lengths run 1..max_seq_len-1.
    """
    buckets = sorted(int(b) for b in serve.get("shape_buckets") or ())
    source = "bless/engines/reference_engine (shape buckets: --shape-buckets)"
    if not buckets:
        family = CoverageFamily("shape_buckets", False, True, NO_BUCKETS, source)
        return CoveragePlan("reference", model_id, (family,), (1, 1), REFERENCE_PROMPT_TOKENS)
    longest = int(serve.get("max_seq_len", SERVE_ARGS["max_seq_len"][1])) - 1

    def bucket(length: int) -> int:
        return next((b for b in buckets if b >= length), buckets[-1])

    classes = group_token_counts(range(1, longest + 1), bucket, lambda b: f"bucket {b}")
    reason = f"buckets {', '.join(map(str, buckets))}; prompts of 1..{longest} tokens"
    family = CoverageFamily("shape_buckets", True, True, reason, source, classes)
    return CoveragePlan("reference", model_id, (family,), (1, longest), REFERENCE_PROMPT_TOKENS)


def _serve_factor(resolved: ResolvedConfig) -> dict[str, Any]:
    serve = resolved.factors.get("serve")
    return dict(serve) if isinstance(serve, Mapping) else {}
