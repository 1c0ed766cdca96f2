"""One-shot draws from a fitted q made in NumPy on the host (issue 28, item 1): gp_alps ``vbem.draw``, ssgp
``vb.draw`` and hlcr fedgibbs ``parameter_draws`` follow the distribution they claim, and a seed fixes them.

Oracles are independent of the code under test: ``scipy.stats`` distributions (Normal, InvGamma, Beta marginals of a
Dirichlet), inverse matrices from ``numpy.linalg.inv``, label counts from ``np.bincount`` and, for ssgp's scale
factors q(s) prop. s^-(p+2) exp(-C/s^2) / (A^2 + s^2), a CDF by adaptive quadrature (``scipy.integrate.quad``), not
the kernel's trapezoid grid. Each check is a Kolmogorov-Smirnov test of S = 3000 draws at a fixed seed: the
smallest p-value over a case's tests must exceed 1e-4 / (number of tests) (Bonferroni at 1e-4). At S = 3000 a
KS test rejects a shift of 0.1 sd (KS distance 0.04 against a critical 0.04-0.05) or a 15 % error of an sd:
a transposed Cholesky factor, a dropped prior precision, a wrong Gamma rate or a Dirichlet count on the wrong
agent all move some tested marginal by more. Linear projections of the Gaussian blocks on fixed random directions
check their covariances, not only their diagonals. log q against scipy at the fitted q is checked on fits in
tests/test_log_q.py; here gp_alps's log q is checked at a random q too.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, optimize, stats

S = 3000
ALPHA = 1e-4


def assert_ks(samples: dict, label: str):
    """``samples``: name -> (draws (S,), cdf callable); every KS p-value above ALPHA / len(samples)."""
    ps = {name: stats.kstest(x, cdf).pvalue for name, (x, cdf) in samples.items()}
    worst = min(ps, key=ps.get)
    assert ps[worst] > ALPHA / len(ps), f"{label}: {worst} fails KS (p = {ps[worst]:.2e}; {len(ps)} tests)"


def gaussian_projections(x, mean, cov, rng, n_dirs: int, name: str) -> dict:
    """KS cases for a . x ~ N(a . mean, a^T cov a) along ``n_dirs`` random unit directions a (x: (S, d))."""
    out = {}
    for i in range(n_dirs):
        a = rng.standard_normal(mean.shape[-1])
        a /= np.linalg.norm(a)
        out[f"{name} dir {i}"] = (x @ a, stats.norm(a @ mean, np.sqrt(a @ cov @ a)).cdf)
    return out


def random_spd(rng, *shape, scale=1.0):
    A = rng.standard_normal((*shape, shape[-1])) * scale
    return A @ np.swapaxes(A, -1, -2) + 0.1 * scale ** 2 * np.eye(shape[-1])


def assert_same_and_different_seeds(draw, label: str):
    """The same seed gives the same draws (rtol 1e-12: a wrong seed changes them by O(1)); another seed others."""
    a, b, c = draw(7), draw(7), draw(8)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-12, atol=0, err_msg=f"{label} {name}: same seed")
        assert not np.allclose(a[name], c[name]), f"{label} {name}: another seed gave the same draws"


# --------------------------------------------------------------------------------------------------
# gp_alps vbem: q(u_j) = N(mu_j, Sigma_j), q(H_ij) = N(mH, sH), q(b_j) = Bern(rho_j), q(sigma2_i) = InvGamma(a, b)
# --------------------------------------------------------------------------------------------------

def gp_alps_state(rng, m=3, r=2, p=2):
    from inference.gp_alps import vbem

    return vbem.State(mu=rng.standard_normal((m, r)), Sigma=random_spd(rng, m, r, scale=0.5),
                      mH=rng.standard_normal((p, m)), sH=rng.uniform(0.05, 1.0, (p, m)),
                      logit_rho=np.array([-1.0, 0.5, 2.0][:m]), a_tau=rng.uniform(2, 20, p), b_tau=rng.uniform(1, 5, p))


def test_gp_alps_vbem_host_draws_follow_q_and_log_q_is_the_scipy_density():
    from inference.gp_alps import vbem

    rng = np.random.default_rng(0)
    st = gp_alps_state(rng)
    out, log_q = vbem.draw(0, st, S, True)
    m, r = st.mu.shape
    p = st.mH.shape[0]
    assert out["u"].shape == (S, m, r) and out["H"].shape == (S, p, m) and out["sigma2"].shape == (S, p)
    cases = {}
    for j in range(m):
        cases |= gaussian_projections(out["u"][:, j], st.mu[j], st.Sigma[j], rng, 2, f"u_{j}")
    for i in range(p):
        cases[f"sigma2_{i}"] = (out["sigma2"][:, i], stats.invgamma(st.a_tau[i], scale=st.b_tau[i]).cdf)
        for j in range(m):
            cases[f"H_{i}{j}"] = (out["H"][:, i, j], stats.norm(st.mH[i, j], np.sqrt(st.sH[i, j])).cdf)
    assert_ks(cases, "gp_alps vbem")
    # b_j ~ Bern(rho_j): frequencies within 4 binomial SE
    rho = 1 / (1 + np.exp(-st.logit_rho))
    freq = out["b"].mean(0)
    assert np.all(np.abs(freq - rho) < 4 * np.sqrt(rho * (1 - rho) / S)), (freq, rho)
    # log q at the draws: the model's sites u, H, sigma2 (b summed out), scipy's densities; units: nats, 1e-8
    expected = sum(stats.multivariate_normal(st.mu[j], st.Sigma[j]).logpdf(out["u"][:, j]) for j in range(m))
    expected += stats.norm.logpdf(out["H"], st.mH, np.sqrt(st.sH)).sum((1, 2))
    expected += stats.invgamma.logpdf(out["sigma2"], st.a_tau, scale=st.b_tau).sum(1)
    np.testing.assert_allclose(log_q, expected, rtol=0, atol=1e-8)
    assert_same_and_different_seeds(lambda seed: vbem.draw(seed, st, 50, True)[0], "gp_alps vbem")


# --------------------------------------------------------------------------------------------------
# ssgp vb: q(lam) = N, q(alpha, beta) = N (joint), scale factors sigma, tau_t, gamma by quadrature
# --------------------------------------------------------------------------------------------------

def scale_density(p, C, A, k=0.0):
    """For s^k q(s), q(s) prop. s^-(p+2) exp(-C/s^2) / (A^2 + s^2), in u = log s: (the density divided by its peak
    value, the mode u0 (scipy.optimize), a width, the log of the peak value); ``integral`` splits the quadrature at
    the mode and +-40 widths."""
    def f(u):
        with np.errstate(over="ignore"):
            return -(p + 1 - k) * u - C * np.exp(-2 * u) - np.logaddexp(2 * np.log(A), 2 * u)

    u0 = optimize.minimize_scalar(lambda u: -f(u), bracket=(-5.0, 5.0)).x
    f0 = f(u0)
    h = 1e-4
    width = 1.0 / np.sqrt(max(-(f(u0 + h) - 2 * f0 + f(u0 - h)) / h**2, 1e-12))
    dens = lambda u: np.exp(f(u) - f0)  # noqa: E731
    return dens, u0, width, f0


def integral(g, u0, width, *_):
    cuts = [-np.inf, u0 - 40 * width, u0, u0 + 40 * width, np.inf]
    return sum(integrate.quad(g, a, b, epsabs=0, epsrel=1e-12, limit=200)[0]
               for a, b in zip(cuts[:-1], cuts[1:], strict=True))


def scale_cdf(p, C, A):
    """CDF of q(s) by adaptive quadrature in u = log s (``scale_density``)."""
    dens, u0, width, _ = scale_density(p, C, A)
    Z = integral(dens, u0, width)

    def cdf(s):
        s = np.asarray(s)
        order = np.argsort(s)
        u = np.log(s[order])
        steps = [integrate.quad(dens, -np.inf, u[0], limit=200)[0]]
        steps += [integrate.quad(dens, a, b, limit=200)[0] for a, b in zip(u[:-1], u[1:], strict=True)]
        out = np.empty_like(u)
        out[order] = np.cumsum(steps) / Z
        return out

    return cdf


def ssgp_case(rng):
    from inference.ssgp import vb
    from inference.ssgp.problem import Config

    m, d, J, T = 3, 2, 4, 1
    s = 1 + J * T
    cfg = Config("gaussian", n=40, m=m, d=d, s=s, J=J, T=T, A_sigma=25.0, A_gamma=25.0, A_tau=25.0, chunk=40,
                 n_chunks=1)
    cov = random_spd(rng, 2 * m + s, scale=0.4)
    z = np.zeros
    Sig_lam = random_spd(rng, d, scale=0.3)
    st = vb.State(mu_lam=rng.standard_normal(d), Sig_lam=Sig_lam, P_lam=np.linalg.inv(Sig_lam),
                  mu_a=rng.standard_normal(2 * m), Sig_a=cov[:2 * m, :2 * m], mu_b=rng.standard_normal(s),
                  Sig_b=cov[2 * m:, 2 * m:], Sig_ab=cov[:2 * m, 2 * m:], C_sig=np.asarray(3.0),
                  C_tau=np.array([0.8]), C_gam=np.asarray(5.0), xi=z(40), EZ=z((40, 2 * m)), ZWZ=z((2 * m, 2 * m)),
                  qz=z(40), w=z(40), yt=z(40), logdet_cov=np.asarray(np.linalg.slogdet(cov)[1]), bound=np.asarray(0.0),
                  a=np.asarray(0.0), it=np.asarray(0), b=np.asarray(0.0), dC=z(2))
    return cfg, st, cov


def test_ssgp_vb_host_draws_follow_q_on_the_model_sites():
    """The non-centred sites mapped back (alpha = alpha_raw sigma / sqrt m, b = b_raw tau) follow the Gaussian
    blocks jointly, and sigma, tau, gamma follow their H-function densities (quadrature CDF)."""
    from inference.ssgp import vb

    rng = np.random.default_rng(1)
    cfg, st, cov = ssgp_case(rng)
    post, log_q = vb.draw(cfg, 0, st, S, cfg.n)
    m = cfg.m
    assert set(post) == {"lam", "sigma", "alpha_raw", "beta0", "tau", "b_raw", "gamma"} and log_q.shape == (S,)
    sigma, tau = post["sigma"], post["tau"]
    theta = np.concatenate([post["alpha_raw"] * sigma[:, None] / np.sqrt(m), post["beta0"][:, None],
                            (post["b_raw"] * tau[:, None, :]).reshape(S, -1)], 1)
    cases = gaussian_projections(post["lam"], st.mu_lam, st.Sig_lam, rng, 2, "lam")
    cases |= gaussian_projections(theta, np.concatenate([st.mu_a, st.mu_b]), cov, rng, 4, "(alpha, beta)")
    cases["sigma"] = (sigma, scale_cdf(2 * m - 2, float(st.C_sig), cfg.A_sigma))
    cases["tau"] = (tau[:, 0], scale_cdf(cfg.J - 2, float(st.C_tau[0]), cfg.A_tau))
    cases["gamma"] = (post["gamma"], scale_cdf(cfg.n - 2, float(st.C_gam), cfg.A_gamma))
    assert_ks(cases, "ssgp vb")
    assert np.all(np.isfinite(log_q))
    assert_same_and_different_seeds(lambda seed: vb.draw(cfg, seed, st, 50, cfg.n)[0], "ssgp vb")


def test_ssgp_scale_moments_on_the_host_match_quadrature():
    """E[sigma], E[gamma], E[gamma^2], E[tau] stored in the tree (NumPy ``hfunction``) against the same
    moments by adaptive quadrature, to 1e-8 relative (the grid's error is below 1e-13)."""
    from inference.ssgp import vb

    cfg, st, _ = ssgp_case(np.random.default_rng(1))
    ds = vb.state_dataset(cfg, st)

    def moment(p, C, A, k):
        (num, log_num), (den, log_den) = ((integral(*d), d[3]) for d in (scale_density(p, C, A, k),
                                                                         scale_density(p, C, A)))
        return num / den * np.exp(log_num - log_den)

    m, n, J = cfg.m, cfg.n, cfg.J
    for name, expected in [("E_sigma", moment(2 * m - 2, 3.0, 25.0, 1)), ("E_gamma", moment(n - 2, 5.0, 25.0, 1)),
                           ("E_gamma2", moment(n - 2, 5.0, 25.0, 2)), ("E_tau", moment(J - 2, 0.8, 25.0, 1))]:
        np.testing.assert_allclose(np.ravel(ds[name].values)[0], expected, rtol=1e-8, err_msg=name)


# --------------------------------------------------------------------------------------------------
# hlcr fedgibbs: w_k ~ N(D_k^-1 c_k, D_k^-1), theta_i ~ Dir(beta psi + N_i) given the final labels
# --------------------------------------------------------------------------------------------------

def test_fedgibbs_parameter_draws_follow_the_conditionals_given_the_labels():
    from inference.hlcr.fedgibbs import parameter_draws

    rng = np.random.default_rng(2)
    K, F, n_agents, E = 3, 2, 4, 30
    D_data, c = random_spd(rng, K, F, scale=2.0), rng.standard_normal((K, F)) * 3
    z, pair_agent = rng.integers(0, K, E), rng.integers(0, n_agents, E)
    log_psi = np.log(rng.dirichlet(np.ones(K)))
    delta, beta = 2.0, 1.5
    w, theta = parameter_draws(0, D_data, c, z, pair_agent, log_psi, (delta, beta), n_agents, S)
    assert w.shape == (S, K, F) and theta.shape == (S, n_agents, K)
    np.testing.assert_allclose(theta.sum(-1), 1.0, rtol=1e-12)
    cases = {}
    for k in range(K):
        cov = np.linalg.inv(np.eye(F) / delta**2 + D_data[k])
        cases |= gaussian_projections(w[:, k], cov @ c[k], cov, rng, 2, f"w_{k}")
    for i in range(n_agents):
        conc = beta * np.exp(log_psi) + np.bincount(z[pair_agent == i], minlength=K)
        for k in range(K):
            cases[f"theta_{i}{k}"] = (theta[:, i, k], stats.beta(conc[k], conc.sum() - conc[k]).cdf)
    assert_ks(cases, "fedgibbs")
    assert_same_and_different_seeds(
        lambda seed: dict(zip("wt", parameter_draws(seed, D_data, c, z, pair_agent, log_psi, (delta, beta), n_agents,
                                                    50), strict=True)), "fedgibbs")


@pytest.mark.parametrize("case", ["gp_alps", "ssgp", "fedgibbs"])
def test_host_draws_compile_no_xla_program(case):
    """The draws are NumPy: none of them builds an XLA program (JAX's compile events, counted)."""
    from inference._timing import Stopwatch
    from inference.gp_alps import vbem
    from inference.hlcr.fedgibbs import parameter_draws
    from inference.ssgp import vb

    rng = np.random.default_rng(3)
    if case == "gp_alps":
        st = gp_alps_state(rng)
        run = lambda: vbem.draw(0, st, 10, True)  # noqa: E731
    elif case == "ssgp":
        cfg, st, _ = ssgp_case(rng)
        run = lambda: (vb.draw(cfg, 0, st, 10, cfg.n), vb.state_dataset(cfg, st))  # noqa: E731
    else:
        run = lambda: parameter_draws(0, random_spd(rng, 2, 2), np.ones((2, 2)), np.array([0, 1]),  # noqa: E731
                                      np.array([0, 0]), np.log([0.5, 0.5]), (1.0, 1.0), 1, 10)
    with Stopwatch() as sw:
        run()
    assert len(sw.xla_compiles) == 0, sw.xla_compiles
