"""The comparison pipeline behind ``zoo compare`` and ``zoo demo``: fit several methods of a model on the data
of its stored NUTS reference, reuse what an earlier run wrote, and write the report.

* ``comparison_data(spec)``: the arrays stored with the model's reference (so every comparison is scored
  against a stored, healthy NUTS run on any CPU), else the simulator's default data;
* ``run_comparison(spec, methods, out)``: every fit validated first (``inference.prepare``, nothing compiles
  before every method, option and the data passed), then each tree written to ``out/<model>/<method>.nc``;
  a tree written by an earlier run with the same seed, options and data is reused (an interrupted run
  resumes), an unreadable one (truncated by a crash) is refitted;
* ``write_comparison(spec, trees, out)``: the model's report page and one verdict line per method;
* ``compare_model`` (both), ``run_demo`` (every model, then the index page).

Messages go to ``log`` (``print`` by default; the command line passes ``typer.echo``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import xarray as xr

import inference
import zoo
from diagnostics import references
from diagnostics.realdata import compare_real_data
from diagnostics.report import SUMMARY, first_clause, report, report_index

Log = Callable[[str], None]


def comparison_data(spec: zoo.ModelSpec) -> tuple[dict, str | None]:
    """(data, reference tag): the exact arrays stored with the model's reference (``default``, else its first
    stored tag, e.g. mppca's ``t11``); a model without a stored reference fits its simulator's default data."""
    if references.stored_tags(spec.name):
        return references.reference_data(spec.name)
    return spec.default_data()[0], None


def run_comparison(spec: zoo.ModelSpec | str, methods: Sequence[str], out: Path, *, seed: int = 0,
                   fresh: bool = False, progress: bool = True, log: Log = print) -> dict[str, xr.DataTree]:
    """Fit ``methods`` on ``comparison_data(spec)`` with the spec's demo options and return ``{label: tree}``,
    the stored reference first (label ``"reference (stored NUTS)"``) when it matches the data.

    Every fit is validated (``inference.prepare``) before the first one runs: a bad method or option is a
    ``ValueError`` naming it, with nothing fitted. Each tree goes to ``out/<model>/<method>.nc`` and is reused
    on a rerun when seed, options and data match (unless ``fresh``)."""
    spec = zoo.get(spec)
    data, tag = comparison_data(spec)
    prepared = {m: inference.prepare(spec, data, m, seed=seed, progress=progress,
                                     **spec.demo_options.get(m, {})) for m in methods}
    checksum = references.data_checksum(spec, data)
    trees = {}
    for i, (method, fit) in enumerate(prepared.items(), 1):
        head = f"  [{i}/{len(methods)}] {spec.name}/{method}"
        path = Path(out) / spec.name / f"{method}.nc"
        stamp = json.dumps({"seed": seed, "options": dict(spec.demo_options.get(method, {})), "data": checksum},
                           sort_keys=True, default=str)
        if path.is_file() and not fresh:
            try:
                tree = inference.load(path)
            except ValueError as err:          # corrupted or truncated by a crash: refit, never reuse
                log(f"{head}: {path} is unreadable ({err}); refitting")
                tree = None
            if tree is not None and tree.attrs.get("run_stamp") == stamp:
                log(f"{head}: reusing {path}")
                trees[method] = tree
                continue
        t0 = time.time()
        tree = inference.fit_prepared(fit)
        tree.attrs["run_stamp"] = stamp
        inference.save(tree, path)
        trees[method] = tree
        log(f"{head}: {time.time() - t0:.1f} s (compile {tree.attrs['compile_seconds']:.1f} s) -> {path}")
    reference = references.load(spec.name, data, tag=tag) if tag is not None else None
    if reference is not None:
        trees = {"reference (stored NUTS)": reference, **trees}
    return trees


def write_comparison(spec: zoo.ModelSpec | str, trees: Mapping[str, xr.DataTree], out: Path, *,
                     log: Log = print) -> Path:
    """Write the model's report page to ``out/<model>/`` (every tree's compared view computed once inside)
    and log each method's verdict with the first clause of its reason; returns the page's path."""
    spec = zoo.get(spec)
    page = Path(report(spec.name, dict(trees), Path(out) / spec.name))
    summary = json.loads((page.parent / SUMMARY).read_text())
    for method, v in summary.get("methods", {}).items():
        reason = v["reasons"]
        if v["verdict"] == "NOT JUDGED":  # the reference's failure is printed once below; a sampler's mixing here
            reason = reason[reason.index("its own chains"):] if "its own chains" in reason else ""
        why = f": {first_clause(reason, 200)}" if v["verdict"] != "PASS" and reason else ""
        log(f"  {spec.name}/{method}: {v['verdict']}{why}")
    health = summary.get("reference_health") or {}
    if health and not health.get("reliable", True):
        log(f"  {spec.name}: reference NOT healthy, nothing judged: {'; '.join(health['failures'])}")
    return page


def compare_model(spec: zoo.ModelSpec | str, methods: Sequence[str] | None, out: Path, *, seed: int = 0,
                  fresh: bool = False, progress: bool = True, log: Log = print) -> Path:
    """``run_comparison`` then ``write_comparison``; ``methods`` None: every method of the model
    (``inference.methods_for``). Returns the report page's path."""
    spec = zoo.get(spec)
    chosen = list(methods) if methods else inference.methods_for(spec)
    trees = run_comparison(spec, chosen, out, seed=seed, fresh=fresh, progress=progress, log=log)
    return write_comparison(spec, trees, out, log=log)


def run_demo(out: Path, models: Sequence[str] | None = None, *, methods: Mapping[str, Sequence[str]] | None = None,
             seed: int = 0, fresh: bool = False, progress: bool = True, log: Log = print) -> Path:
    """``compare_model`` for every model (``models`` None: all registered), each with every method it offers
    or those ``methods[model]`` names, then its real-data sections (``diagnostics.realdata``: its kernels against
    the stored NUTS reference of each real dataset), then the index page counting the verdicts; returns its
    path."""
    specs = [zoo.get(name) for name in (models or zoo.list_models())]   # an unknown name fails before any fit
    t0 = time.time()
    pages = {}
    for i, spec in enumerate(specs, 1):
        chosen = list((methods or {}).get(spec.name) or inference.methods_for(spec))
        log(f"[{i}/{len(specs)}] {spec.name}: {', '.join(chosen)}")
        pages[spec.name] = compare_model(spec, chosen, out, seed=seed, fresh=fresh, progress=progress, log=log)
        for dataset, page in compare_real_data(spec, out, seed=seed, fresh=fresh, progress=progress, log=log).items():
            pages[f"{spec.name} / real data: {dataset}"] = page
    index = Path(report_index(pages, out))
    log(f"demo finished in {time.time() - t0:.0f} s; open {index.resolve()}")
    return index
