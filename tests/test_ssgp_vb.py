"""SSGP + random effects, method "vb" against stored NUTS references and an exact GP (notes 002 §6 B, C, P)
and the bad-input contract of issue 6.

The NUTS references (``zoo/references/ssgp_*__default.nc``, 4 chains x 2000 draws thinned to 4000,
target_accept 0.95, NUTS on the collapsed reformulations of ``zoo.ssgp``, healthy by the reference standard)
were generated on each model's default data (``spec.default_data()``: S-LMM J=10 x 20, S-LOGIT-10 and
S-PROBIT-10, J=30 x 10), so these tests never run NUTS. One VB fit per model (default options, seed 0) is
shared by every test of the module. Comparisons go through ``diagnostics.scorecard`` on the sign-invariant
summaries of ``zoo.ssgp.summaries`` (population curve g = beta0 + f on a 50-point grid, |lam|, sigma, gamma,
tau, random effects b).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import inference
import zoo
from diagnostics import references, scorecard
from diagnostics.scoring import compared_posterior

MODELS = ("ssgp_lmm", "ssgp_logit", "ssgp_probit")
_FITS: dict[str, tuple] = {}


def _vb_fit(name):
    """(data, truth, VB tree, reference tree or None, scorecard or None), computed once per model."""
    if name not in _FITS:
        spec = zoo.get(name)
        _, truth = spec.default_data()
        data, _ = references.reference_data(name)  # the stored arrays: portable across CPUs
        tree = inference.fit(name, data, "vb", seed=0, progress=False)
        ref = references.load(name, data)
        sc = None if ref is None else scorecard(ref, {"vb": tree})
        _FITS[name] = (data, truth, tree, ref, sc)
    return _FITS[name]


def _rows(sc, var):
    """Scorecard rows of one summary variable (``g`` matches g[0] .. g[49], not gamma)."""
    return sc[sc["parameter"].str.match(rf"^{var}(\[|$)")]


def _reference(name):
    data, truth, tree, ref, sc = _vb_fit(name)
    assert ref is not None, (f"zoo/references/{name}__default.nc is missing or was computed on other data; "
                             f"regenerate it with `make references`")
    health = sc.attrs["reference_health"]
    n_draws = ref["posterior"].sizes["chain"] * ref["posterior"].sizes["draw"]
    # notes §6 C: the reference is usable when R-hat < 1.05 and divergences < 2% (the sigma funnel gave
    # 0.4-6.5% in the prototype; the scorecard's stricter "reliable" flag asks for none)
    assert health["max_rhat"] < 1.05, health
    assert health["divergences"] < 0.02 * n_draws, health
    return data, truth, tree, ref, sc


def _summaries(tree):
    return compared_posterior(tree)


# --------------------------------------------------------------------------------------------------
# C: agreement with NUTS (stored references)
# --------------------------------------------------------------------------------------------------

def test_lmm_vb_agrees_with_nuts_on_curve_noise_random_effects_C1():
    """Notes §6 C1 on S-LMM (J = 10 x 20, m = 10). Units: NUTS posterior sd for means, ratios of sds,
    relative error for the scales. Tolerances are the notes' (about 2x the prototype's values)."""
    data, truth, tree, ref, sc = _reference("ssgp_lmm")
    g = _rows(sc, "g")
    assert len(g) == 50
    # population curve g = beta0 + f: max |E_VB g - E_NUTS g| / sd_NUTS(g) <= 0.35 [prototype 0.15]
    assert g["std_mean_error"].max() <= 0.35, g["std_mean_error"].max()
    # sd_VB / sd_NUTS in [0.7, 1.1] at every grid point [0.87-0.94]
    assert g["sd_ratio"].between(0.7, 1.1).all(), (g["sd_ratio"].min(), g["sd_ratio"].max())
    # noise sd gamma: posterior means within 5% (relative) [0.3%]
    gam = _rows(sc, "gamma").iloc[0]
    assert abs(gam["mean"] / gam["mean_ref"] - 1) <= 0.05, gam
    # random-intercept sd tau: within 15% [0.469 vs 0.469]
    tau = _rows(sc, "tau").iloc[0]
    assert abs(tau["mean"] / tau["mean_ref"] - 1) <= 0.15, tau
    # random effects: |dmean| <= 0.3 NUTS sd [about 0.1], sd ratio in [0.7, 1.05] [0.90]
    b = _rows(sc, "b")
    assert len(b) == 10
    assert b["std_mean_error"].max() <= 0.3, b["std_mean_error"].max()
    assert b["sd_ratio"].between(0.7, 1.05).all(), (b["sd_ratio"].min(), b["sd_ratio"].max())
    # |lam|: E_VB inside the NUTS 90% interval; VB sd below the NUTS sd (known mean-field under-dispersion,
    # asserted as a direction, not as closeness)
    q_vb, q_ref = _summaries(tree), _summaries(ref)
    lam_vb, lam_ref = q_vb["abs_lam"].values.ravel(), q_ref["abs_lam"].values.ravel()
    lo, hi = np.quantile(lam_ref, [0.05, 0.95])
    assert lo <= lam_vb.mean() <= hi, (lam_vb.mean(), lo, hi)
    assert lam_vb.std() < lam_ref.std(), (lam_vb.std(), lam_ref.std())
    # sigma is weakly identified (heavy tail, low tail ESS): medians within a factor of 2
    ratio = np.median(q_vb["sigma"].values) / np.median(q_ref["sigma"].values)
    assert 0.5 <= ratio <= 2.0, ratio


def test_logit_vb_agrees_with_nuts_on_curve_scale_and_random_effects_C2():
    """Notes §6 C2 on S-LOGIT-10 (J = 30 x 10, Jaakkola-Jordan bound). Units as in C1."""
    data, truth, tree, ref, sc = _reference("ssgp_logit")
    g = _rows(sc, "g")
    # g: max |dmean| / sd_NUTS <= 0.7 [prototype 0.45]; sd ratio in [0.6, 1.3] [0.78-1.14]
    assert g["std_mean_error"].max() <= 0.7, g["std_mean_error"].max()
    assert g["sd_ratio"].between(0.6, 1.3).all(), (g["sd_ratio"].min(), g["sd_ratio"].max())
    # tau: relative error of the posterior mean <= 0.2 [0.68 vs 0.75]
    tau = _rows(sc, "tau").iloc[0]
    assert abs(tau["mean"] / tau["mean_ref"] - 1) <= 0.2, tau
    # slope of the VB random-effect means regressed on the NUTS means in [0.75, 1.1] [0.88]
    b = _rows(sc, "b")
    assert len(b) == 30
    slope = np.polyfit(b["mean_ref"].to_numpy(), b["mean"].to_numpy(), 1)[0]
    assert 0.75 <= slope <= 1.1, slope


def test_probit_mean_field_vb_shrinks_the_random_effect_scale_against_the_truth_C3():
    """Notes §6 C3, a CHARACTERISATION test of a known limitation, against the simulation truth: on
    S-PROBIT-10 (J = 30 groups of 10, true tau 0.7) the Albert-Chib mean-field VB (q(y*) independent of
    q(alpha, beta)) estimates tau at less than half the sample sd of the true random effects [measured 0.29 vs
    0.69] and shrinks their means towards 0 (slope of VB means on the true b below 0.5) [0.21]. Units: the
    sample sd of the true b; regression slope."""
    data, truth, tree, ref, sc = _vb_fit("ssgp_probit")
    q = _summaries(tree)
    b_true = truth["b"][:, 0]
    assert q["tau"].values.mean() < 0.5 * b_true.std(ddof=1), (q["tau"].values.mean(), b_true.std(ddof=1))
    b_vb = q["b"].values.reshape(-1, b_true.size).mean(0)
    slope = np.polyfit(b_true, b_vb, 1)[0]
    assert slope < 0.5, slope


def test_probit_mean_field_vb_shrinks_the_random_effects_against_nuts_C3():
    """Notes §6 C3 against the stored NUTS reference (S-PROBIT-10, 4 x 2000 draws of the collapsed Albert-Chib
    reformulation, R-hat 1.004, no divergences). CHARACTERISATION of a known limitation (Albert-Chib mean-field
    q(y*)): the VB random-effect means are shrunk towards 0 (slope of VB on NUTS means below 0.5) [measured 0.43;
    prototype 0.155] and the population curve is under-dispersed (sd ratio below 1 everywhere) [0.38-0.77;
    prototype 0.39-0.75]."""
    data, truth, tree, ref, sc = _reference("ssgp_probit")
    b = _rows(sc, "b")
    slope = np.polyfit(b["mean_ref"].to_numpy(), b["mean"].to_numpy(), 1)[0]
    assert slope < 0.5, slope
    g = _rows(sc, "g")
    assert g["sd_ratio"].max() < 1.0, g["sd_ratio"].max()


@pytest.mark.xfail(strict=True, reason="measured E_VB[tau] / E_NUTS[tau] = 0.2913 / 0.5713 = 0.510 at the "
                   "converged optimum (bound -185.0945) on the stored reference (0.502 against the earlier, "
                   "unhealthy 2-chain reference's 0.5802), a hair above the notes' "
                   "characterisation threshold 0.5 (prototype 0.18 vs 0.65): the shrinkage is real but slightly "
                   "less extreme than the notes state")
def test_probit_vb_tau_is_below_half_the_nuts_tau_C3():
    """Notes §6 C3: E_VB[tau] < 0.5 E_NUTS[tau] (unit: ratio of posterior means)."""
    data, truth, tree, ref, sc = _reference("ssgp_probit")
    tau = _rows(sc, "tau").iloc[0]
    assert tau["mean"] < 0.5 * tau["mean_ref"], tau


# --------------------------------------------------------------------------------------------------
# B1: the lower bound never decreases
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_lower_bound_never_decreases_and_the_fit_converges(name):
    """Notes §6 B1 / issue: L_{t+1} >= L_t - 1e-8 |L_t| at every sweep (relative 1e-8, the issue's unit),
    with the adaptive NCVMP step and backtracking; the default fit converges (tol 1e-7) within max_iter."""
    data, truth, tree, ref, sc = _vb_fit(name)
    bound = np.asarray(tree["sample_stats"]["bound"].values).ravel()
    bound = bound[np.isfinite(bound)]
    assert len(bound) == int(tree.attrs["n_iter"]) > 5
    drops = bound[1:] - bound[:-1]
    worst = float(np.min(drops / np.abs(bound[:-1])))
    assert worst >= -1e-8, worst
    assert int(tree.attrs["converged"]) == 1
    assert bound[-1] > bound[0]


@pytest.mark.parametrize("name", ["ssgp_lmm", "ssgp_probit"])
def test_the_default_stopping_rule_stops_at_the_optimum_not_on_a_plateau(name):
    """The default fit (tol 1e-7) ends where a fit run to tol 1e-13 ends: bounds within 1e-6 relative and the
    lam mean within 0.1 sd of q(lam), in under 60 sweeps. [Measured: 19 sweeps for both, gaps 2e-8 and 2e-9
    relative.] The old loop (step <= 10, stop on a small change of L alone) stopped after 417 / 588 sweeps at
    gaps 7e-6 / 9e-6 relative; at n = 2000, m = 50 it stopped at -530.81 against an optimum of -527.63.
    Units: relative bound gap, sd of q(lam)."""
    from inference.ssgp import problem, vb
    from zoo._validation import validate_data

    spec = zoo.get(name)
    data, _ = spec.default_data()
    hyper = spec.default_hyper
    cfg, arr = problem.setup(spec.inputs(validate_data(spec, data), hyper), hyper, problem.LIKELIHOOD_OF[name])
    run = vb.run(cfg, arr, max_iter=2000, tol=1e-7)
    run_opt = vb.run(cfg, arr, max_iter=2000, tol=1e-13)
    st, st_opt = run.state, run_opt.state
    assert run.converged and run_opt.converged
    assert run.n_iter == len(run.info.objective) < 60, run.n_iter
    gap = (float(st_opt.bound) - float(st.bound)) / abs(float(st_opt.bound))
    assert gap < 1e-6, gap
    sd = np.sqrt(np.diag(np.asarray(st_opt.Sig_lam)))
    assert np.all(np.abs(np.asarray(st.mu_lam - st_opt.mu_lam)) < 0.1 * sd), (st.mu_lam, st_opt.mu_lam, sd)


# --------------------------------------------------------------------------------------------------
# P: prediction against the exact GP
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lmm_test_set():
    """S-LMM plus 100 held-out points (10 per known group); the training data are the default data (the
    simulator draws the test inputs after the training set, so the default VB fit is reused)."""
    spec = zoo.get("ssgp_lmm")
    data, truth = zoo.ssgp.simulate_lmm(0, test_per_group=10, **spec.settings.demo_sizes)
    d0, _ = spec.default_data()
    for k in ("X", "y", "group"):
        np.testing.assert_array_equal(data[k], d0[k])
    return data, truth


def test_vb_predictive_rmse_is_within_15_percent_of_the_exact_gp_P1(lmm_test_set):
    """Notes §6 P1: predict the noiseless mean 1 + f + b_g at 100 new points of known groups; the exact GP
    (sigma^2 RBF + tau^2 1[same group] + 100 intercept + gamma^2 delta, type-II ML, 3 restarts) is the
    oracle. RMSE_VB(m = 10) <= 1.15 RMSE_exact [ratios 0.94-0.97 over 3 seeds]. Unit: RMSE ratio."""
    from inference.ssgp.exact_gp import fit_exact_gp, predict_exact_gp

    data, truth = lmm_test_set
    test = truth["test"]
    tree = _vb_fit("ssgp_lmm")[2]
    pv = inference.predict(tree, {"X": test["X"], "group": test["group"]})
    ex = fit_exact_gp(data["X"], data["y"], data["group"], restarts=3, seed=0)
    pe = predict_exact_gp(ex, test["X"], group=test["group"])
    rmse_vb = np.sqrt(np.mean((pv["mean"] - test["eta"]) ** 2))
    rmse_ex = np.sqrt(np.mean((pe["mean"] - test["eta"]) ** 2))
    assert rmse_vb <= 1.15 * rmse_ex, (rmse_vb, rmse_ex)


def test_vb_90_percent_predictive_intervals_cover_noisy_targets_P2(lmm_test_set):
    """Notes §6 P2: the fraction of noisy held-out targets y = eta + N(0, 0.3^2) inside the VB 90% predictive
    interval lies in [0.80, 0.97] (unit: coverage fraction; 100 targets give a binomial sd of 0.03)."""
    from scipy.stats import norm

    data, truth = lmm_test_set
    test = truth["test"]
    y = test["eta"] + truth["gamma"] * np.random.default_rng(7).standard_normal(len(test["eta"]))
    pv = inference.predict(_vb_fit("ssgp_lmm")[2], {"X": test["X"], "group": test["group"]})
    half = norm.ppf(0.95) * np.sqrt(pv["y_var"])
    cover = np.mean(np.abs(y - pv["mean"]) <= half)
    assert 0.80 <= cover <= 0.97, cover


def test_prediction_rejects_unknown_groups_and_wrong_input_width(lmm_test_set):
    tree = _vb_fit("ssgp_lmm")[2]
    with pytest.raises(ValueError, match="group"):
        inference.predict(tree, {"X": np.array([[0.5]]), "group": [10]})
    with pytest.raises(ValueError, match=r"\bX\b"):
        inference.predict(tree, {"X": np.array([[0.5, 0.5]])})


def _numpy_predictive_oracle(tree, train, X_new, group, likelihood):
    """Means over the tree's draws of the feature-map regression, written out draw by draw in NumPy:
    eta_s(x) = sum_r [a_r cos(t_r(x)^T lam_s) + b_r sin(t_r(x)^T lam_s)] + beta0_s + b_s[group] with
    (a, b) = sigma_s alpha_raw_s / sqrt(m), t_r(x) = s_r * x on inputs scaled by the training min/max."""
    from scipy.special import ndtr

    post = tree["posterior"]
    flat = lambda v: np.asarray(post[v].values).reshape(-1, *post[v].shape[2:])
    lam, alpha_raw, sigma, beta0 = flat("lam"), flat("alpha_raw"), flat("sigma"), flat("beta0")
    b = flat("b_raw") * flat("tau")[:, None, :]
    lo, hi = train["X"].min(0), train["X"].max(0)
    Xs = (np.asarray(X_new) - lo) / (hi - lo)
    hyper = {**zoo.get(tree.attrs["model"]).default_hyper, **json.loads(tree.attrs["hyperparameters"])}
    S = zoo.ssgp.spectral_points(hyper["m"], Xs.shape[1], hyper["spectral_seed"])
    m = S.shape[0]
    etas, fs = [], []
    for s in range(len(sigma)):
        Phi = np.array([[np.cos((S[r] * x) @ lam[s]) for r in range(m)] + [np.sin((S[r] * x) @ lam[s])
                                                                           for r in range(m)] for x in Xs])
        f = Phi @ (sigma[s] * alpha_raw[s] / np.sqrt(m))
        re = np.array([b[s, g, 0] if g >= 0 else 0.0 for g in group])
        fs.append(f)
        etas.append(f + beta0[s] + re)
    f, eta = np.array(fs), np.array(etas)
    out = {"f_mean": f.mean(0), "f_var": f.var(0), "mean": eta.mean(0), "var": eta.var(0)}
    if likelihood == "gaussian":
        out["y_var"] = eta.var(0) + np.mean(flat("gamma") ** 2)
    else:
        out["prob"] = ndtr(eta).mean(0)
    return out


@pytest.mark.parametrize(("name", "method"), [("ssgp_lmm", "vb"), ("ssgp_probit", "vb"), ("ssgp_lmm", "nuts")])
def test_predict_from_any_methods_tree_is_the_mean_over_draws_of_the_feature_map(name, method):
    """``inference.predict`` on the module's VB trees (default data) and on a NUTS tree (tiny settings, m = 4)
    equals the NumPy oracle above at known groups and at a new group (-1), to 1e-10 (unit: absolute, on O(1)
    quantities)."""
    if method == "vb":
        data, tree = _vb_fit(name)[0], _vb_fit(name)[2]
    else:
        data = _small(name)
        tree = inference.fit(name, data, "nuts", seed=0, m=4, num_warmup=10, num_samples=10, num_chains=1,
                             progress=False)
    X_new = np.array([[0.1], [0.5], [0.9], [0.3]]) * (data["X"].max() - data["X"].min()) + data["X"].min()
    group = np.array([0, 1, 2, -1])
    got = inference.predict(tree, {"X": X_new, "group": group})
    want = _numpy_predictive_oracle(tree, data, X_new, group, problem_likelihood(name))
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-10, err_msg=k)


def problem_likelihood(name):
    return {"ssgp_lmm": "gaussian", "ssgp_logit": "logit", "ssgp_probit": "probit"}[name]


@pytest.mark.slow
def test_sparse_spectrum_rmse_approaches_the_exact_gp_as_m_grows(lmm_test_set):
    """Issue 6: predictive RMSE of VB with m in {10, 25, 50, 100} spectral points approaches the exact GP's.
    Claims (unit: RMSE ratio to the exact GP): the largest m is within 10% of the exact GP, and no larger m is
    worse than the smallest by more than 10% (the trend; single-seed RMSEs are noisy, hence 10%)."""
    from inference.ssgp.exact_gp import fit_exact_gp, predict_exact_gp

    data, truth = lmm_test_set
    test = truth["test"]
    ex = fit_exact_gp(data["X"], data["y"], data["group"], restarts=3, seed=0)
    rmse_ex = np.sqrt(np.mean((predict_exact_gp(ex, test["X"], group=test["group"])["mean"] - test["eta"]) ** 2))
    ratios = []
    for m in (10, 25, 50, 100):
        tree = inference.fit("ssgp_lmm", data, "vb", seed=0, m=m, progress=False, num_samples=100)
        pv = inference.predict(tree, {"X": test["X"], "group": test["group"]})
        ratios.append(np.sqrt(np.mean((pv["mean"] - test["eta"]) ** 2)) / rmse_ex)
    assert ratios[-1] <= 1.10, ratios
    assert max(ratios[1:]) <= 1.10 * ratios[0], ratios


# --------------------------------------------------------------------------------------------------
# Bad input: clear errors before compilation
# --------------------------------------------------------------------------------------------------

def _small(name):
    return zoo.get(name).simulate(1, n_groups=3, per_group=4)[0]


@pytest.mark.parametrize("name", MODELS)
def test_fewer_than_one_spectral_point_is_rejected(name):
    with pytest.raises(ValueError, match=r"\bm\b"):
        inference.fit(name, _small(name), "vb", seed=0, m=0)


@pytest.mark.parametrize("name", MODELS)
def test_group_index_out_of_range_is_rejected(name):
    data = _small(name)
    with pytest.raises(ValueError, match="group"):
        inference.fit(name, data, "vb", seed=0, n_groups=2)
    bad = dict(data, group=np.where(np.arange(len(data["group"])) == 0, -1, data["group"]))
    with pytest.raises(ValueError, match="group"):
        inference.fit(name, bad, "vb", seed=0)


@pytest.mark.parametrize("name", ["ssgp_logit", "ssgp_probit"])
def test_non_binary_responses_are_rejected_by_the_binary_models(name):
    data = _small(name)
    for y in (data["y"] + 1, data["y"] * 0.5):
        with pytest.raises(ValueError, match="y"):
            inference.fit(name, dict(data, y=y), "vb", seed=0)


@pytest.mark.parametrize("name", MODELS)
def test_constant_input_column_is_rejected(name):
    data = _small(name)
    X = np.concatenate([data["X"], np.full((len(data["y"]), 1), 3.0)], axis=1)
    with pytest.raises(ValueError, match="constant"):
        inference.fit(name, dict(data, X=X), "vb", seed=0)


def test_bad_vb_options_and_prediction_inputs_are_rejected():
    data = _small("ssgp_lmm")
    with pytest.raises(ValueError, match="mu_lam_init"):
        inference.fit("ssgp_lmm", data, "vb", seed=0, mu_lam_init=0.0)
    with pytest.raises(ValueError, match="factorisation"):
        inference.fit("ssgp_lmm", data, "vb", seed=0, factorisation="full")
    with pytest.raises(ValueError, match="NaN|nan|finite"):
        inference.fit("ssgp_lmm", dict(data, y=np.where(np.arange(len(data["y"])) == 0, np.nan, data["y"])),
                      "vb", seed=0)


def test_the_run_program_is_compiled_for_compile_speed_where_sweeps_are_short():
    """``vb.compiler_options``: XLA's backend optimisation off (``programs.ONE_SHOT``) for the demo's tables, whose
    few dozen sweeps cost less than the optimisation's compile; XLA's default from Np m^2 > ``SMALL_SWEEP`` on."""
    from inference import programs
    from inference.ssgp import problem, vb

    spec = zoo.get("ssgp_lmm")
    data, _ = spec.default_data()
    hyper = spec.default_hyper
    cfg, _ = problem.setup(spec.inputs(data, hyper), hyper, "gaussian")
    assert cfg.n_chunks * cfg.chunk * cfg.m**2 <= vb.SMALL_SWEEP
    assert vb.compiler_options(cfg) == programs.ONE_SHOT
    big = cfg._replace(m=50, n_chunks=cfg.n_chunks * 8)
    assert vb.compiler_options(big) == programs.OPTIMISED


@pytest.mark.parametrize("name", ["ssgp_lmm", "ssgp_probit", "ssgp_logit"])
def test_the_host_start_equals_the_compiled_init_and_its_pseudo_data_are_those_of_the_state(name):
    """``vb.run`` builds the start on the host (``init(..., xp=numpy)``): equal to the kernel's own ``init`` compiled
    (1e-12 relative), and its closed-form pseudo-data (w, yt) equal ``bound.pseudo`` evaluated at that state (the
    quadrature E[gamma^-2] of ``h_terms``, the inverse Mills ratio through ``log_ndtr``, omega(xi = 1))."""
    import jax

    from inference.ssgp import bound, problem, vb

    spec = zoo.get(name)
    data, _ = spec.default_data()
    hyper = spec.default_hyper
    cfg, arrays = problem.setup(spec.inputs(data, hyper), hyper, problem.LIKELIHOOD_OF[name])
    cfg = problem.program_config(cfg)._replace(mu_lam_init=(0.7,))
    host = vb.init(cfg, None, arrays, xp=np)
    compiled = jax.jit(lambda a: vb.init(cfg, None, a))(arrays)
    for field in vb.State._fields:
        np.testing.assert_allclose(np.asarray(getattr(compiled, field)), np.asarray(getattr(host, field)),
                                   rtol=1e-12, atol=0, err_msg=field)
    assert np.all(np.asarray(host.mu_lam) == 0.7)
    w, yt = jax.jit(lambda a, s: bound.pseudo(cfg, a, s))(arrays, host)
    np.testing.assert_allclose(np.asarray(w), host.w, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(np.asarray(yt), host.yt, rtol=1e-12, atol=1e-300)
