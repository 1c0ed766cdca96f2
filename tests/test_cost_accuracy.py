"""Accuracy against compute (issue 31): ``diagnostics.cost_accuracy``, its metric path checked against known
answers on synthetic trees (independent of every kernel), its ladders run end to end on a cheap model, and
``zoo compare --ladder`` through the command line.

The oracles:

* exact iid draws from a known Gaussian "reference": the worst standardised mean error of N draws is
  max_i |Z_i| / sqrt(N) in distribution (Z_i standard normal), so log error against log N has slope -0.5;
* a mean-field Gaussian q of a correlated Gaussian p = N(mu, Sigma) (the KL(q||p) optimum: means exact,
  variances 1/Lambda_ii, Lambda = Sigma^-1), reached by coordinate ascent on the means from a wrong start:
  its mean error falls to Monte Carlo noise while its sd ratio sits at the analytic sqrt(1/Lambda_ii) /
  sqrt(Sigma_ii) from the first step on, so the error plateaus there and the method never meets its rule.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from diagnostics.ladders import (
    COLUMNS,
    budget_option,
    cost_accuracy,
    default_budgets,
    error_slope,
    plateau,
    score_fit,
    time_to_rule,
)
from diagnostics.scoring import FAIL, PASS
from diagnostics.view import compared_view

MU = np.array([1.0, -2.0, 0.5])
SIGMA = np.array([[1.0, 0.8, 0.3], [0.8, 2.0, -0.4], [0.3, -0.4, 0.5]])


def _tree(theta: np.ndarray, log_q: np.ndarray | None = None) -> xr.DataTree:
    """A hand-made fit tree: posterior ``theta`` (chain, draw, 3); with ``log_q``, a variational one (log q, and
    log p(theta) as its log prior, the log likelihood 0, so that k-hat has log p(theta, y))."""
    groups = {"posterior": xr.Dataset({"theta": (("chain", "draw", "k"), theta)})}
    if log_q is not None:
        lam = np.linalg.inv(SIGMA)
        dev = theta - MU
        log_p = -0.5 * np.einsum("cdi,ij,cdj->cd", dev, lam, dev) - 0.5 * np.linalg.slogdet(2 * np.pi * SIGMA)[1]
        groups["sample_stats"] = xr.Dataset({"log_q": (("chain", "draw"), log_q)})
        groups["log_prior"] = xr.Dataset({"theta": (("chain", "draw"), log_p)})
        groups["log_likelihood"] = xr.Dataset({"y": (("chain", "draw"), np.zeros_like(log_p))})
    return xr.DataTree.from_dict(groups)


@pytest.fixture(scope="module")
def reference() -> xr.DataTree:
    """iid draws of N(MU, SIGMA), 4 chains x 5000, whitened and recoloured so that their sample mean is MU and
    their sample covariance SIGMA exactly: a healthy reference with no error of its own in the first two moments,
    so a candidate's mean error is its own alone (however many draws it has)."""
    rng = np.random.default_rng(20261127)
    x = rng.standard_normal((20_000, 3))
    x -= x.mean(0)
    x = x @ np.linalg.inv(np.linalg.cholesky(np.cov(x, rowvar=False))).T @ np.linalg.cholesky(SIGMA).T
    return _tree((x + MU).reshape(4, 5000, 3))


def test_iid_draws_worst_mean_error_falls_as_one_over_sqrt_draws(reference):
    """8 independent ladders of exact iid draws (2 chains x N per chain, N = 50 ... 3200): the slope of log worst
    mean error on log N, fitted per ladder, averages -0.5 within 3 standard errors of that average (the spread of
    the 8 slopes, ~0.04). An error that did not fall with the draws (a bias, an sd, a fixed subsample) has slope
    0, one of the sd instead of the mean -0.5 too but not at this size (checked below against the Monte Carlo
    error), a variance-like one -1: each is many standard errors away."""
    ref = compared_view(reference, name="reference")
    budgets = [50, 200, 800, 3200]
    slopes, rows = [], []
    for rep in range(8):
        rng = np.random.default_rng(rep)
        for n in budgets:
            row = score_fit(ref, _tree(rng.multivariate_normal(MU, SIGMA, size=(2, n))), "iid")
            assert row["kind"] == "sampler"
            rows.append({"method": f"iid{rep}", "budget": n, **row})
        slopes.append(error_slope(pd.DataFrame(rows), f"iid{rep}"))
    slopes = np.array(slopes)
    se = slopes.std(ddof=1) / np.sqrt(len(slopes))
    assert abs(slopes.mean() + 0.5) < 3 * se, (slopes.mean(), se)
    assert se < 0.06
    frame = pd.DataFrame(rows)
    # an exact sampler's error tracks its Monte Carlo error: a few mcse at most on the worst of 3 quantities
    ratio = frame["max_std_mean_error"] / frame["mc_error"]
    assert ratio.median() < 2.0 and ratio.max() < 5.0
    assert (frame["reference_mc_error"] < 0.01).all()  # estimated from its ESS, ~1 / sqrt(20 000)
    # and it meets the MCSE rule at every budget that has the draws for R-hat and ESS (>= 400 per chain)
    assert (frame.loc[frame["budget"] >= 800, "verdict"] == PASS).mean() > 0.9


def test_mean_field_gaussian_plateaus_at_its_analytic_sd_error_and_never_meets_the_rule(reference):
    """Coordinate ascent on the mean-field means from 3 sd off: the worst |log sd ratio| equals the analytic
    max_i |log sqrt(1 / (Lambda_ii Sigma_ii))| (0.868 here: sd ratio 0.42) at every iteration, within 0.03 (the
    Monte Carlo sd of a log sd estimate from 4000 draws is ~0.011; the reference's sd is exact); the worst mean
    error falls below 0.05 sd and stays (the plateau), the verdict stays FAIL (too narrow), and ``time_to_rule``
    says "not within the ladder" with the plateau error."""
    lam = np.linalg.inv(SIGMA)
    mf_sd = 1 / np.sqrt(np.diag(lam))
    analytic = float(np.max(np.abs(np.log(mf_sd / np.sqrt(np.diag(SIGMA))))))
    ref = compared_view(reference, name="reference")
    z = np.random.default_rng(7).standard_normal((1, 4000, 3))  # the same base draws at every iteration (one seed)
    m = MU + 3 * np.sqrt(np.diag(SIGMA))
    rows, done = [], 0
    for budget in [1, 2, 4, 8, 16, 32, 64]:
        for _ in range(budget - done):        # CAVI sweep on the means (the variances are fixed at 1/Lambda_ii)
            for i in range(3):
                others = [j for j in range(3) if j != i]
                m[i] = MU[i] - lam[i, others] @ (m[others] - MU[others]) / lam[i, i]
        done = budget
        theta = m + mf_sd * z
        log_q = (-0.5 * (z**2).sum(-1) - np.log(mf_sd).sum() - 1.5 * np.log(2 * np.pi))
        row = score_fit(ref, _tree(theta, log_q), "meanfield")
        rows.append({"method": "meanfield", "budget": budget, "budget_unit": "iterations", "seed": 0, **row})
    frame = pd.DataFrame(rows)
    assert (frame["kind"] == "variational").all() and frame["khat"].notna().all()
    np.testing.assert_allclose(frame["max_abs_log_sd_ratio"], analytic, atol=0.03)
    assert frame["max_std_mean_error"].iloc[0] > 1.0 and frame["max_std_mean_error"].iloc[-1] < 0.05
    first = plateau(frame, "meanfield", column="max_abs_log_sd_ratio")
    assert first == 1  # the sd error is at its plateau from the first iteration on
    assert plateau(frame, "meanfield", column="max_std_mean_error", tol=1.0) is not None
    assert (frame["verdict"] == FAIL).all()
    assert frame["reason"].iloc[-1].startswith("too narrow")
    t = time_to_rule(frame).iloc[0]
    assert not t["reached"] and "not within the ladder" in t["reading"]
    assert t["plateau_error"] == pytest.approx(frame["max_std_mean_error"].iloc[-1])


def test_time_to_rule_takes_the_first_budget_where_every_seed_passes():
    frame = pd.DataFrame({
        "method": ["a"] * 6, "kind": ["sampler"] * 6, "budget_unit": ["draws per chain"] * 6,
        "budget": [10, 10, 20, 20, 40, 40], "seed": [0, 1] * 3,
        "verdict": ["NOT CONVERGED", "PASS", "PASS", "PASS", "PASS", "FAIL"],
        "run_seconds": [1.0, 1.0, 2.0, 4.0, 8.0, 8.0], "compile_seconds": [0.5] * 6,
        "max_std_mean_error": [0.4, 0.3, 0.2, 0.2, 0.1, 0.1]})
    t = time_to_rule(frame).iloc[0]
    assert t["reached"] and t["budget"] == 20 and t["run_seconds"] == pytest.approx(3.0)
    assert t["plateau_error"] == pytest.approx(0.1)


@pytest.mark.parametrize("kwargs,match", [
    ({"methods": ["nope"]}, "methods: .*not methods of 'ppca'"),
    ({"methods": "vbem"}, "methods: expected a non-empty list"),
    ({"methods": ["vbem"], "budgets": [0, 5]}, "budgets: expected positive integers"),
    ({"methods": ["vbem"], "budgets": [5, 5]}, "budgets: .* twice"),
    ({"methods": ["vbem"], "budgets": {"em": [3]}}, r"budgets: \['em'\] are not among"),
    ({"methods": ["vbem"], "budgets": {"vbem": []}}, r"budgets\['vbem'\]: expected a non-empty list"),
    ({"methods": ["vbem"], "seeds": [-1]}, "seeds: expected non-negative"),
    ({"methods": ["vbem"], "seeds": []}, "seeds: expected a non-empty"),
    ({"methods": ["vbem"], "reference": "ref.nc"}, "reference: expected an ArviZ DataTree"),
    ({"methods": ["vbem"], "options": {"vbem": {"max_iter": 3}}}, r"options\['vbem'\]: \['max_iter'\] are set"),
    ({"methods": ["vbem"], "options": {"vbem": {"nope": 3}}}, "nope: not an option"),
])
def test_bad_arguments_are_a_value_error_naming_them_before_anything_compiles(kwargs, match):
    from inference._timing import Stopwatch

    with Stopwatch() as watch, pytest.raises(ValueError, match=match):
        cost_accuracy("ppca", **kwargs, log=lambda _: None)
    assert watch.compile_events == 0


def test_default_ladders_span_too_short_to_twice_the_comparison_setting():
    nuts = default_budgets("ppca", "nuts")        # ppca's comparison runs NUTS with 2000 draws per chain
    assert len(nuts) == 6 and nuts[0] == 125 and nuts[-1] == 4000
    vbem = default_budgets("ppca", "vbem")         # max_iter 1000
    assert len(vbem) == 6 and vbem[0] <= 5 and vbem[-1] == 2000
    assert budget_option("ppca", "svi") == ("num_steps", "steps")
    assert budget_option("hlcr", "gibbs") == ("num_samples", "draws per chain")
    assert budget_option("bpca", "dppca") == ("max_iter", "rounds")
    assert budget_option("ppca", "em") == ("max_iter", "iterations")


def test_ppca_vbem_and_em_ladders_run_end_to_end_with_the_stopping_rule_off():
    """The stored ppca reference's data; every row scored, the budget is the iteration cap (tol off: VB-EM runs
    every iteration it is given; EM stops only at an exact fixed point), compile and run seconds apart."""
    lines = []
    frame = cost_accuracy("ppca", None, ["vbem", "em"], budgets=[3, 30], log=lines.append)
    assert list(frame.columns) == COLUMNS and len(frame) == 4 and len(lines) == 4
    assert frame.attrs["model"] == "ppca"
    vb = frame[frame["method"] == "vbem"]
    assert list(vb["n_iter"]) == [3, 30] and (vb["budget_unit"] == "iterations").all()
    assert (frame["compile_seconds"] >= 0).all() and (frame["run_seconds"] > 0).all()
    assert frame["max_std_mean_error"].notna().all() and frame["verdict"].notna().all()
    assert vb["khat"].notna().all() and frame.loc[frame["method"] == "em", "max_abs_log_sd_ratio"].isna().all()
    assert set(time_to_rule(frame)["method"]) == {"vbem", "em"}


def test_zoo_compare_ladder_on_a_csv_writes_the_frame_the_plot_and_the_section(tmp_path):
    """``zoo compare toy_normal --data toy.csv --methods exact --ladder``: the reference made on the CSV (NUTS,
    seconds), the exact sampler on its default ladder (6 budgets x 2 seeds) scored against it, and the page's
    section with the plot and the table; a second run reuses the ladder."""
    import json

    from test_compare_own_data import TOY_REFERENCE, toy_csv
    from test_spine import SPEC
    from typer.testing import CliRunner

    import zoo
    from zoo_cli import app

    zoo.register(SPEC, replace=True)
    try:
        args = ["compare", "toy_normal", "--data", str(toy_csv(tmp_path)), "--methods", "exact", "--ladder",
                "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"),
                *[a for k, v in TOY_REFERENCE.items() for a in ("--reference", f"{k}={v}")]]
        first = CliRunner().invoke(app, args)
        assert first.exit_code == 0, first.output
        folder = tmp_path / "out" / "toy_normal"
        frame = pd.read_csv(folder / "cost_accuracy.csv")
        assert list(frame.columns) == COLUMNS
        assert sorted(frame["budget"].unique()) == default_budgets("toy_normal", "exact")
        assert set(frame["seed"]) == {0, 1} and len(frame) == 12
        assert (folder / "cost_accuracy.png").stat().st_size > 10_000
        page = (folder / "report.html").read_text()
        assert "Accuracy against compute" in page and "Time to reach the rule" in page
        summary = json.loads((folder / "summary.json").read_text())
        assert [r["method"] for r in summary["cost_accuracy"]] == ["exact"]
        second = CliRunner().invoke(app, args)
        assert second.exit_code == 0 and "reusing the ladders" in second.output, second.output
    finally:
        zoo.unregister("toy_normal")


def test_demo_ladders_default_to_the_cheap_models_and_bad_names_are_refused():
    from typer.testing import CliRunner

    from diagnostics.demo import DEMO_LADDERS, demo_ladders
    from zoo_cli import app

    assert demo_ladders(["hlcr", "ppca", "bpca"], None) == [m for m in ["hlcr", "ppca", "bpca"] if m in DEMO_LADDERS]
    assert demo_ladders(["hlcr", "ppca"], True) == ["hlcr", "ppca"] and demo_ladders(["ppca"], False) == []
    with pytest.raises(ValueError, match="ladders: .*'gp_alps'.* not among"):
        demo_ladders(["ppca"], ["gp_alps"])
    result = CliRunner().invoke(app, ["demo", "--models", "ppca", "--ladders", "hlcr", "--out", "unused"])
    assert result.exit_code == 2 and "not among the demo's models" in " ".join(result.output.split())


def _ladder_cases() -> list[tuple[str, str]]:
    """(model, method) of every exact sampler (NUTS, the Gibbs kernels) and every VB/EM/ADMM kernel of the zoo's
    own models (SVI's stochastic error and the federated Gibbs rounds are neither)."""
    import inference
    import zoo
    from inference._methods import get_method

    cases = []
    for model in zoo.list_models():
        spec = zoo.get(model)
        if not spec.model.__module__.startswith("zoo."):
            continue
        for method in inference.methods_for(spec):
            kind = get_method(spec, method).kind
            if kind == "sampler" or (not method.startswith("svi") and "gibbs" not in method):
                cases.append((model, method))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("model,method", _ladder_cases(), ids=lambda v: str(v))
def test_on_the_demo_data_samplers_fall_as_draws_to_the_minus_half_and_kernels_plateau(model, method):
    """On the stored reference's data, the method's default ladder: an exact sampler's worst mean error falls
    with slope between -0.3 and -0.7 on log-log against draws per chain (exact: -0.5; the reference's own Monte
    Carlo error flattens the last rungs a little); a VB/EM/ADMM kernel's error reaches a plateau within 10 % of
    its converged value before the end of its ladder and stays there. The converged value is the error at the
    kernel's fixed point: its stopping rule at ``TOL_OFF`` (fires only where the objective stops changing in
    float64) and a cap of 4 times the ladder's largest budget, which a kernel with a stopping rule must reach
    before the cap (one without runs the cap). The comparison's own fit is not that: its rule stops on the
    objective's relative change, while a slow mode still moves the compared quantities (bpca: module docstring of
    ``diagnostics.ladders``; the numbers in benchmarks/results.md, cost_accuracy)."""
    import inference
    import zoo
    from diagnostics import references
    from diagnostics.ladders import TOL_OFF
    from diagnostics.planning import comparison_data, method_options
    from inference._methods import get_method
    from inference.trees import problem_of

    spec = zoo.get(model)
    frame = cost_accuracy(model, None, [method])
    if get_method(spec, method).kind == "sampler":
        slope = error_slope(frame, method)
        assert -0.7 <= slope <= -0.3, (slope, frame[["budget", "seed", "max_std_mean_error"]])
        return
    data, tag = comparison_data(spec)
    reference = references.load(model, data, tag=tag)
    option, _ = budget_option(spec, method)
    has_rule = "tol" in get_method(spec, method).declared
    cap = 4 * int(frame["budget"].max())
    fixed_point = inference.fit(spec, data, method, seed=0, **method_options(
        spec, method, problem_of(reference)[2], {option: cap, **({"tol": TOL_OFF} if has_rule else {})}))
    assert not has_rule or fixed_point.attrs["converged"], \
        f"{model}/{method}: no fixed point within {cap} ({fixed_point.attrs.get('n_iter')} run)"
    converged = score_fit(reference, fixed_point, method)["max_std_mean_error"]
    m = frame.groupby("budget")["max_std_mean_error"].mean().sort_index()
    within = np.abs(m.to_numpy() - converged) <= 0.10 * converged
    first = int(np.argmax(within)) if within.any() else len(within)
    assert first < len(within) - 1 and within[first:].all(), (converged, m)


def test_the_index_page_says_which_models_have_ladders_and_which_were_left_out(tmp_path):
    from diagnostics.report_pages import report_index

    note = ("Accuracy against compute (every method on a ladder of budgets): on the pages of ppca; left out of this "
            "demo to keep it within its time budget: hlcr (zoo compare MODEL --ladder makes it for any of them).")
    index = report_index({}, tmp_path, note=note).read_text()
    assert "left out of this demo to keep it within its time budget: hlcr" in index


def test_a_declared_ladder_top_extends_an_optimiser_ladder_with_rungs_no_further_apart():
    """``ZooSettings.ladder_top`` (bpca's optimisers: their error settles long after the comparison's fit stops):
    the ladder keeps the first rung it has without it, ends at the declared budget, and its rungs are no further
    apart than the default ladder's (a factor 512^(1/5) over its 5 gaps); other methods keep their default."""
    import dataclasses

    import zoo

    spec = zoo.get("bpca")
    plain = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, ladder_top={}))
    for method, top in spec.settings.ladder_top.items():
        ladder, default = default_budgets(spec, method), default_budgets(plain, method)
        assert len(default) == 6 and ladder[0] == default[0] and ladder[-1] == top > default[-1]
        assert max(b / a for a, b in zip(ladder[:-1], ladder[1:], strict=True)) <= 512 ** 0.2 * 1.02, ladder
    assert default_budgets(spec, "svi") == default_budgets(plain, "svi")
