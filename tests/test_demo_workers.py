"""The demo's fits in worker processes (``zoo demo --workers``, ``diagnostics.workers``): the same trees, run
stamps and verdicts as the in-process demo, the fits made in other processes, bad worker counts refused before
anything runs."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from typer.testing import CliRunner

import inference
from diagnostics import workers as pool
from diagnostics.compare import run_demo
from diagnostics.report import SUMMARY


def test_demo_jobs_cover_every_pair_and_section_slowest_kind_first():
    plan = [("a", ["vbem", "nuts", "svi"], [("real_x", ["vbem", "em"])]), ("b", ["em", "nuts"], [])]
    jobs = pool.demo_jobs(plan)
    assert sorted(j.label for j in jobs) == sorted(["a/vbem", "a/nuts", "a/svi", "a/real_x/vbem", "a/real_x/em",
                                                    "b/em", "b/nuts"])
    assert [j.method for j in jobs[:3]] == ["nuts", "nuts", "svi"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_worker_count_is_a_value_error_naming_it(bad, tmp_path):
    with pytest.raises(ValueError, match="^workers: "):
        run_demo(tmp_path, ["ppca"], workers=bad)
    assert not any(tmp_path.iterdir())               # refused before anything was fitted or written


def test_cli_refuses_a_negative_worker_count():
    from zoo_cli import app

    result = CliRunner().invoke(app, ["demo", "--workers", "-1"])
    assert result.exit_code == 2 and "--workers" in result.output


def _trees(out):
    return {p.relative_to(out).as_posix(): inference.load(p) for p in sorted(out.rglob("*.nc"))}


def test_parallel_demo_gives_the_trees_and_verdicts_of_the_in_process_demo(tmp_path):
    """ppca with EM on its comparison data and its real-data section (vbem, em): 3 fits in 2 spawned workers,
    against the same demo in process. The log names the pid of the process that made each fit, so the test also
    shows the fits ran elsewhere. Same code, same data: the posteriors agree to 1e-9 relative (not bitwise:
    another process may order its float reductions differently), and the verdicts are identical."""
    lines: list[str] = []
    run_demo(tmp_path / "par", ["ppca"], methods={"ppca": ["em"]}, workers=2, progress=False, log=lines.append)
    run_demo(tmp_path / "seq", ["ppca"], methods={"ppca": ["em"]}, workers=1, progress=False, log=lambda _: None)
    par, seq = _trees(tmp_path / "par"), _trees(tmp_path / "seq")
    assert sorted(par) == sorted(seq) == ["ppca/em.nc", "ppca/real_wine/em.nc", "ppca/real_wine/vbem.nc"]
    for name in par:
        assert par[name].attrs["run_stamp"] == seq[name].attrs["run_stamp"], name
        for var in seq[name].posterior.data_vars:
            a, b = np.asarray(par[name].posterior[var]), np.asarray(seq[name].posterior[var])
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=f"{name}: {var}")
    for page in ("ppca", "ppca/real_wine"):
        verdicts = [json.loads((tmp_path / run / page / SUMMARY).read_text())["methods"] for run in ("par", "seq")]
        assert {m: v["verdict"] for m, v in verdicts[0].items()} == {m: v["verdict"] for m, v in verdicts[1].items()}
    text = "\n".join(lines)
    assert "in 2 worker processes" in text and "[3/3 fit] ppca/" in text and "[1/1 pages of] ppca" in text
    assert "reusing" not in text                     # the pages reused the workers' trees without saying so
    assert "ppca/real_wine/vbem: " in text          # the verdict lines come from the page workers
    pids = {int(line.split("worker pid ")[1].split()[0]) for line in lines if "worker pid " in line}
    assert len(pids) >= 1 and os.getpid() not in pids   # the fits ran in other processes
