"""The benchmark harness measures both sides in one run and writes a table with ratios."""

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
