"""The pure core stays pure: factors.py does no I/O and knows no engine; one config-hash format everywhere;
flows never import one another."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from bless.core.factors import (
    config_hash,
    is_config_hash,
    parse_config_hash,
    parse_config_hash_prefix,
)
from bless.core.manifest import validate_document
from bless.errors import InputInvalidError, ManifestInvalidError
from bless.store import Store

REPO = Path(__file__).resolve().parents[2]
BLESS = REPO / "bless"

#: Modules whose use means I/O (processes, files, the network, the host) or an engine/runtime/flow dependency.
IMPURE = ("os", "subprocess", "shutil", "platform", "socket", "pathlib", "urllib", "huggingface_hub", "docker")
LAYERS_ABOVE_CORE = ("bless.engines", "bless.runtime", "bless.flows", "bless.probes")


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names), anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_factors_does_no_io_and_imports_no_engine() -> None:
    imported = imported_modules(BLESS / "core" / "factors.py")
    impure = sorted(m for m in imported if m.split(".")[0] in IMPURE)
    above = sorted(m for m in imported if m.startswith(LAYERS_ABOVE_CORE))
    assert impure == [], f"factors.py must receive probe results, not probe: imports {impure}"
    assert above == [], f"factors.py is core: imports {above}"


#: The packages below the edges: the core model, the OCI artifact and registry client, the replay protocol, the
#: operating-system helpers, the Kubernetes documents and the store; and the vocabulary at the top.
CORE_PACKAGES = ("core", "oci", "replay", "system", "k8s", "store")
VOCABULARY = ("errors.py", "container_labels.py", "evidence_types.py", "untrusted_text.py")
CORE_MODULES = [
    *VOCABULARY,
    *sorted(
        path.relative_to(BLESS).as_posix() for package in CORE_PACKAGES for path in (BLESS / package).rglob("*.py")
    ),
]


#: The bottom of the layering: the vocabulary (untrusted_text.py among it: how a name from disk is shown, pure text)
#: and the operating-system helpers (system/) import nothing of bless but each other.
#: So the vocabulary never names a core type (errors.py describes a tree check's result, it does not import it) and
#: system/ keeps what it needs (utc_now, file locks) instead of reaching up into core/ or store/.
BOTTOM = (*VOCABULARY, *sorted(path.relative_to(BLESS).as_posix() for path in (BLESS / "system").glob("*.py")))
BOTTOM_MAY_IMPORT = ("bless.system", *(f"bless.{name[:-3]}" for name in VOCABULARY))


@pytest.mark.parametrize("module", BOTTOM)
def test_the_vocabulary_and_system_import_nothing_above_them(module: str) -> None:
    above = sorted(
        m
        for m in imported_modules(BLESS / module)
        if (m == "bless" or m.startswith("bless."))
        and not any(m == allowed or m.startswith(f"{allowed}.") for allowed in BOTTOM_MAY_IMPORT)
    )
    assert above == [], f"bless/{module} is at the bottom of the layering: imports {above}"


@pytest.mark.parametrize("module", sorted(path.name for path in (BLESS / "trust").glob("*.py")))
def test_trust_does_not_import_the_store(module: str) -> None:
    """Trust checks and signs given paths (the store hands it its trust dir and lock): it never reaches into it."""
    store = sorted(
        m for m in imported_modules(BLESS / "trust" / module) if m == "bless.store" or m.startswith("bless.store.")
    )
    assert store == [], f"bless/trust/{module} imports {store}"


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_modules_import_no_engine_runtime_flow_or_probe(module: str) -> None:
    above = sorted(m for m in imported_modules(BLESS / module) if m.startswith(LAYERS_ABOVE_CORE))
    assert above == [], f"bless/{module} is core: imports {above}"


@pytest.mark.parametrize("module", sorted(p.name for p in (BLESS / "runtime").glob("*.py")))
def test_runtimes_import_no_engine(module: str) -> None:
    engines = sorted(m for m in imported_modules(BLESS / "runtime" / module) if m.startswith("bless.engines"))
    assert engines == [], f"bless/runtime/{module} runs any engine: imports {engines}"


#: Modules allowed past ~500 lines, each one concern (docs/dev/architecture.md, "Layout", says which and why).
LONG_MODULES = {
    "runtime/docker.py",
    "runtime/local.py",
    "oci/client.py",
    "k8s/documents.py",
    "errors.py",
    "__init__.py",
}


def test_long_modules_are_the_documented_ones() -> None:
    # bless/cli is a symlink to cli/, which rglob does not enter: walk cli/ itself.
    sources = [*BLESS.rglob("*.py"), *(REPO / "cli").rglob("*.py")]
    long = {
        (path.relative_to(BLESS) if path.is_relative_to(BLESS) else path.relative_to(REPO)).as_posix()
        for path in sources
        if len(path.read_text(encoding="utf-8").splitlines()) > 520
    }
    assert long <= LONG_MODULES, f"split by concern, or document in docs/dev/architecture.md: {long - LONG_MODULES}"
    layout = (REPO / "docs" / "dev" / "architecture.md").read_text(encoding="utf-8").split("\n## Layout\n", 1)[1]
    for module in LONG_MODULES:
        assert f"`{module}`" in layout, f"docs/dev/architecture.md's Layout does not say why {module} is long"


def test_the_config_hash_format_is_written_down_once() -> None:
    """No module but factors.py spells the config-hash pattern (store and CLI each had their own rule).

    The engines package is left out: it parses engine-native keys (vLLM's 64-hex AOT hash), not config hashes.
    """
    spelled = re.compile(r"\[0-9a-f(A-F)?\]\{(64|8,64)\}")
    offenders = []
    for path in [*BLESS.rglob("*.py"), *(REPO / "cli").rglob("*.py")]:
        if path.name == "factors.py" or (BLESS / "engines") in path.parents:
            continue
        if spelled.search(path.read_text(encoding="utf-8")):
            offenders.append(path.relative_to(REPO).as_posix())
    assert offenders == []


FLOWS_DIR = BLESS / "flows"
#: The flows, one per command (a module or a package), and what several flows share beside them.
FLOWS = ("gate", "gc", "inspect", "k8s", "pull", "push", "run", "serve", "sign", "trust")
SHARED_FLOW_MODULES = ("engine_start", "events", "lookup", "resolve", "safety", "transfer", "trust_policy")


def flow_imports(path: Path) -> set[str]:
    """The ``bless.flows`` modules ``path`` imports (``from bless.flows import serve`` is ``bless.flows.serve``)."""
    found = {m for m in imported_modules(path) if m.startswith("bless.flows.")}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "bless.flows":
            found.update(f"bless.flows.{alias.name}" for alias in node.names)
    return found


def flow_sources(name: str) -> list[Path]:
    package = FLOWS_DIR / name
    return sorted(package.rglob("*.py")) if package.is_dir() else [FLOWS_DIR / f"{name}.py"]


def test_every_flow_module_is_a_flow_or_shared() -> None:
    """A new module in bless/flows/ says which it is, so the layering test below covers it."""
    present = {p.stem for p in FLOWS_DIR.glob("*.py") if p.stem != "__init__"}
    present |= {p.name for p in FLOWS_DIR.iterdir() if (p / "__init__.py").is_file()}
    assert present == set(FLOWS) | set(SHARED_FLOW_MODULES)


@pytest.mark.parametrize("name", FLOWS + SHARED_FLOW_MODULES)
def test_flows_never_import_one_another(name: str) -> None:
    """A flow imports its own modules and the shared ones; a shared module imports only shared ones."""
    own = f"bless.flows.{name}"
    allowed = {f"bless.flows.{shared}" for shared in SHARED_FLOW_MODULES}
    offenders = sorted(
        f"{path.relative_to(REPO).as_posix()}: {module}"
        for path in flow_sources(name)
        for module in flow_imports(path)
        if module not in allowed and module != own and not module.startswith(f"{own}.")
    )
    assert offenders == []


#: The store package's modules, each importing only modules listed before it: the crash seam, the narrow
#: parts (paths, locks, leases, manifests), the writer operations given those parts, then the facade.
#: So no operation calls back into :class:`Store`, and no part knows the operations.
STORE_ORDER = (
    "faults",
    "layout",
    "index",
    "trusted_paths",
    "locks",
    "lease",
    "scan",
    "dirs_record",
    "catalog",
    "parts",
    "gc",
    "publish",
    "reject",
    "store",
)


def test_store_dependencies_run_one_way() -> None:
    """Every store module is placed in STORE_ORDER and imports only modules before it."""
    store_dir = BLESS / "store"
    assert {p.stem for p in store_dir.glob("*.py") if p.stem != "__init__"} == set(STORE_ORDER)
    offenders = []
    for rank, name in enumerate(STORE_ORDER):
        for module in imported_modules(store_dir / f"{name}.py"):
            if module == "bless.store" or (
                module.startswith("bless.store.") and module.removeprefix("bless.store.") not in STORE_ORDER[:rank]
            ):
                offenders.append(f"{name}: {module}")
    assert offenders == []


TRUST_DIR = BLESS / "trust"
#: The trust package's modules by side: what both sides read, the signing repository, the verifying client.
TRUST_SIDES = {
    "shared": ("metadata", "target"),
    "signing": ("keys", "modelsig", "repository"),
    "verifying": ("client", "refusals", "root_chain"),
}


def test_every_trust_module_has_a_side() -> None:
    """A new module in bless/trust/ says which side it is on, so the test below covers it."""
    present = {p.stem for p in TRUST_DIR.glob("*.py") if p.stem != "__init__"}
    assert present == {module for modules in TRUST_SIDES.values() for module in modules}


@pytest.mark.parametrize("side", sorted(TRUST_SIDES))
def test_trust_signing_and_verifying_never_import_each_other(side: str) -> None:
    """Dependencies run one way: each side imports the shared modules, never the other side (nor __init__)."""
    allowed = {f"bless.trust.{module}" for module in (*TRUST_SIDES["shared"], *TRUST_SIDES[side])}
    offenders = sorted(
        f"{module}.py: {imported}"
        for module in TRUST_SIDES[side]
        for imported in imported_modules(TRUST_DIR / f"{module}.py")
        if (imported == "bless.trust" or imported.startswith("bless.trust.")) and imported not in allowed
    )
    assert offenders == []


H = config_hash({"factors_version": 1, "x": 1})


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (H, True),
        (H.upper(), False),
        (H + "\n", False),  # a "$"-anchored pattern accepts this
        (" " + H, False),
        (H[:63], False),
        (H + "0", False),
        ("g" * 64, False),
        (None, False),
        (64, False),
    ],
)
def test_one_rule_for_a_stored_config_hash(value: object, valid: bool) -> None:
    assert is_config_hash(value) is valid


def test_the_store_applies_the_one_rule(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    store.paths.ensure_layout()
    assert store.find(H) is None
    for bad in (H + "\n", H.upper(), H[:63]):
        with pytest.raises(InputInvalidError):
            store.find(bad)


def test_user_input_is_normalized_then_held_to_the_one_rule() -> None:
    assert parse_config_hash(f"  {H.upper()}\n") == H
    assert parse_config_hash_prefix(H[:8].upper()) == H[:8]
    for bad in ("", "g" * 64, H[:63], H + "0"):
        with pytest.raises(InputInvalidError):
            parse_config_hash(bad)
    for bad in ("", H[:7], "g" * 8, H + "0"):
        with pytest.raises(InputInvalidError):
            parse_config_hash_prefix(bad)


def test_a_manifest_config_hash_with_a_trailing_newline_is_invalid() -> None:
    """Python's ``$`` would let "<hash>\\n" through; the schema's patterns and the one rule both refuse it."""
    document = json.loads((REPO / "tests" / "fixtures" / "manifests" / "reference-cpu.v1.json").read_text())
    document["config_hash"] += "\n"
    with pytest.raises(ManifestInvalidError, match="config_hash"):
        validate_document(document, where="m")


#: What may sit at the top of bless/: the public API (with _version.py, the version the core imports without the
#: API), the vocabulary every layer shares, and the probes (an edge).
TOP_LEVEL = {"__init__.py", "_version.py", *VOCABULARY, "probes.py"}


def test_the_top_of_the_package_holds_only_the_api_and_the_vocabulary() -> None:
    """Modules are grouped by what they are (docs/dev/architecture.md): a new one goes into its package."""
    loose = {path.name for path in BLESS.glob("*.py")} - TOP_LEVEL
    assert loose == set(), f"put these into a package of bless/ (core, oci, replay, system, ...): {sorted(loose)}"


def test_nothing_below_the_api_imports_the_api() -> None:
    """The package face (``bless/__init__.py``) imports the flows; a flow, engine or core module that imported it
    back (``import bless``, ``from bless import __version__``) would run against the layering. A submodule named
    through the package (``from bless import container_labels``) is that submodule, not the face."""
    submodules = {path.stem for path in BLESS.glob("*.py")} | {path.name for path in BLESS.iterdir() if path.is_dir()}
    offenders = []
    for path in sorted(BLESS.rglob("*.py")):
        if path == BLESS / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import) and any(alias.name == "bless" for alias in node.names):
                offenders.append(f"{path.relative_to(BLESS)}: import bless")
            elif isinstance(node, ast.ImportFrom) and node.module == "bless" and node.level == 0:
                offenders += [
                    f"{path.relative_to(BLESS)}: from bless import {alias.name}"
                    for alias in node.names
                    if alias.name not in submodules
                ]
    assert offenders == []
