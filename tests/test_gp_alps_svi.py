"""The paper's Concrete SVI for GP-ALPS (inference/gp_alps/svi.py, App. B, notes §3.1): the B.7 schedule
(T13), the relaxed KL in logit space (T14), selection on the square wave, and Fig. 1(b) vs Gibbs (T6, slow)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

import inference
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
