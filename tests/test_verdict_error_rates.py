"""The measured error rates of the pass rule and the machinery that measures them (``diagnostics.error_rates``,
run in full by ``benchmarks/bench_verdicts.py``).

Fast: the benchmark's perturbations and candidate choices on closed-form cases, against oracles computed
here from the draws (NumPy, SciPy), never through the code under test:

* an independent exact copy of a stored reference PASSes; the same copy with one mean shifted by 0.3 reference
  sd, or one sd scaled by 0.7, FAILs on that quantity, and nothing else of the copy changes;
* the "worst" rule picks the quantity with the fewest effective draws (an AR(1) chain among iid ones);
* the mean-field Gaussian candidate of a correlated posterior (the toy linear regression, correlation about
  -0.95) has the closed-form mean-field sds 1 / sqrt(Lambda_ii), a log q equal to SciPy's density of its
  draws, and FAILs by the real rules (too narrow); the sign fold's mixture density is SciPy's too.

Slow (``make test-all``): the 19-of-20 goal on both sides for a representative subset -- NUTS on a small
model (ppca), a Gibbs kernel (hlcr, block; its sd x 0.7 miss is checked to be the documented one), and the
mean-field candidate of ssgp_lmm -- 20 fresh runs each.
"""

from __future__ import annotations

import numpy as np
import pytest
from diag_toys import LINREG, hand_tree, registered
from scipy import special, stats
from scipy.signal import lfilter

import inference
from diagnostics import error_rates as er
from diagnostics.scoring import FAIL, PASS
from diagnostics.view import compared_view


@pytest.fixture(scope="module")
def toy():
    with registered(LINREG):
        data, _ = LINREG.simulate(0)
        ref = inference.fit("dq_linreg", data, "exact", seed=1, num_samples=1000, num_chains=4)
        yield data, ref, compared_view(ref, name="reference")


def _iid_with_one_slow(seed, phi=0.8, n=8000):
    """(chain, draw) draws of N(0, 1) for "a" (iid) and "b" (AR(1) with coefficient phi: ESS ~ 11 % of the draws)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(2, n))
    b = lfilter([1.0], [1.0, -phi], np.sqrt(1 - phi**2) * rng.normal(size=(2, n)), axis=1,
                zi=phi * rng.normal(size=(2, 1)))[0]
    return {"a": a, "b": b}


def test_an_exact_copy_passes_and_its_perturbed_copies_fail_on_the_perturbed_quantity(toy):
    data, _, ref = toy
    copy = compared_view(inference.fit("dq_linreg", data, "exact", seed=2), name="exact")
    row, card = er.judge(ref, copy)
    assert row["verdict"] == PASS, row["reasons"]
    label = "beta[0]"
    sd_ref = float(np.std(ref.flat(label), ddof=1))
    shifted = er.perturbed_view(copy, label, shift=er.SHIFT * sd_ref)
    narrowed = er.perturbed_view(copy, label, scale=er.SCALE)
    x = copy.flat(label)
    np.testing.assert_allclose(shifted.flat(label), x + 0.3 * sd_ref, rtol=1e-13)
    np.testing.assert_allclose(np.std(narrowed.flat(label), ddof=1), 0.7 * np.std(x, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(np.mean(narrowed.flat(label)), np.mean(x), rtol=1e-12)
    np.testing.assert_array_equal(shifted.flat("beta[1]"), copy.flat("beta[1]"))  # nothing else moves
    for cand, rule in ((shifted, "mean_ok"), (narrowed, "sd_ok")):
        prow, pcard = er.judge(ref, cand)
        assert prow["verdict"] == FAIL and label in prow["reasons"]
        at = pcard.set_index("parameter")
        assert not at.at[label, rule] and at.at["beta[1]", "ok"]


def test_the_worst_rule_picks_the_quantity_with_the_fewest_effective_draws():
    rng = np.random.default_rng(3)
    ref = compared_view(hand_tree({"a": rng.normal(size=(4, 1000)), "b": rng.normal(size=(4, 1000))},
                                  method="reference"), name="reference")
    base = compared_view(hand_tree(_iid_with_one_slow(4), method="sampler"), name="sampler")
    row, card = er.judge(ref, base)
    assert row["verdict"] == PASS, row["reasons"]
    labels = er.eligible(ref, base, card)
    assert labels == ["a", "b"]
    for what in ("shift", "scale"):
        assert er.choose(ref, base, card, labels, what, "worst", np.random.default_rng(0)) == "b"
    picks = {er.choose(ref, base, card, labels, "shift", "random", np.random.default_rng(s)) for s in range(20)}
    assert picks == {"a", "b"}


def test_a_quantity_whose_shift_is_below_its_floor_is_not_eligible():
    """A probability pinned near 1 (sd 0.005): 0.3 sd = 0.0015 is below the 0.01 floor, by design irrelevant."""
    import dataclasses

    from diagnostics.view import ComparedView

    rng = np.random.default_rng(5)
    ref = compared_view(hand_tree({"p": 0.99 + 0.005 * rng.normal(size=(4, 1000)), "x": rng.normal(size=(4, 1000))},
                                  method="reference"), name="reference")
    ref = dataclasses.replace(ref, floors={"p": 0.01})
    base = compared_view(hand_tree({"p": 0.99 + 0.005 * rng.normal(size=(2, 2000)),
                                    "x": rng.normal(size=(2, 2000))}, method="s"), name="s")
    assert isinstance(ref, ComparedView)
    _, card = er.judge(ref, base)
    assert er.eligible(ref, base, card) == ["x"]


def test_mean_field_candidate_is_the_closed_form_mean_field_with_scipys_log_q_and_fails(toy):
    data, ref_tree, ref = toy
    mf = er.MeanField(LINREG, data, LINREG.default_hyper, ref_tree)
    beta = ref_tree["posterior"]["beta"].values.reshape(-1, 2)
    cov = np.cov(beta, rowvar=False)
    corr = cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1])
    assert mf.max_abs_corr == pytest.approx(abs(corr), rel=1e-10) and abs(corr) > 0.9
    np.testing.assert_allclose(mf.sd["kl"], np.sqrt(np.diag(cov) * (1 - corr**2)), rtol=1e-10)
    tree = mf.tree("kl", seed=7)
    draws = tree["posterior"]["beta"].values[0]
    expected = stats.norm.logpdf(draws, mf.mean, mf.sd["kl"]).sum(axis=1)
    np.testing.assert_allclose(tree["sample_stats"]["log_q"].values[0], expected, rtol=1e-12)
    np.testing.assert_allclose(np.std(draws, axis=0, ddof=1) / np.sqrt(np.diag(cov)), np.sqrt(1 - corr**2),
                               rtol=0.1)
    row, _ = er.judge(ref, compared_view(tree, name="meanfield"))
    # in 2-D at |rho| 0.95 the sd ratio (0.31) fails it; k-hat is only "usable" (measured 0.60 on seed 7)
    assert row["verdict"] == FAIL and "too narrow" in row["reasons"] and row["khat"] > 0.5, row["reasons"]
    moments = mf.tree("moments", seed=7)  # marginals right: the practical marginal rules cannot fail it
    mrow, _ = er.judge(ref, compared_view(moments, name="moments"))
    assert 0.85 < mrow["min_sd_ratio"] and mrow["max_sd_ratio"] < 1.15


def test_a_folded_mean_field_density_is_the_equal_mixture_over_the_symmetry(toy):
    """With a fold (beta -> -beta, folded where beta[0] < 0), log q is log(q(u)/2 + q(-u)/2) (SciPy)."""
    data, ref_tree, _ = toy
    fold = (lambda s: {"beta": -s["beta"]}, lambda s: s["beta"][..., 0] < 0)
    mf = er.MeanField(LINREG, data, LINREG.default_hyper, ref_tree, fold)
    tree = mf.tree("kl", seed=8)
    u = tree["posterior"]["beta"].values[0]
    expected = special.logsumexp([stats.norm.logpdf(u, mf.mean, mf.sd["kl"]).sum(1),
                                  stats.norm.logpdf(-u, mf.mean, mf.sd["kl"]).sum(1)], axis=0) - np.log(2)
    np.testing.assert_allclose(tree["sample_stats"]["log_q"].values[0], expected, rtol=1e-12)
    assert 0.3 < np.mean(u[:, 0] * np.sign(mf.mean[0]) < 0) < 0.7  # both images drawn


def test_exact_cases_are_every_sampler_and_every_gibbs_kernel():
    keys = [c.key for c in er.exact_cases() if not c.model.startswith("dq_")]  # the toys registered above
    assert {"hlcr/gibbs[kernel=block]", "hlcr/gibbs[kernel=paper]", "hlcr/gibbs_blocked", "gp_alps/gibbs"} <= set(keys)
    assert sum(k.endswith("/nuts") for k in keys) == 8 and len(keys) == 12
    with pytest.raises(ValueError, match="only: \\['nope/nuts'\\] are not cases"):
        er.exact_cases(["nope/nuts"])


# --------------------------------------------------------------------------------------------------- slow


def _campaign(tmp_path, monkeypatch, only):
    cases = er.exact_cases(only)
    mf = [m for m in er.FOLDS if f"{m}/meanfield" in only]
    records, errors = er.campaign(cases, mf, checkpoints=tmp_path, n_runs=er.N_RUNS)
    assert not any(errors.values()), errors
    return records


def _count(records, key, field, verdict):
    recs = records[key]
    assert len(recs) == er.N_RUNS
    return sum(1 for r in recs if (r[field] or {}).get("verdict") == verdict)


@pytest.mark.slow
def test_ppca_nuts_passes_19_of_20_and_every_perturbed_copy_fails_19_of_20(tmp_path, monkeypatch):
    records = _campaign(tmp_path, monkeypatch, ["ppca/nuts"])
    reasons = [r["base"]["reasons"][:200] for r in records["ppca/nuts"]]
    assert _count(records, "ppca/nuts", "base", PASS) >= er.GOAL, reasons
    for field in ("shift_worst", "shift_random", "scale_worst", "scale_random"):
        assert _count(records, "ppca/nuts", field, FAIL) >= er.GOAL, field


@pytest.mark.slow
def test_hlcr_gibbs_passes_19_of_20_and_its_shifted_copies_fail_19_of_20(tmp_path, monkeypatch):
    """The sd x 0.7 copies are NOT asserted at 19/20 here: the least detectable sd of hlcr is a co-clustering
    probability whose spread comes from rare draws (measured: coclust[9], |z| 2.0-2.9 < z_crit 3.83 after
    scaling), and the rule rightly cannot tell its sd from 0.7 x its sd at the demo length. What is asserted is
    that every such miss is on a bounded co-clustering quantity and that the sd rule saw it as within noise."""
    key = "hlcr/gibbs[kernel=block]"
    records = _campaign(tmp_path, monkeypatch, [key])
    assert _count(records, key, "base", PASS) >= er.GOAL, [r["base"]["reasons"][:200] for r in records[key]]
    for field in ("shift_worst", "shift_random"):
        assert _count(records, key, field, FAIL) >= er.GOAL, field
    for r in records[key]:
        for field in ("scale_worst", "scale_random"):
            if r[field]["verdict"] != FAIL:
                assert r[field]["label"].startswith("coclust[") and abs(r[field]["z"]) <= r["base"]["z_critical"]


@pytest.mark.slow
def test_a_mean_field_gaussian_fitted_to_the_ssgp_lmm_reference_fails_19_of_20(tmp_path, monkeypatch):
    records = _campaign(tmp_path, monkeypatch, ["ssgp_lmm/meanfield"])
    assert _count(records, "ssgp_lmm/meanfield", "kl", FAIL) >= er.GOAL
