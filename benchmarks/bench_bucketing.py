"""XLA programs of a sweep of tiny data sets with and without bucketed rows (issue 28, item 2).

Every bucketed (model, method) pair is fitted (``inference.fit``, the options' ``tiny`` values) on four simulated
data sets of different row counts in one process; the XLA programs built are counted (JAX's compile events,
``inference._timing.Stopwatch``: one per program, compiled or loaded from the persistent cache, so the counts are
deterministic) and split into the kernel's own programs and the tree's log densities (``jit(densities)``, which
evaluates the NumPyro model on the data as they are, per shape). ``python -m benchmarks bucketing`` runs the sweep
in two fresh processes of this tree, rows padded to ``programs.bucket(n)`` and ``programs.bucketing(False)``.
"""

from __future__ import annotations

import json
import sys

import inference
import zoo
from inference import programs
from inference._methods import get_method
from inference._timing import Stopwatch

CHILD = "import sys; from benchmarks.bench_bucketing import child; child(sys.argv[1])"

# (model, method, simulator sizes of the four data sets)
SWEEP = [
    ("mppca", "vbem", [{"N": n, "N_test": 2} for n in (30, 40, 50, 60)]),
    ("mppca", "em", [{"N": n, "N_test": 2} for n in (30, 40, 50, 60)]),
    ("ppca", "vbem", [{"N": n} for n in (30, 40, 50, 60)]),
    ("ppca", "em", [{"N": n} for n in (30, 40, 50, 60)]),
    ("bpca", "vbem", [{"N": n, "D": 5, "M": 2, "scales": (2.0, 1.0), "num_nodes": 3} for n in (30, 40, 50, 60)]),
    ("bpca", "badmm", [{"N": n, "D": 5, "M": 2, "scales": (2.0, 1.0), "num_nodes": 3} for n in (30, 40, 50, 60)]),
    ("bpca", "dppca", [{"N": n, "D": 5, "M": 2, "scales": (2.0, 1.0), "num_nodes": 3} for n in (30, 40, 50, 60)]),
    ("ssgp_lmm", "vb", [{"n_groups": 4, "per_group": p} for p in (5, 6, 7, 8)]),
    ("ssgp_logit", "vb", [{"n_groups": 4, "per_group": p} for p in (5, 6, 7, 8)]),
    ("ssgp_probit", "vb", [{"n_groups": 4, "per_group": p} for p in (5, 6, 7, 8)]),
    *[("hlcr", m, [{"n_agents": 4, "mean_entities": 3.0, "mean_events": 4.0}] * 4)    # pairs vary by seed
      for m in ("vbem", "gibbs", "gibbs_blocked", "fedgibbs", "fedvb")],
]


def sweep() -> list[tuple[str, str, int, int]]:
    rows = []
    for model, method, sizes in SWEEP:
        spec = zoo.get(model)
        declared = get_method(spec, method).declared
        options = {**{k: o.tiny for k, o in declared.items() if o.tiny is not None},
                   **spec.settings.tiny_hyperparameters, "progress": False}
        kernel = densities = 0
        for i, size in enumerate(sizes):
            data, _ = spec.simulate(i, **size)
            with Stopwatch() as watch:
                inference.fit(model, data, method, seed=i, **options)
            densities += sum(name == "jit(densities)" for name in watch.xla_compiles)
            kernel += sum(name != "jit(densities)" for name in watch.xla_compiles)
        rows.append((model, method, kernel, densities))
    return rows


def child(mode: str) -> None:
    """One side of the sweep in this process; prints the rows as JSON."""
    with programs.bucketing(mode == "on"):
        print(json.dumps(sweep()))


def main(h) -> None:
    from benchmarks.harness import REPO, run_child

    sides = {mode: run_child(REPO, CHILD, mode) for mode in ("off", "on")}
    failed = {mode: r["error"] for mode, r in sides.items() if isinstance(r, dict)}
    if failed:
        raise RuntimeError(f"bench_bucketing: {failed}")
    rows = []
    for off, on in zip(sides["off"], sides["on"], strict=True):
        rows.append({"model": off[0], "method": off[1], "kernel programs, rows as given": off[2],
                     "kernel programs, rows bucketed": on[2], "density programs, as given": off[3],
                     "density programs, bucketed": on[3]})
    total = lambda side, i: sum(r[i] for r in sides[side])  # noqa: E731
    rows.append({"model": "total", "method": "", "kernel programs, rows as given": total("off", 2),
                 "kernel programs, rows bucketed": total("on", 2), "density programs, as given": total("off", 3),
                 "density programs, bucketed": total("on", 3)})
    h.table("XLA programs of four tiny data sets per bucketed pair, rows as given and padded to programs.bucket(n)",
            rows, note="Each side in a fresh process with an empty compilation cache; four simulated data sets of "
                       "other row counts per pair (mppca/ppca/bpca N = 30, 40, 50, 60; ssgp 4 groups of 5-8; hlcr "
                       "4 agents, pairs by seed). Counts are deterministic; the densities program evaluates the "
                       "NumPyro model on the data as given, so it is built per shape either way.")


if __name__ == "__main__":
    child(sys.argv[1] if len(sys.argv) > 1 else "on")
