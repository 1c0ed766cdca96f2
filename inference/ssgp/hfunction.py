"""The H function of the half-Cauchy scale factors (notes §3.5): normalisers, moments, densities and draws.

q(s) prop. s^-(p+2) exp(-C/s^2) / (r + s^2) (s = sigma, gamma or tau; r = A^2) has normaliser and moments
that are ratios of H(p, C, r) = int_0^inf x^p exp(-C x^2)/(r + x^-2) dx (notes §3.5), computed in log space on
a 401-point trapezoid grid in u = log x centred at the closed-form mode (``log_h``): plain adaptive quadrature
misses the peak at large p (log H(998, 40, 625) = 733.7 instead of 752.3).

Every function takes ``xp`` (``jax.numpy``, the default, inside the compiled sweeps; ``numpy`` for the one-shot
draws and moments of a fit, on the host: one formula, two array libraries); ``sample_scale_host`` is the NumPy twin
of ``sample_scale`` (a ``numpy.random.Generator`` for a JAX key). ``log_h`` and ``inv_moment`` broadcast over
arrays of (p, C, r), the grid on a new last axis: a sweep evaluates all its scale factors' H functions in one call
(``inference.ssgp.bound.h_terms``), so its compiled program holds one grid, not one per factor and use.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

H_GRID = 401
SAMPLE_GRID = 20001


def _h_grid(p, C, r, width, tail, K, xp=jnp):
    """u-grid around the mode of g(u) = (p+1)u - C e^{2u} - log(r + e^{-2u}) (strictly concave): K points on the
    last axis of the broadcast shape of (p, C, r), and g there. Written in plain operations (no ``linspace``,
    no ``logaddexp``): a sweep's compiled program holds this grid, and every operation of it costs compile time."""
    p, C, r = xp.broadcast_arrays(p, C, r)
    C = xp.maximum(C, 1e-12)
    b = (p + 1.0) * r - 2.0 * C
    disc = xp.sqrt(b * b + 8.0 * C * r * (p + 3.0))
    v = xp.where(b >= 0, (b + disc) / (4.0 * C * r), 2.0 * (p + 3.0) / (disc - b))  # e^{2u*}, no cancellation
    u0 = 0.5 * xp.log(v)
    su = 1.0 / xp.sqrt(4.0 * C * v + 4.0 * r * v / (r * v + 1.0) ** 2)
    lo = u0 - xp.maximum(width * su, tail / (p + 3.0))  # left tail decays only like e^{(p+3)u}
    step = (u0 + width * su - lo) / (K - 1)
    p, C, r, lo, step = (a[..., None] for a in (p, C, r, lo, step))
    u = lo + step * np.arange(K)
    # log(r + e^{-2u}) = max(a, b) + log1p(e^{-|a - b|}) with a = log r, b = -2u
    a, e = xp.log(r), -2.0 * u
    g = (p + 1.0) * u - C * xp.exp(2.0 * u) - (xp.maximum(a, e) + xp.log1p(xp.exp(-xp.abs(a - e))))
    return u, g, step[..., 0]


def log_h(p, C, r, xp=jnp):
    """log H(p, C, r) = log int_0^inf x^p e^{-C x^2} / (r + x^-2) dx  (C > 0, r > 0, p > -3; notes §3.5),
    elementwise over the broadcast shape of (p, C, r).

    Trapezoid rule on 401 points of u = log x over [u* - max(12 s_u, 46/(p+3)), u* + 12 s_u], in log space;
    relative error below 1e-13 against the Tricomi-U closed form at the notes' eight test triples."""
    _, g, h = _h_grid(p, C, r, 12.0, 46.0, H_GRID, xp)
    gmax = xp.max(g, axis=-1)
    wts = np.concatenate([[0.5], np.ones(H_GRID - 2), [0.5]])
    return gmax + xp.log(h * xp.sum(wts * xp.exp(g - gmax[..., None]), axis=-1))


def inv_moment(p, C, r, k, xp=jnp):
    """E[s^-k] under q(s) prop. s^-(p+2) e^{-C/s^2} / (r + s^2): H(p+k, C, r) / H(p, C, r) (notes §3.2)."""
    return xp.exp(log_h(p + k, C, r, xp) - log_h(p, C, r, xp))


def scale_log_density(s, p, C, r, xp=jnp):
    """log q(s) = -(p+2) log s - C/s^2 - log(r + s^2) - log H(p, C, r)  (s = sigma, gamma or tau)."""
    return -(p + 2.0) * xp.log(s) - C / s**2 - xp.log(r + s**2) - log_h(p, C, r, xp)


def sample_scale(key, p, C, r, shape):
    """Draws of s from q(s) by inverse CDF on a 20001-point u-grid (notes §3.5), s = e^{-u}."""
    u, g, _ = _h_grid(p, C, r, 14.0, 50.0, SAMPLE_GRID)
    dens = jnp.exp(g - jnp.max(g))
    cdf = jnp.concatenate([jnp.zeros(1), jnp.cumsum(0.5 * (dens[1:] + dens[:-1]))])
    cdf = cdf / cdf[-1]
    return jnp.exp(-jnp.interp(jax.random.uniform(key, shape), cdf, u))


def sample_scale_host(rng: np.random.Generator, p, C, r, shape) -> np.ndarray:
    """``sample_scale`` in NumPy: the same inverse CDF on the same 20001-point grid, uniforms from ``rng``."""
    u, g, _ = _h_grid(float(p), float(C), float(r), 14.0, 50.0, SAMPLE_GRID, np)
    dens = np.exp(g - np.max(g))
    cdf = np.concatenate([np.zeros(1), np.cumsum(0.5 * (dens[1:] + dens[:-1]))])
    return np.exp(-np.interp(rng.random(shape), cdf / cdf[-1], u))
