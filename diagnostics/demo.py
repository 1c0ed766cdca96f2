"""``zoo demo``: every model compared with its stored reference (``diagnostics.comparison.compare_model``), its
real-data sections, the ladders of budgets of the cheap models, then the index page counting the verdicts; in this
process, or with ``workers`` > 1 in worker processes (``diagnostics.workers``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import inference
import zoo
from diagnostics import workers as pool
from diagnostics.comparison import compare_model, compare_real_data, with_explained_warnings
from diagnostics.realdata import real_methods, real_sections
from diagnostics.report_pages import report_index

Log = Callable[[str], None]


@with_explained_warnings
def run_demo(out: Path, models: Sequence[str] | None = None, *, methods: Mapping[str, Sequence[str]] | None = None,
             seed: int = 0, fresh: bool = False, progress: bool | None = None, workers: int = 1,
             ladders: bool | Sequence[str] | None = None, log: Log = print) -> Path:
    """``compare_model`` for every model (``models`` None: all registered), each with every method it offers
    or those ``methods[model]`` names, then its real-data sections (``compare_real_data``: its kernels against
    the stored NUTS reference of each real dataset), then the index page counting the verdicts; returns its
    path.

    ``ladders``: the models whose pages get the section "Accuracy against compute" (every method on its ladder
    of budgets, ``ladder_of``; with workers, each model's ladder is a call of its own, started right after the
    long poles): None, the cheap ones (``DEMO_LADDERS``)
    among ``models``; True, every one; False, none. The index page names the models left out.

    ``workers`` > 1: every fit runs in that many spawned worker processes (``diagnostics.workers``, longest
    first), written where the in-process sequence writes it and with its run stamp; each model's pages are
    written in the workers from those trees once its fits are done. The same trees, pages and verdicts as
    ``workers=1`` (in process, the default here: a worker sees only the models ``import zoo`` registers; ``zoo
    demo`` uses one worker per core)."""
    workers = pool.check_workers(workers)
    specs = [zoo.get(name) for name in (models or zoo.list_models())]   # an unknown name fails before any fit
    laddered = demo_ladders([spec.name for spec in specs], ladders)
    for name in laddered if fresh else []:        # a fresh demo runs its ladders again too
        (Path(out) / name / "cost_accuracy.csv.data").unlink(missing_ok=True)
    chosen = {spec.name: list((methods or {}).get(spec.name) or inference.methods_for(spec)) for spec in specs}
    t0 = time.time()
    pages: dict[str, Any] = {}
    if workers > 1:
        sections = {spec.name: [(s.tag, real_methods(spec)) for s in real_sections(spec, log=lambda _: None)]
                    for spec in specs}
        jobs = pool.demo_jobs([(spec.name, chosen[spec.name], sections[spec.name]) for spec in specs])
        log(f"{len(jobs)} fits and {len(specs)} models' pages in {workers} worker processes "
            f"({pool.worker_share(workers)})")
        fits = [pool.Call("fit", job.label, pool.fit_job, (job, str(out), seed, fresh)) for job in jobs]
        # the ladders (against the stored reference: they need no fit) start right after the demo's long poles,
        # being long themselves; a model's pages start once its fits (and its ladder) are done, after every fit
        # has started (the fits go longest first)
        poles = sum(pool.is_long_pole(job) for job in jobs)
        ladder_calls = [pool.Call("ladder", name, pool.ladder_job, (name, chosen[name], str(out))) for name in laddered]
        page_calls = [pool.Call("pages of", spec.name, pool.page_job,
                                (spec.name, chosen[spec.name], str(out), seed, spec.name in laddered),
                                frozenset(("fit", job.label) for job in jobs if job.model == spec.name)
                                | ({("ladder", spec.name)} if spec.name in laddered else set()))
                      for spec in specs]
        with pool.WorkerPool(workers, log) as workers_pool:
            done = workers_pool.run_calls(fits[:poles] + ladder_calls + fits[poles:] + page_calls)
        for spec in specs:                       # the index in the models' order, whatever order they ended in
            pages.update(done[("pages of", spec.name)])
    for i, spec in enumerate(specs if workers == 1 else [], 1):
        log(f"[{i}/{len(specs)}] {spec.name}: {', '.join(chosen[spec.name])}")
        pages[spec.name] = compare_model(spec, chosen[spec.name], out, seed=seed, fresh=fresh, progress=progress,
                                         ladder=spec.name in laddered, log=log)
        for dataset, page in compare_real_data(spec, out, seed=seed, fresh=fresh, progress=progress,
                                               log=log).items():
            pages[f"{spec.name} / real data: {dataset}"] = page
    left_out = [spec.name for spec in specs if spec.name not in laddered]
    note = None
    if laddered or left_out:
        note = ("Accuracy against compute (every method on a ladder of budgets): "
                + (f"on the pages of {', '.join(laddered)}" if laddered else "on no page")
                + (f"; left out of this demo to keep it within its time budget: {', '.join(left_out)} (zoo compare "
                   "MODEL --ladder makes it for any of them)" if left_out else "") + ".")
    index = Path(report_index(pages, out, note=note))
    log(f"demo finished in {time.time() - t0:.0f} s; open {index.resolve()}")
    return index


# The models whose ladders ``zoo demo`` runs by default: ppca, whose every method's ladder (NUTS's 12 fits the
# longest) adds minutes, not tens of minutes, to the demo (benchmarks/results.md, section cost_accuracy); the
# others' ladders cost more than the whole demo. ``zoo demo --ladders all`` or ``zoo compare MODEL --ladder``.
DEMO_LADDERS: tuple[str, ...] = ("ppca",)


def demo_ladders(models: Sequence[str], ladders: bool | Sequence[str] | None) -> list[str]:
    """The models among ``models`` whose demo page gets its ladders (``run_demo``); ``ValueError`` naming
    ``ladders`` for a model that is not among them."""
    if ladders is None:
        return [m for m in models if m in DEMO_LADDERS]
    if isinstance(ladders, bool):
        return list(models) if ladders else []
    if isinstance(ladders, str) or not isinstance(ladders, Sequence):
        raise ValueError(f"ladders: expected None, True, False or a list of models, got {ladders!r}")
    bad = [m for m in ladders if m not in models]
    if bad:
        raise ValueError(f"ladders: {bad} are not among the demo's models {list(models)}")
    return [m for m in models if m in ladders]
