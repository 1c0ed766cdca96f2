"""The benchmark harness measures both sides in one run and writes a table with ratios."""

import os
import pathlib
import time

import pytest

from benchmarks.harness import Harness


def test_compare_reports_medians_compile_time_and_ratio(tmp_path):
    h = Harness()
    out = h.compare("sleep", {"fast": lambda: time.sleep(0.001), "slow": lambda: time.sleep(0.02)},
                    baseline="slow", work=10, work_unit="items")
    assert out["fast"]["speedup_vs_baseline"] > 3  # 20 ms vs 1 ms, with generous slack for a noisy box
    assert out["slow"]["speedup_vs_baseline"] == 1.0
    path = h.write(tmp_path / "results.md")
    text = path.read_text()
    assert "Machine:" in text and "speed vs slow" in text and "items/s" in text


def test_fewer_than_five_repeats_is_refused():
    with pytest.raises(ValueError, match="repeats"):
        Harness(repeats=3)


def test_compare_once_separates_compile_time_from_run_time():
    import jax
    import jax.numpy as jnp

    h = Harness()
    calls = []

    def jitted():  # a fresh function each call: its first and only call compiles
        calls.append(1)
        return jax.jit(lambda x: jnp.sin(x) * 2.0 + len(calls))(jnp.ones(3))

    out = h.compare_once("once", {"jit": jitted, "slow": lambda: time.sleep(0.05)}, baseline="slow")
    assert len(calls) == 1
    assert out["jit"]["compile_s"] > 0
    assert out["slow"]["compile_s"] == 0 and out["slow"]["run_s"] >= 0.05
    assert abs(out["jit"]["compile_s"] + out["jit"]["run_s"] - out["jit"]["wall_s"]) < 1e-9
    assert out["slow"]["speedup_vs_baseline"] == 1.0
    with pytest.raises(ValueError, match="baseline"):
        h.compare_once("once", {"a": lambda: None}, baseline="b")


def test_compile_profile_plugin_attributes_each_compilation_to_its_test_and_function(tmp_path):
    """``benchmarks.compile_profile`` as a pytest plugin in a child pytest: the one jitted function of the child's
    test appears under that test's id and the function's name, and the summary names both."""
    import json
    import subprocess
    import sys

    from benchmarks.compile_profile import summarise

    (tmp_path / "test_child.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "def test_one():\n"
        "    @jax.jit\n"
        "    def doubled_plus_one(x):\n"
        "        return 2 * x + 1\n"
        "    assert float(doubled_plus_one(jnp.ones(3)).sum()) == 9.0\n")
    out = tmp_path / "profile.json"
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "BAYES_ZOO_COMPILE_PROFILE": str(out), "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.compile_profile", "-p",
                          "no:cacheprovider", str(tmp_path / "test_child.py")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    records = json.loads(out.read_text())["records"]
    mine = [r for r in records if r[0] == "test_child.py::test_one" and "doubled_plus_one" in r[2]]
    assert {r[1] for r in mine} >= {"jaxpr_trace_duration", "backend_compile_duration"}, records
    assert all(r[3] >= 0 for r in records)
    summary = summarise(str(out))
    assert "doubled_plus_one" in summary and "test_child.py::test_one" in summary
