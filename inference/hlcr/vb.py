"""Mean-field VB-EM for HLCR (notes §3.8 [ours, checked]; not in the paper, which uses collapsed Gibbs).

q(w, theta, z) = prod_k N(w_k | m_k, S_k) prod_i Dir(theta_i | a_i) prod_e Cat(z_e | r_e), and psi a point
estimate (MAP: psi is not conjugate to Dir(theta_i | beta psi)). With the per-pair statistics of
``inference.hlcr.common`` (Gs_e = X_e^T X_e / s^2, gs_e = X_e^T y_e / s^2, const_e = -n_e/2 log 2 pi s^2
- q_e / 2 s^2), one iteration updates the blocks in turn, each to its exact maximiser of the bound:

1. q(w):      S_k^-1 = I/delta^2 + sum_e r_ek Gs_e   (soft D^(k)),   m_k = S_k sum_e r_ek gs_e  (soft c^(k));
2. psi:       argmax over the simplex of  sum_k (alpha/K - 1) log psi_k
              + sum_i [lgamma(beta) - sum_k lgamma(beta psi_k) + sum_k beta psi_k E[log theta_ik]]
              (softmax parameterisation, gradient ascent with a step accepted only when the objective does
              not decrease: monotone by construction);
3. q(theta):  a_ik = beta psi_k + sum_{e in agent i} r_ek,
              E[log theta_ik] = digamma(a_ik) - digamma(sum_k a_ik);
4. q(z):      log r_ek = E[log theta_{i(e)k}] + const_e + m_k^T gs_e - 1/2 tr(Gs_e (m_k m_k^T + S_k)) + const.

The bound (stored per iteration in ``traces["elbo"]``, non-decreasing; notes E1) is computed in closed form:

    ELBO = sum_ek r_ek {const_e + m_k^T gs_e - 1/2 tr(Gs_e (m_k m_k^T + S_k)) + E[log theta_ik] - log r_ek}
         + sum_i {lgamma(beta) - sum_k lgamma(beta psi_k) + sum_k (beta psi_k - 1) E[log theta_ik]
                  - lgamma(sum_k a_ik) + sum_k lgamma(a_ik) - sum_k (a_ik - 1) E[log theta_ik]}
         + sum_k {-F/2 log delta^2 - (|m_k|^2 + tr S_k)/(2 delta^2) + 1/2 log|S_k| + F/2}
         + log Dir(psi | alpha/K)

(the last term makes it the bound on log p(y, psi), since psi is a point estimate). Space: it is the ELBO on the
label-augmented space, E_q[log p(y, z, w, theta, psi) - log q(w, theta, z)] at psi = its point estimate; the model
(``zoo.hlcr.model``) sums z out, and the ELBO of q(w, theta) on that marginal space is >= this bound
(tests/test_log_q.py checks both by Monte Carlo). The soft statistics
sum_e r_ek Gs_e, sum_e r_ek gs_e, sum_e r_ek are ``common.cluster_sums`` with soft labels, i.e. the
federated VB-EM message of an agent (notes E3).

Draws: w ~ q(w), theta ~ q(theta), z ~ Cat(r), psi = the point estimate in every draw; ``log_q`` of
(w, theta) is stored for PSIS k-hat (psi is a point mass and excluded from it; z is summed out by the model, so
its draws are for display and not in log q). The fitted q is stored in group ``vbem`` (``q_dataset``).

The pairs are padded to ``programs.bucket(E)`` (``run``), so data sets of similar size share the compiled run: the
pair mask multiplies every responsibility, so a padded pair has r_e = 0 and adds nothing to the soft statistics of
q(w), to a_i or to the bound (its own terms are all weighted by r_e); the fitted r is cut back to the E real pairs.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from jax.scipy.special import digamma, gammaln

from inference import host_draws as hd
from inference import host_keys, programs
from inference._methods import Draws, FitContext, Option, register_method
from inference.base import Kernel
from inference.hlcr.common import (
    TINY_LOG,
    Config,
    PairData,
    at_once,
    cluster_sums,
    make_config,
    pair_data,
    prior_precision,
)
from inference.loop import StopRule, run_until_converged


class State(NamedTuple):
    r: jax.Array        # (E, K) responsibilities q(z_e = k)
    m: jax.Array        # (K, F) means of q(w_k)
    S: jax.Array        # (K, F, F) covariances of q(w_k)
    a: jax.Array        # (N, K) Dirichlet parameters of q(theta_i)
    log_psi: jax.Array  # (K,) point estimate of log psi


class Info(NamedTuple):
    objective: jax.Array  # the bound (ELBO) after the iteration


def _update_w(r, pdat: PairData, hyper: Config):
    D, c, _ = cluster_sums(pdat.Gs, pdat.gs, r, hyper.K)
    D = D + prior_precision(pdat.Gs.shape[-1], hyper.delta)
    S = jnp.linalg.inv(D)
    S = 0.5 * (S + jnp.swapaxes(S, -1, -2))
    return jnp.einsum("kij,kj->ki", S, c), S


def _elogtheta(a):
    """E_q[log theta] = digamma(a) - digamma(sum_k a_k) (one digamma call: ``common.at_once``)."""
    d_a, d_sum = at_once(digamma, a, a.sum(-1, keepdims=True))
    return d_a - d_sum


def _psi_objective(u, elog_sum, hyper: Config):
    """The bound's psi terms at log psi = log_softmax(u): (alpha/K - 1) sum log psi - N sum lgamma(beta psi)
    + beta sum_k psi_k sum_i E[log theta_ik]."""
    lp = jax.nn.log_softmax(u)
    bp = hyper.beta * jnp.exp(lp)
    return ((hyper.alpha / hyper.K - 1) * lp.sum() - hyper.n_agents * gammaln(bp).sum()
            + jnp.sum(bp * elog_sum))


def _update_psi(log_psi, a, hyper: Config, n_steps: int = 30):
    return _update_psi_from(log_psi, _elogtheta(a).sum(0), hyper, n_steps)


def _update_psi_from(log_psi, elog_sum, hyper: Config, n_steps: int = 30):
    """Monotone gradient ascent on the softmax logits given sum_i E[log theta_i]: a step is kept only if the
    objective does not drop, and the step size then grows by 1.5; otherwise it shrinks by 4. The server of fedvb
    runs it on the summed uploads."""
    value_and_grad = jax.value_and_grad(lambda u: _psi_objective(u, elog_sum, hyper))

    def body(i, carry):
        # iteration 0 only evaluates the start (lr * 0 = 0 moves nothing, fu = -inf accepts it); iterations
        # 1..n_steps are the ascent steps. One value-and-gradient per iteration, at the candidate, whose gradient
        # is kept with it: the compiled loop holds one copy of the objective's lgamma and its derivative
        u, fu, gu, lr = carry
        v = u + lr * gu
        fv, gv = value_and_grad(v)
        ok = fv >= fu
        lr = jnp.where(i == 0, lr, jnp.where(ok, lr * 1.5, lr * 0.25))
        return jnp.where(ok, v, u), jnp.where(ok, fv, fu), jnp.where(ok, gv, gu), lr

    u0 = log_psi
    start = (u0, jnp.asarray(-jnp.inf), jnp.zeros_like(u0), jnp.asarray(0.1))
    u, _, _, _ = jax.lax.fori_loop(0, n_steps + 1, body, start)
    return jax.nn.log_softmax(u)


def _expected_loglik(m, S, pdat: PairData):
    """E_q[log N(y_e | X_e w_k, sigma^2 I)] for every pair and cluster: (E, K)."""
    second = S + m[:, :, None] * m[:, None, :]                     # E[w w^T] (K, F, F)
    return (pdat.const[:, None] + pdat.gs @ m.T
            - 0.5 * jnp.einsum("eij,kij->ek", pdat.Gs, second))


def _update_theta(r, log_psi, pdat: PairData, hyper: Config):
    return hyper.beta * jnp.exp(log_psi) + jax.ops.segment_sum(r, pdat.agent, num_segments=hyper.n_agents)


def _update_z(m, S, a, pdat: PairData, w=None, parts=None):
    """q(z); ``parts``: (``_expected_loglik(m, S, pdat)``, ``_elogtheta(a)``) where the caller has them."""
    ell, elog = (_expected_loglik(m, S, pdat), _elogtheta(a)) if parts is None else parts
    logits = ell + elog[pdat.agent]
    r = jax.nn.softmax(logits, axis=-1)
    return r if w is None else r * w[:, None]


def theta_terms(a, elog, log_psi, beta):
    """The bound's q(theta) and p(theta | psi) terms, summed over the agents (rows of ``a``, ``elog``):
    lgamma(beta) - sum_k lgamma(beta psi_k) + sum_k (beta psi_k - 1) E[log theta_ik] - lgamma(sum_k a_ik)
    + sum_k lgamma(a_ik) - sum_k (a_ik - 1) E[log theta_ik]."""
    bp = beta * jnp.exp(log_psi)
    g_beta, g_bp, g_sum, g_a = at_once(gammaln, beta, bp, a.sum(-1), a)
    return jnp.sum(g_beta - g_bp.sum() + jnp.sum((bp - 1) * elog, -1)
                   - g_sum + jnp.sum(g_a, -1) - jnp.sum((a - 1) * elog, -1))


def w_psi_terms(m, S, log_psi, hyper: Config):
    """The bound's q(w), p(w) terms and log Dir(psi | alpha/K)."""
    K, F = m.shape
    _, logdet = jnp.linalg.slogdet(S)
    t_w = jnp.sum(-F * jnp.log(hyper.delta) - (jnp.sum(m**2, -1) + jnp.trace(S, axis1=-2, axis2=-1))
                  / (2 * hyper.delta**2) + 0.5 * logdet + 0.5 * F)
    a0 = hyper.alpha / K
    g_alpha, g_a0 = at_once(gammaln, hyper.alpha, a0)
    return t_w + g_alpha - K * g_a0 + (a0 - 1) * jnp.sum(log_psi)


def entropy_z(r):
    """-sum r log r (0 log 0 = 0)."""
    return -jnp.sum(jnp.where(r > 0, r * jnp.log(jnp.where(r > 0, r, 1.0)), 0.0))


def elbo(state: State, pdat: PairData, hyper: Config, parts=None):
    """The closed-form bound of the module docstring; ``parts``: as ``_update_z``'s."""
    r, m, S, a, log_psi = state
    ell, elog = (_expected_loglik(m, S, pdat), _elogtheta(a)) if parts is None else parts
    t_z = jnp.sum(r * (ell + elog[pdat.agent])) + entropy_z(r)
    return t_z + theta_terms(a, elog, log_psi, hyper.beta) + w_psi_terms(m, S, log_psi, hyper)


def flat_dirichlet(key, shape) -> jax.Array:
    """Draws of Dir(1, ..., 1) (the uniform distribution on the simplex) of ``shape`` (..., K): i.i.d. Exp(1)
    normalised over the last axis (Devroye 1986, XI.4). ``jax.random.dirichlet`` draws Gamma variates by rejection
    (a while loop of ~1000 HLO instructions, about a second of XLA compile), which a start needs only for a = 1."""
    e = jax.random.exponential(key, shape)
    return e / jnp.sum(e, axis=-1, keepdims=True)


def init(key, pdat: PairData, hyper: Config, w=None) -> State:
    """Random soft labels r_e ~ Dir(1), psi uniform, then q(w), q(theta) from them; ``w``: the pair mask (a
    padded pair gets r_e = 0; the draws of pair e do not depend on the padding)."""
    E = pdat.gs.shape[0]
    r = flat_dirichlet(key, (E, hyper.K))
    r = r if w is None else r * w[:, None]
    log_psi = jnp.full(hyper.K, -jnp.log(hyper.K))
    m, S = _update_w(r, pdat, hyper)
    return State(r, m, S, _update_theta(r, log_psi, pdat, hyper), log_psi)


def iterate(state: State, pdat: PairData, hyper: Config, w=None) -> tuple[State, Info]:
    """One VB-EM iteration: q(w), psi, q(theta), q(z) in turn (each a block maximiser of the bound); ``w``: the
    pair mask."""
    m, S = _update_w(state.r, pdat, hyper)
    log_psi = _update_psi(state.log_psi, state.a, hyper)
    a = _update_theta(state.r, log_psi, pdat, hyper)
    parts = (_expected_loglik(m, S, pdat), _elogtheta(a))      # q(z)'s and the bound's, computed once
    r = _update_z(m, S, a, pdat, w, parts)
    new = State(r, m, S, a, log_psi)
    return new, Info(elbo(new, pdat, hyper, parts))


class Problem(NamedTuple):
    """The pairs' statistics and the pair mask (1.0 real, 0.0 padding)."""

    pdat: PairData
    w: jax.Array


@programs.cached(maxsize=32)
def kernel(hyper: Config) -> Kernel:
    """``init(key, problem)``, ``step(key, state, problem)`` for ``inference.loop`` (one per static hyper, so the
    loop compiles once per data shape); the problem is a ``Problem``. The step is deterministic."""
    return Kernel(lambda key, p: init(key, p.pdat, hyper, p.w), lambda key, state, p: iterate(state, p.pdat, hyper,
                                                                                              p.w))


def run(key, pdat: PairData, hyper: Config, *, max_iter: int, tol: float, num_restarts: int = 1, progress=None):
    """``num_restarts`` runs (vectorised, ``inference.loop.run_until_converged``) from random soft labels, each
    until the relative bound change falls below ``tol`` or ``max_iter`` iterations; the one with the highest
    final bound is kept (``Run``: state, per-iteration ``info.objective``, every restart's final bound).
    Mean-field VB-EM is a local optimiser: on the notes' C1 data a single start can stop in a merged/split
    mode (seen: ARI 0.62 with bound -5392 against ARI 1.0 for the best of 4 starts)."""
    k, E = kernel(hyper), pdat.gs.shape[0]
    *padded, w = programs.pad_rows(*pdat)       # pairs padded to programs.bucket(E), the mask
    res = run_until_converged(k.init, k.step, Problem(PairData(*padded), w), key, StopRule(max_iter, tol, "relative"),
                              num_restarts=num_restarts, progress=progress, desc="hlcr vbem")
    st = jax.device_get(res.state)     # on the host: cutting a device array compiles a program
    return res._replace(state=st._replace(r=st.r[:E]))


def draw(seed, state: State, num_samples: int):
    """Draws from q: w (S, K, F), theta (S, N, K), z (S, E), and log q(w, theta) (S,), in NumPy from
    ``np.random.default_rng(seed)`` (``inference.host_draws``: a one-shot job, not worth compiling); theta is
    floored at the smallest normal float so its log density stays finite."""
    rng = np.random.default_rng(seed)
    st = jax.tree.map(np.asarray, jax.device_get(state))
    S = num_samples
    L = np.linalg.cholesky(st.S)
    w = hd.mvn_variates(rng, st.m, L, (S,))
    theta = np.exp(hd.log_dirichlet_variates(rng, st.a, (S, *st.a.shape), floor=TINY_LOG))
    p = np.clip(st.r, 1e-300, None)
    cdf = np.cumsum(p / p.sum(-1, keepdims=True), -1)
    z = (rng.random((S, st.r.shape[0], 1)) > cdf[None]).sum(-1).clip(max=st.r.shape[1] - 1).astype(np.int32)
    log_q = hd.mvn_tril_log_pdf(w, st.m, L).sum(-1) + hd.dirichlet_log_pdf(theta, st.a).sum(-1)
    return w, theta, z, log_q


def q_dataset(state: State):
    """The fitted q as an xarray Dataset (group ``vbem`` of the tree): r (pair, cluster), m (cluster, feature),
    S (cluster, feature, feature_bis), a (agent_idx, cluster) and the point estimate psi (cluster), so that
    ``log_q`` and the bound can be recomputed from the tree alone."""
    return xr.Dataset({
        "r": (("pair", "cluster"), np.asarray(state.r)), "m": (("cluster", "feature"), np.asarray(state.m)),
        "S": (("cluster", "feature", "feature_bis"), np.asarray(state.S)),
        "a": (("agent_idx", "cluster"), np.asarray(state.a)), "psi": (("cluster",), np.exp(np.asarray(state.log_psi))),
    })


@register_method("vbem", kind="variational", models=("hlcr",), options={
    "max_iter": Option(200, "positive_int", "most VB-EM iterations per restart", tiny=20),
    "tol": Option(1e-10, "positive", "relative bound change that stops the iterations"),
    "num_samples": Option(1000, "positive_int", "draws from q", tiny=20),
    "num_restarts": Option(4, "positive_int", "random starts, run vectorised; the highest final bound is kept",
                           tiny=2),
})
def run_vbem(ctx: FitContext) -> Draws:
    """Mean-field VB-EM for HLCR: q(w) Gaussian, q(theta_i) Dirichlet, q(z_e) categorical, psi a MAP point
    estimate; closed-form bound per iteration in ``traces["elbo"]`` (non-decreasing). Options: ``max_iter``,
    ``tol`` (relative bound change that stops the updates), ``num_samples`` (draws from q), ``num_restarts``
    (random starts; the highest final bound is kept)."""
    o = ctx.options
    inputs = ctx.model_kwargs
    pdat = pair_data(inputs)
    hyper = make_config(ctx.hyper, inputs["n_agents"])
    k_init = host_keys.fold_in(ctx.key, 0)   # split(key)[0]
    res = run(k_init, pdat, hyper, max_iter=o["max_iter"], tol=o["tol"], num_restarts=o["num_restarts"],
              progress=o["progress"])
    state = res.state
    # the bound per iteration, over max_iter entries: flat after the stopping rule fired (the state is frozen)
    trace = np.pad(np.asarray(res.info.objective), (0, o["max_iter"] - res.n_iter), mode="edge")
    w, theta, z, log_q = draw((ctx.seed, 2), state, o["num_samples"])
    S = o["num_samples"]
    psi = np.broadcast_to(np.exp(np.asarray(state.log_psi)), (S, hyper.K))
    add_chain = lambda x: np.asarray(x)[None]  # noqa: E731
    return Draws(posterior={"w": add_chain(w), "psi": add_chain(psi), "theta": add_chain(theta), "z": add_chain(z)},
                 sample_stats={"log_q": add_chain(log_q)},
                 traces={"elbo": trace},
                 attrs={"objective_per_restart": [float(v) for v in res.objective_per_restart],
                        "psi_point_estimate": "psi is a MAP point estimate; log_q covers (w, theta) only"},
                 groups={"vbem": q_dataset(state)}, objective=res.objective, converged=res.converged,
                 n_iter=res.n_iter)


__all__ = ["Info", "Kernel", "State", "draw", "elbo", "init", "iterate", "kernel", "q_dataset", "run"]
