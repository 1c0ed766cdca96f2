"""The ``progress`` option: whether a long run shows a progress bar (``inference.loop`` advances one between
its compiled chunks; NUTS and SVI use NumPyro's)."""

from __future__ import annotations

import sys


def progress_enabled(flag: bool | None) -> bool:
    """``progress`` option: explicit True/False, or None = only when stderr is a terminal."""
    return sys.stderr.isatty() if flag is None else bool(flag)
