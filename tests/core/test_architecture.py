"""The layout DESIGN.md promises, checked on the source: dependencies point one way, no private imports
across packages, no import cycles inside a package, and the kernel names no backend."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGES = {p.name: p for p in sorted((ROOT / "packages").glob("*/src/*")) if p.is_dir()}
# What each package may import, besides itself and third-party libraries (DESIGN.md: one-way dependencies).
ALLOWED = {
    "hfexport": set(),
    "hfexport_dynamo": {"hfexport"},
    "hfexport_onnx": {"hfexport", "hfexport_dynamo"},
    "hfexport_executorch": {"hfexport", "hfexport_dynamo"},
    "hfexport_openvino": {"hfexport", "hfexport_dynamo"},
    "hfexport_sweep": {"hfexport", "hfexport_dynamo"},
}
OURS = set(ALLOWED) | {"hfexport_testplugin", "hfexport_etportable", "hfexport_brokenplugin"}


def _module_name(package_dir: Path, file: Path) -> str:
    parts = [package_dir.name, *file.relative_to(package_dir).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(module: str, file: Path) -> list[str]:
    """Every module ``file`` imports (function-local imports included), relative imports resolved."""
    is_package = file.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            out.append(target)
            out += [f"{target}.{alias.name}" for alias in node.names]  # `from . import submodule`
    return out


def _sources(root: Path) -> dict[str, tuple[Path, list[str]]]:
    files = {}
    for file in sorted(root.rglob("*.py")):
        module = _module_name(root, file)
        files[module] = (file, _imports(module, file))
    return files


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_dependencies_point_one_way_and_use_public_names_only(package):
    offences = []
    for file, imports in _sources(PACKAGES[package]).values():
        for target in imports:
            top = target.split(".")[0]
            if top in OURS and top != package and top not in ALLOWED[package]:
                offences.append(f"{file.relative_to(ROOT)} imports {target}")
            parts = target.split(".")
            if top in OURS and top != package and any(p.startswith("_") for p in parts[1:]):
                offences.append(f"{file.relative_to(ROOT)} imports the private {target}")
    assert not offences, "\n".join(offences)


def test_plugins_use_the_public_plugin_api_only():
    offences = []
    for root in sorted((ROOT / "tests" / "plugins").glob("*/src/*")):
        for file, imports in _sources(root).values():
            for target in imports:
                parts = target.split(".")
                if parts[0] in OURS and parts[0] != root.name and any(p.startswith("_") for p in parts[1:]):
                    offences.append(f"{file.relative_to(ROOT)} imports the private {target}")
    assert not offences, "\n".join(offences)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_module_imports_one_that_imports_it_back(package):
    sources = _sources(PACKAGES[package])
    graph = {m: {t for t in imports if t in sources and t != m} for m, (_, imports) in sources.items()}
    cycles = []

    def visit(node: str, stack: list[str], seen: set[str]) -> None:
        for target in sorted(graph[node]):
            if target in stack:
                cycles.append(" -> ".join([*stack[stack.index(target):], target]))
            elif target not in seen:
                seen.add(target)
                visit(target, [*stack, target], seen)

    for start in sorted(graph):
        visit(start, [start], {start})
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles)))


def test_the_kernel_and_dynamo_name_no_backend_outside_prose():
    offences = []
    for package in ("hfexport", "hfexport_dynamo"):
        for _, (file, imports) in _sources(PACKAGES[package]).items():
            offences += [f"{file.name} imports {t}" for t in imports
                         if t.split(".")[0] in ("hfexport_onnx", "hfexport_executorch", "hfexport_openvino")]
            tree = ast.parse(file.read_text())
            docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                          if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                          and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            offences += [f"{file.name}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
                         if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
                         and any(name in n.value for name in ("hfexport_onnx", "hfexport_executorch", "hfexport_openvino"))]
    assert not offences, "\n".join(offences)


def test_the_vendor_test_plugin_is_small():
    file = ROOT / "tests/plugins/hfexport-testplugin/src/hfexport_testplugin/exporter_testplugin.py"
    assert len(file.read_text().splitlines()) <= 60


def test_the_kernel_imports_no_transformers():
    """The kernel packages, verifies, saves and loads; everything that knows a Transformers model (its inputs, its
    tasks, generation and its commands) lives in hfexport-dynamo (issue 27)."""
    offences = [f"{file.relative_to(ROOT)} imports {target}"
                for file, imports in _sources(PACKAGES["hfexport"]).values()
                for target in imports if target.split(".")[0] == "transformers"]
    assert not offences, "\n".join(offences)


# The two public surfaces (issue 27): `hfexport` is what a user calls, `hfexport.plugin` what a backend author builds
# on. A name added to either is a decision: add it here too.
USER_API = [
    "BackendInfo", "ExportError", "ExportedModel", "IntegrityError", "InvalidInputError", "ManifestError",
    "Quantization", "UnknownBackendError", "UnresolvedPatchWarning", "UntrustedArtifactError", "VerificationError",
    "VerificationReport", "export", "get_backend", "list_backends", "list_workarounds", "load", "register_patch",
]
# The backend author's API (issue 42: about 20-25 names; the rest in hfexport.trust, .quantization, .workarounds,
# .artifact).
PLUGIN_API = [
    "Backend", "Component", "ComponentPlan", "ExportConfig", "ExportContext", "ExportError", "ExportedModel",
    "Exporter", "FileRunner", "InvalidInputError", "NamedIORunner", "Registration", "Runner", "RuntimeNeeds", "Stage",
    "StageEvent", "Step", "TaskPlan", "Tracer", "artifact_file", "component_manifest", "register_fx_node_fix",
    "register_fx_program_fix", "register_patch", "register_workaround",
]


def test_the_public_surfaces_are_the_pinned_lists():
    import hfexport
    import hfexport.plugin

    assert sorted(hfexport.__all__) == sorted(USER_API)
    assert sorted(hfexport.plugin.__all__) == sorted(PLUGIN_API) and len(PLUGIN_API) <= 25
    for module in (hfexport, hfexport.plugin):  # every listed name exists, and nothing public is left unlisted
        assert all(hasattr(module, name) for name in module.__all__)
        public = {name for name, value in vars(module).items() if not name.startswith("_")
                  and not isinstance(value, type(hfexport)) and getattr(value, "__module__", "").startswith("hfexport")}
        assert public <= set(module.__all__), sorted(public - set(module.__all__))
