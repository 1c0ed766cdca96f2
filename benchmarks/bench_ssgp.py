"""SSGP + random effects (issue 6): closed-form VB vs NUTS wall time, and VB cost per sweep as n grows.

1. VB to convergence vs NUTS (2 chains x (1000 warm-up + 1000 draws)) on S-LMM-type data with n = 2000,
   m = 50, 20 groups (issue goal: VB >= 50x faster), with the scorecard's accuracy numbers beside the
   timing (population curve g, gamma, tau against the NUTS run). NUTS took 2 h on 2 idle cores
   (2026-11-23), so each side runs once (``Harness.compare_once``), compile time apart.
2. VB cost of one sweep at n = 1e3, 1e4, 1e5 (m = 20, d = 1, 50 groups): the slope of log time on log n
   (issue goal: linear, slope ~ 1).

``SSGP_BENCH_SMALL=1`` runs a reduced version (n = 400, m = 20, 10 groups, NUTS 500 + 500 draws; sweeps
at n = 1e3, 3e3, 1e4) for a busy machine; the section title says which one ran. ``SSGP_BENCH_PART=sweep`` or
``=nuts`` runs only one of the two parts.
"""

from __future__ import annotations

import os

import jax
import numpy as np


def _vb_vs_nuts(h, small):
    import inference
    from diagnostics import scorecard
    from inference.nuts import chain_method
    from zoo import ssgp

    n_groups, per_group, m = (10, 40, 20) if small else (20, 100, 50)
    warm, draws = (500, 500) if small else (1000, 1000)
    data, _ = ssgp.simulate_lmm(0, n_groups=n_groups, per_group=per_group)
    n = len(data["y"])
    trees = {}

    def vb():
        trees["vb"] = inference.fit("ssgp_lmm", data, "vb", seed=0, m=m, progress=False)
        return trees["vb"]["posterior"]["sigma"].values

    def nuts():
        trees["nuts"] = inference.fit("ssgp_lmm", data, "nuts", seed=0, m=m, progress=False, num_warmup=warm,
                                      num_samples=draws, num_chains=2, target_accept_prob=0.95)
        return trees["nuts"]["posterior"]["sigma"].values

    chains = {"parallel": "the 2 chains in parallel, one per host device",
              "sequential": "chains one after the other"}[chain_method(2)]
    out = h.compare_once(f"ssgp_lmm VB to convergence vs NUTS (2 chains x {warm}+{draws}), n={n}, m={m}, "
                         f"{n_groups} groups", {"vb": vb, "nuts": nuts}, baseline="nuts",
                         note="Each side is one complete fit() from a cold start (VB: sweeps to the default "
                              f"stopping rule + 1000 draws from q; NUTS: warm-up + sampling, {chains}).")
    sc = scorecard(trees["nuts"], {"vb": trees["vb"]})
    g = sc[sc["parameter"].str.startswith("g[")]
    row = {"speed-up VB vs NUTS (run time)": f"{out['vb']['speedup_vs_baseline']:.0f}x (goal >= 50x)",
           "incl. compile": f"{out['nuts']['wall_s'] / out['vb']['wall_s']:.0f}x",
           "VB sweeps": int(trees["vb"].attrs["n_iter"]), "VB converged": int(trees["vb"].attrs["converged"]),
           "g max std_mean_error": g["std_mean_error"].max(), "g sd_ratio": f"{g['sd_ratio'].min():.2f}.."
           f"{g['sd_ratio'].max():.2f}"}
    for v in ("gamma", "tau[0]"):
        r = sc[sc["parameter"] == v].iloc[0]
        row[f"{v} VB/NUTS mean"] = r["mean"] / r["mean_ref"]
    row["NUTS reference health"] = "R-hat {max_rhat:.3f}, ESS {min_ess_bulk:.0f}, div {divergences}".format(
        **sc.attrs["reference_health"])
    h.table("ssgp_lmm VB accuracy against that NUTS run (scorecard)", [row])


def _sweep_cost(h, small):
    import zoo
    from inference.ssgp import problem, sweep, vb
    from zoo import ssgp

    sizes = (1_000, 3_000, 10_000) if small else (1_000, 10_000, 100_000)
    spec = zoo.get("ssgp_lmm")
    hyper = spec.default_hyper | {"m": 20}
    sides, n_of = {}, {}
    for n in sizes:
        data, _ = ssgp.simulate_lmm(1, n_groups=50, per_group=n // 50)
        cfg, arrays = problem.setup(spec.inputs(data, hyper), hyper, "gaussian")
        st = vb.kernel(cfg).init(None, arrays)
        f = jax.jit(lambda s, d, cfg=cfg: sweep.sweep(cfg, d, s, 1.0).bound)
        sides[f"n={n}"] = lambda f=f, st=st, arrays=arrays: f(st, arrays)
        n_of[f"n={n}"] = n
    out = h.compare("ssgp_lmm VB: one sweep (NCVMP step, q(alpha, beta), scales, lower bound), m=20, d=1, "
                    "50 groups", sides, baseline=f"n={sizes[0]}")
    t = np.array([out[k]["median_s"] for k in sides])
    nn = np.array([n_of[k] for k in sides], dtype=float)
    slope = np.polyfit(np.log(nn), np.log(t), 1)[0]
    slope_top = np.log(t[-1] / t[-2]) / np.log(nn[-1] / nn[-2])
    h.table("ssgp_lmm VB cost per sweep vs n", [
        {"n": int(a), "median s/sweep": b, "us per observation": 1e6 * b / a} for a, b in zip(nn, t, strict=True)
    ] + [{"n": "slope of log t on log n", "median s/sweep": f"{slope:.2f} (all), {slope_top:.2f} (two largest)"}],
        note="Linear in n means slope 1; at small n fixed per-sweep costs (H function grids, 2m x 2m solves) "
             "flatten the curve.")


def main(h) -> None:
    small = os.environ.get("SSGP_BENCH_SMALL", "0") == "1"
    if small:
        h.table("SSGP_BENCH_SMALL=1: reduced sizes", [{"note": "reduced run for a busy machine; see docstring"}])
    part = os.environ.get("SSGP_BENCH_PART", "all")
    if part in ("all", "sweep"):
        _sweep_cost(h, small)
    if part in ("all", "nuts"):
        _vb_vs_nuts(h, small)
