"""Imports run down the floors only: zoo < inference < diagnostics < zoo_cli, notebooks, benchmarks.

Every ``.py`` file of the floors is parsed (``ast``), and every import is read, those inside functions and
``importlib.import_module("...")`` calls with a literal name included; an import of a higher floor from a lower
one is a failure naming the file, the line and the import.

``benchmarks/`` is a leaf: no notebook imports it, and no test except the tests of the benchmark code itself
(``BENCHMARK_TESTS``); what a benchmark shares with a notebook or a test lives in the library.
"""

from __future__ import annotations

import ast
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
    bad.write_text("from . import _registry\n\ndef f():\n    import diagnostics.report\n"
                   "    from inference.api import fit\n    importlib.import_module('zoo_cli')\n")
    assert upward_imports(bad) == ["zoo/bad.py:4 imports diagnostics.report (floor 2 > 0)",
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
