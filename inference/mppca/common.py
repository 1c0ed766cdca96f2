"""What VB-EM, ML-EM and VB merging for the Bayesian mixture of PPCA share (Bruneau, Gelgon & Picarougne 2013,
sec. 4.3 and appendix A; paper page ``docs/papers/mppca.md``, N<section>): the static
configuration, the variational state, the parameter-factor updates of the M step (eq. 55), the parameter part of
the bound F (N3.3), and the post-processing (pruning, eq.-5 rotation, Algorithm 1, plug-in mixture density).

Variational family (N3.3, paper eq. 30 read as mean field in the parameters):
q(z_n) = Cat(r_n), q(x_n | z_n = k) = N(m_nk, Sx_k), q(omega) = Dir(alpha), q(mu_k) = N(m_mu_k, s2_k I),
q(Lambda_k) = prod_i N(row_i | M_k^i, SL_k), q(nu_kj) = Ga(a_kj, b_kj), and, when tau is learned (the default
here; the paper fixes tau = 1, ``tau_fixed``), q(tau) = Ga(c, e). E[tau] = c/e replaces tau everywhere.

M step (eq. 55, from the statistics ``Stats`` of eq. 54: N_k, y_k = sum r y, s_k = sum r m, SY_k = sum r y m^T,
S_k = N_k Sx_k + sum r m m^T, y2_k; data statistics for VB-EM (``vbem``), weighted parameter statistics for
merging (``merge``)):
alpha = alpha0 + N; s2 = 1/(nu0 + E tau N); m_mu = s2 (nu0 mu0 + E tau (y_k - M_k s_k));
SL = (diag E nu + E tau S)^-1; M = E tau (SY - m_mu s^T) SL (E5: row i of SY, not of y_k);
a = a0 + d/2, b = b0 + 1/2 (d SL_jj + |M^(j)|^2); c = a_tau + N d/2, e = b_tau + 1/2 sum_k Q_k.
Bound (N3.3, every constant), Q_k = y2_k + N_k E|mu_k|^2 - 2 y_k^T m_mu - 2 tr(M^T (SY - m_mu s^T)) + tr(EL S).

Post-processing: components with N_k <= ``prune_below`` (2, VBmix, E8) are reported pruned; each kept M_k is
rotated by eq. 5 (columns orthogonal, decreasing norm, first coordinate >= 0) and its rank chosen by Algorithm 1
with the VBmix semantics (successive truncations, 2 KL <= 0.1, E9).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
from jax.scipy.special import digamma, gammaln

from zoo.mppca import resolved_q

LOG_2PI = float(np.log(2 * np.pi))


class Config(NamedTuple):
    """Static configuration (closed over, never traced)."""

    K: int
    q: int
    d: int
    mixture: bool
    learn_tau: bool
    tau: float          # fixed tau (unused when learned)
    alpha0: float
    a0: float
    b0: float
    nu0: float
    a_tau: float
    b_tau: float
    paper_literal: bool = False


class VBState(NamedTuple):
    r: jax.Array        # (N, K) responsibilities
    m: jax.Array        # (N, K, q) means of q(x_n | z_n = k)
    Sx: jax.Array       # (K, q, q)
    alpha: jax.Array    # (K,) Dirichlet parameters
    m_mu: jax.Array     # (K, d)
    s2_mu: jax.Array    # (K,)
    M: jax.Array        # (K, d, q) mean loadings
    SL: jax.Array       # (K, q, q) row covariance of q(Lambda_k)
    a_nu: jax.Array     # (K, q)
    b_nu: jax.Array     # (K, q)
    c_tau: jax.Array    # () shape of q(tau)
    e_tau: jax.Array    # () rate of q(tau)


class Stats(NamedTuple):
    N: jax.Array    # (K,)
    y: jax.Array    # (K, d)
    s: jax.Array    # (K, q)
    SY: jax.Array   # (K, d, q)
    S: jax.Array    # (K, q, q)
    y2: jax.Array   # (K,)


def cfg_from(hyper: dict, d: int, mixture: bool, paper_literal: bool = False) -> Config:
    tf = hyper.get("tau_fixed")
    return Config(K=int(hyper["K"]) if mixture else 1, q=resolved_q(hyper, d), d=d, mixture=mixture,
               learn_tau=tf is None, tau=1.0 if tf is None else float(tf),
               alpha0=float(hyper.get("alpha0", 1.0)), a0=float(hyper["a0"]), b0=float(hyper["b0"]),
               nu0=float(hyper["nu0"]), a_tau=float(hyper["a_tau"]), b_tau=float(hyper["b_tau"]),
               paper_literal=paper_literal)


# --------------------------------------------------------------------------------------------------
# Moments and parameter-factor updates (eq. 55)
# --------------------------------------------------------------------------------------------------


def chol_inv_logdet(A):
    """(A^-1, ln|A|) for a batch of SPD matrices."""
    A = 0.5 * (A + jnp.swapaxes(A, -1, -2))
    L = jnp.linalg.cholesky(A)
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1]), A.shape)
    inv = jax.scipy.linalg.cho_solve((L, True), eye)
    return 0.5 * (inv + jnp.swapaxes(inv, -1, -2)), 2 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), -1)


def tau_moments(cfg: Config, st: VBState):
    if cfg.learn_tau:
        return st.c_tau / st.e_tau, digamma(st.c_tau) - jnp.log(st.e_tau)
    return jnp.asarray(cfg.tau), jnp.log(cfg.tau)


def e_log_omega(cfg: Config, st: VBState):
    if not cfg.mixture:
        return jnp.zeros(1)
    return digamma(st.alpha) - digamma(jnp.sum(st.alpha))


def e_lambda(cfg: Config, st: VBState):
    """EL_k = E[Lambda_k^T Lambda_k] = d SL_k + M_k^T M_k (K, q, q)."""
    return cfg.d * st.SL + jnp.einsum("kdi,kdj->kij", st.M, st.M)


def update_alpha(cfg: Config, st: VBState, s: Stats) -> VBState:
    return st._replace(alpha=cfg.alpha0 + s.N)


def update_mu(cfg: Config, st: VBState, s: Stats, mu0) -> VBState:
    Et, _ = tau_moments(cfg, st)
    s2 = 1.0 / (cfg.nu0 + Et * s.N)
    m_mu = s2[:, None] * (cfg.nu0 * mu0 + Et * (s.y - jnp.einsum("kdq,kq->kd", st.M, s.s)))
    return st._replace(m_mu=m_mu, s2_mu=s2)


def update_lambda(cfg: Config, st: VBState, s: Stats) -> VBState:
    Et, _ = tau_moments(cfg, st)
    Enu = st.a_nu / st.b_nu
    SL, _ = chol_inv_logdet(jax.vmap(jnp.diag)(Enu) + Et * s.S)
    B = s.SY - jnp.einsum("kd,kq->kdq", st.m_mu, s.s)
    return st._replace(SL=SL, M=Et * jnp.einsum("kdq,kqp->kdp", B, SL))


def col_norm2(cfg: Config, st: VBState):
    """E|Lambda_k^j|^2 = d SL_jj + |M^(j)|^2 (K, q)."""
    return cfg.d * jnp.diagonal(st.SL, axis1=-2, axis2=-1) + jnp.sum(st.M**2, 1)


def update_nu(cfg: Config, st: VBState) -> VBState:
    return st._replace(a_nu=jnp.full_like(st.a_nu, cfg.a0 + cfg.d / 2), b_nu=cfg.b0 + 0.5 * col_norm2(cfg, st))


def q_terms(cfg: Config, st: VBState, s: Stats):
    """Q_k = sum_n r_nk E|y_n - Lambda_k x - mu_k|^2 (K,)."""
    Emu2 = jnp.sum(st.m_mu**2, -1) + cfg.d * st.s2_mu
    B = s.SY - jnp.einsum("kd,kq->kdq", st.m_mu, s.s)
    return (s.y2 + s.N * Emu2 - 2 * jnp.sum(s.y * st.m_mu, -1) - 2 * jnp.einsum("kdq,kdq->k", st.M, B)
            + jnp.einsum("kij,kji->k", e_lambda(cfg, st), s.S))


def update_tau(cfg: Config, st: VBState, s: Stats, n_rows) -> VBState:
    if not cfg.learn_tau:
        return st
    return st._replace(c_tau=jnp.asarray(cfg.a_tau + n_rows * cfg.d / 2),
                       e_tau=cfg.b_tau + 0.5 * jnp.sum(q_terms(cfg, st, s)))


def _gamma_elbo(a0, b0, a, b):
    """E_q[ln Ga(v | a0, b0)] - E_q[ln q(v)], q = Ga(a, b) (elementwise)."""
    Elog, E = digamma(a) - jnp.log(b), a / b
    return (a0 * jnp.log(b0) - gammaln(a0) + (a0 - 1) * Elog - b0 * E
            - (a * jnp.log(b) - gammaln(a) + (a - 1) * Elog - a))


def bound_from(cfg: Config, st: VBState, s: Stats, n_total, zpart, mu0):
    """F from the statistics ``s`` (data or virtual, N3.3/N3.5), the Z part sum r (E ln omega - ln r) (weighted
    for virtual samples) and the parameter terms; ``n_total`` = number of (virtual) points."""
    N = n_total
    d, q = cfg.d, cfg.q
    Et, Elt = tau_moments(cfg, st)
    _, logdet_Sx = chol_inv_logdet(st.Sx)
    _, logdet_SL = chol_inv_logdet(st.SL)
    F = (N * d / 2 * (Elt - LOG_2PI) - Et / 2 * jnp.sum(q_terms(cfg, st, s)) - N * q / 2 * LOG_2PI
         - 0.5 * jnp.sum(jnp.trace(s.S, axis1=-2, axis2=-1)) + jnp.sum(s.N * 0.5 * (logdet_Sx + q * (1 + LOG_2PI))))
    if cfg.mixture:
        Elo = e_log_omega(cfg, st)
        F += zpart
        K, a0 = cfg.K, cfg.alpha0
        F += (gammaln(K * a0) - K * gammaln(a0) + (a0 - 1) * jnp.sum(Elo)
              - gammaln(jnp.sum(st.alpha)) + jnp.sum(gammaln(st.alpha)) - jnp.sum((st.alpha - 1) * Elo))
    Elnu, Enu = digamma(st.a_nu) - jnp.log(st.b_nu), st.a_nu / st.b_nu
    F += jnp.sum(d / 2 * (Elnu - LOG_2PI) - 0.5 * Enu * col_norm2(cfg, st))
    F += jnp.sum(d / 2 * (logdet_SL + q * (1 + LOG_2PI)))
    F += jnp.sum(_gamma_elbo(cfg.a0, cfg.b0, st.a_nu, st.b_nu))
    F += jnp.sum(d / 2 * jnp.log(cfg.nu0 / (2 * np.pi))
                 - cfg.nu0 / 2 * (jnp.sum((st.m_mu - mu0) ** 2, -1) + d * st.s2_mu)
                 + d / 2 * (jnp.log(st.s2_mu) + 1 + LOG_2PI))
    if cfg.learn_tau:
        F += _gamma_elbo(cfg.a_tau, cfg.b_tau, st.c_tau, st.e_tau)
    return F


# --------------------------------------------------------------------------------------------------
# Post-processing: pruning, eq.-5 rotation, Algorithm 1
# --------------------------------------------------------------------------------------------------


def rotate(M):
    """Eq. 5: M^T M = V D V^T, M <- M V with decreasing column norms; each column's first coordinate >= 0."""
    M = np.asarray(M, float)
    w, V = np.linalg.eigh(M.T @ M)
    M = M @ V[:, ::-1]
    sign = np.where(M[0] < 0, -1.0, 1.0)
    return M * sign


def effective_rank(M, tau, threshold=0.1):
    """Algorithm 1 with the VBmix semantics (erratum E9): 0 if no |entry| > threshold; otherwise add columns
    one at a time and stop at the first c whose 2 KL(N(0, C_c) || N(0, C_{c-1})) <= threshold, keeping c - 1
    (all q if never). C_c = M_{:, :c} M_{:, :c}^T + tau^-1 I. ``M`` must be rotated (eq. 5)."""
    M = np.asarray(M, float)
    d, q = M.shape
    if not np.any(np.abs(M) > threshold):
        return 0
    prev = np.eye(d) / tau
    for c in range(1, q + 1):
        cur = M[:, :c] @ M[:, :c].T + np.eye(d) / tau
        kl2 = np.trace(np.linalg.solve(prev, cur)) - d + np.linalg.slogdet(prev)[1] - np.linalg.slogdet(cur)[1]
        if kl2 <= threshold:
            return c - 1
        prev = cur
    return q


def summary_of(cfg: Config, st: VBState, prune_below=2.0, rank_threshold=0.1) -> dict:
    """Point summary of a fit: kept components (N_k > prune_below), their weights alpha_k / sum alpha over
    kept, means, rotated loadings, Algorithm-1 ranks, covariance C_k = M M^T + E[tau]^-1 I (plug-in GMM). On the
    host, in NumPy (no JAX operation run one at a time)."""
    st = jax.device_get(st)
    Et = float(st.c_tau / st.e_tau) if cfg.learn_tau else float(cfg.tau)
    Nk = np.asarray(st.alpha) - cfg.alpha0 if cfg.mixture else np.array([float(st.r.shape[0])])
    keep = np.flatnonzero(Nk > prune_below)
    alpha = np.asarray(st.alpha)[keep] if cfg.mixture else np.ones(1)
    M = np.stack([rotate(np.asarray(st.M[k])) for k in keep]) if len(keep) else np.zeros((0, cfg.d, cfg.q))
    ranks = np.array([effective_rank(Mk, Et, rank_threshold) for Mk in M], int)
    C = np.einsum("kiq,kjq->kij", M, M) + np.eye(cfg.d) / Et
    return {"keep": keep, "weights": alpha / alpha.sum(), "means": np.asarray(st.m_mu)[keep], "loadings": M,
            "ranks": ranks, "covariances": C, "tau": Et, "N_k": Nk}


def gmm_logpdf(Y, weights, means, covs):
    """Pointwise log density of a plug-in Gaussian mixture (N,)."""
    Y = np.asarray(Y, float)
    out = []
    for w, m, C in zip(weights, means, covs, strict=True):
        L = np.linalg.cholesky(C)
        z = np.linalg.solve(L, (Y - m).T)
        out.append(np.log(w) - 0.5 * np.sum(z**2, 0) - np.sum(np.log(np.diag(L))) - 0.5 * len(m) * LOG_2PI)
    return scipy.special.logsumexp(np.stack(out, 1), axis=1)   # NumPy data: SciPy's, not JAX's op by op


def point_draws(cfg: Config, pi, mu, W, sig2):
    """One 'draw' (chain 1, draw 1) of the model sites at point estimates; nu at its ML value d/|W^j|^2."""
    W = np.asarray(W, float)
    nu = cfg.d / np.maximum(np.sum(W**2, axis=1), 1e-12)
    post = {"nu": nu, "Wt": np.swapaxes(W, -1, -2), "mu": np.asarray(mu, float)}
    if cfg.mixture:
        om = np.clip(np.asarray(pi, float), 1e-300, None)
        post["omega"] = om / om.sum()
    else:
        post = {k: v[0] for k, v in post.items()}
    if cfg.learn_tau:
        post["tau"] = np.asarray(1.0 / float(sig2))
    return {k: np.asarray(v)[None, None] for k, v in post.items()}
