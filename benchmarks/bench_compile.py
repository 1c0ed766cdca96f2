"""Issue 18 part 3: compile seconds of every (model, method) the demo fits, before and after the compile work.

Two trees: ``before`` = ``BENCH_COMPILE_BASE`` (default ``9b24468``, main before issue 18's first change),
extracted into ``build/compile_base/``, and ``after`` = this working tree. For every registered model and every
method the demo fits (``inference.methods_for``, this tree's registry), one fit with the demo options
(``ModelSpec.demo_options``) on the model's default data, seed 0, in a fresh subprocess per side with an empty
JAX compilation cache (``harness.run_child``), sides interleaved. Reported: the whole fit's compile seconds
(``Stopwatch`` around ``inference.fit``: tracing, lowering and XLA compilation of the run and of the tree's
log densities), the rest of its wall time, and the compile share; totals over the
pairs both sides have. A cold process per fit is the worst case: ``make demo`` runs all of a model's fits in one
process, where programs shared between fits (log densities of the tree build, NUTS set-up) compile once.
``BENCH_COMPILE_ONLY`` (``model/method``, comma-separated) limits the pairs. ``BENCH_COMPILE_SAMPLER_CAP`` = n
(default 0: off) runs samplers for at most n warm-up and n kept iterations: their programs do not depend on the
number of iterations (NUTS compiles one step; Gibbs one chunk of at most 100 sweeps), so the compile seconds
are the demo's while ssgp_logit/probit's NUTS (500 + 1500 deep-tree iterations, minutes each) is spared; the
run and share columns of capped rows are then those of the shortened runs (marked).
"""

from __future__ import annotations

import os

from benchmarks.harness import REPO, checkout_at, run_child

BASE = os.environ.get("BENCH_COMPILE_BASE", "9b24468")

CHILD = """
import json, sys
import zoo, inference
from inference._timing import Stopwatch
from inference._methods import get_method
model, method = sys.argv[1], sys.argv[2]
spec = zoo.get(model)
data = spec.default_data()[0]
options = dict(spec.demo_options.get(method, {}))
cap = int(sys.argv[3])
capped = bool(cap) and get_method(spec, method).kind == "sampler"
if capped:
    options.update({k: min(options.get(k, cap), cap) for k in ("num_warmup", "num_samples")})
with Stopwatch() as watch:
    tree = inference.fit(model, data, method, seed=0, progress=False, **options)
print(json.dumps({"compile": watch.compile_seconds, "run": watch.run_seconds, "capped": capped}))
"""


def main(h) -> None:
    import inference
    import zoo

    only = [p for p in os.environ.get("BENCH_COMPILE_ONLY", "").split(",") if p]
    cap = int(os.environ.get("BENCH_COMPILE_SAMPLER_CAP", "0"))
    sides = {"before": checkout_at(BASE, "compile_base"), "after": REPO}
    pairs = [(m, k) for m in zoo.list_models() for k in inference.methods_for(m)
             if not only or f"{m}/{k}" in only]
    rows, totals = [], {side: {"compile": 0.0, "run": 0.0} for side in sides}
    for model, method in pairs:
        got = {side: run_child(tree, CHILD, model, method, str(cap)) for side, tree in sides.items()}
        capped = any(r.get("capped") for r in got.values())
        row = {"model/method": f"{model}/{method}" + (f" (samples capped at {cap})" if capped else "")}
        for side, r in got.items():
            row[f"compile {side} (s)"] = "error" if "error" in r else f"{r['compile']:.1f}"
            row[f"run {side} (s)"] = "error" if "error" in r else f"{r['run']:.1f}"
            row[f"compile share {side}"] = "-" if "error" in r else \
                f"{r['compile'] / max(r['compile'] + r['run'], 1e-9):.0%}"
        if not any("error" in r for r in got.values()):
            row["compile after/before"] = f"{got['after']['compile'] / got['before']['compile']:.2f}"
            for side, r in got.items():
                totals[side]["compile"] += r["compile"]
                totals[side]["run"] += r["run"]
        else:
            row["compile after/before"] = "; ".join(f"{s}: {r['error'][:80]}" for s, r in got.items() if "error" in r)
        rows.append(row)
        print(row, flush=True)
    total = {"model/method": "total (pairs both sides fit)"}
    for side, t in totals.items():
        total[f"compile {side} (s)"] = f"{t['compile']:.0f}"
        total[f"run {side} (s)"] = f"{t['run']:.0f}"
        total[f"compile share {side}"] = f"{t['compile'] / max(t['compile'] + t['run'], 1e-9):.0%}"
    total["compile after/before"] = f"{totals['after']['compile'] / max(totals['before']['compile'], 1e-9):.2f}"
    rows.append(total)
    h.table(f"Compile seconds per (model, method), demo options and data, before ({BASE}) and after, one cold "
            "subprocess per fit and side", rows,
            note=("compile: Stopwatch seconds (tracing, lowering, XLA) of the whole fit (run and tree build) in a "
                  "fresh process with an empty compilation cache; run: the rest of its wall time; share: compile / "
                  "(compile + run). "
                  "'error' on the before side: the method did not exist yet (gibbs_blocked)."))
