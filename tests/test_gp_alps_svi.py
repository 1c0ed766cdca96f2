"""The paper's Concrete SVI for GP-ALPS (inference/gp_alps/svi.py, App. B, notes §3.1): the B.7 schedule
(T13), the relaxed KL in logit space (T14), selection on the square wave, and Fig. 1(b) vs Gibbs (T6, slow).
The kernel's written-out SVI step against NumPyro (its start is ``SVI.init`` of the guide, its ELBO and gradient
NumPyro's densities of ``relaxed_model`` and ``guide`` at the reparameterised draws, its host draws the guide's
seeded ``jax.random`` draws), the noise it draws, and the programs a fit builds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.util import log_density
from scipy import stats

import inference
from inference._timing import Stopwatch
from inference.gp_alps import gibbs as gb
from inference.gp_alps import svi as sv
from zoo import gp_alps as za


def test_temperature_schedule_b7():
    # T13: T(0) = 0.66 +- 1e-3, T(0.75N) = 10 +- 1e-9, T(N) in [0.66, 0.662], symmetric about 0.75N
    N = 10000
    assert abs(float(sv.temperature(0, N)) - 0.66) < 1e-3
    assert abs(float(sv.temperature(0.75 * N, N)) - 10.0) < 1e-9
    assert 0.66 <= float(sv.temperature(N, N)) <= 0.662
    d = np.arange(1, 2000)
    np.testing.assert_allclose(sv.temperature(0.75 * N + d, N), sv.temperature(0.75 * N - d, N), rtol=1e-12)


def test_relaxed_kl_in_logit_space_equals_relaxed_bernoulli_kl():
    # T14: the Monte Carlo KL between two binary Concretes computed in logit space (Logistic densities, what
    # the guide/model use) equals the one from RelaxedBernoulliLogits.log_prob on b in (0, 1) within 4 MC
    # standard errors when temperatures are >= 0.5; and stays finite where the (0,1) version overflows
    lq, lp, rho_logit, th_logit = 0.66, 0.5, 1.5, 0.0
    z = dist.Logistic(rho_logit / lq, 1 / lq).sample(jax.random.key(0), (200_000,))
    kl_z = dist.Logistic(rho_logit / lq, 1 / lq).log_prob(z) - dist.Logistic(th_logit / lp, 1 / lp).log_prob(z)
    b = jax.nn.sigmoid(z)
    kl_b = (dist.RelaxedBernoulliLogits(lq, rho_logit).log_prob(b)
            - dist.RelaxedBernoulliLogits(lp, th_logit).log_prob(b))
    ok = (b > 0) & (b < 1)
    diff = np.asarray(kl_z - kl_b)[np.asarray(ok)]
    assert abs(diff.mean()) < 4 * diff.std() / np.sqrt(diff.size) + 1e-12
    z2 = dist.Logistic(20.0 / 0.1, 1 / 0.1).sample(jax.random.key(1), (1000,))
    kl2 = dist.Logistic(20.0 / 0.1, 1 / 0.1).log_prob(z2) - dist.Logistic(0.0, 2.0).log_prob(z2)
    assert np.isfinite(np.asarray(kl2)).all()


def test_svi_concrete_switches_on_the_odd_harmonics_of_a_small_square_wave():
    # n = 40, harmonics 1-4, learned noise, 2000 Adam steps with the B.7 schedule: rho > 0.9 on harmonics
    # 1 and 3 (exact P = 1.000); the even ones are not gated here (slow T6 does, at 5000 steps)
    data, _ = za.simulate(0, n=40)
    kern = za.preset_kernels("square_wave")[:4]
    tree = inference.fit("gp_alps", data, "svi_concrete", seed=0, kernels=kern, num_steps=2000, num_samples=200)
    rho = np.array(tree.attrs["rho"] if isinstance(tree.attrs["rho"], list) else eval(tree.attrs["rho"]))
    assert rho[0] > 0.9 and rho[2] > 0.9, rho
    assert np.isfinite(tree["sample_stats"]["log_q"].values).all()
    assert tree["sample_stats"]["temperature"].values.max() > 9.9


@pytest.mark.slow
def test_svi_concrete_reproduces_fig_1b_against_gibbs_t6():
    # T6: square wave (n = 100, m = 8), learned noise, 5000 steps, S = 4, lr 0.01, 3 seeds: rho > 0.9 on
    # odd, < 0.1 on even in >= 2/3 seeds; |rho_j - P_Gibbs(b_j = 1)| <= 0.1 for all j (absolute probability)
    data, _ = za.simulate(0)
    hyper = dict(za.SPEC.default_hyper)
    kw0 = za.model_inputs(data, hyper)
    kw = {"F": jnp.asarray(kw0["F"]), "Y": jnp.asarray(kw0["Y"]), "theta": jnp.asarray(kw0["theta"]), "s": 1.0,
          "sigma2": None, "a0": 2.0, "b0": 0.1}
    from inference.gp_alps.common import Problem
    F = kw0["F"]
    lam, V = np.linalg.eigh(np.einsum("jnr,jns->jrs", F, F))
    pb = Problem(jnp.asarray(F), jnp.asarray(np.clip(lam, 0, None)), jnp.asarray(V), jnp.asarray(data["Y"]),
                 jnp.zeros(8), 1.0, jnp.ones(1), 2.0, 0.1, jnp.arange(8))
    states, _ = gb.run(jax.random.key(0), pb, True, 2, 1000, 2000)
    p_gibbs = np.asarray(states.b).mean((0, 1))
    good = 0
    for seed in range(3):
        params, _, _ = sv.fit_params(jax.random.key(seed), kw, 5000)
        rho = np.asarray(jax.nn.sigmoid(params["logit_rho"]))
        good += bool(np.all(rho[::2] > 0.9) and np.all(rho[1::2] < 0.1) and np.max(np.abs(rho - p_gibbs)) <= 0.1)
    assert good >= 2


# --------------------------------------------------------------------------------------------------
# the written-out SVI step against NumPyro's SVI of relaxed_model and guide
# --------------------------------------------------------------------------------------------------

def small_kw(sigma2):
    """n = 24, harmonics 1-3 (m = 3, r = 2), one output; s = 1.3, so the prior scale of H enters."""
    data, _ = za.simulate(0, n=24)
    kw = za.model_inputs(data, {**za.SPEC.default_hyper, "kernels": za.preset_kernels("square_wave")[:3]})
    return {"F": np.asarray(kw["F"]), "Y": np.asarray(kw["Y"]), "theta": np.asarray(kw["theta"]), "s": 1.3,
            "sigma2": sigma2, "a0": 2.0, "b0": 0.1}


def numpyro_svi(kw):
    """NumPyro's SVI of the kernel's model and guide, and its unconstrained start at key(3) (one compiled call: run
    op by op, the set-up compiled a program per operation)."""
    svi = SVI(sv.relaxed_model, sv.guide, optax.adam(0.01), Trace_ELBO(num_particles=4))
    start = jax.jit(lambda k: svi.optim.get_params(svi.init(k, **kw, lam_q=0.66).optim_state))(jax.random.key(3))
    return svi, start


@pytest.mark.parametrize("sigma2", [None, 0.04], ids=["learned_noise", "fixed_noise"])
def test_host_start_is_numpyros_svi_init_of_the_guide(sigma2):
    # the flat unconstrained start (NumPy, threefry replayed; and the kernel's traced init) equals NumPyro's SVI.init
    # of the guide, parameter by parameter in the layout's order, to 1e-12 (only the last bits of erfinv differ),
    # and Adam starts at zero
    kw = small_kw(sigma2)
    _, expected = numpyro_svi(kw)
    layout = sv.layout_of(kw)
    problem = sv.SVIProblem(kw, 10.0, True, 0.0)
    start = sv.host_init(jax.random.key(3), problem, optax.adam(0.01))
    traced = jax.jit(lambda k: sv.init(k, problem, optax.adam(0.01)))(jax.random.key(3))   # the kernel's init
    assert set(layout.shapes) == set(expected)
    for got in (start, traced):
        got = layout.unflatten(np.asarray(got.x))
        for name in layout.shapes:
            np.testing.assert_allclose(got[name], np.asarray(expected[name]), rtol=0, atol=1e-12, err_msg=name)
    assert all(np.all(a == 0) for a in jax.tree.leaves(start.adam)) and int(start.t) == 0


@pytest.mark.parametrize("sigma2", [None, 0.04], ids=["learned_noise", "fixed_noise"])
def test_relaxed_elbo_and_its_gradient_are_numpyros_at_the_reparameterised_draws(sigma2):
    # oracle: NumPyro's constraint transforms (SVI's constrain_fn), and log_density of relaxed_model minus that of
    # guide at u = mu + L eps, H = mH + sqrt(sH) eps', z = (logit rho + l) / lam_q, sigma2 = exp(loc + scale eps''),
    # differentiated through those draws (what Trace_ELBO does with reparameterised sites). Away from the start
    # (a random point), 3 particles: values and gradient to 1e-9 relative (rounding of sums of ~100 terms)
    kw = small_kw(sigma2)
    svi, _ = numpyro_svi(kw)
    layout = sv.layout_of(kw)
    x = np.random.default_rng(1).normal(0.0, 0.5, layout.size)
    eps = sv.noise(jax.random.key(4), 3, layout)
    lam_q, log_norm = 0.8, sv.inverse_gamma_log_norm(kw["a0"], kw["b0"])

    def reference(x):
        params = svi.constrain_fn(layout.unflatten(x))
        total = []
        for i in range(3):
            eps_u, eps_H, eps_s, ell = (None if e is None else e[i] for e in eps)
            draw = {"u": params["mu"] + jnp.einsum("jab,jb->ja", params["L"], eps_u),
                    "H": params["mH"] + jnp.sqrt(params["sH"]) * eps_H, "z": (params["logit_rho"] + ell) / lam_q}
            if sigma2 is None:
                draw["sigma2"] = jnp.exp(params["sig_loc"] + params["sig_scale"] * eps_s)
            log_p, _ = log_density(sv.relaxed_model, (), {**kw, "lam_q": lam_q}, draw)
            log_q, _ = log_density(sv.guide, (), {**kw, "lam_q": lam_q}, {**params, **draw})
            total.append(log_p - log_q)
        return jnp.stack(total)

    def mean_and_particles(elbo):
        return jax.jit(jax.value_and_grad(lambda x: (jnp.mean(elbo(x)), elbo(x)), has_aux=True))(x)

    (_, ours), grad_ours = mean_and_particles(lambda x: sv.relaxed_elbo(layout, x, eps, kw, lam_q, log_norm))
    (_, expected), grad_ref = mean_and_particles(reference)
    np.testing.assert_allclose(ours, expected, rtol=1e-9)
    np.testing.assert_allclose(grad_ours, grad_ref, rtol=1e-9, atol=1e-9 * np.max(np.abs(grad_ref)))


def test_noise_is_iid_standard_normal_and_logistic():
    # 20,000 particles of m = 3, r = 2, p = 2 (learned noise): every normal coordinate and the logistic ones pass a
    # Kolmogorov-Smirnov test at 1e-3, pooled as well, and the Box-Muller pairs (cos, sin of one draw) and
    # neighbouring coordinates are uncorrelated: |r| < 4 / sqrt(N) (4 standard errors of a zero correlation)
    layout = sv.Layout(3, 2, 2, True)
    eps_u, eps_H, eps_s, ell = (np.asarray(a) for a in sv.noise(jax.random.key(0), 20_000, layout))
    normal = np.concatenate([eps_u.reshape(20_000, -1), eps_H.reshape(20_000, -1), eps_s], axis=1)
    assert normal.shape[1] == 6 + 6 + 2
    for j in range(normal.shape[1]):
        assert stats.kstest(normal[:, j], "norm").pvalue > 1e-3, j
    for j in range(ell.shape[1]):
        assert stats.kstest(ell[:, j], "logistic").pvalue > 1e-3, j
    assert stats.kstest(normal.ravel(), "norm").pvalue > 1e-3
    corr = np.corrcoef(np.concatenate([normal, ell], axis=1).T)
    assert np.max(np.abs(corr - np.eye(corr.shape[0]))) < 4 / np.sqrt(20_000)


def test_host_draws_are_the_guides_seeded_draws():
    # draw i seeded with split(key, n)[i], split in four: NumPyro's MultivariateNormal, Normal and LogNormal
    # samplers and jax.random.bernoulli with those keys, and their log densities, to 1e-12 (erfinv's last bits)
    rng = np.random.default_rng(2)
    m, r, p = 3, 2, 2
    L = np.tril(rng.normal(size=(m, r, r)), -1) + np.eye(r) * rng.uniform(0.5, 1.5, (m, r, 1))
    params = {"mu": rng.normal(size=(m, r)), "L": L, "mH": rng.normal(size=(p, m)),
              "sH": rng.uniform(0.1, 1.0, (p, m)), "logit_rho": np.array([-1.0, 0.3, 2.0]),
              "sig_loc": rng.normal(size=p), "sig_scale": rng.uniform(0.1, 0.5, p)}
    draws, log_q = sv.host_draws(params, jax.random.key(7), 5)

    def guide_draw(k):   # one compiled call for the 5 keys (op by op, every operation compiled a program)
        ku, kh, kb, ks = jax.random.split(k, 4)
        qu = dist.MultivariateNormal(params["mu"], scale_tril=params["L"])
        qh = dist.Normal(params["mH"], np.sqrt(params["sH"]))
        qs = dist.LogNormal(params["sig_loc"], params["sig_scale"])
        u, H, sig = qu.sample(ku), qh.sample(kh), qs.sample(ks)
        b = jax.random.bernoulli(kb, jax.nn.sigmoid(params["logit_rho"]), (m,)).astype(jnp.int32)
        return {"u": u, "H": H, "sigma2": sig, "b": b}, qu.log_prob(u).sum() + qh.log_prob(H).sum() + qs.log_prob(
            sig).sum()

    want, want_log_q = jax.jit(jax.vmap(guide_draw))(jax.random.split(jax.random.key(7), 5))
    for name in ("u", "H", "sigma2"):
        np.testing.assert_allclose(draws[name], want[name], rtol=1e-12, atol=1e-12, err_msg=name)
    np.testing.assert_array_equal(draws["b"], want["b"])
    np.testing.assert_allclose(log_q, want_log_q, rtol=1e-12)


def test_a_fit_builds_its_run_and_the_densities_only_and_a_second_fit_nothing():
    # issue 28: the start and the draws from the fitted guide run on the host; the first fit builds at most the
    # run and the tree's densities (fewer where earlier tests built them), a fit with another seed and another
    # num_steps and num_samples none
    data, _ = za.simulate(0, n=24)
    kern = za.preset_kernels("square_wave")[:3]
    with Stopwatch() as first:
        inference.fit("gp_alps", data, "svi_concrete", seed=0, kernels=kern, num_steps=30, num_samples=10)
    assert set(first.xla_compiles) <= {"jit(optimiser_run)", "jit(densities)"}, first.xla_compiles
    with Stopwatch() as second:
        tree = inference.fit("gp_alps", data, "svi_concrete", seed=1, kernels=kern, num_steps=40, num_samples=7)
    assert second.xla_compiles == [], second.xla_compiles
    assert tree["posterior"]["u"].shape == (1, 7, 3, 2) and tree["sample_stats"]["elbo_relaxed"].shape[-1] == 40
