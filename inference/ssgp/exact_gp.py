"""Exact (dense-kernel) GP regression with a random intercept: the baseline that shows what the
sparse-spectrum approximation of ``ssgp_lmm`` costs (notes 002 §6 P1). Small n only: O(n^3).

Kernel on inputs scaled to [0, 1] like the SSGP (``zoo.ssgp.input_scaling``)::

    k(x, x') = sigma^2 exp(-1/2 sum_k lam_k^2 (x_k - x'_k)^2) + tau^2 1[g = g'] + var_fixed,  y = latent + N(0, gamma^2)

(sigma^2 RBF with inverse length-scales lam, the SSGP's limit m -> inf; a random intercept per group; the
intercept's N(0, var_fixed) prior integrated out). Hyperparameters (sigma, lam, tau, gamma) by type-II
maximum likelihood (L-BFGS on the log marginal likelihood with JAX gradients) from ``restarts`` random
starts. Prediction: the posterior mean and variance of the noiseless latent beta0 + f(x) (+ b_g).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _kernel(Xa, Xb, ga, gb, log_sigma, log_lam, log_tau, var_fixed, with_group):
    diff = (Xa[:, None, :] - Xb[None, :, :]) * jnp.exp(log_lam)
    K = jnp.exp(2 * log_sigma) * jnp.exp(-0.5 * jnp.sum(diff**2, -1)) + var_fixed
    if with_group:
        K = K + jnp.exp(2 * log_tau) * (ga[:, None] == gb[None, :])
    return K


def _neg_log_marginal(params, X, y, g, var_fixed, with_group):
    d = X.shape[1]
    log_sigma, log_lam, log_tau, log_gamma = params[0], params[1:1 + d], params[1 + d], params[2 + d]
    K = _kernel(X, X, g, g, log_sigma, log_lam, log_tau, var_fixed, with_group)
    K = K + (jnp.exp(2 * log_gamma) + 1e-9) * jnp.eye(X.shape[0])
    L = jnp.linalg.cholesky(K)
    a = jax.scipy.linalg.cho_solve((L, True), y)
    return 0.5 * y @ a + jnp.sum(jnp.log(jnp.diagonal(L))) + 0.5 * X.shape[0] * jnp.log(2 * jnp.pi)


def fit_exact_gp(X, y, group=None, *, var_fixed=100.0, restarts=3, seed=0):
    """Type-II ML fit; returns a dict with the scaling, the training data and the fitted hyperparameters."""
    # here, not at the top: every ssgp fit imports this module (``inference._methods`` registers a paper's kernels by
    # importing all of its modules), and scipy.optimize takes a tenth of a second to import
    from scipy.optimize import minimize

    from zoo.ssgp import input_scaling

    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    lo, span = input_scaling(X)
    Xs = (X - lo) / span
    with_group = group is not None
    g = np.asarray(group if with_group else np.zeros(len(y)), dtype=np.int64)
    d = X.shape[1]
    fun = jax.jit(jax.value_and_grad(lambda p: _neg_log_marginal(p, Xs, y, g, var_fixed, with_group)))
    rng = np.random.default_rng(seed)
    sd = np.std(y)
    best = None
    for _ in range(restarts):
        p0 = np.concatenate([[np.log(sd) + rng.normal(0, 0.5)], rng.normal(np.log(3.0), 0.7, size=d),
                             [np.log(0.5 * sd) + rng.normal(0, 0.5), np.log(0.3 * sd) + rng.normal(0, 0.5)]])
        res = minimize(lambda p: tuple(np.asarray(v, dtype=np.float64) for v in fun(p)), p0, jac=True,
                       method="L-BFGS-B", bounds=[(-8, 6)] * (d + 3))
        if np.isfinite(res.fun) and (best is None or res.fun < best.fun):
            best = res
    p = best.x
    return {"lo": lo, "span": span, "X": Xs, "y": y, "group": g, "with_group": with_group, "var_fixed": var_fixed,
            "sigma": float(np.exp(p[0])), "lam": np.exp(p[1:1 + d]), "tau": float(np.exp(p[1 + d])),
            "gamma": float(np.exp(p[2 + d])), "neg_log_marginal": float(best.fun), "params": p}


def predict_exact_gp(fit, X_new, group=None):
    """Posterior mean and variance of the noiseless latent beta0 + f(x*) (+ b_g when ``group`` is given)."""
    Xn = (np.atleast_2d(np.asarray(X_new, dtype=np.float64)) - fit["lo"]) / fit["span"]
    d = Xn.shape[1]
    p = fit["params"]
    ls, ll, lt, lg = p[0], p[1:1 + d], p[1 + d], p[2 + d]
    wg = fit["with_group"] and group is not None
    gn = np.asarray(group if wg else np.full(len(Xn), -1), dtype=np.int64)
    K = _kernel(fit["X"], fit["X"], fit["group"], fit["group"], ls, ll, lt, fit["var_fixed"], fit["with_group"])
    K = K + (np.exp(2 * lg) + 1e-9) * np.eye(len(fit["y"]))
    Ks = _kernel(Xn, fit["X"], gn, fit["group"], ls, ll, lt, fit["var_fixed"], fit["with_group"])
    kss = np.exp(2 * ls) + fit["var_fixed"] + (np.exp(2 * lt) if wg else 0.0)
    L = np.linalg.cholesky(np.asarray(K))
    a = jax.scipy.linalg.cho_solve((L, True), fit["y"])
    V = np.linalg.solve(L, np.asarray(Ks).T)
    return {"mean": np.asarray(Ks @ a), "var": kss - np.sum(V**2, 0)}
