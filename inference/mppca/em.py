"""Maximum-likelihood EM for (M)PPCA (Tipping & Bishop 1999; paper page ``docs/papers/mppca.md`` 3.1-3.2,
errata E1-E2), the paper's baseline, as a kernel run by ``inference.loop``.

One step (``em_step``), with responsibilities r_nk of pi_k N(y_n | mu_k, C_k), C_k = W_k W_k^T + sig2 I:
mu_k = sum_n r y / sum_n r (E2); S_k the responsibility-weighted covariance about mu_k;
W_k <- S_k W_k (sig2 I + M_k^-1 W_k^T S_k W_k)^-1, M_k = sig2 I + W_k^T W_k (eq. 22 with the inverse, E1);
sig2_k = (tr S_k - tr(S_k W_k M_k^-1 W_new^T)) / d; the noise variance tau^-1 is shared, sig2 = sum_k pi_k sig2_k,
or 1/``tau_fixed``. ``Info.objective`` is the log-likelihood at the parameters *before* the step (so the trace is
monotone). Starts from the VB-EM initialisation (k-means + per-cluster PCA, ``inference.mppca.vbem``).

Rows are padded to ``programs.bucket(N)`` (``fit_em``) with a row mask ``w`` that multiplies the responsibilities
and each row's log-likelihood: a padded row adds nothing to N_k, mu_k, S_k, pi or the objective.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from inference import host_keys, programs
from inference._methods import Draws, FitContext, Option, register_method
from inference.base import Kernel
from inference.loop import Run, StopRule, run_until_converged
from inference.mppca.common import LOG_2PI, Config, cfg_from, chol_inv_logdet, point_draws
from inference.mppca.vbem import initial_state, row_mask


class State(NamedTuple):
    pi: jax.Array       # (K,)
    mu: jax.Array       # (K, d)
    W: jax.Array        # (K, d, q)
    sig2: jax.Array     # () shared noise variance tau^-1


class Info(NamedTuple):
    objective: jax.Array    # log-likelihood at the parameters before the step


class Problem(NamedTuple):
    Y: jax.Array        # (N, d)
    w: jax.Array | None = None   # (N,) row mask: 1.0 real, 0.0 padding (None: every row is real)


def mixture_logpdf(Y, pi, mu, W, sig2):
    """(N, K) log pi_k + ln N(y_n | mu_k, W_k W_k^T + sig2 I) by Woodbury, |C| = sig2^(d-q) |sig2 I + W^T W|."""
    d, q = W.shape[1], W.shape[2]
    Mm = sig2 * jnp.eye(q) + jnp.einsum("kdi,kdj->kij", W, W)                        # (K, q, q)
    Minv, logdetM = chol_inv_logdet(Mm)
    D = Y[:, None] - mu[None]                                                         # (N, K, d)
    WtD = jnp.einsum("kdq,nkd->nkq", W, D)
    maha = (jnp.sum(D**2, -1) - jnp.einsum("nki,kij,nkj->nk", WtD, Minv, WtD)) / sig2
    logdet = (d - q) * jnp.log(sig2) + logdetM
    return jnp.log(jnp.clip(pi, 1e-300))[None] - 0.5 * (maha + logdet[None] + d * LOG_2PI)


def em_step(state: State, Y, tau_fixed, w=None) -> tuple[State, jax.Array]:
    """One Tipping-Bishop EM step (notes 3.2 with mu_k = sum r y / sum r, E2; eq. 22 with the inverse, E1);
    shared noise variance sig2 = sum_k pi_k sig2_k, or 1/tau_fixed. Returns (state, log-likelihood before).
    ``w``: the row mask (padded rows weigh 0)."""
    pi, mu, W, sig2 = state
    d = Y.shape[1]
    w = row_mask(Y, w)
    N = jnp.sum(w)
    q = W.shape[-1]
    lp = mixture_logpdf(Y, pi, mu, W, sig2)
    ll = jnp.sum(w * logsumexp(lp, axis=1))
    r = jax.nn.softmax(lp, axis=1) * w[:, None]
    Nk = r.sum(0)
    Nk_safe = jnp.maximum(Nk, 1e-10)
    mu_new = jnp.where(Nk[:, None] > 1e-10, (r.T @ Y) / Nk_safe[:, None], mu)
    D = Y[:, None] - mu_new[None]
    S = jnp.einsum("nk,nki,nkj->kij", r, D, D) / Nk_safe[:, None, None]               # (K, d, d)
    Minv, _ = chol_inv_logdet(sig2 * jnp.eye(q) + jnp.einsum("kdi,kdj->kij", W, W))
    SW = jnp.einsum("kij,kjq->kiq", S, W)
    inner = sig2 * jnp.eye(q) + jnp.einsum("kab,kdb,kdc->kac", Minv, W, SW)
    W_new = jnp.einsum("kdq,kqp->kdp", SW, jnp.linalg.inv(inner))
    sig2_k = (jnp.trace(S, axis1=-2, axis2=-1)
              - jnp.einsum("kdq,kqp,kdp->k", SW, Minv, W_new)) / d
    pi_new = Nk / N
    sig2_new = jnp.sum(pi_new * sig2_k) if tau_fixed is None else jnp.asarray(1.0 / tau_fixed)
    sig2_new = jnp.maximum(sig2_new, 1e-10)
    return State(pi_new, mu_new, W_new, sig2_new), ll


@programs.cached(maxsize=32)
def kernel(cfg: Config) -> Kernel:
    """The EM kernel for one static configuration (cached, so ``inference.loop`` compiles it once)."""
    tau_fixed = None if cfg.learn_tau else cfg.tau

    def init(key, problem: Problem) -> State:
        st = initial_state(cfg, key, problem.Y, problem.w)
        n0 = st.r.sum(0)
        sig2 = st.e_tau / st.c_tau if cfg.learn_tau else jnp.asarray(1.0 / cfg.tau)
        return State(n0 / n0.sum(), st.m_mu, st.M, sig2)

    def step(key, state: State, problem: Problem):
        state, ll = em_step(state, problem.Y, tau_fixed, problem.w)
        return state, Info(ll)

    return Kernel(init, step)


def fit_em(Y, hyper, key, *, mixture=True, max_iter=1000, tol=1e-8, chunk=None, progress=None) -> tuple[Config, Run]:
    """ML EM for MPPCA (K = 1: PPCA) from the VB initialisation until the relative change of the log-likelihood
    is <= ``tol`` or ``max_iter``: returns (cfg, ``inference.loop.Run``; ``info.objective`` is the monotone
    log-likelihood trace)."""
    Y = np.asarray(Y, float)
    cfg = cfg_from(hyper, Y.shape[1], mixture)
    kern, problem = kernel(cfg), Problem(*programs.pad_rows(Y))
    return cfg, run_until_converged(kern.init, kern.step, problem, key, StopRule(int(max_iter), float(tol)),
                                    chunk=chunk, progress=progress, desc="em", start_from_key=True)  # from init(key)


EM_OPTIONS = {
    "max_iter": Option(1000, "positive_int", "most EM steps", tiny=50),
    "tol": Option(1e-8, "positive", "stop when the relative change of the log-likelihood is at most this"),
}


@register_method("em", kind="point", models=("mppca", "ppca"), options=EM_OPTIONS)
def run_em(ctx: FitContext) -> Draws:
    """Maximum-likelihood EM for (M)PPCA (Tipping & Bishop; notes 3.1-3.2, errata E1-E2), the paper's baseline;
    tau shared (learned by ML, or ``tau_fixed``). Priors are ignored; ``nu`` is reported at d / |Lambda^j|^2."""
    mixture = ctx.spec.name != "ppca"
    cfg, res = fit_em(ctx.data["Y"], ctx.hyper, host_keys.fold_in(ctx.key, 1), mixture=mixture,
                      max_iter=ctx.options["max_iter"], tol=ctx.options["tol"], progress=ctx.options["progress"])
    st = res.state
    return Draws(posterior=point_draws(cfg, st.pi, st.mu, st.W, st.sig2), traces={"loglik": res.info.objective},
                 objective=res.objective, converged=res.converged, n_iter=res.n_iter)
