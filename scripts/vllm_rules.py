#!/usr/bin/env python3
"""Derive bless's per-version vLLM rules from each release's own source.

For every vLLM release on the package index (0.20.0 and newer) this script

1. ``fetch``: reads the release's x86-64 wheel from the package index WITHOUT downloading it whole
   (HTTP range requests on the wheel's zip central directory, then only the needed members),
   trims each needed source file to the statements bless depends on (lines are verbatim; only
   lines are dropped) and writes them to ``tests/fixtures/vllm/source/<version>/<member>.txt`` with a
   ``SOURCE.json`` saying where they came from (wheel file name, its sha256 from the index, each
   member's sha256 and line count);
2. ``derive``: reads those excerpts and prints the version's rules entry (JSON);
3. ``update``: writes the derived entries into ``bless/engines/vllm/versions.json`` (the adapter's data);
4. ``check``: derives every stored version again and prints a diff; exit 1 when any entry differs
   (the unit tests run the same comparison).

Usage (from the repository root, network access to the package index needed for ``fetch`` only)::

    python3 scripts/vllm_rules.py fetch --all          # or: fetch 0.33.0
    python3 scripts/vllm_rules.py update --all
    python3 scripts/vllm_rules.py check
    python3 scripts/vllm_rules.py derive 0.26.0

What a release must still contain for an entry to be derived (a release that lacks one fails
loudly, naming what vanished: that is the signal to read the release and update bless):
the log markers of :data:`MARKERS`, the cache layout needles of :data:`LAYOUT_NEEDLES`,
``compile_factors()`` with its ``ignored_factors`` set, ``CompilationConfig.compute_hash`` with
its ``ignored_factors`` set, and ``use_aot_compile`` / ``use_mega_aot_artifact``.

The excerpts double as test fixtures (``tests/unit/test_vllm_versions.py``): a stored entry that
no longer agrees with its excerpts fails the suite. No network in tests.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import re
import sys
import textwrap
import tokenize
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "vllm" / "source"
DATA = REPO / "bless" / "engines" / "vllm" / "versions.json"
INDEX_JSON = "https://pypi.org/pypi/vllm/json"
OLDEST = (0, 20, 0)
ENTRY_VERSION = 1
# Excerpts are not importable code (dropped lines break indentation): a .txt suffix keeps linters off them.
EXCERPT_SUFFIX = ".txt"

# --- what bless reads from vLLM's logs: role -> (marker text, file that logs it) ----------------------
# The marker is a literal piece of a logger format string; a log line matches when it contains it.
MARKERS: dict[str, tuple[tuple[str, str], ...]] = {
    "load": (
        ("Directly load AOT compilation from path", "vllm/compilation/decorators.py"),
        ("Directly load the compiled graph(s) for compile range", "vllm/compilation/backends.py"),
    ),
    "compile": (
        ("saved AOT compiled function to", "vllm/compilation/decorators.py"),
        ("Compiling model again due to a load failure", "vllm/compilation/decorators.py"),
        ("Compiling a graph for compile range", "vllm/compilation/backends.py"),
        ("Cache the graph of compile range", "vllm/compilation/backends.py"),
        ("unable to save AOT compiled function", "vllm/compilation/decorators.py"),
    ),
    "fatal": (
        ("EngineCore failed to start", "vllm/v1/engine/core.py"),
        ("Engine core initialization failed", "vllm/v1/engine/utils.py"),
    ),
}
# Timings bless records (seconds): name -> (marker text, file, how repeated lines combine).
TIMINGS: dict[str, tuple[str, str, str]] = {
    "torch_compile_s": ("torch.compile took", "vllm/compilation/monitor.py", "sum"),
    "init_engine_s": ("init engine (profile, create kv cache, warmup model) took", "vllm/v1/engine/core.py", "last"),
    "dynamo_transform_s": ("Dynamo bytecode transform time:", "vllm/compilation/backends.py", "sum"),
    "graph_compile_s": ("Compiling a graph for compile range", "vllm/compilation/backends.py", "sum"),
    "graph_load_s": ("Directly load the compiled graph(s) for compile range", "vllm/compilation/backends.py", "sum"),
}
# The line that names vLLM's backbone cache dir (its 10-hex key).
CACHE_DIR_MARKER = ("Using cache directory:", "vllm/compilation/backends.py")

# --- the cache layout: what must still be in the source for bless's layout rules to hold ---------------
LAYOUT_NEEDLES: dict[str, tuple[tuple[str, str], ...]] = {
    # torch_compile_cache/<10 hex>/rank_<R>_<D>/<component>/{artifact_*, cache_key_factors.json, vllm_compile_cache.py}
    "backbone": (
        ("vllm/compilation/backends.py", 'envs.VLLM_CACHE_ROOT, "torch_compile_cache", hash_key'),
        ("vllm/compilation/backends.py", "hexdigest()[:10]"),
        ("vllm/compilation/backends.py", 'f"rank_{rank}_{dp_rank}", self.prefix'),
        ("vllm/compilation/backends.py", '"cache_key_factors.json"'),
        ("vllm/compilation/backends.py", '"vllm_compile_cache.py"'),
    ),
    # torch_compile_cache/torch_aot_compile/<64 hex>/{rank_<R>_<D>/model, inductor_cache/}
    "aot": (
        ("vllm/compilation/decorators.py", '"torch_aot_compile"'),
        ("vllm/compilation/decorators.py", "hash_key = hashlib.sha256(str(factors).encode()).hexdigest()"),
        ("vllm/compilation/decorators.py", 'f"rank_{rank}_{dp_rank}"'),
        ("vllm/compilation/decorators.py", 'aot_compilation_path = os.path.join(cache_dir, "model")'),
    ),
    # vLLM forces TORCHINDUCTOR_CACHE_DIR to <aot dir>/inductor_cache: the rewrites of a warm load land there.
    "inductor_cache_forced": (
        ("vllm/compilation/decorators.py", 'inductor_cache = os.path.join(cache_dir, "inductor_cache")'),
        ("vllm/compilation/decorators.py", 'os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache'),
    ),
    # The mega-AOT path creates VLLM_CACHE_ROOT/dummy_cache (bless pre-creates it).
    "dummy_cache": (("vllm/compilation/caching.py", 'os.path.join(envs.VLLM_CACHE_ROOT, "dummy_cache")'),),
    # VLLM_FORCE_AOT_LOAD re-raises a failed AOT load instead of recompiling.
    "force_aot_load": (("vllm/compilation/decorators.py", "if envs.VLLM_FORCE_AOT_LOAD:"),),
}

# --- members read from the wheel, and which statements of each are kept ----------------------------------
# Needles select statements (the innermost statement holding the needle, whole); functions and
# classes listed are kept whole (CompilationConfig: its field statements and compute_hash only).
ENVS = "vllm/envs.py"
COMPILATION_CONFIG = "vllm/config/compilation.py"
ENVS_FUNCTIONS = ("disable_compile_cache", "use_aot_compile", "use_mega_aot_artifact", "compile_factors")


def _needles_by_file() -> dict[str, set[str]]:
    needles: dict[str, set[str]] = {}
    for entries in MARKERS.values():
        for marker, path in entries:
            needles.setdefault(path, set()).add(marker)
    for marker, path, _ in TIMINGS.values():
        needles.setdefault(path, set()).add(marker)
    needles.setdefault(CACHE_DIR_MARKER[1], set()).add(CACHE_DIR_MARKER[0])
    for entries in LAYOUT_NEEDLES.values():
        for path, needle in entries:
            needles.setdefault(path, set()).add(needle)
    return needles


# =========================================================================================================
# fetch: the wheel's members over HTTP range requests
# =========================================================================================================


class _RangeReader(io.RawIOBase):
    """A seekable read-only file over HTTP range requests (enough for zipfile to read the central directory)."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.pos = url, size, 0
        self._start, self._data = 0, b""

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self.size - self.pos)
        if count <= 0:
            return 0
        if not (self._start <= self.pos and self.pos + count <= self._start + len(self._data)):
            end = min(self.size, self.pos + max(count, 1 << 18)) - 1
            request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end}"})
            with urllib.request.urlopen(request, timeout=120) as response:
                if response.status != 206:
                    raise RuntimeError(f"{self.url}: the server ignored the range request (HTTP {response.status})")
                self._start, self._data = self.pos, response.read()
        offset = self.pos - self._start
        buffer[:count] = self._data[offset : offset + count]
        self.pos += count
        return count


def _index() -> dict[str, Any]:
    with urllib.request.urlopen(INDEX_JSON, timeout=60) as response:
        return json.load(response)  # type: ignore[no-any-return]


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def released_versions(index: dict[str, Any]) -> list[str]:
    """Final releases from 0.20.0 on, oldest first (pre-releases and post-releases skipped)."""
    found = [v for v in index["releases"] if re.fullmatch(r"\d+\.\d+\.\d+", v) and _version_key(v) >= OLDEST]
    return sorted((v for v in found if index["releases"][v]), key=_version_key)


def _wheel_file(index: dict[str, Any], version: str) -> dict[str, Any]:
    wheels = [f for f in index["releases"][version] if f["filename"].endswith("x86_64.whl")]
    if not wheels:
        raise SystemExit(f"vLLM {version}: no x86-64 wheel on the index")
    return wheels[0]  # type: ignore[no-any-return]


def fetch(version: str, index: dict[str, Any]) -> Path:
    """Read the needed members of ``version``'s wheel and write trimmed excerpts + SOURCE.json."""
    wheel = _wheel_file(index, version)
    url = urllib.parse.urljoin(INDEX_JSON, wheel["url"])
    reader = io.BufferedReader(_RangeReader(url, int(wheel["size"])), 1 << 16)
    archive = zipfile.ZipFile(reader)
    names = set(archive.namelist())
    metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    out = FIXTURES / version
    members: dict[str, dict[str, Any]] = {}

    def read(name: str) -> str:
        data = archive.read(name)
        members[name] = {"sha256": hashlib.sha256(data).hexdigest(), "lines": data.count(b"\n")}
        return data.decode("utf-8")

    excerpts: dict[str, str] = {"METADATA": trim_metadata(read(metadata_name))}
    excerpts[ENVS] = trim_envs(read(ENVS))
    excerpts[COMPILATION_CONFIG] = trim_compilation_config(read(COMPILATION_CONFIG))
    for path, needles in sorted(_needles_by_file().items()):
        if path not in names:
            raise SystemExit(f"vLLM {version}: {path} is not in the wheel (moved?): read the release and update")
        excerpts[path] = trim_to_statements(read(path), needles)
    for path, text in excerpts.items():
        target = out / (path + EXCERPT_SUFFIX)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    source = {
        "version": version,
        "wheel": wheel["filename"],
        "wheel_sha256": wheel["digests"]["sha256"],
        "wheel_size": int(wheel["size"]),
        "members": {("METADATA" if k == metadata_name else k): v for k, v in sorted(members.items())},
        "note": "excerpts of the members above: lines are verbatim, only lines were dropped "
        "(scripts/vllm_rules.py fetch)",
    }
    (out / "SOURCE.json").write_text(json.dumps(source, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return out


# --- trimming (lines verbatim, only lines dropped) -------------------------------------------------------


def trim_metadata(text: str) -> str:
    keep = [line for line in text.splitlines() if line.startswith(("Name:", "Version:", "Requires-Dist: torch=="))]
    return "\n".join(keep) + "\n"


def _span(node: ast.AST) -> tuple[int, int]:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])  # type: ignore[attr-defined]
    return start, node.end_lineno or node.lineno  # type: ignore[attr-defined]


def _render(lines: list[str], spans: Iterable[tuple[int, int]]) -> str:
    """The union of 1-based inclusive line spans, in order, with a ``# [lines a-b]`` header per run."""
    keep: set[int] = set()
    for start, end in spans:
        keep.update(range(start, end + 1))
    out: list[str] = []
    previous = -1
    for number in sorted(keep):
        if number != previous + 1:
            run_end = number
            while run_end + 1 in keep:
                run_end += 1
            out.append(f"# [lines {number}-{run_end}]")
        out.append(lines[number - 1])
        previous = number
    return "\n".join(out) + "\n"


def trim_envs(text: str) -> str:
    """The AOT/cache functions, ``compile_factors`` whole, and one line per ``environment_variables`` key."""
    tree = ast.parse(text)
    lines = text.splitlines()
    spans: list[tuple[int, int]] = []
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in ENVS_FUNCTIONS:
            spans.append(_span(node))
            found.add(node.name)
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "environment_variables"
        ):
            assert isinstance(node.value, ast.Dict)
            spans.append((node.lineno, node.lineno))
            spans.append((node.end_lineno or node.lineno, node.end_lineno or node.lineno))
            for key in node.value.keys:
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                    raise SystemExit(f"{ENVS}: a non-literal environment_variables key at line {key and key.lineno}")
                if not re.match(rf'^    "{re.escape(key.value)}":', lines[key.lineno - 1]):
                    raise SystemExit(f"{ENVS}:{key.lineno}: key {key.value} is not at the start of its line")
                spans.append((key.lineno, key.lineno))
            found.add("environment_variables")
    missing = {*ENVS_FUNCTIONS, "environment_variables"} - found
    if missing:
        raise SystemExit(f"{ENVS}: {', '.join(sorted(missing))} not found: read the release and update")
    return _render(lines, spans)


def trim_compilation_config(text: str) -> str:
    """``class CompilationConfig``: its line, every field statement and ``compute_hash``; plus its imports' absence."""
    tree = ast.parse(text)
    lines = text.splitlines()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "CompilationConfig":
            spans = [(node.lineno, node.lineno)]
            spans += [_span(s) for s in node.body if isinstance(s, ast.AnnAssign)]
            spans += [_span(s) for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "compute_hash"]
            if len(spans) < 3:
                raise SystemExit(f"{COMPILATION_CONFIG}: CompilationConfig has no fields or no compute_hash")
            return _render(lines, spans)
    raise SystemExit(f"{COMPILATION_CONFIG}: class CompilationConfig not found: read the release and update")


def trim_to_statements(text: str, needles: Iterable[str]) -> str:
    """For each needle: the innermost simple statement holding it (whole), else just its line."""
    tree = ast.parse(text)
    lines = text.splitlines()
    statements = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.stmt) and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    spans: list[tuple[int, int]] = []
    for needle in needles:
        hits = [i for i, line in enumerate(lines, 1) if needle in line]
        if not hits:
            # A marker split over two literals ("... took " "%.2f s"): search the joined statement text.
            hits = [
                s.lineno
                for s in statements
                if needle in "".join(_string_literals(ast.get_source_segment(text, s) or ""))
            ]
        for line in hits:
            holders = [s for s in statements if s.lineno <= line <= (s.end_lineno or s.lineno)]
            holders = [s for s in holders if not isinstance(s, ast.If | ast.For | ast.While | ast.With | ast.Try)]
            if holders:
                inner = min(holders, key=lambda s: (s.end_lineno or s.lineno) - s.lineno)
                start, end = _span(inner)
                spans.append((start, end) if end - start <= 20 else (line, line))
            else:
                spans.append((line, line))
    return _render(lines, spans)


# =========================================================================================================
# derive: the rules entry, from the excerpts alone
# =========================================================================================================


def _string_literals(text: str) -> list[str]:
    """Every string literal of a code fragment; adjacent literals (implicit concatenation) joined."""
    out: list[str] = []
    pending: list[str] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.STRING:
                try:
                    value = ast.literal_eval(token.string)
                except (ValueError, SyntaxError):
                    value = None  # an f-string part or similar: not a format string we read
                if isinstance(value, str):
                    pending.append(value)
                continue
            if token.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT) and pending:
                continue
            if pending:
                out.append("".join(pending))
                pending = []
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    if pending:
        out.append("".join(pending))
    return out


def _blocks(text: str) -> list[str]:
    """The runs of an excerpt (split at the ``# [lines a-b]`` headers)."""
    return [block for block in re.split(r"^# \[lines \d+-\d+\]\n", text, flags=re.M) if block.strip()]


def _literals_of(text: str) -> list[str]:
    found: list[str] = []
    for block in _blocks(text):
        found.extend(_string_literals(textwrap.dedent(block)))
    return found


def _formats_with(literals: list[str], marker: str, where: str) -> list[str]:
    """Every format string holding ``marker`` (one message may have variants, e.g. with/without compile time)."""
    formats = sorted({s for s in literals if marker in s})
    if not formats:
        raise ValueError(f"{where}: no format string contains {marker!r}: vLLM changed this message")
    return formats


def _set_literal(block: str, name: str, where: str) -> list[str]:
    """The string items of ``name: set[str] = {...}`` / ``name = [...]`` inside a code excerpt."""
    match = re.search(rf"^(\s*){name}(: [^=]+)? = [{{\[]\n(.*?)^\1[}}\]]", block, flags=re.M | re.S)
    if not match:
        raise ValueError(f"{where}: {name} not found")
    return sorted(set(re.findall(r'^\s*"([A-Za-z0-9_]+)",', match[3], flags=re.M)))


def _function(text: str, name: str, where: str) -> str:
    match = re.search(rf"^def {name}\(.*?(?=^\S|\Z)", text, flags=re.M | re.S)
    if not match:
        raise ValueError(f"{where}: def {name} not found")
    return match[0]


def derive(version: str, root: Path = FIXTURES) -> dict[str, Any]:
    """The rules entry of ``version`` from its excerpts under ``root/<version>/`` (no network)."""
    base = root / version

    def excerpt(path: str) -> str:
        return (base / (path + EXCERPT_SUFFIX)).read_text(encoding="utf-8")

    source = json.loads((base / "SOURCE.json").read_text(encoding="utf-8"))
    metadata = excerpt("METADATA")
    pins = re.findall(r"^Requires-Dist: torch==(\S+)$", metadata, flags=re.M)
    if len(pins) != 1:
        raise ValueError(f"vLLM {version}: expected one exact torch pin in METADATA, found {pins}")
    if f"Version: {version}" not in metadata:
        raise ValueError(f"vLLM {version}: METADATA is of another version")

    envs = excerpt(ENVS)
    known = re.findall(r'^    "([A-Z0-9_]+)":', envs, flags=re.M)
    factors_fn = _function(envs, "compile_factors", f"{version} {ENVS}")
    ignored = _set_literal(factors_fn, "ignored_factors", f"{version} {ENVS} compile_factors")
    ray = _set_literal(factors_fn, "ray_noset_env_vars", f"{version} {ENVS} compile_factors")
    hashed = sorted((set(known) - set(ignored)) | set(ray))

    def torch_threshold(function: str) -> str:
        body = _function(envs, function, f"{version} {ENVS}")
        found = re.findall(r'is_torch_equal_or_newer\("([^"]+)"\)', body)
        if len(found) != 1:
            raise ValueError(f"vLLM {version}: {function}: expected one torch threshold, found {found}")
        return str(found[0])

    literals: dict[str, list[str]] = {}

    def literals_in(path: str) -> list[str]:
        if path not in literals:
            literals[path] = _literals_of(excerpt(path))
        return literals[path]

    markers: dict[str, list[dict[str, str | list[str]]]] = {}
    for role, entries in MARKERS.items():
        markers[role] = [
            {"marker": marker, "formats": _formats_with(literals_in(path), marker, f"{version} {path}"), "file": path}
            for marker, path in entries
        ]
    timings = {
        name: {
            "formats": _formats_with(literals_in(path), marker, f"{version} {path}"),
            "file": path,
            "combine": combine,
        }
        for name, (marker, path, combine) in TIMINGS.items()
    }
    cache_dir = {
        "formats": _formats_with(literals_in(CACHE_DIR_MARKER[1]), CACHE_DIR_MARKER[0], f"{version} backends.py"),
        "file": CACHE_DIR_MARKER[1],
    }

    layout: dict[str, bool] = {}
    for feature, needles in LAYOUT_NEEDLES.items():
        layout[feature] = all(needle in excerpt(path) for path, needle in needles)
    for required in ("backbone", "aot", "inductor_cache_forced"):
        if not layout[required]:
            missing = [n for p, n in LAYOUT_NEEDLES[required] if n not in excerpt(p)]
            raise ValueError(f"vLLM {version}: the {required} cache layout changed: {missing} not found")

    config_text = excerpt(COMPILATION_CONFIG)
    fields = _compilation_fields(config_text, version)
    compute_hash = re.search(r"^    def compute_hash\(self\).*?(?=^    \S|\Z)", config_text, flags=re.M | re.S)
    if not compute_hash:
        raise ValueError(f"vLLM {version}: CompilationConfig.compute_hash not found")
    excluded = _set_literal(compute_hash[0], "ignored_factors", f"{version} CompilationConfig.compute_hash")

    force = "VLLM_FORCE_AOT_LOAD" if "VLLM_FORCE_AOT_LOAD" in known and layout["force_aot_load"] else None
    return {
        "entry_version": ENTRY_VERSION,
        "version": version,
        "source": {"wheel": source["wheel"], "wheel_sha256": source["wheel_sha256"]},
        "torch": pins[0],
        "env": {"hashed": hashed, "ignored_by_vllm": ignored},
        "aot": {
            "aot_compile_default_from_torch": torch_threshold("use_aot_compile"),
            "mega_artifact_default_from_torch": torch_threshold("use_mega_aot_artifact"),
            "force_load_env": force,
            "force_load_hashed_by_vllm": bool(force and force in hashed),
        },
        "markers": markers,
        "timings": timings,
        "cache_dir_line": cache_dir,
        "layout": layout,
        "compilation_config": {
            # Fields vLLM's compute_hash folds into its key (the rest: excluded, or not init fields).
            "hashed_fields": {name: default for name, default in sorted(fields.items()) if name not in excluded},
            "excluded_from_hash": excluded,
        },
    }


def _compilation_fields(text: str, version: str) -> dict[str, str]:
    """Init fields of CompilationConfig (name -> default as written), from the excerpt's field statements."""
    body = text.split("    def compute_hash", 1)[0]
    source = "\n".join(line for line in body.splitlines() if not line.startswith("# [lines"))
    tree = ast.parse(source)
    fields: dict[str, str] = {}
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            name = node.target.id
            default = ast.unparse(node.value) if node.value is not None else "<required>"
            if name.startswith("_") or "init=False" in default:
                continue
            fields[name] = default
    if not fields:
        raise ValueError(f"vLLM {version}: no CompilationConfig fields found")
    return fields


# =========================================================================================================
# update / check
# =========================================================================================================


def load_stored() -> dict[str, Any]:
    if not DATA.exists():
        return {"versions": {}}
    return json.loads(DATA.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def write_stored(data: dict[str, Any]) -> None:
    versions = dict(sorted(data["versions"].items(), key=lambda item: _version_key(item[0])))
    text = _compact_json({**data, "versions": versions}) + "\n"
    temp = DATA.with_suffix(".json.tmp")
    temp.write_text(text, encoding="utf-8")
    temp.replace(DATA)


def _compact_json(value: Any, indent: str = "") -> str:
    """JSON with one key per line and every list of scalars on one line (a reviewable diff, a small file)."""
    if isinstance(value, dict) and value:
        inner = indent + " "
        items = [f"{inner}{json.dumps(key)}: {_compact_json(item, inner)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and any(isinstance(item, dict | list) for item in value):
        inner = indent + " "
        return "[\n" + ",\n".join(inner + _compact_json(item, inner) for item in value) + "\n" + indent + "]"
    return json.dumps(value, ensure_ascii=False)


def diff_entries(stored: Any, derived: Any, where: str = "") -> list[str]:
    """Leaf-level differences between two JSON values (``path: stored -> derived``)."""
    if isinstance(stored, dict) and isinstance(derived, dict):
        out: list[str] = []
        for key in sorted(set(stored) | set(derived)):
            out += diff_entries(stored.get(key, "<absent>"), derived.get(key, "<absent>"), f"{where}.{key}")
        return out
    if isinstance(stored, list) and isinstance(derived, list) and all(isinstance(x, str) for x in stored + derived):
        gone, new = sorted(set(stored) - set(derived)), sorted(set(derived) - set(stored))
        return [f"{where}: -{gone} +{new}"] if gone or new else []
    return [] if stored == derived else [f"{where}: {stored!r} -> {derived!r}"]


def stored_fields(entry: dict[str, Any]) -> dict[str, Any]:
    """The derived part of a stored entry (GPU evidence fields are added by hand and not derived)."""
    return {key: value for key, value in entry.items() if key not in ("gpu_proven", "upper_rewrites")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("fetch", "update", "derive"):
        command = sub.add_parser(name)
        command.add_argument("versions", nargs="*")
        command.add_argument("--all", action="store_true", help="every release from 0.20.0 on")
    sub.add_parser("check")
    args = parser.parse_args(argv)
    if args.command == "check":
        stored = load_stored()["versions"]
        problems = 0
        for version, entry in stored.items():
            for line in diff_entries(stored_fields(entry), derive(version)):
                print(f"{version}{line}")
                problems += 1
        print(f"{len(stored)} stored entries, {problems} difference(s)", file=sys.stderr)
        return 1 if problems else 0
    versions = list(args.versions)
    if args.all:
        versions = (
            released_versions(_index())
            if args.command == "fetch"
            else sorted((p.name for p in FIXTURES.iterdir() if p.is_dir()), key=_version_key)
        )
    if not versions:
        parser.error("name versions or pass --all")
    if args.command == "fetch":
        index = _index()
        for version in versions:
            print(f"vLLM {version}: {fetch(version, index).relative_to(REPO)}", file=sys.stderr)
        return 0
    if args.command == "derive":
        for version in versions:
            print(json.dumps(derive(version), indent=1))
        return 0
    data = load_stored()
    for version in versions:
        entry = derive(version)
        old = data["versions"].get(version)
        if old is not None:
            for line in diff_entries(stored_fields(old), entry):
                print(f"{version}{line}", file=sys.stderr)
            entry.update({k: v for k, v in old.items() if k in ("gpu_proven", "upper_rewrites")})
        else:
            print(f"{version}: new entry", file=sys.stderr)
        data["versions"][version] = entry
    write_stored(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
