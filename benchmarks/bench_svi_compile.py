"""Issue 18 part 3: SVI compiled once per (model, guide settings, data shapes), before and after.

Two checkouts: ``before`` = ``BENCH_SVI_BASE`` (default ``0a3db0c``, main before the change: ``SVI.run`` and a new
``jax.jit`` of the guide draws per fit), extracted with ``git archive`` into ``build/svi_compile_base/``, and
``after`` = this working tree. For every model, in a fresh subprocess per side (its own empty JAX compilation
cache, sides interleaved), three ``svi`` fits with the model's demo options: on the demo data (seed 0), again with
seed 1, then on the simulator's dataset of seed 1 (same sizes) with seed 2. Reported: each fit's compile
seconds (``Stopwatch``: tracing, lowering and XLA compilation) and wall seconds (compile + run), medians over
``BENCH_SVI_REPEATS`` (default 1) subprocesses per side.
"""

from __future__ import annotations

import json
import os
import statistics

from benchmarks.harness import REPO, checkout_at, run_child

BASE = os.environ.get("BENCH_SVI_BASE", "0a3db0c")

CHILD = """
import json, sys
import numpy as np
import zoo, inference
spec = zoo.get(sys.argv[1])
options = dict(spec.settings.demo_options.get("svi", {}))
data, other = spec.default_data()[0], spec.default_data(1)[0]
same = all(np.shape(data[k]) == np.shape(other[k]) for k in data)
runs = ((data, 0), (data, 1), (other if same else data, 2))
fits = [inference.fit(spec, d, "svi", seed=s, **options) for d, s in runs]
print(json.dumps({"compile": [t.attrs["compile_seconds"] for t in fits],
                  "run": [t.attrs["run_seconds"] for t in fits], "other_data": same}))
"""


def main(h) -> None:
    import zoo

    repeats = int(os.environ.get("BENCH_SVI_REPEATS", "1"))
    only = [m for m in os.environ.get("BENCH_SVI_ONLY", "").split(",") if m]
    sides = {"before": checkout_at(BASE, "svi_compile_base"), "after": REPO}
    rows, totals = [], {side: [0.0, 0.0] for side in sides}
    for model in only or zoo.list_models():
        runs = {side: [] for side in sides}
        for _ in range(repeats):
            for side, tree in sides.items():
                runs[side].append(run_child(tree, CHILD, model))
        failed = {side: r["error"] for side, rs in runs.items() for r in rs if "error" in r}
        if failed:
            rows.append({"model": model, "error": json.dumps(failed)[:300]})
            print(rows[-1], flush=True)
            continue
        med = {side: {key: [statistics.median(r[key][i] for r in rs) for i in range(3)] for key in ("compile", "run")}
               for side, rs in runs.items()}
        for side in sides:
            totals[side][0] += sum(med[side]["compile"])
            totals[side][1] += sum(med[side]["run"])
        row = {"model": model}
        for i, fit in enumerate(("1st fit", "2nd fit (seed)", "3rd fit (data)")):
            before, after = ([med[side]["compile"][i], med[side]["compile"][i] + med[side]["run"][i]]
                             for side in sides)
            row[f"{fit}: compile before / after (s)"] = f"{before[0]:.2f} / {after[0]:.2f}"
            row[f"{fit}: wall before / after (s)"] = f"{before[1]:.2f} / {after[1]:.2f}"
        row["3rd fit on other data"] = "yes" if runs["after"][0]["other_data"] else "no (other sizes: demo data)"
        rows.append(row)
        print(row, flush=True)
    rows.append({"model": "total, 3 fits of every model",
                 "1st fit: compile before / after (s)": f"{totals['before'][0]:.1f} / {totals['after'][0]:.1f} "
                                                         "(all 3 fits)",
                 "1st fit: wall before / after (s)": f"{sum(totals['before']):.1f} / {sum(totals['after']):.1f} "
                                                      "(all 3 fits)"})
    h.table(f"SVI compile once per shape: svi on every model's demo data and demo options, before ({BASE}) and "
            f"after, median of {repeats} subprocess(es) per side", rows,
            note=("compile: Stopwatch seconds (tracing, lowering, XLA) of each fit, an empty persistent cache per "
                  "subprocess; wall: the fit's whole run stage (compile + run seconds; the tree is built apart). "
                  "2nd fit: same data, another seed; 3rd fit: the simulator's seed-1 dataset of the same sizes, "
                  "another seed. Compare walls, not run seconds: work JAX dispatched asynchronously runs while "
                  "the next program compiles and is counted as compile time (before: the Adam steps run while "
                  "the guide-draw program compiles). Before: NumPyro's SVI.run traces its step again in every "
                  "fit, its set-up runs op by op, the guide draws are a new jax.jit per fit (the persistent cache "
                  "spares only XLA's part); after: three cached programs with the data as arguments."))
