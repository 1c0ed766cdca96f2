"""A toy kernel added by following the recipe of docs/guide/adding_a_model.md to the letter.

The model: y_i ~ N(mu, 1/lam), mu | lam ~ N(m0, 1/(k0 lam)), lam ~ Gamma(a0, b0) (Bishop 2006, §10.1.3).
The kernel: mean-field CAVI, q(mu, lam) = N(mu | m_N, 1/s_N) Gamma(lam | a_N, b_N), with the updates of
Bishop eqs. 10.26-10.30:

    m_N = (k0 m0 + n ybar) / (k0 + n),       s_N = (k0 + n) E[lam],
    a_N = a0 + (n + 1) / 2,
    b_N = b0 + 1/2 E_mu[ sum_i (y_i - mu)^2 + k0 (mu - m0)^2 ],

and the ELBO as ``Info.objective``. In a real kernel this file would be ``inference/<paper>/<algorithm>.py``
and the model ``zoo/<model>.py``; here both sit in ``tests/`` so the toy never reaches users.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import digamma, gammaln

import zoo
from inference import Draws, host_draws, programs, register_method
from inference._methods import Option
from inference.base import Kernel
from inference.loop import StopRule, run_until_converged

# ---- the model (recipe step 1: zoo/<model>.py) --------------------------------------------------------


def model(y, m0=0.0, k0=1.0, a0=2.0, b0=2.0):
    lam = numpyro.sample("lam", dist.Gamma(a0, b0))
    mu = numpyro.sample("mu", dist.Normal(m0, 1.0 / jnp.sqrt(k0 * lam)))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(lam)), obs=y)


def simulate(seed, n=50):
    rng = np.random.default_rng(seed)
    return {"y": rng.normal(1.5, 0.7, size=n)}, {"mu": 1.5, "lam": 1 / 0.49}


SPEC = zoo.ModelSpec(
    name="toy_normal_gamma", model=model, simulate=simulate, paper="Bishop (2006) §10.1.3",
    data_fields=(zoo.DataField("y", ("n",), doc="observations"),),
    hyperparameters={"m0": zoo.Hyper(0.0, "real", "prior mean of mu"),
                     "k0": zoo.Hyper(1.0, "positive", "prior precision scale of mu"),
                     "a0": zoo.Hyper(2.0, "positive", "Gamma shape of lam"),
                     "b0": zoo.Hyper(2.0, "positive", "Gamma rate of lam")},
    settings=zoo.ZooSettings(tiny_sizes={"n": 20}, demo_sizes={"n": 50}))

# ---- the kernel (recipe step 2: inference/<paper>/<algorithm>.py) --------------------------------------


class Problem(NamedTuple):
    y: jax.Array
    m0: jax.Array
    k0: jax.Array
    a0: jax.Array
    b0: jax.Array


class State(NamedTuple):
    m: jax.Array      # E_q[mu]
    s: jax.Array      # precision of q(mu)
    a: jax.Array      # shape of q(lam)
    b: jax.Array      # rate of q(lam)


class Info(NamedTuple):
    objective: jax.Array   # the ELBO after the step


def init(key, problem: Problem) -> State:
    return State(problem.y.mean() + jax.random.normal(key), jnp.asarray(1.0), problem.a0, problem.b0)


def elbo(state: State, p: Problem):
    n = p.y.shape[0]
    e_lam, e_log_lam = state.a / state.b, digamma(state.a) - jnp.log(state.b)
    e_sq = jnp.sum((p.y - state.m) ** 2) + n / state.s          # E_mu sum (y - mu)^2
    e_prior_sq = p.k0 * ((state.m - p.m0) ** 2 + 1 / state.s)   # E_mu k0 (mu - m0)^2
    log_lik = 0.5 * n * (e_log_lam - jnp.log(2 * jnp.pi)) - 0.5 * e_lam * e_sq
    log_p_mu = 0.5 * (jnp.log(p.k0) + e_log_lam - jnp.log(2 * jnp.pi)) - 0.5 * e_lam * e_prior_sq
    log_p_lam = p.a0 * jnp.log(p.b0) - gammaln(p.a0) + (p.a0 - 1) * e_log_lam - p.b0 * e_lam
    h_mu = 0.5 * (1 + jnp.log(2 * jnp.pi) - jnp.log(state.s))
    h_lam = state.a - jnp.log(state.b) + gammaln(state.a) + (1 - state.a) * digamma(state.a)
    return log_lik + log_p_mu + log_p_lam + h_mu + h_lam


def step(key, state: State, p: Problem) -> tuple[State, Info]:
    """One CAVI sweep, Bishop eqs. 10.26-10.30."""
    n = p.y.shape[0]
    m = (p.k0 * p.m0 + p.y.sum()) / (p.k0 + n)
    s = (p.k0 + n) * state.a / state.b
    a = p.a0 + 0.5 * (n + 1)
    b = p.b0 + 0.5 * (jnp.sum((p.y - m) ** 2) + n / s + p.k0 * ((m - p.m0) ** 2 + 1 / s))
    new = State(m, s, a, b)
    return new, Info(elbo(new, p))


def draw(seed, state: State, n: int):
    """n draws from q and log q at each, in NumPy (a one-shot job: compiled, it would cost more than the fit)."""
    rng, st = np.random.default_rng(seed), jax.device_get(state)
    sd = 1 / np.sqrt(st.s)
    mu = st.m + sd * rng.standard_normal(n)
    lam = rng.gamma(st.a, 1 / st.b, n)
    return {"mu": mu, "lam": lam}, host_draws.normal_log_pdf(mu, st.m, sd) + host_draws.gamma_log_pdf(lam, st.a, st.b)


@programs.cached
def kernel() -> Kernel:
    """The kernel record (``inference.base``). The toy has no static settings (its hyperparameters are arrays of the
    problem), so its factory takes no ``Config``."""
    return Kernel(init, step, draw)


@register_method("cavi", kind="variational", models=("toy_normal_gamma",), options={
    "max_iter": Option(100, "positive_int", "most CAVI sweeps", tiny=20),
    "tol": Option(1e-10, "positive", "relative ELBO change that stops the sweeps"),
    "num_samples": Option(1000, "positive_int", "draws from q", tiny=50)})
def run(ctx) -> Draws:
    """Mean-field CAVI for the normal-gamma model (Bishop §10.1.3)."""
    o, h = ctx.options, ctx.hyper
    # NumPy arrays: compiled programs take them as they are (jnp.asarray would run as programs of their own)
    problem = Problem(np.asarray(ctx.data["y"], float), *(np.float64(h[k]) for k in ("m0", "k0", "a0", "b0")))
    k = kernel()
    result = run_until_converged(k.init, k.step, problem, ctx.key, StopRule(o["max_iter"], o["tol"]),
                                 progress=o["progress"], desc="toy cavi")
    draws, log_q = k.draw((ctx.seed, 1), result.state, o["num_samples"])
    return Draws(posterior={k: v[None] for k, v in draws.items()}, sample_stats={"log_q": log_q[None]},
                 traces={"elbo": result.info.objective}, objective=result.objective,
                 converged=result.converged, n_iter=result.n_iter)
