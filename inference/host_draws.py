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


# --- jax.random's threefry draws and NumPyro's constraint transforms, replayed on the host (AutoNormal's q) ---

def threefry_native() -> bool:
    """Whether ``jax.random`` keys are JAX's default partitionable threefry-2x32, the keys these functions replay."""
    import jax

    return jax.config.jax_default_prng_impl == "threefry2x32" and bool(jax.config.jax_threefry_partitionable)


def threefry_split(keys: np.ndarray, num: int = 2) -> np.ndarray:
    """``jax.random.split`` of each key in ``keys`` (uint32 words, shape ``(..., 2)``): shape ``(..., num, 2)``,
    row ``i`` the threefry-2x32 of the counter ``(0, i)`` (``inference.host_keys``: JAX's default partitionable
    threefry, bit for bit)."""
    from inference.host_keys import threefry2x32

    k = np.asarray(keys, np.uint32)[..., None, :]
    a, b = threefry2x32(k[..., 0], k[..., 1], np.zeros(num, np.uint32), np.arange(num, dtype=np.uint32))
    return np.stack([a, b], axis=-1)


def threefry_bits(keys: np.ndarray, shape: tuple) -> np.ndarray:
    """JAX's 64 random bits per element (default partitionable threefry-2x32) for each key in ``keys`` (shape
    ``(..., 2)``), as uint64 of shape ``(..., *shape)``: threefry-2x32 of the element's flat index as the counter
    ``(hi, lo)``, the two output words as the high and low half."""
    from inference.host_keys import threefry2x32

    size = int(np.prod(shape, dtype=np.int64))
    index = np.arange(size, dtype=np.uint64)
    k = np.asarray(keys, np.uint32)[..., None, :]
    hi, lo = threefry2x32(k[..., 0], k[..., 1], (index >> np.uint64(32)).astype(np.uint32),
                         (index & np.uint64(0xFFFFFFFF)).astype(np.uint32))
    bits = (hi.astype(np.uint64) << np.uint64(32)) | lo.astype(np.uint64)
    return bits.reshape(*np.shape(keys)[:-1], *shape)


def threefry_uniform(keys: np.ndarray, shape: tuple, minval: float = 0.0, maxval: float = 1.0) -> np.ndarray:
    """``jax.random.uniform(key, shape, float64, minval, maxval)`` for each key in ``keys`` (``(..., 2)``), bit for
    bit: the top 52 of ``threefry_bits`` as the mantissa of a float in [1, 2), minus 1, scaled onto
    [minval, maxval) and floored at minval."""
    floats = ((threefry_bits(keys, shape) >> np.uint64(12)) | np.float64(1.0).view(np.uint64)).view(np.float64) - 1.0
    lo, hi = np.float64(minval), np.float64(maxval)
    return np.maximum(lo, floats * (hi - lo) + lo)


def threefry_normal(keys: np.ndarray, shape: tuple) -> np.ndarray:
    """``jax.random.normal(key, shape)`` in float64 for each key in ``keys`` (shape ``(..., 2)``): shape
    ``(..., *shape)``. JAX's recipe: ``threefry_uniform`` on ``[nextafter(-1, 0), 1)``, then ``sqrt(2)
    erfinv(u)``. Equal to JAX's up to the last bits of ``erfinv`` (SciPy's against XLA's polynomial)."""
    return np.sqrt(2.0) * special.erfinv(threefry_uniform(keys, shape, np.nextafter(-1.0, 0.0), 1.0))


def _clipped_expit(z):
    """NumPyro's sigmoid, clipped to [tiny, 1 - eps] so that a simplex or unit-interval value is never 0 or 1."""
    f = np.finfo(np.float64)
    return np.clip(special.expit(z), f.tiny, 1.0 - f.eps)


def _softplus(z):
    return np.logaddexp(z, 0.0)


def identity_transform(z):
    """(x, log|dx/dz|) of the identity: elementwise."""
    return z, np.zeros_like(z)


def exp_transform(z):
    """(exp z, z): the positive reals, elementwise."""
    return np.exp(z), z


def softplus_transform(z):
    """(softplus z, log sigmoid z): the positive reals by softplus, elementwise."""
    return _softplus(z), -_softplus(-z)


def sigmoid_transform(z):
    """(sigmoid z clipped, -softplus(z) - softplus(-z)): the unit interval, elementwise."""
    return _clipped_expit(z), -_softplus(z) - _softplus(-z)


def affine_transform(loc, scale):
    """x = loc + scale z, log|dx/dz| = log|scale| (elementwise, broadcast to z)."""
    def forward(z):
        return loc + scale * z, np.broadcast_to(np.log(np.abs(scale)), np.shape(z))
    return forward


def stick_breaking_transform(z):
    """(x, log|det dx/dz|) of the stick-breaking map from R^(K-1) (last axis) onto the K-simplex, as NumPyro's
    ``StickBreakingTransform``: z_k shifted by -log(K-1-k) (so z = 0 maps to the uniform point), fractions
    s_k = sigmoid, x_k = s_k prod_{j<k} (1 - s_j), x_K the rest; log|det J| = sum_k log x_k + log s_k - z_k
    (over the shifted z, k < K), one value per vector."""
    k = z.shape[-1]
    shifted = z - np.log(k - np.arange(k))
    s = _clipped_expit(shifted)
    rest = np.cumprod(1.0 - s, axis=-1)
    ones = np.ones((*z.shape[:-1], 1))
    x = np.concatenate([s, ones], axis=-1) * np.concatenate([ones, rest], axis=-1)
    log_sigmoid = -_softplus(-shifted)
    return x, np.sum(np.log(x[..., :-1]) + log_sigmoid - shifted, axis=-1)


def compose(*forwards):
    """The transforms ``forwards`` applied in order; their log|det J|s add (each summed to one value per draw:
    the caller only needs the total, and a stick-breaking step has fewer elements than its input)."""
    def forward(z):
        total = np.zeros(z.shape[:1])
        for f in forwards:
            z, ldj = f(z)
            total = total + np.reshape(ldj, (ldj.shape[0], -1)).sum(1)
        return z, total
    return forward
