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


PROGRAM_LOG_CHILD = """
import json, sys
from benchmarks.bench_compile import ProgramLog
log = ProgramLog(sys.argv[1])
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)

def f(x):
    return jnp.sin(x) @ x

x = jax.device_put(jnp.ones((3, 3)))
log.take()
jax.jit(f)(x)
jax.jit(f)(x)          # the same program: built once
y = x + 1.0            # an eager operation: a program of its own
print(json.dumps(log.take()))
"""


def test_program_log_names_each_program_with_its_xla_seconds_and_hlo_ops(tmp_path):
    """``bench_compile.ProgramLog`` in a fresh process with XLA's dump on: ``sin(x) @ x`` is one program of
    three HLO instructions (the parameter, sine, dot: counted by hand), the eager add another, marked eager; the
    CPU seconds of the compile spans are counted."""
    import json
    import subprocess
    import sys

    dump = tmp_path / "dump"
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text",
           "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[1]),
           "BAYES_ZOO_JAX_CACHE": str(tmp_path / "cache")}   # empty, as the benchmark's: a cached program has no dump
    done = subprocess.run([sys.executable, "-c", PROGRAM_LOG_CHILD, str(dump)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    programs, compile_s, compile_cpu_s = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [p for p in programs if not p["eager"]]
    assert [(p["name"], p["hlo_ops"]) for p in ours] == [("f", 3)]
    assert ours[0]["xla_s"] > 0 and compile_s >= ours[0]["xla_s"]
    assert compile_cpu_s > 0   # the process's CPU seconds inside those spans: compiling costs some
    assert any(p["eager"] and p["name"] == "add" for p in programs)


def test_hlo_ops_counts_the_instructions_of_every_computation():
    from benchmarks.bench_compile import hlo_ops

    text = """HloModule jit_g, entry_computation_layout={(f64[])->f64[]}

%region_0.1 (a: f64[], b: f64[]) -> f64[] {
  %a = f64[] parameter(0)
  %b = f64[] parameter(1)
  ROOT %add.1 = f64[] add(%a, %b)
}

ENTRY %main.2 (x.1: f64[4]) -> f64[] {
  %x.1 = f64[4]{0} parameter(0)
  %constant.1 = f64[] constant(0)
  ROOT %reduce.1 = f64[] reduce(%x.1, %constant.1), dimensions={0}, to_apply=%region_0.1
}
"""
    assert hlo_ops(text) == 6


def test_the_floor_takes_one_step_of_the_kernel_the_loop_would_run_with_one_restarts_state():
    """The loop's program builder stood in for (``bench_compile._stand_in``): the fit stops at the program's first
    call with the kernel's own step and one restart's state shapes (the restart axis dropped), nothing compiled."""
    from typing import NamedTuple

    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.bench_compile import _Captured, _stand_in
    from inference import loop

    class State(NamedTuple):
        w: jax.Array

    class Info(NamedTuple):
        objective: jax.Array

    def init(key, problem):
        return State(jnp.zeros(problem.shape[1]))

    def step(key, state, problem):
        w = state.w + 0.1 * problem.sum(0)
        return State(w), Info(-jnp.sum(w ** 2))

    original = loop._optimiser_program
    loop._optimiser_program = _stand_in("_optimiser_program")
    try:
        with pytest.raises(_Captured) as got:
            loop.run_until_converged(init, step, np.ones((5, 3)), jax.random.key(0), loop.StopRule(10, 1e-6),
                                     num_restarts=4)
    finally:
        loop._optimiser_program = original
    assert got.value.step is step
    assert got.value.state.w.shape == (3,) and got.value.state.w.dtype == jnp.float64
    assert np.shape(got.value.problem) == (5, 3)
