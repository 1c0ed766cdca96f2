"""GP-ALPS model (zoo/gp_alps.py): the switch-summed likelihood is exact, the exact square-wave
reference (notes §2.4, T1), NUTS on a tiny problem hits the exact inclusion probabilities, bad input."""

from __future__ import annotations

import numpy as np
import pytest

import inference
import zoo
from inference.gp_alps.common import exact_inclusion_orthogonal, log_joint_b
from zoo import gp_alps as za

SIGMA2_SQ = 0.0285  # notes §5.1: the 16-parameter least-squares residual variance of the square wave


def test_square_wave_factors_are_orthogonal_on_the_grid():
    data, truth = za.simulate(0)
    F = za.model_inputs(data, za.SPEC.default_hyper)["F"]
    assert F.shape == (8, 100, 2) and data["Y"].shape == (100, 1) and data["t"].shape == (100, 1)
    G = np.einsum("jnr,kns->jkrs", F, F)
    off = G.copy()
    for j in range(8):
        off[j, j] = 0.0
        np.testing.assert_allclose(G[j, j], 50.0 * np.eye(2), atol=1e-9)  # Phi_j^T Phi_j = n/2 I
    assert np.abs(off).max() < 1e-9
    np.testing.assert_array_equal(truth["active"], [1, 0, 1, 0, 1, 0, 1, 0])


def test_summed_switch_likelihood_equals_brute_force_logsumexp():
    # p = 2, m = 3, n = 5 with random latents: the O(2^m m^2) quadratic form must equal the direct
    # log-sum-exp of log p(b) + sum log N(y; H(x * b), sigma2) over the 8 patterns (exact algebra: 1e-10)
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp

    rng = np.random.default_rng(1)
    t = rng.uniform(0, 5, size=(5, 1))
    kern = [{"kind": "rbf", "lengthscale": 1.0}, {"kind": "linper", "period": 3.0}, {"kind": "periodic",
                                                                                  "period": 2.0, "lengthscale": 1.0}]
    Y = rng.standard_normal((5, 2))
    kw = za.model_inputs({"t": t, "Y": Y}, {**za.SPEC.default_hyper, "kernels": kern, "theta": 0.3})
    F = jnp.asarray(kw["F"])
    u = rng.standard_normal((3, F.shape[2]))
    H = rng.standard_normal((2, 3))
    sig2 = np.array([0.3, 0.7])
    X = np.einsum("jnr,jr->jn", kw["F"], u)

    @jax.jit  # both sides evaluated as one program each (eager op-by-op evaluation compiles one per operation)
    def fast_and_brute(X, H, sig2, Y, F, u, configs, theta):
        a, A, const = za.switch_terms(X, H, 1.0 / sig2, Y)
        fast = const + logsumexp(za.config_log_joint(a, A, configs, za.log_prior_table(configs, theta)))
        brute = logsumexp(jnp.stack([log_joint_b(configs[i], u, H, sig2, F, Y, jnp.full(3, 0.3))
                                     for i in range(configs.shape[0])]))
        return fast, brute

    fast, brute = fast_and_brute(X, H, sig2, Y, F, u, jnp.asarray(kw["configs"]), jnp.asarray(kw["theta"]))
    assert abs(float(fast) - float(brute)) < 1e-10
    # and the Gram matrices of the eigen factors reproduce the kernels
    for j, k in enumerate(za.resolve_kernels(kern)):
        np.testing.assert_allclose(kw["F"][j] @ kw["F"][j].T, za.gram(t, t, k), atol=1e-8)


def test_exact_square_wave_reference_selects_odd_harmonics_and_matches_monte_carlo():
    # notes T1: sigma2 = 0.0285, theta = 0.5: P(b = 1 | y) > 0.999 on odd and in [0.01, 0.08] on even
    data, _ = za.simulate(0)
    F = za.model_inputs(data, za.SPEC.default_hyper)["F"]
    p = exact_inclusion_orthogonal(data["Y"], F, SIGMA2_SQ, 0.5)
    assert np.all(p[::2] > 0.999)
    assert np.all((p[1::2] >= 0.01) & (p[1::2] <= 0.08)), p
    # brute-force Monte Carlo over h ~ N(0, 1) (10^6 draws) of E[BF_j(h)] for the even latents: +-5% relative
    # on the Bayes factor (the MC relative standard error is ~1% here)
    rng = np.random.default_rng(0)
    h2 = rng.standard_normal(1_000_000) ** 2
    y = data["Y"][:, 0]
    for j in (1, 3, 5, 7):
        q = F[j].T @ y / np.sqrt(50.0)
        var1 = h2[:, None] * 50.0 + SIGMA2_SQ
        bf = np.exp(np.sum(-0.5 * np.log(var1 / SIGMA2_SQ) - 0.5 * q ** 2 * (1 / var1 - 1 / SIGMA2_SQ), axis=1))
        p_mc = bf.mean() / (bf.mean() + 1.0)
        assert abs(p_mc / p[j] - 1) < 0.05, (j, p_mc, p[j])


def test_nuts_on_three_latents_matches_exact_inclusion_probabilities():
    # Tiny square wave (n = 40, latents 1-3, sigma2 fixed): NUTS on (u, H) with b summed out; the
    # Rao-Blackwellised P(b_j = 1 | u, H, y) averaged over draws must match the exact orthogonal-design
    # answer (0.044 for latent 2) within 0.03 absolute probability (~4 MCSE at 2 x 300 draws, measured
    # draw sd of P(b_2 | .) ~ 0.1 with ESS ~ 100).
    data, _ = za.simulate(0, n=40)
    kern = za.preset_kernels("square_wave")[:3]
    tree = inference.fit("gp_alps", data, "nuts", seed=0, kernels=kern, sigma2=SIGMA2_SQ, num_warmup=300,
                         num_samples=300)
    hyper = {**za.SPEC.default_hyper, "kernels": kern, "sigma2": SIGMA2_SQ}
    summ = za.summaries(tree["posterior"].dataset, data, hyper)
    p_nuts = summ["p_on"].mean(("chain", "draw")).values
    exact = exact_inclusion_orthogonal(data["Y"], za.model_inputs(data, hyper)["F"], SIGMA2_SQ, 0.5)
    assert np.max(np.abs(p_nuts - exact)) < 0.03, (p_nuts, exact)
    assert set(tree.children) >= {"posterior", "log_likelihood", "log_prior", "sample_stats"}


@pytest.mark.parametrize("bad, match", [
    ({"theta": 1.5}, "theta"), ({"theta": [0.5, 0.5]}, "theta"), ({"sigma2": -1.0}, "sigma2"),
    ({"kernels": "nope"}, "kernels"), ({"kernels": [{"kind": "rbf", "lengthscale": -1.0}]}, "lengthscale"),
    ({"kernels": [{"kind": "rbf", "lengthscale": 1.0, "feature": 3}]}, "feature"),
    ({"kernels": [{"kind": "linper", "period": 5.0}] * 15}, "m <= 14"),
])
def test_bad_hyperparameters_raise_before_compilation(bad, match):
    data, _ = za.simulate(0, n=20)
    with pytest.raises(ValueError, match=match):
        inference.fit("gp_alps", data, "nuts", seed=0, **bad)


def test_bad_data_shapes_raise():
    data, _ = za.simulate(0, n=20)
    with pytest.raises(ValueError, match="t"):
        inference.fit("gp_alps", {"t": data["t"][:, 0], "Y": data["Y"]}, "nuts", seed=0)
    with pytest.raises(ValueError, match="n"):
        inference.fit("gp_alps", {"t": data["t"], "Y": data["Y"][:10]}, "nuts", seed=0)


def test_other_setups_simulate_with_matching_presets():
    d2, t2 = za.simulate(1, setup="periodic_mixture")
    assert d2["Y"].shape == (150, 9) and t2["test"]["Y"].shape == (50, 9)
    assert len(za.resolve_kernels(t2["hyperparameters"]["kernels"])) == 9
    d3, t3 = za.simulate(2, setup="additive_rbf", n=50, d=4)
    assert d3["t"].shape == (50, 4)
    assert len(za.resolve_kernels("additive_rbf", 4)) == 4
    assert "gp_alps" in zoo.list_models()


@pytest.mark.slow  # compiles SVI + the tree builder (~15-80 s on the shared machine)
def test_generic_svi_autoguide_runs_with_sampled_noise():
    # regression: the noise site must not reuse the "output" plate at another dim (AutoNormal rejects it)
    data, _ = za.simulate(0, n=40)
    tree = inference.fit("gp_alps", data, "svi", seed=0, kernels=za.preset_kernels("square_wave")[:2],
                         num_steps=100, num_samples=20)
    assert tree["posterior"]["sigma2"].shape == (1, 20, 1)
