"""The one loop that runs every hand-written kernel (the blackjax shape: kernels never loop themselves).

A kernel is a module with NamedTuples ``State`` and ``Info`` and pure functions

* ``init(key, problem) -> State``;
* ``step(key, state, problem) -> (State, Info)``, where ``Info.objective`` is the quantity the kernel
  reports at the state it returns (the bound / ELBO of a variational step, the log likelihood of an EM
  step, the log joint of a Gibbs sweep): **one name everywhere**;
* for variational kernels ``draw(key, state, n) -> (draws, log_q)``.

``problem`` is a pytree of arrays (the data and hyperparameters the kernel needs) and static numbers
closed over by the kernel's functions; it is passed as an argument, never closed over, so data sets of the
same shapes share one compiled program and the persistent compilation cache. The loop's programs are kept in
the registry of compiled programs (``inference.programs``), keyed by what the kernel's functions compute (their
code and the values they close over), so a second fit with a kernel of the same configuration compiles nothing
even where its factory built new closures.

This module runs them:

* ``run_until_converged``: optimisation kernels (VB, EM, ADMM), one stopping rule API (``StopRule``),
  restarts vectorised with ``vmap`` (the best final objective wins; one restart runs without ``vmap``),
  compiled chunks of at most ``chunk`` steps, each a ``while_loop`` that ends when every restart has stopped,
  with a progress bar between chunks (no bar: one chunk for the whole run); a run that has converged is
  frozen while the others go on, so the result equals a ``while_loop`` per restart.
  ``Info.may_stop`` (optional boolean field) vetoes the stopping rule at a step.
* ``sample_chains``: Markov kernels (Gibbs), ``num_chains`` chains vectorised, ``num_warmup`` steps
  dropped, every ``thinning``-th of the next ``num_samples * thinning`` steps kept (selected on the host).

Host round trips and dispatches are few on purpose (issue 17): every chunk costs one call and one transfer, the
start (key splitting and ``init``) is one compiled call, and nothing is indexed on the device per chunk.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from inference import programs
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
                        desc: str = "", init_state: Any = None, start_from_key: bool = False) -> Run:
    """Run ``step`` from ``init`` until ``rule`` stops it, for ``num_restarts`` restarts at once.

    Restart ``r`` starts from ``init(k_r, problem)`` (``k_r`` the r-th of ``jax.random.split(key,
    num_restarts)``; or from ``init_state``, a State with a leading restart axis) and its step ``t`` gets
    the key ``fold_in(k_r, t)``. Steps run in compiled chunks of at most ``chunk`` steps (default: with a
    progress bar, a twentieth of ``max_iter``, at least 50; without one, the whole of ``max_iter`` in one
    chunk unless its per-step ``Info`` would pass ``INFO_BUFFER_BYTES``: every chunk costs a host round
    trip); a restart whose rule has fired keeps its state and objective (its trace is cut at ``n_iter``);
    a chunk ends early once all have stopped. Raises ``FloatingPointError`` if the best objective is not
    finite. ``start_from_key`` (one restart only): the run starts from ``init(key, problem)`` itself, its steps
    keep the keys above (what an ``init_state`` of ``init(key, problem)`` gives, inside the compiled program).
    """
    if num_restarts < 1:
        raise ValueError(f"num_restarts: expected a positive integer, got {num_restarts!r}")
    if start_from_key and num_restarts != 1:
        raise ValueError(f"start_from_key: only for one restart, got num_restarts={num_restarts!r}")
    shown = progress_enabled(progress)
    if chunk is None:
        chunk = max(50, -(-rule.max_iter // 20)) if shown else rule.max_iter
    chunk = max(1, min(int(chunk), rule.max_iter))
    chunk_fn = _optimiser_chunk(step, rule, chunk, num_restarts == 1)
    first_fn = chunk_fn
    if init_state is None and chunk == rule.max_iter:   # one chunk: start and run in one program (one compile)
        first_fn = _optimiser_start_and_run(init, step, rule, chunk, num_restarts, start_from_key)
        keys = key
    elif init_state is None:
        keys, init_state = _optimiser_start(init, num_restarts, start_from_key)(key, problem)
    else:
        keys, init_state = jax.random.split(key, num_restarts), strongly_typed(init_state)
    carry = None if init_state is None else (init_state, *_fresh_flags(num_restarts))
    infos, taken = [], 0
    bar = tqdm(total=rule.max_iter, desc=desc, disable=not shown, leave=False)
    while taken < rule.max_iter:
        if taken == 0 and first_fn is not chunk_fn:
            keys, carry, info = first_fn(key, problem)
        else:
            carry, info = chunk_fn(carry, keys, problem)
        info, done = jax.device_get((info, carry[2]))
        infos.append(info)
        rows = jax.tree.leaves(info)[0].shape[0]
        taken += rows
        bar.update(min(rows, rule.max_iter - bar.n))
        if np.all(done):
            break
    bar.close()
    state, f, done, conv, it = carry
    finals, conv, it = jax.device_get((f, conv, it))
    best = int(np.argmax(np.where(np.isfinite(finals), finals, -np.inf)))
    if not np.isfinite(finals[best]):
        raise FloatingPointError(f"{desc or 'kernel'}: the objective became non-finite ({finals[best]})")
    n_iter = int(it[best])
    info = jax.tree.map(lambda *a: np.concatenate([b[:, best] for b in a], axis=0)[:n_iter], *infos)
    return Run(_pick(state, best), info, float(finals[best]), bool(conv[best]), n_iter, finals, best)


INFO_BUFFER_BYTES = 64 * 2**20   # the most a default chunk's per-step Info buffer may take (all restarts)


def _fresh_flags(num_restarts: int):
    """``_flags`` on the host, in NumPy (a compiled program takes them as it takes its own outputs; built with
    JAX operations one at a time, they compiled six small programs)."""
    return (np.full(num_restarts, -np.inf), np.zeros(num_restarts, bool), np.zeros(num_restarts, bool),
            np.zeros(num_restarts, np.int32))


def _flags(num_restarts: int):
    """(objective, done, converged, steps) before the first step, per restart."""
    return (jnp.full(num_restarts, -jnp.inf, dtype=float), jnp.zeros(num_restarts, bool),
            jnp.zeros(num_restarts, bool), jnp.zeros(num_restarts, jnp.int32))


@jax.jit
def _pick(tree, i):
    """Restart ``i`` of every leaf, in one compiled call (not one dispatch per leaf)."""
    return jax.tree.map(lambda a: a[i], tree)


@programs.cached(maxsize=64)
def _optimiser_start(init: Kernel, num_restarts: int, start_from_key: bool = False):
    """Key splitting and every restart's ``init`` in one compiled call: (keys, strongly typed states);
    ``start_from_key``: the one restart starts from ``init(key)``."""

    def start(key, problem):
        keys = jax.random.split(key, num_restarts)
        init_keys = key[None] if start_from_key else keys
        return keys, strongly_typed(jax.vmap(init, in_axes=(0, None))(init_keys, problem))

    return jax.jit(start)


def _one_restart_step(step: Kernel, rule: StopRule):
    """One step of one restart with the stopping rule: ``(state, f, done, conv, it), k, problem -> (carry,
    Info)``. A stopped restart (``done``) keeps its state, objective and step count."""

    def one(carry, k, problem):
        state, f, done, conv, it = carry
        new, info = step(jax.random.fold_in(k, it), state, problem)
        fired = rule.reached(f, info.objective, getattr(info, "residual", None)) & getattr(info, "may_stop", True)
        stop = fired | (it + 1 >= rule.max_iter)
        state = _freeze(done, state, new)
        conv = conv | (~done & fired)
        f = jnp.where(done, f, info.objective)
        it = jnp.where(done, it, it + 1)
        return (state, f, done | stop, conv, it), info

    return one


@programs.cached(maxsize=64)
def _optimiser_start_and_run(init: Kernel, step: Kernel, rule: StopRule, chunk: int, num_restarts: int,
                             start_from_key: bool = False):
    """``_optimiser_start`` then the first chunk (``_optimiser_chunk``), one compiled program: (keys, carry,
    Info buffer). Used when one chunk may cover the run (no progress bar): a separate start program cost a
    compilation of ``init`` of its own (gp_alps svi_concrete: 1.3 s of 10)."""
    start = _optimiser_start(init, num_restarts, start_from_key).__wrapped__
    run_chunk = _optimiser_chunk(step, rule, chunk, num_restarts == 1).__wrapped__

    def start_and_run(key, problem):
        keys, state = start(key, problem)
        return keys, *run_chunk((state, *_flags(num_restarts)), keys, problem)

    return jax.jit(start_and_run)


@programs.cached(maxsize=64)
def _optimiser_chunk(step: Kernel, rule: StopRule, chunk: int, single: bool):
    """One compiled chunk of at most ``rows`` steps for every restart (cached per kernel, rule and chunk, so
    repeated fits in one process trace once), ``rows = chunk`` unless the per-step ``Info`` of all restarts
    times ``chunk`` passes ``INFO_BUFFER_BYTES``: a ``while_loop`` that ends when every restart has stopped or
    ``rows`` steps are taken, so a run costs the steps it needs and no step pays for more than the loop's own
    test. Each step's ``Info`` goes to row ``i`` of a ``(rows, restarts, ...)`` buffer; rows after the loop
    ended stay zero and are never read (the trace is cut at ``n_iter``). ``single``: one restart, stepped
    without ``vmap`` (the restart axis is dropped inside the program). An ``Info`` with a boolean field
    ``may_stop`` vetoes the rule where it is False (a kernel whose convergence needs more than a small change
    of the objective)."""
    one = _one_restart_step(step, rule)
    every = jax.jit(one if single else jax.vmap(one, in_axes=(0, 0, None)))   # traced once: eval_shape + loop

    def run_chunk(carry, keys, problem):
        if single:
            carry, keys = jax.tree.map(lambda a: a[0], (carry, keys))
        shapes = jax.eval_shape(every, carry, keys, problem)[1]
        per_step = sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in jax.tree.leaves(shapes))
        rows = max(1, min(chunk, INFO_BUFFER_BYTES // max(per_step, 1)))
        buffer = jax.tree.map(lambda s: jnp.zeros((rows, *s.shape), s.dtype), shapes)

        def go_on(loop):
            i, carry, _ = loop
            return (i < rows) & ~jnp.all(carry[2])

        def body(loop):
            i, carry, buffer = loop
            carry, info = every(carry, keys, problem)
            buffer = jax.tree.map(lambda b, x: jax.lax.dynamic_update_index_in_dim(b, x, i, 0), buffer, info)
            return i + 1, carry, buffer

        _, carry, buffer = jax.lax.while_loop(go_on, body, (jnp.asarray(0, jnp.int32), carry, buffer))
        if single:
            carry = jax.tree.map(lambda a: a[None], carry)
            buffer = jax.tree.map(lambda a: a[:, None], buffer)
        return carry, buffer

    return jax.jit(run_chunk)


def sample_chains(init: Kernel, step: Kernel, problem: Any, key: jax.Array, *, num_chains: int,
                  num_warmup: int, num_samples: int, thinning: int = 1,
                  collect: Callable[[jax.Array, Any, Any], Any] | None = None, chunk: int | None = None,
                  progress: bool | None = None, desc: str = "", init_state: Any = None) -> tuple[Any, Any]:
    """Run ``num_chains`` chains of a Markov kernel for ``num_warmup + num_samples * thinning`` steps.

    Chain ``c`` starts from ``init(k_c, problem)`` (or ``init_state`` with a leading chain axis); step ``t``
    of every chain uses the ``t``-th of ``split(k_steps, total)``, split again per chain. After each step
    ``collect(key, state, info)`` (default: ``(state, info)``) gives what is kept: a pytree whose leaves
    come back as NumPy arrays with leading ``(chain, draw)`` axes, warm-up dropped and thinned on the host.
    Returns (kept, last state). One compiled scan body serves warm-up and sampling; it runs in chunks of
    ``chunk`` steps, the largest divisor of the total not above ``chunk`` (default: 100 with a progress
    bar; without one, as many as ``collect``'s per-step output allows within ``INFO_BUFFER_BYTES``).
    """
    total = num_warmup + num_samples * thinning
    if init_state is None:
        k_steps, init_state = _sampler_start(init, num_chains)(key, problem)
    else:
        k_steps, init_state = jax.random.split(key)[1], strongly_typed(init_state)
    collect = collect or _state_and_info
    one_step, run_chunk = _sampler_chunk(step, collect, num_chains)
    shown = progress_enabled(progress)
    if chunk is None and shown:
        chunk = 100
    elif chunk is None:
        out_shapes = jax.eval_shape(one_step, (init_state, problem), k_steps)[1]
        per_step = sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in jax.tree.leaves(out_shapes))
        chunk = max(1, INFO_BUFFER_BYTES // max(per_step, 1))
    chunk = _largest_divisor(total, min(int(chunk), total))
    keys = _step_keys(k_steps, total, chunk)
    carry, outs = (init_state, problem), []
    keep = np.arange(num_warmup + thinning - 1, total, thinning)
    bar = tqdm(total=total, desc=desc, disable=not shown, leave=False)
    for c in range(total // chunk):
        lo = c * chunk
        sel = keep[(keep >= lo) & (keep < lo + chunk)] - lo
        carry, out = run_chunk(carry, keys, c)
        if sel.size:
            out = jax.device_get(out)
            whole = sel.size == chunk   # thinning 1 past warm-up: the chunk as it is (no copy)
            outs.append(out if whole else jax.tree.map(lambda a, s=sel: a[s], out))
        bar.update(chunk)
    bar.close()
    kept = jax.tree.map(lambda *a: np.swapaxes(np.concatenate(a, axis=0), 0, 1), *outs)
    return kept, carry[0]


def _largest_divisor(total: int, at_most: int) -> int:
    """The largest divisor of ``total`` that is at most ``at_most`` (>= 1)."""
    small = [d for d in range(1, int(np.sqrt(total)) + 1) if total % d == 0]
    return max(d for d in small + [total // d for d in small] if d <= at_most)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _step_keys(k_steps, total: int, chunk: int):
    """The step keys ``split(k_steps, total)`` in rows of ``chunk`` (one compiled call)."""
    return jax.random.split(k_steps, total).reshape(total // chunk, chunk)


@programs.cached(maxsize=64)
def _sampler_start(init: Kernel, num_chains: int):
    """``k_init, k_steps = split(key)`` and every chain's ``init(split(k_init, num_chains)[c])`` in one
    compiled call: (k_steps, strongly typed states)."""

    def start(key, problem):
        k_init, k_steps = jax.random.split(key)
        return k_steps, strongly_typed(jax.vmap(init, in_axes=(0, None))(jax.random.split(k_init, num_chains),
                                                                         problem))

    return jax.jit(start)


@programs.cached(maxsize=64)
def _sampler_chunk(step: Kernel, collect: Callable, num_chains: int):
    """(one step, one chunk), compiled. A chunk is a scan over row ``c`` of the step keys (``keys[c]``, indexed
    inside the program: no dispatch per chunk), every chain vectorised. The problem rides in the carry (not
    closed over), so data sets of the same shapes share the program. The step is traced once for both
    (``eval_shape`` of its output and the scan body)."""

    def one(carry, k):
        state, problem = carry
        k_step, k_collect = jax.random.split(k)
        state, info = jax.vmap(step, in_axes=(0, 0, None))(jax.random.split(k_step, num_chains), state, problem)
        out = jax.vmap(collect)(jax.random.split(k_collect, num_chains), state, info)
        return (state, problem), out

    one = jax.jit(one)

    def run_chunk(carry, keys, c):
        return jax.lax.scan(one, carry, keys[c])

    return one, jax.jit(run_chunk)
