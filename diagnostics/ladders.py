"""Accuracy against compute: each method run on a ladder of budgets and scored against one MCMC reference.

``cost_accuracy(model, data, methods)`` fits every method at every budget of its ladder (and every seed), and
scores each fit against the reference with the scorecard's own metrics (``diagnostics.scoring``: nothing is
re-implemented here). One row per (method, budget, seed):

* ``budget`` in the method's own unit (``budget_unit``), set through ``budget_option``:
  draws per chain (``num_samples``) for the samplers (NUTS, the Gibbs kernels; warm-up stays at the comparison's
  setting), steps (``num_steps``) for SVI, iterations or rounds (``max_iter``) for VB-EM, EM and ADMM;
* ``compile_seconds`` and ``run_seconds`` apart (the fit tree's attributes, ``inference._timing``), and
  ``xla_programs``: the XLA programs built (compiled or read from the persistent cache) during the fit, so a
  ladder's compile count is the column's sum;
* ``max_std_mean_error`` (worst |E_q - E_ref| / sd_ref), ``max_abs_log_sd_ratio`` (worst |log(sd_q / sd_ref)|; NaN
  for a point estimate, which has no spread), ``mean_w1_sd`` (mean 1-D W1 in reference sd), ``khat`` (PSIS, where
  the method stores log q) and ``verdict`` at that budget, each as ``method_scores`` computes it on the
  quantities the reference does not hold constant;
* ``mc_error``: the run's Monte Carlo error of the mean difference on its worst quantity, in reference sd
  (max of the scorecard's ``mcse_mean_sd`` = sqrt(sd_ratio^2 / ESS_q + 1 / ESS_ref)): an exact sampler's worst
  mean error sits at a few times this, so the line it draws is the sampler's Monte Carlo floor at that budget;
  ``reference_mc_error``: the reference's own part of it (max mcse_mean / sd over its quantities), below which
  no method can be seen to improve.

**Budgets are the budget.** A method with a stopping rule (an option ``tol``) runs with the smallest positive
float as ``tol`` (``TOL_OFF``): the option's declared constraint is "positive", and at that value the rule
``|f_t - f_{t-1}| <= tol |f_t|`` fires only where the objective no longer changes at all in float64, i.e. at a
fixed point where further iterations would change nothing. ``n_iter`` records the steps actually run.

**Default ladders** (``default_budgets``): 6 budgets spaced geometrically, from "too short" to twice the
comparison's own setting ``d`` (the spec's ``demo_options`` over the method's defaults): samplers from d/16
(a factor 2 apart; at least ``MIN_DRAWS`` draws), optimisers from d/256 (a factor ~3.5 apart: they converge
within a few dozen iterations, and the first rungs must show them before that). Samplers run seeds 0 and 1 per
budget (the spread of the curve is their Monte Carlo noise), the others seed 0.

**Where an optimiser's error settles.** Its converged value is its error at its fixed point (``tol`` at
``TOL_OFF``, run until the rule fires), not at the comparison's fit: that fit's stopping rule watches the objective's
relative change, and along a nearly flat direction of the objective the iterates (and the compared quantities) move
on long after the change per step is below ``tol``. For a linear rate rho the distance left is about the step over
1 - rho. bpca's per-entry mean-field q(W) is such a case: its ELBO depends on the rotation of the latent space only
through the diagonal variances of q(W), so coordinate ascent turns the latent basis within the (already fixed)
subspace at a rate rho close to 1. The model then declares, per method, the budget by which the error has settled
(``ZooSettings.ladder_top``), and the ladder runs there (``default_budgets``).

``time_to_rule(frame)``: per method, the first budget at which every seed meets the method's rule (verdict PASS)
and its seconds, or "not within the ladder" with the error it plateaus at: a variational method stays biased,
which is the answer, not a failure. ``error_slope`` and ``plateau`` read the two shapes the curves should
have: a sampler's worst mean error falls as draws^-1/2; an optimiser's error stops changing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

import inference
import zoo
from diagnostics import references
from diagnostics.own_references import NoReference, own_reference
from diagnostics.planning import comparison_data, method_options, plan_comparison
from diagnostics.scoring import MEAN_TOL, PASS, first_clause, method_scores, scorecard
from diagnostics.view import ComparedView, compared_view

Log = Callable[[str], None]

TOL_OFF = sys.float_info.min  # the stopping rule's tol that never fires before a fixed point (module docstring)
LADDER_SIZE = 6
SAMPLER_SPAN = (1 / 16, 2.0)   # of the comparison's setting: draws per chain
OPTIMISER_SPAN = (1 / 256, 2.0)  # iterations, rounds, steps
MIN_DRAWS = 20                  # a sampler's shortest rung: R-hat and ESS need some draws per chain
SAMPLER_SEEDS = (0, 1)
OTHER_SEEDS = (0,)
PLATEAU_TOL = 0.10              # ``plateau``: within 10 % of the error at the largest budget
CSV = "cost_accuracy.csv"       # the frame, beside the report page

COLUMNS = ["model", "method", "kind", "budget", "budget_unit", "budget_option", "seed", "n_iter", "compile_seconds",
           "run_seconds", "xla_programs", "max_std_mean_error", "max_abs_log_sd_ratio", "mean_w1_sd", "khat",
           "mc_error", "reference_mc_error", "verdict", "reason"]

__all__ = ["COLUMNS", "TOL_OFF", "budget_option", "cost_accuracy", "default_budgets", "error_slope",
           "ladder_compile_count", "plateau", "score_fit", "time_to_rule"]


def budget_option(spec: zoo.ModelSpec | str, method: str) -> tuple[str, str]:
    """(option, unit) of ``method``'s budget: ``num_samples`` in draws per chain for a sampler, ``num_steps`` in
    steps for SVI, ``max_iter`` in iterations (rounds where the option says so: ADMM, the federated kernels)."""
    from inference._methods import get_method

    spec = zoo.get(spec)
    meth = get_method(spec, method)
    if meth.kind == "sampler":
        return "num_samples", "draws per chain"
    if "num_steps" in meth.declared:
        return "num_steps", "steps"
    if "max_iter" in meth.declared:
        return "max_iter", "rounds" if "round" in meth.declared["max_iter"].doc.lower() else "iterations"
    raise ValueError(f"methods: {method!r} of {spec.name!r} has no budget option (num_samples, num_steps or "
                     f"max_iter)")


def _setting(spec: zoo.ModelSpec, method: str, option: str) -> int:
    """The comparison's own value of ``option`` for ``method``: the spec's ``demo_options`` over the method's
    defaults and the spec's per-method overrides."""
    from inference._methods import get_method

    meth = get_method(spec, method)
    opts = {**meth.options, **spec.settings.method_options.get(method, {}), **method_options(spec, method, {})}
    return int(opts[option])


def default_budgets(spec: zoo.ModelSpec | str, method: str) -> list[int]:
    """The default ladder of ``method``: ``LADDER_SIZE`` budgets geometric over ``SAMPLER_SPAN`` (samplers) or
    ``OPTIMISER_SPAN`` (the others) times the comparison's own setting, rounded, distinct, increasing. An
    optimiser whose model declares a larger ``ladder_top`` (``ZooSettings``) runs from the same first rung up to it,
    with as many more rungs as keep them no further apart than the default's."""
    from inference._methods import get_method

    spec = zoo.get(spec)
    option, _ = budget_option(spec, method)
    d = _setting(spec, method, option)
    sampler = get_method(spec, method).kind == "sampler"
    lo, hi = SAMPLER_SPAN if sampler else OPTIMISER_SPAN
    low = max(d * lo, MIN_DRAWS if sampler else 2)
    high = max(d * hi, low * 2)
    size = LADDER_SIZE
    top = 0 if sampler else int(spec.settings.ladder_top.get(method, 0))
    if top > high:
        # the model declares where the method's error settles (``ZooSettings.ladder_top``): the ladder runs there,
        # its rungs no further apart than the default ladder's
        size = LADDER_SIZE + int(np.ceil((LADDER_SIZE - 1) * np.log(top / high) / np.log(hi / lo) - 1e-9))
        high = top
    return sorted({int(round(b)) for b in np.geomspace(low, high, size)})


def _check_methods(spec: zoo.ModelSpec, methods: Any) -> list[str]:
    offered = inference.methods_for(spec)
    if methods is None:
        return offered
    if isinstance(methods, str) or not isinstance(methods, Sequence) or not methods:
        raise ValueError(f"methods: expected a non-empty list of methods of {spec.name!r} ({offered}), got "
                         f"{methods!r}")
    bad = [m for m in methods if m not in offered]
    if bad:
        raise ValueError(f"methods: {bad} are not methods of {spec.name!r}; it has {offered}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods: {list(methods)} names a method twice")
    return list(methods)


def _check_budget_list(name: str, values: Any) -> list[int]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not len(values):
        raise ValueError(f"{name}: expected a non-empty list of positive integers, got {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise ValueError(f"{name}: expected positive integers, got {v!r}")
        out.append(int(v))
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: {out} names a budget twice")
    return sorted(out)


def _check_budgets(spec: zoo.ModelSpec, methods: list[str], budgets: Any) -> dict[str, list[int]]:
    """Every method's ladder: ``budgets`` None (the defaults), one list for every method, or a mapping method ->
    list (methods it leaves out get their default ladder)."""
    if budgets is None:
        return {m: default_budgets(spec, m) for m in methods}
    if isinstance(budgets, Mapping):
        bad = [k for k in budgets if k not in methods]
        if bad:
            raise ValueError(f"budgets: {bad} are not among the methods {methods}")
        return {m: _check_budget_list(f"budgets[{m!r}]", budgets[m]) if m in budgets else default_budgets(spec, m)
                for m in methods}
    ladder = _check_budget_list("budgets", budgets)
    return {m: ladder for m in methods}


def _check_seeds(seeds: Any) -> list[int] | None:
    if seeds is None:
        return None
    if isinstance(seeds, str | bytes) or not isinstance(seeds, Sequence) or not len(seeds):
        raise ValueError(f"seeds: expected a non-empty list of integer seeds, got {seeds!r}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 0:
            raise ValueError(f"seeds: expected non-negative integers, got {s!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: {list(seeds)} names a seed twice")
    return [int(s) for s in seeds]


def _reference_and_data(spec: zoo.ModelSpec, data: Any, reference: Any, columns, dropna
                        ) -> tuple[xr.DataTree, Any]:
    """(reference tree, data to fit): a given reference (its own stored data when ``data`` is None); without
    one, the stored reference of ``data`` (None: the comparison data, ``diagnostics.planning.comparison_data``),
    else a reference cached by ``diagnostics.compare`` on these data. ``ValueError`` naming ``reference`` when
    there is none (nothing is made here: a reference costs more than a ladder)."""
    from inference.trees import data_of

    if reference is not None:
        if isinstance(reference, ComparedView):
            reference = reference.tree
        if not isinstance(reference, xr.DataTree) or "posterior" not in reference.children:
            raise ValueError(f"reference: expected an ArviZ DataTree with a posterior (a stored or your own MCMC "
                             f"reference), got {type(reference).__name__}")
        if reference.attrs.get("model") not in (None, spec.name):
            raise ValueError(f"reference: it is a reference of {reference.attrs.get('model')!r}, not of "
                             f"{spec.name!r}")
        return reference, (data_of(reference) if data is None else data)
    if data is None:

        data, tag = comparison_data(spec)
        tree = references.load(spec.name, data, tag=tag) if tag is not None else None
        if tree is None:
            raise ValueError(f"reference: {spec.name!r} has no stored reference (make references MODELS="
                             f"{spec.name}); pass reference= a healthy MCMC run on your data")
        return tree, data

    plan = plan_comparison(spec, data, [inference.methods_for(spec)[0]], columns=columns, dropna=dropna)
    try:
        ref = own_reference(spec, plan.data, settings=plan.settings, seed=plan.seed,
                            samplers=plan.samplers or None, make=False, log=lambda _: None)
    except NoReference:
        raise ValueError(f"reference: no stored or cached reference of {spec.name!r} has these data; run "
                         f"diagnostics.compare({spec.name!r}, data) first (it makes one and caches it), or pass "
                         f"reference= a healthy MCMC run on these data") from None
    return ref.tree, data


def score_fit(reference: xr.DataTree | ComparedView, tree: xr.DataTree | ComparedView, label: str | None = None
              ) -> dict[str, Any]:
    """The accuracy columns of one fit against ``reference`` (module docstring), from ``scorecard`` and
    ``method_scores`` (without the joint metrics): ``max_std_mean_error``, ``max_abs_log_sd_ratio``,
    ``mean_w1_sd``, ``khat``, ``mc_error``, ``reference_mc_error``, ``verdict``, ``reason`` (its first clause),
    ``kind``, ``compile_seconds``, ``run_seconds``."""
    ref = reference if isinstance(reference, ComparedView) else compared_view(reference, name="reference")
    view = compared_view(tree, name=label)
    label = view.name
    card = scorecard(ref, {label: view}, warn=False)
    row = method_scores(ref, {label: view}, card=card, joint=False).iloc[0]
    live = card[card["sd_ref"] > card["floor"]]
    live = live if len(live) else card
    ratios = np.asarray(live["sd_ratio"], dtype=float)
    with np.errstate(divide="ignore"):
        log_ratio = (float(np.nanmax(np.abs(np.log(ratios)))) if view.kind != "point" and ratios.size
                     else float("nan"))
    stats = ref.stats.loc[[lab for lab in live["parameter"] if lab in ref.stats.index]]
    ref_mc = float((stats["mcse_mean"] / stats["sd"].where(stats["sd"] > 0)).max()) if len(stats) else float("nan")
    return {"kind": view.kind, "compile_seconds": float(row["compile_seconds"]),
            "run_seconds": float(row["run_seconds"]),
            "max_std_mean_error": float(row.get("max_std_mean_error", np.nan)), "max_abs_log_sd_ratio": log_ratio,
            "mean_w1_sd": float(row.get("mean_w1_sd", np.nan)), "khat": float(row["khat"]),
            "mc_error": float(live["mcse_mean_sd"].max()) if len(live) else float("nan"),
            "reference_mc_error": ref_mc, "verdict": row["verdict"],
            "reason": "" if row["verdict"] == PASS else first_clause(str(row["reasons"]), 200)}


def cost_accuracy(model: zoo.ModelSpec | str, data: Any = None, methods: Sequence[str] | None = None,
                  budgets: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
                  reference: xr.DataTree | None = None, seeds: Sequence[int] | None = None, *,
                  options: Mapping[str, Mapping[str, Any]] | None = None, columns: Mapping[str, Any] | None = None,
                  dropna: bool = False, progress: bool | None = None, log: Log = print) -> pd.DataFrame:
    """Fit every method of ``methods`` at every budget of its ladder and every seed, score each fit against the
    reference, and return the tidy frame of the module docstring (``COLUMNS``, one row per (method, budget,
    seed); attrs: ``model``, ``reference_mc_error``).

    Every method is fitted with the reference's hyperparameters. Every argument and every fit of the ladder is
    validated (``inference.prepare``) before the first one runs: a ``ValueError`` naming the argument, nothing
    compiled. Each fit logs one line (``log``).

    Parameters
    ----------
    model:
        a registered model name or ``ModelSpec``.
    data:
        the data to fit (a dict of arrays or a DataFrame read with ``columns``/``dropna``, as for
        ``inference.fit``); None: the reference's own data (the stored reference's when ``reference`` is
        None too, as ``zoo compare`` without --data).
    methods:
        default: every method of the model.
    budgets:
        None: each method's default ladder (``default_budgets``); a list of positive integers: the same
        ladder for every method, in each method's own unit; a mapping method -> list (the others default).
    reference:
        a healthy MCMC reference of ``data`` (a DataTree). None: the stored reference of these data, else
        one ``diagnostics.compare`` made and cached on them; without either, a ``ValueError``.
    seeds:
        the seeds of every (method, budget); None: 0 and 1 for samplers, 0 for the others.
    options:
        per-method options over the comparison's (``diagnostics.planning.method_options``: the spec's
        ``demo_options``), e.g. ``{"nuts": {"num_warmup": 200}}``; the budget option itself and ``tol``
        are set by the ladder.
    """
    from inference._methods import get_method
    from inference._timing import Stopwatch
    from inference.trees import problem_of

    spec = zoo.get(model)
    chosen = _check_methods(spec, methods)
    ladders = _check_budgets(spec, chosen, budgets)
    seed_list = _check_seeds(seeds)
    options = dict(options or {})
    for key, opts in options.items():
        if key not in chosen:
            raise ValueError(f"options: {key!r} is not one of the methods {chosen}")
        if not isinstance(opts, Mapping):
            raise ValueError(f"options[{key!r}]: expected a mapping of option names to values, got "
                             f"{type(opts).__name__}")
        fixed = [k for k in opts if k in (budget_option(spec, key)[0], "tol")]
        if fixed:
            raise ValueError(f"options[{key!r}]: {fixed} are set by the ladder (give budgets= instead)")
    ref_tree, fit_data = _reference_and_data(spec, data, reference, columns, dropna)
    hyper = problem_of(ref_tree)[2] if ref_tree.attrs.get("model") else spec.default_hyper
    plan = []
    for method in chosen:
        option, unit = budget_option(spec, method)
        kind = get_method(spec, method).kind
        base = method_options(spec, method, hyper, options.get(method))
        if "tol" in get_method(spec, method).declared:
            base["tol"] = TOL_OFF
        for budget in ladders[method]:
            for seed in seed_list or (SAMPLER_SEEDS if kind == "sampler" else OTHER_SEEDS):
                opts = {**base, option: budget}
                prepared = inference.prepare(spec, fit_data, method, seed=seed, columns=columns, dropna=dropna,
                                             progress=progress, **opts)
                plan.append((method, option, unit, budget, seed, prepared))
    ref_view = compared_view(ref_tree, name="reference")
    rows = []
    t0 = time.time()
    for i, (method, option, unit, budget, seed, prepared) in enumerate(plan, 1):
        with Stopwatch() as watch:
            tree = inference.fit_prepared(prepared)
        score = score_fit(ref_view, tree, method)
        rows.append({"model": spec.name, "method": method, "kind": score.pop("kind"), "budget": budget,
                     "budget_unit": unit, "budget_option": option, "seed": seed,
                     "n_iter": int(tree.attrs.get("n_iter", budget)), "xla_programs": len(watch.xla_compiles),
                     **score})
        r = rows[-1]
        log(f"  [{i}/{len(plan)}] {spec.name}/{method} {option}={budget} seed {seed}: run {r['run_seconds']:.2f} s "
            f"(compile {r['compile_seconds']:.2f} s, {r['xla_programs']} programs); worst mean error "
            f"{r['max_std_mean_error']:.3g} sd; {r['verdict']}")
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame.attrs["model"] = spec.name
    frame.attrs["reference_mc_error"] = float(frame["reference_mc_error"].max()) if len(frame) else float("nan")
    frame.attrs["seconds"] = time.time() - t0
    return frame


def _mean_by_budget(g: pd.DataFrame, column: str) -> pd.Series:
    return g.groupby("budget")[column].mean().sort_index()


def time_to_rule(frame: pd.DataFrame) -> pd.DataFrame:
    """Per method of a ``cost_accuracy`` frame: the first budget at which every seed's verdict is PASS
    (``reached``), with the mean run and compile seconds of its seeds there; else ``reached`` False and the
    error it plateaus at (``plateau_error``: the mean worst mean error at the largest budget, in reference sd)
    and the verdicts there, with the first clause of a failed one (``why_at_largest``). ``reading`` says it in
    words."""
    rows = []
    for method, g in frame.groupby("method", sort=False):
        unit = str(g["budget_unit"].iloc[0])
        per = g.groupby("budget")
        met = per["verdict"].apply(lambda v: bool((v == PASS).all())).sort_index()
        top = g[g["budget"] == g["budget"].max()]
        row = {"method": method, "kind": g["kind"].iloc[0], "budget_unit": unit,
               "plateau_error": float(top["max_std_mean_error"].mean()),
               "verdicts_at_largest": ", ".join(sorted(set(top["verdict"]))),
               "why_at_largest": next((str(r) for r in top.get("reason", ()) if isinstance(r, str) and r), "")}
        if met.any():
            b = int(met[met].index[0])
            at = g[g["budget"] == b]
            row.update({"reached": True, "budget": b, "run_seconds": float(at["run_seconds"].mean()),
                        "compile_seconds": float(at["compile_seconds"].mean()),
                        "reading": f"meets its rule at {b} {unit}, {float(at['run_seconds'].mean()):.3g} s run"})
        else:
            row.update({"reached": False, "budget": None, "run_seconds": float("nan"),
                        "compile_seconds": float("nan"),
                        "reading": (f"not within the ladder (up to {int(g['budget'].max())} {unit}): its worst mean "
                                    f"error stays at {row['plateau_error']:.3g} reference sd"
                                    + (" (within the 0.2 sd of the practical rule: another part of the rule fails)"
                                       if row["plateau_error"] <= MEAN_TOL else ""))})
        rows.append(row)
    return pd.DataFrame(rows, columns=["method", "kind", "reached", "budget", "budget_unit", "run_seconds",
                                       "compile_seconds", "plateau_error", "verdicts_at_largest", "why_at_largest",
                                       "reading"])


def error_slope(frame: pd.DataFrame, method: str, column: str = "max_std_mean_error") -> float:
    """Least-squares slope of log(``column``) on log(budget) over every row of ``method`` (every seed): -0.5 for
    an exact sampler whose error is Monte Carlo noise (error ~ draws^-1/2)."""
    g = frame[(frame["method"] == method) & (frame[column] > 0)]
    if g["budget"].nunique() < 2:
        raise ValueError(f"method: {method!r} has fewer than two budgets with a positive {column}")
    return float(np.polyfit(np.log(g["budget"].astype(float)), np.log(g[column].astype(float)), 1)[0])


def plateau(frame: pd.DataFrame, method: str, column: str = "max_std_mean_error", tol: float = PLATEAU_TOL
            ) -> int | None:
    """The first budget of ``method`` from which the (seed-averaged) ``column`` stays within ``tol`` (relative) of
    its value at the largest budget, that largest budget excluded; None when only the last rung is there (the
    error was still moving at the end of the ladder)."""
    m = _mean_by_budget(frame[frame["method"] == method], column)
    final = float(m.iloc[-1])
    close = np.abs(m.to_numpy() - final) <= tol * max(abs(final), 1e-12)
    first = len(close) - 1
    while first > 0 and close[first - 1]:
        first -= 1
    return int(m.index[first]) if first < len(close) - 1 else None


def ladder_compile_count(frame: pd.DataFrame) -> dict[str, int]:
    """XLA programs built over each method's ladder (the sum of ``xla_programs``)."""
    return {m: int(g["xla_programs"].sum()) for m, g in frame.groupby("method", sort=False)}
