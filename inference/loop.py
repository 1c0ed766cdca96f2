"""The one loop that runs every hand-written kernel (the blackjax shape: kernels never loop themselves).

A kernel is a module with NamedTuples ``State`` and ``Info`` and pure functions

* ``init(key, problem) -> State``;
* ``step(key, state, problem) -> (State, Info)``, where ``Info.objective`` is the quantity the kernel
  reports at the state it returns (the bound / ELBO of a variational step, the log likelihood of an EM
  step, the log joint of a Gibbs sweep): **one name everywhere**;
* for variational kernels ``draw(key, state, n) -> (draws, log_q)``.

``problem`` is a pytree of arrays (the data and hyperparameters the kernel needs) and static numbers
closed over by the kernel's functions; it is passed as an argument, never closed over, so data sets of the
same shapes share one compiled program and the persistent compilation cache.

This module runs them:

* ``run_until_converged``: optimisation kernels (VB, EM, ADMM), one stopping rule API (``StopRule``),
  restarts vectorised with ``vmap`` (the best final objective wins), chunks of ``chunk`` jit-compiled
  steps with a progress bar between chunks; a run that has converged is frozen while the others go on,
  so the result equals a ``while_loop`` per restart; steps after every restart has stopped are skipped.
  ``Info.may_stop`` (optional boolean field) vetoes the stopping rule at a step.
* ``sample_chains``: Markov kernels (Gibbs), ``num_chains`` chains vectorised, ``num_warmup`` steps
  dropped, every ``thinning``-th of the next ``num_samples * thinning`` steps kept.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from inference.progress import progress_enabled

Kernel = Callable[..., Any]


class StopRule(NamedTuple):
    """When a run of an optimisation kernel stops: after ``max_iter`` steps, or at the first step ``t >= 2``
    where ``|f_t - f_{t-1}| <= tol * scale`` (``f`` the objective; ``scale = |f_t|`` for
    ``kind="relative"``, 1 for ``"absolute"``). ``tol = 0`` never stops early. ``kind="increase"`` stops on
    the relative *increase* ``f_t - f_{t-1} <= tol |f_t|`` (a monotone bound: a decrease also stops, and
    the trace shows it). ``tol_residual`` (consensus ADMM): the rule also needs ``Info.residual <
    tol_residual`` (a joint rule: the objective settles long before the nodes agree)."""

    max_iter: int
    tol: float = 0.0
    kind: str = "relative"
    tol_residual: float | None = None

    def reached(self, previous, current, residual=None):
        change = current - previous if self.kind == "increase" else jnp.abs(current - previous)
        scale = 1.0 if self.kind == "absolute" else jnp.abs(current)
        fired = (self.tol > 0) & jnp.isfinite(previous) & (change <= self.tol * scale)
        if self.tol_residual is not None:
            fired = fired & (residual < self.tol_residual)
        return fired


class Run(NamedTuple):
    """What ``run_until_converged`` returns, for the best restart (highest final objective)."""

    state: Any
    info: Any             # per-step Info of the best restart, stacked over its ``n_iter`` steps (host arrays)
    objective: float      # Info.objective after the last step
    converged: bool       # stopped by the rule before max_iter
    n_iter: int
    objective_per_restart: np.ndarray
    best: int


def _state_and_info(key, state, info):
    return state, info


def _freeze(done, old, new):
    return jax.tree.map(lambda a, b: jnp.where(done, a, b), old, new)


def strongly_typed(tree):
    """``tree`` with every weakly typed numeric leaf (a Python scalar, ``jnp.asarray(0.0)``, ``x * 2.0`` of one)
    made strongly typed, values and dtypes unchanged. A kernel's ``init`` often returns weak leaves that its
    ``step`` returns strong: ``lax.scan`` promotes the carry, so the chunk's *output* state has other types
    than its input, and the second chunk compiled the whole program again (measured: ssgp vb on 48 points
    compiled ``run_chunk`` twice, 4.9 s + 7.0 s)."""

    def strong(a):
        if jax.dtypes.issubdtype(jnp.result_type(a), jax.dtypes.extended):
            return a
        a = jnp.asarray(a)
        return jax.lax.convert_element_type(a, a.dtype) if a.weak_type else a

    return jax.tree.map(strong, tree)

def run_until_converged(init: Kernel, step: Kernel, problem: Any, key: jax.Array, rule: StopRule, *,
                        num_restarts: int = 1, chunk: int | None = None, progress: bool | None = None,
                        desc: str = "", init_state: Any = None) -> Run:
    """Run ``step`` from ``init`` until ``rule`` stops it, for ``num_restarts`` restarts at once.

    Restart ``r`` starts from ``init(k_r, problem)`` (``k_r`` the r-th of ``jax.random.split(key,
    num_restarts)``; or from ``init_state``, a State with a leading restart axis) and its step ``t`` gets
    the key ``fold_in(k_r, t)``. Steps run in compiled chunks of ``chunk`` (default: a twentieth of
    ``max_iter``, at least 50: every chunk costs a host round trip); a restart whose rule has
    fired keeps its state and objective (its trace repeats the last value, then is cut at ``n_iter``);
    the loop ends when all have stopped. Raises ``FloatingPointError`` if the best objective is not finite.
    """
    if num_restarts < 1:
        raise ValueError(f"num_restarts: expected a positive integer, got {num_restarts!r}")
    keys = jax.random.split(key, num_restarts)
    init_state = _vmapped_init(init)(keys, problem) if init_state is None else strongly_typed(init_state)
    chunk = max(50, -(-rule.max_iter // 20)) if chunk is None else chunk
    chunk = max(1, min(int(chunk), rule.max_iter))
    chunk_fn = _optimiser_chunk(step, rule, chunk)
    f = jnp.full(num_restarts, -jnp.inf, dtype=float)
    done = jnp.zeros(num_restarts, bool)
    conv = jnp.zeros(num_restarts, bool)
    it = jnp.zeros(num_restarts, jnp.int32)
    state, infos = init_state, []
    bar = tqdm(total=rule.max_iter, desc=desc, disable=not progress_enabled(progress), leave=False)
    for _ in range(-(-rule.max_iter // chunk)):
        (state, f, done, conv, it, _), info = chunk_fn(state, f, done, conv, it, keys, problem)
        infos.append(jax.device_get(info))
        bar.update(min(chunk, rule.max_iter - bar.n))
        if bool(jnp.all(done)):
            break
    bar.close()
    finals = np.asarray(f)
    best = int(np.argmax(np.where(np.isfinite(finals), finals, -np.inf)))
    if not np.isfinite(finals[best]):
        raise FloatingPointError(f"{desc or 'kernel'}: the objective became non-finite ({finals[best]})")
    n_iter = int(it[best])
    info = jax.tree.map(lambda *a: np.concatenate(a, axis=1)[best, :n_iter], *infos)
    return Run(jax.tree.map(lambda a: a[best], state), info, float(finals[best]), bool(conv[best]), n_iter,
               finals, best)


@functools.lru_cache(maxsize=64)
def _vmapped_init(init: Kernel):
    def init_all(keys, problem):
        return strongly_typed(jax.vmap(init, in_axes=(0, None))(keys, problem))

    return jax.jit(init_all)


@functools.lru_cache(maxsize=64)
def _optimiser_chunk(step: Kernel, rule: StopRule, chunk: int):
    """One compiled chunk of ``chunk`` steps for every restart (cached per kernel, rule and chunk, so
    repeated fits in one process trace once). Once every restart has stopped, the remaining steps of the
    chunk are skipped (``lax.cond`` on all restarts), so a run costs the steps it needs, not whole chunks.
    An ``Info`` with a boolean field ``may_stop`` vetoes the rule where it is False (a kernel whose
    convergence needs more than a small change of the objective)."""

    def one(state, f, done, conv, it, k, problem):
        new, info = step(jax.random.fold_in(k, it), state, problem)
        fired = rule.reached(f, info.objective, getattr(info, "residual", None)) & getattr(info, "may_stop", True)
        stop = fired | (it + 1 >= rule.max_iter)
        state = _freeze(done, state, new)
        conv = conv | (~done & fired)
        f = jnp.where(done, f, info.objective)
        it = jnp.where(done, it, it + 1)
        return (state, f, done | stop, conv, it), info

    every = jax.vmap(one, in_axes=(0, 0, 0, 0, 0, 0, None))

    def run_chunk(state, f, done, conv, it, k, problem):
        def body(carry, _):
            shapes = jax.eval_shape(every, *carry, k, problem)[1]
            idle = lambda c: (c, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))
            return jax.lax.cond(jnp.all(carry[2]), idle, lambda c: every(*c, k, problem), carry)

        carry, info = jax.lax.scan(body, (state, f, done, conv, it), None, length=chunk)
        return (*carry, k), jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), info)

    return jax.jit(run_chunk)


def sample_chains(init: Kernel, step: Kernel, problem: Any, key: jax.Array, *, num_chains: int,
                  num_warmup: int, num_samples: int, thinning: int = 1,
                  collect: Callable[[jax.Array, Any, Any], Any] | None = None, chunk: int = 100,
                  progress: bool | None = None, desc: str = "", init_state: Any = None) -> tuple[Any, Any]:
    """Run ``num_chains`` chains of a Markov kernel for ``num_warmup + num_samples * thinning`` steps.

    Chain ``c`` starts from ``init(k_c, problem)`` (or ``init_state`` with a leading chain axis); step ``t``
    of every chain uses the ``t``-th of ``split(k_steps, total)``, split again per chain. After each step
    ``collect(key, state, info)`` (default: ``(state, info)``) gives what is kept: a pytree whose leaves
    come back with leading ``(chain, draw)`` axes, warm-up dropped and thinned. Returns (kept, last
    state). One compiled scan body serves warm-up and sampling.
    """
    k_init, k_steps = jax.random.split(key)
    if init_state is None:
        init_state = _vmapped_init(init)(jax.random.split(k_init, num_chains), problem)
    init_state = strongly_typed(init_state)
    collect = collect or _state_and_info
    total = num_warmup + num_samples * thinning

    chunk = max(d for d in range(1, min(chunk, total) + 1) if total % d == 0)
    run_chunk = _sampler_chunk(step, collect, num_chains)
    keys = jax.random.split(k_steps, total).reshape(total // chunk, chunk)
    carry, outs = (init_state, problem), []
    keep = np.arange(num_warmup + thinning - 1, total, thinning)
    bar = tqdm(total=total, desc=desc, disable=not progress_enabled(progress), leave=False)
    for c in range(total // chunk):
        carry, out = run_chunk(carry, keys[c])
        lo = c * chunk
        sel = keep[(keep >= lo) & (keep < lo + chunk)] - lo
        if sel.size:
            outs.append(jax.tree.map(lambda a, s=sel: a[s], out))
        bar.update(chunk)
    bar.close()
    kept = jax.tree.map(lambda *a: jnp.swapaxes(jnp.concatenate(a, axis=0), 0, 1), *outs)
    return kept, carry[0]


@functools.lru_cache(maxsize=64)
def _sampler_chunk(step: Kernel, collect: Callable, num_chains: int):
    """One compiled scan over a chunk of step keys, every chain vectorised. The problem rides in the carry
    (not closed over), so data sets of the same shapes share the program."""

    def one(carry, k):
        state, problem = carry
        k_step, k_collect = jax.random.split(k)
        state, info = jax.vmap(step, in_axes=(0, 0, None))(jax.random.split(k_step, num_chains), state, problem)
        out = jax.vmap(collect)(jax.random.split(k_collect, num_chains), state, info)
        return (state, problem), out

    def run_chunk(carry, keys):
        return jax.lax.scan(one, carry, keys)

    return jax.jit(run_chunk)
