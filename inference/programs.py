"""The one registry of compiled programs (and of the kernel factories whose functions key them).

JAX compiles a jitted function once per input shapes, but only for as long as the jitted object lives and is
called again: a program built anew for every fit is compiled anew for every fit. Every builder of a jitted
program in ``inference/`` (the loop's chunks, the NUTS and SVI programs, the log densities of the trees) and
every kernel factory (``kernel(cfg) -> (init, step, ...)``) is therefore decorated with ``@programs.cached``:

* what it returns is kept per value of its arguments (least recently used first out, ``maxsize`` per builder),
  so a second fit of the same configuration gets the same objects, and JAX's own cache does the rest;
* a function argument is keyed by what it computes, not by the object: a function by its code and the values
  it closed over, a ``functools.partial`` by its function and bound arguments (``program_key``). So a kernel
  factory that is not cached, and builds new closures for every fit, still meets the loop's programs of the
  first fit: "cache the kernel factory or the loop recompiles" holds by construction;
* an argument that cannot be a key (an unhashable model argument, a closure over an array that is not the one
  seen before) builds the program for this call only;
* ``builds()`` counts, per builder, how many times it ran (a miss, or a call that could not be cached), so a
  test can assert that a second fit builds nothing;
* ``clear()`` drops every kept program (their compiled executables go with them once nothing else holds them).

A fit compiles a few programs one after the other, and XLA's compile of one leaves part of the machine idle (the
tracing around it is single-threaded Python, and XLA releases the GIL while it compiles). A program whose argument
shapes are known before its turn comes is compiled ahead: ``compile_ahead(program, *args)`` lowers it
(``program.lower(*args)``, arguments concrete or ``jax.ShapeDtypeStruct``), runs XLA's compile of it in a
background thread while the caller traces, compiles or runs the program before it, and returns an ``Ahead``;
``ahead.result()`` waits for it and re-raises its error, the same exception object, in the caller. The jitted
``program``'s own cache is then warm: calling it on arguments of those shapes compiles nothing, so a fit calls its
programs as before, only after ``result()`` (a call while the compile is still under way would compile the program
a second time). Users: the tree's log densities (``inference.trees.densities_ahead``, started by ``inference.fit``
before the method runs) and SVI's Adam steps (compiled while its initialisation compiles). ``compiling_ahead(False)``
turns it off.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
import functools
import threading
import types
from collections.abc import Callable
from typing import Any

import numpy as np

_REGISTRY: dict[str, Cached] = {}
_BUILDS: collections.Counter = collections.Counter()
_LOCK = threading.RLock()
_MAX_DEPTH = 32


class _Unkeyable(Exception):
    """An argument that cannot be part of a key."""


def program_key(value: Any) -> Any:
    """The cache key of one argument: equal keys mean the same program.

    A function is keyed by its code, its defaults and the keys of the values in its closure's cells; a
    ``functools.partial`` by the key of its function and of its bound arguments; a tuple by its type and its
    elements' keys; a number by its type and value. Where a function's or a partial's contents cannot be keys,
    the object itself is (it is hashable: two fits that pass the same object share the program). Anything else
    is its own key; an unhashable one raises ``TypeError``."""
    try:
        return _key(value)
    except _Unkeyable as exc:
        raise TypeError(str(exc)) from None


def _key(value: Any, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:   # a closure that reaches itself
        raise _Unkeyable("nested too deep")
    down = functools.partial(_key, depth=depth + 1)
    if isinstance(value, types.FunctionType):
        try:
            cells = tuple(down(c.cell_contents) for c in value.__closure__ or ())
            defaults = down(value.__defaults__) if value.__defaults__ else None
            kwdefaults = down(tuple(sorted(value.__kwdefaults__.items()))) if value.__kwdefaults__ else None
            return ("closure", value.__code__, id(value.__globals__), cells, defaults, kwdefaults)
        except (_Unkeyable, ValueError):   # ValueError: an empty cell
            return value
    if isinstance(value, functools.partial):
        try:
            return ("partial", down(value.func), down(value.args), down(tuple(sorted(value.keywords.items()))))
        except _Unkeyable:
            return value
    if type(value) is tuple or (isinstance(value, tuple) and hasattr(value, "_fields")):
        return (type(value), tuple(down(v) for v in value))
    if isinstance(value, int | float | complex | np.generic):   # 1, 1.0 and True are equal, not the same program
        return (type(value), value)
    try:
        hash(value)
    except TypeError as exc:
        raise _Unkeyable(f"unhashable argument of type {type(value).__name__}") from exc
    return value


class Cached:
    """A registered builder: ``cached(*args, **kwargs)`` returns the kept result for these arguments or builds
    it (``__wrapped__`` is the builder itself)."""

    def __init__(self, builder: Callable, maxsize: int, name: str, argument_key: Callable | None = None) -> None:
        functools.update_wrapper(self, builder)
        self.name = name
        self.maxsize = maxsize
        self._argument_key = argument_key or (lambda v: v)
        self._kept: collections.OrderedDict = collections.OrderedDict()

    def __call__(self, *args, **kwargs):
        try:
            of = self._argument_key
            key = (program_key(tuple(of(a) for a in args)),
                   program_key(tuple(sorted((k, of(v)) for k, v in kwargs.items()))))
        except TypeError:
            key = None
        with _LOCK:
            if key is not None and key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        built = self.__wrapped__(*args, **kwargs)
        with _LOCK:
            _BUILDS[self.name] += 1
            if key is not None:
                self._kept[key] = built
                while len(self._kept) > self.maxsize:
                    self._kept.popitem(last=False)
        return built

    def cache_clear(self) -> None:
        with _LOCK:
            self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)


def cached(builder: Callable | None = None, *, maxsize: int = 32, argument_key: Callable | None = None):
    """Register ``builder`` (a function returning jitted programs, or a kernel factory) in the one registry:
    ``@programs.cached`` or ``@programs.cached(maxsize=16)``. ``argument_key(value)``: what stands for an
    argument in the key (default the value itself), e.g. a graph by its adjacency matrix's bytes."""

    def register(fn: Callable) -> Cached:
        name = f"{fn.__module__}.{fn.__qualname__}"
        with _LOCK:
            entry = _REGISTRY[name] = Cached(fn, maxsize, name, argument_key)
        return entry

    return register if builder is None else register(builder)


def clear() -> None:
    """Drop every kept program and kernel of every registered builder (counts are kept)."""
    with _LOCK:
        for entry in _REGISTRY.values():
            entry._kept.clear()


def builds() -> dict[str, int]:
    """How many times each registered builder has run in this process (misses and uncacheable calls)."""
    with _LOCK:
        return dict(_BUILDS)


def registered() -> dict[str, Cached]:
    """Every registered builder by name (``module.qualname``)."""
    with _LOCK:
        return dict(_REGISTRY)


# Compiler options of a program that a fit runs once, or whose run is short next to its compile: SVI's
# initialisation and its draws from the guide, NUTS's site mapper, and the loop's optimiser runs (VB, EM, ADMM: a
# few hundred cheap steps on a user's table). XLA's backend (LLVM) optimisation level 0 compiles such a program
# 1.5 to 2 times faster, and its run costs next to nothing either way (the demo's optimiser runs: 0.002 to 0.1 s of
# run against 0.5 to 2 s less compile). Semantics are unchanged (only the last bits of reductions may differ, as at
# the test suite's level 0). benchmarks/results.md, "compile_cold" and "opt_level".
ONE_SHOT: dict[str, int] = {"xla_backend_optimization_level": 0}
# XLA's defaults: a program whose run pays for its optimisation (NUTS's sampling, Gibbs sweeps, SVI's steps, a
# kernel whose step is dominated by dense linear algebra that level 0 runs several times slower).
OPTIMISED: dict[str, int] = {}


def options_key(options) -> tuple:
    """Compiler options as a key of a cached builder (a dict is not hashable): its sorted items."""
    return tuple(sorted(dict(options or {}).items()))


_AHEAD_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("compiling_ahead", default=True)
_AHEAD_WORKERS = 2   # background compiles at a time (a fit has at most two programs to compile ahead)
_ahead_pool: concurrent.futures.ThreadPoolExecutor | None = None


class Ahead:
    """A program compiled ahead (``compile_ahead``). ``result()`` waits for its compile and returns it
    (``jax.stages.Compiled``), or None where nothing was compiled ahead (``compiling_ahead(False)``: the caller's
    own call compiles it); an error of its lowering or compilation is raised there, the same exception object.
    ``args``: the arguments' shapes and dtypes it was compiled for (``jax.ShapeDtypeStruct``s). Used as a
    context manager, the block's end waits for the compile, so none is left running past the code that started
    it, and raises its error where neither ``result()`` nor ``discard()`` was called, unless the block itself
    raised."""

    def __init__(self, future: concurrent.futures.Future | None, name: str = "", args: Any = None) -> None:
        self._future = future
        self.name = name
        self.args = args
        self._consumed = False

    def result(self):
        self._consumed = True
        return None if self._future is None else self._future.result()

    def done(self) -> bool:
        """Whether the compile has ended (or none was started)."""
        return self._future is None or self._future.done()

    def compiled_for(self, *args: Any, **kwargs: Any) -> bool:
        """Whether this is the program for arguments of these shapes and dtypes."""
        return _shapes((args, kwargs)) == self.args

    def wait(self) -> None:
        """Wait for the compile to end, its outcome left to ``result()``."""
        if self._future is not None:
            concurrent.futures.wait([self._future])

    def discard(self) -> None:
        """Wait for the compile to end and set it aside: the caller does not use this program (its arguments
        turned out to have other shapes), so its outcome does not matter."""
        self.wait()
        self._consumed = True

    def __enter__(self) -> Ahead:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is not None or self._consumed:
            self.wait()
        else:
            self.result()

    def __repr__(self) -> str:
        state = "off" if self._future is None else ("done" if self.done() else "compiling")
        return f"Ahead({self.name or '?'}, {state})"


def _shapes(args: Any) -> Any:
    import jax

    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype if hasattr(a, "dtype")
                                                        else np.result_type(a)), args)


def compile_ahead(program: Callable, *args: Any, **kwargs: Any) -> Ahead:
    """Lower the jitted ``program`` for ``args`` here (concrete values or ``jax.ShapeDtypeStruct``s: only their
    shapes and dtypes count, as in a call), start XLA's compile of it in a background thread, and return its
    ``Ahead``. Call ``program`` only after ``Ahead.result()``: the call then finds it compiled (JAX's own cache
    of ``program``), and where that cache already holds it (a second fit) nothing is lowered or compiled here.
    The program is the one the call would build, with the same compiler options: results are unchanged.

    Only XLA's compile leaves the caller's thread: tracing runs the model's Python, and NumPyro's effect
    handlers live on one process-wide stack (``numpyro.primitives._PYRO_STACK``), which two threads tracing at
    once would mix up. An error of the lowering is kept for ``result()`` too, so it is raised where the program
    is used, as a plain call would raise it."""
    name = getattr(program, "__name__", "")
    if not _AHEAD_ENABLED.get():
        return Ahead(None, name, _shapes((args, kwargs)))
    global _ahead_pool
    with _LOCK:
        if _ahead_pool is None:
            _ahead_pool = concurrent.futures.ThreadPoolExecutor(_AHEAD_WORKERS, thread_name_prefix="compile-ahead")
    try:
        lowered = program.lower(*args, **kwargs)
    except Exception as exc:   # raised by result(), where the program is used
        future = concurrent.futures.Future()
        future.set_exception(exc)
    else:
        future = _ahead_pool.submit(contextvars.copy_context().run, lowered.compile)
    return Ahead(future, name, _shapes((args, kwargs)))


@contextlib.contextmanager
def compiling_ahead(enabled: bool):
    """Within this block ``compile_ahead`` starts background compiles (``True``, the default) or does nothing
    (``False``: every program compiles at its first call, one after the other)."""
    token = _AHEAD_ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _AHEAD_ENABLED.reset(token)


BUCKET_MIN = 8
_BUCKETING: contextvars.ContextVar[bool] = contextvars.ContextVar("bucketing", default=True)


def bucket(n: int, minimum: int = BUCKET_MIN) -> int:
    """The padded size of a data dimension of ``n`` rows: the next power of two, at least ``minimum`` (``n`` itself
    inside ``bucketing(False)``). So a bucket wastes less than half its rows."""
    n = int(n)
    if not _BUCKETING.get():
        return n
    return max(int(minimum), 1 << max(n - 1, 0).bit_length())


@contextlib.contextmanager
def bucketing(enabled: bool):
    """Within this block ``bucket`` pads (``True``, the default) or returns ``n`` unchanged (``False``)."""
    token = _BUCKETING.set(bool(enabled))
    try:
        yield
    finally:
        _BUCKETING.reset(token)


def pad_rows(*arrays, size: int | None = None):
    """``(padded arrays, mask)``: each array (NumPy, same leading length ``n``) padded along axis 0 to ``size``
    rows (default ``bucket(n)``) by copies of its last row, so every per-row term a kernel computes on a padded row
    stays finite, and ``mask`` (``size``,) float64: 1.0 on the ``n`` real rows, 0.0 on the padding. A kernel
    multiplies every per-row term by the mask (a padded row then adds exactly zero) and cuts per-row outputs back
    to ``n``."""
    arrays = [np.asarray(a) for a in arrays]
    n = arrays[0].shape[0]
    if any(a.shape[0] != n for a in arrays):
        raise ValueError(f"pad_rows: arrays of different lengths {[a.shape[0] for a in arrays]}")
    size = bucket(n) if size is None else int(size)
    if size < n or n == 0:
        raise ValueError(f"pad_rows: cannot pad {n} rows to {size}")
    padded = [np.concatenate([a, np.repeat(a[-1:], size - n, axis=0)]) if size > n else a for a in arrays]
    mask = np.zeros(size)
    mask[:n] = 1.0
    return (*padded, mask)
