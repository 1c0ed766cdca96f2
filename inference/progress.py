"""What a long run prints: the ``progress`` option (whether a progress bar shows; ``inference.loop`` advances one
between its compiled chunks, NUTS between calls of its one program, SVI uses NumPyro's) and ``explained_warnings``
(warnings a user cannot act on, caught and summarised once with what they mean)."""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections.abc import Callable, Iterator

# (pattern of the message, what it means to the user): warnings that ask nothing of the user.
EXPLAINED = (
    (re.compile(r"Out-of-support values provided to log prob method"),
     "NumPyro evaluated a log density at a value outside its distribution's support: a starting point drawn from "
     "the prior that underflowed to the boundary (e.g. a precision of 0 under a Gamma(0.001, 0.001) prior), "
     "which NumPyro rejects and redraws. The draws are not affected; nothing to change."),
)

_depth = 0


def progress_enabled(flag: bool | None) -> bool:
    """``progress`` option: explicit True/False, or None = only when stderr is a terminal."""
    return sys.stderr.isatty() if flag is None else bool(flag)


@contextlib.contextmanager
def explained_warnings(log: Callable[[str], None] | None = print) -> Iterator[dict[str, int]]:
    """Within the block, warnings of ``EXPLAINED`` are counted instead of shown, and said once at its end through
    ``log`` (with what they mean); every other warning is shown as usual (once per place, at the end of the block,
    also when it ends by an exception), so a warning a user can act on stays. The filters in force apply (an
    ``error`` filter still raises). Nested blocks leave the summary to the outermost. Yields {meaning: count}."""
    global _depth
    counts: dict[str, int] = {}
    if _depth:
        yield counts
        return
    _depth += 1
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as record:
            try:
                yield counts
            finally:
                caught = list(record)
    finally:
        _depth -= 1
        others = {}
        for w in caught:
            meaning = next((m for p, m in EXPLAINED if p.search(str(w.message))), None)
            if meaning is not None:
                counts[meaning] = counts.get(meaning, 0) + 1
            else:
                others.setdefault((str(w.message), w.category, w.filename, w.lineno), w)
        for w in others.values():
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        if log is not None:
            for meaning, n in counts.items():
                log(f"note: {n} warning{'s' if n > 1 else ''} caught: {meaning}")
