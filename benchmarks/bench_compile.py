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

import json
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


COUNTS_CHILD = """
import ast, collections, json, pathlib, sys, time
from tests.conftest import release_compiled_programs   # the suite's settings; releases every kept program
import jax
import inference, zoo
from inference._methods import get_method

size = sys.argv[1]
only = [p for p in sys.argv[2:] if p]
root = pathlib.Path(inference.__file__).parents[1]
ours = {"<lambda>"}
for pkg in ("inference", "zoo"):
    for f in (root / pkg).rglob("*.py"):
        ours |= {n.name for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.FunctionDef)}
from jax.extend.core import Primitive
primitives = {v.name for m in list(sys.modules.values()) if (getattr(m, "__name__", "") or "").startswith("jax")
              for v in list(vars(m).values()) if isinstance(v, Primitive)}
ours -= primitives | {"stage"}
spans = []
def span(event, start, end, **kw):
    if event.startswith("/jax/core/compile/"):
        spans.append((event.rsplit("/", 1)[1], str(kw.get("fun_name", "?")), end - start, kw.get("stack")))
jax.monitoring.register_event_time_span_listener(span)
pairs = [(m, k) for m in zoo.list_models() for k in inference.methods_for(m) if not only or f"{m}/{k}" in only]
for model, method in pairs:
    spec = zoo.get(model)
    if size == "tiny":
        declared = get_method(spec, method).declared
        options = {**{k: o.tiny for k, o in declared.items() if o.tiny is not None}, **spec.tiny_hyperparameters}
        data = spec.tiny_data()[0]
    else:
        data, options = spec.default_data()[0], dict(spec.demo_options.get(method, {}))
    options["progress"] = False
    release_compiled_programs()
    out = {"pair": f"{model}/{method}", "kind": get_method(spec, method).kind}
    for label, seed in (("cold", 3), ("second", 4)):
        spans.clear()
        start = time.time()
        try:
            inference.fit(model, data, method, seed=seed, **options)
        except Exception as exc:
            out["error"] = repr(exc)[:200]
            break
        wall = time.time() - start
        xla = [(f.removeprefix("jit(").removesuffix(")"), s) for e, f, s, _ in spans
               if e == "backend_compile_duration"]
        programs = [(f, s) for f, s in xla if f in ours]
        out[label] = {"wall": round(wall, 2), "xla": len(xla), "programs": len(programs),
                      "eager": len(xla) - len(programs), "compile_s": round(sum(s for _, _, s, _ in spans), 2),
                      "program_seconds": [(f, round(s, 2)) for f, s in programs]}
    print("COUNTS " + json.dumps(out), flush=True)
"""


def count_compiles(tree, size: str = "tiny", pairs: tuple[str, ...] = ()) -> list[dict]:
    """XLA compilations of every pair's cold fit and of a second fit with another seed, in one process of
    ``tree`` that releases every kept program before each pair (``tests.conftest.release_compiled_programs``):
    a cold fit as the test suite can see it (the modules imported; their programs, JAX's and ours, released).
    Programs are counted whether compiled or loaded from the persistent cache; ``programs``: those named after a
    function of ``inference/`` or ``zoo/``, ``eager``: the rest (JAX operations run one at a time)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", COUNTS_CHILD, size, *pairs], cwd=tree, env=env, text=True,
                          capture_output=True, timeout=7200)
    rows = [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("COUNTS ")]
    if not rows:
        raise RuntimeError(done.stderr[-2000:])
    return rows


BUDGETS_CHILD = """
import json
from tests.conftest import release_compiled_programs
import inference, zoo
from inference._methods import get_method
from inference._timing import Stopwatch

BUDGETS = ("max_iter", "tol", "num_samples", "num_warmup", "num_steps", "thinning")
for model in zoo.list_models():
    spec = zoo.get(model)
    for method in inference.methods_for(model):
        declared = get_method(spec, method).declared
        opts = {**{k: o.tiny for k, o in declared.items() if o.tiny is not None}, **spec.tiny_hyperparameters}
        other = dict(opts)
        for name in BUDGETS:
            if name in declared:
                v = opts.get(name, declared[name].default)
                other[name] = v * 10 if name == "tol" else (v + 1 if name == "thinning" else max(1, v - v // 3))
        data = spec.tiny_data()[0]
        release_compiled_programs()
        inference.fit(model, data, method, seed=3, progress=False, **opts)
        with Stopwatch() as w:
            inference.fit(model, data, method, seed=5, progress=False, **other)
        changed = sorted(k for k in other if other[k] != opts.get(k))
        print("BUDGET " + json.dumps({"pair": f"{model}/{method}", "changed": changed, "xla": len(w.xla_compiles)}),
              flush=True)
"""


def count_budget_compiles(tree) -> list[dict]:
    """XLA programs of a fit that changes every budget a method declares (``tests/test_contract.py``'s rule: an
    integer budget about two thirds of its tiny value, ``thinning`` one more, ``tol`` ten times larger) and the
    seed, after a cold tiny fit of the same pair, in one process of ``tree`` (every kept program released before
    each pair). The rule is copied into the child, so a tree without it (an older commit) runs it too."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", BUDGETS_CHILD], cwd=tree, env=env, text=True, capture_output=True,
                          timeout=7200)
    rows = [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("BUDGET ")]
    if not rows:
        raise RuntimeError(done.stderr[-2000:])
    return rows


if __name__ == "__main__":
    import sys

    # python benchmarks/bench_compile.py counts TREE tiny|demo [model/method ...]: JSON lines of compile counts
    if sys.argv[1:2] == ["counts"]:
        for row in count_compiles(sys.argv[2], sys.argv[3], tuple(sys.argv[4:])):
            print(json.dumps(row))
    # python benchmarks/bench_compile.py budgets TREE: JSON lines of the XLA programs of a fit with other budgets
    if sys.argv[1:2] == ["budgets"]:
        for row in count_budget_compiles(sys.argv[2]):
            print(json.dumps(row))
