"""The comparison pipeline behind ``zoo compare`` and ``zoo demo``: fit several methods of a model on the data
of its stored NUTS reference, reuse what an earlier run wrote, and write the report.

* ``comparison_data(spec)``: the arrays stored with the model's reference (so every comparison is scored
  against a stored, healthy NUTS run on any CPU), else the simulator's default data;
* ``run_comparison(spec, methods, out)``: every fit validated first (``inference.prepare``, nothing compiles
  before every method, option and the data passed), then each tree written to ``out/<model>/<method>.nc``;
  a tree written by an earlier run with the same seed, options and data is reused (an interrupted run
  resumes), an unreadable one (truncated by a crash) is refitted;
* ``write_comparison(spec, trees, out)``: the model's report page and one verdict line per method;
* ``compare_model`` (both), ``run_demo`` (every model and its real-data sections, then the index page);
* ``compare(model, data, methods)``: the same on **your own data** (a DataFrame or a dict): a NUTS reference
  on it (``own_reference``: a stored reference whose data and hyperparameters match serves as it is, else one
  is made to the stored references' standard and cached by the data; resumable, reused by a later call), then
  the methods and the report; an unhealthy reference makes every verdict NOT JUDGED, with what to try.
  ``plan_comparison`` (every check, nothing runs) and ``run_plan`` are its two halves;
* ``compare_real_data(spec, out)``: the demo's real-data sections (``diagnostics.realdata``) through that same
  pipeline, each served by its stored ``real_<dataset>`` reference and never by a new NUTS run.

Messages go to ``log`` (``print`` by default; the command line passes ``typer.echo``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

import inference
import zoo
from diagnostics import references
from diagnostics.realdata import real_methods, real_sections
from diagnostics.report_pages import SUMMARY, report, report_index, verdict_lines
from inference.api import read_data, resolve
from inference.progress import explained_warnings
from zoo._validation import validate_hyper

Log = Callable[[str], None]


def _explained(fn):
    """``fn`` run inside ``inference.progress.explained_warnings`` with its ``log``: warnings a user cannot act on
    are said once, with what they mean."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with explained_warnings(kwargs.get("log", print)):
            return fn(*args, **kwargs)
    return wrapper


def comparison_data(spec: zoo.ModelSpec) -> tuple[dict, str | None]:
    """(data, reference tag): the exact arrays stored with the model's reference (``default``, else its first
    stored tag, e.g. mppca's ``t11``); a model without a stored reference fits its simulator's default data."""
    if references.stored_tags(spec.name):
        return references.reference_data(spec.name)
    return spec.default_data()[0], None


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


def method_options(spec: zoo.ModelSpec, method: str, hyper: Mapping[str, Any],
                   options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The options ``method`` is fitted with in a comparison: the spec's ``demo_options`` of the method without
    their hyperparameters, then ``hyper`` (the one set every method and the reference share), then
    ``options``."""
    demo = {k: v for k, v in spec.demo_options.get(method, {}).items() if k not in spec.hyperparameters}
    return {**demo, **dict(hyper), **dict(options or {})}


def hyper_advice(spec: zoo.ModelSpec, given: Mapping[str, Any], call: Callable[[], Any]) -> Any:
    """``call()``; a ``ValueError`` that names a hyperparameter (``"q: expected ..."``, e.g. the model's check of
    it against the data) is raised again saying what to do: set another value with ``hyper={'q': VALUE}``
    (``--set q=VALUE`` on the command line), or, when it was set, leave it out for the model's default."""
    try:
        return call()
    except ValueError as exc:
        text = str(exc)
        name = text.split(":", 1)[0].strip()
        if name not in spec.hyperparameters or "hyper={" in text:
            raise
        h = spec.hyperparameters[name]
        what = (f"you set {name}={given[name]!r}; set another value" if name in given else
                f"the model's default is {h.default!r}; set a value that fits your data")
        tail = f", or leave {name} out for the model's default {h.default!r}" if name in given else ""
        raise ValueError(f"{text}. {name} is a hyperparameter ({h.doc}): {what} with hyper={{{name!r}: VALUE}} "
                         f"(command line: --set {name}=VALUE){tail}") from None


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


@_explained
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

    from diagnostics.ladders import CSV, cost_accuracy, default_budgets

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


@_explained
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
    from diagnostics import workers as pool

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
        log(f"{len(jobs)} fits and {len(specs)} models' pages in {workers} worker processes")
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


# --------------------------------------------------------------------------------------------------
# Your own data: a NUTS reference made (and cached) on it, then the same comparison
# --------------------------------------------------------------------------------------------------

OWN_REFERENCE_LABEL = "reference ({method} on your data)"
DEFAULT_REFERENCE_BUDGET = 600.0   # seconds a reference sampler's runs may take before its extension stops


def default_cache_dir() -> Path:
    """Where references made on users' data are cached: ``$BAYES_ZOO_CACHE/references``, default
    ``~/.cache/bayes-zoo/references``."""
    return Path(os.environ.get("BAYES_ZOO_CACHE", Path.home() / ".cache" / "bayes-zoo")) / "references"


class NoReference(LookupError):
    """``own_reference(..., make=False)`` found no stored or cached reference for the data (nothing was run)."""


@dataclasses.dataclass(frozen=True)
class OwnReference:
    """The reference of a comparison on given data: the tree, whether it passed the stored-reference standard,
    whether it was reused (no run now), its folder (the cache folder, or ``zoo/references`` for a stored one),
    the seconds spent making it now (0 when reused), when a stored reference served its tag, and the exact
    sampler that made it (``method``; its validation record, ``tree.attrs["validation"]``, holds the cross-checks
    and the samplers tried before it)."""

    tree: xr.DataTree
    healthy: bool
    reused: bool
    folder: Path
    seconds: float
    stored: str | None = None
    method: str = "nuts"

    @property
    def label(self) -> str:
        """The reference's label on the report page, naming the sampler that made it."""
        if self.stored:
            return f"reference (stored {self.method.upper() if self.method == 'nuts' else self.method}, {self.stored})"
        return OWN_REFERENCE_LABEL.format(method=self.method.upper() if self.method == "nuts" else self.method)


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


def reference_cache_key(spec: zoo.ModelSpec, data: Mapping[str, Any], settings: Mapping[str, Any], seed: int,
                        crosscheck: Any) -> str:
    """The cache key of a reference made on ``data``: sha256 of the model, the validated data arrays
    (``references.data_checksum``: the bytes a file was read into, never re-simulated), the NUTS settings and
    hyperparameters, the seed and the cross-check."""
    doc = {"model": spec.name, "data": references.data_checksum(spec, data), "settings": dict(settings),
           "seed": seed, "crosscheck": crosscheck}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=repr).encode()).hexdigest()[:20]


def _exact_samplers(spec: zoo.ModelSpec) -> list[str]:
    """The model's exact samplers (methods of kind ``"sampler"``), NUTS first."""
    from inference._methods import get_method

    return [m for m in inference.methods_for(spec) if get_method(spec, m).kind == "sampler"]


def check_reference_method(spec: zoo.ModelSpec, method: Any) -> None:
    """``ValueError`` naming ``reference_method`` unless ``method`` is one of the model's exact samplers."""
    exact = _exact_samplers(spec)
    if not isinstance(method, str) or method not in inference.methods_for(spec):
        raise ValueError(f"reference_method: {spec.name!r} has no method {method!r}; its exact samplers are {exact}")
    if method not in exact:
        raise ValueError(f"reference_method: {method!r} is not an exact sampler (it is an approximation, so it cannot "
                         f"be a reference); the exact samplers of {spec.name!r} are {exact}")


def reference_samplers(spec: zoo.ModelSpec, settings: Mapping[str, Any], method: str | None = None,
                       options: Mapping[str, Any] | None = None) -> list[tuple[str, dict]]:
    """The exact samplers a reference on the user's data is made with, in the order they are tried, each with its
    full options (``references.sampler_settings``, the hyperparameters of ``settings`` included): the model's
    ``reference_samplers`` (default NUTS alone), NUTS with ``settings``. ``method``: that sampler alone, with
    ``options`` over its declared ones (the others then only cross-check it). Every option is checked
    (``ValueError`` naming it), nothing runs."""
    hyper = {k: v for k, v in settings.items() if k in spec.hyperparameters}
    declared = [(m, dict(o)) for m, o in (spec.reference_samplers or (("nuts", {}),))]
    if method is not None:
        check_reference_method(spec, method)
        mine = next((o for m, o in declared if m == method), {})
        declared = [(method, {**mine, **dict(options or {})})] + [(m, o) for m, o in declared if m != method]
    plan = []
    for m, o in declared:
        opts = dict(settings) if m == "nuts" else references.sampler_settings(spec.name, m, **{**o, **hyper})
        resolve(spec, m, opts)
        plan.append((m, opts))
    return plan


def _more_advice(spec: zoo.ModelSpec, settings: Mapping[str, Any], tried: Sequence[Mapping[str, Any]] = (),
                 budget: float | None = None) -> list[str]:
    """What to try when no exact sampler made a healthy reference on the user's data, beyond
    ``references.advice``."""
    out = []
    at_budget = [t["method"] for t in tried if str(t.get("extension", "")).startswith("stopped at the budget")]
    if at_budget and budget is not None:
        out.append(f"a larger time budget for {', '.join(at_budget)}: reference_budget={4 * budget:.0f} (zoo compare "
                   f"--reference-budget {4 * budget:.0f}); the runs so far stay in the cache and are resumed")
    if any(t["method"] == "nuts" for t in tried):
        out.append(f"a longer run of NUTS: reference={{'num_warmup': {2 * settings['num_warmup']}, 'num_samples': "
                   f"{2 * settings['num_samples']}}} (zoo compare --reference num_samples="
                   f"{2 * settings['num_samples']})")
        if not settings.get("dense_mass"):
            out.append("a dense mass matrix for correlated posteriors: reference={'dense_mass': True} "
                       "(zoo compare --reference dense_mass=True)")
    untried = [m for m in _exact_samplers(spec) if m not in {t["method"] for t in tried}]
    if untried:
        out.append(f"another exact sampler of the model as the reference: reference_method={untried[0]!r} "
                   f"(zoo compare --reference-method {untried[0]}; exact samplers not tried: {', '.join(untried)})")
    return out


def _canonical(value: Any) -> Any:
    """``value`` as a validation record stores it (JSON, ``repr`` for the rest), so the two compare equal."""
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


def stored_reference(spec: zoo.ModelSpec | str, data: Mapping[str, Any], settings: Mapping[str, Any], *,
                     tags: Sequence[str] | None = None) -> tuple[xr.DataTree, str] | None:
    """``(tree, tag)`` of a stored reference (``zoo/references``; ``tags``, default every stored one) that is the
    reference of ``data`` under the hyperparameters of ``settings``: its record passed the standard, its
    hyperparameters (every one, defaults filled in) equal these, and its stored arrays are ``data``
    (``references.data_mismatch``: equal to 1e-12 relative). None when none is."""
    from inference.trees import data_of

    spec = zoo.get(spec)
    defaults = _canonical(spec.default_hyper)
    wanted = {**defaults, **_canonical({k: v for k, v in settings.items() if k in spec.hyperparameters})}
    for tag in references.stored_tags(spec.name) if tags is None else tags:
        path = references.reference_path(spec.name, tag)
        if not path.is_file():
            continue
        tree = inference.load(path)
        record = json.loads(tree.attrs.get("validation", "{}"))
        made = {k: v for k, v in record.get("settings", {}).items() if k in spec.hyperparameters}
        if record.get("reliable") and {**defaults, **made} == wanted and \
                references.data_mismatch(spec, data_of(tree), data) is None:
            return tree, tag
    return None


def own_reference(spec: zoo.ModelSpec | str, data: Mapping[str, Any], *, settings: Mapping[str, Any],
                  seed: int = 0, crosscheck: Any = True, cache_dir: str | os.PathLike | None = None,
                  fresh: bool = False, stored: bool = True, stored_tags: Sequence[str] | None = None,
                  make: bool = True, samplers: Sequence[tuple[str, Mapping[str, Any]]] | None = None,
                  budget: float | None = DEFAULT_REFERENCE_BUDGET, progress: bool | None = None,
                  log: Log = print) -> OwnReference:
    """The reference of ``spec`` on ``data`` (validated arrays), in this order:

    1. ``stored`` (unless ``fresh``): a stored reference of these data and hyperparameters (``stored_reference``,
       among ``stored_tags``) serves as it is: it was made to the standard below by ``make references``;
    2. the cache ``cache_dir/<model>/<reference_cache_key>/``: ``reference.nc`` when healthy,
       ``reference-unhealthy.nc`` (its validation record, failures and advice in ``attrs["validation"]``) when
       not, made by an earlier call with the same data and settings (``reused``; an unhealthy one whose
       extension stopped at a smaller ``budget`` than this one is resumed instead);
    3. ``make`` (else ``NoReference``, nothing run): made now to the stored references' standard
       (``references.generate``: health rule, second seed) by the exact samplers of ``samplers`` (default
       ``reference_samplers(spec, settings)``: the model's ``reference_samplers``, best first) in order: the first
       that meets the standard is the reference, cross-checked (``crosscheck`` True) against the others where
       their own runs are healthy; a sampler short only for want of draws is run longer within ``budget``
       seconds. Its record (``attrs["validation"]``) names the sampler (``method``), its cross-checks and the
       samplers tried before it (``tried``: method, failures, extension). When none is healthy, the first one's
       run is the (unhealthy) reference and its record lists every sampler tried and why each failed. Cached;
       an interrupted call resumes from the runs checkpointed in ``work/<method>/`` (each written atomically
       when it finishes). ``fresh``: remake it."""
    from inference.trees import data_of

    spec = zoo.get(spec)
    if stored and not fresh:
        found = stored_reference(spec, data, settings, tags=stored_tags)
        if found is not None:
            tree, tag = found
            record = json.loads(tree.attrs["validation"])
            log(f"reference: the stored NUTS reference {references.reference_path(spec.name, tag)} has these data "
                f"and hyperparameters; it serves (made by make references: {record['n_chains']} chains, "
                f"{record['n_draws']} draws, max R-hat {record['max_rhat']:.3f})")
            return OwnReference(tree, True, True, references.REFERENCE_DIR, 0.0, stored=tag,
                                method=record.get("method", "nuts"))
    plan = [(m, dict(o)) for m, o in samplers] if samplers is not None else reference_samplers(spec, settings)
    if crosscheck is True:
        cross_of = lambda method: [(m, o) for m, o in plan if m != method]  # noqa: E731
    else:
        fixed = references._crosschecks(spec, crosscheck)
        cross_of = lambda method: [(m, o) for m, o in fixed if m != method]  # noqa: E731
    key = reference_cache_key(spec, data, settings, seed, {"samplers": plan, "crosscheck": crosscheck})
    folder = Path(cache_dir or default_cache_dir()) / spec.name / key
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    for name, healthy in (("reference.nc", True), ("reference-unhealthy.nc", False)):
        path = folder / name
        if not path.is_file():
            continue
        try:
            tree = inference.load(path)
        except ValueError as err:
            log(f"reference: {path} is unreadable ({err}); making it again")
            path.unlink()
            continue
        record = json.loads(tree.attrs.get("validation", "{}"))
        if not healthy and _budget_was_short(record, budget):
            log(f"reference: the cached unhealthy reference stopped at a smaller time budget than {budget:.0f} s; "
                f"resuming its runs")
            path.unlink()
            continue
        if references.data_mismatch(spec, data_of(tree), data) is None:
            method = record.get("method", "nuts")
            made = float(tree.attrs.get("reference_seconds", tree.attrs.get("wall_seconds", float("nan"))))
            log(f"reference: reusing the cached {'healthy' if healthy else 'UNHEALTHY'} {method} reference {path} "
                f"(made in {made:.0f} s)")
            return OwnReference(tree, healthy, True, folder, 0.0, method=method)
    if not make:
        raise NoReference(f"no stored or cached NUTS reference of {spec.name!r} has these data and hyperparameters "
                          f"(make references MODELS={spec.name}, or diagnostics.compare on these data)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "key.json").write_text(json.dumps({"model": spec.name, "settings": dict(settings), "seed": seed,
                                                 "samplers": plan, "crosscheck": crosscheck}, indent=1, default=repr))
    t0 = time.time()
    tried: list[dict] = []
    first = None
    for i, (method, opts) in enumerate(plan, 1):
        unhealthy = {t["method"] for t in tried}
        others = [(m, o) for m, o in cross_of(method) if m not in unhealthy]
        log(f"reference: [{i}/{len(plan)}] {method} on your data"
            + (f", cross-checked against {', '.join(m for m, _ in others)} where healthy" if others else ""))
        try:
            tree = references.generate(spec.name, data, tag=f"yours-{key[:8]}", seed=seed,
                                       path=folder / "reference.nc", work=folder / "work" / method, progress=progress,
                                       log=log, crosscheck=others or None, method=method, budget=budget, **opts)
        except references.UnhealthyReference as exc:
            ext = (exc.record.get("extension") or {}).get("outcome", "")
            tried.append({"method": method, "failures": list(exc.record["failures"]), "extension": ext})
            log(f"reference: {method} NOT healthy ({'; '.join(exc.record['failures'])}); extension: {ext}")
            first = first or (exc.tree, exc.record)
            if all(f.startswith("cross-check ") for f in exc.record["failures"]):
                # its own runs were healthy and a healthy exact sampler disagrees: one of the two misses part of
                # the posterior, and neither can say which, so no other sampler is taken in its place
                log(f"reference: {method} and its cross-check disagree; no sampler is trusted over the other")
                break
            continue
        record = {**json.loads(tree.attrs["validation"]), "tried": tried}
        tree.attrs.update({"validation": json.dumps(record, default=repr), "reference_seconds": time.time() - t0})
        inference.save(tree, folder / "reference.nc")
        shutil.rmtree(folder / "work", ignore_errors=True)
        log("reference: healthy; " + "; ".join(references.provenance(record)))
        return OwnReference(tree, True, False, folder, time.time() - t0, method=method)
    tree, record = first
    shown = tried[0]["method"]
    record = {**record, "tried": tried, "failures": [
        f"no exact sampler met the health rule (tried {', '.join(t['method'] for t in tried)}; the reference shown is "
        f"{shown}'s run)", *tried[0]["failures"], *[f"{t['method']}: {f}" for t in tried[1:] for f in t["failures"]]]}
    record["advice"] = list(record.get("advice", [])) + _more_advice(spec, settings, tried, budget)
    tree.attrs.update({"validation": json.dumps(record, default=repr), "reliable": 0,
                       "reference_seconds": time.time() - t0})
    inference.save(tree, folder / "reference-unhealthy.nc")
    if not any(t["extension"].startswith("stopped at the budget") for t in tried):
        shutil.rmtree(folder / "work", ignore_errors=True)   # kept when a larger budget could resume it
    log(f"reference: NOT healthy with any exact sampler ({'; '.join(record['failures'])}); nothing is judged "
        f"against it (a sampler that has not mixed is still NOT CONVERGED)")
    return OwnReference(tree, False, False, folder, time.time() - t0, method=plan[0][0])


def _budget_was_short(record: Mapping[str, Any], budget: float | None) -> bool:
    """Whether an unhealthy reference's record has a sampler whose extension stopped at a budget smaller than
    ``budget`` (then a call with this budget resumes it instead of reusing the refusal)."""
    recorded = (record.get("extension") or {}).get("budget")
    stopped = any(str(t.get("extension", "")).startswith("stopped at the budget") for t in record.get("tried", []))
    return bool(stopped and budget is not None and (recorded is None or budget > recorded))


@dataclasses.dataclass(frozen=True)
class ComparisonPlan:
    """A checked comparison, nothing run yet (``plan_comparison``): the model, the validated data arrays, the
    reference's NUTS settings and the hyperparameters given (``settings``; the others are the model's defaults),
    whether the caller chose reference settings or a reference sampler of its own (then no stored reference
    serves), each method's options and its prepared fit, the seed, and the exact samplers the reference is made
    with, in the order tried (``reference_samplers``)."""

    spec: zoo.ModelSpec
    data: dict
    settings: dict
    own_settings: bool
    options: dict[str, dict]
    prepared: dict[str, inference.Prepared]
    seed: int
    samplers: tuple[tuple[str, dict], ...] = ()


def plan_comparison(model: zoo.ModelSpec | str, data: Any, methods: Sequence[str] | None = None, *,
                    columns: Mapping[str, Any] | None = None, dropna: bool = False, seed: int = 0,
                    hyper: Mapping[str, Any] | None = None, options: Mapping[str, Mapping[str, Any]] | None = None,
                    reference: Mapping[str, Any] | None = None, reference_method: str | None = None,
                    progress: bool | None = None) -> ComparisonPlan:
    """Every check of ``compare`` (its arguments, see there), nothing run: ``ValueError`` naming the first bad
    argument, method, option or column.

    One set of hyperparameters serves the reference and every method: the model's ``Hyper`` defaults (presets
    applied, ``zoo._validation.validate_hyper``) under ``hyper``, exactly what ``inference.fit`` uses on these
    data; a default the model derives from the data (ppca's ``q=None``: d - 1) is derived by the model in every
    fit alike. The reference's NUTS options are ``references.reference_settings`` under ``reference``; each
    method's options (``method_options``) its ``demo_options`` without their hyperparameters, the hyperparameters,
    then ``options[method]``. A stored reference serves only when its data and hyperparameters are these
    (``stored_reference``)."""
    spec = zoo.get(model)
    chosen = list(methods) if methods else inference.methods_for(spec)
    hyper, options, reference = dict(hyper or {}), dict(options or {}), dict(reference or {})
    for key in hyper:
        if key not in spec.hyperparameters:
            raise ValueError(f"hyper: {key!r} is not a hyperparameter of {spec.name!r} "
                             f"(hyperparameters: {sorted(spec.hyperparameters)})")
    for key in reference:
        if key in spec.hyperparameters:
            raise ValueError(f"reference: {key!r} is a hyperparameter; give it in hyper=, which the reference and "
                             f"every method share")
    for key, opts in options.items():
        if key not in chosen:
            raise ValueError(f"options: {key!r} is not one of the compared methods {chosen}")
        shared = sorted(k for k in opts if k in spec.hyperparameters)
        if shared:
            raise ValueError(f"options: {shared} of {key!r} are hyperparameters; give them in hyper=, which the "
                             f"reference and every method share")
    if reference_method is not None:
        check_reference_method(spec, reference_method)
    model_hyper = validate_hyper(spec, hyper)             # the defaults of inference.fit, under the given ones
    table = read_data(spec, data, columns, dropna)
    nuts_options = reference if reference_method in (None, "nuts") else {}
    settings = references.reference_settings(spec.name, **nuts_options, **hyper)   # the rest: the defaults
    resolve(spec, "nuts", settings)                       # the reference's options, checked before any run
    samplers = reference_samplers(spec, settings, reference_method,
                                  reference if reference_method not in (None, "nuts") else None)
    per_method = {m: method_options(spec, m, model_hyper, options.get(m)) for m in chosen}
    prepared = {m: hyper_advice(spec, hyper, lambda m=m: inference.prepare(
        spec, data, m, seed=seed, columns=columns, dropna=dropna, progress=progress, **per_method[m]))
        for m in chosen}
    own = bool(reference) or reference_method not in (None, "nuts")
    return ComparisonPlan(spec, table.data, settings, own, per_method, prepared, seed, tuple(samplers))


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
        from diagnostics.ladders import budget_option

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


@_explained
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

    Parameters
    ----------
    model, data:   a model name and a pandas DataFrame (read with ``columns``/``dropna``, as ``inference.fit``)
                   or a dict of arrays.
    methods:       default: every method of the model.
    hyper:         hyperparameters, the same for the reference and every method; unset ones are the model's
                   defaults (``zoo show MODEL``), as for ``inference.fit``.
    options:       per-method options (no hyperparameters) over the model's ``demo_options``:
                   ``{"gibbs": {"num_samples": 4000}}``.
    reference:     options of the reference sampler: NUTS options over ``references.reference_settings`` (4
                   chains, ...), or with ``reference_method`` that method's options over its declared ones; given,
                   a reference is made with exactly these (no stored reference serves).
    reference_method: an exact sampler of the model (kind "sampler") that alone makes the reference, instead of
                   the model's ``reference_samplers`` in order (the others still cross-check it).
    reference_budget: seconds each reference sampler's runs may take while a run short of the health rule only
                   for want of draws is run longer (``references.generate``); None: judged once at its length.
    crosscheck:    True: the other reference samplers cross-check the reference where healthy; None: none.
    cache_dir:     where references are cached (``default_cache_dir()``); ``fresh_reference`` remakes it,
                   ``fresh`` refits the methods.
    ladder:        also run every method on its ladder of budgets against the reference
                   (``diagnostics.cost_accuracy``): ``cost_accuracy.csv`` and the page's section "Accuracy against
                   compute".
    progress:      progress bars of the fits; None (default): only when stderr is a terminal.

    Every argument, method and option is checked before anything runs (``ValueError`` naming it).
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


# --------------------------------------------------------------------------------------------------
# Prior sensitivity on your own data
# --------------------------------------------------------------------------------------------------

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


@_explained
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
    from diagnostics.report_pages import sensitivity_page

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
