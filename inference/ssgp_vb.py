"""Closed-form variational Bayes for the sparse-spectrum GP with random effects (``ssgp_lmm``,
``ssgp_logit``, ``ssgp_probit``): one coordinate-ascent engine for the three likelihoods.

Source: D. Lim (2016) on Tan, Ong, Nott & Jasra (Stat. Comput. 2016); every equation, definition and
erratum below is from ``shared/notes/002_gp_random_effects.md`` ("notes §x", "E<k>").

Mean-field family q(lam) q(alpha) q(beta) q(sigma) q(tau) [q(gamma) | q(y*) | xi] with
beta = (beta0, A-coefficients, random effects b flattened (group, term)).

**One engine (notes §3.1).** For all three models the expected log-likelihood in (alpha, beta, lam) is
-1/2 sum_i w_i E_q[(yt_i - z_i^T alpha - a_i^T beta)^2] + const with

=========  =====================  ================================================  =========================
model      weight w_i             pseudo-response yt_i                              extra factor
=========  =====================  ================================================  =========================
LMM        E[gamma^-2]            y_i                                               q(gamma) via C_gamma
probit     1                      E[y*_i] = mu_i + s_i phi(mu_i)/Phi(s_i mu_i)       q(y*_i) = TN(mu_i, 1)
logit      2 omega(xi_i)          (y_i - 1/2) / (2 omega(xi_i))                      xi_i^2 = E[eta_i^2]
=========  =====================  ================================================  =========================

(s_i = 2 y_i - 1, mu_i = E[z_i]^T mu_alpha + a_i^T mu_beta, omega(xi) = tanh(xi/2)/(4 xi), Jaakkola-Jordan.)

**Moments under q(lam) = N(mu, Sigma)** (notes §2.1): nu(t) = exp(-t^T Sigma t / 2), theta_ij = t_ij^T mu,
t_ij = s_j * x_i; E[cos t^T lam] = nu cos(t^T mu), E[sin] = nu sin. E[Z^T W Z] = [[CC, CS], [CS^T, SS]] with
CC_jr = 1/2 sum_i w_i (nu-_ijr cos th-_ijr + nu+_ijr cos th+_ijr), SS_jr = 1/2 sum_i w_i (nu- cos th- - nu+
cos th+), CS_jr = 1/2 sum_i w_i (nu- sin th- + nu+ sin th+), where t-_ijr = t_ir - t_ij, t+ = t_ir + t_ij.
Per observation the m x m matrix G_i = T_i Sigma T_i^T gives t+-^T Sigma t+- = G_rr + G_jj +- 2 G_jr
(reduced cost, notes §3.7): O(n (m^2 d + m d^2)) per sweep, accumulated over chunks of observations.

**Closed-form updates (notes §3.2).**
q(alpha): Sigma_a = (m E[sigma^-2] I + E[Z^T W Z])^-1, mu_a = Sigma_a E[Z]^T W (yt - A mu_beta)   (E2 fixed:
A, not A^T); q(beta): Sigma_b = (P_beta0 + A^T W A)^-1, mu_b = Sigma_b A^T W (yt - E[Z] mu_a), with
P_beta0 = diag(1/var_fixed, 1/var_beta, E[tau_t^-2]); q(sigma) prop. sigma^-2m exp(-C_s/sigma^2)/(A_s^2+sigma^2),
C_s = m/2 (tr Sigma_a + |mu_a|^2); q(tau_t) likewise with J and C_t = 1/2 sum_j E[b_jt^2]; q(gamma) with n and
C_g = 1/2 E||y - Z alpha - A beta||^2 (never defined in the document, E4/E7). Their normalisers and moments
are ratios of H(p, C, r) = int_0^inf x^p exp(-C x^2)/(r + x^-2) dx (notes §3.5), computed in log space on a
401-point trapezoid grid in u = log x centred at the closed-form mode (``log_h``): plain adaptive quadrature
misses the peak at large p (log H(998, 40, 625) = 733.7 instead of 752.3).

**q(lam) by NCVMP (notes §3.2, §3.3).** With r_i = w_i (yt_i - a_i^T mu_beta) and M = Sigma_a + mu_a mu_a^T,
S(mu, Sigma) = mu_a^T E[Z]^T r - 1/2 tr(E[Z^T W Z] M) - 1/2 (mu - mu0)^T P0 (mu - mu0) - 1/2 tr(P0 Sigma);
g = dS/dmu and dS/dSigma = -1/2 (P0 + F1 + F2) with

    F1 = sum_i sum_j r_i nu_ij [mu_a,j cos th_ij + mu_a,m+j sin th_ij] t_ij t_ij^T
    F2 = -1/4 sum_i w_i sum_jr { nu-[(Mcc+Mss) cos th- + 2 Mcs sin th-] t- t-^T
                                + nu+[(Mcc-Mss) cos th+ + 2 Mcs sin th+] t+ t+^T }

(**E1**: the document's F2 carries -1/2; -1/4 is right, checked against ``jax.hessian`` in the tests).
Step a: P_s = (1 - s) Sigma^-1 + s (P0 + F1 + F2) with s = min(a, 1), shrinking s <- 2s/3 until P_s is
positive definite, Sigma <- P_s^-1, mu <- mu + a Sigma g (**E16**: natural-parameter damping, PD guard).

**Step control (ours; the notes' a <= 10 with backtracking from a = 1 needed 417-1469 sweeps).** P holds
alpha fixed, but alpha follows lam inside the same sweep, so the curvature along the path a sweep takes is far
smaller than P and the plain step crawls. a > 1 therefore over-relaxes the mean only: a doubles after each
accepted sweep (up to ``step_max`` = 1e4); if the lower bound would decrease, the sweep is redone with a / 4,
a / 16, ... and, below 2^-13, a = 0 (q(lam) frozen: a pure CAVI sweep, never decreasing). The NCVMP pieces are
computed once per sweep for all its tries. Two more accelerations keep every accepted sweep an exact bound
increase: (i) steps 4-7 are repeated ``INNER`` = 10 times at fixed q(lam) for the Gaussian and probit models
(O(n m s) each: E[Z] and E[Z^T W Z] do not change), so q(y*) and the scales catch up with lam; (ii) each try
also runs steps 4-7 from (C_sigma, C_tau) extrapolated along their last change, by b = 2 b_prev (<= 64), and
keeps the higher bound of the two (C_sigma's EM-like drift was the slowest mode, ~0.07 per sweep).
**Stopping rule:** |L_t - L_{t-1}| < tol |L_t| AND the lam mean moved less than 0.01 sd of q(lam) in that
sweep: an over-relaxed step can jump across the maximum and land on an almost equal bound.

**Sweep order (notes §3.3):** pseudo-data; q(lam); recompute E[Z], E[Z^T W Z]; pseudo-data; q(alpha);
(logit) xi; q(beta); C_sigma, C_tau, C_gamma; then the complete lower bound (notes §3.4).
**Cost:** the m^2 pairwise cosines and sines come from the m per-observation ones by the addition formulas;
only the Gaussian factors nu+- need exp per pair.
**Warm start (E17):** the first ``warm_start`` sweeps freeze q(lam): from mu_alpha = 0 the first lam step
would send mu_lam to the prior mean 0, a stationary point with a flat f.

**Spaces of log q and of the bound.** ``draw`` returns log q at the model's (non-centred) sites lam, sigma,
alpha_raw, beta0, beta, tau, b_raw, gamma, with the Jacobians of alpha_raw = sqrt(m) alpha / sigma and b_raw =
b / tau. The bound (``lower_bound``) is: LMM, the ELBO on the model's space itself; probit, the ELBO on the
Albert-Chib space (theta, y*) with the optimal q(y*_i) = TN(E_q eta_i, 1) truncated to y_i's side, below the
model-space ELBO; logit, the Jaakkola-Jordan bound, which is exactly the ELBO on the Polya-Gamma space
(theta, omega) with q(omega_i) = PG(1, xi_i) (E_q omega_i = tanh(xi_i/2)/(2 xi_i) = 2 omega(xi_i); Durante &
Rigon 2019), also below the model-space ELBO. tests/test_log_q.py checks all three identities by Monte Carlo.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from jax.scipy.linalg import cho_factor, cho_solve
from jax.scipy.special import log_ndtr

from inference._methods import Draws, FitContext, register_method
from inference.progress import progress_enabled

LOG_2PI = math.log(2 * math.pi)
H_GRID = 401
SAMPLE_GRID = 20001
MODELS = ("ssgp_lmm", "ssgp_logit", "ssgp_probit")
LIKELIHOOD_OF = {"ssgp_lmm": "gaussian", "ssgp_logit": "logit", "ssgp_probit": "probit"}
GROW, SHRINK, MIN_STEP = 2.0, 0.25, 2.0 ** -13  # adaptive lam step: x2 after a success, /4 per failed try
INNER = 10  # CAVI passes over (alpha, beta, scales[, y*]) per lam step (``_coefficients_and_scales``)
B_MAX = 64.0  # largest extrapolation factor of the coefficient scales (see ``sweep``)
LAM_TOL = 1e-2  # convergence also needs the last lam-mean move below 0.01 sd of q(lam) (Mahalanobis)


# --------------------------------------------------------------------------------------------------
# The H function (notes §3.5)
# --------------------------------------------------------------------------------------------------

def _h_grid(p, C, r, width, tail, K):
    """u-grid around the mode of g(u) = (p+1)u - C e^{2u} - log(r + e^{-2u}) (strictly concave)."""
    C = jnp.maximum(C, 1e-12)
    b = (p + 1.0) * r - 2.0 * C
    disc = jnp.sqrt(b * b + 8.0 * C * r * (p + 3.0))
    v = jnp.where(b >= 0, (b + disc) / (4.0 * C * r), 2.0 * (p + 3.0) / (disc - b))  # e^{2u*}, no cancellation
    u0 = 0.5 * jnp.log(v)
    su = 1.0 / jnp.sqrt(4.0 * C * v + 4.0 * r * v / (r * v + 1.0) ** 2)
    lo = u0 - jnp.maximum(width * su, tail / (p + 3.0))  # left tail decays only like e^{(p+3)u}
    u = jnp.linspace(lo, u0 + width * su, K)
    g = (p + 1.0) * u - C * jnp.exp(2.0 * u) - jnp.logaddexp(jnp.log(r), -2.0 * u)
    return u, g


def log_h(p, C, r):
    """log H(p, C, r) = log int_0^inf x^p e^{-C x^2} / (r + x^-2) dx  (C > 0, r > 0, p > -3; notes §3.5).

    Trapezoid rule on 401 points of u = log x over [u* - max(12 s_u, 46/(p+3)), u* + 12 s_u], in log space;
    relative error below 1e-13 against the Tricomi-U closed form at the notes' eight test triples."""
    u, g = _h_grid(p, C, r, 12.0, 46.0, H_GRID)
    h = u[1] - u[0]
    gmax = jnp.max(g)
    wts = jnp.ones(H_GRID).at[0].set(0.5).at[-1].set(0.5)
    return gmax + jnp.log(h * jnp.sum(wts * jnp.exp(g - gmax)))


def inv_moment(p, C, r, k):
    """E[s^-k] under q(s) prop. s^-(p+2) e^{-C/s^2} / (r + s^2): H(p+k, C, r) / H(p, C, r) (notes §3.2)."""
    return jnp.exp(log_h(p + k, C, r) - log_h(p, C, r))


def scale_log_density(s, p, C, r):
    """log q(s) = -(p+2) log s - C/s^2 - log(r + s^2) - log H(p, C, r)  (s = sigma, gamma or tau)."""
    return -(p + 2.0) * jnp.log(s) - C / s**2 - jnp.log(r + s**2) - log_h(p, C, r)


def sample_scale(key, p, C, r, shape):
    """Draws of s from q(s) by inverse CDF on a 20001-point u-grid (notes §3.5), s = e^{-u}."""
    u, g = _h_grid(p, C, r, 14.0, 50.0, SAMPLE_GRID)
    dens = jnp.exp(g - jnp.max(g))
    cdf = jnp.concatenate([jnp.zeros(1), jnp.cumsum(0.5 * (dens[1:] + dens[:-1]))])
    cdf = cdf / cdf[-1]
    return jnp.exp(-jnp.interp(jax.random.uniform(key, shape), cdf, u))


# --------------------------------------------------------------------------------------------------
# Static problem description and variational state
# --------------------------------------------------------------------------------------------------

class Config(NamedTuple):
    """Static (hashable) description of a fit: sizes, likelihood, prior scales, chunking."""
    likelihood: str
    n: int
    m: int
    d: int
    s: int            # columns of the full design [1, A, random effects]
    J: int            # groups (0: none)
    T: int            # random-effect terms per group (0: none)
    A_sigma: float
    A_gamma: float
    A_tau: float
    chunk: int        # observations per chunk
    n_chunks: int
    factorisation: str = "joint"  # "joint": q(alpha, beta) one Gaussian block; "mean_field": q(alpha) q(beta)


class Data(NamedTuple):
    """Arrays, padded to n_chunks * chunk rows (``mask`` = 0 on padding)."""
    X: jax.Array          # (Np, d) inputs scaled to [0, 1]
    y: jax.Array          # (Np,)
    mask: jax.Array       # (Np,)
    Af: jax.Array         # (Np, s) full design: intercept, A, random-effect columns (group j, term t) at 1+sA+j*T+t
    S: jax.Array          # (m, d) spectral points
    prec_fixed: jax.Array  # (s,) prior precision of the non-random coefficients (0 for random ones)
    re_term: jax.Array    # (s, T) one-hot term of each random coefficient (zero rows for fixed ones)
    mu_lam0: jax.Array    # (d,)
    P_lam0: jax.Array     # (d, d) prior precision of lam
    AtA: jax.Array        # (s, s) A_f^T A_f over the real rows


class VBState(NamedTuple):
    """Variational parameters and the cached expectations that go with them."""
    mu_lam: jax.Array   # (d,)
    Sig_lam: jax.Array  # (d, d)
    mu_a: jax.Array     # (2m,)
    Sig_a: jax.Array    # (2m, 2m)
    mu_b: jax.Array     # (s,)
    Sig_b: jax.Array    # (s, s)
    Sig_ab: jax.Array   # (2m, s) Cov(alpha, beta) under q (zero for the mean-field factorisation)
    C_sig: jax.Array    # ()
    C_tau: jax.Array    # (T,)
    C_gam: jax.Array    # () (LMM)
    xi: jax.Array       # (Np,) (logit)
    EZ: jax.Array       # (Np, 2m)  E[Z] under q(lam)
    ZWZ: jax.Array      # (2m, 2m)  E[Z^T W Z] (unweighted for LMM and probit)
    qz: jax.Array       # (Np,)     tr(E[z_i z_i^T] M) (logit)
    bound: jax.Array    # ()        lower bound after this state's sweep
    a: jax.Array        # ()        NCVMP step actually used in the last sweep
    it: jax.Array       # ()        sweeps done
    b: jax.Array        # ()        extrapolation of the coefficient scales (C_sigma, C_tau) used in the last sweep
    dC: jax.Array       # (1+T,)    change of (C_sigma, C_tau) over the last sweep (the extrapolation direction)


class Info(NamedTuple):
    bound: jax.Array
    step: jax.Array
    n_tries: jax.Array


# --------------------------------------------------------------------------------------------------
# Moments of the features under q(lam), per chunk of observations (notes §2.1, §3.7)
# --------------------------------------------------------------------------------------------------

def _pair_terms(Xc, S, mu, Sig):
    """Per-observation pieces: T (B,m,d), theta, nu, cos theta, sin theta (B,m) and nu-/nu+ (B,m,m) [b, j, r].

    Only the m^2 Gaussian factors nu+- need transcendental functions: the m^2 cosines and sines of
    th+- = th_r +- th_j come from the m per-observation cos/sin by the addition formulas (``_trig_pairs``)."""
    T = Xc[:, None, :] * S[None, :, :]
    th = T @ mu
    G = jnp.einsum("bjk,kl,brl->bjr", T, Sig, T)
    gd = jnp.diagonal(G, axis1=1, axis2=2)
    # Materialise the (B, m) factors: left to itself XLA fuses them into every (B, m, m) loop and
    # re-evaluates the exp/cos/sin per pair (5x slower sweeps at m = 50).
    gd, nu, c, s = jax.lax.optimization_barrier((gd, jnp.exp(-0.5 * gd), jnp.cos(th), jnp.sin(th)))
    base = -0.5 * (gd[:, :, None] + gd[:, None, :])
    nu_m, nu_p = jnp.exp(base + G), jnp.exp(base - G)          # t- = t_r - t_j, t+ = t_r + t_j
    return T, th, nu, c, s, nu_m, nu_p


def _trig_pairs(c, s):
    """cos th-, sin th-, cos th+, sin th+ (B,m,m) [b, j, r] from c = cos th, s = sin th (B,m):
    cos(th_r -+ th_j) = c_r c_j +- s_r s_j, sin(th_r -+ th_j) = s_r c_j -+ c_r s_j."""
    cc = c[:, :, None] * c[:, None, :]
    ss = s[:, :, None] * s[:, None, :]
    sc = c[:, :, None] * s[:, None, :]      # c_j s_r
    cs = s[:, :, None] * c[:, None, :]      # s_j c_r
    return cc + ss, sc - cs, cc - ss, sc + cs


def _zz_blocks(nu_m, nu_p, c, s):
    """Per-observation E[cos cos], E[sin sin], E[cos_j sin_r] (B, m, m)."""
    cm, sm, cp, sp = _trig_pairs(c, s)
    cm, cp = nu_m * cm, nu_p * cp
    cs = 0.5 * (nu_m * sm + nu_p * sp)
    return 0.5 * (cm + cp), 0.5 * (cm - cp), cs


def _chunked(cfg, fn, arrays, init):
    """Scan ``fn(carry, chunk_arrays) -> (carry, per_row)`` over the chunks of observations."""
    resh = jax.tree.map(lambda a: a.reshape(cfg.n_chunks, cfg.chunk, *a.shape[1:]), arrays)
    carry, rows = jax.lax.scan(fn, init, resh)
    rows = jax.tree.map(lambda a: a.reshape(cfg.n_chunks * cfg.chunk, *a.shape[2:]), rows)
    return carry, rows


def expectations(cfg, X, w, S, mu, Sig):
    """E[Z] (Np, 2m) and E[Z^T W Z] (2m, 2m) under q(lam) = N(mu, Sig) (notes §2.1)."""
    m = cfg.m

    def fn(acc, xs):
        Xc, wc = xs
        _, _, nu, c, s, nu_m, nu_p = _pair_terms(Xc, S, mu, Sig)
        cc, ss, cs = _zz_blocks(nu_m, nu_p, c, s)
        CC, SS, CS = (jnp.einsum("b,bjr->jr", wc, a) for a in (cc, ss, cs))
        blk = jnp.block([[CC, CS], [CS.T, SS]])
        return acc + blk, jnp.concatenate([nu * c, nu * s], axis=-1)

    ZWZ, EZ = _chunked(cfg, fn, (X, w), jnp.zeros((2 * m, 2 * m)))
    return EZ, ZWZ


def quad_features(cfg, X, S, mu, Sig, Mmat):
    """tr(E[z_i z_i^T] M) for every observation (Np,) (notes §2.1, per-observation formula)."""
    m = cfg.m
    Mcc, Mcs, Mss = Mmat[:m, :m], Mmat[:m, m:], Mmat[m:, m:]

    def fn(acc, Xc):
        _, _, _, c, s, nu_m, nu_p = _pair_terms(Xc, S, mu, Sig)
        cc, ss, cs = _zz_blocks(nu_m, nu_p, c, s)
        return acc, jnp.einsum("bjr,jr->b", cc, Mcc) + jnp.einsum("bjr,jr->b", ss, Mss) + \
            2.0 * jnp.einsum("bjr,jr->b", cs, Mcs)

    return _chunked(cfg, fn, X, jnp.zeros(()))[1]


def ncvmp_terms(cfg, X, w, coef, S, mu, Sig, Mmat, f2_coef=-0.25):
    """Data part of the NCVMP gradient g and of F1 + F2 (notes §3.2), summed over observations.

    The data part of S is sum_i E[z_i]^T c_i - 1/2 tr(E[Z^T W Z] M) with c_i = r_i mu_alpha (notes §3.2) for
    the mean-field family, and c_i = r_i mu_alpha - w_i Cov(alpha, beta) a_i when q(alpha, beta) is joint;
    ``coef`` holds the rows c_i (Np, 2m). ``f2_coef`` is -1/4 (E1); the tests pass -1/2 (the document's
    value) to show that it is wrong."""
    m = cfg.m
    Mcc, Mcs, Mss = Mmat[:m, :m], Mmat[:m, m:], Mmat[m:, m:]

    def fn(acc, xs):
        g_acc, F_acc = acc
        Xc, wc, cc_ = xs
        mc, ms = cc_[:, :m], cc_[:, m:]
        T, _, nu, cth, sth, nu_m, nu_p = _pair_terms(Xc, S, mu, Sig)
        # first-order term: sum_j nu_ij [c_i,m+j cos th_ij - c_i,j sin th_ij] t_ij  (c_i = r_i mu_alpha: notes)
        u = nu * (ms * cth - mc * sth)
        g1 = jnp.einsum("bjk,bj->k", T, u)
        v = nu * (mc * cth + ms * sth)
        F1 = jnp.einsum("bj,bjk,bjl->kl", v, T, T)
        cm, sm, cp, sp = _trig_pairs(cth, sth)
        wc3 = wc[:, None, None]
        nu_m, nu_p = jax.lax.optimization_barrier((wc3 * nu_m, wc3 * nu_p))
        wc3 = 1.0
        Pm = wc3 * nu_m * (2.0 * Mcs * cm - (Mcc + Mss) * sm)
        Pp = wc3 * nu_p * (2.0 * Mcs * cp + (Mss - Mcc) * sp)
        Qm = wc3 * nu_m * ((Mcc + Mss) * cm + 2.0 * Mcs * sm)
        Qp = wc3 * nu_p * ((Mcc - Mss) * cp + 2.0 * Mcs * sp)
        # With t+-_ijr = x_i * (S_r +- S_j): sum_jr P_jr t+-  and  sum_jr Q_jr t+- t+-^T summed over the chunk
        # are contractions of sum_i x_ik P_ijr and sum_i x_ik x_il Q_ijr (one matmul over i each) with S.
        Um, Up = (jnp.einsum("bk,bjr->kjr", Xc, a) for a in (Pm, Pp))
        XX = Xc[:, :, None] * Xc[:, None, :]
        Vm, Vp = (jnp.einsum("bkl,bjr->kljr", XX, a) for a in (Qm, Qp))
        Dm = S[None, :, :] - S[:, None, :]          # (j, r, k): S_rk - S_jk
        Dp = S[None, :, :] + S[:, None, :]
        g2 = jnp.einsum("kjr,jrk->k", Um, Dm) + jnp.einsum("kjr,jrk->k", Up, Dp)
        F2 = jnp.einsum("kljr,jrk,jrl->kl", Vm, Dm, Dm) + jnp.einsum("kljr,jrk,jrl->kl", Vp, Dp, Dp)
        return (g_acc + g1 - 0.25 * g2, F_acc + F1 + f2_coef * F2), None

    d = cfg.d
    (g, F), _ = _chunked(cfg, fn, (X, w, coef), (jnp.zeros(d), jnp.zeros((d, d))))
    return g, F


# --------------------------------------------------------------------------------------------------
# Pseudo-likelihood, expectations of the scales, lower bound (notes §3.1, §3.4)
# --------------------------------------------------------------------------------------------------

def omega(xi):
    """omega(xi) = tanh(xi/2) / (4 xi), continuous at 0 (series 1/8 - xi^2/96 for |xi| < 1e-4)."""
    small = jnp.abs(xi) < 1e-4
    safe = jnp.where(small, 1.0, xi)
    return jnp.where(small, 0.125 - xi**2 / 96.0, jnp.tanh(safe / 2.0) / (4.0 * safe))


def e_sigma_inv2(cfg, st):
    return inv_moment(2.0 * cfg.m - 2.0, st.C_sig, cfg.A_sigma**2, 2.0)


def e_gamma_inv2(cfg, st):
    return inv_moment(cfg.n - 2.0, st.C_gam, cfg.A_gamma**2, 2.0)


def e_tau_inv2(cfg, st):
    return jax.vmap(lambda c: inv_moment(cfg.J - 2.0, c, cfg.A_tau**2, 2.0))(st.C_tau)


def pseudo(cfg, data, st):
    """(w, yt): the weighted Gaussian pseudo-likelihood of the current factors (notes §3.1)."""
    if cfg.likelihood == "gaussian":
        return data.mask * e_gamma_inv2(cfg, st), data.y
    if cfg.likelihood == "probit":
        mu = st.EZ @ st.mu_a + data.Af @ st.mu_b
        sgn = 2.0 * data.y - 1.0
        # inverse Mills ratio in log space (E9): s phi(mu) / Phi(s mu)
        mills = sgn * jnp.exp(-0.5 * mu**2 - 0.5 * LOG_2PI - log_ndtr(sgn * mu))
        return data.mask, mu + mills
    om = omega(st.xi)
    return data.mask * 2.0 * om, (data.y - 0.5) / (2.0 * om)


def prior_prec_beta(cfg, data, st):
    """Diagonal prior precision of beta: 1/var_fixed, 1/var_beta, E[tau_t^-2] (notes §2.6)."""
    if cfg.T == 0:
        return data.prec_fixed
    return data.prec_fixed + data.re_term @ e_tau_inv2(cfg, st)


def _logdet_spd(P):
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(jnp.linalg.cholesky(P))))


def _inv_spd(P):
    c = cho_factor(P, lower=True)
    return cho_solve(c, jnp.eye(P.shape[0]))


def eta_moments(cfg, data, st):
    """Per observation: E[f_i] = E[z_i]^T mu_a, (A mu_b)_i, a_i^T (Sigma_b + mu_b mu_b^T) a_i and the
    cross term E[z_i]^T Cov(alpha, beta) a_i; E[eta_i^2] = tr(E[z_i z_i^T] M) + 2 f re + 2 cross + aq."""
    f = st.EZ @ st.mu_a
    re = data.Af @ st.mu_b
    aq = jnp.sum((data.Af @ st.Sig_b) * data.Af, axis=1) + re**2
    cross = jnp.sum(st.EZ * (data.Af @ st.Sig_ab.T), axis=1)
    return f, re, aq, cross


def joint_cov(st):
    """Cov of theta = (alpha, beta) under q: [[Sigma_a, Sigma_ab], [Sigma_ab^T, Sigma_b]]."""
    return jnp.block([[st.Sig_a, st.Sig_ab], [st.Sig_ab.T, st.Sig_b]])


def lower_bound(cfg, data, st):
    """The complete lower bound (notes §3.4) at ``st``: exact for any state of the family, with the
    E[.^-2](C - C_now) corrections when a C is not current (E14). Probit: at the optimal q(y*);
    logit: the Jaakkola-Jordan bound at ``st.xi``."""
    m, d = cfg.m, cfg.d
    trM = jnp.trace(st.Sig_a) + st.mu_a @ st.mu_a
    Es = e_sigma_inv2(cfg, st)
    L = m * math.log(m) - m * LOG_2PI + math.log(2 * cfg.A_sigma / math.pi) + \
        log_h(2.0 * m - 2.0, st.C_sig, cfg.A_sigma**2) + Es * (st.C_sig - 0.5 * m * trM)
    dl = st.mu_lam - data.mu_lam0
    L += 0.5 * (jnp.linalg.slogdet(data.P_lam0 @ st.Sig_lam)[1] + d - jnp.trace(data.P_lam0 @ st.Sig_lam)
                - dl @ data.P_lam0 @ dl)
    # beta part: random terms through q(tau_t), fixed ones with their Gaussian prior, entropy of q(beta)
    eb2 = jnp.diagonal(st.Sig_b) + st.mu_b**2
    fixed = data.prec_fixed > 0
    pf = jnp.where(fixed, data.prec_fixed, 1.0)
    L += jnp.sum(jnp.where(fixed, -0.5 * LOG_2PI + 0.5 * jnp.log(pf) - 0.5 * pf * eb2, 0.0))
    if cfg.T > 0:
        Et = e_tau_inv2(cfg, st)
        ssq = data.re_term.T @ eb2
        lh = jax.vmap(lambda c: log_h(cfg.J - 2.0, c, cfg.A_tau**2))(st.C_tau)
        L += jnp.sum(-0.5 * cfg.J * LOG_2PI + math.log(2 * cfg.A_tau / math.pi) + lh + Et * (st.C_tau - 0.5 * ssq))
    # entropy of q(alpha, beta) (= the notes' 1/2 log|Sigma_a| + m(1 + log 2 pi) + beta entropy when the
    # factorisation is mean-field)
    L += 0.5 * (2 * m + cfg.s) * (1.0 + LOG_2PI) + 0.5 * _logdet_spd(joint_cov(st))
    # likelihood part
    f, re, aq, cross = eta_moments(cfg, data, st)
    mask = data.mask
    Mmat = st.Sig_a + jnp.outer(st.mu_a, st.mu_a)
    if cfg.likelihood == "logit":
        eta2 = st.qz + 2.0 * (f * re + cross) + aq
        om = omega(st.xi)
        L += jnp.sum(mask * ((data.y - 0.5) * (f + re) - om * eta2 + st.xi / 2.0 - jax.nn.softplus(st.xi)
                             + om * st.xi**2))
        return L
    sum_eta2 = jnp.sum(st.ZWZ * Mmat) + jnp.sum(mask * (2.0 * (f * re + cross) + aq))
    mu = f + re
    if cfg.likelihood == "probit":
        sgn = 2.0 * data.y - 1.0
        return L + jnp.sum(mask * log_ndtr(sgn * mu)) - 0.5 * (sum_eta2 - jnp.sum(mask * mu**2))
    ssr = jnp.sum(mask * (data.y**2 - 2.0 * data.y * mu)) + sum_eta2
    Eg = e_gamma_inv2(cfg, st)
    return L - 0.5 * cfg.n * LOG_2PI + math.log(2 * cfg.A_gamma / math.pi) + \
        log_h(cfg.n - 2.0, st.C_gam, cfg.A_gamma**2) + Eg * (st.C_gam - 0.5 * ssr)


# --------------------------------------------------------------------------------------------------
# One sweep (notes §3.3) and the step with adaptive size and backtracking
# --------------------------------------------------------------------------------------------------

def _exp_weights(cfg, data, w):
    """Weights of the cached E[Z^T W Z]: unweighted (mask) for LMM/probit, w for logit."""
    return w if cfg.likelihood == "logit" else data.mask


def _is_pd(P):
    return jnp.all(jnp.isfinite(jnp.linalg.cholesky(P)))


def lam_terms(cfg, data, st, w, yt, f2_coef=-0.25):
    """The NCVMP pieces of q(lam) at ``st`` (notes §3.2): gradient g = dS/dmu and P = P0 + F1 + F2.

    They depend only on the state a sweep starts from, so ``vb_step`` computes them once for all its tries."""
    Mmat = st.Sig_a + jnp.outer(st.mu_a, st.mu_a)
    r = w * (yt - data.Af @ st.mu_b)
    coef = r[:, None] * st.mu_a - w[:, None] * (data.Af @ st.Sig_ab.T)
    g_data, F = ncvmp_terms(cfg, data.X, w, coef, data.S, st.mu_lam, st.Sig_lam, Mmat, f2_coef)
    return data.P_lam0 @ (data.mu_lam0 - st.mu_lam) + g_data, data.P_lam0 + F


def lam_update(st, g, P, a):
    """NCVMP update of q(lam) with step a (notes §3.3, E16).

    Precision: P_s = (1 - s) Sigma^-1 + s P with s = min(a, 1), shrunk s <- 2s/3 until positive definite;
    Sigma <- P_s^-1. Mean: mu <- mu + a Sigma g. For a <= 1 this is the notes' natural-parameter damping. A
    step a > 1 over-relaxes the mean only: the NCVMP curvature P holds alpha fixed, while alpha follows lam
    within the same sweep, so the curvature along the path the sweep actually takes is much smaller and the
    plain step (a = 1) crawls (1469 sweeps at n = 2000, m = 50). Returns (mu, Sigma, step used for the mean)."""
    P_old = _inv_spd(st.Sig_lam)
    s0 = jnp.minimum(a, 1.0)

    def shrink(carry):
        s_, _ = carry
        s_new = jnp.where(s_ < 1e-8, 0.0, s_ * 2.0 / 3.0)
        return s_new, (1.0 - s_new) * P_old + s_new * P

    s_used, Ps = jax.lax.while_loop(lambda c: (c[0] > 0) & ~_is_pd(c[1]), shrink, (s0, (1.0 - s0) * P_old + s0 * P))
    Sig_new = jnp.where(s_used > 0, _inv_spd(0.5 * (Ps + Ps.T)), st.Sig_lam)
    a_used = jnp.where(s_used < s0, s_used, a)  # the PD guard bit: fall back to the damped step
    return st.mu_lam + a_used * Sig_new @ g, Sig_new, a_used


def lam_step(cfg, data, st, w, yt, a, f2_coef=-0.25):
    """NCVMP update of q(lam) from ``st`` with step ``a`` (``lam_terms`` then ``lam_update``)."""
    return lam_update(st, *lam_terms(cfg, data, st, w, yt, f2_coef), a)


def _refresh_xi(cfg, data, st):
    """Logit: xi_i = sqrt(E[eta_i^2]) under the current q (the JJ bound is tight there)."""
    Mmat = st.Sig_a + jnp.outer(st.mu_a, st.mu_a)
    qz = quad_features(cfg, data.X, data.S, st.mu_lam, st.Sig_lam, Mmat)
    f, re, aq, cross = eta_moments(cfg, data, st)
    return st._replace(qz=qz, xi=jnp.sqrt(jnp.maximum(qz + 2.0 * (f * re + cross) + aq, 0.0)))


def sweep(cfg, data, st, a, f2_coef=-0.25, lam=None, b=0.0):
    """One coordinate-ascent sweep with NCVMP step ``a`` (notes §3.3 steps 1-7) and its lower bound.

    ``lam``: the (g, P) of ``lam_terms`` at ``st``, if already computed. ``b`` > 0 also tries starting steps 4-7
    from the coefficient scales extrapolated along their last change, (C_sigma, C_tau) + b dC, and keeps
    whichever of the two sweeps ends with the higher bound (``b`` used, or 0). Both end with the exact CAVI
    update of every C, so the bound stays exact; the extrapolation only speeds up the slow EM-like drift of
    C_sigma (sigma is weakly identified: C_sigma crept by ~0.07 per sweep for hundreds of sweeps at n = 2000)."""
    w, yt = pseudo(cfg, data, st)                                     # 1
    g, P = lam_terms(cfg, data, st, w, yt, f2_coef) if lam is None else lam
    mu_lam, Sig_lam, a_used = lam_update(st, g, P, a)                 # 2
    EZ, ZWZ = expectations(cfg, data.X, _exp_weights(cfg, data, w), data.S, mu_lam, Sig_lam)  # 3
    st0 = st
    st = st._replace(mu_lam=mu_lam, Sig_lam=Sig_lam, EZ=EZ, ZWZ=ZWZ, a=a_used)
    plain = _coefficients_and_scales(cfg, data, st)
    if isinstance(b, float) and b == 0.0:
        new = plain._replace(b=jnp.asarray(0.0))
    else:
        C = jnp.concatenate([st.C_sig[None], st.C_tau])
        C_ext = C + b * st.dC
        C_ext = jnp.where(C_ext > 0.5 * C, C_ext, C)                  # keep the scales positive
        ext = _coefficients_and_scales(cfg, data, st._replace(C_sig=C_ext[0], C_tau=C_ext[1:]))
        use = ext.bound > plain.bound
        new = jax.tree.map(lambda x, y: jnp.where(use, x, y), ext, plain)._replace(b=jnp.where(use, b, 0.0))
    return new._replace(dC=jnp.concatenate([new.C_sig[None] - st0.C_sig, new.C_tau - st0.C_tau]))


def _coefficients_and_scales(cfg, data, st):
    """Steps 4-7 of the sweep after q(lam) moved (E[Z], E[Z^T W Z] current) and the lower bound, repeated
    ``INNER`` times for the Gaussian and probit models: with q(lam) fixed, E[Z] and E[Z^T W Z] do not change,
    so each repeat costs O(n m s) instead of a sweep's O(n m^2), and it lets q(y*) (probit) and the scales
    catch up with lam (the probit bound crept by ~0.004 per sweep for 300 sweeps with one pass)."""
    if cfg.likelihood == "logit":       # xi needs the O(n m^2) tr(E[z z^T] M) per refresh: one pass
        return _coefficients_and_scales_once(cfg, data, st)
    st1 = _coefficients_and_scales_once(cfg, data, st)
    return jax.lax.fori_loop(1, INNER, lambda _, s: _coefficients_and_scales_once(cfg, data, s)._replace(it=st1.it),
                             st1)


def _coefficients_and_scales_once(cfg, data, st):
    """Steps 4-7 of the sweep after q(lam) moved (E[Z], E[Z^T W Z] current) and the lower bound."""
    m = cfg.m
    w, yt = pseudo(cfg, data, st)                                     # probit: y* for the new E[Z]
    EZ, ZWZ = st.EZ, st.ZWZ
    Es = e_sigma_inv2(cfg, st)
    Eg = e_gamma_inv2(cfg, st) if cfg.likelihood == "gaussian" else 1.0
    ZWZ_w = ZWZ * Eg if cfg.likelihood != "logit" else ZWZ
    wy = w * yt
    if cfg.factorisation == "joint":
        # 4+6 q(alpha, beta) in one Gaussian block: precision [[m E[s^-2] I + E[Z'WZ], E[Z]'WA], [.., P_b + A'WA]]
        AtWA = data.Af.T @ (w[:, None] * data.Af)
        ZWA = EZ.T @ (w[:, None] * data.Af)
        prec = jnp.block([[m * Es * jnp.eye(2 * m) + ZWZ_w, ZWA],
                          [ZWA.T, jnp.diag(prior_prec_beta(cfg, data, st)) + AtWA]])
        Sig = _inv_spd(prec)
        mu = Sig @ jnp.concatenate([EZ.T @ wy, data.Af.T @ wy])
        st = st._replace(mu_a=mu[:2 * m], mu_b=mu[2 * m:], Sig_a=Sig[:2 * m, :2 * m], Sig_b=Sig[2 * m:, 2 * m:],
                         Sig_ab=Sig[:2 * m, 2 * m:])
        if cfg.likelihood == "logit":  # 5 xi after the block
            st = _refresh_xi(cfg, data, st)
    else:
        # 4 q(alpha) (notes §3.2; E2: A mu_beta, not A^T mu_beta)
        Sig_a = _inv_spd(m * Es * jnp.eye(2 * m) + ZWZ_w)
        st = st._replace(mu_a=Sig_a @ (EZ.T @ (w * (yt - data.Af @ st.mu_b))), Sig_a=Sig_a)
        if cfg.likelihood == "logit":  # 5 xi_i^2 = E[eta_i^2]
            st = _refresh_xi(cfg, data, st)
            w, yt = pseudo(cfg, data, st)
        # 6 q(beta)
        AtWA = data.Af.T @ (w[:, None] * data.Af) if cfg.likelihood == "logit" else data.AtA * Eg
        Sig_b = _inv_spd(jnp.diag(prior_prec_beta(cfg, data, st)) + AtWA)
        st = st._replace(mu_b=Sig_b @ (data.Af.T @ (w * (yt - EZ @ st.mu_a))), Sig_b=Sig_b)
    # 7 C_sigma, C_tau, C_gamma
    st = st._replace(C_sig=0.5 * m * (jnp.trace(st.Sig_a) + st.mu_a @ st.mu_a))
    if cfg.T > 0:
        st = st._replace(C_tau=0.5 * data.re_term.T @ (jnp.diagonal(st.Sig_b) + st.mu_b**2))
    if cfg.likelihood == "gaussian":
        f, re, aq, cross = eta_moments(cfg, data, st)
        Mmat = st.Sig_a + jnp.outer(st.mu_a, st.mu_a)
        ssr = jnp.sum(data.mask * (data.y**2 - 2.0 * data.y * (f + re) + 2.0 * (f * re + cross) + aq)) + \
            jnp.sum(ZWZ * Mmat)
        st = st._replace(C_gam=0.5 * ssr)
    return st._replace(bound=lower_bound(cfg, data, st), it=st.it + 1)


def vb_step(cfg, data, st, *, warm_start, step_max, backtrack):
    """One accepted sweep (notes §3.3, with adaptive over-relaxation of the lam mean, see ``lam_update``).

    Try a = min(GROW a_prev, step_max) (a = 1 right after the warm start); while the bound would decrease,
    redo the sweep with a / 4, a / 16, ... and, once that is below 2^-13, a = 0 (q(lam) frozen: a pure CAVI
    sweep, never decreasing). The NCVMP pieces (g, P) are computed once for all tries. ``backtrack=False``:
    plain NCVMP with a = 1 every sweep (the document's algorithm, which can decrease the bound)."""
    if backtrack:
        a_try = jnp.where(st.it < warm_start, 0.0,
                          jnp.where(st.it == warm_start, 1.0, jnp.minimum(GROW * jnp.maximum(st.a, 0.25), step_max)))
    else:
        a_try = jnp.where(st.it < warm_start, 0.0, 1.0)
    b_try = jnp.where(backtrack & (st.it > warm_start), jnp.minimum(GROW * jnp.maximum(st.b, 0.5), B_MAX), 0.0)
    w, yt = pseudo(cfg, data, st)
    lam = lam_terms(cfg, data, st, w, yt)

    def cond(c):
        k, a, s = c
        ok = s.bound >= st.bound - 1e-13 * jnp.abs(st.bound)
        return (k == 0) | (backtrack & (a > 0) & ~ok)

    def body(c):
        k, a_prev, _ = c
        a = jnp.where(k == 0, a_try, jnp.where(a_prev * SHRINK < MIN_STEP, 0.0, a_prev * SHRINK))
        return k + 1, a, sweep(cfg, data, st, a, lam=lam, b=b_try)

    n_tries, _, new = jax.lax.while_loop(cond, body, (jnp.asarray(0), jnp.asarray(a_try, dtype=jnp.float64), st))
    return new, Info(new.bound, new.a, n_tries)


@partial(jax.jit, static_argnames=("cfg", "warm_start", "step_max", "backtrack", "tol", "length"))
def _run_chunk(st, done, data, *, cfg, warm_start, step_max, backtrack, tol, length):
    """``length`` sweeps in one compiled scan; a converged state is carried unchanged."""

    def go(s):
        new, info = vb_step(cfg, data, s, warm_start=warm_start, step_max=step_max, backtrack=backtrack)
        # an over-relaxed lam step can jump across the maximum and land on an almost equal bound, so a small
        # change of L alone does not mean convergence: the lam mean must also have stopped moving
        dmu = new.mu_lam - s.mu_lam
        lam_moved = jnp.sqrt(dmu @ cho_solve(cho_factor(new.Sig_lam, lower=True), dmu))
        conv = (new.it > warm_start + 2) & (jnp.abs(new.bound - s.bound) < tol * jnp.abs(new.bound)) & \
            (lam_moved < LAM_TOL)
        return (new, conv), info

    def stay(s):
        return (s, jnp.asarray(True)), Info(s.bound, jnp.asarray(jnp.nan), jnp.asarray(0))

    def body(carry, _):
        s, dn = carry
        return jax.lax.cond(dn, stay, go, s)

    return jax.lax.scan(body, (st, done), None, length=length)


# --------------------------------------------------------------------------------------------------
# Set-up from the model inputs, initialisation, the run loop
# --------------------------------------------------------------------------------------------------

def design(inputs, hyper):
    """Full design [1 | A | random effects] (n, s), prior precision of the fixed columns, term one-hots."""
    X = np.asarray(inputs["X"])
    n = X.shape[0]
    cols = [np.ones((n, 1))]
    prec = [1.0 / float(hyper["var_fixed"])]
    if inputs.get("A") is not None:
        cols.append(np.asarray(inputs["A"], dtype=np.float64))
        prec += [1.0 / float(hyper["var_beta"])] * inputs["A"].shape[1]
    J = T = 0
    s_fixed = len(prec)
    if inputs.get("group") is not None:
        J, C = int(inputs["n_groups"]), np.asarray(inputs["C"])
        T = C.shape[1]
        R = np.zeros((n, J * T))
        R[np.repeat(np.arange(n), T), (inputs["group"][:, None] * T + np.arange(T)).ravel()] = C.ravel()
        cols.append(R)
        prec += [0.0] * (J * T)
    Af = np.concatenate(cols, axis=1)
    re_term = np.zeros((Af.shape[1], T))
    if T:
        re_term[s_fixed + np.arange(J * T), np.tile(np.arange(T), J)] = 1.0
    return Af, np.asarray(prec), re_term, J, T


def setup(inputs, hyper, likelihood, chunk_size=None, factorisation="joint"):
    """(Config, Data) from the model's keyword arguments (``spec.inputs(data, hyper)``)."""
    X = np.asarray(inputs["X"], dtype=np.float64)
    S = np.asarray(inputs["S"], dtype=np.float64)
    n, d = X.shape
    m = S.shape[0]
    Af, prec, re_term, J, T = design(inputs, hyper)
    chunk = int(chunk_size) if chunk_size else max(1, min(n, 2**18 // (m * m)))
    n_chunks = -(-n // chunk)
    pad = n_chunks * chunk - n
    padr = lambda a: np.concatenate([a, np.zeros((pad, *a.shape[1:]))]) if pad else a
    y = np.asarray(inputs["y"], dtype=np.float64)
    cfg = Config(likelihood, n, m, d, Af.shape[1], J, T, float(hyper["A_sigma"]),
                 float(hyper.get("A_gamma", 25.0)), float(hyper["A_tau"]), chunk, n_chunks, factorisation)
    data = Data(X=jnp.asarray(padr(X)), y=jnp.asarray(padr(y)), mask=jnp.asarray(padr(np.ones(n))),
                Af=jnp.asarray(padr(Af)), S=jnp.asarray(S), prec_fixed=jnp.asarray(prec),
                re_term=jnp.asarray(re_term), mu_lam0=jnp.full(d, float(hyper["mu_lam0"])),
                P_lam0=jnp.eye(d) / float(hyper["var_lam0"]), AtA=jnp.asarray(Af.T @ Af))
    return cfg, data


def init_state(cfg, data, mu_lam_init=0.5):
    """Initial factors (notes §3.3): mu_lam = 0.5 (never 0), Sigma_lam = 0.5 I, C_sigma = (m-1) v, C_gamma =
    (n/2 - 1) v/4 (v = var y; 1 for the binary models), C_tau = (J/2 - 1)/2, mu_alpha = 0, Sigma_alpha =
    Sigma_beta = 0.1 I, xi = 1."""
    m, d, n = cfg.m, cfg.d, cfg.n
    if cfg.likelihood == "gaussian":
        ybar = jnp.sum(data.mask * data.y) / n
        v = jnp.maximum(jnp.sum(data.mask * (data.y - ybar) ** 2) / max(n - 1, 1), 1e-6)
    else:
        v = jnp.asarray(1.0)
    mu_lam = jnp.broadcast_to(jnp.asarray(mu_lam_init, dtype=jnp.float64), (d,))
    Sig_lam = 0.5 * jnp.eye(d)
    Np = data.X.shape[0]
    st = VBState(mu_lam=mu_lam, Sig_lam=Sig_lam, mu_a=jnp.zeros(2 * m), Sig_a=0.1 * jnp.eye(2 * m),
                 mu_b=jnp.zeros(cfg.s), Sig_b=0.1 * jnp.eye(cfg.s), Sig_ab=jnp.zeros((2 * m, cfg.s)),
                 C_sig=jnp.maximum(m - 1.0, 0.5) * v,
                 C_tau=jnp.full(cfg.T, max(0.5 * (cfg.J / 2.0 - 1.0), 0.1)),
                 C_gam=jnp.maximum(n / 2.0 - 1.0, 0.5) * v / 4.0, xi=jnp.ones(Np), EZ=jnp.zeros((Np, 2 * m)),
                 ZWZ=jnp.zeros((2 * m, 2 * m)), qz=jnp.zeros(Np), bound=jnp.asarray(-jnp.inf), a=jnp.asarray(0.0),
                 it=jnp.asarray(0), b=jnp.asarray(0.0), dC=jnp.zeros(1 + cfg.T))
    w0 = data.mask if cfg.likelihood != "logit" else data.mask * 2.0 * omega(st.xi)
    EZ, ZWZ = expectations(cfg, data.X, w0, data.S, mu_lam, Sig_lam)
    return st._replace(EZ=EZ, ZWZ=ZWZ)


def run(cfg, data, *, max_iter=1000, tol=1e-6, warm_start=3, step_max=1e4, backtrack=True, mu_lam_init=0.5,
        progress=None, chunk=50, state=None):
    """Iterate ``vb_step`` until |L_t - L_{t-1}| < tol |L_t| (after the warm start) or ``max_iter`` sweeps.

    Returns (final state, Info trace with leading axis = sweep, converged flag). Runs compiled chunks of
    ``chunk`` sweeps (``chunk`` should divide ``max_iter``) and stops after the first converged chunk."""
    from tqdm.auto import tqdm

    st = init_state(cfg, data, mu_lam_init) if state is None else state
    kw = dict(cfg=cfg, warm_start=int(warm_start), step_max=float(step_max), backtrack=bool(backtrack),
              tol=float(tol), length=int(chunk))
    infos, done, it = [], jnp.asarray(False), 0
    bar = tqdm(total=max_iter, desc="ssgp vb", disable=not progress_enabled(progress), leave=False)
    while it < max_iter and not bool(done):
        (st, done), info = _run_chunk(st, done, data, **kw)
        infos.append(info)
        it += chunk
        bar.update(chunk)
    bar.close()
    info = jax.tree.map(lambda *a: np.concatenate([np.asarray(x) for x in a]), *infos)
    n_done = int(np.sum(info.n_tries > 0))
    info = jax.tree.map(lambda a: a[:min(n_done, max_iter)], info)
    return st, info, bool(done)


# --------------------------------------------------------------------------------------------------
# Draws from q, log q in the model's constrained space
# --------------------------------------------------------------------------------------------------

def draw(cfg, data, st, key, num_samples):
    """``num_samples`` draws of the model's latent sites from q and log q at each (constrained space).

    alpha_raw = sqrt(m) alpha / sigma and b_raw = b / tau (the model is non-centred), so log q gains the
    Jacobians 2m log(sigma / sqrt m) and J sum_t log tau_t."""
    m, S_ = cfg.m, num_samples
    k = jax.random.split(key, 6)
    lam = jax.random.multivariate_normal(k[0], st.mu_lam, st.Sig_lam, (S_,))
    p_s = 2.0 * m - 2.0
    sigma = sample_scale(k[1], p_s, st.C_sig, cfg.A_sigma**2, (S_,))
    mu_t, Sig_t = jnp.concatenate([st.mu_a, st.mu_b]), joint_cov(st)
    theta = jax.random.multivariate_normal(k[2], mu_t, Sig_t, (S_,))
    alpha, beta = theta[:, :2 * m], theta[:, 2 * m:]
    mvn = lambda x, mu, Sig: jax.scipy.stats.multivariate_normal.logpdf(x, mu, Sig)
    log_q = (mvn(lam, st.mu_lam, st.Sig_lam) + scale_log_density(sigma, p_s, st.C_sig, cfg.A_sigma**2)
             + mvn(theta, mu_t, Sig_t) + 2.0 * m * jnp.log(sigma / math.sqrt(m)))
    post = {"lam": lam, "sigma": sigma, "alpha_raw": alpha * math.sqrt(m) / sigma[:, None], "beta0": beta[:, 0]}
    s_fixed = cfg.s - cfg.J * cfg.T
    if s_fixed > 1:
        post["beta"] = beta[:, 1:s_fixed]
    if cfg.T > 0:
        keys = jax.random.split(k[4], cfg.T)
        tau = jnp.stack([sample_scale(keys[t], cfg.J - 2.0, st.C_tau[t], cfg.A_tau**2, (S_,))
                         for t in range(cfg.T)], axis=1)
        b = beta[:, s_fixed:].reshape(S_, cfg.J, cfg.T)
        post["tau"], post["b_raw"] = tau, b / tau[:, None, :]
        log_q += sum(scale_log_density(tau[:, t], cfg.J - 2.0, st.C_tau[t], cfg.A_tau**2) for t in range(cfg.T))
        log_q += cfg.J * jnp.sum(jnp.log(tau), axis=1)
    if cfg.likelihood == "gaussian":
        gamma = sample_scale(k[5], cfg.n - 2.0, st.C_gam, cfg.A_gamma**2, (S_,))
        post["gamma"] = gamma
        log_q += scale_log_density(gamma, cfg.n - 2.0, st.C_gam, cfg.A_gamma**2)
    return post, log_q


def state_dataset(cfg, st):
    """The variational parameters as an xarray Dataset (stored in the tree for ``predict`` and for
    recomputing ``log_q`` and the bound from the tree), with the Jaakkola-Jordan points ``xi`` for logit."""
    ds = {"mu_lam": (["input"], st.mu_lam), "Sig_lam": (["input", "input_"], st.Sig_lam),
          "mu_alpha": (["basis"], st.mu_a), "Sig_alpha": (["basis", "basis_"], st.Sig_a),
          "mu_beta": (["coef"], st.mu_b), "Sig_beta": (["coef", "coef_"], st.Sig_b),
          "Sig_alpha_beta": (["basis", "coef"], st.Sig_ab),
          "C_sigma": ((), st.C_sig), "C_tau": (["re_term"], st.C_tau), "C_gamma": ((), st.C_gam),
          "E_sigma": ((), inv_moment(2.0 * cfg.m - 2.0, st.C_sig, cfg.A_sigma**2, -1.0))}
    if cfg.likelihood == "gaussian":
        ds["E_gamma"] = ((), inv_moment(cfg.n - 2.0, st.C_gam, cfg.A_gamma**2, -1.0))
        ds["E_gamma2"] = ((), inv_moment(cfg.n - 2.0, st.C_gam, cfg.A_gamma**2, -2.0))
    if cfg.T > 0:
        ds["E_tau"] = (["re_term"], jax.vmap(lambda c: inv_moment(cfg.J - 2.0, c, cfg.A_tau**2, -1.0))(st.C_tau))
    if cfg.likelihood == "logit":
        ds["xi"] = (["obs"], st.xi[:cfg.n])  # the Jaakkola-Jordan points of the bound (``lower_bound``)
    return xr.Dataset({k: (dims, np.asarray(v)) for k, (dims, v) in ds.items()})


# --------------------------------------------------------------------------------------------------
# The registered method
# --------------------------------------------------------------------------------------------------

def _check(options):
    if not isinstance(options["warm_start"], int) or isinstance(options["warm_start"], bool) \
            or options["warm_start"] < 0:
        raise ValueError(f"warm_start: expected a non-negative integer, got {options['warm_start']!r}")
    if not np.isfinite(options["step_max"]) or options["step_max"] < 1:
        raise ValueError(f"step_max: expected a number >= 1, got {options['step_max']!r}")
    if not isinstance(options["backtrack"], bool):
        raise ValueError(f"backtrack: expected True or False, got {options['backtrack']!r}")
    mu0 = np.asarray(options["mu_lam_init"], dtype=float)
    if not np.all(np.isfinite(mu0)) or np.all(mu0 == 0):
        raise ValueError(f"mu_lam_init: expected finite non-zero start values (mu_lam = 0 is a stationary point "
                         f"with a flat f, notes E17), got {options['mu_lam_init']!r}")
    if options["factorisation"] not in ("joint", "mean_field"):
        raise ValueError(f"factorisation: expected 'joint' (q(alpha, beta) one block) or 'mean_field' (q(alpha) "
                         f"q(beta), the paper's), got {options['factorisation']!r}")
    c = options["chunk_size"]
    if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
        raise ValueError(f"chunk_size: expected a positive integer or None (automatic), got {c!r}")


def fit_state(spec, data, hyper, options):
    """Run the VB engine on validated ``data``: returns (cfg, data arrays, final state, info, converged)."""
    inputs = spec.inputs(data, hyper)
    cfg, arrays = setup(inputs, hyper, LIKELIHOOD_OF[spec.name], options.get("chunk_size"),
                        options.get("factorisation", "joint"))
    st, info, converged = run(cfg, arrays, max_iter=options["max_iter"], tol=options["tol"],
                              warm_start=options["warm_start"], step_max=options["step_max"],
                              backtrack=options["backtrack"], mu_lam_init=options["mu_lam_init"],
                              progress=options.get("progress"), chunk=_chunk_len(options["max_iter"]))
    return cfg, arrays, st, info, converged


def _chunk_len(max_iter):
    return max(k for k in range(1, 51) if max_iter % k == 0)


@register_method("vb", kind="variational", models=MODELS, check=_check, options={
    "max_iter": 2000, "tol": 1e-7, "num_samples": 1000, "warm_start": 3, "step_max": 1e4, "backtrack": True,
    "mu_lam_init": 0.5, "chunk_size": None, "factorisation": "joint",
})
def run_vb(ctx: FitContext) -> Draws:
    """Closed-form mean-field VB with NCVMP for q(lam) (Tan & Nott 2016; Lim 2016; notes §3)."""
    o = ctx.options
    cfg, arrays, st, info, converged = fit_state(ctx.spec, ctx.data, ctx.hyper, o)
    post, log_q = jax.jit(partial(draw, cfg, arrays), static_argnums=2)(st, ctx.key, o["num_samples"])
    posterior = {k: np.asarray(v)[None] for k, v in post.items()}
    return Draws(
        posterior=posterior, sample_stats={"log_q": np.asarray(log_q)[None]},
        traces={"bound": info.bound, "step_size": info.step, "n_tries": info.n_tries},
        groups={"variational_parameters": state_dataset(cfg, st)},
        attrs={"n_iter": int(len(info.bound)), "converged": int(converged), "bound_final": float(st.bound),
               "n_backtracked_sweeps": int(np.sum(info.n_tries > 1))})


# --------------------------------------------------------------------------------------------------
# Prediction with uncertainty (notes §3.6)
# --------------------------------------------------------------------------------------------------

def _tree_context(tree):
    """(spec, training data, hyperparameters) of a fitted ssgp tree."""
    import json

    import zoo
    from diagnostics.references import data_of
    from zoo._validation import validate_data

    spec = zoo.get(tree.attrs["model"])
    hyper = spec.default_hyper
    hyper.update(json.loads(tree.attrs.get("hyperparameters", "{}")))
    return spec, validate_data(spec, data_of(tree)), hyper


def _new_design(spec, data, hyper, X_new, group=None, A=None):
    """Scaled new inputs and their design rows [1, A, random effects] (zeros for group None or -1)."""
    from zoo import ssgp

    X_new = np.atleast_2d(np.asarray(X_new, dtype=np.float64))
    X = np.asarray(data["X"])
    if X_new.shape[1] != X.shape[1]:
        raise ValueError(f"X_new: expected {X.shape[1]} columns like the training X, got {X_new.shape[1]}")
    if not np.all(np.isfinite(X_new)):
        raise ValueError("X_new: contains NaN/inf values")
    lo, span = ssgp.input_scaling(X)
    Xs = (X_new - lo) / span
    n = Xs.shape[0]
    cols = [np.ones((n, 1))]
    if data.get("A") is not None:
        if A is None:
            raise ValueError(f"A: the model was fitted with a design matrix A ({data['A'].shape[1]} columns); "
                             f"pass A for the new points")
        cols.append(np.asarray(A, dtype=np.float64).reshape(n, -1))
    if data.get("group") is not None:
        J = ssgp.n_groups_of(data, hyper)
        slopes = ssgp.random_slopes(hyper)
        T = 1 + len(slopes)
        R = np.zeros((n, J * T))
        if group is not None:
            g = np.broadcast_to(np.asarray(group, dtype=np.int64), (n,))
            if np.any(g >= J) or np.any(g < -1):
                raise ValueError(f"group: expected indices in 0..{J - 1} (or -1 / None for a new group, i.e. "
                                 f"without random effect), got values in {int(g.min())}..{int(g.max())}")
            C = ssgp.re_covariates(Xs, slopes)
            rows = np.flatnonzero(g >= 0)
            for t in range(T):
                R[rows, g[rows] * T + t] = C[rows, t]
        cols.append(R)
    return Xs, np.concatenate(cols, axis=1)


def predict(tree, X_new, group=None, A=None):
    """Posterior predictive summaries at new inputs (notes §3.6).

    ``group``: the group of each new point (None or -1: population level, no random effect; a known group
    adds its random effect). Returns a dict of arrays: ``f_mean``/``f_var`` (the GP part f = Z alpha),
    ``mean``/``var`` of the linear predictor eta = beta0 + f (+ A beta + random effect), and ``y_var``
    (LMM: var + E[gamma^2]) or ``prob`` (binary models: P(y = 1); probit Phi(m / sqrt(1 + v)), logit
    sigma(m / sqrt(1 + pi v / 8)) for VB, the Monte Carlo average over draws for samplers).

    VB trees (with a ``variational_parameters`` group) use the closed forms E[z*]^T mu_alpha and
    tr(E[z* z*^T] M) - E[f*]^2; other trees (NUTS, SVI) average over their posterior draws."""
    from zoo import ssgp

    spec, data, hyper = _tree_context(tree)
    Xs, Arow = _new_design(spec, data, hyper, X_new, group, A)
    lik = LIKELIHOOD_OF[spec.name]
    S = ssgp.spectral_points(hyper["m"], Xs.shape[1], hyper["spectral_seed"])
    m = S.shape[0]
    if "variational_parameters" in tree.children:
        q = tree["variational_parameters"].to_dataset()
        n = Xs.shape[0]
        cfg = Config(lik, n, m, Xs.shape[1], Arow.shape[1], 0, 0, 1.0, 1.0, 1.0, n, 1)
        mu_l, Sig_l = jnp.asarray(q["mu_lam"].values), jnp.asarray(q["Sig_lam"].values)
        mu_a, Sig_a = q["mu_alpha"].values, q["Sig_alpha"].values
        mu_b, Sig_b, Sig_ab = q["mu_beta"].values, q["Sig_beta"].values, q["Sig_alpha_beta"].values
        EZ, _ = expectations(cfg, jnp.asarray(Xs), jnp.ones(n), jnp.asarray(S), mu_l, Sig_l)
        EZ = np.asarray(EZ)
        Mmat = Sig_a + np.outer(mu_a, mu_a)
        quad = np.asarray(quad_features(cfg, jnp.asarray(Xs), jnp.asarray(S), mu_l, Sig_l, jnp.asarray(Mmat)))
        f_mean = EZ @ mu_a
        f_var = np.maximum(quad - f_mean**2, 0.0)
        mean = f_mean + Arow @ mu_b
        var = f_var + np.sum((Arow @ Sig_b) * Arow, 1) + 2.0 * np.sum(EZ * (Arow @ Sig_ab.T), 1)
        out = {"f_mean": f_mean, "f_var": f_var, "mean": mean, "var": var}
        if lik == "gaussian":
            out["y_var"] = var + float(q["E_gamma2"].values)
        elif lik == "probit":
            from scipy.special import ndtr
            out["prob"] = ndtr(mean / np.sqrt(1.0 + var))
        else:
            out["prob"] = 1.0 / (1.0 + np.exp(-mean / np.sqrt(1.0 + np.pi * var / 8.0)))
        return out
    post = tree["posterior"].to_dataset().stack(sample=("chain", "draw")).transpose("sample", ...)
    lam, alpha_raw, sigma = post["lam"].values, post["alpha_raw"].values, post["sigma"].values
    ang = np.einsum("ik,sk,rk->sir", Xs, lam, S)
    alpha = alpha_raw * (sigma / np.sqrt(m))[:, None]
    f = np.einsum("sir,sr->si", np.cos(ang), alpha[:, :m]) + np.einsum("sir,sr->si", np.sin(ang), alpha[:, m:])
    coefs = [post["beta0"].values[:, None]]
    if "beta" in post:
        coefs.append(post["beta"].values)
    if "tau" in post:
        b = post["b_raw"].values * post["tau"].values[:, None, :]
        coefs.append(b.reshape(b.shape[0], -1))
    eta = f + np.concatenate(coefs, axis=1) @ Arow.T
    out = {"f_mean": f.mean(0), "f_var": f.var(0), "mean": eta.mean(0), "var": eta.var(0)}
    if lik == "gaussian":
        out["y_var"] = out["var"] + np.mean(post["gamma"].values ** 2)
    elif lik == "probit":
        from scipy.special import ndtr
        out["prob"] = ndtr(eta).mean(0)
    else:
        out["prob"] = (1.0 / (1.0 + np.exp(-eta))).mean(0)
    return out
