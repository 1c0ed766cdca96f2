"""Measured error rates of the pass rule itself, per model and exact method: the campaign of
``diagnostics.error_rates`` (its docstring says what is run and judged) over every registered model, and its
two tables in ``benchmarks/results.md``.

Every run is checkpointed (``BENCH_VERDICTS_DIR``, default ``build/bench_verdicts/``, one JSON per run with
the settings it was made with), so an interrupted campaign resumes. ``BENCH_VERDICTS_WORKERS`` processes run
in parallel (each with single-threaded XLA); ``BENCH_VERDICTS_DEADLINE`` (seconds) stops starting new runs
after that long, and ``BENCH_VERDICTS_ONLY`` (``model/method`` names, comma-separated) limits the cases.
``BENCH_VERDICTS_RUNS`` sets the number of runs per case (default 20). Every number in the table is counted from
the checkpoints of the real runs.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from diagnostics.error_rates import (
    FOLDS,
    GOAL,
    MEANFIELD_DRAWS,
    N_RUNS,
    SCALE,
    SEED_BASE,
    SHIFT,
    Case,
    campaign,
    compared_correlation,
    exact_cases,
)

REPO = Path(__file__).resolve().parent.parent


def checkpoint_dir() -> Path:
    return Path(os.environ.get("BENCH_VERDICTS_DIR", REPO / "build" / "bench_verdicts"))


# ------------------------------------------------------------------------------------------------- tables


def _count(recs: Sequence[dict | None], verdict: str) -> int:
    return sum(1 for r in recs if r is not None and r.get("verdict") == verdict)


def _others(recs: Sequence[dict | None], skip: str) -> str:
    c = collections.Counter(r["verdict"] for r in recs if r is not None and r.get("verdict") != skip)
    return ", ".join(f"{n} {v}" for v, n in sorted(c.items()))


def _cell(recs: Sequence[dict | None], verdict: str) -> str:
    recs = [r for r in recs if r is not None]
    if not recs:
        return "n/a"
    n = _count(recs, verdict)
    other = _others(recs, verdict)
    mark = "" if n >= GOAL * len(recs) / N_RUNS and len(recs) >= N_RUNS else " (!)"
    return f"{n}/{len(recs)}{mark}" + (f" ({other})" if other else "")


def _range(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    v = [x for x in values if x is not None and np.isfinite(x)]
    if not v:
        return "n/a"
    return f"{fmt.format(np.median(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"


def _top(labels: Sequence[str]) -> str:
    c = collections.Counter(labels)
    return ", ".join(f"{k} x{n}" for k, n in c.most_common(2))


def summary_rows(cases: Sequence[Case], records: Mapping[str, list[dict]], errors: Mapping[str, list[str]],
                 correlations: Mapping[str, float]) -> list[dict]:
    rows = []
    for c in cases:
        recs = sorted(records.get(c.key, []), key=lambda r: r["seed"])
        base = [r["base"] for r in recs]
        row = {"model": c.model, "method": c.label, "runs": len(recs),
               "false alarms: PASS": _cell(base, "PASS")}
        for what in ("shift", "scale"):
            for rule in ("worst", "random"):
                name = f"{'mean +0.3 sd' if what == 'shift' else 'sd x0.7'} ({rule}): FAIL"
                row[name] = _cell([r[f"{what}_{rule}"] for r in recs], "FAIL")
        row["detectable shift (sd)"] = _range([r["base"].get("detectable_shift") for r in recs])
        row["abs z of perturbed (worst): mean / sd"] = (
            _range([abs(r["shift_worst"]["z"]) for r in recs if r.get("shift_worst")], "{:.1f}") + " / " +
            _range([abs(r["scale_worst"]["z"]) for r in recs if r.get("scale_worst")], "{:.1f}"))
        row["z_crit"] = _range([r["base"].get("z_critical") for r in recs])
        row["perturbed (worst): mean / sd"] = (
            _top([r["shift_worst"]["label"] for r in recs if r.get("shift_worst")]) + " / " +
            _top([r["scale_worst"]["label"] for r in recs if r.get("scale_worst")]))
        row["eligible / compared"] = (f"{_range([r['n_eligible'] for r in recs], '{:.0f}')} / "
                                      f"{recs[0]['n_compared']}" if recs else "n/a")
        row["max abs corr (compared)"] = f"{correlations.get(c.model, float('nan')):.2f}"
        row["s per run (compile)"] = (f"{np.median([r['seconds'] for r in recs]):.0f} "
                                      f"({np.median([r['compile_seconds'] for r in recs]):.0f})" if recs else "n/a")
        if errors.get(c.key):
            row["errors"] = f"{len(errors[c.key])}: {errors[c.key][0][:120]}"
        rows.append(row)
    return rows


def meanfield_rows(models: Sequence[str], records: Mapping[str, list[dict]],
                   correlations: Mapping[str, float]) -> list[dict]:
    rows = []
    for m in models:
        recs = records.get(f"{m}/meanfield", [])
        if not recs:
            continue
        kl, mo = [r["kl"] for r in recs], [r["moments"] for r in recs]
        khat_fails = sum(1 for r in kl if r["verdict"] == "FAIL" and "k-hat" in (r["reasons"] or "")
                         and r.get("khat", 0) > 0.7)
        sd_fails = sum(1 for r in kl if r["verdict"] == "FAIL" and "too narrow" in (r["reasons"] or ""))
        rows.append({
            "model": m, "dimension (unconstrained)": recs[0]["dimension"],
            "max abs corr: compared / unconstrained": f"{correlations.get(m, float('nan')):.2f} / "
                                                     f"{recs[0]['max_abs_corr_unconstrained']:.2f}",
            "KL mean-field: min sd ratio sqrt(1 - R^2)": f"{recs[0]['min_sd_ratio_kl']:.2f}",
            "KL mean-field: FAIL": _cell(kl, "FAIL"),
            "of which k-hat > 0.7 / too narrow": f"{khat_fails} / {sd_fails}",
            "KL mean-field k-hat": _range([r.get("khat") for r in kl]),
            "moment-matched: FAIL (information)": _cell(mo, "FAIL"),
            "moment-matched k-hat": _range([r.get("khat") for r in mo]),
        })
    return rows


def main(h) -> None:
    import jax

    only = [s for s in os.environ.get("BENCH_VERDICTS_ONLY", "").split(",") if s]
    cases = exact_cases(only or None)
    mf_models = [m for m in FOLDS if not only or m in only or f"{m}/meanfield" in only]
    models = sorted({c.model for c in cases} | set(mf_models))
    n_runs = int(os.environ.get("BENCH_VERDICTS_RUNS", N_RUNS))
    workers = int(os.environ.get("BENCH_VERDICTS_WORKERS", "1"))
    deadline = float(os.environ["BENCH_VERDICTS_DEADLINE"]) if os.environ.get("BENCH_VERDICTS_DEADLINE") else None
    t0 = time.perf_counter()
    records, errors = campaign(cases, mf_models, checkpoints=checkpoint_dir(), n_runs=n_runs, workers=workers,
                               deadline=deadline)
    wall = time.perf_counter() - t0
    correlations = {m: compared_correlation(m) for m in models}
    h.table(
        f"False alarms and power of the verdict: independent runs per exact method at the demo settings (goal "
        f"{n_runs}; 'runs' = how many finished)",
        summary_rows(cases, records, errors, correlations),
        note=(f"Each run: a fit with seed {SEED_BASE}+i on the stored reference's data, judged against the stored "
              f"reference by `diagnostics.method_scores` (goal: PASS >= {GOAL}/{N_RUNS}). Power: the same run with "
              f"one compared quantity's mean shifted by {SHIFT} reference sd, or its sd scaled by {SCALE}, on the "
              "quantity where that is least detectable (worst) or a random one; goal FAIL >= "
              f"{GOAL}/{N_RUNS}. (!) marks a cell below the goal or with fewer than {N_RUNS} runs; other verdicts in "
              "brackets. Detectable shift: the verdict's (z_crit + 1.645) x max mcse_mean_sd, median (min-max). "
              "Eligible: quantities whose 0.3 sd exceeds their floor. Seconds: median wall time of one fit "
              f"(compile). This invocation: {wall:.0f} s on {workers} worker(s), JAX {jax.__version__}; reused "
              "runs keep the numbers of the machine that made them."))
    mf = meanfield_rows(mf_models, records, correlations)
    if mf:
        h.table(
            f"Power against a mean-field Gaussian fitted to the reference ({MEANFIELD_DRAWS} draws per seed)",
            mf,
            note=("KL mean-field: q(u) = N(m, diag(1/diag(Sigma^-1))) in the unconstrained coordinates of the model's "
                  "sites (the lam sign fold restored as an equal mixture), what mean-field VI converges to on a "
                  "Gaussian posterior; judged as an approximation (mean 0.2 sd, sd ratio 0.8-1.25, PSIS k-hat 0.7). "
                  "Moment-matched: N(m, diag(Sigma)), marginals right and correlations dropped, for information. "
                  "max abs corr: between two compared quantities of the reference / between two unconstrained "
                  "coordinates (folded)."))


if __name__ == "__main__":
    from benchmarks.__main__ import main as run

    raise SystemExit(run(["verdicts"]))
