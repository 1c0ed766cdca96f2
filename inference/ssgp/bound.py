"""The weighted Gaussian pseudo-likelihood of the three models, the expectations of the scale factors and the
complete lower bound (notes §3.1, §3.4).

For all three models the expected log-likelihood in (alpha, beta, lam) is
-1/2 sum_i w_i E_q[(yt_i - z_i^T alpha - a_i^T beta)^2] + const with

=========  =====================  ================================================  =========================
model      weight w_i             pseudo-response yt_i                              extra factor
=========  =====================  ================================================  =========================
LMM        E[gamma^-2]            y_i                                               q(gamma) via C_gamma
probit     1                      E[y*_i] = mu_i + s_i phi(mu_i)/Phi(s_i mu_i)       q(y*_i) = TN(mu_i, 1)
logit      2 omega(xi_i)          (y_i - 1/2) / (2 omega(xi_i))                      xi_i^2 = E[eta_i^2]
=========  =====================  ================================================  =========================

(s_i = 2 y_i - 1, mu_i = E[z_i]^T mu_alpha + a_i^T mu_beta, omega(xi) = tanh(xi/2)/(4 xi), Jaakkola-Jordan.)

**The bound** (``lower_bound``) is: LMM, the ELBO on the model's space itself; probit, the ELBO on the
Albert-Chib space (theta, y*) with the optimal q(y*_i) = TN(E_q eta_i, 1) truncated to y_i's side, below the
model-space ELBO; logit, the Jaakkola-Jordan bound, which is exactly the ELBO on the Polya-Gamma space
(theta, omega) with q(omega_i) = PG(1, xi_i) (E_q omega_i = tanh(xi_i/2)/(2 xi_i) = 2 omega(xi_i); Durante &
Rigon 2019), also below the model-space ELBO. tests/test_log_q.py checks all three identities by Monte Carlo.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_factor, cho_solve

from inference.ssgp.hfunction import log_h

LOG_2PI = math.log(2 * math.pi)
LOG_NDTR_SERIES_BELOW = -20.0


def log_ndtr(x):
    """log Phi(x), the standard normal log CDF, with one erfc: t = Phi(-|x|) = erfc(|x|/sqrt 2)/2 (accurate in the
    tail), log t for x < 0 and log1p(-t) for x >= 0; below x = -20, where t would underflow near -37, the
    asymptotic series log Phi(x) = -x^2/2 - log(-x) - log(2 pi)/2 + log(1 - 1/x^2 + 3/x^4 - 15/x^6 + 105/x^8) (relative
    error below 1e-12 there). ``jax.scipy.special.log_ndtr`` is as accurate but evaluates erf, erfc and both tails
    on every element; the probit sweep holds three copies of this function, and each of its operations costs
    compile time (benchmarks/results.md, "compile_cold" session 18). tests/test_ssgp_vb.py checks it against SciPy."""
    t = 0.5 * jax.lax.erfc(jnp.abs(x) * (1.0 / math.sqrt(2.0)))
    direct = jnp.where(x < 0, jnp.log(t), jnp.log1p(-t))
    xs = jnp.minimum(x, LOG_NDTR_SERIES_BELOW)
    r = 1.0 / (xs * xs)
    series = -0.5 * xs * xs - jnp.log(-xs) - 0.5 * LOG_2PI + jnp.log1p(r * (-1.0 + r * (3.0 + r * (-15.0 + 105.0 * r))))
    return jnp.where(x < LOG_NDTR_SERIES_BELOW, series, direct)


def omega(xi):
    """omega(xi) = tanh(xi/2) / (4 xi), continuous at 0 (series 1/8 - xi^2/96 for |xi| < 1e-4)."""
    small = jnp.abs(xi) < 1e-4
    safe = jnp.where(small, 1.0, xi)
    return jnp.where(small, 0.125 - xi**2 / 96.0, jnp.tanh(safe / 2.0) / (4.0 * safe))


class HTerms(NamedTuple):
    """log H(p, C, r) and E[s^-2] = H(p+2, C, r)/H(p, C, r) of q(sigma), q(gamma) (LMM) and q(tau_t) at a state."""
    lh_sigma: jax.Array   # ()
    E_sigma: jax.Array    # ()   E[sigma^-2]
    lh_gamma: jax.Array   # ()   (LMM; else 0)
    E_gamma: jax.Array    # ()   E[gamma^-2] (LMM; else 1)
    lh_tau: jax.Array     # (T,)
    E_tau: jax.Array      # (T,) E[tau_t^-2]


def h_terms(cfg, st, n) -> HTerms:
    """The H functions of every scale factor at ``st`` (q(sigma): p = 2m - 2, q(gamma): p = n - 2, q(tau_t):
    p = J - 2; notes §3.2, §3.5) in one batched ``log_h`` over the 2 (2 + T) values of p and p + 2: a sweep
    computes them once per state, so its program holds one quadrature grid (``n`` observations)."""
    gauss = cfg.likelihood == "gaussian"
    p = [2.0 * cfg.m - 2.0] + ([n - 2.0] if gauss else []) + [jnp.full(cfg.T, cfg.J - 2.0)]
    C = [st.C_sig] + ([st.C_gam] if gauss else []) + [st.C_tau]
    r = [cfg.A_sigma**2] + ([cfg.A_gamma**2] if gauss else []) + [jnp.full(cfg.T, cfg.A_tau**2)]
    p, C, r = (jnp.concatenate([jnp.ravel(jnp.asarray(v, dtype=jnp.float64)) for v in a]) for a in (p, C, r))
    lh = log_h(jnp.concatenate([p, p + 2.0]), jnp.concatenate([C, C]), jnp.concatenate([r, r]))
    k = p.shape[0]
    lh0, E = lh[:k], jnp.exp(lh[k:] - lh[:k])
    g = 1 if gauss else 0
    return HTerms(lh0[0], E[0], lh0[1] if gauss else jnp.asarray(0.0), E[1] if gauss else jnp.asarray(1.0),
                        lh0[1 + g:], E[1 + g:])


def pseudo_terms(cfg, data, st, E_gamma=None):
    """(w, yt, log_phi): the weighted Gaussian pseudo-likelihood of the current factors (notes §3.1) and, for
    probit, log Phi(s_i mu_i) at the same mu (the bound's likelihood term, ``lower_bound``; None otherwise), so a
    sweep evaluates ``log_ndtr`` once per state. LMM: ``E_gamma`` = E[gamma^-2] at ``st`` (``h_terms``), computed
    here if not given."""
    if cfg.likelihood == "gaussian":
        if E_gamma is None:
            E_gamma = h_terms(cfg, st, data.n_obs).E_gamma
        return data.mask * E_gamma, data.y, None
    if cfg.likelihood == "probit":
        mu = st.EZ @ st.mu_a + data.Af @ st.mu_b
        sgn = 2.0 * data.y - 1.0
        log_phi = log_ndtr(sgn * mu)
        # inverse Mills ratio in log space (E9): s phi(mu) / Phi(s mu)
        mills = sgn * jnp.exp(-0.5 * mu**2 - 0.5 * LOG_2PI - log_phi)
        return data.mask, mu + mills, log_phi
    om = omega(st.xi)
    return data.mask * 2.0 * om, (data.y - 0.5) / (2.0 * om), None


def pseudo(cfg, data, st, E_gamma=None):
    """(w, yt) of ``pseudo_terms``."""
    return pseudo_terms(cfg, data, st, E_gamma)[:2]


def prior_prec_beta(cfg, data, E_tau):
    """Diagonal prior precision of beta: 1/var_fixed, 1/var_beta, E[tau_t^-2] (``E_tau``; notes §2.6)."""
    if cfg.T == 0:
        return data.prec_fixed
    return data.prec_fixed + data.re_term @ E_tau


def _logdet_spd(P):
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(jnp.linalg.cholesky(P))))


def inv_and_logdet_spd(P):
    """(P^-1, log det P) from one Cholesky factor."""
    c = cho_factor(P, lower=True)
    return cho_solve(c, jnp.eye(P.shape[0])), 2.0 * jnp.sum(jnp.log(jnp.diagonal(c[0])))


def eta_moments(cfg, data, st):
    """Per observation: E[f_i] = E[z_i]^T mu_a, (A mu_b)_i, a_i^T (Sigma_b + mu_b mu_b^T) a_i and the
    cross term E[z_i]^T Cov(alpha, beta) a_i; E[eta_i^2] = tr(E[z_i z_i^T] M) + 2 f re + 2 cross + aq."""
    f = st.EZ @ st.mu_a
    re = data.Af @ st.mu_b
    aq = jnp.sum((data.Af @ st.Sig_b) * data.Af, axis=1) + re**2
    cross = jnp.sum(st.EZ * (data.Af @ st.Sig_ab.T), axis=1)
    return f, re, aq, cross


def joint_cov(st, xp=jnp):
    """Cov of theta = (alpha, beta) under q: [[Sigma_a, Sigma_ab], [Sigma_ab^T, Sigma_b]] (``xp``: the array
    library, NumPy for the host draws of ``vb.draw``)."""
    return xp.block([[st.Sig_a, st.Sig_ab], [st.Sig_ab.T, st.Sig_b]])


def lower_bound(cfg, data, st, mom=None, log_phi=None, logdet_cov=None):
    """The complete lower bound (notes §3.4) at ``st``: exact for any state of the family, with the
    E[.^-2](C - C_now) corrections when a C is not current (E14). Probit: at the optimal q(y*);
    logit: the Jaakkola-Jordan bound at ``st.xi``.

    A sweep passes what it already holds at ``st`` (``sweep._coefficients_and_scales``): ``mom`` (``h_terms``),
    ``log_phi`` (probit's log Phi(s_i mu_i), ``pseudo_terms``) and ``logdet_cov`` (log det Cov_q(alpha, beta), from
    the Cholesky factor of its precision), so its compiled program holds one copy of each; computed here if None."""
    m, d = cfg.m, cfg.d
    trM = jnp.trace(st.Sig_a) + st.mu_a @ st.mu_a
    mom = h_terms(cfg, st, data.n_obs) if mom is None else mom
    L = m * math.log(m) - m * LOG_2PI + math.log(2 * cfg.A_sigma / math.pi) + \
        mom.lh_sigma + mom.E_sigma * (st.C_sig - 0.5 * m * trM)
    dl = st.mu_lam - data.mu_lam0
    L += 0.5 * (jnp.linalg.slogdet(data.P_lam0 @ st.Sig_lam)[1] + d - jnp.trace(data.P_lam0 @ st.Sig_lam)
                - dl @ data.P_lam0 @ dl)
    # beta part: random terms through q(tau_t), fixed ones with their Gaussian prior, entropy of q(beta)
    eb2 = jnp.diagonal(st.Sig_b) + st.mu_b**2
    fixed = data.prec_fixed > 0
    pf = jnp.where(fixed, data.prec_fixed, 1.0)
    L += jnp.sum(jnp.where(fixed, -0.5 * LOG_2PI + 0.5 * jnp.log(pf) - 0.5 * pf * eb2, 0.0))
    if cfg.T > 0:
        ssq = data.re_term.T @ eb2
        L += jnp.sum(-0.5 * cfg.J * LOG_2PI + math.log(2 * cfg.A_tau / math.pi) + mom.lh_tau
                     + mom.E_tau * (st.C_tau - 0.5 * ssq))
    # entropy of q(alpha, beta) (= the notes' 1/2 log|Sigma_a| + m(1 + log 2 pi) + beta entropy when the
    # factorisation is mean-field)
    logdet_cov = _logdet_spd(joint_cov(st)) if logdet_cov is None else logdet_cov
    L += 0.5 * (2 * m + cfg.s) * (1.0 + LOG_2PI) + 0.5 * logdet_cov
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
        log_phi = log_ndtr((2.0 * data.y - 1.0) * mu) if log_phi is None else log_phi
        return L + jnp.sum(mask * log_phi) - 0.5 * (sum_eta2 - jnp.sum(mask * mu**2))
    ssr = jnp.sum(mask * (data.y**2 - 2.0 * data.y * mu)) + sum_eta2
    n = data.n_obs
    return L - 0.5 * n * LOG_2PI + math.log(2 * cfg.A_gamma / math.pi) + \
        mom.lh_gamma + mom.E_gamma * (st.C_gam - 0.5 * ssr)
