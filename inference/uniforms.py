"""Random numbers from one block of uniforms, for kernels whose step draws many variates.

On the CPU every ``jax.random`` call compiles its own Threefry loop into the program (a ``while`` loop compiled as
a function of its own), every ``jax.random.normal`` an erf_inv, and ``jax.random.gamma`` a rejection loop with
several more: a Gibbs sweep that draws its variates one call at a time compiles a program several times larger
than its arithmetic (benchmarks/results.md, "hlcr_gibbs_sweep" and "compile_cold"). A kernel therefore draws
every uniform of a step in one ``open_uniforms`` call and makes its variates from slices of them:

* ``split_uniforms``: the block cut into the step's arrays (``uniforms_size``: how many the shapes take);
* ``box_muller``: standard normals from two uniforms each;
* ``log_gamma_from_uniforms``: Gamma(a, 1) variates (log scale, any shape a > 0), ``GAMMA_UNIFORMS`` uniforms each,
  by Marsaglia & Tsang (2000) (``log_gamma_mt``).

The hlcr samplers (``inference.hlcr``) and gp_alps's Gibbs sweep (``inference.gp_alps.gibbs``) use them.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

GAMMA_TRIALS = 12


def log_gamma_mt(a, x, u, u_boost):
    """log Gamma(a, 1) from ``GAMMA_TRIALS`` Marsaglia-Tsang proposals for shape a + 1 (standard normals ``x`` and
    uniforms ``u`` on (0, 1), shape (GAMMA_TRIALS, *a.shape)), the first accepted (the last where none is), and the
    boost G(a) = G(a + 1) U^(1/a) with ``u_boost`` (a.shape) in log space."""
    b = a + 1.0
    d = b - 1.0 / 3.0
    c = 1.0 / jnp.sqrt(9.0 * d)
    v = (1.0 + c * x) ** 3
    vpos = jnp.where(v > 0, v, 1.0)
    accept = (v > 0) & (jnp.log(u) < 0.5 * x**2 + d - d * vpos + d * jnp.log(vpos))
    first = jnp.argmax(accept.at[-1].set(True), axis=0)
    log_g = jnp.log(d) + jnp.log(jnp.take_along_axis(vpos, first[None], axis=0)[0])
    return log_g + jnp.log(u_boost) / a


GAMMA_UNIFORMS = 3 * GAMMA_TRIALS + 1
"""Uniforms ``log_gamma_from_uniforms`` reads per Gamma variate: two per proposal's normal (Box-Muller), one per
proposal's accept test, one for the boost."""


def open_uniforms(key, shape):
    """Uniforms on (0, 1) (``jax.random.uniform`` from the smallest normal float: every log is finite)."""
    return jax.random.uniform(key, shape, minval=jnp.finfo(jnp.float64).tiny)


def log_gamma_from_uniforms(u, a):
    """log of Gamma(a, 1) draws (any shape ``a`` > 0) from ``u`` (GAMMA_UNIFORMS, *a.shape), independent
    uniforms on (0, 1): ``log_gamma_mt``'s Marsaglia-Tsang sampler (the law of
    ``inference.hlcr.common.sample_log_gamma``) with the proposals' standard normals by Box-Muller,
    sqrt(-2 log u1) cos(2 pi u2) (exact: a standard normal for independent uniform u1, u2), so a kernel draws every
    random number of a step in one call and compiles no erf_inv (~150 HLO instructions) and no random-bits function
    per draw (benchmarks/results.md, "hlcr_gibbs_sweep")."""
    T = GAMMA_TRIALS
    return log_gamma_mt(a, box_muller(u[:T], u[T:2 * T]), u[2 * T:3 * T], u[3 * T])


def box_muller(u1, u2):
    """Standard normals sqrt(-2 log u1) cos(2 pi u2) of independent uniforms on (0, 1) (Box & Muller 1958)."""
    return jnp.sqrt(-2.0 * jnp.log(u1)) * jnp.cos(2.0 * jnp.pi * u2)


def uniforms_size(shapes) -> int:
    """How many uniforms arrays of these ``shapes`` take."""
    return sum(math.prod(shape) for shape in shapes)


def split_uniforms(u, shapes) -> list:
    """Consecutive slices of the flat block ``u`` reshaped to ``shapes``, in order (its first
    ``uniforms_size(shapes)`` uniforms)."""
    out, at = [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append(u[at:at + size].reshape(shape))
        at += size
    return out
