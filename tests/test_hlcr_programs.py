"""The HLCR kernels' compile-size helpers (issue 28): a group of lgammas or normals in one call gives the numbers of
one call each, the proposals' normals handed to the Gamma sampler give its own draw, and the collapsed sweep returns
the exact cluster sums its log joint and the next sweep read; the host draws of (w, theta) that replace the
program's follow their conditionals.

Oracles: JAX's own ``gammaln`` / ``digamma`` / ``jax.random.normal`` called one at a time, and the cluster sums
recomputed from the labels in NumPy. Tolerances: 1e-14 relative (rounding of the same series evaluated in another
program). The host draws: the closed-form Gaussian and Dirichlet moments (SciPy), within Monte Carlo error."""

from __future__ import annotations

import zoo  # noqa: F401  (JAX set-up first)

# isort: split
import jax
import numpy as np
import scipy.linalg
import scipy.stats
from jax.scipy.special import digamma, gammaln

from inference.hlcr import gibbs as hg
from inference.hlcr.common import (
    at_once,
    conditional_keys,
    conditional_normals,
    draw_conditionals,
    gamma_keys,
    gamma_normals,
    host_conditionals,
    make_config,
    normals,
    pair_data,
    sample_log_gamma,
)
from inference.uniforms import GAMMA_TRIALS
from zoo.hlcr import model_inputs, simulate

REL = 1e-14


def test_at_once_and_normals_give_the_numbers_of_one_call_each():
    a, b = np.linspace(0.01, 40.0, 7), np.linspace(0.5, 3.0, 6).reshape(2, 3)
    k1, k2 = jax.random.split(jax.random.key(3))

    @jax.jit
    def both():
        joined = (at_once(gammaln, 2.5, a, b), at_once(digamma, a, b), normals((k1, (4, 3)), (k2, (5,))))
        alone = ([gammaln(2.5), gammaln(a), gammaln(b)], [digamma(a), digamma(b)],
                 [jax.random.normal(k1, (4, 3)), jax.random.normal(k2, (5,))])
        return joined, alone

    joined, alone = both()
    for got, want in zip(jax.tree.leaves(joined), jax.tree.leaves(alone), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=REL, atol=0)


def test_gamma_and_conditional_draws_with_normals_drawn_together_equal_their_own_draws():
    conc = np.array([[0.3, 2.0, 1e-4], [5.0, 0.7, 1.2]])
    D = np.broadcast_to(np.eye(2) * 3.0, (3, 2, 2)) + 0.1
    c = np.arange(6.0).reshape(3, 2)
    n_agent, log_psi = np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 1.0]]), np.log(np.array([0.2, 0.5, 0.3]))
    key = jax.random.key(7)

    @jax.jit
    def both():
        keys = gamma_keys(key)
        x = jax.random.normal(keys[0], (GAMMA_TRIALS, *conc.shape))
        ck = conditional_keys(key)
        drawn = normals(*conditional_normals(ck, c.shape, n_agent.shape))
        return ((sample_log_gamma(keys, conc, x), draw_conditionals(ck, D, c, n_agent, log_psi, 2.0, drawn),
                 gamma_normals(keys, conc.shape)[1]),
                (sample_log_gamma(key, conc), draw_conditionals(key, D, c, n_agent, log_psi, 2.0)))

    (g, cond, shape), (g_own, cond_own) = both()
    assert shape == (GAMMA_TRIALS, *conc.shape)
    for got, want in zip(jax.tree.leaves((g, cond)), jax.tree.leaves((g_own, cond_own)), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=REL, atol=0)


def test_a_collapsed_sweep_returns_the_exact_sums_of_its_labels_and_its_log_joint_reads_them():
    data, _ = simulate(2, n_agents=6, mean_entities=3.0, mean_events=5.0, K=3, F=2, sigma=0.5)
    hyper_dict = {"K": 3, "alpha": None, "beta": 1.0, "delta": 1.0, "sigma": 0.5}
    inputs = model_inputs(data, hyper_dict)
    pdat = pair_data(inputs)
    hyper = make_config(hyper_dict, inputs["n_agents"])
    z0 = np.random.default_rng(0).integers(0, 3, pdat.gs.shape[0]).astype(np.int32)
    step = jax.jit(lambda k, s: hg.kernel(hyper).step(k, s, hg.Problem(pdat)))
    state = jax.jit(lambda z: hg.state_from_labels(z, pdat, hyper))(z0)
    for t in range(3):
        state, info = step(jax.random.key(t), state)
    z = np.asarray(state.z)
    D = np.eye(2)[None] / hyper.delta**2 + np.stack([pdat.Gs[z == k].sum(0) for k in range(3)])   # NumPy oracle
    c = np.stack([pdat.gs[z == k].sum(0) for k in range(3)])
    np.testing.assert_allclose(np.asarray(state.D), D, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(state.c), c, rtol=1e-12, atol=1e-12)
    logZ = np.array([0.5 * c[k] @ np.linalg.solve(D[k], c[k]) - 0.5 * np.linalg.slogdet(D[k])[1] for k in range(3)])
    np.testing.assert_allclose(np.asarray(state.logZ), logZ, rtol=1e-12)
    recomputed = jax.jit(lambda s: hg.log_joint(s, pdat, hyper))(state)     # exact=False: from the labels again
    np.testing.assert_allclose(float(info.objective), float(recomputed), rtol=1e-13)


def test_host_draws_of_w_and_theta_follow_their_closed_form_conditionals_within_mcse():
    """``host_conditionals`` given fixed statistics: w_k ~ N(D_k^-1 c_k, D_k^-1) (the sample mean of every
    coordinate within 4.5 MCSE of D_k^-1 c_k, MCSE = sqrt(Sigma_ii / S); every covariance entry within 4.5 of its
    standard error sqrt((Sigma_ii Sigma_jj + Sigma_ij^2) / S), the Gaussian sample covariance's), theta_i ~
    Dir(beta psi + N_i) (every mean within 4.5 MCSE of SciPy's Dirichlet mean, MCSE from SciPy's Dirichlet variance,
    a concentration of 1e-3 among them); 68 comparisons at 4.5 sd: a false alarm has probability < 1e-3. Same seed,
    same draws."""
    rng = np.random.default_rng(11)
    K, F, N, S, beta = 3, 3, 2, 40_000, 2.0
    A = rng.normal(size=(K, F, F))
    D = np.eye(F) + A @ np.swapaxes(A, 1, 2)                 # SPD, the prior precision included
    c = rng.normal(size=(K, F)) * 3.0
    n_agent = np.array([[4.0, 0.0, 1.0], [0.0, 7.0, 2.0]])
    log_psi = np.log(np.array([0.6, 0.4 - 5e-4, 5e-4]))      # beta psi_3 = 1e-3 where N_i3 = 0
    n_agent[0, 2] = 0.0
    stats = [np.broadcast_to(a, (S, *a.shape)) for a in (D, c, n_agent, log_psi)]
    w, theta = host_conditionals(np.random.default_rng(5), *stats, beta)
    assert w.shape == (S, K, F) and theta.shape == (S, N, K)
    for k in range(K):
        cov = scipy.linalg.inv(D[k])                           # closed form: N(D^-1 c, D^-1)
        mean = cov @ c[k]
        assert np.all(np.abs(w[:, k].mean(0) - mean) < 4.5 * np.sqrt(np.diag(cov) / S)), k
        se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / S)
        assert np.all(np.abs(np.cov(w[:, k].T) - cov) < 4.5 * se), k
    for i in range(N):
        conc = beta * np.exp(log_psi) + n_agent[i]
        want, var = scipy.stats.dirichlet.mean(conc), scipy.stats.dirichlet.var(conc)
        assert np.all(np.abs(theta[:, i].mean(0) - want) < 4.5 * np.sqrt(var / S)), i
    np.testing.assert_allclose(theta.sum(-1), 1.0, rtol=1e-12)
    few = [a[:10] for a in stats]
    first, again, other = (host_conditionals(np.random.default_rng(seed), *few, beta) for seed in (5, 5, 6))
    for a, b, o in zip(first, again, other, strict=True):
        np.testing.assert_array_equal(a, b)
        assert not np.allclose(a, o)
