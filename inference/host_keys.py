"""``jax.random.fold_in`` and ``jax.random.split`` of the default (threefry) key, computed in NumPy on the host.

Run as JAX operations on a concrete key, each compiles a program of its own (``_threefry_fold_in``,
``_threefry_split`` and a ``convert_element_type``) in every fresh process; a fit derives its keys once, so that is
all they would do. These give the same keys, bit for bit: threefry-2x32 (Salmon et al. 2011, 20 rounds) of the
counter ``(0, data)`` under the key's two words, which is JAX's ``fold_in`` and, with
``jax_threefry_partitionable`` (JAX's default), row ``i`` of ``split(key, n)``. Another PRNG implementation or
the old split is handed to ``jax.random`` itself.
"""

from __future__ import annotations

import jax
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _rotl(x: np.ndarray, d: int) -> np.ndarray:
    return (x << np.uint32(d)) | (x >> np.uint32(32 - d))


def threefry2x32(k0, k1, x0, x1) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32 of the counters ``(x0, x1)`` (uint32 arrays) under the key words ``(k0, k1)``."""
    with np.errstate(over="ignore"):
        k0, k1 = np.uint32(k0), np.uint32(k1)
        ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
        x0 = np.asarray(x0, np.uint32) + ks[0]
        x1 = np.asarray(x1, np.uint32) + ks[1]
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                x0 = x0 + x1
                x1 = _rotl(x1, r) ^ x0
            x0 = x0 + ks[(i + 1) % 3]
            x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _native() -> bool:
    return jax.config.jax_default_prng_impl == "threefry2x32" and bool(jax.config.jax_threefry_partitionable)


def words(key: jax.Array) -> np.ndarray:
    """The key's data as host uint32 words (no compiled program)."""
    return np.asarray(jax.random.key_data(key), np.uint32)


def wrap(data: np.ndarray) -> jax.Array:
    """A typed key array from host words (``jax.random.wrap_key_data``; nothing compiles)."""
    return jax.random.wrap_key_data(np.asarray(data, np.uint32))


def fold_in(key: jax.Array, data: int) -> jax.Array:
    """``jax.random.fold_in(key, data)`` (``data`` a non-negative integer below 2**32), on the host."""
    if not _native():
        return jax.random.fold_in(key, data)
    k = words(key)
    a, b = threefry2x32(k[0], k[1], np.zeros(1, np.uint32), np.array([data], np.uint32))
    return wrap(np.array([a[0], b[0]], np.uint32))


def fold_in_many(key: jax.Array, data) -> jax.Array:
    """``fold_in(key, d)`` for every ``d`` of ``data`` (an integer array): a key array of ``data``'s shape."""
    data = np.asarray(data, np.uint32)
    if not _native():
        return jax.vmap(lambda d: jax.random.fold_in(key, d))(data.ravel()).reshape(data.shape)
    k = words(key)
    a, b = threefry2x32(k[0], k[1], np.zeros(data.shape, np.uint32), data)
    return wrap(np.stack([a, b], axis=-1))


def split(key: jax.Array, num: int = 2) -> jax.Array:
    """``jax.random.split(key, num)``, on the host: row ``i`` is ``fold_in(key, i)``."""
    if not _native():
        return jax.random.split(key, num)
    return fold_in_many(key, np.arange(num))


def parts(key: jax.Array, num: int = 2) -> tuple[jax.Array, ...]:
    """The rows of ``split(key, num)`` as separate keys (``k1, k2 = parts(key)``): unpacking a key array would
    run an ``unstack`` program."""
    if not _native():
        return tuple(jax.random.split(key, num))
    return tuple(fold_in(key, i) for i in range(num))
