"""vLLM serve arguments: the schema bless models, their canonical form (hashed), argv, and unsafe values.

A profile's ``[serve]`` table is normalized once, at resolution, into ``factors.serve``; the argv
of every start and the unsafe check are built from that canonical form (:func:`serve_argv`,
:func:`unsafe_serve_settings`), so what runs is what was hashed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bless.engines.base import CONTROL_CHARACTERS, UnsafeSetting, argv_value
from bless.errors import InputInvalidError


@dataclass(frozen=True)
class _Arg:
    """One modeled vLLM engine argument: its flag, its type and bounds."""

    flag: str
    kind: Literal["int", "float", "bool", "str"]
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    #: vLLM's short spelling of the flag (``-tp``): refused in extra_args like the flag itself.
    short: str | None = None


# Order = argv order. Only what the profile states is hashed and passed: an omitted argument means
# "vLLM's default for this vLLM version", and the version is a factor (image ID or package versions).
SERVE_ARGS: dict[str, _Arg] = {
    "served_model_name": _Arg("--served-model-name", "str"),
    "seed": _Arg("--seed", "int", 0, 2**32 - 1),
    "dtype": _Arg("--dtype", "str", choices=("auto", "half", "float16", "bfloat16", "float", "float32")),
    "max_model_len": _Arg("--max-model-len", "int", 1),
    "max_num_seqs": _Arg("--max-num-seqs", "int", 1),
    "max_num_batched_tokens": _Arg("--max-num-batched-tokens", "int", 1),
    "tensor_parallel_size": _Arg("--tensor-parallel-size", "int", 1, 1024, short="-tp"),
    "pipeline_parallel_size": _Arg("--pipeline-parallel-size", "int", 1, 1024, short="-pp"),
    # The MoE layers' tensor parallelism becomes expert parallelism: each rank holds whole experts, which changes
    # the fused-MoE shapes the coverage model plans per rank (coverage/ranks.py moe_rank_shapes).
    "enable_expert_parallel": _Arg("--enable-expert-parallel", "bool", short="-ep"),
    "gpu_memory_utilization": _Arg("--gpu-memory-utilization", "float", 0.0, 1.0),
    "kv_cache_dtype": _Arg("--kv-cache-dtype", "str"),
    "quantization": _Arg("--quantization", "str"),
    "block_size": _Arg("--block-size", "int", 1),
    "enable_prefix_caching": _Arg("--enable-prefix-caching", "bool"),
    "enable_chunked_prefill": _Arg("--enable-chunked-prefill", "bool"),
    "trust_remote_code": _Arg("--trust-remote-code", "bool"),
    # Which implementation serves the model: it decides whether vLLM compiles it AOT (0.33 turns AOT
    # off for the Transformers backend), so the adapter reads it: never through extra_args.
    "model_impl": _Arg("--model-impl", "str", choices=("auto", "vllm", "transformers", "terratorch")),
    "enforce_eager": _Arg("--enforce-eager", "bool"),
}
COMPILATION_CONFIG = "compilation_config"
EXTRA_ARGS = "extra_args"
# JSON-valued engine arguments modeled as tables, key -> flag (argv order). vLLM's own compile key
# misses both (vllm#50891: limit_mm_per_prompt; vllm#53366: num_speculative_tokens), so a change
# that vLLM would reuse a cache across must change bless's hash, and a diff must name the leaf
# (serve.speculative_config.num_speculative_tokens), not a whole extra_args list.
TABLE_ARGS: dict[str, str] = {
    "limit_mm_per_prompt": "--limit-mm-per-prompt",
    "speculative_config": "--speculative-config",
}
KNOWN_SERVE_KEYS = (*SERVE_ARGS, COMPILATION_CONFIG, *TABLE_ARGS, EXTRA_ARGS)

COMPILATION_MODES = {"NONE": 0, "STOCK_TORCH_COMPILE": 1, "DYNAMO_TRACE_ONCE": 2, "VLLM_COMPILE": 3}
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
_CC_BOOLS = (
    "cudagraph_copy_inputs",
    "cudagraph_specialize_lora",
    "use_inductor_graph_partition",
    "compile_mm_encoder",
)
_CC_STR_LISTS = ("custom_ops", "splitting_ops")
_CC_TABLES = ("inductor_compile_config", "inductor_passes", "pass_config", "dynamic_shapes_config")

# Flags the adapter sets itself, or that a modeled key covers: in extra_args they would bypass the
# canonical form and the unsafe checks (``--enforce-eager``), or leak a secret into the manifest. ``--config``
# reads more flags from a YAML file (vLLM's FlexibleArgumentParser), whose contents no factor would hold.
_MANAGED_FLAGS = frozenset(
    {"--host", "--port", "--model", "--revision", "--compilation-config", "-cc", "--api-key", "--hf-token"}
    | {"--config"}
    | {arg.flag for arg in SERVE_ARGS.values()}
    | {"--no-" + arg.flag[2:] for arg in SERVE_ARGS.values() if arg.kind == "bool"}
    | {arg.short for arg in SERVE_ARGS.values() if arg.short}
    | set(TABLE_ARGS.values())
    | {"-sc"}
)
#: Flags that address one key of a JSON argument (``--speculative-config.num_speculative_tokens 3``).
_TABLE_FLAG_PREFIXES = {
    **{"--compilation-config.": COMPILATION_CONFIG, "-cc.": COMPILATION_CONFIG, "-sc.": "speculative_config"},
    **{flag + ".": key for key, flag in TABLE_ARGS.items()},
}
#: The short spellings vLLM accepts for a modeled JSON argument.
_TABLE_ALIASES = {"-cc": COMPILATION_CONFIG, "--compilation-config": COMPILATION_CONFIG, "-sc": "speculative_config"}
_NO_COMPILE_OPT_LEVELS = {"0"}


def normalize_serve(serve: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """Validate vLLM engine arguments and return their canonical form.

    Only stated arguments appear (no defaults are invented: an omitted argument is vLLM's
    default for the vLLM version, which is itself a factor). ``compilation_config`` is
    canonicalized (see :func:`_normalize_compilation_config`); ``extra_args`` carries flags
    this adapter does not model and enters the hash verbatim.
    """
    unknown = sorted(set(serve) - set(KNOWN_SERVE_KEYS))
    if unknown:
        raise InputInvalidError(
            f"{where}: serve.{unknown[0]}: not a vLLM argument this adapter models",
            hint=f"known arguments: {', '.join(KNOWN_SERVE_KEYS)}; pass other vLLM flags verbatim "
            f"in serve.{EXTRA_ARGS} (a list of strings)",
        )
    normalized: dict[str, Any] = {}
    for key, spec in SERVE_ARGS.items():
        if key in serve:
            normalized[key] = _check_value(f"{where}: serve.{key}", serve[key], spec)
    if COMPILATION_CONFIG in serve:
        normalized[COMPILATION_CONFIG] = _normalize_compilation_config(
            serve[COMPILATION_CONFIG], where=f"{where}: serve.{COMPILATION_CONFIG}"
        )
    if "limit_mm_per_prompt" in serve:
        normalized["limit_mm_per_prompt"] = _normalize_limit_mm_per_prompt(
            serve["limit_mm_per_prompt"], where=f"{where}: serve.limit_mm_per_prompt"
        )
    if "speculative_config" in serve:
        normalized["speculative_config"] = _normalize_speculative_config(
            serve["speculative_config"], where=f"{where}: serve.speculative_config"
        )
    if EXTRA_ARGS in serve:
        normalized[EXTRA_ARGS] = _normalize_extra_args(serve[EXTRA_ARGS], where=f"{where}: serve.{EXTRA_ARGS}")
    return normalized


def serve_argv(serve: Mapping[str, Any]) -> list[str]:
    """The engine flags for canonical serve arguments, in :data:`SERVE_ARGS` order, then the config, then extras."""
    argv: list[str] = []
    for key, spec in SERVE_ARGS.items():
        if key in serve:
            argv.extend(_render_arg(spec, serve[key]))
    if COMPILATION_CONFIG in serve:
        argv.extend(["--compilation-config", compilation_config_json(serve[COMPILATION_CONFIG])])
    for key, flag in TABLE_ARGS.items():
        if key in serve:
            argv.extend([flag, compilation_config_json(serve[key])])
    argv.extend(serve.get(EXTRA_ARGS, []))
    return argv


def unsafe_serve_settings(serve: Mapping[str, Any]) -> list[UnsafeSetting]:
    """Eager mode, compilation mode NONE, debug dumps and ``-O0`` in (canonical) serve arguments."""
    found: list[UnsafeSetting] = []
    if serve.get("enforce_eager") is True:
        found.append(UnsafeSetting("serve.enforce_eager", "true", "eager mode compiles nothing: nothing to bless"))
    config = serve.get(COMPILATION_CONFIG)
    if isinstance(config, Mapping):
        for key in ("mode", "level"):
            if key in config and _is_mode_none(config[key]):
                found.append(
                    UnsafeSetting(
                        f"serve.{COMPILATION_CONFIG}.{key}",
                        str(config[key]),
                        "compilation mode NONE compiles nothing: nothing to bless",
                    )
                )
        if config.get("debug_dump_path"):
            found.append(
                UnsafeSetting(
                    f"serve.{COMPILATION_CONFIG}.debug_dump_path",
                    str(config["debug_dump_path"]),
                    "vLLM compilation debug dumps: a debug start",
                )
            )
    extra = serve.get(EXTRA_ARGS)
    if isinstance(extra, list) and all(isinstance(item, str) for item in extra):
        level = _optimization_level_zero(extra)
        if level is not None:
            found.append(
                UnsafeSetting(f"serve.{EXTRA_ARGS}", level, "optimization level 0 compiles nothing: nothing to bless")
            )
    return found


def compilation_config_json(config: Mapping[str, Any]) -> str:
    """A JSON argument's value (``--compilation-config``, ...): compact JSON, sorted keys (same dict, same argv)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _check_value(where: str, value: Any, spec: _Arg) -> Any:
    """Type and bounds of one scalar argument; returns it unchanged."""
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise InputInvalidError(f"{where}: expected true or false, got {value!r}")
        return value
    if spec.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputInvalidError(f"{where}: expected an integer, got {value!r}")
    elif spec.kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputInvalidError(f"{where}: expected a number, got {value!r}")
    elif not isinstance(value, str) or not value:
        raise InputInvalidError(f"{where}: expected a non-empty string, got {value!r}")
    else:
        argv_value(where, value)  # it becomes the word after its flag: never a flag itself
    if spec.choices and value not in spec.choices:
        raise InputInvalidError(f"{where}: {value!r} is not one of {', '.join(spec.choices)}")
    if spec.kind == "float":
        # Exclusive low bound: a zero memory fraction (or any zero-sized float) is never meant.
        low = spec.minimum if spec.minimum is not None else float("-inf")
        high = spec.maximum if spec.maximum is not None else float("inf")
        if not low < value <= high:
            raise InputInvalidError(f"{where}: {value} is outside ({low:g}, {high:g}]")
    if spec.kind == "int":
        low = spec.minimum if spec.minimum is not None else float("-inf")
        high = spec.maximum if spec.maximum is not None else float("inf")
        if not low <= value <= high:
            raise InputInvalidError(f"{where}: {value} is outside {low:g}..{high:g}")
    return value


def _render_arg(spec: _Arg, value: Any) -> list[str]:
    if spec.kind == "bool":
        # vLLM's bool engine args are BooleanOptionalAction: --x / --no-x (stated false must be said).
        return [spec.flag] if value else ["--no-" + spec.flag[2:]]
    if isinstance(value, float):
        return [spec.flag, repr(value)]
    return [spec.flag, str(value)]


def _json_value(where: str, value: Any) -> Any:
    """A JSON-representable copy of a TOML value (dates and times are refused)."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise InputInvalidError(f"{where}: NaN and infinity are not valid")
        return value
    if isinstance(value, list):
        return [_json_value(f"{where}[{index}]", item) for index, item in enumerate(value)]
    if isinstance(value, Mapping):
        return {str(key): _json_value(f"{where}.{key}", item) for key, item in value.items()}
    raise InputInvalidError(f"{where}: {type(value).__name__} values cannot be passed to vLLM")


def _int_list(where: str, value: Any, *, allow: tuple[str, ...] = ()) -> list[Any]:
    if not isinstance(value, list):
        raise InputInvalidError(f"{where}: expected a list, got {value!r}")
    for item in value:
        if isinstance(item, str) and item in allow:
            continue
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            extra = f" or {', '.join(repr(a) for a in allow)}" if allow else ""
            raise InputInvalidError(f"{where}: expected positive integers{extra}, got {item!r}")
    if len(set(value)) != len(value):
        raise InputInvalidError(f"{where}: {value!r} lists a size twice")
    return list(value)


def _normalize_compilation_config(value: Any, *, where: str) -> dict[str, Any]:
    """Validate the keys this adapter knows and canonicalize them; pass the others through.

    Canonical forms: ``mode`` as its integer (``"VLLM_COMPILE"`` and ``3`` hash alike),
    ``cudagraph_mode`` upper case, ``cudagraph_capture_sizes`` and ``compile_sizes`` sorted.
    vLLM treats both size lists as sets (it sorts capture sizes and de-duplicates compile sizes),
    so their order is not configuration: sorting keeps a reordered profile on the same hash.
    Other lists keep their order (``compile_ranges_split_points``, ``custom_ops`` where
    ``all,-op`` is order-sensitive): a reorder there only costs a spurious mismatch, never a wrong hit.
    Keys this adapter does not model are passed through verbatim (JSON values) and hashed; vLLM's
    CompilationConfig forbids unknown fields, so a typo fails at the bootstrap, loudly.
    """
    if not isinstance(value, Mapping):
        raise InputInvalidError(f"{where}: expected a table, got {value!r}")
    config = _json_value(where, value)
    assert isinstance(config, dict)
    _refuse_moved_cache_and_level(config, where=where)
    _canonical_modes(config, where=where)
    _canonical_size_lists(config, where=where)
    _check_value_types(config, where=where)
    return {key: config[key] for key in sorted(config)}


def _refuse_moved_cache_and_level(config: dict[str, Any], *, where: str) -> None:
    """``cache_dir`` would move the compile cache away from what bless pins; ``level`` is vLLM's old ``mode``."""
    if "cache_dir" in config:
        raise InputInvalidError(
            f"{where}.cache_dir: not allowed: it moves vLLM's compile cache out of VLLM_CACHE_ROOT, "
            "which bless pins and blesses",
            hint="remove it; bless mounts the blessed cache at VLLM_CACHE_ROOT",
        )
    if "level" in config:
        raise InputInvalidError(
            f"{where}.level: deprecated by vLLM; use mode", hint="mode = 'VLLM_COMPILE' (or 3) compiles and caches"
        )


def _canonical_modes(config: dict[str, Any], *, where: str) -> None:
    """``mode`` as its integer, ``cudagraph_mode`` upper case (refused when they name no mode)."""
    if "mode" in config:
        mode = config["mode"]
        if isinstance(mode, str) and mode.upper() in COMPILATION_MODES:
            config["mode"] = COMPILATION_MODES[mode.upper()]
        elif isinstance(mode, bool) or not isinstance(mode, int) or mode not in COMPILATION_MODES.values():
            raise InputInvalidError(
                f"{where}.mode: {mode!r} is not a compilation mode",
                hint=f"one of {', '.join(COMPILATION_MODES)} (or 0-3)",
            )
    if "cudagraph_mode" in config:
        graph_mode = config["cudagraph_mode"]
        if not isinstance(graph_mode, str) or graph_mode.upper() not in CUDAGRAPH_MODES:
            raise InputInvalidError(
                f"{where}.cudagraph_mode: {graph_mode!r} is not a CUDA graph mode",
                hint=f"one of {', '.join(CUDAGRAPH_MODES)}",
            )
        config["cudagraph_mode"] = graph_mode.upper()


def _canonical_size_lists(config: dict[str, Any], *, where: str) -> None:
    """The size lists checked; the two vLLM treats as sets sorted, the split points in their order."""
    if "cudagraph_capture_sizes" in config:
        config["cudagraph_capture_sizes"] = sorted(
            _int_list(f"{where}.cudagraph_capture_sizes", config["cudagraph_capture_sizes"])
        )
    if "compile_sizes" in config:
        sizes = _int_list(f"{where}.compile_sizes", config["compile_sizes"], allow=("cudagraph_capture_sizes",))
        config["compile_sizes"] = sorted(
            sizes, key=lambda item: (isinstance(item, str), item if isinstance(item, int) else 0)
        )
    if "compile_ranges_split_points" in config:
        config["compile_ranges_split_points"] = _int_list(
            f"{where}.compile_ranges_split_points", config["compile_ranges_split_points"]
        )


def _check_value_types(config: dict[str, Any], *, where: str) -> None:
    """The other known keys hold values of their type (``compile_cache_save_format`` one of its two)."""
    for key in ("max_cudagraph_capture_size", "cudagraph_num_of_warmups"):
        if key in config and (isinstance(config[key], bool) or not isinstance(config[key], int) or config[key] < 0):
            raise InputInvalidError(f"{where}.{key}: expected a non-negative integer, got {config[key]!r}")
    for key in _CC_BOOLS:
        if key in config and not isinstance(config[key], bool):
            raise InputInvalidError(f"{where}.{key}: expected true or false, got {config[key]!r}")
    for key in _CC_STR_LISTS:
        if key in config and (
            not isinstance(config[key], list) or not all(isinstance(item, str) for item in config[key])
        ):
            raise InputInvalidError(f"{where}.{key}: expected a list of strings, got {config[key]!r}")
    for key in _CC_TABLES:
        if key in config and not isinstance(config[key], dict):
            raise InputInvalidError(f"{where}.{key}: expected a table, got {config[key]!r}")
    for key in ("backend", "compile_cache_save_format", "debug_dump_path"):
        if key in config and not isinstance(config[key], str):
            raise InputInvalidError(f"{where}.{key}: expected a string, got {config[key]!r}")
    if config.get("compile_cache_save_format", "binary") not in ("binary", "unpacked"):
        raise InputInvalidError(f"{where}.compile_cache_save_format: expected 'binary' or 'unpacked'")


def _table(where: str, value: Any) -> dict[str, Any]:
    """A TOML table as a JSON-representable dict with sorted keys (a table value is sorted too)."""
    if not isinstance(value, Mapping):
        raise InputInvalidError(f"{where}: expected a table, got {value!r}")
    table = _json_value(where, value)
    assert isinstance(table, dict)
    return {key: table[key] for key in sorted(table)}


def _count(where: str, value: object) -> int:
    """``value`` when it is a non-negative integer (a per-prompt limit, an image size)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputInvalidError(f"{where}: expected a non-negative integer, got {value!r}")
    return value


def _normalize_limit_mm_per_prompt(value: Any, *, where: str) -> dict[str, Any]:
    """``{modality = count}`` or ``{modality = {count = N, width = W, ...}}``, as vLLM's
    ``dict[str, int | dict[str, int]]``; every number a non-negative integer. Keys sorted."""
    table = _table(where, value)
    for modality, limit in table.items():
        if not modality:
            raise InputInvalidError(f"{where}: a modality name is empty")
        if isinstance(limit, dict):
            table[modality] = {key: _count(f"{where}.{modality}.{key}", limit[key]) for key in sorted(limit)}
        else:
            _count(f"{where}.{modality}", limit)
    return table


def _normalize_speculative_config(value: Any, *, where: str) -> dict[str, Any]:
    """vLLM's speculative config, passed through as JSON (keys sorted); ``num_speculative_tokens``
    a positive integer and ``method`` / ``model`` strings where given (vLLM checks the rest)."""
    table = _table(where, value)
    tokens = table.get("num_speculative_tokens")
    if "num_speculative_tokens" in table and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise InputInvalidError(f"{where}.num_speculative_tokens: expected a positive integer, got {tokens!r}")
    for key in ("method", "model"):
        if key in table and (not isinstance(table[key], str) or not table[key]):
            raise InputInvalidError(f"{where}.{key}: expected a non-empty string, got {table[key]!r}")
    return table


def _vllm_spelling(token: str) -> str:
    """``token`` as vLLM's argument parser reads it: a long flag's name (up to ``=`` or its first ``.``) with
    ``_`` as ``-`` (``--max_model_len=8`` is ``--max-model-len=8``), so no spelling slips past the checks."""
    if not token.startswith("--"):
        return token
    flag, equals, value = token.partition("=")
    name, dot, key = flag[2:].partition(".")
    return "--" + name.replace("_", "-") + dot + key + equals + value


def _flag_of(token: str) -> str:
    return _vllm_spelling(token).split("=", 1)[0]


def _normalize_extra_args(value: Any, *, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise InputInvalidError(f"{where}: expected a list of non-empty strings, got {value!r}")
    for token in value:
        if CONTROL_CHARACTERS.search(token):
            raise InputInvalidError(f"{where}: {token!r} contains a control character")
        flag = _flag_of(token)
        table = next((key for prefix, key in _TABLE_FLAG_PREFIXES.items() if flag.startswith(prefix)), None)
        table = table or _TABLE_ALIASES.get(flag) or next((k for k, f in TABLE_ARGS.items() if f == flag), None)
        if flag in _MANAGED_FLAGS or table:
            modeled = [
                key for key, spec in SERVE_ARGS.items() if flag in (spec.flag, "--no-" + spec.flag[2:], spec.short)
            ]
            if modeled:
                hint = f"use serve.{modeled[0]} instead"
            elif table:
                hint = f"use the serve.{table} table instead"
            elif flag in ("--api-key", "--hf-token"):
                hint = "secrets never go into a profile (extra_args are hashed and written to the manifest)"
            elif flag == "--config":
                hint = "a config file's contents are not hashed: give its options as serve keys or in extra_args"
            else:
                hint = "bless sets it itself (model, host, port, revision)"
            raise InputInvalidError(f"{where}: {token!r} is not allowed here", hint=hint)
    return list(value)


def _is_mode_none(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value == 0
    return isinstance(value, str) and value.strip().upper() in ("0", "NONE")


def _optimization_level_zero(args: Sequence[str]) -> str | None:
    """The spelling of an optimization level 0 in ``args`` (``-O0``, ``-O 0``, ``--optimization-level=0``, ...)."""
    args = [_vllm_spelling(token) for token in args]
    for index, token in enumerate(args):
        following = args[index + 1] if index + 1 < len(args) else ""
        if token in ("-O", "--optimization-level") and following in _NO_COMPILE_OPT_LEVELS:
            return f"{token} {following}"
        for prefix in ("-O", "-O=", "--optimization-level="):
            if token.startswith(prefix) and token[len(prefix) :] in _NO_COMPILE_OPT_LEVELS:
                return token
        # Older vLLM: -O.<key>=<value> addresses the compilation config.
        if re.fullmatch(r"^-O\.(mode|level)=(0|NONE)$", token, re.IGNORECASE):
            return token
    return None
