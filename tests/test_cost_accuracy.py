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

from diagnostics.cost_accuracy import (
    COLUMNS,
    budget_option,
    cost_accuracy,
    default_budgets,
    error_slope,
    plateau,
    score_fit,
    time_to_rule,
)
from diagnostics.scorecard import FAIL, PASS
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
