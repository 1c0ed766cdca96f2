"""Moments of the sparse-spectrum features under q(lam) = N(mu, Sigma), per chunk of observations (notes §2.1,
§3.7), and the data part of the NCVMP gradient and curvature of q(lam) (notes §3.2).

nu(t) = exp(-t^T Sigma t / 2), theta_ij = t_ij^T mu, t_ij = s_j * x_i; E[cos t^T lam] = nu cos(t^T mu),
E[sin] = nu sin. E[Z^T W Z] = [[CC, CS], [CS^T, SS]] with CC_jr = 1/2 sum_i w_i (nu-_ijr cos th-_ijr + nu+_ijr
cos th+_ijr), SS_jr = 1/2 sum_i w_i (nu- cos th- - nu+ cos th+), CS_jr = 1/2 sum_i w_i (nu- sin th- + nu+ sin
th+), where t-_ijr = t_ir - t_ij, t+ = t_ir + t_ij. Per observation the m x m matrix G_i = T_i Sigma T_i^T gives
t+-^T Sigma t+- = G_rr + G_jj +- 2 G_jr (reduced cost, notes §3.7): O(n (m^2 d + m d^2)) per sweep, accumulated
over chunks of observations. Only the m^2 Gaussian factors nu+- need exp per pair: the pairwise cosines and
sines come from the m per-observation ones by the addition formulas.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
