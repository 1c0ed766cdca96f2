"""Shared pieces of the GP-ALPS kernels (paper page ``docs/papers/gp_alps.md``): the problem arrays
every kernel needs (weight-space factors and their eigendecompositions), the corrected switch
conditional (erratum E3), the paper's wrong one (kept only to document E3 in tests), and the exact
switch posterior on orthogonal designs (notes §2.4), the test oracle of the square-wave case.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from zoo import gp_alps as za


class Problem(NamedTuple):
    """Arrays of one fit. F (m, n, r) latent factors (x_j = F_j u_j); lam (m, r), V (m, r, r): F_j^T F_j =
    V_j diag(lam_j) V_j^T; Y (n, p); logit_theta (m,); s prior variance of H; sigma2 (p,) fixed noise
    variances (ignored when ``learn_noise``); a0, b0 the InvGamma prior of sigma2; group (m,) ids of
    exchangeable latents (identical kernels)."""

    F: jax.Array
    lam: jax.Array
    V: jax.Array
    Y: jax.Array
    logit_theta: jax.Array
    s: float
    sigma2: jax.Array
    a0: float
    b0: float
    group: jax.Array


def problem(ctx) -> tuple[Problem, bool]:
    """(Problem, learn_noise) from a FitContext."""
    kw = ctx.model_kwargs
    F = np.asarray(kw["F"])
    G = np.einsum("jnr,jns->jrs", F, F)
    lam, V = np.linalg.eigh(G)
    lam = np.clip(lam, 0.0, None)
    Y = np.asarray(kw["Y"])
    th = np.asarray(kw["theta"])
    learn = kw["sigma2"] is None
    sig2 = np.full(Y.shape[1], 1.0 if learn else kw["sigma2"])
    kernels = za.resolve_kernels(ctx.hyper["kernels"], np.asarray(ctx.data["t"]).shape[1])
    keys = [repr(sorted(k.items())) for k in kernels]
    group = np.array([keys.index(k) for k in keys])
    # host arrays: the programs take them as arguments (``jnp.asarray`` here ran a program per field)
    return Problem(F, lam, V, Y, np.log(th) - np.log1p(-th), float(kw["s"]), sig2, float(kw["a0"]),
                   float(kw["b0"]), group), learn


def switch_logit(logit_theta, c):
    """Corrected Bernoulli conditional of App. C.3 (erratum E3): P(b_j = 1 | .) = sigmoid(logit theta_j + c_j)."""
    return logit_theta + c


def paper_switch_logit(logit_theta, c):
    """The paper's printed conditional theta e^c / (e^c + theta), as a logit (WRONG, erratum E3: at c = 0 it
    gives theta / (1 + theta) instead of theta). Kept only so a test can show it misses the exact posterior."""
    log_theta = -jnp.logaddexp(0.0, -logit_theta)
    log_p1 = log_theta + c - jnp.logaddexp(c, log_theta)
    log_p0 = jnp.log1p(-jnp.exp(log_p1))
    return log_p1 - log_p0


def exact_inclusion_orthogonal(y, F, sigma2, theta, s=1.0, n_grid=20001, log_h_range=(-18.420680743952367, None)):
    """Exact P(b_j = 1 | y) for p = 1, fixed sigma2, and mutually orthogonal factors (F_j^T F_k = 0, j != k),
    e.g. the square wave on its grid (notes §2.4). Then the posterior factorises over latents:

        BF_j(h) = prod_k N(q_jk; 0, h^2 lam_jk + sigma2) / N(q_jk; 0, sigma2),   q_j = diag(lam_j)^(-1/2) V_j^T F_j^T y,
        P(b_j = 1 | y) = theta_j E_h[BF_j(h)] / (theta_j E_h[BF_j(h)] + 1 - theta_j),  h ~ N(0, s).

    E_h is a trapezoid integral over log|h| on ``n_grid`` points (Gauss-Hermite is wrong here: BF has a
    spike of width ~ sqrt(2 sigma2 / (n v)) at h = 0, notes §2.4). Returns (m,) probabilities (NumPy)."""
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    F = np.asarray(F, dtype=np.float64)
    m = F.shape[0]
    th = np.broadcast_to(np.asarray(theta, dtype=np.float64), (m,))
    lo, hi = log_h_range
    hi = np.log(12.0 * np.sqrt(s)) if hi is None else hi
    w = np.linspace(lo, hi, n_grid)
    h2 = np.exp(2 * w)
    out = np.empty(m)
    for j in range(m):
        lam, V = np.linalg.eigh(F[j].T @ F[j])
        keep = lam > 1e-12 * max(lam.max(), 1e-300)
        q = (V[:, keep].T @ (F[j].T @ y)) / np.sqrt(lam[keep])
        var1 = h2[:, None] * lam[keep][None, :] + sigma2
        log_bf = np.sum(-0.5 * np.log(var1 / sigma2) - 0.5 * q ** 2 * (1 / var1 - 1 / sigma2), axis=1)
        # density of |h| in u = log|h|: 2 N(e^u; 0, s) e^u
        log_dens = np.log(2.0) - 0.5 * np.log(2 * np.pi * s) - 0.5 * h2 / s + w
        f = log_bf + log_dens
        fmax = f.max()
        log_ebf = fmax + np.log(np.trapezoid(np.exp(f - fmax), w))
        log_ebf = np.logaddexp(log_ebf, lo + np.log(2.0 / np.sqrt(2 * np.pi * s)))  # |h| < e^lo: BF ~ 1
        out[j] = 1.0 / (1.0 + np.exp(-(np.log(th[j]) - np.log1p(-th[j]) + log_ebf)))
    return out


def enumerated_switch_posterior(u, H, sigma2, F, Y, theta):
    """P(b | u, H, sigma2, Y) for every pattern by brute-force enumeration (the model's own table)."""
    configs = jnp.asarray(za.switch_table(F.shape[0]))
    return configs, za.switch_posterior(u, H, jnp.asarray(sigma2), F, Y, configs, jnp.asarray(theta))


def log_joint_b(b, u, H, sigma2, F, Y, theta):
    """log p(Y, b | u, H, sigma2) at one switch pattern (for brute-force checks of the conditional)."""
    X = jnp.einsum("jnr,jr->jn", F, u)
    Fm = ((H * b) @ X).T
    ll = jnp.sum(-0.5 * jnp.log(2 * jnp.pi * sigma2) - 0.5 * (Y - Fm) ** 2 / sigma2)
    return ll + jnp.sum(b * jnp.log(theta) + (1 - b) * jnp.log1p(-theta))


__all__ = ["Problem", "problem", "switch_logit", "paper_switch_logit", "exact_inclusion_orthogonal",
           "enumerated_switch_posterior", "log_joint_b", "logsumexp"]
