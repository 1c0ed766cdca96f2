"""One coordinate-ascent sweep of mean-field VI for Bayesian PCA at a node, with a consensus penalty: the step of
``vbem`` (no neighbours, c = 1) and the node update of ``badmm`` (notes N3.1 with errata E12-E15, E21, E26, E28
fixed; the penalties of N3.4-3.5 are described in ``inference.bpca.badmm``). E[.] under q:

1. q(z_n): Lambda_n = I + E[tau] sum_{d in O_n} (m_d m_d^T + diag v_d),  m^z_n = E[tau] Lambda_n^-1 sum_{d in O_n}
   m_d (x_dn - m^mu_d) (paper eqs. 30-33; eq. 32's undefined sum of inverses is diag(sum_d v_d), E15).
2. q(mu_d): precision |O^d| E[tau] + c theta, mean E[tau] sum_{n in O^d} (x_dn - m_d^T m^z_n) / precision.
3. q(w_d): S_d = sum_{n in O^d} E[z z^T], b_d = sum_{n in O^d} (x_dn - m^mu_d) m^z_n;
   m_d = (E[tau] S_d + c diag E[alpha])^-1 E[tau] b_d (exact block update: the row-mean problem is quadratic),
   v_dm = c / (E[tau] (S_d)_mm + c E[alpha_m]).
4. q(alpha_m) = Gamma(a_alpha + D/2, b_alpha + 1/2 sum_d E[w_dm^2]) (N3.6; its mean is shape/rate, not
   shape/(2 rate), E26).
5. q(tau) = Gamma(a_tau + n_obs/(2 c), b_tau + A/(2 c)), A = sum_{(n,d) observed} E[(x_dn - w_d^T z_n - mu_d)^2]
   (n_obs = observed entries, not N D: E28).
6. the closed-form ELBO (``inference.bpca.common``), monotone under these updates when c = 1 (test 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from inference.bpca.common import (
    Config,
    Globals,
    Shard,
    VBState,
    elbo_from,
    expectations,
    expected_sq_residual,
    positive_root,
    second_moments,
    z_step,
)

TAU_RHO = 1.0      # ADMM penalty of the q(tau) averaging (unit curvature)


def _mean_pen(cfg: Config, pen, name: str, v_old):
    """(extra precision, extra linear term) the penalty adds to a mean update."""
    k, eta = pen["k"], pen["eta"]
    if cfg.penalty == "quadratic":
        return 2.0 * eta * k, -2.0 * getattr(pen["G"], name) + eta * getattr(pen["anchor"], name)
    return 2.0 * eta * k / v_old, -getattr(pen["g"], name) + eta * getattr(pen["srho"], name) / v_old


def _var_update(cfg: Config, pen, mname: str, vname: str, P, prior_prec_c, c, m_new):
    """Variance of a scalar factor with data precision P and (c-weighted) prior precision."""
    k, eta = pen["k"], pen["eta"]
    if cfg.penalty == "quadratic":
        a = 2.0 * eta * k
        b = 0.5 * (P + prior_prec_c) + 2.0 * getattr(pen["G"], vname) - eta * getattr(pen["anchor"], vname)
        return positive_root(a, b, 0.5 * c)
    a = P + prior_prec_c + 2.0 * getattr(pen["g"], vname)
    b = 2.0 * eta * k - c
    srho, srho2 = getattr(pen["srho"], mname), getattr(pen["srho2"], mname)
    cc = eta * (getattr(pen["srho"], vname) + srho2 - 2.0 * m_new * srho + 2.0 * k * m_new**2)
    return positive_root(a, b, cc)


def no_penalty(cfg: Config, g: Globals):
    """The penalty of a node without neighbours (centralised VB-EM)."""
    z = jax.tree.map(jnp.zeros_like, g)
    if cfg.penalty == "quadratic":
        return {"k": 0.0, "eta": 0.0, "G": z, "anchor": z}
    return {"k": 0.0, "eta": 0.0, "g": z, "srho": z, "srho2": z}


def sweep(cfg: Config, st: VBState, shard: Shard, c, pen, c_tau=None, tau_pen=None) -> VBState:
    """One coordinate-ascent sweep at a node (module docstring steps 1-6), with a consensus penalty."""
    c_tau = c if c_tau is None else c_tau
    g = st.g
    Etau, _, Ealpha, _ = expectations(cfg, st.tau, st.alpha)
    # 1. q(z)
    mz, Sz, logdet = z_step(g, Etau, shard)
    # 2. q(mu)
    n_d = shard.O.sum(0)
    P_mu = Etau * n_d
    L_mu = Etau * jnp.sum(shard.O * (shard.X - mz @ g.mw.T), axis=0)
    prec, lin = _mean_pen(cfg, pen, "mmu", g.vmu)
    mmu = (L_mu + lin) / (P_mu + c * cfg.theta + prec)
    vmu = _var_update(cfg, pen, "mmu", "vmu", P_mu, c * cfg.theta, c, mmu)
    # 3. q(W), row by row (exact block update of the row means, then the per-entry variances)
    S = second_moments(mz, Sz, shard)
    b = ((shard.X - mmu) * shard.O).T @ mz                                           # (D, M)
    prec, lin = _mean_pen(cfg, pen, "mw", g.vw)
    A_rows = Etau * S + jax.vmap(jnp.diag)(c * Ealpha + prec * jnp.ones_like(g.vw))
    mw = jnp.linalg.solve(A_rows, (Etau * b + lin)[..., None])[..., 0]
    P_w = Etau * jnp.diagonal(S, axis1=1, axis2=2)
    vw = _var_update(cfg, pen, "mw", "vw", P_w, c * Ealpha, c, mw)
    g = Globals(mw, vw, mmu, vmu)
    # 4. q(alpha) from this node's copy of q(W) (c cancels)
    alpha = st.alpha
    if cfg.learn_alpha:
        alpha = jnp.stack([jnp.full(cfg.M, cfg.a_alpha + 0.5 * cfg.D),
                           cfg.b_alpha + 0.5 * jnp.sum(mw**2 + vw, axis=0)])
    # 5. q(tau)
    A = expected_sq_residual(g, mz, S, shard)
    tau = st.tau
    if cfg.learn_tau:
        n_obs = jnp.sum(shard.O)
        target = jnp.stack([cfg.a_tau + 0.5 * n_obs / c_tau, cfg.b_tau + 0.5 * A / c_tau])
        tau = target if tau_pen is None else (target - 2.0 * tau_pen["G"] + TAU_RHO * tau_pen["anchor"]) / (
            1.0 + 2.0 * TAU_RHO * tau_pen["k"])
    new = VBState(g, tau, alpha, mz, Sz, logdet, st.elbo)
    return new._replace(elbo=elbo_from(cfg, new, shard, A, c, c_tau))
