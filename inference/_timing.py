"""Compile time measured apart from run time, for every method.

JAX reports each tracing, lowering and XLA-compilation step as a time span through
``jax.monitoring``; ``Stopwatch`` collects the spans that fall inside it and takes the length of their
union (nested spans, e.g. an inner ``jit`` traced inside an outer one, are counted once).
``run_seconds`` is the wall time minus that.
"""

from __future__ import annotations

import threading
import time

import jax

_COMPILE_EVENTS = frozenset({
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
})
_active: list[Stopwatch] = []
_lock = threading.Lock()
_installed = False


_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def _listener(event: str, start: float, end: float, **kwargs: object) -> None:
    if event in _COMPILE_EVENTS and _active:
        with _lock:
            for watch in _active:
                watch._spans.append((start, end))
                if event == _BACKEND_COMPILE:
                    watch.xla_compiles.append(str(kwargs.get("fun_name", "?")))


def _install() -> None:
    global _installed
    if not _installed:
        jax.monitoring.register_event_time_span_listener(_listener)
        _installed = True


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.compile_seconds``, ``sw.run_seconds``, ``sw.wall_seconds``."""

    def __init__(self) -> None:
        self._spans: list[tuple[float, float]] = []
        self.wall_seconds = 0.0
        # the name of every XLA program built inside (``jit(<function>)``; an eager operation is
        # ``jit(<primitive>)``), loaded from the persistent compilation cache or compiled
        self.xla_compiles: list[str] = []

    def __enter__(self) -> Stopwatch:
        _install()
        self._start = time.time()
        with _lock:
            _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        self.wall_seconds = time.time() - self._start
        with _lock:
            _active.remove(self)

    @property
    def compile_seconds(self) -> float:
        total, last_end = 0.0, -float("inf")
        for start, end in sorted(self._spans):
            if end <= last_end:
                continue
            total += end - max(start, last_end)
            last_end = end
        return min(total, self.wall_seconds)

    @property
    def run_seconds(self) -> float:
        return max(self.wall_seconds - self.compile_seconds, 0.0)

    @property
    def compile_events(self) -> int:
        """How many tracing, lowering or XLA-compilation spans JAX reported inside the stopwatch (0: nothing
        was traced or compiled, e.g. input rejected before any JAX work; tests assert this)."""
        return len(self._spans)
