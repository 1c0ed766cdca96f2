"""Gibbs samplers for GP-ALPS (inference/gp_alps/gibbs.py, notes §3.3-§3.4): collapsed (G1) and the
paper's uncollapsed sweep with the corrected conditional hit the exact switch posterior (T3); the paper's
printed conditional does not (E3); the swap move makes duplicate latents exchangeable (T9, E12); the scale move
keeps the prior of (H_.j, u_j) (the likelihood is constant along its orbits)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import inference
from inference.gp_alps import gibbs as gb
from inference.gp_alps.common import Problem, exact_inclusion_orthogonal
from zoo import gp_alps as za

SIGMA2_SQ = 0.0285


def _problem(data, hyper, learn, group=None):
    kw = za.model_inputs(data, hyper)
    F = np.asarray(kw["F"])
    lam, V = np.linalg.eigh(np.einsum("jnr,jns->jrs", F, F))
    th = np.asarray(kw["theta"])
    p = data["Y"].shape[1]
    group = np.arange(F.shape[0]) if group is None else np.asarray(group)
    return Problem(jnp.asarray(F), jnp.asarray(np.clip(lam, 0, None)), jnp.asarray(V), jnp.asarray(data["Y"]),
                   jnp.asarray(np.log(th / (1 - th))), 1.0, jnp.full(p, 1.0 if learn else hyper["sigma2"]),
                   2.0, 0.1, jnp.asarray(group))


def _small_square_wave():
    # n = 40 (two periods), harmonics 1-4: still exactly orthogonal, so the exact oracle applies
    data, _ = za.simulate(0, n=40)
    hyper = {**za.SPEC.default_hyper, "kernels": za.preset_kernels("square_wave")[:4], "sigma2": SIGMA2_SQ}
    pb = _problem(data, hyper, learn=False)
    return pb, exact_inclusion_orthogonal(data["Y"], pb.F, SIGMA2_SQ, 0.5)


@pytest.mark.parametrize("collapsed", [True, False])
def test_gibbs_matches_exact_switch_posterior_on_small_square_wave(collapsed):
    # 2 chains x 1500 kept sweeps (300 burn-in). Tolerance 0.03 absolute probability: the even latents'
    # exact P ~ 0.04, binomial sd of a frequency from 3000 draws ~0.0036, x sqrt(autocorrelation time ~ 5)
    # -> MCSE ~ 0.008, so 0.03 is ~4 MCSE
    pb, exact = _small_square_wave()
    states, _ = gb.run(jax.random.key(1), pb, False, 2, 300, 1500, collapsed=collapsed)
    freq = np.asarray(states.b).mean((0, 1))
    assert np.all(freq[::2] >= 0.99)
    assert np.max(np.abs(freq - exact)) <= 0.03, (freq, exact)


def test_paper_app_c_conditional_misses_the_exact_posterior():
    # E3 regression: the same uncollapsed sampler with the paper's theta e^c / (e^c + theta) switches the
    # odd harmonics (exact P = 1.000) off most of the time (measured on the full square wave: 0.12-0.27)
    pb, exact = _small_square_wave()
    states, _ = gb.run(jax.random.key(1), pb, False, 2, 300, 1500, collapsed=False, paper_conditional=True)
    freq = np.asarray(states.b).mean((0, 1))
    assert np.max(np.abs(freq - exact)) > 0.3, (freq, exact)


def test_swap_move_permutes_only_identical_latents():
    state = gb.State(u=jnp.arange(10.0).reshape(5, 2), H=jnp.arange(10.0).reshape(2, 5), b=jnp.arange(5.0),
                     tau=jnp.ones(2))
    group = jnp.array([0, 1, 1, 2, 1])
    seen = set()
    for k in range(20):
        out = gb._swap(jax.random.uniform(jax.random.key(k), (5,)), state, group)
        b = np.asarray(out.b).astype(int)
        assert b[0] == 0 and b[3] == 3 and sorted(b[[1, 2, 4]]) == [1, 2, 4]
        np.testing.assert_array_equal(np.asarray(out.H)[0], b)      # columns move with their switches
        np.testing.assert_array_equal(np.asarray(out.u)[:, 0], 2 * b)
        seen.add(tuple(b))
    assert len(seen) > 1


@pytest.mark.parametrize("p, r", [(1, 2), (4, 2)])
def test_scale_move_keeps_the_prior(p, r):
    """Where the likelihood is flat, the scale move must leave the prior of (H_.j, u_j) invariant: 20,000
    independent prior draws (latents j, each moved on its own), moved 5 times, still have ||H_.j||^2 / s ~
    chi2(p) and ||u_j||^2 ~ chi2(r) (Kolmogorov-Smirnov against SciPy), while the move did change them (most
    proposals accepted, signs flipped half the time). A wrong Jacobian (|c|^(p - r) without the Haar 1/|c|, i.e.
    lam = (p - r + 1)/2) fails at p < 1e-10."""
    m, s = 20_000, 1.7
    rng = np.random.default_rng(p)
    H0, u0 = np.sqrt(s) * rng.standard_normal((p, m)), rng.standard_normal((m, r))
    state = gb.State(u=jnp.asarray(u0), H=jnp.asarray(H0), b=jnp.zeros(m), tau=jnp.ones(p))
    for _ in range(5):
        normal, acc, sign = (jnp.asarray(x) for x in (rng.standard_normal(m), rng.uniform(size=m),
                                                      rng.uniform(size=m)))
        state = gb._rescale(state, s, normal, acc, sign)
    H, u = np.asarray(state.H), np.asarray(state.u)
    np.testing.assert_allclose(H * u.T[:1], H0 * u0.T[:1], rtol=1e-9)    # the products (likelihood) unchanged
    assert np.mean(np.abs(H[0] / H0[0]) != 1.0) > 0.5
    assert abs(np.mean(np.sign(H[0]) != np.sign(H0[0])) - 0.5) < 0.02                # c's sign a fair coin
    assert stats.kstest(np.sum(H ** 2, axis=0) / s, stats.chi2(p).cdf).pvalue > 1e-3
    assert stats.kstest(np.sum(u ** 2, axis=1), stats.chi2(r).cdf).pvalue > 1e-3


@pytest.mark.slow  # ~25 s of compilation through fit (integration only; the statistics are tested above)
def test_fit_gibbs_returns_switch_draws():
    # same sizes as the tests above (learned noise is a traced flag), so the compiled sweep is reused
    data, _ = za.simulate(0, n=40)
    kern = za.preset_kernels("square_wave")[:4]
    tree = inference.fit("gp_alps", data, "gibbs", seed=0, kernels=kern, num_warmup=300, num_samples=1500)
    assert tree["posterior"]["b"].shape == (2, 1500, 4) and tree["posterior"]["sigma2"].shape == (2, 1500, 1)
    assert tree["posterior"]["b"].values[..., 0].mean() > 0.99



def test_thinning_keeps_every_thinning_th_sweep_of_the_same_chains():
    """``thinning`` selects sweeps inside the program: the same chains (same keys) as an unthinned run, every
    3rd sweep after the warm-up kept (draw j is sweep num_warmup + 3 (j + 1) - 1)."""
    data, _ = za.simulate(0, n=40)
    kern = za.preset_kernels("square_wave")[:4]
    opts = {"kernels": kern, "num_warmup": 10, "progress": False}
    every = inference.fit("gp_alps", data, "gibbs", seed=3, num_samples=30, **opts)
    thinned = inference.fit("gp_alps", data, "gibbs", seed=3, num_samples=10, thinning=3, **opts)
    for site in ("H", "u", "b", "sigma2"):
        np.testing.assert_allclose(thinned["posterior"][site].values, every["posterior"][site].values[:, 2::3],
                                   rtol=1e-12, atol=1e-12)


def test_real_data_sections_run_the_sweeps_they_state():
    """A real-data section's options merge over the model's demo options (``diagnostics.planning``): a section that
    sets the number of draws of a thinned demo sampler also sets its thinning, or it would inherit it (when
    gp_alps's demo thinned by 30, diabetes4's 20,000 draws became 600,000 sweeps)."""
    import zoo

    for name in zoo.list_models():
        spec = zoo.get(name)
        for dataset, real in spec.real_datasets.items():
            for method, own in real.demo_options.items():
                demo = spec.settings.demo_options.get(method, {})
                if demo.get("thinning", 1) != 1 and "num_samples" in own:
                    assert "thinning" in own, (name, dataset, method)

@pytest.mark.slow
@pytest.mark.parametrize("collapsed", [True, False])
def test_gibbs_full_square_wave_t3(collapsed):
    # T3: 2 chains x 3000 sweeps after 1000 burn-in; odd >= 0.99; each even |freq - exact| <= 0.03 and the
    # even average within 0.015 of the exact average (absolute probabilities, notes §6 T3)
    data, _ = za.simulate(0)
    pb = _problem(data, {**za.SPEC.default_hyper, "sigma2": SIGMA2_SQ}, learn=False)
    exact = exact_inclusion_orthogonal(data["Y"], pb.F, SIGMA2_SQ, 0.5)
    states, _ = gb.run(jax.random.key(0), pb, False, 2, 1000, 3000, collapsed=collapsed)
    freq = np.asarray(states.b).mean((0, 1))
    assert np.all(freq[::2] >= 0.99)
    assert np.max(np.abs(freq[1::2] - exact[1::2])) <= 0.03
    assert abs(freq[1::2].mean() - exact[1::2].mean()) <= 0.015


def _mixture_gibbs(swap):
    data, _ = za.simulate(0, setup="periodic_mixture")
    hyper = {**za.SPEC.default_hyper, "kernels": "periodic_mixture", "sigma2": None}
    pb = _problem(data, hyper, learn=True, group=[0, 1, 1, 2, 3, 4, 5, 6, 6])
    states, _ = gb.run(jax.random.key(0), pb, True, 2, 1000, 3000, swap=swap)
    return np.asarray(states.b)


@pytest.mark.slow
def test_swap_move_makes_duplicate_marginals_equal_t9():
    # T9 (E12): with the swap move, |P(b2) - P(b3)| <= 0.1 and |P(b8) - P(b9)| <= 0.1 (absolute probability;
    # exact value 0), and some copy of each duplicate pair is on (P(b2 or b3) >= 0.99)
    b = _mixture_gibbs(True)
    f = b.mean((0, 1))
    assert abs(f[1] - f[2]) <= 0.1 and abs(f[7] - f[8]) <= 0.1, f
    assert np.maximum(b[..., 1], b[..., 2]).mean() >= 0.99 and np.maximum(b[..., 7], b[..., 8]).mean() >= 0.99


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "measured on our §5.2 simulation (seed 0, learned noise): P(b2 and b3) = 0.92 with the swap move "
    "(notes T9 expect <= 0.3). The latent noise is mixed through H*, so it is rank 3 and coherent across the "
    "9 outputs, and a second T = 7 copy fits that coherent noise; the exact posterior is not parsimonious here"))
def test_duplicate_pair_rarely_both_on_t9():
    b = _mixture_gibbs(True)
    assert (b[..., 1] * b[..., 2]).mean() <= 0.3


@pytest.mark.slow
def test_vi_vs_mcmc_on_switch_count_through_scorecard_t7():
    # T7: Gibbs (2 chains) as the reference through diagnostics.scorecard on the invariant summaries:
    # R-hat <= 1.01 and bulk ESS >= 200 for f(t) at the summary points and for n_on = E[sum_j b_j | .]; and
    # |E_q[sum b] - E_MCMC[sum b]| <= 0.3 (exact E[sum b] = 4 + sum of the even P = 4.12)
    import arviz as az

    import diagnostics

    data, _ = za.simulate(0)
    gibbs = inference.fit("gp_alps", data, "gibbs", seed=0, sigma2=SIGMA2_SQ, num_warmup=1000, num_samples=3000)
    vbt = inference.fit("gp_alps", data, "vbem", seed=0, sigma2=SIGMA2_SQ)
    summ = za.summaries(gibbs["posterior"].dataset, data, {**za.SPEC.default_hyper, "sigma2": SIGMA2_SQ})
    rhat = az.rhat(summ[["f", "n_on"]])
    ess = az.ess(summ[["f", "n_on"]], method="bulk")
    assert float(rhat["n_on"]) <= 1.01 and float(rhat["f"].max()) <= 1.01
    assert float(ess["n_on"]) >= 200 and float(ess["f"].min()) >= 200
    e_sum_b_gibbs = float(gibbs["posterior"]["b"].sum("latent").mean())
    e_sum_b_vb = float(np.sum(vbt["sample_stats"]["rho"].values[-1]))
    assert abs(e_sum_b_vb - e_sum_b_gibbs) <= 0.3, (e_sum_b_vb, e_sum_b_gibbs)
    card = diagnostics.scorecard(gibbs, {"vbem": vbt}, var_names=["n_on"])
    assert len(card) == 1 and card["std_mean_error"].iloc[0] < 5  # reported, not the T7 gate
