"""SSGP VB algebra (notes 002 §6 A): closed-form feature moments, NCVMP derivatives, the H function and its
moments, special-case limits. Every closed form is checked against an independent oracle (Monte Carlo,
autodiff of the closed-form objective, mpmath)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference.ssgp import bound, features, hfunction, problem

# The library's functions under test, each evaluated as ONE compiled program (as inside a fit) rather than
# one program per operation; ``cfg`` is a static NamedTuple.
_expectations = jax.jit(features.expectations, static_argnums=0)
_quad_features = jax.jit(features.quad_features, static_argnums=0)
_ncvmp_terms = jax.jit(features.ncvmp_terms, static_argnums=0, static_argnames="f2_coef")
_log_h = jax.jit(hfunction.log_h)
_inv_moment = jax.jit(hfunction.inv_moment)
_scale_log_density = jax.jit(hfunction.scale_log_density)
_sample_scale = jax.jit(hfunction.sample_scale, static_argnums=4)
_omega = jax.jit(bound.omega)


def _cfg(n, m, d, chunk=None):
    chunk = chunk or n
    return problem.Config("gaussian", n, m, d, 1, 0, 0, 25.0, 25.0, 25.0, chunk, -(-n // chunk))


@pytest.fixture(scope="module")
def small():
    """n = 7, m = 4, d = 3 with a random full Sigma_lam (notes A1)."""
    rng = np.random.default_rng(11)
    n, m, d = 7, 4, 3
    X = rng.uniform(size=(n, d))
    S = rng.standard_normal((m, d))
    mu = rng.normal(0.0, 1.0, size=d)
    L = rng.normal(0.0, 0.5, size=(d, d))
    Sig = L @ L.T + 0.1 * np.eye(d)
    w = rng.uniform(0.5, 2.0, size=n)
    B = rng.standard_normal((2 * m, 2 * m))
    Mmat = B @ B.T / (2 * m) + np.outer(*(rng.standard_normal((2, 2 * m))))
    Mmat = 0.5 * (Mmat + Mmat.T)
    return {"n": n, "m": m, "d": d, "X": X, "S": S, "mu": mu, "Sig": Sig, "w": w, "M": Mmat, "rng": rng}


def _mc_features(p, n_draws, seed):
    lam = np.random.default_rng(seed).multivariate_normal(p["mu"], p["Sig"], size=n_draws)    # (D, d)
    ang = np.einsum("ik,rk,sk->sir", p["X"], p["S"], lam)                                        # (D, n, m)
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=-1)                                  # (D, n, 2m)


def test_feature_moments_match_monte_carlo_within_4_standard_errors(small):
    """E[Z], E[Z^T W Z] and tr(E[z_i z_i^T] M) under a Gaussian q(lam) vs 2e5 draws of lam (notes A1).
    Unit: Monte Carlo standard errors of each entry (4 SE: a false alarm has probability ~6e-5 per entry)."""
    p = small
    cfg = _cfg(p["n"], p["m"], p["d"])
    EZ, ZWZ = _expectations(cfg, jnp.asarray(p["X"]), jnp.asarray(p["w"]), jnp.asarray(p["S"]),
                             jnp.asarray(p["mu"]), jnp.asarray(p["Sig"]))
    quad = _quad_features(cfg, jnp.asarray(p["X"]), jnp.asarray(p["S"]), jnp.asarray(p["mu"]),
                           jnp.asarray(p["Sig"]), jnp.asarray(p["M"]))
    Z = _mc_features(p, 200_000, 5)
    D = Z.shape[0]
    zwz = np.einsum("sia,i,sib->sab", Z, p["w"], Z)
    qz = np.einsum("sia,ab,sib->si", Z, p["M"], Z)
    for name, closed, draws in (("E[Z]", EZ, Z), ("E[Z'WZ]", ZWZ, zwz), ("tr(E[zz']M)", quad, qz)):
        mc, se = draws.mean(0), draws.std(0) / math.sqrt(D)
        z = np.abs(np.asarray(closed) - mc) / np.maximum(se, 1e-12)
        assert z.max() < 4.0, f"{name}: worst entry {z.max():.2f} MC standard errors away"


def _naive_zwz(p):
    """E[Z^T W Z] with the t+- vectors materialised (Tan & Nott's O(n m^2 d) memory form)."""
    T = p["X"][:, None, :] * p["S"][None]                                # (n, m, d)
    tm = T[:, None, :, :] - T[:, :, None, :]                             # [i, j, r] = t_ir - t_ij
    tp = T[:, None, :, :] + T[:, :, None, :]
    th = lambda t: t @ p["mu"]
    nu = lambda t: np.exp(-0.5 * np.einsum("...k,kl,...l->...", t, p["Sig"], t))
    cm, cp = nu(tm) * np.cos(th(tm)), nu(tp) * np.cos(th(tp))
    w = p["w"][:, None, None]
    CC = 0.5 * np.sum(w * (cm + cp), 0)
    SS = 0.5 * np.sum(w * (cm - cp), 0)
    CS = 0.5 * np.sum(w * (nu(tm) * np.sin(th(tm)) + nu(tp) * np.sin(th(tp))), 0)
    return np.block([[CC, CS], [CS.T, SS]])


def test_reduced_cost_moments_equal_the_naive_t_plus_minus_form(small):
    """The G_i = T_i Sigma T_i^T implementation (notes §3.7) equals the materialised t+- form to 1e-12,
    also when the observations are split into chunks with padding."""
    p = small
    naive = _naive_zwz(p)
    for chunk in (7, 3):
        cfg = _cfg(p["n"], p["m"], p["d"], chunk)
        pad = cfg.n_chunks * chunk - p["n"]
        X = np.concatenate([p["X"], np.zeros((pad, p["d"]))])
        w = np.concatenate([p["w"], np.zeros(pad)])
        _, ZWZ = _expectations(cfg, jnp.asarray(X), jnp.asarray(w), jnp.asarray(p["S"]), jnp.asarray(p["mu"]),
                                jnp.asarray(p["Sig"]))
        assert np.max(np.abs(np.asarray(ZWZ) - naive)) < 1e-12


def _closed_form_S(p, coef):
    """S(mu, Sigma) = sum_i E[z_i]^T c_i - 1/2 tr(E[Z^T W Z] M) - 1/2 (mu-mu0)^T P0 (mu-mu0) - 1/2 tr(P0 Sigma)."""
    cfg = _cfg(p["n"], p["m"], p["d"])
    P0 = np.eye(p["d"]) / 10.0

    def S(mu, Sig):
        EZ, ZWZ = _expectations(cfg, jnp.asarray(p["X"]), jnp.asarray(p["w"]), jnp.asarray(p["S"]), mu, Sig)
        return jnp.sum(EZ * coef) - 0.5 * jnp.sum(ZWZ * p["M"]) - 0.5 * mu @ P0 @ mu - 0.5 * jnp.trace(P0 @ Sig)

    return S, P0, cfg


@pytest.mark.parametrize("joint", [False, True], ids=["mean_field_coef", "joint_coef"])
def test_ncvmp_gradient_and_F1_F2_equal_autodiff_of_the_closed_form_objective(small, joint):
    """Hand-written g and F1 + F2 (notes §3.2, with F2's coefficient -1/4) vs jax.grad of the closed-form S:
    g = dS/dmu, P0 + F1 + F2 = -2 dS/dSigma. The implementation writes t-'Sigma t- as G_jj + G_rr - 2 G_jr
    (Sigma symmetric), so autodiff sees an asymmetric matrix derivative: compare with its symmetric part
    -(dS/dSigma + dS/dSigma^T). Relative error < 1e-8 (float64)."""
    p = small
    rng = np.random.default_rng(3)
    mu_a = rng.standard_normal(2 * p["m"])
    r = rng.standard_normal(p["n"])
    coef = r[:, None] * mu_a + (rng.standard_normal((p["n"], 2 * p["m"])) if joint else 0.0)
    S, P0, cfg = _closed_form_S(p, jnp.asarray(coef))
    mu, Sig = jnp.asarray(p["mu"]), jnp.asarray(p["Sig"])
    g_ad, dSig = (np.asarray(a) for a in jax.jit(jax.grad(S, argnums=(0, 1)))(mu, Sig))
    g_data, F = _ncvmp_terms(cfg, jnp.asarray(p["X"]), jnp.asarray(p["w"]), jnp.asarray(coef),
                                     jnp.asarray(p["S"]), mu, Sig, jnp.asarray(p["M"]))
    g = np.asarray(g_data) - P0 @ p["mu"]
    rel = lambda a, b: float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
    assert rel(g, g_ad) < 1e-8
    assert rel(P0 + np.asarray(F), -(dSig + dSig.T)) < 1e-8


def test_the_documents_F2_coefficient_minus_one_half_is_wrong(small):
    """Regression test for erratum E1: with the document's -1/2 the precision disagrees with autodiff."""
    p = small
    mu_a = np.random.default_rng(4).standard_normal(2 * p["m"])
    coef = jnp.asarray(np.ones((p["n"], 1)) * mu_a)
    S, P0, cfg = _closed_form_S(p, coef)
    mu, Sig = jnp.asarray(p["mu"]), jnp.asarray(p["Sig"])
    dSig = np.asarray(jax.jit(jax.grad(S, argnums=1))(mu, Sig))
    _, F_doc = _ncvmp_terms(cfg, jnp.asarray(p["X"]), jnp.asarray(p["w"]), coef, jnp.asarray(p["S"]), mu, Sig,
                                    jnp.asarray(p["M"]), f2_coef=-0.5)
    rel = float(np.max(np.abs(P0 + np.asarray(F_doc) + dSig + dSig.T)) / np.max(np.abs(dSig)))
    assert rel > 1e-2  # the -1/2 variant is off by a large relative amount


# log H(p, C, r) = log(1/2) - nu log r + log Gamma(nu) + log U(nu, nu, C/r), nu = (p+3)/2 (Tricomi U), computed
# with mpmath (50 digits) when this test was written and checked against mpmath.quad to 1e-47:
#   mp.log(mp.mpf(1)/2) - nu*mp.log(r) + mp.loggamma(nu) + mp.log(mp.hyperu(nu, nu, C/r))
H_REFERENCE = [
    ((18, 3, 625), -5.8789466558857930155), ((0, 0.5, 1), -0.84039113986324116262),
    ((-2, 2, 625), -2.829979475600973047), ((198, 9, 625), 131.08049236637377603),
    ((998, 40, 625), 752.28298227580884183), ((8, 1e-3, 625), 26.407736038823042992),
    ((19998, 900, 625), 14067.434885054666478), ((4, 50, 0.01), -13.184953712577250316),
]


@pytest.mark.parametrize("args,expected", H_REFERENCE, ids=[str(a) for a, _ in H_REFERENCE])
def test_log_h_matches_the_tricomi_closed_form(args, expected):
    """notes A3: relative error below 1e-10 (the grid reaches ~1e-14) at the notes' eight triples,
    including large p where plain adaptive quadrature is silently wrong (p = 998: 733.7 vs 752.3)."""
    got = float(_log_h(*map(float, args)))
    assert abs(got - expected) / abs(expected) < 1e-10


def test_log_h_reference_values_agree_with_mpmath_when_available():
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 30
    for (p, C, r), expected in H_REFERENCE:
        nu = mp.mpf(p + 3) / 2
        val = mp.log(mp.mpf(1) / 2) - nu * mp.log(r) + mp.loggamma(nu) + mp.log(mp.hyperu(nu, nu, mp.mpf(C) / r))
        assert abs(float(val) - expected) <= 1e-12 * abs(expected)


def test_log_h_derivative_identity_monotonicity_and_extreme_p():
    """-d log H/dC = H(p+2)/H(p) by central differences (1e-6 relative); log H decreases in C; finite at
    p = -2 and p = 19998 (notes A3)."""
    for p, C, r in ((18.0, 3.0, 625.0), (0.0, 0.5, 1.0), (198.0, 9.0, 625.0)):
        h = 1e-5 * C
        fd = -(float(_log_h(p, C + h, r)) - float(_log_h(p, C - h, r))) / (2 * h)
        assert abs(fd - float(_inv_moment(p, C, r, 2.0))) / fd < 1e-6
    Cs = np.geomspace(1e-3, 1e3, 25)
    vals = np.array([float(_log_h(10.0, c, 625.0)) for c in Cs])
    assert np.all(np.diff(vals) < 0)
    assert np.isfinite(float(_log_h(-2.0, 1.0, 625.0)))
    assert np.isfinite(float(_log_h(19998.0, 900.0, 625.0)))


@pytest.mark.parametrize("p,C,r", [(18.0, 3.0, 625.0), (8.0, 0.4, 625.0), (198.0, 9.0, 625.0), (0.0, 0.5, 1.0)])
def test_h_moments_match_importance_sampling_within_4_standard_errors(p, C, r):
    """E[s^-2], E[s^-1] (= E[1/s]), E[s] and E[s^2] from H ratios vs Monte Carlo, for q(s) prop.
    s^-(p+2) e^{-C/s^2}/(r + s^2): s^2 ~ InvGamma((p+1)/2, C) reweighted by 1/(r + s^2) (bounded weights).
    Unit: self-normalised importance-sampling standard errors (delta method); 4 SE."""
    rng = np.random.default_rng(int(p) + 7)
    D = 400_000
    v = C / rng.gamma((p + 1) / 2, 1.0, size=D)        # InvGamma(shape, scale C)
    wts = 1.0 / (r + v)
    wts /= wts.mean()
    for k in (2.0, 1.0, -1.0, -2.0):
        f = v ** (-k / 2)
        est = np.mean(wts * f)
        se = np.std(wts * (f - est)) / math.sqrt(D)
        closed = float(_inv_moment(p, C, r, k))
        assert abs(closed - est) < 4 * se, (k, closed, est, se)


def test_scale_sampler_and_log_density_agree_with_the_closed_form():
    """The inverse-CDF sampler of q(sigma) reproduces E[sigma^-2] within 4 MC standard errors, and its log
    density integrates to 1 (trapezoid on a fine grid, 1e-6)."""
    p, C, r = 18.0, 3.0, 625.0
    s = np.asarray(_sample_scale(jax.random.key(0), p, C, r, (200_000,)))
    f = s ** -2.0
    assert abs(f.mean() - float(_inv_moment(p, C, r, 2.0))) < 4 * f.std() / math.sqrt(len(f))
    grid = np.linspace(1e-3, 20.0, 400_001)
    dens = np.exp(np.asarray(_scale_log_density(jnp.asarray(grid), p, C, r)))
    assert abs(np.trapezoid(dens, grid) - 1.0) < 1e-6


def test_special_case_limits():
    """notes A4: Sigma_lam -> 0 gives E[Z'Z] -> Z'Z at lam = mu (1e-10); A_sigma -> inf gives
    H(2m)/H(2m-2) -> (m - 1/2)/C (1e-6 at r = 1e6); omega is continuous at 0 with omega(0) = 1/8."""
    rng = np.random.default_rng(0)
    n, m, d = 6, 3, 2
    X, S, mu = rng.uniform(size=(n, d)), rng.standard_normal((m, d)), rng.standard_normal(d)
    cfg = _cfg(n, m, d)
    _, ZZ = _expectations(cfg, jnp.asarray(X), jnp.asarray(np.ones(n)), jnp.asarray(S), jnp.asarray(mu),
                                  jnp.asarray(1e-14 * np.eye(d)))
    from zoo.ssgp import features as feature_map
    Z = np.asarray(jax.jit(feature_map)(jnp.asarray(X), jnp.asarray(S), jnp.asarray(mu)))
    assert np.max(np.abs(np.asarray(ZZ) - Z.T @ Z)) < 1e-10
    for mm, C in ((10, 3.0), (50, 40.0)):
        ratio = float(_inv_moment(2.0 * mm - 2.0, C, 1e6, 2.0))
        assert abs(ratio / ((mm - 0.5) / C) - 1.0) < 1e-6
    eps = 1e-4
    om = [float(_omega(jnp.asarray(x))) for x in (0.0, eps * (1 - 1e-9), eps * (1 + 1e-9))]
    assert om[0] == 0.125 and abs(om[1] - om[2]) < 1e-12


def test_log_ndtr_matches_scipy_in_both_tails_and_its_gradient_is_the_mills_ratio():
    """``bound.log_ndtr`` (one erfc, the asymptotic series below -20) against ``scipy.special.log_ndtr`` on
    [-10^4, 37]: relative error below 1e-12 (a series one term short, or log(Phi) for log1p(-Phi(-x)) above 0, is
    off by more than 1e-9), and its gradient phi(x)/Phi(x) against SciPy's ratio on [-30, 8]."""
    from scipy import special, stats

    x = np.concatenate([-np.logspace(4, -3, 3000), [0.0], np.logspace(-3, np.log10(37.0), 3000),
                        np.linspace(-21.0, -19.0, 201)])
    got = np.asarray(jax.jit(bound.log_ndtr)(jnp.asarray(x)))
    want = special.log_ndtr(x)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0.0)
    g = np.linspace(-30.0, 8.0, 381)
    grad = np.asarray(jax.jit(jax.vmap(jax.grad(bound.log_ndtr)))(jnp.asarray(g)))
    np.testing.assert_allclose(grad, np.exp(stats.norm.logpdf(g) - special.log_ndtr(g)), rtol=1e-10)
