"""The comparison pipeline behind ``zoo compare`` (``zoo demo`` runs it for every model: ``diagnostics.demo``):
fit several methods of a model, reuse what an earlier run wrote, and write the report.

* ``run_comparison(spec, methods, out)``: every method fitted on ``comparison_data(spec)`` (the arrays stored
  with the model's reference, ``diagnostics.planning``), every fit validated first (``inference.prepare``:
  nothing compiles before every method, option and the data passed), then each tree written to
  ``out/<model>/<method>.nc``; a tree written by an earlier run with the same seed, options and data is reused (an
  interrupted run resumes), an unreadable one (truncated by a crash) is refitted (``fit_prepared_methods``);
* ``write_comparison(spec, trees, out)``: the model's report page and one verdict line per method;
* ``compare_model``: both, and with ``ladder`` every method on its ladder of budgets (``ladder_of``);
* ``compare(model, data, methods)``: the same on **your own data** (a DataFrame or a dict): a reference on it
  (``diagnostics.own_references``: a stored reference whose data and hyperparameters match serves as it is, else
  one is made to the stored references' standard and cached by the data; resumable, reused by a later call), then
  the methods and the report; an unhealthy reference makes every verdict NOT JUDGED, with what to try.
  ``plan_comparison`` (``diagnostics.planning``: every check, nothing runs) and ``run_plan`` are its two halves;
* ``compare_real_data(spec, out)``: the demo's real-data sections (``diagnostics.realdata``) through that same
  pipeline, each served by its stored ``real_<dataset>`` reference and never by a new NUTS run;
* ``sensitivity_report``: prior sensitivity (power-scaling) of one method's fit on your own data, as a page.

Messages go to ``log`` (``print`` by default; the command line passes ``typer.echo``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

import inference
import zoo
from diagnostics import references
from diagnostics.ladders import CSV, budget_option, cost_accuracy, default_budgets
from diagnostics.own_references import DEFAULT_REFERENCE_BUDGET, NoReference, OwnReference, own_reference
from diagnostics.planning import ComparisonPlan, comparison_data, hyper_advice, method_options, plan_comparison
from diagnostics.realdata import real_methods, real_sections
from diagnostics.report_pages import SUMMARY, report, sensitivity_page, verdict_lines
from inference.api import read_data, resolve
from inference.progress import explained_warnings

Log = Callable[[str], None]


def with_explained_warnings(fn):
    """``fn`` run inside ``inference.progress.explained_warnings`` with its ``log``: warnings a user cannot act on
    are said once, with what they mean."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with explained_warnings(kwargs.get("log", print)):
            return fn(*args, **kwargs)
    return wrapper


def run_comparison(spec: zoo.ModelSpec | str, methods: Sequence[str], out: Path, *, seed: int = 0,
                   fresh: bool = False, progress: bool | None = None, log: Log = print) -> dict[str, xr.DataTree]:
    """Fit ``methods`` on ``comparison_data(spec)`` and return ``{label: tree}``, the stored reference first
    (label ``"reference (stored NUTS)"``) when it matches the data.

    Every method gets the hyperparameters of that stored reference (``inference.trees.problem_of``; without
    one, the model's defaults), so that all of them approximate the reference's posterior, and the method
    options of the spec's ``demo_options`` (their hyperparameters dropped). Every fit is validated
    (``inference.prepare``) before the first one runs: a bad method or option is a ``ValueError`` naming it,
    with nothing fitted. Each tree goes to ``out/<model>/<method>.nc`` and is reused on a rerun when seed,
    options and data match (unless ``fresh``)."""
    from inference.trees import problem_of

    spec = zoo.get(spec)
    data, tag = comparison_data(spec)
    reference = references.load(spec.name, data, tag=tag) if tag is not None else None
    hyper = problem_of(reference)[2] if reference is not None else spec.default_hyper
    options = {m: method_options(spec, m, hyper) for m in methods}
    prepared = {m: inference.prepare(spec, data, m, seed=seed, progress=progress, **options[m]) for m in methods}
    trees = fit_prepared_methods(spec, prepared, options, Path(out) / spec.name, seed=seed, fresh=fresh, log=log)
    if reference is not None:
        trees = {"reference (stored NUTS)": reference, **trees}
    return trees


def fit_prepared_methods(spec: zoo.ModelSpec, prepared: Mapping[str, inference.Prepared],
                         options: Mapping[str, Mapping[str, Any]], folder: Path, *, seed: int, fresh: bool,
                         log: Log) -> dict[str, xr.DataTree]:
    """Run every prepared fit, each tree written to ``folder/<method>.nc`` and reused on a rerun when its
    seed, options, data and data labels match (unless ``fresh``); an unreadable file is refitted."""
    trees = {}
    for i, (method, fit) in enumerate(prepared.items(), 1):
        head = f"  [{i}/{len(prepared)}] {spec.name}/{method}"
        path = Path(folder) / f"{method}.nc"
        stamp = json.dumps({"seed": seed, "options": dict(options.get(method, {})),
                            "data": references.data_checksum(spec, fit.context.data),
                            "labels": _labels_checksum(fit)}, sort_keys=True, default=str)
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
    return trees


def _labels_checksum(fit: inference.Prepared) -> str:
    """sha256 of a prepared fit's axis labels and table provenance (a rerun with renamed columns refits)."""
    text = json.dumps({"labels": {k: np.asarray(v).tolist() for k, v in fit.axis_labels.items()},
                       "source": dict(fit.provenance)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def write_comparison(spec: zoo.ModelSpec | str, trees: Mapping[str, xr.DataTree], out: Path, *,
                     section: str | None = None, data_note: str | None = None, ladder: Any = None,
                     log: Log = print) -> Path:
    """Write the model's report page to ``out/<model>/`` (``out/<model>/<section>/`` for a section such as a real
    dataset's, with ``data_note`` naming its data under the title; every tree's compared view computed once
    inside; ``ladder``: a ``diagnostics.cost_accuracy`` frame, its section and ``cost_accuracy.csv``) and log each
    method's verdict with the first clause of its reason; returns the page's path."""
    spec = zoo.get(spec)
    folder = Path(out) / spec.name / (section or "")
    page = Path(report(spec.name, dict(trees), folder, data_note=data_note, ladder=ladder,
                       index_link="../../index.html" if section else "../index.html"))
    summary = json.loads((page.parent / SUMMARY).read_text())
    where = f"{spec.name}/{section}" if section else spec.name
    for line in verdict_lines(summary.get("methods", {}), summary.get("reference_health"), where=where):
        log(f"  {line}")
    return page


@with_explained_warnings
def compare_model(spec: zoo.ModelSpec | str, methods: Sequence[str] | None, out: Path, *, seed: int = 0,
                  fresh: bool = False, progress: bool | None = None, ladder: bool = False, log: Log = print) -> Path:
    """``run_comparison`` then ``write_comparison``; ``methods`` None: every method of the model
    (``inference.methods_for``). ``ladder``: every method also on its default ladder of budgets
    (``ladder_of``), the page's section "Accuracy against compute". Returns the report page's path."""
    spec = zoo.get(spec)
    chosen = list(methods) if methods else inference.methods_for(spec)
    trees = run_comparison(spec, chosen, out, seed=seed, fresh=fresh, progress=progress, log=log)
    frame = ladder_of(spec, chosen, Path(out) / spec.name, fresh=fresh, progress=progress, log=log) if ladder else None
    return write_comparison(spec, trees, out, ladder=frame, log=log)


def ladder_of(spec: zoo.ModelSpec, methods: Sequence[str], folder: Path, *, data: Any = None,
              reference: xr.DataTree | None = None, options: Mapping[str, Mapping[str, Any]] | None = None,
              fresh: bool = False, progress: bool | None = None, log: Log = print):
    """``diagnostics.cost_accuracy`` of ``methods`` on their default ladders (``data``/``reference`` None: the
    stored reference and its data), or the frame an earlier run wrote to ``folder/cost_accuracy.csv`` when it
    holds exactly these methods and ladders and the reference's data (unless ``fresh``)."""
    import pandas as pd

    path, marker = Path(folder) / CSV, Path(folder) / f"{CSV}.data"   # the marker: which data the ladders ran on
    stamp = references.data_checksum(spec, data) if data is not None else "the stored reference's data"
    if path.is_file() and not fresh:
        old = pd.read_csv(path)
        same = (list(old["method"].drop_duplicates()) == list(methods)
                and all(sorted(old.loc[old["method"] == m, "budget"].unique()) == default_budgets(spec, m)
                        for m in methods)
                and marker.is_file() and marker.read_text() == stamp)
        if same:
            log(f"  {spec.name}: reusing the ladders of {path}")
            old.attrs["model"] = spec.name
            return old
    log(f"  {spec.name}: accuracy against compute, every method on its ladder of budgets")
    frame = cost_accuracy(spec, data, list(methods), reference=reference, options=options, progress=progress,
                          log=log)
    path.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(stamp)     # the frame itself is written beside the page by the report
    return frame


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What ``compare`` did: the report page, each method's verdict, the reference, and wall seconds of the
    reference, the method fits and the whole call; ``reasons`` (method -> the verdict's reasons) and
    ``reference_health`` (its health record) as the page has them. Its ``repr`` is the verdict list, one line per
    method, as ``zoo compare`` prints it."""

    page: Path
    verdicts: dict[str, str]
    reference: OwnReference
    seconds: dict[str, float]
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)
    reference_health: dict = dataclasses.field(default_factory=dict)

    def lines(self) -> list[str]:
        """The verdict lines (``diagnostics.report_pages.verdict_lines``) and where the page is."""
        methods = {m: {"verdict": v, "reasons": self.reasons.get(m, "")} for m, v in self.verdicts.items()}
        return verdict_lines(methods, self.reference_health) + [f"report: {self.page}"]

    def __repr__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        import html

        return "<pre>" + html.escape(repr(self)) + "</pre>"


def run_plan(plan: ComparisonPlan, out: str | os.PathLike, *, section: str | None = None,
             data_note: str | None = None, crosscheck: Any = True, cache_dir: str | os.PathLike | None = None,
             fresh: bool = False, fresh_reference: bool = False, make_reference: bool = True,
             stored_tags: Sequence[str] | None = None, reference_budget: float | None = DEFAULT_REFERENCE_BUDGET,
             ladder: bool = False, progress: bool | None = None, log: Log = print) -> Comparison:
    """Run a planned comparison: the reference (``own_reference`` with the plan's samplers and
    ``reference_budget``; ``make_reference`` False: only a stored or cached one, else ``NoReference`` before any
    fit), the methods (each tree in ``out/<model>[/<section>]/``, reused on a rerun unless ``fresh``) and the
    report there (``write_comparison``); ``ladder``: every method also on its ladder of budgets against that
    reference (``ladder_of``), the page's section "Accuracy against compute"."""
    t_start = time.time()
    spec = plan.spec
    n_rows = len(next(iter(plan.data.values())))
    log(f"{spec.name}{f'/{section}' if section else ''}: {n_rows} rows; methods {', '.join(plan.prepared)}")
    ref = own_reference(spec, plan.data, settings=plan.settings, seed=plan.seed, crosscheck=crosscheck,
                        cache_dir=cache_dir, fresh=fresh_reference, stored=not plan.own_settings,
                        stored_tags=stored_tags, make=make_reference, samplers=plan.samplers or None,
                        budget=reference_budget, progress=progress, log=log)
    t_methods = time.time()
    trees = fit_prepared_methods(spec, plan.prepared, plan.options, Path(out) / spec.name / (section or ""),
                                 seed=plan.seed, fresh=fresh, log=log)
    seconds = {"reference": ref.seconds, "methods": time.time() - t_methods}
    frame = None
    if ladder:
        opts = {m: {k: v for k, v in o.items() if k not in spec.hyperparameters
                    and k not in (budget_option(spec, m)[0], "tol", "progress")} for m, o in plan.options.items()}
        frame = ladder_of(spec, list(plan.prepared), Path(out) / spec.name / (section or ""), data=plan.data,
                          reference=ref.tree, options=opts, fresh=fresh, progress=progress, log=log)
        seconds["ladder"] = time.time() - t_methods - seconds["methods"]
    page = write_comparison(spec, {ref.label: ref.tree, **trees}, Path(out), section=section, data_note=data_note,
                            ladder=frame, log=log)
    summary = json.loads((page.parent / SUMMARY).read_text())
    seconds["total"] = time.time() - t_start
    return Comparison(page=page, verdicts={m: v["verdict"] for m, v in summary.get("methods", {}).items()},
                      reference=ref, seconds=seconds,
                      reasons={m: v["reasons"] for m, v in summary.get("methods", {}).items()},
                      reference_health=summary.get("reference_health") or {})


@with_explained_warnings
def compare(model: zoo.ModelSpec | str, data: Any, methods: Sequence[str] | None = None, *,
            out: str | os.PathLike = "zoo-compare", columns: Mapping[str, Any] | None = None, dropna: bool = False,
            seed: int = 0, hyper: Mapping[str, Any] | None = None,
            options: Mapping[str, Mapping[str, Any]] | None = None, reference: Mapping[str, Any] | None = None,
            reference_method: str | None = None, reference_budget: float | None = DEFAULT_REFERENCE_BUDGET,
            crosscheck: Any = True, cache_dir: str | os.PathLike | None = None, fresh: bool = False,
            fresh_reference: bool = False, ladder: bool = False, progress: bool | None = None,
            log: Log = print) -> Comparison:
    """Compare ``methods`` with MCMC on your own data: a reference on ``data`` by the model's best exact sampler
    (``own_reference``: a stored reference of the same data and hyperparameters serves as it is, else the model's
    ``reference_samplers`` are tried in order, the first healthy one cross-checked against the others, and
    cached), every method fitted on the same data, and the report of ``zoo compare`` written to
    ``out/<model>/report.html`` with a verdict per method (NOT JUDGED, with the samplers tried and what to try,
    when no exact sampler makes a healthy reference; a sampler that has not mixed is NOT CONVERGED either way).

    Every argument, method and option is checked before anything runs (``ValueError`` naming it).

    Parameters
    ----------
    model, data:
        a model name and a pandas DataFrame (read with ``columns``/``dropna``, as ``inference.fit``)
        or a dict of arrays.
    methods:
        default: every method of the model.
    hyper:
        hyperparameters, the same for the reference and every method; unset ones are the model's
        defaults (``zoo show MODEL``), as for ``inference.fit``.
    options:
        per-method options (no hyperparameters) over the model's ``demo_options``:
        ``{"gibbs": {"num_samples": 4000}}``.
    reference:
        options of the reference sampler: NUTS options over ``references.reference_settings`` (4
        chains, ...), or with ``reference_method`` that method's options over its declared ones; given,
        a reference is made with exactly these (no stored reference serves).
    reference_method:
        an exact sampler of the model (kind "sampler") that alone makes the reference, instead of
        the model's ``reference_samplers`` in order (the others still cross-check it).
    reference_budget:
        seconds each reference sampler's runs may take while a run short of the health rule only
        for want of draws is run longer (``references.generate``); None: judged once at its length.
    crosscheck:
        True: the other reference samplers cross-check the reference where healthy; None: none.
    cache_dir:
        where references are cached (``default_cache_dir()``); ``fresh_reference`` remakes it,
        ``fresh`` refits the methods.
    ladder:
        also run every method on its ladder of budgets against the reference
        (``diagnostics.cost_accuracy``): ``cost_accuracy.csv`` and the page's section "Accuracy against
        compute".
    progress:
        progress bars of the fits; None (default): only when stderr is a terminal.
    """
    if reference_budget is not None and (isinstance(reference_budget, bool) or
                                         not isinstance(reference_budget, int | float) or not reference_budget >= 0):
        raise ValueError(f"reference_budget: expected seconds >= 0 or None, got {reference_budget!r}")
    plan = plan_comparison(model, data, methods, columns=columns, dropna=dropna, seed=seed, hyper=hyper,
                           options=options, reference=reference, reference_method=reference_method,
                           progress=progress)
    return run_plan(plan, out, crosscheck=crosscheck, cache_dir=cache_dir, fresh=fresh,
                    fresh_reference=fresh_reference, reference_budget=reference_budget, ladder=ladder,
                    progress=progress, log=log)


def compare_real_data(spec: zoo.ModelSpec | str, out: str | os.PathLike, *, seed: int = 0, fresh: bool = False,
                      progress: bool | None = None, log: Log = print) -> dict[str, Path]:
    """The demo's real-data sections of ``spec`` (``diagnostics.realdata.real_sections``: one per demo dataset
    with a stored reference), each through the own-data pipeline: ``real_methods`` fitted on the reference's
    stored arrays with its hyperparameters, the stored ``real_<dataset>`` reference serving as the reference
    (never a NUTS run: a stored reference that no longer matches skips the section and says so), each tree in
    ``out/<model>/real_<dataset>/`` reused on a rerun (unless ``fresh``), one report page there. Returns
    ``{dataset: page}``."""
    spec = zoo.get(spec)
    pages = {}
    for section in real_sections(spec, log=log):
        plan = plan_comparison(spec, section.data, real_methods(spec), seed=seed, hyper=section.hyper,
                               options=section.options, progress=progress)
        try:
            result = run_plan(plan, out, section=section.tag, data_note=section.note, fresh=fresh,
                              make_reference=False, stored_tags=[section.tag], progress=progress, log=log)
        except NoReference:
            log(f"  {spec.name}/real data {section.dataset}: the stored reference "
                f"{references.reference_path(spec.name, section.tag).name} was made with other hyperparameters or "
                f"data than the dataset now declares; section skipped (make references MODELS={spec.name})")
            continue
        pages[section.dataset] = result.page
    return pages


def prior_sites_of(spec: zoo.ModelSpec, data: Mapping[str, Any], hyper: Mapping[str, Any]) -> list[str]:
    """The prior sites of ``spec``'s model on validated ``data`` (the ``log_prior`` variables of its trees: every
    sample site that is not a likelihood site), found by tracing the model abstractly (``jax.eval_shape``:
    nothing compiles)."""
    import jax

    from inference.trees import trace_model

    names: list[str] = []

    def sites():
        trace = trace_model(spec, spec.inputs(dict(data), dict(hyper)))
        names.extend(n for n, s in trace.items() if s["type"] == "sample" and n not in spec.likelihood_sites)
        return 0

    jax.eval_shape(sites)
    return names


@with_explained_warnings
def sensitivity_report(model: zoo.ModelSpec | str, data: Any, method: str = "nuts", *,
                       out: str | os.PathLike = "zoo-sensitivity", prior_sites: Sequence[str] | None = None,
                       columns: Mapping[str, Any] | None = None, dropna: bool = False, seed: int = 0,
                       hyper: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
                       fresh: bool = False, progress: bool | None = None, log: Log = print) -> Path:
    """Prior sensitivity on your own data: fit ``method`` (its ``demo_options`` without their hyperparameters,
    then ``hyper`` and ``options``; unset hyperparameters are the model's defaults, as for ``inference.fit``) on
    ``data`` (a DataFrame read with ``columns``/``dropna``, or a dict) and write the power-scaling
    page ``out/<model>/sensitivity/sensitivity.html`` (``diagnostics.report_pages.sensitivity_page``: table, plots,
    Pareto k-hat flags). ``prior_sites`` scales only those prior sites (selective power-scaling). The fit is
    saved beside the page and reused by a rerun with the same data and options (unless ``fresh``). Every
    argument is checked before the fit (``ValueError`` naming it). Returns the page's path."""
    spec = zoo.get(model)
    for key in hyper or {}:
        if key not in spec.hyperparameters:
            raise ValueError(f"hyper: {key!r} is not a hyperparameter of {spec.name!r} "
                             f"(hyperparameters: {sorted(spec.hyperparameters)})")
    opts = method_options(spec, method, hyper or {}, options)
    given = {k: v for k, v in opts.items() if k in spec.hyperparameters}
    if prior_sites is not None:                 # checked on the validated data before prepare makes any key
        _, _, model_hyper, _ = resolve(spec, method, opts)
        known = prior_sites_of(spec, read_data(spec, data, columns, dropna).data, model_hyper)
        bad = [p for p in prior_sites if p not in known]
        if bad or not prior_sites:
            raise ValueError(f"prior_sites: {bad or 'an empty list'} not among the prior sites of {spec.name!r} "
                             f"({known})")
    prepared = hyper_advice(spec, given, lambda: inference.prepare(
        spec, data, method, seed=seed, columns=columns, dropna=dropna, progress=progress, **opts))
    folder = Path(out) / spec.name / "sensitivity"
    tree = fit_prepared_methods(spec, {method: prepared}, {method: opts}, folder, seed=seed, fresh=fresh,
                                log=log)[method]
    page = sensitivity_page(tree, folder, label=method, prior_sites=list(prior_sites) if prior_sites else None)
    summary = json.loads((folder / "sensitivity.json").read_text())
    if summary.get("failed"):
        log(f"  {spec.name}/{method}: the sensitivity check failed (see {page})")
    else:
        flagged = summary["flagged"]
        khat = max(summary["khat_prior"], summary["khat_likelihood"])
        log(f"  {spec.name}/{method}: " + (f"{len(flagged)} prior-sensitive quantities: {', '.join(flagged[:8])}"
                                           if flagged else "no quantity is prior-sensitive")
            + ("" if summary["reliable"] else f" (UNRELIABLE: Pareto k-hat {khat:.2f} > 0.7)"))
    return page
