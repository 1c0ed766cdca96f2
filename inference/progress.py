"""Progress bars for long runs, and a jit-compiled loop that can show one.

Hand-written kernels run their sweeps with ``lax.scan``; ``scan_with_progress`` runs the scan in
chunks of ``chunk`` steps (one compiled chunk, called repeatedly) and advances a tqdm bar between
chunks, so a long Gibbs or VB run shows progress without a Python loop over single steps.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from tqdm.auto import tqdm


def progress_enabled(flag: bool | None) -> bool:
    """``progress`` option: explicit True/False, or None = only when stderr is a terminal."""
    return sys.stderr.isatty() if flag is None else bool(flag)


def scan_with_progress(step: Callable[[Any, Any], tuple[Any, Any]], state: Any, xs: Any, *,
                       length: int, chunk: int = 100, progress: bool | None = None,
                       desc: str = "") -> tuple[Any, Any]:
    """``lax.scan(step, state, xs, length)`` in compiled chunks, with an optional progress bar.

    Results are identical to one ``lax.scan`` (same per-step inputs). ``xs`` may be ``None`` or a
    pytree with leading axis ``length`` (e.g. per-step keys).
    """
    chunk = max(1, min(chunk, length))
    run_chunk = jax.jit(lambda s, x: jax.lax.scan(step, s, x, length=chunk if x is None else None))
    outs = []
    bar = tqdm(total=length, desc=desc, disable=not progress_enabled(progress), leave=False)
    done = 0
    while done < length:
        n = min(chunk, length - done)
        x = None if xs is None else jax.tree.map(lambda a, lo=done, hi=done + n: a[lo:hi], xs)
        if n == chunk:
            state, out = run_chunk(state, x)
        else:  # the last, shorter chunk compiles once more
            state, out = jax.lax.scan(step, state, x, length=n if x is None else None)
        outs.append(out)
        done += n
        bar.update(n)
    bar.close()
    ys = jax.tree.map(lambda *a: jnp.concatenate(a, axis=0), *outs) if len(outs) > 1 else outs[0]
    return state, ys
