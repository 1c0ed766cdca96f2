"""``python -m benchmarks [name ...]``: run benchmarks/bench_<name>.py (all by default)."""

import importlib
import os
import sys
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")
from zoo import _runtime  # noqa: E402,F401  (JAX set-up: float64, 2 host devices, numpyro before arviz)

# isort: split
from benchmarks.harness import Harness  # noqa: E402


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    available = sorted(p.stem[len("bench_"):] for p in here.glob("bench_*.py"))
    chosen = argv or available
    unknown = [n for n in chosen if n not in available]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; available: {available}", file=sys.stderr)
        return 2
    h = Harness()
    for name in chosen:
        print(f"## {name}\n", flush=True)
        h.start(name)
        importlib.import_module(f"benchmarks.bench_{name}").main(h)
        h.write()  # after each benchmark, so an interrupted run keeps what finished
    print(f"results written to {h.write()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
