"""Accuracy against compute (issue 31): every method of each model on its ladder of budgets
(``diagnostics.cost_accuracy``, default ladders and seeds), on the stored reference's data, all in one process
and one run, so the seconds of the methods of one model are side by side.

Per model, two tables: the time to reach the rule (the first budget at which every seed of a method meets its
rule, with its run seconds; else "not within the ladder" and the error it plateaus at), and the ladder's
compile count (XLA programs built over all its fits against those of its first fit: a ladder whose budgets are
arguments of the compiled programs builds no program after its first fit).

Each model's frame is checkpointed to ``BENCH_CA_DIR`` (default ``build/bench_cost_accuracy/<model>.csv``) and
reused by a rerun (delete it to measure again); beside it ``<model>.commit`` (the code it ran on) and
``<model>.load`` (the box's load average when it started and ended), which the model's tables state.
``BENCH_CA_MODELS``: comma-separated models (default: ppca, mppca, bpca, hlcr); ``BENCH_CA_METHODS``:
``model/method`` names to keep (default: every method);
``BENCH_CA_SAMPLER_CAP``: the most draws per chain a sampler's ladder goes to (default: none; the default
ladders go to twice the demo's setting); ``BENCH_CA_BEFORE``: a checkpoint folder of the same ladders run on
other code, compared program by program with this one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ("ppca", "mppca", "bpca", "hlcr")


def checkpoint_dir() -> Path:
    return Path(os.environ.get("BENCH_CA_DIR", REPO / "build" / "bench_cost_accuracy"))


def ladders(model: str, methods: list[str]) -> dict[str, list[int]]:
    import zoo
    from diagnostics.ladders import default_budgets
    from inference._methods import get_method

    cap = int(os.environ.get("BENCH_CA_SAMPLER_CAP", "0") or 0)
    out = {}
    for m in methods:
        ladder = default_budgets(model, m)
        if cap and get_method(zoo.get(model), m).kind == "sampler":
            ladder = sorted({min(b, cap) for b in ladder})
        out[m] = ladder
    return out


def run_model(model: str, methods: list[str]) -> pd.DataFrame:
    from diagnostics.ladders import cost_accuracy

    path = checkpoint_dir() / f"{model}.csv"
    if path.is_file():
        print(f"{model}: reusing {path} (code at {measured_at(model)})", flush=True)
        return pd.read_csv(path)
    code, start = commit(), _load()
    frame = cost_accuracy(model, None, methods, budgets=ladders(model, methods), log=lambda s: print(s, flush=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    path.with_suffix(".commit").write_text(code)
    path.with_suffix(".load").write_text(f"{start} at the start, {_load()} at the end")
    return frame


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def commit() -> str:
    """The code's commit (and '+' when the work tree differs from it)."""
    import subprocess

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "--",
                            "inference", "diagnostics", "zoo"], capture_output=True, text=True).stdout.strip()
    return head + ("+" if dirty else "")


def measured_at(model: str) -> str:
    path = checkpoint_dir() / f"{model}.commit"
    return path.read_text().strip() if path.is_file() else "unrecorded"


def load_during(model: str) -> str:
    path = checkpoint_dir() / f"{model}.load"
    return path.read_text().strip() if path.is_file() else "unrecorded"


def main(h) -> None:
    import inference
    from diagnostics.ladders import error_slope, plateau, time_to_rule

    models = [m.strip() for m in os.environ.get("BENCH_CA_MODELS", ",".join(DEFAULT_MODELS)).split(",") if m.strip()]
    keep = {m.strip() for m in os.environ.get("BENCH_CA_METHODS", "").split(",") if m.strip()}
    summary = []
    for model in models:
        methods = [m for m in inference.methods_for(model) if not keep or f"{model}/{m}" in keep]
        frame = run_model(model, methods)
        rule = time_to_rule(frame)
        rows = []
        summary.append({"model": model, "code at": measured_at(model), "load average (1, 5, 15 min)":
                        load_during(model), **{
            r.method: (f"{r.run_seconds:.3g} s ({int(r.budget)})" if r.reached else f"never ({r.plateau_error:.2f})")
            for r in rule.itertuples()}})
        for r in rule.itertuples():
            g = frame[frame["method"] == r.method]
            ladder = sorted(g["budget"].unique())
            shape = (f"slope {error_slope(frame, r.method):.2f}" if r.kind == "sampler" else
                     f"flat from {plateau(frame, r.method)}" if plateau(frame, r.method) else "still moving")
            rows.append({
                "method": r.method, "kind": r.kind, "unit": r.budget_unit,
                "ladder": f"{ladder[0]}..{ladder[-1]} ({len(ladder)})", "seeds": g["seed"].nunique(),
                "meets its rule at": int(r.budget) if r.reached else "not within the ladder",
                "run s there": f"{r.run_seconds:.3g}" if r.reached else "",
                "error at the largest budget (ref sd)": f"{r.plateau_error:.3g}",
                "verdicts at the largest budget": r.verdicts_at_largest,
                "run s at the largest budget": f"{g.loc[g['budget'] == ladder[-1], 'run_seconds'].mean():.3g}",
                "curve": shape})
        h.table(f"{model}: time to reach the rule, every method on its default ladder (code at "
                f"{measured_at(model)}, load average {load_during(model)})", rows,
                note="Every method of the model in one process and one run, side by side, on the stored reference's "
                     "data (the box was loaded by other tenants: compare the methods with each other, not with other "
                     "runs). A ladder column ending below twice the demo setting was capped (BENCH_CA_SAMPLER_CAP) to "
                     "fit the time. A "
                     "budget meets the rule when every seed's verdict is PASS; run s: mean over its seeds, compile "
                     "time apart. Approximations that never meet it stay biased: the error they plateau at is the "
                     "answer. curve: a sampler's least-squares slope of log worst mean error on log draws (exact: "
                     "-0.5), an optimiser's first budget from which its error stays within 10 % of the last.")
        crows = []
        for method, g in frame.groupby("method", sort=False):
            g = g.sort_values(["budget", "seed"])
            crows.append({"method": method, "fits": len(g), "XLA programs, first fit": int(g["xla_programs"].iloc[0]),
                          "XLA programs, whole ladder": int(g["xla_programs"].sum()),
                          "compile s, first fit": f"{g['compile_seconds'].iloc[0]:.2f}",
                          "compile s, whole ladder": f"{g['compile_seconds'].sum():.2f}"})
        h.table(f"{model}: compile count of a ladder (code at {measured_at(model)})", crows,
                note="XLA programs built during each fit (JAX's backend-compile events: compiled or read from the "
                     "persistent cache). Budgets that are arguments of the compiled programs add no program after "
                     "the first fit; compile s counts tracing too.")
    before = os.environ.get("BENCH_CA_BEFORE")
    for model in models if before else []:
        old_path = Path(before) / f"{model}.csv"
        if not old_path.is_file():
            continue
        old, new = pd.read_csv(old_path), pd.read_csv(checkpoint_dir() / f"{model}.csv")
        old_at = (Path(before) / f"{model}.commit").read_text().strip() if (Path(before) / f"{model}.commit"
                                                                           ).is_file() else "unrecorded"
        h.table(f"{model}: XLA programs of each method's whole ladder, code at {old_at} and at {measured_at(model)}",
                [{"method": m, "fits": len(g),
                  "programs before": int(old.loc[old["method"] == m, "xla_programs"].sum()),
                  "programs after": int(g["xla_programs"].sum()),
                  "compile s before": f"{old.loc[old['method'] == m, 'compile_seconds'].sum():.1f}",
                  "compile s after": f"{g['compile_seconds'].sum():.1f}"}
                 for m, g in new.groupby("method", sort=False)],
                note="The same ladders (budgets, seeds, data) on both sides, each in one process; programs: JAX's "
                     "backend-compile events (compiled or read from the persistent cache), so they do not depend on "
                     "the cache; compile s counts tracing too and was measured under load.")
    h.table("Seconds to meet the rule, every model's methods side by side", summary,
            note="Run seconds of the first budget (in brackets, in the method's unit) at which every seed meets the "
                 "method's rule; never: not within its ladder, with the worst mean error (reference sd) it ends at. "
                 "Compare within a row (each model's methods ran in one process, one run, on the code and under the "
                 "load its row states: the 2-core box is shared with other engineers' test suites, so the seconds "
                 "are upper bounds and only their ratios within a row mean something).")
