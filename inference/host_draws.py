"""Draws from stored variational factors and their log densities, in NumPy on the host.

A fit draws from its q once. Compiled, that one-shot job cost more than the whole VB run: XLA compiles the
Gamma/Dirichlet rejection samplers and the densities into a program used once per fit. Here the draws come from
``np.random.default_rng(seed)`` (reproducible: the same seed gives the same draws) and the log densities are the
closed forms; the q parameters are the arrays the kernel stored.
"""

from __future__ import annotations

import numpy as np
from scipy import special

LOG_2PI = float(np.log(2 * np.pi))


def log_gamma_variates(rng: np.random.Generator, shape, size: tuple) -> np.ndarray:
    """log of Gamma(shape, 1) variates, exact for any shape > 0: G = G' U^(1/shape) with G' ~ Gamma(shape + 1),
    U ~ U(0, 1] (Marsaglia & Tsang 2000, §6), so a tiny shape neither underflows to log 0 nor loses its small
    values."""
    shape = np.asarray(shape, float)
    return np.log(rng.standard_gamma(shape + 1.0, size)) + np.log1p(-rng.random(size)) / shape


def log_dirichlet_variates(rng: np.random.Generator, conc, size: tuple, floor: float = -np.inf) -> np.ndarray:
    """log of Dirichlet(conc) draws along the last axis (``size`` ends with conc's shape), floored at ``floor``."""
    lg = log_gamma_variates(rng, conc, size)
    return np.maximum(lg - special.logsumexp(lg, axis=-1, keepdims=True), floor)


def gamma_log_pdf(x, shape, rate):
    """log Gamma(x | shape, rate)."""
    return shape * np.log(rate) - special.gammaln(shape) + (shape - 1) * np.log(x) - rate * x


def dirichlet_log_pdf(x, conc):
    """log Dirichlet(x | conc) along the last axis."""
    return special.gammaln(conc.sum(-1)) - special.gammaln(conc).sum(-1) + ((conc - 1) * np.log(x)).sum(-1)


def normal_log_pdf(x, mean, sd):
    """log N(x | mean, sd^2), elementwise."""
    return -0.5 * ((x - mean) / sd) ** 2 - np.log(sd) - 0.5 * LOG_2PI


def mvn_tril_log_pdf(x, mean, chol):
    """log N(x | mean, L L^T) along the last axis (``chol`` = L lower triangular, broadcast against x)."""
    white = np.linalg.solve(chol, (x - mean)[..., None])[..., 0]
    log_det = np.log(np.diagonal(chol, axis1=-2, axis2=-1)).sum(-1)
    return -0.5 * (white ** 2).sum(-1) - log_det - 0.5 * x.shape[-1] * LOG_2PI


def mvn_variates(rng: np.random.Generator, mean, chol, size: tuple) -> np.ndarray:
    """mean + L eps, eps ~ N(0, I), for ``size`` leading axes before mean's shape."""
    eps = rng.standard_normal((*size, *np.shape(mean)))
    return mean + np.einsum("...ij,...j->...i", chol, eps)
