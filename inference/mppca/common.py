"""VB-EM for the Bayesian mixture of PPCA (VBMPPCA, Bruneau, Gelgon & Picarougne 2013, sec. 4.3 and appendix
A), vectorised over components; engineering notes ``shared/notes/001_vbmppca.md`` (N<section>).

Variational family (N3.3, paper eq. 30 read as mean field in the parameters):
q(z_n) = Cat(r_n), q(x_n | z_n = k) = N(m_nk, Sx_k), q(omega) = Dir(alpha), q(mu_k) = N(m_mu_k, s2_k I),
q(Lambda_k) = prod_i N(row_i | M_k^i, SL_k), q(nu_kj) = Ga(a_kj, b_kj), and, when tau is learned (the default
here; the paper fixes tau = 1, ``tau_fixed``), q(tau) = Ga(c, e). E[tau] = c/e replaces tau everywhere.

One sweep (``sweep``; order alpha, (X, Z), statistics, mu, Lambda, nu, tau; each step is an exact coordinate
ascent step, so the bound F never decreases):

* X/Z (eq. 53, corrected, erratum E4):  Sx_k = (I + E tau EL_k)^-1,  EL_k = d SL_k + M_k^T M_k,
  m_nk = E tau Sx_k M_k^T (y_n - m_mu_k),
  ln rho_nk = E ln omega_k - 1/2 tr(Sx_k + m m^T) + **1/2 ln|Sx_k|**
              - E tau/2 [|y|^2 + E|mu_k|^2 - 2 y^T m_mu_k - 2 (y - m_mu_k)^T M_k m_nk + tr(EL_k (Sx_k + m m^T))].
  The paper (and VBmix) omit +1/2 ln|Sx_k|, the entropy of q(x | z = k); then the Z step is not the coordinate
  optimum and the bound can decrease (what the paper's sec. 7 blames on "coupled moments").
  ``paper_literal=True`` reproduces the omission (tests only).
* statistics (eq. 54): N_k, y_k = sum r y, s_k = sum r m, SY_k = sum r y m^T, S_k = N_k Sx_k + sum r m m^T, y2_k.
* M step (eq. 55): alpha = alpha0 + N; s2 = 1/(nu0 + E tau N); m_mu = s2 (nu0 mu0 + E tau (y_k - M_k s_k));
  SL = (diag E nu + E tau S)^-1; M = E tau (SY - m_mu s^T) SL (E5: row i of SY, not of y_k);
  a = a0 + d/2, b = b0 + 1/2 (d SL_jj + |M^(j)|^2); c = a_tau + N d/2, e = b_tau + 1/2 sum_k Q_k.
* bound (N3.3, every constant), Q_k = y2_k + N_k E|mu_k|^2 - 2 y_k^T m_mu - 2 tr(M^T (SY - m_mu s^T)) + tr(EL S).

Initialisation: k-means (random distinct rows as centres, Lloyd iterations) then per-cluster PCA for M_k (a
non-zero M is required: q(Lambda) at the prior is a fixed point, E17); restarts ``n_init`` run in parallel
(vmap), the highest final bound wins. Post-processing: components with N_k <= ``prune_below`` (2, VBmix,
E8) are reported pruned; each kept M_k is rotated by eq. 5 (columns orthogonal, decreasing norm, first
coordinate >= 0) and its rank chosen by Algorithm 1 with the VBmix semantics (successive truncations,
2 KL <= 0.1, E9). Draws for the DataTree come from the q factors (unrotated) with their log density ``log_q``.

Spaces: ``log_q`` is the density of q(omega) q(nu) q(Lambda) q(mu) q(tau) at the draws of the model's sites
(omega, nu, Wt = Lambda^T, mu, tau); the NumPyro model marginalises z and x, so these are exactly the variables
its log density is evaluated on. The bound F is the ELBO on the augmented space (omega, nu, Lambda, mu, tau, z,
x), E_q[log p(Y, x, z, theta) - log q(theta) - log q(z, x)]; the ELBO of q(theta) on the model's space is >= F.
Every parameter of q is stored in group ``variational`` (tests/test_log_q.py rebuilds both from it).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import xarray as xr
from jax.scipy.special import digamma, gammaln, logsumexp

from inference._methods import Draws, FitContext, register_method
from zoo.mppca import prior_means, resolved_q

LOG_2PI = float(np.log(2 * np.pi))


class Cfg(NamedTuple):
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


def cfg_from(hyper: dict, d: int, mixture: bool, paper_literal: bool = False) -> Cfg:
    tf = hyper.get("tau_fixed")
    return Cfg(K=int(hyper["K"]) if mixture else 1, q=resolved_q(hyper, d), d=d, mixture=mixture,
               learn_tau=tf is None, tau=1.0 if tf is None else float(tf),
               alpha0=float(hyper.get("alpha0", 1.0)), a0=float(hyper["a0"]), b0=float(hyper["b0"]),
               nu0=float(hyper["nu0"]), a_tau=float(hyper["a_tau"]), b_tau=float(hyper["b_tau"]),
               paper_literal=paper_literal)


# --------------------------------------------------------------------------------------------------
# Moments and factor updates
# --------------------------------------------------------------------------------------------------


def _chol_inv_logdet(A):
    """(A^-1, ln|A|) for a batch of SPD matrices."""
    A = 0.5 * (A + jnp.swapaxes(A, -1, -2))
    L = jnp.linalg.cholesky(A)
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1]), A.shape)
    inv = jax.scipy.linalg.cho_solve((L, True), eye)
    return 0.5 * (inv + jnp.swapaxes(inv, -1, -2)), 2 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), -1)


def tau_moments(cfg: Cfg, st: VBState):
    if cfg.learn_tau:
        return st.c_tau / st.e_tau, digamma(st.c_tau) - jnp.log(st.e_tau)
    return jnp.asarray(cfg.tau), jnp.log(cfg.tau)


def e_log_omega(cfg: Cfg, st: VBState):
    if not cfg.mixture:
        return jnp.zeros(1)
    return digamma(st.alpha) - digamma(jnp.sum(st.alpha))


def e_lambda(cfg: Cfg, st: VBState):
    """EL_k = E[Lambda_k^T Lambda_k] = d SL_k + M_k^T M_k (K, q, q)."""
    return cfg.d * st.SL + jnp.einsum("kdi,kdj->kij", st.M, st.M)


def update_xz(cfg: Cfg, st: VBState, Y) -> VBState:
    """q(x, z) given the parameter factors (eq. 53 with the +1/2 ln|Sx_k| of erratum E4)."""
    Et, _ = tau_moments(cfg, st)
    EL = e_lambda(cfg, st)
    Sx, logdet_Px = _chol_inv_logdet(jnp.eye(cfg.q) + Et * EL)                     # ln|Sx| = -logdet_Px
    D = Y[:, None, :] - st.m_mu[None]                                               # (N, K, d)
    m = Et * jnp.einsum("kab,kdb,nkd->nka", Sx, st.M, D)                            # (N, K, q)
    Emu2 = jnp.sum(st.m_mu**2, -1) + cfg.d * st.s2_mu                               # (K,)
    y2 = jnp.sum(Y**2, -1)[:, None]
    quad = (y2 + Emu2[None] - 2 * Y @ st.m_mu.T - 2 * jnp.einsum("nkd,kdq,nkq->nk", D, st.M, m)
            + jnp.einsum("kij,kji->k", EL, Sx)[None] + jnp.einsum("nki,kij,nkj->nk", m, EL, m))
    trxx = jnp.trace(Sx, axis1=-2, axis2=-1)[None] + jnp.sum(m**2, -1)
    logrho = e_log_omega(cfg, st)[None] - 0.5 * trxx - 0.5 * Et * quad
    if not cfg.paper_literal:
        logrho = logrho - 0.5 * logdet_Px[None]
    r = jax.nn.softmax(logrho, axis=-1) if cfg.mixture else jnp.ones_like(logrho)
    return st._replace(r=r, m=m, Sx=Sx)


def stats_of(st: VBState, Y) -> Stats:
    r, m = st.r, st.m
    N = jnp.sum(r, 0)
    rm = r[..., None] * m
    return Stats(N=N, y=r.T @ Y, s=jnp.sum(rm, 0), SY=jnp.einsum("nd,nkq->kdq", Y, rm),
                 S=N[:, None, None] * st.Sx + jnp.einsum("nki,nkj->kij", rm, m), y2=r.T @ jnp.sum(Y**2, -1))


def update_alpha(cfg: Cfg, st: VBState, s: Stats) -> VBState:
    return st._replace(alpha=cfg.alpha0 + s.N)


def update_mu(cfg: Cfg, st: VBState, s: Stats, mu0) -> VBState:
    Et, _ = tau_moments(cfg, st)
    s2 = 1.0 / (cfg.nu0 + Et * s.N)
    m_mu = s2[:, None] * (cfg.nu0 * mu0 + Et * (s.y - jnp.einsum("kdq,kq->kd", st.M, s.s)))
    return st._replace(m_mu=m_mu, s2_mu=s2)


def update_lambda(cfg: Cfg, st: VBState, s: Stats) -> VBState:
    Et, _ = tau_moments(cfg, st)
    Enu = st.a_nu / st.b_nu
    SL, _ = _chol_inv_logdet(jax.vmap(jnp.diag)(Enu) + Et * s.S)
    B = s.SY - jnp.einsum("kd,kq->kdq", st.m_mu, s.s)
    return st._replace(SL=SL, M=Et * jnp.einsum("kdq,kqp->kdp", B, SL))


def col_norm2(cfg: Cfg, st: VBState):
    """E|Lambda_k^j|^2 = d SL_jj + |M^(j)|^2 (K, q)."""
    return cfg.d * jnp.diagonal(st.SL, axis1=-2, axis2=-1) + jnp.sum(st.M**2, 1)


def update_nu(cfg: Cfg, st: VBState) -> VBState:
    return st._replace(a_nu=jnp.full_like(st.a_nu, cfg.a0 + cfg.d / 2), b_nu=cfg.b0 + 0.5 * col_norm2(cfg, st))


def q_terms(cfg: Cfg, st: VBState, s: Stats):
    """Q_k = sum_n r_nk E|y_n - Lambda_k x - mu_k|^2 (K,)."""
    Emu2 = jnp.sum(st.m_mu**2, -1) + cfg.d * st.s2_mu
    B = s.SY - jnp.einsum("kd,kq->kdq", st.m_mu, s.s)
    return (s.y2 + s.N * Emu2 - 2 * jnp.sum(s.y * st.m_mu, -1) - 2 * jnp.einsum("kdq,kdq->k", st.M, B)
            + jnp.einsum("kij,kji->k", e_lambda(cfg, st), s.S))


def update_tau(cfg: Cfg, st: VBState, s: Stats, n_rows) -> VBState:
    if not cfg.learn_tau:
        return st
    return st._replace(c_tau=jnp.asarray(cfg.a_tau + n_rows * cfg.d / 2),
                       e_tau=cfg.b_tau + 0.5 * jnp.sum(q_terms(cfg, st, s)))


def _gamma_elbo(a0, b0, a, b):
    """E_q[ln Ga(v | a0, b0)] - E_q[ln q(v)], q = Ga(a, b) (elementwise)."""
    Elog, E = digamma(a) - jnp.log(b), a / b
    return (a0 * jnp.log(b0) - gammaln(a0) + (a0 - 1) * Elog - b0 * E
            - (a * jnp.log(b) - gammaln(a) + (a - 1) * Elog - a))


def bound(cfg: Cfg, st: VBState, Y, mu0):
    """The variational lower bound F (N3.3, all constants) at the current state."""
    s = stats_of(st, Y)
    zpart = jnp.sum(st.r * (e_log_omega(cfg, st)[None] - jnp.log(jnp.clip(st.r, 1e-300)))) if cfg.mixture else 0.0
    return bound_from(cfg, st, s, Y.shape[0], zpart, mu0)


def bound_from(cfg: Cfg, st: VBState, s: Stats, n_total, zpart, mu0):
    """F from the statistics ``s`` (data or virtual, N3.3/N3.5), the Z part sum r (E ln omega - ln r) (weighted
    for virtual samples) and the parameter terms; ``n_total`` = number of (virtual) points."""
    N = n_total
    d, q = cfg.d, cfg.q
    Et, Elt = tau_moments(cfg, st)
    _, logdet_Sx = _chol_inv_logdet(st.Sx)
    _, logdet_SL = _chol_inv_logdet(st.SL)
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


def sweep(cfg: Cfg, st: VBState, Y, mu0, record: bool = False):
    """One VB-EM sweep: alpha; X/Z; stats; mu; Lambda; nu; tau. Returns (state, bound) or, with ``record``,
    (state, bounds after each factor update: [alpha, xz, mu, Lambda, nu, tau])."""
    rec = []
    st = update_alpha(cfg, st, stats_of(st, Y)) if cfg.mixture else st
    rec.append(st)
    st = update_xz(cfg, st, Y)
    rec.append(st)
    s = stats_of(st, Y)
    st = update_mu(cfg, st, s, mu0)
    rec.append(st)
    st = update_lambda(cfg, st, s)
    rec.append(st)
    st = update_nu(cfg, st)
    rec.append(st)
    st = update_tau(cfg, st, s, Y.shape[0])
    rec.append(st)
    if record:
        return st, jnp.stack([bound(cfg, x, Y, mu0) for x in rec])
    return st, bound(cfg, st, Y, mu0)


# --------------------------------------------------------------------------------------------------
# Initialisation, run with restarts
# --------------------------------------------------------------------------------------------------


def kmeans_labels(key, Y, K, iters=20):
    """Lloyd's k-means from K distinct random rows (vectorised; empty clusters keep their centre)."""
    N = Y.shape[0]
    C = Y[jax.random.choice(key, N, (K,), replace=False)]

    def body(C, _):
        lab = jnp.argmin(jnp.sum((Y[:, None] - C[None]) ** 2, -1), -1)
        R = jax.nn.one_hot(lab, K)
        n = R.sum(0)
        C = jnp.where(n[:, None] > 0, (R.T @ Y) / jnp.maximum(n, 1)[:, None], C)
        return C, None

    C, _ = jax.lax.scan(body, C, None, length=iters)
    return jnp.argmin(jnp.sum((Y[:, None] - C[None]) ** 2, -1), -1), C


def init(cfg: Cfg, Y, mu0, key) -> VBState:
    """k-means responsibilities, per-cluster PCA loadings (notes E17: M must not start at 0)."""
    N, d = Y.shape
    K, q = cfg.K, cfg.q
    if cfg.mixture:
        lab, C = kmeans_labels(key, Y, K)
        r = jax.nn.one_hot(lab, K)
    else:
        r, C = jnp.ones((N, 1)), Y.mean(0)[None]
    n = r.sum(0)
    D = Y[:, None] - C[None]
    cov = jnp.einsum("nk,nki,nkj->kij", r, D, D) / jnp.maximum(n, 1)[:, None, None]
    cov = cov + 1e-6 * jnp.trace(jnp.cov(Y.T)) / d * jnp.eye(d)
    lam, U = jnp.linalg.eigh(cov)                                  # ascending
    lam, U = lam[:, ::-1], U[:, :, ::-1]
    if cfg.learn_tau:
        resid = jnp.sum(n[:, None] * lam[:, q:]) / (N * (d - q))
        sig2 = jnp.maximum(resid, 1e-3 * jnp.mean(lam[:, 0]))
    else:
        sig2 = 1.0 / cfg.tau
    M = U[:, :, :q] * jnp.sqrt(jnp.maximum(lam[:, :q] - sig2, 1e-2 * sig2))[:, None, :]
    a_nu = jnp.full((K, q), cfg.a0 + d / 2)
    b_nu = a_nu * jnp.sum(M**2, 1) / d
    c_tau = jnp.asarray(cfg.a_tau + N * d / 2)
    return VBState(r=r, m=jnp.zeros((N, K, q)), Sx=jnp.broadcast_to(jnp.eye(q), (K, q, q)),
                   alpha=cfg.alpha0 + n, m_mu=C, s2_mu=1.0 / (cfg.nu0 + n / sig2), M=M,
                   SL=jnp.zeros((K, q, q)) + 1e-12 * jnp.eye(q), a_nu=a_nu, b_nu=b_nu, c_tau=c_tau,
                   e_tau=c_tau * sig2)


class RunResult(NamedTuple):
    state: VBState          # best restart
    trace: np.ndarray       # bound after every sweep of the best restart
    finals: np.ndarray      # final bound of every restart
    n_iter: int
    converged: bool


@functools.lru_cache(maxsize=64)
def _compiled(cfg: Cfg, chunk: int, tol: float):
    """(jitted vmapped init, jitted chunk of ``chunk`` sweeps over restarts), cached per configuration."""

    def one(carry, _, Y, mu0):
        st, F_old, done, it = carry
        new, F = sweep(cfg, st, Y, mu0)
        conv = (it > 0) & (jnp.abs(F - F_old) <= tol * jnp.abs(F))
        st = jax.tree.map(lambda a, b: jnp.where(done, a, b), st, new)
        F = jnp.where(done, F_old, F)
        return (st, F, done | conv, it + jnp.where(done, 0, 1)), F

    def single(s, f, dn, i, Y, mu0):
        (s, f, dn, i), tr = jax.lax.scan(lambda c, x: one(c, x, Y, mu0), (s, f, dn, i), None, length=chunk)
        return s, f, dn, i, tr

    init_fn = jax.jit(jax.vmap(lambda k, Y, mu0: init(cfg, Y, mu0, k), in_axes=(0, None, None)))
    chunk_fn = jax.jit(jax.vmap(single, in_axes=(0, 0, 0, 0, None, None)))
    return init_fn, chunk_fn


def run(cfg: Cfg, Y, mu0, key, *, n_init=1, max_iter=1000, tol=1e-7, chunk=25) -> RunResult:
    """VB-EM from ``n_init`` k-means initialisations in parallel (vmap), chunks of ``chunk`` jit-compiled
    sweeps until every restart has converged (relative bound increase < ``tol``) or ``max_iter``."""
    Y = jnp.asarray(Y)
    mu0 = jnp.asarray(mu0)
    init_fn, chunk_fn = _compiled(cfg, int(chunk), float(tol))
    st = init_fn(jax.random.split(key, n_init), Y, mu0)
    F = jnp.full(n_init, -jnp.inf)
    done = jnp.zeros(n_init, bool)
    it = jnp.zeros(n_init, jnp.int32)
    traces = []
    for _ in range(int(np.ceil(max_iter / chunk))):
        st, F, done, it, tr = chunk_fn(st, F, done, it, Y, mu0)
        traces.append(np.asarray(tr))
        if bool(jnp.all(done)):
            break
    trace = np.concatenate(traces, axis=1)
    finals = np.asarray(F)
    if not np.all(np.isfinite(finals)):
        raise FloatingPointError("vbem: the lower bound became non-finite")
    b = int(np.argmax(finals))
    n = int(it[b])
    best = jax.tree.map(lambda a: a[b], st)
    return RunResult(best, trace[b, :n], finals, n, bool(done[b]))


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


def summary_of(cfg: Cfg, st: VBState, prune_below=2.0, rank_threshold=0.1) -> dict:
    """Point summary of a fit: kept components (N_k > prune_below), their weights alpha_k / sum alpha over
    kept, means, rotated loadings, Algorithm-1 ranks, covariance C_k = M M^T + E[tau]^-1 I (plug-in GMM)."""
    Et = float(tau_moments(cfg, st)[0])
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
    return np.asarray(logsumexp(jnp.asarray(np.stack(out, 1)), axis=1))


# --------------------------------------------------------------------------------------------------
# Draws from q
# --------------------------------------------------------------------------------------------------


def draw_q(cfg: Cfg, st: VBState, key, S: int):
    """S draws of (omega, nu, Wt, mu, tau) from the q factors and log q at each (constrained space)."""
    post, lq = _draw_q(cfg, st, key, S)
    return {k: np.asarray(v)[None] for k, v in post.items()}, np.asarray(lq)[None]


@functools.partial(jax.jit, static_argnums=(0, 3))
def _draw_q(cfg: Cfg, st: VBState, key, S: int):
    k1, k3, k4 = jax.random.split(key, 3)
    K, q, d = cfg.K, cfg.q, cfg.d
    post, lq = {}, jnp.zeros(S)
    # every Gamma variate in one loggamma call (one sampler to compile): [alpha (K), a_nu (K q), c_tau (1)]
    shapes = jnp.concatenate([st.alpha, st.a_nu.reshape(-1), st.c_tau[None]])
    lg = jax.random.loggamma(k1, shapes, (S, shapes.shape[0]))
    if cfg.mixture:
        la = lg[:, :K]
        lw = jnp.maximum(la - logsumexp(la, -1, keepdims=True), -700.0)   # omega_k >= e^-700: finite log densities
        om = jnp.exp(lw)
        om = om / om.sum(-1, keepdims=True)
        post["omega"] = om
        lq += dist.Dirichlet(st.alpha).log_prob(om)
    nu = jnp.maximum(jnp.exp(lg[:, K:K + K * q].reshape(S, K, q)) / st.b_nu, 1e-300)
    post["nu"] = nu
    lq += dist.Gamma(st.a_nu, st.b_nu).log_prob(nu).sum((-2, -1))
    Lc = jnp.linalg.cholesky(st.SL + 1e-300 * jnp.eye(q))                        # (K, q, q)
    eps = jax.random.normal(k3, (S, K, d, q))
    Wrows = st.M[None] + jnp.einsum("kij,skdj->skdi", Lc, eps)                     # rows ~ N(M^i, SL)
    post["Wt"] = jnp.swapaxes(Wrows, -1, -2)                                        # (S, K, q, d)
    lq += dist.MultivariateNormal(st.M, scale_tril=Lc[:, None]).log_prob(Wrows).sum((-2, -1))
    mu = st.m_mu[None] + jnp.sqrt(st.s2_mu)[None, :, None] * jax.random.normal(k4, (S, K, d))
    post["mu"] = mu
    lq += dist.Normal(st.m_mu, jnp.sqrt(st.s2_mu)[:, None]).log_prob(mu).sum((-2, -1))
    if cfg.learn_tau:
        tau = jnp.exp(lg[:, -1]) / st.e_tau
        post["tau"] = tau
        lq += dist.Gamma(st.c_tau, st.e_tau).log_prob(tau)
    if not cfg.mixture:
        post = {k: (v[:, 0] if k != "tau" else v) for k, v in post.items()}
    return post, lq


# --------------------------------------------------------------------------------------------------
# The registered method
# --------------------------------------------------------------------------------------------------

VBEM_OPTIONS = {"max_iter": 1000, "tol": 1e-7, "num_samples": 1000, "n_init": 1, "prune_below": 2.0,
                "rank_threshold": 0.1, "paper_literal": False}


def _check_vbem(o):
    if isinstance(o["n_init"], bool) or not isinstance(o["n_init"], int) or o["n_init"] < 1:
        raise ValueError(f"n_init: expected a positive integer number of restarts, got {o['n_init']!r}")
    for k in ("prune_below", "rank_threshold"):
        if isinstance(o[k], bool) or not isinstance(o[k], int | float) or not o[k] >= 0:
            raise ValueError(f"{k}: expected a non-negative number, got {o[k]!r}")
    if not isinstance(o["paper_literal"], bool):
        raise ValueError(f"paper_literal: expected True or False, got {o['paper_literal']!r}")


def fit_vbem(Y, hyper, key, *, mixture=True, n_init=1, max_iter=1000, tol=1e-7, paper_literal=False):
    """Run VB-EM on ``Y`` (no DataTree): returns (cfg, RunResult)."""
    Y = np.asarray(Y, float)
    cfg = cfg_from(hyper, Y.shape[1], mixture, paper_literal)
    if cfg.mixture and cfg.K > Y.shape[0]:
        raise ValueError(f"K: at most N = {Y.shape[0]} components can be initialised by k-means, got {cfg.K}")
    mu0 = prior_means({"Y": Y}, hyper, cfg.K)
    return cfg, run(cfg, Y, mu0, key, n_init=n_init, max_iter=max_iter, tol=tol)


def _variational_group(cfg: Cfg, st: VBState, summ: dict) -> xr.Dataset:
    """Group ``variational``: the point summary (N_k, kept, rank, weight, E_nu, E_tau) and every parameter of
    q, so that ``log_q`` and the bound can be recomputed from the tree: alpha (Dirichlet q(omega); absent for
    ppca), a_nu, b_nu (Gamma shape/rate of q(nu)), M, SL (q(Lambda_k) rows N(M_k^i, SL_k)), m_mu, s2_mu
    (q(mu_k) = N(m_mu_k, s2_k I)), c_tau, e_tau (Gamma shape/rate of q(tau); absent when tau is fixed) and the
    local factors r (row, component) = q(z_n = k), m_x (row, component, column), Sx (component, column,
    column) of q(x_n | z_n = k) = N(m_x_nk, Sx_k)."""
    K = cfg.K
    ds = {
        "N_k": (("component",), np.asarray(summ["N_k"])),
        "kept": (("component",), np.isin(np.arange(K), summ["keep"])),
        "m_mu": (("component", "feature"), np.asarray(st.m_mu)),
        "s2_mu": (("component",), np.asarray(st.s2_mu)),
        "M": (("component", "feature", "column"), np.asarray(st.M)),
        "SL": (("component", "column", "column_bis"), np.asarray(st.SL)),
        "E_nu": (("component", "column"), np.asarray(st.a_nu / st.b_nu)),
        "a_nu": (("component", "column"), np.asarray(st.a_nu)),
        "b_nu": (("component", "column"), np.asarray(st.b_nu)),
        "r": (("row", "component"), np.asarray(st.r)),
        "m_x": (("row", "component", "column"), np.asarray(st.m)),
        "Sx": (("component", "column", "column_bis"), np.asarray(st.Sx)),
        "rank": (("kept_component",), summ["ranks"]),
        "weight": (("kept_component",), summ["weights"]),
    }
    if cfg.mixture:
        ds["alpha"] = (("component",), np.asarray(st.alpha))
    if cfg.learn_tau:
        ds["c_tau"], ds["e_tau"] = ((), np.asarray(st.c_tau)), ((), np.asarray(st.e_tau))
    return xr.Dataset(ds, attrs={"E_tau": summ["tau"]})


@register_method("vbem", kind="variational", models=("mppca", "ppca"), check=_check_vbem, options=VBEM_OPTIONS)
def run_vbem(ctx: FitContext) -> Draws:
    """VB-EM for Bayesian (M)PPCA with automatic pruning of components and ARD columns (notes 3.3; erratum E4
    fixed: +1/2 ln|Sigma_x| in the responsibilities, so the bound is monotone); restarts ``n_init``."""
    o = ctx.options
    mixture = ctx.spec.name != "ppca"
    cfg, res = fit_vbem(ctx.data["Y"], ctx.hyper, jax.random.fold_in(ctx.key, 1), mixture=mixture,
                        n_init=o["n_init"], max_iter=o["max_iter"], tol=o["tol"], paper_literal=o["paper_literal"])
    post, log_q = draw_q(cfg, res.state, jax.random.fold_in(ctx.key, 2), o["num_samples"])
    summ = summary_of(cfg, res.state, o["prune_below"], o["rank_threshold"])
    return Draws(posterior=post, sample_stats={"log_q": log_q}, traces={"bound": res.trace},
                 groups={"variational": _variational_group(cfg, res.state, summ)},
                 attrs={"bound_final": float(res.trace[-1]), "n_iter": res.n_iter, "converged": int(res.converged),
                        "K_eff": int(len(summ["keep"])), "ranks": summ["ranks"].tolist(),
                        "restart_bounds": res.finals.tolist()})


# --------------------------------------------------------------------------------------------------
# Baselines: ML EM for (M)PPCA (notes 3.1-3.2) and scikit-learn's VBGMM (notes 3.7)
# --------------------------------------------------------------------------------------------------


class EMState(NamedTuple):
    pi: jax.Array       # (K,)
    mu: jax.Array       # (K, d)
    W: jax.Array        # (K, d, q)
    sig2: jax.Array     # () shared noise variance tau^-1
    loglik: jax.Array   # () log-likelihood at the parameters before this update


def mixture_logpdf(Y, pi, mu, W, sig2):
    """(N, K) log pi_k + ln N(y_n | mu_k, W_k W_k^T + sig2 I) by Woodbury, |C| = sig2^(d-q) |sig2 I + W^T W|."""
    d, q = W.shape[1], W.shape[2]
    Mm = sig2 * jnp.eye(q) + jnp.einsum("kdi,kdj->kij", W, W)                        # (K, q, q)
    Minv, logdetM = _chol_inv_logdet(Mm)
    D = Y[:, None] - mu[None]                                                         # (N, K, d)
    WtD = jnp.einsum("kdq,nkd->nkq", W, D)
    maha = (jnp.sum(D**2, -1) - jnp.einsum("nki,kij,nkj->nk", WtD, Minv, WtD)) / sig2
    logdet = (d - q) * jnp.log(sig2) + logdetM
    return jnp.log(jnp.clip(pi, 1e-300))[None] - 0.5 * (maha + logdet[None] + d * LOG_2PI)


def em_step(state: EMState, Y, tau_fixed):
    """One Tipping-Bishop EM step (notes 3.2 with mu_k = sum r y / sum r, E2; eq. 22 with the inverse, E1);
    shared noise variance sig2 = sum_k pi_k sig2_k, or 1/tau_fixed."""
    pi, mu, W, sig2 = state.pi, state.mu, state.W, state.sig2
    N, d = Y.shape
    q = W.shape[-1]
    lp = mixture_logpdf(Y, pi, mu, W, sig2)
    ll = jnp.sum(logsumexp(lp, axis=1))
    r = jax.nn.softmax(lp, axis=1)
    Nk = r.sum(0)
    Nk_safe = jnp.maximum(Nk, 1e-10)
    mu_new = jnp.where(Nk[:, None] > 1e-10, (r.T @ Y) / Nk_safe[:, None], mu)
    D = Y[:, None] - mu_new[None]
    S = jnp.einsum("nk,nki,nkj->kij", r, D, D) / Nk_safe[:, None, None]               # (K, d, d)
    Minv, _ = _chol_inv_logdet(sig2 * jnp.eye(q) + jnp.einsum("kdi,kdj->kij", W, W))
    SW = jnp.einsum("kij,kjq->kiq", S, W)
    inner = sig2 * jnp.eye(q) + jnp.einsum("kab,kdb,kdc->kac", Minv, W, SW)
    W_new = jnp.einsum("kdq,kqp->kdp", SW, jnp.linalg.inv(inner))
    sig2_k = (jnp.trace(S, axis1=-2, axis2=-1)
              - jnp.einsum("kdq,kqp,kdp->k", SW, Minv, W_new)) / d
    pi_new = Nk / N
    sig2_new = jnp.sum(pi_new * sig2_k) if tau_fixed is None else jnp.asarray(1.0 / tau_fixed)
    sig2_new = jnp.maximum(sig2_new, 1e-10)
    return EMState(pi_new, mu_new, W_new, sig2_new, ll)


@functools.lru_cache(maxsize=32)
def _em_compiled(tau_fixed, chunk):
    def body(st, _, Y):
        new = em_step(st, Y, tau_fixed)
        return new, new.loglik
    return jax.jit(lambda st, Y: jax.lax.scan(lambda s, x: body(s, x, Y), st, None, length=chunk))


def fit_em(Y, hyper, key, *, mixture=True, max_iter=1000, tol=1e-8, chunk=25):
    """ML EM for MPPCA (K = 1: PPCA) from the VB initialisation (k-means + per-cluster PCA); returns
    (EMState at the last update, log-likelihood trace (monotone), converged)."""
    Y = np.asarray(Y, float)
    cfg = cfg_from(hyper, Y.shape[1], mixture)
    mu0 = prior_means({"Y": Y}, hyper, cfg.K)
    st0 = init(cfg, jnp.asarray(Y), jnp.asarray(mu0), key)
    n0 = st0.r.sum(0)
    sig2 = st0.e_tau / st0.c_tau if cfg.learn_tau else jnp.asarray(1.0 / cfg.tau)
    st = EMState(n0 / n0.sum(), st0.m_mu, st0.M, sig2, jnp.asarray(-jnp.inf))
    fn = _em_compiled(None if cfg.learn_tau else cfg.tau, int(chunk))
    traces, conv = [], False
    for _ in range(int(np.ceil(max_iter / chunk))):
        st, tr = fn(st, jnp.asarray(Y))
        traces.append(np.asarray(tr))
        t = np.concatenate(traces)
        if len(t) > 1 and abs(t[-1] - t[-2]) <= tol * abs(t[-1]):
            conv = True
            break
    return cfg, st, np.concatenate(traces), conv


def _point_draws(cfg: Cfg, pi, mu, W, sig2):
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


EM_OPTIONS = {"max_iter": 1000, "tol": 1e-8}


@register_method("em", kind="point", models=("mppca", "ppca"), options=EM_OPTIONS)
def run_em(ctx: FitContext) -> Draws:
    """Maximum-likelihood EM for (M)PPCA (Tipping & Bishop; notes 3.1-3.2, errata E1-E2), the paper's baseline;
    tau shared (learned by ML, or ``tau_fixed``). Priors are ignored; ``nu`` is reported at d / |Lambda^j|^2."""
    mixture = ctx.spec.name != "ppca"
    cfg, st, trace, conv = fit_em(ctx.data["Y"], ctx.hyper, jax.random.fold_in(ctx.key, 1), mixture=mixture,
                                  max_iter=ctx.options["max_iter"], tol=ctx.options["tol"])
    post = _point_draws(cfg, st.pi, st.mu, st.W, st.sig2)
    return Draws(posterior=post, traces={"loglik": trace},
                 attrs={"loglik_final": float(trace[-1]), "n_iter": len(trace), "converged": int(conv)})


VBGMM_PRIORS = ("sklearn", "vbmix")


def vbgmm_covariance_prior(Y, prior="sklearn"):
    """The Wishart scale W0^-1 (sklearn's ``covariance_prior``): ``"sklearn"`` -> None (sklearn's default, the
    empirical covariance of Y), ``"vbmix"`` -> the paper's VBGMM prior (notes 3.7, VBmix: W0 = diag(64 /
    (d range_j^2)), i.e. W0^-1 = diag(d range_j^2 / 64))."""
    if prior not in VBGMM_PRIORS:
        raise ValueError(f"covariance_prior: expected one of {VBGMM_PRIORS}, got {prior!r}")
    if prior == "sklearn":
        return None
    Y = np.asarray(Y, float)
    return np.diag(Y.shape[1] * np.ptp(Y, axis=0) ** 2 / 64.0)


def fit_vbgmm(Y, K, *, tol=1e-3, max_iter=1000, seed=0, alpha0=1e-3, covariance_prior="sklearn"):
    """scikit-learn ``BayesianGaussianMixture`` (full covariances, Dirichlet-distribution weight prior with
    concentration ``alpha0``, k-means init, mean precision beta0 = 1, Wishart dof nu0 = d) -- the paper's VBGMM
    baseline, not re-implemented. ``covariance_prior``: ``"sklearn"`` (empirical covariance of Y) or
    ``"vbmix"`` (the paper's W0, notes 3.7; see ``vbgmm_covariance_prior``).

    sklearn's ``tol`` is an absolute threshold on the change of its *total* lower bound (constants dropped),
    not a per-point or relative one: 1e-3 at |bound| ~ 1e5 is ~1e-8 relative, stricter than vbem's default
    1e-7 relative. For evaluation use the plug-in density (``gmm_logpdf`` of weights_, means_, covariances_):
    sklearn's ``score`` is its E-step quantity (E_q ln pi + E_q ln N, Jensen-lowered, not normalised)."""
    from sklearn.mixture import BayesianGaussianMixture

    return BayesianGaussianMixture(n_components=K, covariance_type="full", weight_concentration_prior=alpha0,
                                   weight_concentration_prior_type="dirichlet_distribution", tol=tol,
                                   max_iter=max_iter, random_state=seed,
                                   covariance_prior=vbgmm_covariance_prior(Y, covariance_prior)
                                   ).fit(np.asarray(Y, float))


VBGMM_OPTIONS = {"max_iter": 1000, "tol": 1e-3, "covariance_prior": "sklearn"}


def _check_vbgmm(o):
    if o["covariance_prior"] not in VBGMM_PRIORS:
        raise ValueError(f"covariance_prior: expected one of {VBGMM_PRIORS}, got {o['covariance_prior']!r}")


@register_method("vbgmm", kind="point", models=("mppca",), check=_check_vbgmm, options=VBGMM_OPTIONS)
def run_vbgmm(ctx: FitContext) -> Draws:
    """VBGMM baseline: scikit-learn's ``BayesianGaussianMixture`` (full covariances, K = K_init, alpha0;
    ``covariance_prior`` "sklearn" (empirical covariance) or "vbmix" (the paper's W0, notes 3.7)).
    The exact fitted GMM (weights, means, covariances) is in group ``gmm``; the posterior holds its projection
    on the MPPCA parameters (per component the top-q eigenvectors, shared noise variance = the weighted mean
    of the discarded eigenvalues, or 1/tau_fixed) so the tree has the model's shape."""
    Y = ctx.data["Y"]
    cfg = cfg_from(ctx.hyper, Y.shape[1], True)
    g = fit_vbgmm(Y, cfg.K, tol=ctx.options["tol"], max_iter=ctx.options["max_iter"], seed=ctx.seed,
                  alpha0=cfg.alpha0, covariance_prior=ctx.options["covariance_prior"])
    lam, U = np.linalg.eigh(g.covariances_)
    lam, U = lam[:, ::-1], U[:, :, ::-1]
    sig2 = float(np.sum(g.weights_ * lam[:, cfg.q:].mean(1))) if cfg.learn_tau else 1.0 / cfg.tau
    W = U[:, :, :cfg.q] * np.sqrt(np.maximum(lam[:, :cfg.q] - sig2, 0.0))[:, None, :]
    post = _point_draws(cfg, g.weights_, g.means_, W, sig2)
    gmm = xr.Dataset({"weight": (("component",), g.weights_), "mean": (("component", "feature"), g.means_),
                      "covariance": (("component", "feature", "feature2"), g.covariances_)},
                     attrs={"converged": int(g.converged_), "n_iter": int(g.n_iter_)})
    return Draws(posterior=post, groups={"gmm": gmm},
                 attrs={"converged": int(g.converged_), "n_iter": int(g.n_iter_),
                        "K_eff": int(np.sum(g.weights_ * len(Y) > 2))})


def clustering_error(labels_a, labels_b) -> float:
    """The paper's clustering error (VBmix ``getCouple``, erratum E21): the fraction of point pairs on which two
    partitions disagree (same cluster in one, different in the other) = 1 - Rand index (unadjusted)."""
    a, b = np.asarray(labels_a), np.asarray(labels_b)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError("labels: expected two 1-D label arrays of the same length >= 2")
    _, ia = np.unique(a, return_inverse=True)
    _, ib = np.unique(b, return_inverse=True)
    table = np.zeros((ia.max() + 1, ib.max() + 1))
    np.add.at(table, (ia, ib), 1)
    pairs = lambda x: float(np.sum(x * (x - 1) / 2))  # noqa: E731
    n = a.size
    same_both = pairs(table)
    same_a, same_b = pairs(table.sum(1)), pairs(table.sum(0))
    disagree = same_a + same_b - 2 * same_both
    return disagree / (n * (n - 1) / 2)
