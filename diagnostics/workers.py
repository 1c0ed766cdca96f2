"""The demo's fits in parallel worker processes (``zoo demo --workers N``, default: one per core).

The demo is a list of independent fits: each (model, method) on the model's comparison data, and each
(model, section, method) of a real-data section. ``prefit`` runs them in ``workers`` processes, each fit written
to the very path, with the very run stamp, that the sequential pipeline of ``diagnostics.compare`` writes; the
sequential pipeline that follows (reports, verdicts, index) then finds every tree written and reuses it. So the
parallel demo and the sequential one give the same trees and the same pages, and an interrupted parallel run
resumes like a sequential one (each tree is written atomically when its fit ends, ``inference.save``).

Why processes and not threads: a fit holds the GIL while JAX traces and compiles, which is most of a cold fit.
The workers are *spawned* (a forked JAX runtime is unsafe) and share the persistent compilation cache
(``BAYES_ZOO_JAX_CACHE``, inherited from the environment) and the device choice (``JAX_PLATFORMS``).

A worker sees only the models a fresh ``import zoo`` registers: a model registered at run time in the calling
process cannot be fitted there, which is why ``diagnostics.compare.run_demo`` defaults to ``workers=1`` (in
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

Log = Callable[[str], None]

# Fits that take longest go first, so that the last fit to start is a short one (longest-processing-time
# scheduling). Only the order depends on this rank; every fit runs.
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
    """The fits of a demo ``plan`` (``[(model, methods, [(section, methods), ...]), ...]``), slowest kind first
    (NUTS, then SVI, then the kernels), in the plan's order within a kind."""
    jobs = []
    for model, methods, sections in plan:
        jobs += [FitJob(model, m) for m in methods]
        jobs += [FitJob(model, m, section) for section, section_methods in sections for m in section_methods]
    return sorted(jobs, key=lambda job: _SLOW_FIRST.get(job.method, len(_SLOW_FIRST)))


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


def fit_job(job: FitJob, out: str | os.PathLike, seed: int, fresh: bool, log: Log = _say) -> tuple[float, int]:
    """Run one fit of the demo exactly as the sequential pipeline would (same options, path and run stamp):
    ``run_comparison`` for the comparison data, the section's ``plan_comparison`` for a real-data section.
    Returns its wall seconds and the id of the process that ran it."""
    import zoo
    from diagnostics.compare import fit_prepared_methods, plan_comparison, run_comparison
    from diagnostics.realdata import real_sections

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
    plan = plan_comparison(spec, section.data, [job.method], seed=seed, hyper=section.hyper,
                                   options=options, progress=False)
    fit_prepared_methods(spec, plan.prepared, plan.options, Path(out) / spec.name / section.tag,
                                 seed=seed, fresh=fresh, log=log)
    return time.time() - t0, os.getpid()


# ------------------------------------------------------------------------------------------------
# In the calling process
# ------------------------------------------------------------------------------------------------

def prefit(jobs: Sequence[FitJob], out: str | os.PathLike, *, seed: int, fresh: bool, workers: int,
           log: Log = print) -> float:
    """Run ``jobs`` in ``workers`` spawned processes (``fit_job`` each), logging every fit's line as it ends
    and a count ``[k/n]``; returns the wall seconds. The first failed fit stops the rest (those not started are
    cancelled) and is raised as a ``RuntimeError`` naming it, with the worker's error as its cause; the trees
    already written stay, so a rerun resumes."""
    workers = check_workers(workers)
    t0 = time.time()
    context = multiprocessing.get_context("spawn")
    lines: multiprocessing.Queue = context.Queue()

    def drain() -> None:
        while True:
            try:
                log(lines.get_nowait())
            except queue_module.Empty:
                return

    log(f"fitting {len(jobs)} (model, method) pairs in {min(workers, len(jobs))} worker processes")
    with ProcessPoolExecutor(max_workers=min(workers, max(1, len(jobs))), mp_context=context,
                             initializer=_start_worker, initargs=(lines,)) as pool:
        futures: dict[Future, FitJob] = {pool.submit(fit_job, job, str(out), seed, fresh): job for job in jobs}
        pending, done_count = set(futures), 0
        try:
            while pending:
                done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                drain()
                for future in done:
                    job = futures[future]
                    error = future.exception()
                    if error is not None:
                        raise RuntimeError(f"the demo's fit {job.label} failed in its worker: {error}") from error
                    done_count += 1
                    seconds, pid = future.result()
                    log(f"[{done_count}/{len(jobs)}] {job.label} done: {seconds:.0f} s in worker pid {pid} "
                        f"({time.time() - t0:.0f} s since the start)")
        except BaseException:
            for future in pending:
                future.cancel()
            raise
        finally:
            time.sleep(0.05)
            drain()
    return time.time() - t0
