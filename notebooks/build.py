"""Execute the teaching notebooks through the real notebook machinery (jupytext -> ipynb -> nbclient
with a Jupyter kernel).

``python -m notebooks.build`` (``make notebooks``) runs every notebook at full size and writes executed
copies with outputs to ``notebooks/_build/`` (``--out DIR`` elsewhere: ``make docs`` renders them from
``docs/_notebooks/``); ``--fast`` sets ``FAST=1`` (what CI runs, via tests/test_notebooks.py).
``python -m notebooks.build hlcr mppca`` runs a subset.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = HERE / "_build"


def sources() -> list[Path]:
    """Every notebook source: notebooks/*.py except this package's own modules."""
    return sorted(p for p in HERE.glob("*.py") if not p.name.startswith("_") and p.name != "build.py")


def execute(path: Path, out_dir: Path, *, fast: bool, timeout: int = 600,
            env: Mapping[str, str] | None = None) -> tuple[Path, float]:
    """Run ``path`` in a fresh kernel (cwd ``out_dir``, environment ``env`` (default: this process's) with
    ``FAST`` and Jupyter's inline matplotlib backend; this process's own environment is left alone); write
    ``out_dir/<name>.ipynb`` atomically with outputs, readable by everyone the umask allows. Returns (that
    file, seconds). Raises ``nbclient.exceptions.CellExecutionError`` if a cell fails."""
    import jupytext
    import nbformat
    from nbclient import NotebookClient

    out_dir.mkdir(parents=True, exist_ok=True)
    nb = jupytext.read(path)
    env = {**(os.environ if env is None else env), "FAST": "1" if fast else "0",
           "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    t0 = time.time()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(out_dir)}}).execute(env=env)
    elapsed = time.time() - t0
    target = out_dir / f"{path.stem}.ipynb"
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{path.stem}.", suffix=".tmp")
    os.close(fd)
    nbformat.write(nb, tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's file is 0600: an executed notebook is for reading
    os.replace(tmp, target)
    return target, elapsed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="notebook names (default: all)")
    parser.add_argument("--fast", action="store_true", help="FAST=1: small sizes, as in CI")
    parser.add_argument("--timeout", type=int, default=None,
                        help="seconds per cell (default: 600 with --fast, 3600 at full size: the SSGP m-sweep "
                             "up to m = 100 alone takes several minutes on 2 cores)")
    parser.add_argument("--out", type=Path, default=BUILD, help=f"where the executed .ipynb go (default {BUILD})")
    args = parser.parse_args(argv)
    chosen = [p for p in sources() if not args.names or p.stem in args.names]
    if args.names and len(chosen) != len(args.names):
        known = [p.stem for p in sources()]
        print(f"unknown notebook(s) in {args.names}; available: {known}", file=sys.stderr)
        return 2
    for i, path in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {path.name} ...", flush=True)
        timeout = args.timeout or (600 if args.fast else 3600)
        target, elapsed = execute(path, args.out, fast=args.fast, timeout=timeout)
        print(f"    {elapsed:.0f} s -> {target}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
