"""At which sizes the ssgp VB's run program should be compiled at XLA backend level 0 (``programs.ONE_SHOT``) or at
XLA's default (``programs.OPTIMISED``): ``inference.ssgp.vb.compiler_options`` chooses by Np m^2.

For each model and table size (``n_groups`` x ``per_group`` rows simulated with seed 0, ``m`` spectral points), one
fresh process per level (an empty persistent compilation cache each, the two levels back to back, their order
alternating): a cold ``vb`` fit (seed 0), then a second fit (seed 1) whose run stage is the sweeps alone.
Reported: the cold fit's wall and CPU seconds (XLA compiles on every core, so CPU seconds are the steadier
measure on a shared machine), the second fit's run seconds, sweeps, and the level ``compiler_options`` picks.
``BENCH_SSGP_LEVEL_REPEATS`` (default 2) processes per level and size; medians.
"""

from __future__ import annotations

import os
import statistics

from benchmarks.harness import REPO, run_child

CHILD = """
import json, resource, sys, time
import numpyro
import inference, zoo
import inference.programs as programs
import inference.ssgp.vb as vb
from inference.ssgp import problem

model, n_groups, per_group, m, level = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
chosen = vb.compiler_options
vb.compiler_options = lambda cfg: programs.ONE_SHOT if level == "0" else programs.OPTIMISED
spec = zoo.get(model)
data, _ = spec.simulate(0, n_groups=n_groups, per_group=per_group)
options = {**spec.settings.demo_options.get("vb", {}), "m": m}


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


c0, t0 = cpu(), time.perf_counter()
inference.fit(model, data, "vb", seed=0, progress=False, **options)
wall, cpu_s = time.perf_counter() - t0, cpu() - c0
second = inference.fit(model, data, "vb", seed=1, progress=False, **options)
hyper = {**spec.default_hyper, "m": m}
cfg, _ = problem.setup(spec.inputs(data, hyper), hyper, problem.LIKELIHOOD_OF[model])
print(json.dumps({"wall": wall, "cpu": cpu_s, "run": second.attrs["run_seconds"], "sweeps": second.attrs["n_iter"],
                  "size": cfg.n_chunks * cfg.chunk * cfg.m ** 2,
                  "picked": "0" if chosen(cfg) == programs.ONE_SHOT else "default"}))
"""

SIZES = ((10, 20, 10), (20, 50, 10), (20, 50, 20), (40, 50, 20))   # (n_groups, per_group, m); the first: the demo's


def main(h) -> None:
    repeats = int(os.environ.get("BENCH_SSGP_LEVEL_REPEATS", "2"))
    models = [m for m in os.environ.get("BENCH_SSGP_LEVEL_MODELS", "ssgp_lmm,ssgp_probit").split(",") if m]
    rows = []
    for model in models:
        for n_groups, per_group, m in SIZES:
            args = (model, str(n_groups), str(per_group), str(m))
            got = {"0": [], "default": []}
            for r in range(repeats):
                for level in (("0", "default") if r % 2 == 0 else ("default", "0")):
                    got[level].append(run_child(REPO, CHILD, *args, level))
            errors = [g["error"] for runs in got.values() for g in runs if "error" in g]
            if errors:
                rows.append({"model": model, "rows x m": f"{n_groups * per_group} x {m}", "error": errors[0][:200]})
                print(rows[-1], flush=True)
                continue
            med = {lv: {k: statistics.median(g[k] for g in runs) for k in ("wall", "cpu", "run", "sweeps")}
                   for lv, runs in got.items()}
            first = got["0"][0]
            rows.append({
                "model": model, "rows x m": f"{n_groups * per_group} x {m}", "Np m^2": first["size"],
                "sweeps": int(med["0"]["sweeps"]),
                "cold wall s: level 0 / default": f"{med['0']['wall']:.2f} / {med['default']['wall']:.2f}",
                "cold CPU s: level 0 / default": f"{med['0']['cpu']:.2f} / {med['default']['cpu']:.2f}",
                "2nd fit's run s: level 0 / default": f"{med['0']['run']:.3f} / {med['default']['run']:.3f}",
                "cold wall + 2nd run: level 0 / default": (f"{med['0']['wall'] + med['0']['run']:.2f} / "
                                                          f"{med['default']['wall'] + med['default']['run']:.2f}"),
                "compiler_options picks": first["picked"]})
            print(rows[-1], flush=True)
    h.table(f"ssgp VB's run program at XLA backend level 0 and at XLA's default, by table size (median of {repeats} "
            "fresh processes per level)", rows,
            note=("cold: a fit in a fresh process with an empty persistent cache (compile and run; the tree too); "
                  "2nd fit's run s: the sweeps of a second fit (seed 1) in the same process. Level 0 pays where "
                  "the cold wall plus a run is smaller. `compiler_options picks`: the level "
                  "`inference.ssgp.vb.compiler_options` gives this size (0 up to Np m^2 = 2^17)."))
