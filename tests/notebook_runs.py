"""Every teaching notebook executed once per test session in FAST mode, shared by the tests that read its
outputs (tests/test_notebooks.py checks them, tests/test_docs.py renders them into the site).

One lock file per notebook: under pytest-xdist the workers of one run share a directory, and a worker that
needs a notebook another is executing waits for it instead of running it again. The kernel runs as a student's
would: Jupyter's inline backend and no ``DISPLAY`` (unset on macOS and JupyterHub)."""

from __future__ import annotations

import fcntl
import os
import traceback
from pathlib import Path

from notebooks.build import execute, sources

TIMEOUT = 600  # seconds per cell, a hang guard (as `notebooks.build --fast`): cells run longer on a loaded box
# Notebooks whose FAST run is spent running compiled programs rather than compiling them: their kernels get XLA's
# default optimisation, not the suite's level 0 (tests/conftest.py): cost_accuracy's NUTS ladder (6 fits of 350
# to 1100 iterations on the stored reference's data) costs far less optimised, while the other notebooks build
# many small programs and cost more (measured per notebook: benchmarks/results.md, "suite_speed").
OPTIMISED = frozenset({"cost_accuracy"})
OPT_LEVEL_FLAG = "--xla_backend_optimization_level"


def kernel_env(name: str) -> dict[str, str]:
    """The environment notebook ``name``'s kernel starts with: this process's, without ``DISPLAY``, and for the
    notebooks of ``OPTIMISED`` without the XLA optimisation-level flag (every other XLA flag kept)."""
    env = {k: v for k, v in os.environ.items() if k != "DISPLAY"}
    if name in OPTIMISED and "XLA_FLAGS" in env:
        env["XLA_FLAGS"] = " ".join(f for f in env["XLA_FLAGS"].split() if not f.startswith(OPT_LEVEL_FLAG + "="))
    return env


def session_dir(tmp_path_factory) -> Path:
    """A directory of this test run: the base temp directory, or under xdist the one its workers share."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    out = base / "notebook_runs"
    out.mkdir(exist_ok=True)
    return out


def executed(path: Path, directory: Path) -> Path:
    """``directory/<name>.ipynb``, ``path`` executed in FAST mode (once per directory); a notebook that failed
    earlier in the run raises again with the first failure's traceback, without a second execution."""
    with open(directory / f"{path.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        target, failed = directory / f"{path.stem}.ipynb", directory / f"{path.stem}.failed"
        if target.exists():
            return target
        if failed.exists():
            raise RuntimeError(f"{path.name} failed earlier in this run:\n{failed.read_text()}")
        try:
            return execute(path, directory, fast=True, timeout=TIMEOUT, env=kernel_env(path.stem))[0]
        except BaseException:
            failed.write_text(traceback.format_exc())
            raise


def all_executed(directory: Path, *, reverse: bool = False) -> list[Path]:
    """Every notebook executed into ``directory``. ``reverse``: from the last one, so that a worker that needs them
    all while another runs tests/test_notebooks.py (first to last) executes the other half instead of waiting."""
    paths = sources()
    done = {p: executed(p, directory) for p in (reversed(paths) if reverse else paths)}
    return [done[p] for p in paths]
