"""The demo's fits in worker processes (``zoo demo --workers``, ``diagnostics.workers``): the same trees, run
stamps and verdicts as the in-process demo, the fits made in other processes, bad worker counts refused before
anything runs."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import inference
import zoo
from diagnostics import workers as pool
from diagnostics.demo import run_demo
from diagnostics.report_pages import SUMMARY


def test_demo_jobs_cover_every_pair_and_section_slowest_kind_first():
    plan = [("a", ["vbem", "nuts", "svi"], [("real_x", ["vbem", "em"])]), ("b", ["em", "nuts"], [])]
    jobs = pool.demo_jobs(plan)
    assert sorted(j.label for j in jobs) == sorted(["a/vbem", "a/nuts", "a/svi", "a/real_x/vbem", "a/real_x/em",
                                                    "b/em", "b/nuts"])
    assert [j.method for j in jobs[:3]] == ["nuts", "nuts", "svi"]


def test_the_binary_ssgp_nuts_candidates_start_first_then_nuts_svi_and_the_kernels():
    """Longest-processing-time order on the registry's own demo plan: the two binary ssgp NUTS fits (the demo's
    long poles, one per worker) before every other fit; then every NUTS fit, every SVI fit, the kernels; a
    real-data section's NUTS fit is not a long pole."""
    plan = [(m, inference.methods_for(m), [("real_x", ["vbem", "nuts"])] if m == "ssgp_logit" else [])
            for m in zoo.list_models() if m.startswith(("ssgp", "hlcr", "ppca", "bpca"))]
    jobs = pool.demo_jobs(plan)
    assert [j.label for j in jobs[:2]] == ["ssgp_probit/nuts", "ssgp_logit/nuts"]
    kinds = [0 if j.method == "nuts" else 1 if j.method == "svi" else 2 for j in jobs[2:]]
    assert kinds == sorted(kinds) and kinds.count(0) == 1 + sum("nuts" in methods for _, methods, _ in plan) - 2
    assert "ssgp_logit/real_x/nuts" in [j.label for j in jobs[2:] if j.method == "nuts"]


def _threads_pool(workers: int) -> pool.WorkerPool:
    """A WorkerPool whose workers are threads (the scheduling is the pool's own; nothing is spawned)."""
    import queue
    from concurrent.futures import ThreadPoolExecutor

    wp = pool.WorkerPool(workers, log=lambda _: None)
    wp._lines, wp._pool = queue.Queue(), ThreadPoolExecutor(max_workers=workers)
    return wp


def test_calls_start_in_order_when_a_worker_is_free_and_only_after_their_prerequisites():
    """2 workers, fits a (long), b, c, d (short), then the pages of A (needs a) and of B (needs b). Each call's
    start and end are stamped: at most 2 run at once, the fits start in their order, each page starts after its
    fits ended and after every fit started, and page B does not wait for the long fit a."""
    import threading

    stamps: dict[str, list[float]] = {}
    lock = threading.Lock()
    running = [0, 0]                                   # now, most at once

    def work(label: str, seconds: float):
        with lock:
            stamps[label] = [time.monotonic()]
            running[0] += 1
            running[1] = max(running)
        time.sleep(seconds)
        with lock:
            running[0] -= 1
            stamps[label].append(time.monotonic())
        return label.upper(), os.getpid()

    calls = [pool.Call("fit", x, work, (x, t)) for x, t in [("a", 1.0), ("b", 0.05), ("c", 0.05), ("d", 0.05)]]
    calls += [pool.Call("pages of", "A", work, ("A", 0.05), frozenset({("fit", "a")})),
              pool.Call("pages of", "B", work, ("B", 0.05), frozenset({("fit", "b")}))]
    wp = _threads_pool(2)
    with wp._pool:
        results = wp.run_calls(calls)
    assert results == {(c.what, c.label): c.label.upper() for c in calls}
    assert running[1] == 2
    starts = {k: v[0] for k, v in stamps.items()}
    assert starts["a"] <= starts["b"] <= starts["c"] <= starts["d"]
    assert stamps["A"][0] >= stamps["a"][1] and stamps["B"][0] >= stamps["b"][1]
    assert min(starts["A"], starts["B"]) >= starts["d"]
    assert stamps["B"][1] <= stamps["a"][1]              # the short page ran beside the long fit


def test_prerequisites_that_are_no_call_or_a_cycle_are_refused_before_anything_runs():
    ran = []

    def work():
        ran.append(1)
        return None, os.getpid()

    wp = _threads_pool(2)
    with wp._pool:
        with pytest.raises(ValueError, match=r"^calls: prerequisites that are no call: \[\('fit', 'z'\)\]"):
            wp.run_calls([pool.Call("fit", "a", work, ()),
                          pool.Call("pages of", "A", work, (), frozenset({("fit", "z")}))])
        with pytest.raises(ValueError, match="^calls: prerequisites in a cycle"):
            wp.run_calls([pool.Call("fit", "a", work, (), frozenset({("fit", "b")})),
                          pool.Call("fit", "b", work, (), frozenset({("fit", "a")})), pool.Call("fit", "c", work, ())])
        with pytest.raises(ValueError, match="^calls: a \\(what, label\\) is given twice"):
            wp.run_calls([pool.Call("fit", "a", work, ()), pool.Call("fit", "a", work, ())])
    assert ran == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_worker_count_is_a_value_error_naming_it(bad, tmp_path):
    with pytest.raises(ValueError, match="^workers: "):
        run_demo(tmp_path, ["ppca"], workers=bad)
    assert not any(tmp_path.iterdir())               # refused before anything was fitted or written


def test_cli_refuses_a_negative_worker_count():
    from zoo_cli import app

    result = CliRunner().invoke(app, ["demo", "--workers", "-1"])
    assert result.exit_code == 2 and "--workers" in result.output


@pytest.mark.parametrize("workers,cores,devices,single_thread", [(2, 2, 1, True), (4, 2, 1, True), (1, 2, 2, False),
                                                                  (2, 16, 2, False), (3, 4, 1, False)])
def test_each_worker_gets_its_share_of_the_cores(workers, cores, devices, single_thread):
    """Two workers on 2 cores: one host device and one thread each (not 2 devices with every core's threads, as a
    process alone has); fewer workers than cores: cores // workers devices, at most 2, and XLA's own threads.
    The caller's other flags are kept, its device count replaced, never doubled."""
    flags = pool.worker_xla_flags("--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=2", workers, cores)
    assert flags.split().count("--xla_dump_to=/tmp/x") == 1
    assert [f for f in flags.split() if f.startswith(pool.DEVICE_COUNT_FLAG)] == \
        [f"{pool.DEVICE_COUNT_FLAG}={devices}"]
    assert (pool.SINGLE_THREAD_FLAG in flags.split()) is single_thread
    assert pool.worker_host_devices(workers, cores) == devices


def test_spawned_workers_start_with_their_share_and_the_caller_keeps_its_flags():
    """2 spawned workers on this machine's cores: each sees ``worker_host_devices`` JAX devices and the flags
    ``worker_xla_flags`` gives; the calling process's ``XLA_FLAGS`` are back as they were once the pool closes."""
    names = ("XLA_FLAGS", *pool.BLAS_THREADS)
    before = {name: os.environ.get(name) for name in names}
    with pool.WorkerPool(2, log=lambda _: None) as wp:
        got = wp.run("setup", [("a", pool.worker_setup, ()), ("b", pool.worker_setup, ())])
    assert {name: os.environ.get(name) for name in names} == before
    for setup in got.values():
        assert setup["devices"] == pool.worker_host_devices(2)
        assert setup["xla_flags"] == pool.worker_xla_flags(before["XLA_FLAGS"] or "", 2)
        for name in pool.BLAS_THREADS:        # one BLAS thread where 2 workers have the cores, the user's own kept
            assert setup[name] == (before[name] or ("1" if 2 >= pool.default_workers() else None))


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
    assert f"in 2 worker processes ({pool.worker_share(2)})" in text
    assert "[3/3 fit] ppca/" in text and "[1/1 pages of] ppca" in text
    assert "reusing" not in text                     # the pages reused the workers' trees without saying so
    # ppca's ladders (a demo default) ran in a worker as a call of their own, and its page carries them
    assert "[1/1 ladder] ppca done in worker pid" in text
    assert text.index("[1/1 ladder] ppca") < text.index("[1/1 pages of] ppca")
    for run in ("par", "seq"):
        ladder = pd.read_csv(tmp_path / run / "ppca" / "cost_accuracy.csv")
        assert list(ladder["method"].unique()) == ["em"] and len(ladder) >= 2
        assert "Accuracy against compute" in (tmp_path / run / "ppca" / "report.html").read_text()
    assert "ppca/real_wine/vbem: " in text          # the verdict lines come from the page workers
    pids = {int(line.split("worker pid ")[1].split()[0]) for line in lines if "worker pid " in line}
    assert len(pids) >= 1 and os.getpid() not in pids   # the fits ran in other processes
