"""One coordinate-ascent sweep of the ssgp VB (notes §3.3): q(lam) by NCVMP, then the closed-form
q(alpha, beta), (logit) xi, and the scales, with the complete lower bound at the end.

**Closed-form updates (notes §3.2).**
q(alpha): Sigma_a = (m E[sigma^-2] I + E[Z^T W Z])^-1, mu_a = Sigma_a E[Z]^T W (yt - A mu_beta)   (E2 fixed:
A, not A^T); q(beta): Sigma_b = (P_beta0 + A^T W A)^-1, mu_b = Sigma_b A^T W (yt - E[Z] mu_a), with
P_beta0 = diag(1/var_fixed, 1/var_beta, E[tau_t^-2]); q(sigma) prop. sigma^-2m exp(-C_s/sigma^2)/(A_s^2+sigma^2),
C_s = m/2 (tr Sigma_a + |mu_a|^2); q(tau_t) likewise with J and C_t = 1/2 sum_j E[b_jt^2]; q(gamma) with n and
C_g = 1/2 E||y - Z alpha - A beta||^2 (never defined in the document, E4/E7). Their normalisers and moments
C_g = 1/2 E||y - Z alpha - A beta||^2 (never defined in the document, E4/E7); their moments come from
``inference.ssgp.hfunction``.

**q(lam) by NCVMP (notes §3.2, §3.3).** With r_i = w_i (yt_i - a_i^T mu_beta) and M = Sigma_a + mu_a mu_a^T,
S(mu, Sigma) = mu_a^T E[Z]^T r - 1/2 tr(E[Z^T W Z] M) - 1/2 (mu - mu0)^T P0 (mu - mu0) - 1/2 tr(P0 Sigma);
g = dS/dmu and dS/dSigma = -1/2 (P0 + F1 + F2) with

    F1 = sum_i sum_j r_i nu_ij [mu_a,j cos th_ij + mu_a,m+j sin th_ij] t_ij t_ij^T
    F2 = -1/4 sum_i w_i sum_jr { nu-[(Mcc+Mss) cos th- + 2 Mcs sin th-] t- t-^T
                                + nu+[(Mcc-Mss) cos th+ + 2 Mcs sin th+] t+ t+^T }

(**E1**: the document's F2 carries -1/2; -1/4 is right, checked against ``jax.hessian`` in the tests).
Step a: P_s = (1 - s) Sigma^-1 + s (P0 + F1 + F2) with s = min(a, 1), shrinking s <- 2s/3 until P_s is
positive definite, Sigma <- P_s^-1, mu <- mu + a Sigma g (**E16**: natural-parameter damping, PD guard).

**Sweep order (notes §3.3):** pseudo-data; q(lam); recompute E[Z], E[Z^T W Z]; pseudo-data; q(alpha);
(logit) xi; q(beta); C_sigma, C_tau, C_gamma; then the complete lower bound (notes §3.4).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_solve

from inference.ssgp.bound import (
    eta_moments,
    h_terms,
    inv_and_logdet_spd,
    lower_bound,
    prior_prec_beta,
    pseudo,
    pseudo_terms,
)
from inference.ssgp.features import expectations, ncvmp_terms, quad_features

INNER = 10  # CAVI passes over (alpha, beta, scales[, y*]) per lam step (``_coefficients_and_scales``)


def _exp_weights(cfg, data, w):
    """Weights of the cached E[Z^T W Z]: unweighted (mask) for LMM/probit, w for logit."""
    return w if cfg.likelihood == "logit" else data.mask


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

    Precision: P_s = (1 - s) P_lam + s P with s = min(a, 1) (P_lam = Sigma^-1, kept in the state), shrunk
    s <- 2s/3 until positive definite; Sigma <- P_s^-1 from the Cholesky factor that tested it. Mean:
    mu <- mu + a Sigma g. For a <= 1 this is the notes' natural-parameter damping. A step a > 1 over-relaxes the
    mean only: the NCVMP curvature P holds alpha fixed, while alpha follows lam within the same sweep, so the
    curvature along the path the sweep actually takes is much smaller and the plain step (a = 1) crawls (1469
    sweeps at n = 2000, m = 50). Returns (mu, Sigma, P_s, step used for the mean)."""
    s0 = jnp.minimum(a, 1.0)

    def blend(carry):  # the first round tries s0, each later one 2/3 of the last s (0 below 1e-8)
        k, s_, _, _ = carry
        s_ = jnp.where(k == 0, s_, jnp.where(s_ < 1e-8, 0.0, s_ * 2.0 / 3.0))
        Ps = (1.0 - s_) * st.P_lam + s_ * P
        Ps = 0.5 * (Ps + Ps.T)
        return k + 1, s_, Ps, jnp.linalg.cholesky(Ps)

    def again(carry):
        k, s_, _, L = carry
        return (k == 0) | ((s_ > 0) & ~jnp.all(jnp.isfinite(L)))

    _, s_used, Ps, L = jax.lax.while_loop(again, blend, (0, s0, P, P))
    moved = s_used > 0
    Sig_new = jnp.where(moved, cho_solve((L, True), jnp.eye(P.shape[0])), st.Sig_lam)
    a_used = jnp.where(s_used < s0, s_used, a)  # the PD guard bit: fall back to the damped step
    return st.mu_lam + a_used * Sig_new @ g, Sig_new, jnp.where(moved, Ps, st.P_lam), a_used


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

    ``lam``: the (g, P) of ``lam_terms`` at ``st``, if already computed; the pseudo-data (w, yt) at ``st`` are
    ``st.w, st.yt``, which the sweep or ``init`` that made ``st`` left there. ``b`` > 0 also tries
    starting steps 4-7 from the coefficient scales extrapolated along their last change, (C_sigma, C_tau) + b dC,
    and keeps whichever of the two sweeps ends with the higher bound (``b`` used, or 0). Both end with the exact CAVI
    update of every C, so the bound stays exact; the extrapolation only speeds up the slow EM-like drift of
    C_sigma (sigma is weakly identified: C_sigma crept by ~0.07 per sweep for hundreds of sweeps at n = 2000)."""
    w, yt = st.w, st.yt                                              # 1
    g, P = lam_terms(cfg, data, st, w, yt, f2_coef) if lam is None else lam
    mu_lam, Sig_lam, P_lam, a_used = lam_update(st, g, P, a)          # 2
    EZ, ZWZ = expectations(cfg, data.X, _exp_weights(cfg, data, w), data.S, mu_lam, Sig_lam)  # 3
    st0 = st
    st = st._replace(mu_lam=mu_lam, Sig_lam=Sig_lam, P_lam=P_lam, EZ=EZ, ZWZ=ZWZ, a=a_used)
    if isinstance(b, float) and b == 0.0:
        new = _coefficients_and_scales(cfg, data, st)._replace(b=jnp.asarray(0.0))
    else:
        # both starts of steps 4-7, one after the other in a loop of two rounds (one copy of them in the compiled
        # program, traced once; batched by ``vmap``, their tracing took a third longer and the program compiled no
        # faster; as a ``lax.map`` their outputs were stacked, each field costing a zero buffer, an update and a slice)
        C = jnp.concatenate([st.C_sig[None], st.C_tau])
        C_ext = C + b * st.dC
        C_ext = jnp.where(C_ext > 0.5 * C, C_ext, C)                  # keep the scales positive
        fields = _changed_fields(cfg)

        def start(k, carry):
            # start k (0: C, 1: C_ext); the carry holds the fields steps 4-7 change of the better start so far
            # (start 1 only where its bound is strictly higher) and which start that was
            best, kept = carry
            c = jnp.where(k == 0, C, C_ext)
            out = _coefficients_and_scales(cfg, data, st._replace(C_sig=c[0], C_tau=c[1:]))
            better = (k == 0) | (out.bound > best["bound"])
            return {f: jnp.where(better, getattr(out, f), best[f]) for f in fields}, jnp.where(better, k, kept)

        best, kept = jax.lax.fori_loop(0, 2, start, ({f: getattr(st, f) for f in fields}, 0))
        new = st._replace(**best, it=st.it + 1, b=jnp.where(kept == 1, b, 0.0))
    return new._replace(dC=jnp.concatenate([new.C_sig[None] - st0.C_sig, new.C_tau - st0.C_tau]))


def _changed_fields(cfg):
    """The state fields ``_coefficients_and_scales`` changes (besides ``it``)."""
    return (("mu_a", "Sig_a", "mu_b", "Sig_b", "Sig_ab", "C_sig", "C_tau", "w", "yt", "logdet_cov", "bound")
            + (("C_gam",) if cfg.likelihood == "gaussian" else ())
            + (("xi", "qz") if cfg.likelihood == "logit" else ()))


def _coefficients_and_scales(cfg, data, st):
    """Steps 4-7 of the sweep after q(lam) moved (E[Z], E[Z^T W Z] current), repeated ``INNER`` times for the
    Gaussian and probit models, then the lower bound: with q(lam) fixed, E[Z] and E[Z^T W Z] do not change, so
    each repeat costs O(n m s) instead of a sweep's O(n m^2), and it lets q(y*) (probit) and the scales catch up
    with lam (the probit bound crept by ~0.004 per sweep for 300 sweeps with one pass).

    One loop of passes + 1 rounds: each round evaluates the scale factors' moments (``h_terms``) and the
    pseudo-data (``pseudo_terms``) at its state, then either runs a pass or, in the last round, takes the lower
    bound with those same values and keeps the pseudo-data in the state for the next sweep's q(lam) step. So the
    compiled sweep holds one quadrature grid and (probit) one ``log_ndtr``, not one per use."""
    # logit: xi needs the O(n m^2) tr(E[z z^T] M) per refresh: one pass
    passes = 1 if cfg.likelihood == "logit" else INNER

    def round_(k, s):
        mom = h_terms(cfg, s, data.n_obs)
        w, yt, log_phi = pseudo_terms(cfg, data, s, mom.E_gamma)    # probit: y* for the new E[Z]

        def finish():
            bound = lower_bound(cfg, data, s, mom=mom, log_phi=log_phi, logdet_cov=s.logdet_cov)
            return s._replace(bound=bound, it=s.it + 1, w=w, yt=yt)

        return jax.lax.cond(k < passes, lambda: _coefficients_and_scales_once(cfg, data, s, mom, w, yt), finish)

    return jax.lax.fori_loop(0, passes + 1, round_, st)


def _coefficients_and_scales_once(cfg, data, st, mom, w, yt):
    """Steps 4-7 of the sweep after q(lam) moved (E[Z], E[Z^T W Z] current), one pass from the scale factors'
    moments ``mom`` and the pseudo-data (w, yt) at ``st``; keeps log det Cov_q(alpha, beta) for the bound."""
    m = cfg.m
    EZ, ZWZ = st.EZ, st.ZWZ
    Es = mom.E_sigma
    Eg = mom.E_gamma if cfg.likelihood == "gaussian" else 1.0
    ZWZ_w = ZWZ * Eg if cfg.likelihood != "logit" else ZWZ
    wy = w * yt
    if cfg.factorisation == "joint":
        # 4+6 q(alpha, beta) in one Gaussian block: precision [[m E[s^-2] I + E[Z'WZ], E[Z]'WA], [.., P_b + A'WA]]
        AtWA = data.Af.T @ (w[:, None] * data.Af)
        ZWA = EZ.T @ (w[:, None] * data.Af)
        prec = jnp.block([[m * Es * jnp.eye(2 * m) + ZWZ_w, ZWA],
                          [ZWA.T, jnp.diag(prior_prec_beta(cfg, data, mom.E_tau)) + AtWA]])
        Sig, logdet_prec = inv_and_logdet_spd(prec)
        mu = Sig @ jnp.concatenate([EZ.T @ wy, data.Af.T @ wy])
        st = st._replace(mu_a=mu[:2 * m], mu_b=mu[2 * m:], Sig_a=Sig[:2 * m, :2 * m], Sig_b=Sig[2 * m:, 2 * m:],
                         Sig_ab=Sig[:2 * m, 2 * m:], logdet_cov=-logdet_prec)
        if cfg.likelihood == "logit":  # 5 xi after the block
            st = _refresh_xi(cfg, data, st)
    else:
        # 4 q(alpha) (notes §3.2; E2: A mu_beta, not A^T mu_beta)
        Sig_a, logdet_prec_a = inv_and_logdet_spd(m * Es * jnp.eye(2 * m) + ZWZ_w)
        st = st._replace(mu_a=Sig_a @ (EZ.T @ (w * (yt - data.Af @ st.mu_b))), Sig_a=Sig_a)
        if cfg.likelihood == "logit":  # 5 xi_i^2 = E[eta_i^2]
            st = _refresh_xi(cfg, data, st)
            w, yt = pseudo(cfg, data, st, mom.E_gamma)
        # 6 q(beta)
        AtWA = data.Af.T @ (w[:, None] * data.Af) if cfg.likelihood == "logit" else data.AtA * Eg
        Sig_b, logdet_prec_b = inv_and_logdet_spd(jnp.diag(prior_prec_beta(cfg, data, mom.E_tau)) + AtWA)
        st = st._replace(mu_b=Sig_b @ (data.Af.T @ (w * (yt - EZ @ st.mu_a))), Sig_b=Sig_b,
                         logdet_cov=-logdet_prec_a - logdet_prec_b)  # Sigma_ab = 0: block-diagonal
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
    return st
