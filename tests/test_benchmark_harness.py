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
