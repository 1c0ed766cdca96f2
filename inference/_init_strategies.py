"""Initialisation strategies shared by the NUTS and SVI baselines (option ``init``), and the prior draws of
``init_to_median`` replayed on the host for SVI (``HOST_INIT_STRATEGIES``).

``init_to_median`` sets each latent site to the median, in the unconstrained space, of ``num_samples`` (15) draws
from its prior, seeded with the key the seed handler gives the site. Inside a compiled program those draws are the
program's largest part: JAX's Gamma sampler (behind NumPyro's Gamma, Dirichlet and Beta) is a rejection loop in a
loop, and every ``jax.random`` draw is a threefry-2x32 of 20 rounds, each inlined where it is drawn; an autoguide's
set-up draws them twice (its prototype trace and ``find_valid_initial_params``'s candidate). ``init_to_median_on_host``
makes the same draws in NumPy, from the key's words and the prior's parameters at run time (a
``jax.pure_callback``, so priors whose parameters depend on other sites are drawn from those sites' values), bit for
bit the threefry bits and the sampler's steps (JAX's recipes: ``jax.random.uniform``/``normal``/``cauchy``, the
Marsaglia-Tsang Gamma sampler with its boost for shapes below 1, ``dirichlet`` by log-Gamma draws and a softmax);
the transcendental functions are NumPy's and SciPy's rather than XLA's, equal up to their last bits. The median and
the transforms stay in the program, as ``init_to_median`` computes them. Sites whose prior it does not replay
(another family, a float32 run, keys other than JAX's default partitionable threefry) get ``init_to_median``
itself. NUTS keeps ``INIT_STRATEGIES``: its initial point is NumPyro's, computed as NumPyro does.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import distributions as dist
from numpyro.distributions import biject_to
from numpyro.distributions import transforms as T
from numpyro.infer import init_to_median, init_to_sample, init_to_uniform

from inference import host_draws as hd

# "uniform": unconstrained values uniform in (-2, 2); use it when the prior median is degenerate (a
# Gamma(0.001, 0.001) precision has median ~1e-300: "median" starts SVI with an infinite noise variance).
INIT_STRATEGIES = {"prior": init_to_sample, "median": init_to_median, "uniform": init_to_uniform}

# A host sampler: (key words uint32[2], sample shape, parameters as NumPy arrays) -> draws, as the prior's
# ``sample(key, sample_shape)``; its parameters are the arrays the program passes to the callback.
Sampler = Callable[[np.ndarray, tuple, list], np.ndarray]


_uniform = hd.threefry_uniform   # jax.random.uniform(key, shape, float64, minval, maxval), per key


def _gamma_one(keys: np.ndarray, alpha: np.ndarray, log_space: bool) -> np.ndarray:
    """JAX's ``_gamma_one`` for each (key, shape) pair (``keys`` ``(n, 2)``, ``alpha`` ``(n,)``), the element's
    own key sequence as JAX's vectorised loop gives it: Marsaglia and Tsang (2000) for Gamma(alpha) with alpha
    boosted by 1 below 1 (the boost ``U^(1/alpha)``, or ``log U / alpha`` in log space, drawn with the key's
    second half); log Gamma draws where ``log_space``."""
    one_third = np.float64(1.0 / 3.0)
    boost = alpha >= 1.0
    a = np.where(boost, alpha, alpha + 1.0)
    d = a - one_third
    c = one_third / np.sqrt(d)
    halves = hd.threefry_split(keys)
    key, subkey = halves[:, 0].copy(), halves[:, 1]
    big_x, big_v, big_u = np.zeros_like(a), np.ones_like(a), np.full_like(a, 2.0)

    def rejected(X, V, U, d):
        with np.errstate(divide="ignore", invalid="ignore"):
            return (U >= 1.0 - 0.0331 * (X * X)) & (np.log(U) >= X * 0.5 + d * ((1.0 - V) + np.log(V)))

    todo = np.flatnonzero(rejected(big_x, big_v, big_u, d))
    while todo.size:
        three = hd.threefry_split(key[todo], 3)
        key[todo] = three[:, 0]
        x_key, u_key = three[:, 1].copy(), three[:, 2]
        x, v = np.zeros(todo.size), np.full(todo.size, -1.0)
        inner = np.flatnonzero(v <= 0.0)
        while inner.size:
            two = hd.threefry_split(x_key[inner])
            x_key[inner] = two[:, 0]
            x[inner] = hd.threefry_normal(two[:, 1], ())
            v[inner] = 1.0 + x[inner] * c[todo][inner]
            inner = np.flatnonzero(v <= 0.0)
        big_x[todo], big_v[todo], big_u[todo] = x * x, (v * v) * v, _uniform(u_key, ())
        todo = todo[rejected(big_x[todo], big_v[todo], big_u[todo], d[todo])]
    with np.errstate(divide="ignore", over="ignore"):
        u = _uniform(subkey, ())
        if log_space:
            log_samples = np.log1p(-u)
            log_boost = np.where(boost | (log_samples == 0.0), 0.0, log_samples * (1.0 / alpha))
            return (np.log(d) + np.log(big_v)) + log_boost
        return (d * big_v) * np.where(boost, 1.0, np.power(1.0 - u, 1.0 / alpha))


def _gamma(key: np.ndarray, alpha: np.ndarray, shape: tuple, log_space: bool = False) -> np.ndarray:
    """``jax.random.gamma`` (``loggamma`` where ``log_space``) of one key: alpha broadcast to ``shape``, element
    ``i`` (row-major) drawn with row ``i`` of ``split(key, size)``."""
    alpha = np.broadcast_to(np.asarray(alpha, np.float64), shape).ravel()
    keys = hd.threefry_split(np.asarray(key, np.uint32), alpha.size)
    return _gamma_one(keys, alpha, log_space).reshape(shape)


def _normal(fn) -> Sampler:
    return lambda key, shape, p: p[0] + hd.threefry_normal(key, shape + fn.batch_shape + fn.event_shape) * p[1]


def _cauchy(fn) -> Sampler:
    def sample(key, shape, p):
        u = _uniform(key, shape + fn.batch_shape, np.finfo(np.float64).eps, 1.0)
        return p[0] + np.tan(np.float64(np.pi) * (u - 0.5)) * p[1]
    return sample


def _gamma_dist(fn) -> Sampler:
    return lambda key, shape, p: _gamma(key, p[0], shape + fn.batch_shape + fn.event_shape) / p[1]


def _dirichlet(fn) -> Sampler:
    def sample(key, shape, p):
        conc = np.asarray(p[0], np.float64)
        log_gamma = _gamma(key, conc, shape + fn.batch_shape + conc.shape[-1:], log_space=True)
        unnormalised = np.exp(log_gamma - np.max(log_gamma, axis=-1, keepdims=True))
        draws = unnormalised / np.sum(unnormalised, axis=-1, keepdims=True)
        finfo = np.finfo(np.float64)
        return np.clip(draws, finfo.tiny, 1.0 - finfo.eps)
    return sample


def _expanded(fn, base: Sampler) -> Sampler:
    """NumPyro's ``ExpandedDistribution._sample``: the base drawn with the expanded and interstitial sizes as
    leading batch axes, the interstitial ones then moved into place."""
    expanded, interstitial = tuple(fn._expanded_sizes.values()), tuple(fn._interstitial_sizes.values())

    def sample(key, shape, p):
        draws = base(key, shape + expanded + interstitial, p)
        if not interstitial:
            return draws
        batch_ndims = draws.ndim - len(fn.event_shape)
        permutation = list(range(batch_ndims))
        start = len(shape) + len(expanded)
        for i, j in zip((batch_ndims + i for i in fn._interstitial_sizes), range(start, start + len(interstitial)),
                        strict=True):
            permutation[i], permutation[j] = permutation[j], permutation[i]
        draws = np.transpose(draws, permutation + list(range(batch_ndims, draws.ndim)))
        return draws.reshape(shape + fn.batch_shape + draws.shape[batch_ndims:])
    return sample


def _transformed(fn, base: tuple[list, Sampler]) -> tuple[list, Sampler] | None:
    """NumPyro's ``TransformedDistribution.sample`` (e.g. InverseGamma, LogNormal): the base's draws through
    each transform in order, for power, exp and affine transforms (their parameters follow the base's)."""
    params, steps = list(base[0]), []
    for t in fn.transforms:
        first = len(params)
        if type(t) is T.PowerTransform:
            params.append(t.exponent)
            steps.append(lambda x, p, i=first: np.power(x, p[i]))
        elif type(t) is T.ExpTransform:
            steps.append(lambda x, p: np.exp(x))
        elif type(t) is T.AffineTransform:
            params += [t.loc, t.scale]
            steps.append(lambda x, p, i=first: p[i] + np.multiply(p[i + 1], x))
        else:
            return None
    sample_base, n_base = base[1], len(base[0])

    def sample(key, shape, p):
        x = sample_base(key, shape, p[:n_base])
        for step in steps:
            x = step(x, p)
        return x
    return params, sample


def host_sampler(fn) -> tuple[list, Sampler] | None:
    """(the prior's parameters, its host sampler) for a prior ``init_to_median_on_host`` replays: Normal,
    HalfNormal, Cauchy, HalfCauchy, Gamma, Dirichlet, and ``Independent``/``ExpandedDistribution`` of these, or
    their ``TransformedDistribution`` by power, exp or affine maps (InverseGamma, LogNormal); None for any other."""
    kind = type(fn)
    if isinstance(fn, dist.TransformedDistribution) and kind in (dist.TransformedDistribution, dist.InverseGamma,
                                                                 dist.LogNormal):
        base = host_sampler(fn.base_dist)
        return None if base is None else _transformed(fn, base)
    if kind is dist.Independent:
        return host_sampler(fn.base_dist)
    if kind is dist.ExpandedDistribution:
        base = host_sampler(fn.base_dist)
        return None if base is None else (base[0], _expanded(fn, base[1]))
    if kind is dist.Normal:
        return [fn.loc, fn.scale], _normal(fn)
    if kind is dist.HalfNormal:
        params, sample = host_sampler(fn._normal)
        return params, lambda key, shape, p: np.abs(sample(key, shape, p))
    if kind is dist.Cauchy:
        return [fn.loc, fn.scale], _cauchy(fn)
    if kind is dist.HalfCauchy:
        params, sample = host_sampler(fn._cauchy)
        return params, lambda key, shape, p: np.abs(sample(key, shape, p))
    if kind is dist.Gamma:
        return [fn.concentration, fn.rate], _gamma_dist(fn)
    if kind is dist.Dirichlet:
        return [fn.concentration], _dirichlet(fn)
    return None


def host_prior_draws(fn, key, sample_shape: tuple) -> jax.Array | None:
    """``fn(sample_shape=sample_shape, rng_key=key)`` drawn on the host inside a trace (a ``jax.pure_callback``
    of ``host_sampler``), or None where the host does not replay it (the caller then draws with JAX)."""
    plan = host_sampler(fn)
    if plan is None or key is None or not hd.threefry_native():
        return None
    params, sample = plan
    params = [jnp.asarray(p) for p in params]
    if jnp.result_type(float, *params) != jnp.float64:
        return None
    words = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    if words.shape != (2,) or words.dtype != jnp.uint32:
        return None
    shape = tuple(sample_shape) + fn.batch_shape + fn.event_shape

    def on_host(words, *values):   # JAX hands the callback jax.Arrays: NumPy ones here, or each op would compile
        with np.errstate(all="ignore"):
            values = [np.asarray(v) for v in values]
            return np.asarray(sample(np.asarray(words), tuple(sample_shape), values), np.float64)

    return jax.pure_callback(on_host, jax.ShapeDtypeStruct(shape, jnp.float64), words, *params,
                             vmap_method="sequential")


def init_to_median_on_host(site=None, num_samples: int = 15):
    """NumPyro's ``init_to_median`` with the prior draws made on the host (``host_prior_draws``): the same
    initial values, without the samplers in the compiled program; ``init_to_median`` itself for a site whose prior
    the host does not replay."""
    if site is None:
        return partial(init_to_median_on_host, num_samples=num_samples)
    if (site["type"] == "sample" and not site["is_observed"] and not site["fn"].support.is_discrete
            and site["value"] is None):
        draws = host_prior_draws(site["fn"], site["kwargs"].get("rng_key"),
                                 (num_samples,) + tuple(site["kwargs"].get("sample_shape", ())))
        if draws is not None:
            transform = biject_to(site["fn"].support)
            return transform(jnp.median(transform.inv(draws), axis=0))
    return init_to_median(site, num_samples=num_samples)


# What SVI's programs use: the prior median's draws on the host (same values as "median")
HOST_INIT_STRATEGIES = {**INIT_STRATEGIES, "median": init_to_median_on_host}
