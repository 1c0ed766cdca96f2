"""Issue 18 part 3: compile seconds of every (model, method) the demo fits, before and after the compile work.

Two trees: ``before`` = ``BENCH_COMPILE_BASE`` (default ``9b24468``, main before issue 18's first change),
extracted into ``build/compile_base/``, and ``after`` = this working tree. For every registered model and every
method the demo fits (``inference.methods_for``, this tree's registry), one fit with the demo options
(``ZooSettings.demo_options``) on the model's default data, seed 0, in a fresh subprocess per side with an empty
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

Issue 28's done-when, from the command line (``cli``; results as JSON lines in ``build/bench_compile/``, one line
per finished child, so an interrupted run resumes where it stopped; ``--jobs 2`` runs two children at a time):

* ``python -m benchmarks.bench_compile cold-demo``: every hand-written kernel's and SVI's cold fit of its demo data
  in a fresh process with an empty persistent cache: each XLA program's compile seconds and HLO op count, the
  wall (tree included), a second fit with another seed; and its floor, one step of the kernel compiled alone in
  another fresh process (``child_floor``);
* ``python -m benchmarks.bench_compile nuts``: our NUTS fit beside NumPyro's own ``MCMC.run`` on the same model,
  data and settings, one fresh process per side (``child_nuts``), wall and CPU seconds of compilation; ``--repeat
  n`` runs each pair n times, in alternating order, and reports medians and the range of the pairs' ratios
  (``build/bench_compile/nuts-before.jsonl``, where present, is reported beside as the code before a change);
* ``python -m benchmarks.bench_compile report --write``: their tables into results.md, sections ``compile_cold``
  and ``compile_nuts``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

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
options = dict(spec.settings.demo_options.get(method, {}))
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
        options = {**{k: o.tiny for k, o in declared.items() if o.tiny is not None},
                   **spec.settings.tiny_hyperparameters}
        data = spec.tiny_data()[0]
    else:
        data, options = spec.default_data()[0], dict(spec.settings.demo_options.get(method, {}))
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
        opts = {**{k: o.tiny for k, o in declared.items() if o.tiny is not None},
                **spec.settings.tiny_hyperparameters}
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



# ---------------------------------------------------------------------------------------------------------------------
# Issue 28's done-when, measured: every pair's cold demo fit program by program, the floor of each kernel, and NUTS
# beside NumPyro's own MCMC.run. ``python -m benchmarks.bench_compile cold-demo | nuts | report`` (see ``cli``).
# ---------------------------------------------------------------------------------------------------------------------

OUT = REPO / "build" / "bench_compile"
TARGET_SECONDS = {"kernel": 2.0, "svi": 4.0}   # issue 28: a hand-written kernel's cold fit, an SVI's
NUTS_CAP = 50   # warm-up and kept iterations of both NUTS sides: compile seconds do not depend on them


def method_class(method: str) -> str:
    """``nuts``, ``svi`` (NumPyro's SVI and the hand-written ``svi_*`` kernels: Adam on a Monte Carlo ELBO, the
    4 s target) or ``kernel`` (every other hand-written kernel: the 2 s target)."""
    if method == "nuts":
        return "nuts"
    return "svi" if method.startswith("svi") else "kernel"


def _normal(name: str) -> str:
    """A program's name as JAX reports it (``jit(f)``) and as XLA names its module (``jit_f``), made comparable."""
    return re.sub(r"[^A-Za-z0-9]", "", name)


def hlo_ops(text: str) -> int:
    """Instructions of an HLO module's text (every computation: the entry and those it calls, e.g. a while loop's
    body), as XLA dumps it before its optimisations: the size of the program we hand to XLA."""
    return sum(1 for line in text.splitlines() if re.match(r"\s+(ROOT )?%\S+ = ", line))


class ProgramLog:
    """Every XLA program a process builds, in order, with its compile seconds and HLO op count.

    Seconds come from ``jax.monitoring``'s compile spans (``backend_compile_duration``: XLA; the lowering span of
    the same name just before it); op counts from the modules XLA dumps before optimising them (``XLA_FLAGS``
    ``--xla_dump_to=DIR --xla_dump_hlo_as_text``, set by the parent before JAX starts), each matched to the first
    dump of its name not matched yet (a program compiled ahead may end after one started later). A program loaded
    from the persistent cache has no dump (ops None). ``take()`` returns the programs since the last ``take``,
    the union of all compile spans (tracing, lowering, XLA) in seconds, and the CPU seconds of this process (user
    and system, all its threads) inside the outermost of those spans (``cpu_seconds``): on a machine other
    processes load, wall seconds grow with the load, CPU seconds much less."""

    def __init__(self, dump: str | None) -> None:
        import jax
        from jax.extend.core import Primitive

        self.dump, self.seen, self.spans, self.hits, self.cpu = dump, set(), [], 0, 0.0
        self._primitive = Primitive
        jax.monitoring.register_event_time_span_listener(self._span)
        jax.monitoring.register_event_listener(self._event)
        self._time_cpu()

    def _time_cpu(self) -> None:
        """Wrap JAX's timer of its compile spans (``dispatch.log_elapsed_time``, private: where it is missing the
        CPU seconds stay 0) to add the process's CPU seconds of each outermost span to ``self.cpu``."""
        import resource

        from jax._src import dispatch

        timer = getattr(dispatch, "LogElapsedTimeContextManager", None)
        if timer is None or getattr(timer, "_bench_cpu", False):
            return
        enter, leave, open_at, log = timer.__enter__, timer.__exit__, [], self

        def cpu() -> float:
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime

        def timed_enter(this):
            open_at.append(cpu())
            return enter(this)

        def timed_exit(this, *exc):
            out = leave(this, *exc)
            start = open_at.pop()
            if not open_at:
                log.cpu += cpu() - start
            return out

        timer.__enter__, timer.__exit__, timer._bench_cpu = timed_enter, timed_exit, True

    def _span(self, event: str, start: float, end: float, **kw) -> None:
        if event.startswith("/jax/core/compile/"):
            self.spans.append((event.rsplit("/", 1)[1], str(kw.get("fun_name", "?")), start, end))

    def _event(self, event: str, **_) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self.hits += 1

    def primitives(self) -> set[str]:
        import sys

        return {v.name for m in list(sys.modules.values()) if (getattr(m, "__name__", "") or "").startswith("jax")
                for v in list(vars(m).values()) if isinstance(v, self._primitive)}

    def _modules(self) -> list[tuple[str, int]]:
        if not self.dump:
            return []
        found = []
        for path in sorted(Path(self.dump).glob("module_*.before_optimizations.txt")):
            if path.name not in self.seen:
                self.seen.add(path.name)
                number, name = re.match(r"module_(\d+)\.(.+)\.before_optimizations\.txt", path.name).groups()
                found.append((int(number), _normal(name), hlo_ops(path.read_text())))
        return [(name, ops) for _, name, ops in sorted(found)]

    def take(self) -> tuple[list[dict], float]:
        spans, self.spans = self.spans, []
        eager = self.primitives()
        modules = self._modules()
        programs, lowered = [], {}
        for event, name, start, end in spans:
            if event == "jaxpr_to_mlir_module_duration":
                lowered[name] = end - start
            elif event == "backend_compile_duration":
                ops = None   # the first dump of that name not matched yet (programs compiled ahead end out of order)
                j = next((j for j, (dumped, _) in enumerate(modules) if dumped == _normal(name)), None)
                if j is not None:
                    ops = modules.pop(j)[1]
                short = name.removeprefix("jit(").removesuffix(")")
                programs.append({"name": short, "xla_s": round(end - start, 3),
                                 "lower_s": round(lowered.pop(name, 0.0), 3), "hlo_ops": ops,
                                 "eager": short in eager})
        total, last = 0.0, -float("inf")
        for _, _, start, end in sorted(spans, key=lambda s: s[2]):
            if end > last:
                total += end - max(start, last)
                last = end
        cpu, self.cpu = self.cpu, 0.0
        return programs, round(total, 3), round(cpu, 3)


def _summary(programs: list[dict], compile_s: float, compile_cpu_s: float, wall: float, **extra) -> dict:
    return {"wall_s": round(wall, 3), "compile_s": compile_s, "compile_cpu_s": compile_cpu_s,
            "programs": len(programs), "eager": sum(p["eager"] for p in programs), "program_list": programs, **extra}


def _load(data_path: str):
    import pickle

    with open(data_path, "rb") as f:
        return pickle.load(f)


def _options(spec, method: str, size: str) -> dict:
    from inference._methods import get_method

    if size == "tiny":
        declared = get_method(spec, method).declared
        return {**{k: o.tiny for k, o in declared.items() if o.tiny is not None},
                **spec.settings.tiny_hyperparameters}
    return dict(spec.settings.demo_options.get(method, {}))


def child_fit(log: ProgramLog, model: str, method: str, data_path: str, size: str) -> dict:
    """A cold fit (seed 0) and a second fit (seed 1) of one pair in this fresh process: wall (fit and tree), the
    run stage's seconds (``tree.attrs``), every program built."""
    import time

    import inference
    import zoo

    spec, data = zoo.get(model), _load(data_path)
    options = {**_options(spec, method, size), "progress": False}
    log.take()
    out = {}
    for label, seed in (("cold", 0), ("second", 1)):
        start = time.perf_counter()
        tree = inference.fit(model, data, method, seed=seed, **options)
        wall = time.perf_counter() - start
        stage = float(tree.attrs.get("compile_seconds", 0.0)) + float(tree.attrs.get("run_seconds", 0.0))
        out[label] = _summary(*log.take(), wall, run_stage_s=round(stage, 3), cache_hits=log.hits)
    return out


class _Captured(BaseException):
    """Raised by the loop's stand-in program at its first call: the kernel's step and its arguments' shapes
    (a BaseException, so no ``except Exception`` of a method turns it into an error of its own)."""

    def __init__(self, step, state, key, problem, options=()) -> None:
        super().__init__("captured")
        self.step, self.state, self.key, self.problem, self.options = step, state, key, problem, dict(options)


def _stand_in(builder: str):
    """A stand-in for ``inference.loop.<builder>``: the loop calls the program it returns with (carry or state,
    key, problem, ...); it raises ``_Captured`` with one restart's (one chain's) state shape: the leading restart
    or chain axis dropped, and the compiler options the fit's program would have had (the optimiser's
    ``options``, the builder's last argument)."""
    import jax

    def build(init, step, *args, **kwargs):
        options = kwargs.get("options", args[4] if builder == "_optimiser_program" and len(args) > 4 else ())

        def program(first, key, problem, *rest):
            state = first[0] if builder == "_optimiser_program" else first
            one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), state)
            raise _Captured(step, one, key, problem, options)

        return program

    return build


def child_floor(log: ProgramLog, model: str, method: str, data_path: str, size: str) -> dict:
    """The floor of a pair in this fresh process: the compile seconds of one step of its kernel alone, jitted on
    the shapes of the demo fit with the compiler options of the fit's program (``jax.jit(step,
    compiler_options=...).lower(key, state, problem).compile()``), after an empty program (``x + 1.0``, timed
    apart: what the first program of a process costs whatever its size). The step is taken from the fit itself:
    the loop's program builders (``inference.loop._optimiser_program``, ``_sampler_program``) are replaced by
    stand-ins that stop the fit at its first call. ``svi``: one ``SVI.stable_update`` of its guide and optimiser.
    Methods that run no JAX kernel (scikit-learn's) have none."""
    import time

    import jax
    import numpy as np

    import inference
    import zoo
    from inference import loop, programs

    spec, data = zoo.get(model), _load(data_path)
    options = {**_options(spec, method, size), "progress": False}
    log.take()
    compiler_options = {}
    if method == "svi":
        step, args = _svi_step(spec, data, options)
    else:
        for builder in ("_optimiser_program", "_sampler_program"):
            setattr(loop, builder, _stand_in(builder))
        try:
            with programs.compiling_ahead(False):   # the densities are compiled below, timed apart
                inference.fit(model, data, method, seed=0, **options)
            return {"floor": None, "why": "no kernel run by inference.loop (not a JAX kernel)"}
        except _Captured as got:
            key = jax.eval_shape(lambda k: jax.random.fold_in(k, 0), got.key)
            step, args, compiler_options = got.step, (key, got.state, got.problem), got.options
    density, density_args = _densities_program(spec, data, method, options)
    before = log.take()[0]
    start = time.perf_counter()
    jax.jit(lambda x: x + 1.0).lower(np.float64(0.0)).compile()   # what any first program costs here
    empty = _summary(*log.take(), time.perf_counter() - start)
    start = time.perf_counter()
    jax.jit(step, compiler_options=compiler_options).lower(*args).compile()
    wall = time.perf_counter() - start
    out = {"floor": _summary(*log.take(), wall), "empty": empty, "before": len(before)}
    start = time.perf_counter()
    density.lower(*density_args).compile()
    out["densities"] = _summary(*log.take(), time.perf_counter() - start)
    return out


def _densities_program(spec, data, method: str, options: dict):
    """The program every fit builds for its tree (``inference.trees._log_density_program``: log prior and log
    likelihood of a batch of draws) and its arguments as the fit passes them: the data arrays and a batch of the
    model's latent sites, shaped as a prior draw shapes them (``jax.eval_shape``: nothing compiles)."""
    import jax
    from numpyro import handlers

    import inference
    from inference import trees

    ctx = inference.prepare(spec.name, data, method, seed=0, **options).context
    arrays, static = trees.split_arguments(ctx.model_kwargs)

    def prior(arrays):
        tr = handlers.trace(handlers.seed(spec.model, 0)).get_trace(**dict(static), **arrays)
        return {n: s["value"] for n, s in tr.items() if s["type"] == "sample" and not s["is_observed"]}

    batch = 64   # trees.log_densities' default batch
    draws = {k: jax.ShapeDtypeStruct((batch, *v.shape), v.dtype) for k, v in jax.eval_shape(prior, arrays).items()}
    return trees._log_density_program(spec.model, tuple(spec.likelihood_sites), static, batch), (arrays, draws)


def _svi_step(spec, data, options):
    """``(state, arrays) -> state``: one ``SVI.stable_update`` as ``inference.svi``'s step program builds it (guide,
    Adam, ELBO of the fit's settings; the guide set up by ``SVI.init`` inside the trace, its result unused), with
    the state's shapes traced abstractly (``jax.eval_shape``: nothing compiles)."""
    import jax
    import optax
    from numpyro.infer import SVI, Trace_ELBO

    import inference
    from inference.svi import make_guide
    from inference.trees import split_arguments

    ctx = inference.prepare(spec.name, data, "svi", seed=0, **options).context
    o = ctx.options
    arrays, static = split_arguments(ctx.model_kwargs)

    def fresh(arrays):
        guide = make_guide(spec.model, o["guide"], o["init"], o["rank"])
        svi = SVI(spec.model, guide, optax.adam(o["learning_rate"]), Trace_ELBO(num_particles=o["num_particles"]))
        return svi, {**dict(static), **arrays}

    def init(key, arrays):
        svi, kwargs = fresh(arrays)
        return svi.init(key, **kwargs)

    def step(state, arrays):
        svi, kwargs = fresh(arrays)
        svi.init(jax.random.key(0), **kwargs)   # sets the guide up, as inference.svi's programs do; XLA drops it
        return svi.stable_update(state, **kwargs)

    key = jax.eval_shape(lambda: jax.random.key(0))
    return step, (jax.eval_shape(init, key, arrays), arrays)


def child_nuts(log: ProgramLog, side: str, model: str, data_path: str, cap: int, size: str = "demo") -> dict:
    """One side of NUTS against NumPyro, in this fresh process: ``ours`` = ``inference.fit(model, data, "nuts")``
    (seed 0, then seed 1); ``numpyro`` = ``MCMC(NUTS(model), ...).run(key, **data)`` (NumPyro's defaults where we
    set nothing: ``jit_model_args=False``), then ``run`` again with another key, on the same model (the spec's
    ``nuts_reformulation`` where ours samples it), data, kernel and chain settings, extra fields and iterations
    (``num_warmup``, ``num_samples`` at most ``cap``). Compile seconds of both: the union of JAX's compile spans
    (tracing, lowering, XLA) inside the call."""
    import time

    import jax
    from numpyro.infer import MCMC, NUTS

    import inference
    import zoo
    from inference import nuts
    from inference._init_strategies import INIT_STRATEGIES
    from inference.trees import split_arguments

    spec, data = zoo.get(model), _load(data_path)
    options = {**_options(spec, "nuts", size), "progress": False}
    for name in ("num_warmup", "num_samples"):
        options[name] = min(options.get(name, cap), cap)
    log.take()
    out = {}
    if side == "ours":
        for label, seed in (("first", 0), ("second", 1)):
            start = time.perf_counter()
            tree = inference.fit(model, data, "nuts", seed=seed, **options)
            wall = time.perf_counter() - start
            out[label] = _summary(*log.take(), wall, sampling_compile_s=round(tree.attrs["compile_seconds"], 3),
                                  reformulation=str(tree.attrs.get("nuts_reformulation", "")))
        return {**out, "cap": cap}
    ctx = inference.prepare(model, data, "nuts", seed=0, **options).context
    o, kwargs = ctx.options, ctx.model_kwargs
    reform = spec.nuts_reformulation
    if reform is not None and not (o["reformulate"] and reform.applies(kwargs)):
        reform = None
    chains = o["num_chains"]
    method = nuts.chain_method(chains) if hasattr(nuts, "chain_method") else "parallel"
    kernel = NUTS(reform.model if reform else spec.model, dense_mass=o["dense_mass"],
                  target_accept_prob=o["target_accept_prob"], max_tree_depth=o["max_tree_depth"],
                  init_strategy=INIT_STRATEGIES[o["init"]])
    mcmc = MCMC(kernel, num_warmup=o["num_warmup"], num_samples=o["num_samples"], num_chains=chains,
                thinning=o["thinning"], chain_method=method, progress_bar=False)
    arrays, static = split_arguments(kwargs)
    extra = getattr(nuts, "EXTRA_FIELDS", ())
    keys = [jax.random.PRNGKey(s) for s in (0, 1)]   # as a NumPyro user makes them
    log.take()
    for label, key in zip(("first", "second"), keys, strict=True):
        start = time.perf_counter()
        mcmc.run(key, **dict(static), **arrays, extra_fields=extra)
        jax.block_until_ready(mcmc.get_samples())
        wall = time.perf_counter() - start
        out[label] = _summary(*log.take(), wall, reformulation=reform.name if reform else "",
                              chain_method=method)
    return {**out, "cap": cap}


def child_main(argv: list[str]) -> None:
    """``child TASK ...`` in a fresh process (``_spawn``): one JSON line ``RESULT {...}``."""
    import os

    log = ProgramLog(os.environ.get("BENCH_COMPILE_DUMP"))
    task, *args = argv
    if task == "fit":
        got = child_fit(log, *args)
    elif task == "floor":
        got = child_floor(log, *args)
    elif task in ("ours", "numpyro"):
        got = child_nuts(log, task, args[0], args[1], int(args[2]), *args[3:])
    else:
        raise SystemExit(f"unknown child task {task!r}")
    flags = os.environ.get("XLA_FLAGS", "").split()
    got["xla_flags"] = " ".join(f for f in flags if not f.startswith("--xla_dump"))
    print("RESULT " + json.dumps(got), flush=True)


def _spawn(task: str, args: list[str], timeout: float, hlo: bool = True) -> dict:
    """``child_main(task, *args)`` in a fresh Python process of this tree, with an empty persistent compilation
    cache (``BAYES_ZOO_JAX_CACHE``) and an XLA dump folder of its own on a RAM disk where there is one; both are
    removed after. Returns its result, or ``{"error": ...}``."""
    import shutil
    import subprocess
    import sys
    import tempfile

    ram = "/dev/shm" if Path("/dev/shm").is_dir() else None
    cache, dump = tempfile.mkdtemp(prefix="bz-cache-"), tempfile.mkdtemp(prefix="bz-dump-", dir=ram)
    flags = os.environ.get("XLA_FLAGS", "") + (f" --xla_dump_to={dump} --xla_dump_hlo_as_text" if hlo else "")
    env = {**os.environ, "PYTHONPATH": str(REPO), "BAYES_ZOO_JAX_CACHE": cache, "MPLBACKEND": "Agg",
           "XLA_FLAGS": flags.strip(), "BENCH_COMPILE_DUMP": dump if hlo else ""}
    try:
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_compile", "child", task, *args], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(dump, ignore_errors=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        errors = [line for line in done.stderr.splitlines() if re.match(r"[\w.]*(Error|Exception|Exit)\b", line)]
        tail = (errors or done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {"error": tail[:300]}
    return json.loads(lines[-1][len("RESULT "):])


def _data_file(model: str, size: str, out: Path = OUT) -> str:
    """The model's demo (or tiny) dataset of seed 0 pickled once, as NumPy arrays, so that a child's first
    compilation is its fit's: simulating it in the child would compile the simulator first."""
    import pickle

    import jax
    import numpy as np

    import zoo

    path = out / "data" / f"{model}-{size}.pkl"
    if not path.is_file():
        spec = zoo.get(model)
        data = (spec.tiny_data() if size == "tiny" else spec.default_data())[0]
        data = {k: np.asarray(v) if isinstance(v, jax.Array) else v for k, v in data.items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            pickle.dump(data, f)
    return str(path)


def _read_jsonl(path: Path) -> dict[tuple[str, str], dict]:
    rows = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["pair"], row["task"]] = row
    return rows


def run_tasks(tasks: list[tuple[str, str, list[str], float]], path: Path, jobs: int, hlo: bool = True) -> dict:
    """Run ``(pair, task, child args, timeout)`` tasks, ``jobs`` at a time, skipping those ``path`` (JSON lines)
    already holds without an error; each result is appended as it comes, with a progress line."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor, as_completed

    done = {k: v for k, v in _read_jsonl(path).items() if "error" not in v}
    todo = [t for t in tasks if (t[0], t[1]) not in done]
    print(f"{len(tasks) - len(todo)} of {len(tasks)} tasks already in {path}; running {len(todo)}, {jobs} at a "
          "time", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock, start = threading.Lock(), time.time()

    def one(pair: str, task: str, args: list[str], timeout: float) -> dict:
        t0 = time.time()
        got = _spawn(task.split("#")[0], args, timeout, hlo)   # "ours#2": the task "ours", its third run
        return {"pair": pair, "task": task, "seconds": round(time.time() - t0, 1), "code": _code(), **got}

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one, *t) for t in todo]
        for n, future in enumerate(as_completed(futures), 1):
            row = future.result()
            with lock, open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
            done[row["pair"], row["task"]] = row
            elapsed = time.time() - start
            eta = elapsed / n * (len(todo) - n)
            print(f"[{n}/{len(todo)} {elapsed:5.0f} s, ~{eta:.0f} s left] {row['pair']} {row['task']}: "
                  f"{_brief(row)}", flush=True)
    return done


def _code() -> str:
    """The commit of this tree, ``+`` where its tracked files differ from it."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


def _brief(row: dict) -> str:
    if "error" in row:
        return "ERROR " + row["error"]
    parts = []
    for label in ("cold", "second", "first", "floor"):
        r = row.get(label)
        if isinstance(r, dict):
            parts.append(f"{label} {r['wall_s']:.2f} s wall, {r['compile_s']:.2f} s compile, {r['programs']} "
                         f"programs")
    return "; ".join(parts) or row.get("why", "")


def _pairs(only: list[str], classes: tuple[str, ...]) -> list[tuple[str, str]]:
    import inference
    import zoo

    return [(m, k) for m in zoo.list_models() for k in inference.methods_for(m)
            if method_class(k) in classes and (not only or f"{m}/{k}" in only or m in only)]


def _programs_cell(programs: list[dict], top: int = 4) -> str:
    """The largest programs by XLA seconds: ``name xla s / HLO ops``, then the eager ones summed."""
    ours = sorted((p for p in programs if not p["eager"]), key=lambda p: -p["xla_s"])
    eager = [p for p in programs if p["eager"]]
    cells = [f"{p['name']} {p['xla_s']:.2f} s / {p['hlo_ops'] if p['hlo_ops'] is not None else '?'} ops"
             for p in ours[:top]]
    if len(ours) > top:
        cells.append(f"{len(ours) - top} more {sum(p['xla_s'] for p in ours[top:]):.2f} s")
    if eager:
        cells.append(f"{len(eager)} eager {sum(p['xla_s'] for p in eager):.2f} s")
    return "; ".join(cells) or "none"


def cold_demo_rows(rows: dict, pairs: list[tuple[str, str]]) -> list[dict]:
    """The table of ``cold-demo``: one row per pair that has both tasks."""
    out = []
    met = 0
    for model, method in pairs:
        pair = f"{model}/{method}"
        fit, floor = rows.get((pair, "fit"), {}), rows.get((pair, "floor"), {})
        target = TARGET_SECONDS[method_class(method)]
        row = {"model/method": pair, "target s": f"{target:g}"}
        if "cold" not in fit:
            row["cold wall s"] = "error: " + fit.get("error", "not run")[:120]
            out.append(row)
            continue
        cold, second = fit["cold"], fit["second"]
        row.update({"cold wall s": f"{cold['wall_s']:.2f}", "compile s": f"{cold['compile_s']:.2f}",
                    "run stage s": f"{cold['run_stage_s']:.2f}",
                    "tree s": f"{max(cold['wall_s'] - cold['run_stage_s'], 0):.2f}",
                    "XLA programs (eager)": f"{cold['programs']} ({cold['eager']})",
                    "programs: XLA s / HLO ops": _programs_cell(cold["program_list"]),
                    "2nd fit: programs, wall s": f"{second['programs']}, {second['wall_s']:.2f}"})
        f, d = floor.get("floor"), floor.get("densities")
        floor_s = None
        if f:
            step = max((p for p in f["program_list"] if not p["eager"]), key=lambda p: p["xla_s"], default=None)
            ops = step["hlo_ops"] if step else None
            cell = f"{f['compile_s']:.2f} ({ops if ops is not None else '?'})"
            floor_s = f["compile_s"]
            if d:   # the tree's densities program, which every fit builds too
                dens = max((p for p in d["program_list"] if not p["eager"]), key=lambda p: p["xla_s"], default=None)
                dops = dens["hlo_ops"] if dens else None
                cell += f" + densities {d['compile_s']:.2f} ({dops if dops is not None else '?'})"
                floor_s += d["compile_s"]
            row["floor: one step s (HLO ops)"] = cell
            row["empty program s"] = f"{floor['empty']['compile_s']:.2f}" if "empty" in floor else "?"
        else:
            row["floor: one step s (HLO ops)"] = floor.get("why") or floor.get("error", "not run")[:120]
        if cold["wall_s"] <= target:
            row["verdict"], met = "met", met + 1
        elif floor_s is not None and floor_s >= target:
            what = "one step and the densities program alone compile" if d else "one step alone compiles"
            row["verdict"] = f"out of reach: {what} in {floor_s:.2f} s"
        else:
            row["verdict"] = "missed"
        out.append(row)
    fits = [r for r in out if "compile s" in r]
    if fits:
        out.append({"model/method": f"{met} of {len(fits)} within target",
                    "cold wall s": f"{sum(float(r['cold wall s']) for r in fits):.1f}",
                    "compile s": f"{sum(float(r['compile s']) for r in fits):.1f}"})
    return out


def _runs(rows: dict, model: str, side: str) -> list[dict]:
    """Every run of one side for one model, in the order of their repetition (``side``, ``side#1``, ...)."""
    found = [(int(t.partition("#")[2] or 0), r) for (m, t), r in rows.items() if m == model and t.split("#")[0] == side]
    return [r for _, r in sorted(found, key=lambda x: x[0])]


def _spread(values: list[float]) -> str:
    """``median [min-max]`` (the median alone for one value)."""
    import statistics

    med = statistics.median(values)
    return f"{med:.2f}" + (f" [{min(values):.2f}-{max(values):.2f}]" if len(values) > 1 else "")


def _pair_ratio(pairs: list[tuple[dict, dict]], key_a: str, key_b: str) -> str:
    """``_spread`` of ``ours[key_a] / numpyro[key_b]`` over the pairs' first runs."""
    return _spread([a["first"].get(key_a, 0.0) / max(b["first"].get(key_b, 0.0), 1e-9) for a, b in pairs])


def _mapping_seconds(run: dict) -> float:
    """Lowering and XLA seconds of the program that maps a reformulation's draws to the model's sites."""
    return sum(p["xla_s"] + p["lower_s"] for p in run["program_list"] if p["name"] == "to_sites")


def nuts_rows(rows: dict, models: list[str]) -> list[dict]:
    """One row per model: medians over the runs of each side, the ratios of the pairs run back to back (``ours#k``
    beside ``numpyro#k``) with their range."""
    import functools
    import statistics

    out = []
    for model in models:
        ours = [r for r in _runs(rows, model, "ours") if "first" in r]
        theirs = [r for r in _runs(rows, model, "numpyro") if "first" in r]
        row = {"model": model}
        if not ours or not theirs:
            bad = [r for r in _runs(rows, model, "ours") + _runs(rows, model, "numpyro") if "error" in r]
            row["error"] = "; ".join(f"{r['task']}: {r['error'][:100]}" for r in bad) or "not run"
            out.append(row)
            continue
        pairs = list(zip(ours, theirs, strict=False))
        a, b = ours[0]["first"], theirs[0]["first"]
        med = lambda runs, key: statistics.median(r["first"].get(key, 0.0) for r in runs)  # noqa: E731
        ratio = functools.partial(_pair_ratio, pairs)
        cpu = all(r["first"].get("compile_cpu_s") for r in ours + theirs)
        mapping = statistics.median(_mapping_seconds(r["first"]) for r in ours)
        row.update({
            "sampled": a["reformulation"] or "the model", "chain method": b["chain_method"],
            "runs (pairs)": f"{len(pairs)}", "code": ", ".join(sorted({r.get("code", "?") for r in ours})),
            "iterations (warm-up, kept) at most": str(ours[0].get("cap", NUTS_CAP)),
            "ours: sampling compile s": f"{med(ours, 'sampling_compile_s'):.2f}",
            "ours: fit compile s (tree too)": f"{med(ours, 'compile_s'):.2f}",
            "NumPyro MCMC.run compile s": f"{med(theirs, 'compile_s'):.2f}",
            "ours sampling / NumPyro": ratio("sampling_compile_s", "compile_s"),
            "ours fit / NumPyro": ratio("compile_s", "compile_s"),
            "compile CPU s: ours fit, NumPyro": (f"{med(ours, 'compile_cpu_s'):.2f}, {med(theirs, 'compile_cpu_s'):.2f}"
                                                 if cpu else "-"),
            "CPU: ours fit / NumPyro": ratio("compile_cpu_s", "compile_cpu_s") if cpu else "-",
            "ours: to_sites program s (lowering + XLA)": f"{mapping:.2f}" if mapping else "-",
            "ours fit less to_sites / NumPyro": _spread([(x["first"]["compile_s"] - _mapping_seconds(x["first"]))
                                                         / max(y["first"]["compile_s"], 1e-9) for x, y in pairs])
            if mapping else "-",
            "programs (eager): ours, NumPyro": f"{a['programs']} ({a['eager']}), {b['programs']} ({b['eager']})",
            "largest program: ours, NumPyro": " ; ".join(_programs_cell(s["program_list"], 1).split("; ")[0]
                                                         for s in (a, b)),
            "2nd run compile s: ours, NumPyro": f"{statistics.median(r['second']['compile_s'] for r in ours):.2f}, "
                                                f"{statistics.median(r['second']['compile_s'] for r in theirs):.2f}",
            "first wall s: ours, NumPyro": f"{med(ours, 'wall_s'):.1f}, {med(theirs, 'wall_s'):.1f}"})
        out.append(row)
    return out


COLD_NOTE = ("One fresh process per pair and task, an empty persistent compilation cache each, the demo data "
             "(seed 0) made beforehand and the demo options, no progress bar. cold wall: `inference.fit` of the "
             "first fit, tree included; compile: the union of JAX's compile spans in it (tracing, lowering, XLA); "
             "run stage: the tree's compile_seconds + run_seconds, tree: the rest; programs: every XLA program "
             "built (eager: a single JAX operation), the largest by XLA seconds with the instructions of the HLO "
             "module XLA was given (dumped before its optimisations). 2nd fit: seed 1 in the same process. floor: "
             "another fresh process compiles an empty program (x + 1.0, its seconds shown), then one step of the "
             "kernel alone with the compiler options of the fit's program (`jax.jit(step, compiler_options=...)"
             ".lower(...).compile()`; the optimisers' at XLA backend level 0, `programs.ONE_SHOT`), "
             "the loop's program builders stood in for, the step's arguments those the fit would pass; svi: one "
             "`SVI.stable_update`), its compile seconds and HLO ops, then the tree's densities program that every "
             "fit builds (log prior and log likelihood of a batch of 64 draws): where the two together pass the "
             "target, no fit that runs the kernel can meet it. Targets (issue 28): a hand-written kernel 2 s, SVI "
             "(svi, svi_concrete) 4 s.")
NUTS_NOTE = ("One fresh process per side, an empty persistent compilation cache each, the demo data and the demo "
             "options with num_warmup and num_samples capped (compile seconds do not depend on them). ours: "
             "`inference.fit(model, data, 'nuts')`; sampling compile: the tree's compile_seconds (the run "
             "stage), fit compile: the whole fit's (the tree's log densities too). NumPyro: `MCMC(NUTS(model), "
             "...).run(key, **data)` with the same model (the spec's NUTS reformulation where ours samples it), "
             "kernel settings, chains, chain method, extra fields and iterations, NumPyro's defaults otherwise. "
             "Compile seconds: the union of JAX's compile spans inside the call, the same measure on both sides; "
             "compile CPU s: the process's CPU seconds inside those spans (less inflated by a loaded machine). "
             "Runs: each side run that many times, the two sides of a run back to back, ours first in even runs, "
             "NumPyro first in odd ones; seconds are medians over the runs, ratios the median [range] of the "
             "runs' ratios. ours sampled: ours maps the reformulation's draws back to the model's sites "
             "(`to_sites`, a program of its own, in the sampling compile) and evaluates the log densities; "
             "NumPyro's MCMC.run does neither. "
             "2nd run: seed 1 (ours: a second fit; NumPyro: `run` again on the same MCMC).")


def cli(argv: list[str]) -> int:
    import argparse
    import time

    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_compile", description=(
        "cold-demo: every hand-written kernel's and SVI's cold demo fit and its floor; nuts: NUTS beside "
        "NumPyro's MCMC.run; report: their tables (into benchmarks/results.md with --write). Results go to "
        "build/bench_compile/<mode>.jsonl as they come; a rerun skips what is there (--fresh: start over)."))
    p.add_argument("mode", choices=("cold-demo", "nuts", "report"))
    p.add_argument("--only", default="", help="comma-separated model/method pairs or models")
    p.add_argument("--jobs", type=int, default=1, help="child processes at a time")
    p.add_argument("--size", choices=("demo", "tiny"), default="demo", help="tiny: check the code quickly")
    p.add_argument("--cap", type=int, default=NUTS_CAP, help="nuts: num_warmup and num_samples at most")
    p.add_argument("--repeat", type=int, default=1, help="nuts: runs of each side per model, in alternating order")
    p.add_argument("--timeout", type=float, default=600, help="seconds per child process")
    p.add_argument("--no-hlo", action="store_true", help="no XLA dump (op counts '?'), to see what dumping costs")
    p.add_argument("--fresh", action="store_true", help="discard earlier results of this mode")
    p.add_argument("--out", type=Path, default=OUT, help="folder of the JSON lines and the pickled data sets")
    p.add_argument("--write", action="store_true", help="write the tables into benchmarks/results.md (demo size "
                   "only; cold-demo and nuts: report when done)")
    a = p.parse_args(argv)
    only = [s for s in a.only.split(",") if s]
    suffix = "" if a.size == "demo" else "-tiny"
    paths = {"cold-demo": a.out / f"cold-demo{suffix}.jsonl", "nuts": a.out / f"nuts{suffix}.jsonl",
             "nuts-before": a.out / f"nuts-before{suffix}.jsonl"}
    started = time.time()
    if a.mode in paths and a.fresh:
        paths[a.mode].unlink(missing_ok=True)
    if a.mode == "cold-demo":
        pairs = _pairs(only, ("kernel", "svi"))
        tasks = [(f"{m}/{k}", task, [m, k, _data_file(m, a.size, a.out), a.size], a.timeout)
                 for m, k in pairs for task in ("fit", "floor")]
        run_tasks(tasks, paths[a.mode], a.jobs, not a.no_hlo)
    elif a.mode == "nuts":
        models = [m for m, _ in _pairs(only, ("nuts",))]
        # run k of every model, the two sides back to back, ours first in even runs, NumPyro first in odd ones
        tasks = [(m, side + (f"#{k}" if k else ""), [m, _data_file(m, a.size, a.out), str(a.cap), a.size], a.timeout)
                 for k in range(a.repeat) for m in models
                 for side in (("ours", "numpyro") if k % 2 == 0 else ("numpyro", "ours"))]
        run_tasks(tasks, paths[a.mode], a.jobs, not a.no_hlo)
    if a.mode == "report" or a.write:
        report(paths, only, a.cap, write=a.write and a.size == "demo")
    print(f"done in {time.time() - started:.0f} s", flush=True)
    return 0


def report(paths: dict[str, Path], only: list[str], cap: int, write: bool = True) -> None:
    """The two tables from the JSON lines there are, printed and (``write``) written to results.md, sections
    ``compile_cold`` (cold-demo) and ``compile_nuts`` (nuts; a mode without results leaves its section as it is),
    the machine described as the harness does."""
    from benchmarks.harness import Harness

    h = Harness()
    cold, nuts = _read_jsonl(paths["cold-demo"]), _read_jsonl(paths["nuts"])
    before = _read_jsonl(paths["nuts-before"]) if "nuts-before" in paths else {}

    def said(rows: dict) -> str:
        flags = sorted({r.get("xla_flags", "") for r in rows.values() if "error" not in r})
        return f" XLA_FLAGS of the child processes: {', '.join(f'`{f}`' for f in flags)}." if flags else ""

    if cold:
        h.start("compile_cold")
        h.table("Cold demo fits of every hand-written kernel and SVI: programs, compile seconds, HLO ops, and "
                "the floor", cold_demo_rows(cold, _pairs(only, ("kernel", "svi"))), note=COLD_NOTE + said(cold))
    if nuts:
        h.start("compile_nuts")
        h.table("NUTS beside NumPyro's own MCMC.run: compile seconds, same model, data and settings",
                nuts_rows(nuts, [m for m, _ in _pairs(only, ("nuts",))]), note=NUTS_NOTE + said(nuts))
        if before:
            h.table("The same before this session's change of the sampling program (one run per side; no CPU "
                    "seconds measured then)", nuts_rows(before, [m for m, _ in _pairs(only, ("nuts",))]),
                    note="build/bench_compile/nuts-before.jsonl: runs of the code named in the code column.")
    if write and (cold or nuts):
        h.write()


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["child"]:
        child_main(sys.argv[2:])
        raise SystemExit(0)
    if sys.argv[1:2] and sys.argv[1] in ("cold-demo", "nuts", "report"):
        raise SystemExit(cli(sys.argv[1:]))
    # python benchmarks/bench_compile.py counts TREE tiny|demo [model/method ...]: JSON lines of compile counts
    if sys.argv[1:2] == ["counts"]:
        for row in count_compiles(sys.argv[2], sys.argv[3], tuple(sys.argv[4:])):
            print(json.dumps(row))
    # python benchmarks/bench_compile.py budgets TREE: JSON lines of the XLA programs of a fit with other budgets
    if sys.argv[1:2] == ["budgets"]:
        for row in count_budget_compiles(sys.argv[2]):
            print(json.dumps(row))

