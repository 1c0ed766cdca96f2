"""The one loop that runs every hand-written kernel (the blackjax shape: kernels never loop themselves).

A kernel follows the typed contract of ``inference.base``: a cached factory ``kernel(config) -> Kernel`` of
pure functions, the key first,

* ``init(key, problem) -> State``;
* ``step(key, state, problem) -> (State, Info)``, where ``Info.objective`` is the quantity the kernel
  reports at the state it returns (the bound / ELBO of a variational step, the log likelihood of an EM
  step, the log joint of a Gibbs sweep): **one name everywhere**;
* for variational kernels ``draw(seed, state, num_samples, ...) -> (draws, log_q)`` (on the host); for samplers
  ``collect(key, state, info)`` and ``chains``.

``problem`` is a pytree of arrays (the data and hyperparameters the kernel needs) and static numbers
closed over by the kernel's functions; it is passed as an argument, never closed over, so data sets of the
same shapes share one compiled program and the persistent compilation cache. The loop's programs are kept in
the registry of compiled programs (``inference.programs``), keyed by what the kernel's functions compute (their
code and the values they close over), so a second fit with a kernel of the same configuration compiles nothing
even where its factory built new closures.

This module runs them:

* ``run_until_converged``: optimisation kernels (VB, EM, ADMM), one stopping rule API (``StopRule``),
  restarts vectorised with ``vmap`` (the best final objective wins; one restart runs without ``vmap``),
  calls of at most ``chunk`` steps, each a ``while_loop`` that ends when every restart has stopped, with a
  progress bar between calls (no bar: one call for the whole run); a run that has converged is frozen while
  the others go on, so the result equals a ``while_loop`` per restart.
  ``Info.may_stop`` (optional boolean field) vetoes the stopping rule at a step.
* ``sample_chains``: Markov kernels (Gibbs), ``num_chains`` chains vectorised (or one after another in each step:
  ``chains="map"``), ``num_warmup`` steps
  dropped, every ``thinning``-th of the next ``num_samples * thinning`` steps kept (selected in the program).
* ``draws_in_blocks``: draws from a fitted q through a compiled program of a fixed block of keys, so no program
  depends on ``num_samples``.

Each runs as **one** compiled program per kernel, whatever the budgets: ``max_iter``, ``tol``, ``num_warmup``,
``num_samples``, ``thinning`` and the key are arguments of the program, the start (key splitting and ``init``)
and the pick of the best restart are inside it, and its output buffer has a fixed number of rows (``ROWS``): a
longer run calls it again from its carry. Host round trips are few on purpose (issue 17): every call costs one
dispatch and one transfer, and nothing is indexed on the device between calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from inference import host_keys, programs
from inference.base import Collect, Init, Step
from inference.progress import progress_enabled


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


def _typed_like(old, new):
    """``new`` with the dtypes of ``old`` (strongly typed), as ``_freeze`` would give them: a loop's carry keeps
    its types."""

    def like(a, b):
        b = jnp.asarray(b)
        if b.dtype == a.dtype and not getattr(b, "weak_type", False):
            return b
        return jax.lax.convert_element_type(b, a.dtype)

    return jax.tree.map(like, old, new)


def strongly_typed(tree):
    """``tree`` with every weakly typed numeric leaf (a Python scalar, ``jnp.asarray(0.0)``, ``x * 2.0`` of one)
    made strongly typed, values and dtypes unchanged. A kernel's ``init`` often returns weak leaves that its
    ``step`` returns strong: ``lax.scan`` promotes the carry, so the chunk's *output* state has other types
    than its input, and the second call compiled the whole program again (benchmarks/results.md, "strongly typed
    carry")."""

    def strong(a):
        if isinstance(a, np.ndarray | np.generic):
            return a   # host arrays are strongly typed; jnp.asarray would compile a program per shape to copy them
        if isinstance(a, bool | int | float | complex):
            return np.asarray(a, jax.dtypes.canonicalize_dtype(jnp.result_type(a)))
        if jax.dtypes.issubdtype(jnp.result_type(a), jax.dtypes.extended):
            return a
        a = jnp.asarray(a)
        return jax.lax.convert_element_type(a, a.dtype) if a.weak_type else a

    return jax.tree.map(strong, tree)

def run_until_converged(init: Init, step: Step, problem: Any, key: jax.Array, rule: StopRule, *,
                        num_restarts: int = 1, chunk: int | None = None, progress: bool | None = None,
                        desc: str = "", init_state: Any = None, start_from_key: bool = False,
                        compiler_options: dict | None = None) -> Run:
    """Run ``step`` from ``init`` until ``rule`` stops it, for ``num_restarts`` restarts at once.

    Restart ``r`` starts from ``init(k_r, problem)`` (``k_r`` the r-th of ``jax.random.split(key,
    num_restarts)``; or from ``init_state``, a State with a leading restart axis) and its step ``t`` gets
    the key ``fold_in(k_r, t)``. The run is one compiled program (``_optimiser_program``), called once without a
    progress bar and once per ``chunk`` steps with one (default: a twentieth of ``max_iter``, at least 50); a
    call also ends when its per-step ``Info`` buffer is full (``ROWS`` steps, fewer where ``Info`` is large), and
    the next call goes on from its carry. ``max_iter``, ``tol`` and ``tol_residual`` are arguments of that
    program, not constants: fits that differ only in them, or in the key, share it. A restart whose rule has
    fired keeps its state and objective (its trace is cut at ``n_iter``); a call ends early once all have
    stopped. Raises ``FloatingPointError`` if the best objective is not finite. ``start_from_key`` (one restart
    only): the run starts from ``init(key, problem)`` itself, its steps keep the keys above.

    ``num_restarts`` stays a constant of the program: it is the width of the ``vmap`` over restarts (the shape of
    every state leaf), and padding it to a bucket would make every step of every fit compute the padded restarts.

    ``compiler_options`` (default ``programs.ONE_SHOT``: XLA's backend optimisation off): an optimiser's run is a
    few hundred cheap steps, so its program compiles faster at level 0 than its run gets slower; a kernel whose
    step is dominated by dense linear algebra, or that runs thousands of steps, passes ``programs.OPTIMISED``.
    """
    if num_restarts < 1:
        raise ValueError(f"num_restarts: expected a positive integer, got {num_restarts!r}")
    if start_from_key and num_restarts != 1:
        raise ValueError(f"start_from_key: only for one restart, got num_restarts={num_restarts!r}")
    max_iter = int(rule.max_iter)
    shown = progress_enabled(progress)
    if chunk is None:
        chunk = max(50, -(-max_iter // 20)) if shown else max_iter
    chunk = max(1, min(int(chunk), max_iter))
    fresh = init_state is None
    options = programs.ONE_SHOT if compiler_options is None else compiler_options
    program = _optimiser_program(init if fresh else None, step, rule.kind, rule.tol_residual is not None,
                                 num_restarts, start_from_key, programs.options_key(options))
    if fresh:
        state = _zeros_like(_start_shapes(init, num_restarts, start_from_key, key, problem))
    else:
        state = strongly_typed(init_state)
    carry = (state, *_fresh_flags(num_restarts))
    tol_residual = 0.0 if rule.tol_residual is None else rule.tol_residual
    infos, taken, start = [], 0, fresh
    bar = tqdm(total=max_iter, desc=desc, disable=not shown, leave=False)
    while taken < max_iter:
        budget = (np.int32(max_iter), np.float64(rule.tol), np.float64(tol_residual),
                  np.int32(min(chunk, max_iter - taken)))
        carry, info, rows, best, picked = program(carry, key, problem, budget, np.bool_(start))
        start = False
        info, done, rows = jax.device_get((info, carry[2], rows))
        rows = int(rows)
        infos.append(jax.tree.map(lambda a, r=rows: a[:r], info))
        taken += rows
        bar.update(min(rows, max_iter - bar.n))
        if np.all(done):
            break
    bar.close()
    _, f, done, conv, it = carry
    finals, conv, it, best = jax.device_get((f, conv, it, best))
    best = int(best)
    if not np.isfinite(finals[best]):
        raise FloatingPointError(f"{desc or 'kernel'}: the objective became non-finite ({finals[best]})")
    n_iter = int(it[best])
    info = jax.tree.map(lambda *a: np.concatenate([b[:, best] for b in a], axis=0)[:n_iter], *infos)
    return Run(picked, info, float(finals[best]), bool(conv[best]), n_iter, finals, best)


INFO_BUFFER_BYTES = 64 * 2**20   # the most one call's per-step output buffer may take (all restarts or chains)
ROWS = 1024   # steps (optimiser) or kept draws (sampler) one call buffers at most: fixed, so no budget shapes it


def _fresh_flags(num_restarts: int):
    """(objective, done, converged, steps) before the first step, per restart, in NumPy on the host (a compiled
    program takes them as it takes its own outputs; built with JAX operations one at a time, they compiled six
    small programs)."""
    return (np.full(num_restarts, -np.inf), np.zeros(num_restarts, bool), np.zeros(num_restarts, bool),
            np.zeros(num_restarts, np.int32))


def _flags(num_restarts: int):
    """``_fresh_flags`` inside a program."""
    return (jnp.full(num_restarts, -jnp.inf, dtype=float), jnp.zeros(num_restarts, bool),
            jnp.zeros(num_restarts, bool), jnp.zeros(num_restarts, jnp.int32))


def _zeros_like(shapes):
    """Host zeros of these shapes and dtypes (a key leaf: the key of zero words), the carry a fresh run's first
    call replaces by its own start (the program's argument types, nothing more)."""

    def zero(s):
        if jax.dtypes.issubdtype(s.dtype, jax.dtypes.prng_key):
            data = jax.eval_shape(jax.random.key_data, s)
            return jax.random.wrap_key_data(np.zeros(data.shape, data.dtype), impl=s.dtype._impl)
        return np.zeros(s.shape, s.dtype)

    return jax.tree.map(zero, shapes)


def _shape_key(tree) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(np.shape(a)), str(jax.numpy.result_type(a)), getattr(a, "weak_type", False))
                          for a in leaves)


_SHAPES: dict = {}


def _start_shapes(init: Init, width: int, start_from_key: bool, key, problem, chains: bool = False,
                  sequential: bool = False):
    """The shapes and dtypes of every restart's (or chain's) strongly typed ``init`` state, traced abstractly
    once per kernel and problem shapes (kept, so a second fit traces nothing)."""
    cache_key = (programs.program_key(init), width, start_from_key, chains, sequential, _shape_key((key, problem)))
    if cache_key not in _SHAPES:
        start = (_sampler_start_fn(init, width, sequential) if chains
                 else _optimiser_start_fn(init, width, start_from_key))
        _SHAPES[cache_key] = jax.eval_shape(start, key, problem)
        while len(_SHAPES) > 256:
            _SHAPES.pop(next(iter(_SHAPES)))
    return _SHAPES[cache_key]


@programs.cached(maxsize=64)
def _optimiser_start_fn(init: Init, num_restarts: int, start_from_key: bool):
    """Every restart's ``init`` from ``key`` (strongly typed states with a leading restart axis); jitted and kept,
    so that ``_start_shapes`` and the program's start share one trace of ``init`` (a nested jit's trace is cached
    by its argument types)."""

    def start(key, problem):
        init_keys = key[None] if start_from_key else jax.random.split(key, num_restarts)
        return strongly_typed(jax.vmap(init, in_axes=(0, None))(init_keys, problem))

    return jax.jit(start, inline=True)


def _one_restart_step(step: Step, rule: StopRule, single: bool = False):
    """One step of one restart with the stopping rule: ``(state, f, done, conv, it), k, problem -> (carry,
    Info)``. A stopped restart (``done``) keeps its state, objective and step count. ``single``: the run's only
    restart, which ``_optimiser_program``'s loop steps only while it has not stopped, so it is never frozen (the
    per-leaf selects of ``_freeze`` were one XLA kernel per state leaf)."""

    def one(carry, k, problem):
        state, f, done, conv, it = carry
        new, info = step(jax.random.fold_in(k, it), state, problem)
        fired = rule.reached(f, info.objective, getattr(info, "residual", None)) & getattr(info, "may_stop", True)
        stop = fired | (it + 1 >= rule.max_iter)
        if single:   # the loop steps a lone restart only while it runs: done is False here, nothing to freeze
            return (_typed_like(state, new), _typed_like(f, info.objective), stop, conv | fired, it + 1), info
        state = _freeze(done, state, new)
        conv = conv | (~done & fired)
        f = jnp.where(done, f, info.objective)
        it = jnp.where(done, it, it + 1)
        return (state, f, done | stop, conv, it), info

    return one


def empty_buffer(shapes, rows: int):
    """A zero buffer of ``rows`` rows of every leaf of ``shapes`` (per-step outputs, kept draws)."""
    return jax.tree.map(lambda s: jnp.zeros((rows, *s.shape), s.dtype), shapes)


def is_kept(t, num_warmup, thinning):
    """Whether transition ``t`` (from 0) gives a kept draw: past the warm-up, every ``thinning``-th."""
    return (t >= num_warmup) & ((t - num_warmup + 1) % thinning == 0)


def _buffer_rows(shapes, leading: int = 1) -> int:
    """Rows of a per-step output buffer: ``ROWS``, fewer where a row of ``shapes`` would pass
    ``INFO_BUFFER_BYTES``."""
    per_step = sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in jax.tree.leaves(shapes)) * leading
    return max(1, min(ROWS, INFO_BUFFER_BYTES // max(per_step, 1)))


@programs.cached(maxsize=64)
def _optimiser_program(init: Init | None, step: Step, kind: str, residual: bool, num_restarts: int,
                       start_from_key: bool = False, options: tuple = ()):
    """The whole optimiser run as one compiled program of ``(carry, key, problem, budget, start)``, cached per
    kernel, rule kind, restart count and compiler options (``options``: their sorted items) (so repeated fits in
    one process trace once). ``budget = (max_iter,
    tol, tol_residual, limit)`` are arguments: fits that differ only in them share the program.

    ``start`` (a fresh run's first call; ``init`` given): the carry is replaced by every restart's ``init``
    (``jax.random.split(key, num_restarts)``, or ``key`` itself with ``start_from_key``) and fresh flags, inside
    the program (``lax.cond``), so a run that needs several calls (a progress bar, a long run) still compiles one
    program. Then a ``while_loop`` of at most ``limit`` steps that ends when every restart has stopped or its
    buffer is full (``_buffer_rows``): each step's ``Info`` goes to row ``i`` of a ``(rows, restarts, ...)``
    buffer; rows from ``i`` on are zero and never read. One restart is stepped without ``vmap`` (the restart
    axis is dropped inside the program). An ``Info`` with a boolean field ``may_stop`` vetoes the rule where it
    is False (a kernel whose convergence needs more than a small change of the objective). Returns (carry,
    buffer, steps taken ``i``, the best restart (highest finite objective), its state): the pick of the best
    restart is part of the program, not a program of its own."""
    single = num_restarts == 1
    start_fn = None if init is None else _optimiser_start_fn(init, num_restarts, start_from_key)

    def every_restart(carry, keys, problem, budget):
        max_iter, tol, tol_residual, _ = budget
        one = _one_restart_step(step, StopRule(max_iter, tol, kind, tol_residual if residual else None), single)
        return one(carry, keys, problem) if single else jax.vmap(one, in_axes=(0, 0, None))(carry, keys, problem)

    # jitted inside the program so that the buffer's shapes (``eval_shape``) and the loop's body share one trace of
    # the step (a nested jit's trace is cached by its argument types): tracing a large step twice cost 0.1-0.3 s
    every = jax.jit(every_restart, inline=True)

    def optimiser_run(carry, key, problem, budget, start):
        limit = budget[3]
        keys = jax.random.split(key, num_restarts)
        if start_fn is not None:
            carry = jax.lax.cond(start, lambda: (start_fn(key, problem), *_flags(num_restarts)), lambda: carry)
        if single:
            carry, keys = jax.tree.map(lambda a: a[0], (carry, keys))
        shapes = jax.eval_shape(every, carry, keys, problem, budget)[1]
        rows = _buffer_rows(shapes)
        buffer = empty_buffer(shapes, rows)

        def go_on(loop):
            i, carry, _ = loop
            return (i < rows) & (i < limit) & ~jnp.all(carry[2])

        def body(loop):
            i, carry, buffer = loop
            carry, info = every(carry, keys, problem, budget)
            buffer = jax.tree.map(lambda b, x: jax.lax.dynamic_update_index_in_dim(b, x, i, 0), buffer, info)
            return i + 1, carry, buffer

        i, carry, buffer = jax.lax.while_loop(go_on, body, (jnp.asarray(0, jnp.int32), carry, buffer))
        if single:
            carry = jax.tree.map(lambda a: a[None], carry)
            buffer = jax.tree.map(lambda a: a[:, None], buffer)
        f = carry[1]
        best = jnp.argmax(jnp.where(jnp.isfinite(f), f, -jnp.inf))
        return carry, buffer, i, best, jax.tree.map(lambda a: a[best], carry[0])

    return jax.jit(optimiser_run, compiler_options=dict(options))


def sample_chains(init: Init, step: Step, problem: Any, key: jax.Array, *, num_chains: int,
                  num_warmup: int, num_samples: int, thinning: int = 1,
                  collect: Collect | None = None, chunk: int | None = None,
                  progress: bool | None = None, desc: str = "", init_state: Any = None,
                  chains: str = "vmap") -> tuple[Any, Any]:
    """Run ``num_chains`` chains of a Markov kernel for ``num_warmup + num_samples * thinning`` steps.

    Chain ``c`` starts from ``init(k_c, problem)`` (``k_c`` the c-th of ``split(k_init, num_chains)``, ``k_init,
    k_steps = split(key)``; or from ``init_state`` with a leading chain axis); step ``t`` of every chain uses
    ``fold_in(k_steps, t)`` (the ``t``-th of ``split(k_steps, total)``), split again per chain. After each step
    ``collect(key, state, info)`` (default: ``(state, info)``) gives what is kept: a pytree whose leaves
    come back as NumPy arrays with leading ``(chain, draw)`` axes, the warm-up dropped and every ``thinning``-th
    step kept inside the program. Returns (kept, last state). The run is one compiled program
    (``_sampler_program``) whose budgets (``num_warmup``, ``num_samples``, ``thinning``) are arguments, called
    once per ``chunk`` steps (default: 100 with a progress bar; without one, the whole run) or until its buffer
    of kept draws is full (``ROWS`` draws, fewer where a draw is large); the next call goes on from its carry.
    ``num_chains`` is a constant of the program (the ``vmap`` width).

    ``chains``: ``"vmap"`` (default) steps the chains at once, batched; ``"map"`` one after another in each step
    (``lax.map``: the same keys, so the same chains up to rounding). The batched step can take about twice as long
    to compile as the step alone; the mapped program holds the unbatched step and runs the chains' steps in
    sequence: for a kernel whose step is short or sequential (a scan) that costs little run time and saves compile
    time. A per-kernel choice; a long run of dense steps is better batched.
    """
    if chains not in CHAINS:
        raise ValueError(f"chains: expected one of {CHAINS}, got {chains!r}")
    total = num_warmup + num_samples * thinning
    collect = collect or _state_and_info
    fresh = init_state is None
    program = _sampler_program(init if fresh else None, step, collect, num_chains, chains == "map")
    if fresh:
        state = _zeros_like(_start_shapes(init, num_chains, False, key, problem, chains=True,
                                              sequential=chains == "map"))
    else:
        state = strongly_typed(init_state)
    shown = progress_enabled(progress)
    if chunk is None:
        chunk = 100 if shown else total
    chunk = max(1, int(chunk))
    outs, t, start = [], 0, fresh
    bar = tqdm(total=total, desc=desc, disable=not shown, leave=False)
    while t < total:
        budget = (np.int32(num_warmup), np.int32(thinning), np.int32(total), np.int32(t), np.int32(chunk))
        state, out, t_next, kept = program(state, key, problem, budget, np.bool_(start))
        start = False
        t_next, kept = (int(v) for v in jax.device_get((t_next, kept)))
        if kept:
            outs.append(jax.tree.map(lambda a, k=kept: a[:k], jax.device_get(out)))
        bar.update(t_next - t)
        t = t_next
    bar.close()
    kept = jax.tree.map(lambda *a: np.swapaxes(np.concatenate(a, axis=0), 0, 1), *outs)
    return kept, state


CHAINS = ("vmap", "map")


@programs.cached(maxsize=64)
def _sampler_start_fn(init: Init, num_chains: int, sequential: bool = False):
    """Every chain's ``init(split(k_init, num_chains)[c])``, ``k_init = split(key)[0]`` (strongly typed), batched
    (``vmap``) or one chain after another (``sequential``: ``lax.map``)."""

    def start(key, problem):
        k_init = jax.random.split(key)[0]
        keys = jax.random.split(k_init, num_chains)
        if sequential:
            return strongly_typed(jax.lax.map(lambda k: init(k, problem), keys))
        return strongly_typed(jax.vmap(init, in_axes=(0, None))(keys, problem))

    return jax.jit(start, inline=True)   # kept and jitted: one trace of ``init`` (``_optimiser_start_fn``)


@programs.cached(maxsize=64)
def _sampler_program(init: Init | None, step: Step, collect: Collect, num_chains: int,
                     sequential: bool = False):
    """The whole sampler run as one compiled program of ``(state, key, problem, budget, start)``, ``budget =
    (num_warmup, thinning, total, t0, limit)``: fits that differ only in these or in the key share it.
    ``start`` (a fresh run's first call): the state is replaced by every chain's ``init`` (``lax.cond``). Then a
    ``while_loop`` over steps ``t = t0, ...`` that ends at ``total``, after ``limit`` steps, or when its buffer
    of kept draws is full (``_buffer_rows``). Step ``t`` uses ``k = fold_in(k_steps, t)``: ``k_step, k_collect =
    split(k)``, every chain's step with ``split(k_step, num_chains)`` and its ``collect`` with
    ``split(k_collect, num_chains)``; the step's output is written to row ``j`` of the buffer and ``j`` moves on
    where the step is kept (past the warm-up, every ``thinning``-th). The problem is an argument (not closed
    over), so data sets of the same shapes share the program. ``sequential``: the chains' init, step and collect
    run one chain after another (``lax.map``) instead of batched (``vmap``), with the same keys. Returns (state,
    buffer, next ``t``, rows kept)."""
    start_fn = None if init is None else _sampler_start_fn(init, num_chains, sequential)

    def one(state, problem, k):
        k_step, k_collect = jax.random.split(k)
        step_keys, collect_keys = jax.random.split(k_step, num_chains), jax.random.split(k_collect, num_chains)
        if sequential:
            def chain(args):
                k_s, k_c, s = args
                s, info = step(k_s, s, problem)
                return s, collect(k_c, s, info)

            return jax.lax.map(chain, (step_keys, collect_keys, state))
        state, info = jax.vmap(step, in_axes=(0, 0, None))(step_keys, state, problem)
        out = jax.vmap(collect)(collect_keys, state, info)
        return state, out

    # one trace of the step for the buffer's shapes and the loop's body (``_optimiser_program``)
    one = jax.jit(one, inline=True)

    def sampler_run(state, key, problem, budget, start):
        num_warmup, thinning, total, t0, limit = budget
        k_steps = jax.random.split(key)[1]
        if start_fn is not None:
            state = jax.lax.cond(start, lambda: start_fn(key, problem), lambda: state)
        shapes = jax.eval_shape(one, state, problem, k_steps)[1]
        rows = _buffer_rows(shapes)
        buffer = empty_buffer(shapes, rows)
        end = jnp.minimum(total, t0 + limit)

        def go_on(loop):
            t, j, _, _ = loop
            return (t < end) & (j < rows)

        def body(loop):
            t, j, state, buffer = loop
            state, out = one(state, problem, jax.random.fold_in(k_steps, t))
            buffer = jax.tree.map(lambda b, x: jax.lax.dynamic_update_index_in_dim(b, x, j, 0), buffer, out)
            kept = is_kept(t, num_warmup, thinning)
            return t + 1, j + kept.astype(jnp.int32), state, buffer

        t, j, state, buffer = jax.lax.while_loop(go_on, body, (t0, jnp.asarray(0, jnp.int32), state, buffer))
        return state, buffer, t, j

    return jax.jit(sampler_run)


DRAW_BLOCK = 64   # draws per call of a draw program (fixed: no num_samples shapes the program)


def draws_in_blocks(draw_block: Callable, key: jax.Array, num_samples: int, *args, block: int = DRAW_BLOCK):
    """``num_samples`` draws from a compiled ``draw_block(keys, *args) -> (per_draw, extra)``: draw ``i`` is
    seeded with ``split(key, n)[i]`` (``fold_in(key, i)``, made on the host: ``inference.host_keys``), ``block``
    keys per call, the last block padded with further keys and its extra draws cut, so the program does not
    depend on ``num_samples``. ``per_draw``: a pytree with a leading draw axis; ``extra``: anything the program
    computes once (e.g. the fitted parameters), taken from the last call. Returns (per_draw as NumPy arrays with
    ``num_samples`` rows, extra)."""
    n_blocks = -(-num_samples // block)
    words = host_keys.words(host_keys.split(key, n_blocks * block))
    words = words.reshape(n_blocks, block, *words.shape[1:])
    outs = [jax.device_get(draw_block(host_keys.wrap(w), *args)) for w in words]
    per_draw = jax.tree.map(lambda *a: np.concatenate([np.asarray(b) for b in a])[:num_samples],
                            *[o[0] for o in outs])
    return per_draw, outs[-1][1]
