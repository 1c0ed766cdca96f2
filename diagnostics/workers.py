"""The demo's fits in parallel worker processes (``zoo demo --workers N``, default: one per core).

The demo is a list of independent fits: each (model, method) on the model's comparison data, and each
(model, section, method) of a real-data section. ``diagnostics.demo.run_demo`` runs them (``fit_job``) in a
``WorkerPool`` of ``workers`` processes, longest first (``demo_jobs``), each fit written to the very path, with the
very run stamp, that the in-process pipeline of ``diagnostics.comparison`` writes; each model's pages (``page_job``:
``compare_model`` and ``compare_real_data``) are written in the workers, reusing those trees, as soon as that
model's fits are done and a worker is free of fits. A model's ladders of budgets (``ladder_job``, the page's
"Accuracy against compute") are a call of their own, right after the long poles. So the parallel demo and the
in-process one give the same trees and the same pages, and an interrupted parallel run resumes like an
in-process one (each tree is written atomically when its fit ends, ``inference.save``). The jobs run the
pipeline's own steps (this module imports ``diagnostics.comparison``); the demo that starts them
(``diagnostics.demo``) imports both.

Why processes and not threads: a fit holds the GIL while JAX traces and compiles, which is most of a cold fit.
The workers are *spawned* (a forked JAX runtime is unsafe) and share the persistent compilation cache
(``BAYES_ZOO_JAX_CACHE``, inherited from the environment) and the device choice (``JAX_PLATFORMS``).

Each worker gets its share of the cores, not the whole machine (``worker_xla_flags``, ``BLAS_THREADS``): a process
alone asks XLA for 2 host devices, so that NUTS runs its 2 chains in parallel, and XLA's CPU runtime spreads each
program over every core. Two such workers on 2 cores would run 4 chains' threads on 2 cores, and the two binary
ssgp NUTS fits side by side then took 6 times as long as one alone (benchmarks/results.md, compile_cold). So with
``workers`` at least the cores, a worker has one host device (its chains run one after the other,
``inference.nuts.chain_method``) and one thread; with fewer workers than cores, ``cores // workers`` devices (at
least 1, at most the 2 a lone process has) and XLA's own threads.

A worker sees only the models a fresh ``import zoo`` registers: a model registered at run time in the calling
process cannot be fitted there, which is why ``diagnostics.demo.run_demo`` defaults to ``workers=1`` (in
process) and the command line to one worker per core.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue as queue_module
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import zoo
from diagnostics.comparison import compare_model, compare_real_data, fit_prepared_methods, ladder_of, run_comparison
from diagnostics.ladders import CSV
from diagnostics.planning import plan_comparison
from diagnostics.realdata import real_sections

Log = Callable[[str], None]

# Fits that take longest go first, so that the last fit to start is a short one (longest-processing-time
# scheduling). Only the order depends on this rank; every fit runs. First the demo's long poles, on their
# comparison data (the binary ssgp NUTS candidates: the Gaussian augmentation samples one latent per
# observation; benchmarks/results.md, "demo_workers"), then NUTS, then SVI, then the kernels.
_LONG_POLES = (("ssgp_probit", "nuts"), ("ssgp_logit", "nuts"))
_SLOW_FIRST = {"nuts": 0, "svi": 1}


@dataclasses.dataclass(frozen=True)
class FitJob:
    """One fit of the demo: ``model``'s ``method`` on its comparison data (``section`` None) or on the data of
    its real-data section ``section`` (the section's tag, ``real_<dataset>``)."""
    model: str
    method: str
    section: str | None = None

    @property
    def label(self) -> str:
        return "/".join(p for p in (self.model, self.section, self.method) if p)


@dataclasses.dataclass(frozen=True)
class Call:
    """One call for a ``WorkerPool``: ``fn(*args)`` in a worker (a module-level function that returns ``(result,
    pid)``), logged as ``[k/n what] label``, started only once every call named in ``needs`` (as ``(what,
    label)``) has finished."""
    what: str
    label: str
    fn: Callable
    args: tuple
    needs: frozenset[tuple[str, str]] = frozenset()


def is_long_pole(job: FitJob) -> bool:
    """Whether ``job`` is one of the demo's long poles (``_LONG_POLES``, on its comparison data)."""
    return job.section is None and (job.model, job.method) in _LONG_POLES


def _rank(job: FitJob) -> tuple[int, int]:
    if is_long_pole(job):
        return 0, _LONG_POLES.index((job.model, job.method))
    return 1 + _SLOW_FIRST.get(job.method, len(_SLOW_FIRST)), 0


def default_workers() -> int:
    """One worker per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                       # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)


def check_workers(workers: int | None, name: str = "workers") -> int:
    """``workers`` as a positive int (None: ``default_workers()``), else a ``ValueError`` naming ``name``."""
    if workers is None:
        return default_workers()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"{name}: expected a whole number of worker processes >= 1, got {workers!r}")
    return workers


def demo_jobs(plan: Sequence[tuple[str, Sequence[str], Sequence[tuple[str, Sequence[str]]]]]) -> list[FitJob]:
    """The fits of a demo ``plan`` (``[(model, methods, [(section, methods), ...]), ...]``), longest first: the
    long poles (``_LONG_POLES``), then NUTS, then SVI, then the kernels, in the plan's order within a kind."""
    jobs = []
    for model, methods, sections in plan:
        jobs += [FitJob(model, m) for m in methods]
        jobs += [FitJob(model, m, section) for section, section_methods in sections for m in section_methods]
    return sorted(jobs, key=_rank)


DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
SINGLE_THREAD_FLAG = "--xla_cpu_multi_thread_eigen=false"
# the host BLAS/OpenMP pools NumPy and SciPy use for the scoring (one thread a worker, unless the user set one)
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_LONE_PROCESS_DEVICES = 2                      # zoo._runtime's host devices for a process alone


def worker_host_devices(workers: int, cores: int | None = None) -> int:
    """The host CPU devices of each of ``workers`` processes on ``cores`` cores (default: this process's,
    ``default_workers()``): ``cores // workers``, at least 1 and at most the 2 of a process alone."""
    cores = default_workers() if cores is None else cores
    return max(1, min(_LONE_PROCESS_DEVICES, cores // check_workers(workers)))


def worker_xla_flags(flags: str, workers: int, cores: int | None = None) -> str:
    """``XLA_FLAGS`` for each of ``workers`` worker processes on ``cores`` cores, from the calling process's
    ``flags``: its host device count replaced by ``worker_host_devices``, and XLA's CPU runtime kept to one thread
    (``SINGLE_THREAD_FLAG``) where there are at least as many workers as cores; every other flag kept as it is."""
    cores = default_workers() if cores is None else cores
    devices = worker_host_devices(workers, cores)
    kept = [f for f in flags.split() if not f.startswith((DEVICE_COUNT_FLAG, "--xla_cpu_multi_thread_eigen"))]
    extra = [SINGLE_THREAD_FLAG] if check_workers(workers) >= cores else []
    return " ".join(kept + [f"{DEVICE_COUNT_FLAG}={devices}"] + extra)


def worker_share(workers: int, cores: int | None = None) -> str:
    """``worker_xla_flags``'s share in words, for the log: "each with 1 host device and 1 thread, on 2 cores"."""
    cores = default_workers() if cores is None else cores
    devices = worker_host_devices(workers, cores)
    threads = " and 1 thread" if check_workers(workers) >= cores else ""
    return f"each with {devices} host device{'s' if devices > 1 else ''}{threads}, on {cores} cores"


# ------------------------------------------------------------------------------------------------
# In the worker
# ------------------------------------------------------------------------------------------------

_LINES: multiprocessing.Queue | None = None


def _start_worker(lines: multiprocessing.Queue) -> None:
    global _LINES
    _LINES = lines


def _say(line: str) -> None:
    if _LINES is not None:
        _LINES.put(line)


def worker_setup() -> tuple[dict[str, Any], int]:
    """What this worker runs on: its JAX backend, its number of devices and its ``XLA_FLAGS``; and its pid."""
    import jax

    return {"backend": jax.default_backend(), "devices": jax.local_device_count(),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            **{name: os.environ.get(name) for name in BLAS_THREADS}}, os.getpid()


def fit_job(job: FitJob, out: str | os.PathLike, seed: int, fresh: bool, log: Log = _say) -> tuple[float, int]:
    """Run one fit of the demo exactly as the sequential pipeline would (same options, path and run stamp):
    ``run_comparison`` for the comparison data, the section's ``plan_comparison`` for a real-data section.
    Returns its wall seconds and the id of the process that ran it."""
    t0 = time.time()
    spec = zoo.get(job.model)
    if job.section is None:
        run_comparison(spec, [job.method], Path(out), seed=seed, fresh=fresh, progress=False, log=log)
        return time.time() - t0, os.getpid()
    sections = [s for s in real_sections(spec, log=lambda _: None) if s.tag == job.section]
    if not sections:
        raise ValueError(f"section: {job.section!r} is not a real-data section of {spec.name!r} with a stored "
                         f"reference")
    section = sections[0]
    options = {job.method: section.options[job.method]} if job.method in section.options else {}
    plan = plan_comparison(spec, section.data, [job.method], seed=seed, hyper=section.hyper, options=options,
                           progress=False)
    fit_prepared_methods(spec, plan.prepared, plan.options, Path(out) / spec.name / section.tag, seed=seed,
                         fresh=fresh, log=log)
    return time.time() - t0, os.getpid()


def ladder_job(model: str, methods: Sequence[str], out: str | os.PathLike, log: Log = _say) -> tuple[int, int]:
    """Run every method of ``model`` on its ladder of budgets against the stored reference (``ladder_of``, as
    ``compare_model(..., ladder=True)`` does) and leave its marker in ``out/<model>/``, so that the model's page
    job reuses the frame instead of running it again. Returns the ladder's number of rows and the process id."""
    frame = ladder_of(zoo.get(model), list(methods), Path(out) / model, progress=False, log=log)
    frame.to_csv(Path(out) / model / CSV, index=False)   # the page job's reuse reads it
    return len(frame), os.getpid()


def page_job(model: str, methods: Sequence[str], out: str | os.PathLike, seed: int, ladder: bool = False,
             log: Log = _say) -> tuple[dict[str, str], int]:
    """Write ``model``'s report page and its real-data pages from the trees the fit jobs wrote (``compare_model``
    and ``compare_real_data``, each fit reused: the "reusing" lines are not repeated; ``ladder``: with the
    section "Accuracy against compute" from the frame ``ladder_job`` wrote). Returns ``{index label: page
    path}`` as ``run_demo`` collects them, and the id of the process."""

    def quiet(line: str) -> None:
        if not (": reusing " in line and (line.endswith(".nc") or line.endswith(".csv"))):
            log(line)

    pages = {model: str(compare_model(model, list(methods), Path(out), seed=seed, progress=False, ladder=ladder,
                                      log=quiet))}
    for dataset, page in compare_real_data(model, Path(out), seed=seed, progress=False, log=quiet).items():
        pages[f"{model} / real data: {dataset}"] = str(page)
    return pages, os.getpid()


# ------------------------------------------------------------------------------------------------
# In the calling process
# ------------------------------------------------------------------------------------------------

def _check_calls(calls: Sequence[Call]) -> None:
    """Every (what, label) once, every prerequisite a call, and an order that meets them all (no cycle)."""
    keys = [(c.what, c.label) for c in calls]
    if len(set(keys)) != len(keys):
        raise ValueError("calls: a (what, label) is given twice")
    unknown = sorted({need for c in calls for need in c.needs} - set(keys))
    if unknown:
        raise ValueError(f"calls: prerequisites that are no call: {unknown}")
    met: set[tuple[str, str]] = set()
    left = list(calls)
    while left:
        ready = [c for c in left if c.needs <= met]
        if not ready:
            raise ValueError(f"calls: prerequisites in a cycle: {sorted((c.what, c.label) for c in left)}")
        met |= {(c.what, c.label) for c in ready}
        left = [c for c in left if c not in ready]


class WorkerPool:
    """``workers`` spawned processes (``with WorkerPool(n, log) as pool``) that run module-level functions
    (``pool.run``), each worker's log lines passed to ``log`` as they come. Each worker starts with
    ``worker_xla_flags`` (its share of the cores), and with at least as many workers as cores one thread for
    NumPy's BLAS too (``BLAS_THREADS``, where the user set none): the calling process's environment holds them
    while the pool is open (the workers are spawned as calls need them) and is restored when it closes."""

    def __init__(self, workers: int, log: Log = print):
        self.workers, self.log = check_workers(workers), log

    def __enter__(self) -> WorkerPool:
        self._saved = {name: os.environ.get(name) for name in ("XLA_FLAGS", *BLAS_THREADS)}
        os.environ["XLA_FLAGS"] = worker_xla_flags(self._saved["XLA_FLAGS"] or "", self.workers)
        if self.workers >= default_workers():
            for name in BLAS_THREADS:
                os.environ.setdefault(name, "1")
        context = multiprocessing.get_context("spawn")
        self._lines: multiprocessing.Queue = context.Queue()
        self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=context,
                                         initializer=_start_worker, initargs=(self._lines,))
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._drain()
        finally:
            for name, value in self._saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def _drain(self) -> None:
        while True:
            try:
                self.log(self._lines.get_nowait())
            except queue_module.Empty:
                return

    def run(self, what: str, calls: Sequence[tuple[str, Callable, tuple]]) -> dict[str, Any]:
        """Run every ``(label, function, args)`` of ``calls`` (``run_calls`` with no prerequisites); returns
        ``{label: result}``."""
        done = self.run_calls([Call(what, label, fn, args) for label, fn, args in calls])
        return {label: result for (_, label), result in done.items()}

    def run_calls(self, calls: Sequence[Call]) -> dict[tuple[str, str], Any]:
        """Run every call, at most ``workers`` at a time: whenever a worker is free, the first call in ``calls``'
        order whose prerequisites (``Call.needs``) have all finished starts there. Logs ``[k/n what] label``
        with its seconds as each ends; returns ``{(what, label): result}``. The first failure cancels the calls
        not started and is raised as a ``RuntimeError`` naming it, with the worker's error as its cause (what
        finished stays written, so a rerun resumes). Prerequisites that are no call or form a cycle are a
        ``ValueError`` naming ``calls``, raised before anything runs."""
        _check_calls(calls)
        totals = {what: sum(c.what == what for c in calls) for what in dict.fromkeys(c.what for c in calls)}
        counts = dict.fromkeys(totals, 0)
        t0 = time.time()
        waiting, results = list(calls), {}
        running: dict[Future, tuple[Call, float]] = {}
        try:
            while waiting or running:
                while waiting and len(running) < self.workers:
                    ready = next((c for c in waiting if c.needs <= results.keys()), None)
                    if ready is None:
                        break
                    waiting.remove(ready)
                    running[self._pool.submit(ready.fn, *ready.args)] = (ready, time.time())
                done, _ = wait(running, timeout=0.25, return_when=FIRST_COMPLETED)
                self._drain()
                for future in done:
                    call, started = running.pop(future)
                    error = future.exception()
                    if error is not None:
                        raise RuntimeError(f"{call.what} {call.label} failed in its worker: {error}") from error
                    results[(call.what, call.label)], pid = future.result()
                    counts[call.what] += 1
                    self.log(f"[{counts[call.what]}/{totals[call.what]} {call.what}] {call.label} done in worker pid "
                             f"{pid} ({time.time() - started:.0f} s, {time.time() - t0:.0f} s since the start)")
        except BaseException:
            for future in running:
                future.cancel()
            raise
        return results
