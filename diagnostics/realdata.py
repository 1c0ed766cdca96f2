"""The demo's real-data sections: on each model's real dataset (``ModelSpec.real_datasets``, those ``in_demo``),
the model's own kernels judged against the stored NUTS reference of those data (tag ``real_<dataset>``, made by
``make references`` with the health rule of every stored reference, ``diagnostics.references``).

The reference is never generated here: a cold ``zoo demo`` only fits the kernels (seconds each). A real dataset
whose reference is not stored gets no section, and the log says how to make it.

* ``real_methods(spec)``: the methods a section fits: every method of the model except the generic NUTS and SVI
  baselines (NUTS is the reference itself);
* ``real_options(spec, dataset, method)``: the spec's demo options of that method with the dataset's
  hyperparameters (those of its reference) and its ``demo_options``;
* ``compare_real_data(spec, out)``: fit, reuse what an earlier run wrote, write one report page per dataset to
  ``out/<model>/real_<dataset>/``; returns ``{dataset: page}``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import inference
import zoo
from diagnostics import references
from diagnostics.report import report
from zoo._registry import REAL_TAG

Log = Callable[[str], None]
BASELINES = ("nuts", "svi")


def real_methods(spec: zoo.ModelSpec) -> list[str]:
    return [m for m in inference.methods_for(spec) if m not in BASELINES]


def real_options(spec: zoo.ModelSpec, dataset: str, method: str) -> dict:
    """Options of ``method`` on real dataset ``dataset``: the spec's demo options of that method without their
    hyperparameters, every hyperparameter as in the dataset's stored reference (defaults overridden by the
    dataset's ``hyper``), then the dataset's own ``demo_options`` of that method."""
    real = spec.real_datasets[dataset]
    own = {k: v for k, v in spec.demo_options.get(method, {}).items() if k not in spec.hyperparameters}
    return {**own, **spec.default_hyper, **real.hyper, **real.demo_options.get(method, {})}


def compare_real_data(spec: zoo.ModelSpec | str, out: Path, *, seed: int = 0, fresh: bool = False,
                      progress: bool = True, log: Log = print) -> dict[str, Path]:
    """One report page per real dataset of the demo with a stored reference: ``real_methods`` fitted on the
    reference's stored arrays, each tree written to ``out/<model>/real_<dataset>/<method>.nc`` and reused on a rerun
    with the same seed, options and data (unless ``fresh``)."""
    spec = zoo.get(spec)
    pages = {}
    for dataset, real in spec.real_datasets.items():
        if not real.in_demo:
            continue
        tag = REAL_TAG + dataset
        if references.reference_path(spec.name, tag).is_file():
            data, _ = references.reference_data(spec.name, tag)
        else:
            log(f"  {spec.name}/real data {dataset}: no stored reference, section skipped (make references "
                f"MODELS={spec.name})")
            continue
        folder = Path(out) / spec.name / tag
        methods = real_methods(spec)
        prepared = {m: inference.prepare(spec, data, m, seed=seed, progress=progress,
                                         **real_options(spec, dataset, m)) for m in methods}
        checksum = references.data_checksum(spec, data)
        trees = {f"reference (stored NUTS, {dataset})": references.load(spec.name, tag=tag)}
        for i, (method, fit) in enumerate(prepared.items(), 1):
            head = f"  [{i}/{len(methods)}] {spec.name}/real data {dataset}/{method}"
            path = folder / f"{method}.nc"
            stamp = json.dumps({"seed": seed, "options": real_options(spec, dataset, method), "data": checksum},
                               sort_keys=True, default=str)
            tree = _reusable(path, stamp, log, head) if not fresh else None
            if tree is None:
                t0 = time.time()
                tree = inference.fit_prepared(fit)
                tree.attrs["run_stamp"] = stamp
                inference.save(tree, path)
                log(f"{head}: {time.time() - t0:.1f} s -> {path}")
            trees[method] = tree
        page = report(spec.name, trees, folder, data_note=f"real data {dataset} ({real.source}; {real.size_text()}): "
                                                            f"{real.description}. Licence: {real.licence}",
                      index_link="../../index.html")
        summary = json.loads((page.parent / "summary.json").read_text())
        for method, v in summary.get("methods", {}).items():
            log(f"  {spec.name}/real data {dataset}/{method}: {v['verdict']}")
        pages[dataset] = page
    return pages


def _reusable(path: Path, stamp: str, log: Log, head: str):
    """The tree at ``path`` when it was written with ``stamp``; None when absent, stale or unreadable."""
    if not path.is_file():
        return None
    try:
        tree = inference.load(path)
    except ValueError as err:
        log(f"{head}: {path} is unreadable ({err}); refitting")
        return None
    if tree.attrs.get("run_stamp") != stamp:
        return None
    log(f"{head}: reusing {path}")
    return tree
