"""XLA programs of a sweep of tiny data sets with and without bucketed rows (issue 28, item 2).

Every bucketed (model, method) pair is fitted (``inference.fit``, the options' ``tiny`` values) on four simulated
data sets of different row counts in one process; the XLA programs built are counted (JAX's compile events,
``inference._timing.Stopwatch``) and split into the kernel's own programs and the tree's log densities
(``jit(densities)``, which evaluates the NumPyro model on the data as they are, per shape). Deterministic counts:

    python -m benchmarks.bench_bucketing            # rows padded to programs.bucket(n)
    python -m benchmarks.bench_bucketing --off      # programs.bucketing(False): every size its own programs

Run each in a fresh process (programs kept from the other mode would be found again).
"""

from __future__ import annotations

import sys

import inference
import zoo
from inference import programs
from inference._methods import get_method
from inference._timing import Stopwatch

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


def main(argv: list[str]) -> None:
    off = "--off" in argv
    with programs.bucketing(not off):
        rows = sweep()
    print(f"bucketing {'off' if off else 'on'}: XLA programs of four tiny data sets per pair")
    print("| model | method | kernel programs | density programs |")
    print("|---|---|---|---|")
    for model, method, kernel, densities in rows:
        print(f"| {model} | {method} | {kernel} | {densities} |")
    print(f"| total | | {sum(r[2] for r in rows)} | {sum(r[3] for r in rows)} |")


if __name__ == "__main__":
    main(sys.argv[1:])
