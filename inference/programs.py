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

JAX compiles one program per input shapes, so every data set of another size is another program. A kernel whose
run is a sum over rows (observations) takes its data padded to ``bucket(n)`` rows (``pad_rows``) with a 0/1 row
mask, and weights every per-row term by it: data sets of similar size then share one program (the test suite's
tiny data sets, the demo's simulated and real data where their other dimensions agree). What a user sees has the
original sizes: the kernel cuts per-row outputs back to ``n``. ``bucketing(False)`` turns the padding off
(``bucket(n) == n``), for tests that compare a padded run with the unpadded one.
"""

from __future__ import annotations

import collections
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
