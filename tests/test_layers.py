"""Imports run down the floors only: zoo < inference < diagnostics < zoo_cli, notebooks, benchmarks.

Every ``.py`` file of the floors is parsed (``ast``), and every import is read, those inside functions and
``importlib.import_module("...")`` calls with a literal name included; an import of a higher floor from a lower
one is a failure naming the file, the line and the import.

``benchmarks/`` is a leaf: no notebook imports it, and no test except the tests of the benchmark code itself
(``BENCHMARK_TESTS``); what a benchmark shares with a notebook or a test lives in the library.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS = {"zoo": 0, "inference": 1, "diagnostics": 2, "zoo_cli": 3, "notebooks": 3, "benchmarks": 3}
SKIP_DIRS = {"_build", "__pycache__", ".ipynb_checkpoints"}
BENCHMARK_TESTS = {"test_benchmark_harness.py"}  # the tests of benchmarks/ itself


def source_files() -> list[Path]:
    return sorted(p for top in FLOORS for p in (ROOT / top).rglob("*.py")
                  if not SKIP_DIRS & set(p.relative_to(ROOT).parts))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                out.append((node.lineno, ".".join([*base, *([node.module] if node.module else [])])))
            else:
                out.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


def upward_imports(path: Path) -> list[str]:
    own = FLOORS[path.relative_to(ROOT).parts[0]]
    return [f"{path.relative_to(ROOT)}:{line} imports {name} (floor {FLOORS[name.split('.')[0]]} > {own})"
            for line, name in imported_modules(path) if FLOORS.get(name.split(".")[0], -1) > own]


def test_the_walker_sees_imports_inside_functions_and_relative_ones(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "zoo").mkdir()
    bad = tmp_path / "zoo" / "bad.py"
    bad.write_text("from . import _registry\n\ndef f():\n    import diagnostics.report_pages\n"
                   "    from inference.api import fit\n    importlib.import_module('zoo_cli')\n")
    assert upward_imports(bad) == ["zoo/bad.py:4 imports diagnostics.report_pages (floor 2 > 0)",
                                   "zoo/bad.py:5 imports inference.api (floor 1 > 0)",
                                   "zoo/bad.py:6 imports zoo_cli (floor 3 > 0)"]
    assert imported_modules(bad)[0] == (1, "zoo")


def test_every_floor_has_files():
    found = {p.relative_to(ROOT).parts[0] for p in source_files()}
    assert found == set(FLOORS), set(FLOORS) - found


@pytest.mark.parametrize("top", ["zoo", "inference", "diagnostics"])
def test_no_import_runs_up_a_floor(top):
    bad = [line for path in source_files() if path.relative_to(ROOT).parts[0] == top for line in upward_imports(path)]
    assert not bad, "imports from a lower floor to a higher one:\n" + "\n".join(bad)


def benchmark_imports(paths) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line} imports {name}" for path in paths
            for line, name in imported_modules(path) if name.split(".")[0] == "benchmarks"]


def test_the_benchmark_walker_sees_a_benchmark_import(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "tests").mkdir()
    bad = tmp_path / "tests" / "test_x.py"
    bad.write_text("import numpy\n\ndef test():\n    from benchmarks import bench_verdicts as bv\n")
    assert benchmark_imports([bad]) == ["tests/test_x.py:4 imports benchmarks"]


def test_no_notebook_imports_benchmarks():
    bad = benchmark_imports(p for p in source_files() if p.relative_to(ROOT).parts[0] == "notebooks")
    assert not bad, "notebooks importing benchmarks/ (move what they share into the library):\n" + "\n".join(bad)


def test_only_the_tests_of_the_benchmark_code_import_benchmarks():
    tests = sorted(p for p in (ROOT / "tests").rglob("*.py") if not SKIP_DIRS & set(p.parts))
    assert {p.name for p in tests} >= BENCHMARK_TESTS
    bad = benchmark_imports(p for p in tests if p.name not in BENCHMARK_TESTS)
    assert not bad, "tests importing benchmarks/ (move what they share into the library or a test helper):\n" + \
        "\n".join(bad)


# --- no circle among the library's modules -------------------------------------------------------------------

LIBRARY = ("zoo", "inference", "diagnostics", "zoo_cli")
# Circles still allowed, each with its reason; the test fails when a listed one is gone (shrink the list) as when a
# new one appears. None today.
ALLOWED_CIRCLES: dict[frozenset[str], str] = {}

# The comparison pipeline, bottom to top: a module may import those before it, never one after it (directly or
# through others). The ladders stand on the planning helpers and the references of a comparison; the report pages
# and their plots read the ladders; the pipeline writes the pages; the worker processes run the pipeline's steps;
# the demo starts the workers.
PIPELINE = ("diagnostics.own_references", "diagnostics.planning", "diagnostics.ladders", "diagnostics.plots",
            "diagnostics.report_pages", "diagnostics.comparison", "diagnostics.workers", "diagnostics.demo")


def library_modules() -> dict[str, Path]:
    return {module_name(p): p for p in source_files() if p.relative_to(ROOT).parts[0] in LIBRARY}


def import_edges(path: Path, modules) -> set[str]:
    """The library modules ``path`` imports, at module level or inside a function: ``from pkg import sub`` is an
    import of the module ``pkg.sub`` when there is one, else of ``pkg``; importing a package's submodule is not
    counted as importing the package's ``__init__`` (every submodule would otherwise close a circle with an
    ``__init__`` that re-exports it)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])]) \
                if node.level else node.module
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            out.add(node.args[0].value)
    return {m for m in out if m in modules and m != module_name(path)}


def circles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan), i.e. every import circle."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_sees_a_circle_through_a_function_level_import(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "diagnostics").mkdir()
    files = {"__init__": "from diagnostics.a import f\n", "a": "from diagnostics import b\n",
             "b": "def g():\n    from . import c\n", "c": "from diagnostics.a import f\n",
             "d": "import diagnostics.a\n"}
    for name, text in files.items():
        (tmp_path / "diagnostics" / f"{name}.py").write_text(text)
    modules = {module_name(p): p for p in (tmp_path / "diagnostics").glob("*.py")}
    graph = {m: import_edges(p, modules) for m, p in modules.items()}
    assert graph["diagnostics.b"] == {"diagnostics.c"} and graph["diagnostics"] == {"diagnostics.a"}
    assert circles(graph) == [frozenset({"diagnostics.a", "diagnostics.b", "diagnostics.c"})]


def test_no_import_circle_among_the_library_modules():
    modules = library_modules()
    graph = {m: import_edges(p, modules) for m, p in modules.items()}
    found = circles(graph)
    new = [sorted(c) for c in found if c not in ALLOWED_CIRCLES]
    assert not new, "import circles (move the shared helper to the lower module):\n" + "\n".join(
        f"{c}: " + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in new)
    gone = [sorted(c) for c in ALLOWED_CIRCLES if c not in found]
    assert not gone, f"allowed circles that are gone (remove them from ALLOWED_CIRCLES): {gone}"
    for diag in ("diagnostics.health", "diagnostics.view", "diagnostics.scoring", "diagnostics.quantities"):
        assert not any(diag in c for c in found), diag


def reachable(graph: Mapping[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_the_comparison_pipeline_imports_downwards_only():
    modules = library_modules()
    assert set(PIPELINE) <= set(modules), set(PIPELINE) - set(modules)
    graph = {m: import_edges(p, modules) for m, p in modules.items()}
    up = [f"{low} imports {high}" for i, low in enumerate(PIPELINE) for high in PIPELINE[i + 1:]
          if high in reachable(graph, low)]
    assert not up, "the comparison pipeline imports upwards:\n" + "\n".join(up)
    assert {"diagnostics.workers", "diagnostics.comparison"} <= graph["diagnostics.demo"]
    assert "diagnostics.comparison" in graph["diagnostics.workers"]


# The helpers of the compared quantities, each defined in one module only (the others import it).
SHARED_HELPERS = {"SAMPLE_DIMS": "inference.trees", "component_labels": "diagnostics.quantities",
                  "dim_entries": "diagnostics.quantities", "labels_of": "diagnostics.quantities",
                  "compared_posterior": "diagnostics.quantities", "with_user_labels": "diagnostics.quantities",
                  "COMPARED_ATTR": "diagnostics.quantities", "spec_of": "diagnostics.quantities",
                  "compared_draws": "diagnostics.quantities", "is_positions": "diagnostics.quantities"}


def module_level_definitions(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_the_shared_helpers_are_defined_once():
    homes = {name: [] for name in SHARED_HELPERS}
    for path in source_files():
        for name in module_level_definitions(path) & set(SHARED_HELPERS):
            homes[name].append(module_name(path))
    assert homes == {name: [home] for name, home in SHARED_HELPERS.items()}, homes

    from diagnostics import health, metrics, quantities, scoring, view
    from inference import trees

    for module in (health, metrics, view, quantities):
        assert module.SAMPLE_DIMS is trees.SAMPLE_DIMS == ("chain", "draw")
    for module in (view, scoring):  # the names they have always offered
        assert module.compared_posterior is quantities.compared_posterior
    assert view.with_user_labels is quantities.with_user_labels
    assert health.labels_of is quantities.labels_of


# --- no module shadowed by a package attribute of the same name -----------------------------------------------

def library_packages() -> list[str]:
    """Every package of the library (a folder with an ``__init__.py``), subpackages included."""
    return sorted(module_name(p.parent / "__init__.py") for top in LIBRARY for p in (ROOT / top).rglob("__init__.py")
                  if not SKIP_DIRS & set(p.relative_to(ROOT).parts))


def submodules(package: str, root: Path | None = None) -> list[str]:
    """The names of ``package``'s submodules: its ``.py`` files (``__init__`` and ``__main__`` aside) and its
    subpackages."""
    folder = (root or ROOT).joinpath(*package.split("."))
    return sorted([p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")]
                  + [p.parent.name for p in folder.glob("*/__init__.py")])


def shadowed_modules(package: str, root: Path | None = None) -> list[str]:
    """The submodules of ``package`` that the package's attribute of the same name hides: after importing both,
    ``getattr(package, name)`` must be that module or absent (a function ``report`` that the package re-exports
    from ``report.py`` hides that module: ``package.report.report_index`` does not resolve)."""
    import importlib

    pkg = importlib.import_module(package)
    out = []
    for name in submodules(package, root):
        module = importlib.import_module(f"{package}.{name}")
        value = getattr(pkg, name, module)
        if value is not module:
            out.append(f"{package}.{name}: the package's attribute is the {type(value).__name__} {value!r:.80}, which "
                       f"hides the module {package}/{name}")
    return out


def test_the_shadow_finder_sees_a_function_that_hides_its_module(tmp_path, monkeypatch):
    pkg = tmp_path / "shadowpkg_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from shadowpkg_probe.report import report\nfrom shadowpkg_probe import pages\n")
    (pkg / "report.py").write_text("def report():\n    return 1\n")
    (pkg / "pages.py").write_text("X = 1\n")
    (pkg / "unused.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        found = shadowed_modules("shadowpkg_probe", tmp_path)
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "shadowpkg_probe"]:
            del sys.modules[name]
    assert [line.split(":")[0] for line in found] == ["shadowpkg_probe.report"], found


def test_every_library_package_is_walked():
    packages = library_packages()
    assert {"zoo", "inference", "diagnostics", "zoo_cli", "inference.mppca", "inference.distributed"} <= set(packages)
    assert "report_index" not in submodules("diagnostics") and "workers" in submodules("diagnostics")


@pytest.mark.parametrize("package", ["zoo", "inference", "diagnostics", "zoo_cli"])
def test_no_package_attribute_shadows_a_submodule(package):
    bad = [line for p in library_packages() if p.split(".")[0] == package for line in shadowed_modules(p)]
    assert not bad, "a package's attribute hides its submodule of the same name (rename the module):\n" + "\n".join(bad)


# --- inference's own names are generic ------------------------------------------------------------------------

def generic_inference_modules() -> set[str]:
    """The generic floor of ``inference``: the modules directly under ``inference/`` (fit, methods, the loop,
    trees, NUTS, SVI, I/O, prediction, programs). Every subpackage is not: ``inference/<paper>/`` holds one
    paper's kernels, ``inference/distributed/`` the runners those kernels use."""
    return {f"inference.{p.stem}" for p in (ROOT / "inference").glob("*.py") if p.stem != "__init__"}


def test_inference_exports_only_generic_names():
    import inference

    generic = generic_inference_modules()
    assert {"inference.api", "inference.loop", "inference.trees"} <= generic and "inference.mppca.merge" not in generic
    homes = {name: getattr(getattr(inference, name), "__module__", None) for name in inference.__all__}
    bad = {name: home for name, home in homes.items() if home not in generic}
    assert not bad, f"inference.__all__ names defined outside the generic modules (import them from there): {bad}"
