"""Issue 17: every hand-written kernel before and after the redesign (one loop, one package per paper).

The two sides are two checkouts of the repository: ``before`` = ``BENCH_REDESIGN_BASE`` (default: the last
commit before the redesign, ``7f24ee8``, extracted with ``git archive`` into ``build/redesign_base/``) and
``after`` = this working tree. Both run in the same Python environment, each in a fresh subprocess per fit
(``PYTHONPATH`` puts its checkout first), **interleaved** (before, after, before, after, ...), on the model's
demo dataset with its demo options (``ModelSpec.default_data`` / ``demo_options`` of that side), with its own
empty JAX compilation cache so compile times compare. In each subprocess the fit runs twice: the first call's
``compile_seconds`` is the compile time, the second call's ``run_seconds`` the run time (no compilation left).
Reported: medians over ``BENCH_REDESIGN_REPEATS`` (default 3) subprocesses per side, and the ratio after /
before (> 1: the redesign is slower).

Both sides run with ``jax_cpu_enable_async_dispatch`` off (set in the subprocess; a JAX flag, not read from
the environment): with asynchronous dispatch a computation still
running while the same fit traces or compiles something else (a ``jax.jit`` of a fresh closure, compiled again in
every fit) is hidden inside the compile seconds that ``Stopwatch`` subtracts, so a side that recompiles in its
second fit looked faster than it runs. ``recompile``: the second fit's compile seconds (0 when every program of
the fit was reused).
"""

from __future__ import annotations

import json
import os
import statistics

from benchmarks.harness import REPO, checkout_at, run_child

BASE = os.environ.get("BENCH_REDESIGN_BASE", "7f24ee8")
PAIRS = [("hlcr", "gibbs"), ("hlcr", "vbem"), ("hlcr", "fedgibbs"), ("hlcr", "fedvb"), ("mppca", "vbem"),
         ("mppca", "em"), ("bpca", "vbem"), ("bpca", "badmm"), ("bpca", "dppca"), ("ssgp_lmm", "vb"),
         ("ssgp_logit", "vb"), ("ssgp_probit", "vb"), ("gp_alps", "vbem"), ("gp_alps", "gibbs"),
         ("gp_alps", "svi_concrete")]

CHILD = """
import json, sys
import jax
jax.config.update("jax_cpu_enable_async_dispatch", False)   # before the first computation creates the client
import zoo, inference
model, method = sys.argv[1], sys.argv[2]
spec = zoo.get(model)
data, _ = spec.default_data()
options = dict(spec.settings.demo_options.get(method, {}))
first = inference.fit(model, data, method, seed=0, **options)
second = inference.fit(model, data, method, seed=0, **options)
print(json.dumps({"compile": first.attrs["compile_seconds"], "first_run": first.attrs["run_seconds"],
                  "run": second.attrs["run_seconds"], "recompile": second.attrs["compile_seconds"]}))
"""


def main(h) -> None:
    repeats = int(os.environ.get("BENCH_REDESIGN_REPEATS", "3"))
    only = [p for p in os.environ.get("BENCH_REDESIGN_ONLY", "").split(",") if p]
    sides = {"before": checkout_at(BASE, "redesign_base"), "after": REPO}
    rows = []
    for model, method in PAIRS:
        if only and f"{model}/{method}" not in only:
            continue
        runs = {side: [] for side in sides}
        for _ in range(repeats):
            for side, checkout in sides.items():
                runs[side].append(run_child(checkout, CHILD, model, method))
        errors = {side: r["error"] for side, rs in runs.items() for r in rs if "error" in r}
        if errors:
            rows.append({"model/method": f"{model}/{method}", "error": json.dumps(errors)[:200]})
            continue
        med = {side: {k: statistics.median(r[k] for r in rs) for k in ("compile", "run", "recompile")}
               for side, rs in runs.items()}
        rows.append({"model/method": f"{model}/{method}",
                     "compile before (s)": f"{med['before']['compile']:.2f}",
                     "compile after (s)": f"{med['after']['compile']:.2f}",
                     "recompile before (s)": f"{med['before']['recompile']:.2f}",
                     "recompile after (s)": f"{med['after']['recompile']:.2f}",
                     "run before (s)": f"{med['before']['run']:.3f}", "run after (s)": f"{med['after']['run']:.3f}",
                     "run ratio after/before": f"{med['after']['run'] / med['before']['run']:.2f}",
                     "run spread before": f"{min(r['run'] for r in runs['before']):.3f}-"
                                          f"{max(r['run'] for r in runs['before']):.3f}",
                     "run spread after": f"{min(r['run'] for r in runs['after']):.3f}-"
                                         f"{max(r['run'] for r in runs['after']):.3f}"})
        print(rows[-1], flush=True)
    h.table(f"Kernels before ({BASE}) and after the redesign, demo data and options, median of {repeats} "
            "interleaved subprocesses per side", rows,
            note=("compile: first fit's compile seconds (empty cache per subprocess); run: second fit's run "
                  "seconds; recompile: the second fit's compile seconds; synchronous CPU dispatch on both sides "
                  "(module docstring). Ratio > 1: the redesign is slower. Spread: min-max over "
                  "the repeats, the noise to compare the ratio with."))
