"""Benchmark harness: both sides of a comparison measured in the same run, interleaved.

Each ``benchmarks/bench_<name>.py`` defines ``main(h: Harness)`` and calls

* ``h.compare(title, {"side A": fn_a, "side B": fn_b}, baseline="side B", work=..., work_unit=...)``:
  each ``fn`` is called once to compile (its compile time is measured apart with JAX's compile
  events), then the sides are run in interleaved order ``repeats`` times (>= 5) and the median wall
  time is kept; the table shows each side's compile seconds, median run seconds, throughput
  (``work`` per second, if given) and the ratio to the baseline;
* ``h.table(title, rows, note=...)`` for results that are not timings (accuracy beside speed,
  scaling slopes, ...);
* ``checkout_at(commit, folder)`` and ``run_child(tree, code, *args)``: an older commit's tree and a fresh
  Python process on a tree with its own empty compilation cache, for before/after comparisons of the code.

``python -m benchmarks [name ...]`` prints every table as it is produced and writes them, with a
description of the machine, to ``benchmarks/results.md`` (atomically, after each benchmark); the
sections of benchmarks not run this time are kept.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from inference._timing import Stopwatch

RESULTS = Path(__file__).resolve().parent / "results.md"
REPO = RESULTS.parent.parent


def checkout_at(commit: str, folder: str) -> Path:
    """``commit``'s tree extracted (``git archive``) into ``build/<folder>/``, once per commit."""
    target = REPO / "build" / folder
    stamp = target / ".commit"
    if stamp.is_file() and stamp.read_text() == commit:
        return target
    target.mkdir(parents=True, exist_ok=True)
    tar = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=tar, check=True)
    stamp.write_text(commit)
    return target


def run_child(tree: Path, code: str, *args: str, timeout: float = 3600) -> dict:
    """Run ``code`` in a fresh Python process with ``tree`` first on ``sys.path`` and an empty JAX compilation
    cache of its own; its last line of output is JSON, returned as a dict (``{"error": last line of stderr}`` if
    it failed)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPATH": str(tree), "BAYES_ZOO_JAX_CACHE": cache, "MPLBACKEND": "Agg"}
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=tree, env=env, capture_output=True,
                              text=True, timeout=timeout)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _block(x: Any) -> Any:
    return jax.block_until_ready(x) if x is not None else x


def machine_description() -> str:
    from importlib import metadata

    versions = ", ".join(f"{p} {metadata.version(p)}" for p in ("jax", "numpyro", "arviz") if _has(p))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{platform.node()} | {platform.machine()} | {os.cpu_count()} CPUs | Python "
            f"{platform.python_version()} | {versions} | load average {load} | "
            f"{datetime.datetime.now().isoformat(timespec='seconds')}")


def _has(pkg: str) -> bool:
    from importlib import metadata
    try:
        metadata.version(pkg)
        return True
    except metadata.PackageNotFoundError:
        return False


class Harness:
    def __init__(self, repeats: int = 5) -> None:
        if repeats < 5:
            raise ValueError(f"repeats: at least 5 repeats are needed for a median, got {repeats}")
        self.repeats = repeats
        self.sections: dict[str, list[str]] = {}
        self.current = "misc"

    def start(self, name: str) -> None:
        """Begin the section of benchmark ``name`` (its tables replace that section in results.md)."""
        self.current = name
        self.sections[name] = []

    def compare(self, title: str, sides: Mapping[str, Callable[[], Any]], *, baseline: str | None = None,
                work: float | None = None, work_unit: str = "items", repeats: int | None = None,
                note: str = "") -> dict[str, dict[str, float]]:
        """Time every side (compile apart, then interleaved repeats); returns side -> figures."""
        repeats = max(self.repeats, repeats or 0)
        names = list(sides)
        baseline = baseline or names[-1]
        if baseline not in sides:
            raise ValueError(f"baseline: {baseline!r} is not one of the sides {names}")
        figures = {n: {"compile_s": 0.0, "first_call_s": 0.0, "runs": []} for n in names}
        for n in names:  # first call: compile (+ one run)
            with Stopwatch() as sw:
                _block(sides[n]())
            figures[n]["compile_s"] = sw.compile_seconds
            figures[n]["first_call_s"] = sw.wall_seconds
        for r in range(repeats):  # interleaved, rotating the order each round
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                t0 = time.perf_counter()
                _block(sides[n]())
                figures[n]["runs"].append(time.perf_counter() - t0)
        out = {}
        base = statistics.median(figures[baseline]["runs"])
        rows = []
        for n in names:
            med = statistics.median(figures[n]["runs"])
            out[n] = {"compile_s": figures[n]["compile_s"], "median_s": med,
                      "speedup_vs_baseline": base / med if med > 0 else float("inf")}
            row = {"side": n, "compile s": f"{figures[n]['compile_s']:.2f}", "median run s": f"{med:.4g}",
                   "min..max s": f"{min(figures[n]['runs']):.3g}..{max(figures[n]['runs']):.3g}"}
            if work is not None:
                out[n]["throughput"] = work / med
                row[f"{work_unit}/s"] = f"{work / med:.4g}"
            row[f"speed vs {baseline}"] = f"{base / med:.2f}x"
            rows.append(row)
        self.table(title, rows, note=(note + " " if note else "") +
                   f"Median of {repeats} interleaved repeats after one compile call.")
        return out

    def compare_once(self, title: str, sides: Mapping[str, Callable[[], Any]], *, baseline: str,
                     note: str = "") -> dict[str, dict[str, float]]:
        """Time every side ONCE, in the given order, for sides too slow to repeat (a NUTS run of many
        minutes). Compile time is taken apart from run time by JAX's compile events (``Stopwatch``), and the
        ratio is of run times. Use ``compare`` whenever the sides can be repeated."""
        names = list(sides)
        if baseline not in sides:
            raise ValueError(f"baseline: {baseline!r} is not one of the sides {names}")
        figures = {}
        for n in names:
            with Stopwatch() as sw:
                _block(sides[n]())
            figures[n] = {"compile_s": sw.compile_seconds, "run_s": sw.run_seconds, "wall_s": sw.wall_seconds}
        base = figures[baseline]["run_s"]
        rows, out = [], {}
        for n in names:
            f = figures[n]
            out[n] = f | {"speedup_vs_baseline": base / f["run_s"] if f["run_s"] > 0 else float("inf")}
            rows.append({"side": n, "compile s": f"{f['compile_s']:.2f}", "run s": f"{f['run_s']:.4g}",
                         "wall s": f"{f['wall_s']:.4g}",
                         f"speed vs {baseline}": f"{out[n]['speedup_vs_baseline']:.1f}x"})
        self.table(title, rows, note=(note + " " if note else "") +
                   "One run per side (too slow to repeat); run s = wall s minus JAX compile time.")
        return out

    def table(self, title: str, rows: Sequence[Mapping[str, Any]], *, note: str = "") -> None:
        cols = list(dict.fromkeys(c for r in rows for c in r))
        lines = [f"### {title}", ""]
        if note:
            lines += [note, ""]
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
        text = "\n".join(lines) + "\n"
        print(text, flush=True)
        self.sections.setdefault(self.current, []).append(text)

    def write(self, path: Path = RESULTS) -> Path:
        """Write results.md: sections of benchmarks run now replace their old sections; the others
        are kept (each section records the machine and time it was measured on)."""
        old = {}
        if path.is_file():
            for chunk in path.read_text().split("\n## ")[1:]:
                name = chunk.split("\n", 1)[0].strip()
                old[name] = "## " + chunk.rstrip() + "\n"
        machine = machine_description()
        for name, tables in self.sections.items():
            old[name] = f"## {name}\n\nMachine: {machine}\n\n" + "\n".join(tables)
        body = "# Benchmark results\n\n`make bench` (or `python -m benchmarks NAME`) regenerates a section.\n\n" + \
            "\n".join(old[k] for k in sorted(old))
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, path)
        return path


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
