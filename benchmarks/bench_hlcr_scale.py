"""HLCR at scale (issue 18): the collapsed Gibbs kernel (``gibbs``, a ``lax.scan`` over pairs) against the blocked
uncollapsed kernel (``gibbs_blocked``, all labels in parallel), at 1e4, 1e5, 1e6 and 1e7 events.

Data: the issue's design, agents x 25 entities x 20 events (2,000 agents = 1e6 events), F = 10, K = 8, drawn from
the model (w_k ~ N(0, I), psi = 1/K, theta_i ~ Dir(beta psi), x ~ N(0, I)) with noise sd ``SIGMA`` = 4, so that
clusters overlap a little (a pair's 20 events favour its cluster by ~12 nats on average, some pairs far less).

Every (size, kernel) runs in a fresh subprocess, so its peak resident memory (``ru_maxrss``, data included; the
peak after preparing the data is shown apart) is its own:

* speed: one chain, ``sweeps`` sweeps after the compile call; sweeps/s = sweeps / run seconds (JAX compile time
  measured apart by ``Stopwatch`` and reported in its own column);
* mixing: 2 chains (vectorised), warm-up then kept sweeps; bulk ESS (``arviz_stats``, rank-normalised, both
  chains) of the collapsed log joint log p(y, z | psi) + log p(psi) (both kernels report the same quantity) and
  the minimum bulk ESS over the co-clustering summaries (``zoo.hlcr.summaries``: Rao-Blackwellised
  P(z_e = z_e') of 8 evenly spaced pairs; only entries with posterior sd > 0.01 count, constant ones have no
  ESS); ESS/s = ESS / run seconds of that run.

The collapsed kernel costs ~23 us per pair per sweep, so at 1e6 and 1e7 events only a few sweeps are timed and
its mixing run is skipped: its ESS/s there is its ESS per sweep measured at 1e5 events (same design) times its
sweeps/s measured at that size, and the table says "extrapolated". ``HLCR_SCALE_SIZES`` (comma-separated events,
e.g. ``10000,100000``) runs a subset. Goals on 2 cores: blocked >= 30 sweeps/s at 1e6; blocked ESS/s >= 50x the
collapsed at 1e6; 20 blocked sweeps on 1e7 events within 8 GB.

A second table compares ESS per sweep and per second of both kernels at 1e4 events for noise sd 1, 4 and 8
(clusters well apart, overlapping a little, overlapping much): the evidence for
"which kernel when" (docs/guide/models.md).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import numpy as np

SIGMA = 4.0
K, F, ENTITIES, EVENTS = 8, 10, 25, 20
SIZES = (10_000, 100_000, 1_000_000, 10_000_000)
# (speed sweeps, mixing warm-up, mixing kept, burn-in sweeps) per kernel and size; None: no mixing run
PLAN = {
    "gibbs_blocked": {10_000: (200, 200, 2000, 1000), 100_000: (200, 200, 2000, 3000),
                      1_000_000: (100, 200, 1000, 3000), 10_000_000: (20, None, None, None)},
    "gibbs": {10_000: (100, 200, 2000, 1000), 100_000: (20, 100, 400, 300), 1_000_000: (3, None, None, None),
              10_000_000: (2, None, None, None)},
}


def scale_data(n_events, sigma=SIGMA, seed=0):
    """agents x 25 entities x 20 events drawn from the HLCR model with psi = 1/K (module docstring)."""
    rng = np.random.default_rng(seed)
    n_agents = n_events // (ENTITIES * EVENTS)
    E = n_agents * ENTITIES
    W = rng.normal(size=(K, F))
    theta = rng.dirichlet(np.full(K, 1.0 / K), size=n_agents)
    agent_of_pair = np.repeat(np.arange(n_agents), ENTITIES)
    u = rng.random(E)[:, None]
    z = np.minimum((np.cumsum(theta[agent_of_pair], axis=1) < u).sum(1), K - 1)
    pair = np.repeat(np.arange(E), EVENTS)
    X = rng.normal(size=(E * EVENTS, F))
    y = np.einsum("mf,mf->m", X, W[z[pair]]) + sigma * rng.normal(size=E * EVENTS)
    return {"X": X, "y": y, "agent": pair // ENTITIES, "entity": pair % ENTITIES}, z   # pairs in (agent, entity) order


def _peak_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def _cpu_seconds():
    """CPU seconds (user + system, all threads) this process has used: on a shared machine the wall time of a
    run grows with other jobs' load, its CPU time much less."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _run_kernel(method, problem, hyper, key, *, num_warmup, num_samples, num_chains, z_init=None):
    from inference.hlcr import gibbs as hg
    from inference.hlcr import gibbs_blocked as gb

    run = hg.run if method == "gibbs" else gb.run
    return run(key, problem, hyper, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
               z_init=z_init)


def one(method, n_events, mode, sigma=SIGMA):
    """One measurement in this process (run by ``main`` in a subprocess); returns a dict of figures."""
    from zoo import _runtime  # noqa: F401  (float64, numpyro before arviz)

    # isort: split
    import jax
    import xarray as xr

    from inference._timing import Stopwatch
    from inference.hlcr import gibbs as hg
    from inference.hlcr import gibbs_blocked as gb
    from inference.hlcr.common import make_config, pair_data
    from zoo.hlcr import model_inputs, summaries

    data, z_true = scale_data(n_events, sigma)
    hyper_d = {"K": K, "alpha": float(K), "beta": 1.0, "delta": 1.0, "sigma": sigma}
    inputs = model_inputs(data, hyper_d)
    problem = hg.Problem(pair_data(inputs)) if method == "gibbs" else gb.problem_from_inputs(inputs)
    hyper = make_config(hyper_d, inputs["n_agents"])
    out = {"events": len(data["y"]), "pairs": int(inputs["g"].shape[0]), "peak_after_data_gb": _peak_gb()}
    sweeps, warm, kept, burn = PLAN[method][n_events] if sigma == SIGMA else (None, 200, 2000, 1000)
    key = jax.random.key(0)
    if mode == "speed":
        with Stopwatch() as sw:   # compile call: same program as the timed run (chunk = number of sweeps)
            jax.block_until_ready(_run_kernel(method, problem, hyper, key, num_warmup=0, num_samples=sweeps,
                                              num_chains=1)[0])
        cpu0 = _cpu_seconds()
        with Stopwatch() as run:
            jax.block_until_ready(_run_kernel(method, problem, hyper, jax.random.key(1), num_warmup=0,
                                              num_samples=sweeps, num_chains=1)[0])
        out |= {"sweeps": sweeps, "compile_s": sw.compile_seconds, "run_s": run.run_seconds,
                "sweeps_per_s": sweeps / run.run_seconds, "cpu_s_per_sweep": (_cpu_seconds() - cpu0) / sweeps,
                "peak_gb": _peak_gb()}
        return out
    with Stopwatch() as sw:   # stationary mixing: both chains start at the true labels
        post, stats, _ = _run_kernel(method, problem, hyper, key, num_warmup=warm, num_samples=kept, num_chains=2,
                                     z_init=z_true)
        jax.block_until_ready(post)
    # burn-in from uniform random labels (one chain): the first sweep whose log joint reaches the 5 % quantile of
    # the stationary run's
    with Stopwatch() as sw_burn:
        _, burn_stats, _ = _run_kernel(method, problem, hyper, jax.random.key(7), num_warmup=0, num_samples=burn,
                                       num_chains=1)
        trace = np.asarray(burn_stats["log_joint_collapsed"])[0]
    level = np.quantile(np.asarray(stats["log_joint_collapsed"]), 0.05)
    reached = np.flatnonzero(trace >= level)
    out |= {"burn_level": float(level), "burn_max": burn, "burn_sweeps": int(reached[0]) + 1 if reached.size else None,
            "burn_s_per_sweep": sw_burn.run_seconds / burn, "burn_final_gap": float(level - trace[-1])}
    import arviz_stats  # noqa: F401  (the .azstats accessor)

    coords = {"chain": np.arange(2), "draw": np.arange(kept)}
    ds = xr.Dataset({"w": (("chain", "draw", "cluster", "feature"), np.asarray(post["w"])),
                     "psi": (("chain", "draw", "cluster"), np.asarray(post["psi"])),
                     "theta": (("chain", "draw", "agent", "cluster"), np.asarray(post["theta"]))}, coords=coords)
    summ = summaries(ds, data, hyper_d)
    lj = xr.DataArray(np.asarray(stats["log_joint_collapsed"]), dims=("chain", "draw"), coords=coords)
    ess_lj = float(lj.azstats.ess(method="bulk"))
    co = summ["coclust"]
    live = co.std(("chain", "draw")).values > 0.01
    ess_co = float(co.isel(pair_pair=np.flatnonzero(live)).azstats.ess(method="bulk").min()) if live.any() else None
    out |= {"warmup": warm, "kept": kept, "mix_compile_s": sw.compile_seconds, "mix_run_s": sw.run_seconds,
            "ess_logjoint": ess_lj, "ess_coclust_min": ess_co, "n_coclust_live": int(live.sum()),
            "ess_logjoint_per_sweep": ess_lj / (2 * kept),
            "ess_coclust_per_sweep": None if ess_co is None else ess_co / (2 * kept),
            "ess_logjoint_per_s": ess_lj / sw.run_seconds,
            "ess_coclust_per_s": None if ess_co is None else ess_co / sw.run_seconds}
    return out


def _subprocess(method, n_events, mode, sigma=SIGMA):
    env = dict(os.environ, MPLBACKEND="Agg")
    cmd = [sys.executable, "-m", "benchmarks.bench_hlcr_scale", method, str(n_events), mode, str(sigma)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if res.returncode != 0:
        raise RuntimeError(f"{cmd}: exit {res.returncode}\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _f(x, fmt=".3g"):
    return "—" if x is None else format(x, fmt)


def _burn(m):
    """Sweeps (seconds) from random labels to the stationary 5 % quantile of the log joint, or the gap left."""
    if m is None:
        return "—"
    if m["burn_sweeps"] is None:
        return f"> {m['burn_max']} ({m['burn_final_gap']:.0f} nats short)"
    return f"{m['burn_sweeps']} ({m['burn_sweeps'] * m['burn_s_per_sweep']:.3g} s)"


def bench_scale(h):
    sizes = [int(s) for s in os.environ.get("HLCR_SCALE_SIZES", "").split(",") if s] or list(SIZES)
    speed, mix, failed = {}, {}, {}
    for n in sizes:
        for method in ("gibbs_blocked", "gibbs"):
            try:
                speed[method, n] = _subprocess(method, n, "speed")
                print(f"  {method} {n:.0e} speed: {speed[method, n]}", flush=True)
                if PLAN[method][n][1] is not None:
                    mix[method, n] = _subprocess(method, n, "mix")
                    print(f"  {method} {n:.0e} mixing: {mix[method, n]}", flush=True)
            except RuntimeError as exc:   # a size that does not fit is a result, not the end of the benchmark
                print(f"  {method} {n:.0e} FAILED: {exc}", flush=True)
                failed[method, n] = str(exc).strip().splitlines()[-1][:120]
    rows = []
    for n in sizes:
        for method in ("gibbs_blocked", "gibbs"):
            if (method, n) in failed:
                rows.append({"events": f"{n:.0e}", "kernel": method, "note": f"FAILED: {failed[method, n]}"})
                continue
            s = speed[method, n]
            m = mix.get((method, n))
            note = ""
            if m is None and method == "gibbs" and (method, 100_000) in mix:
                base = mix[method, 100_000]   # ESS per sweep at 1e5 x sweeps/s here
                m = {"ess_logjoint_per_s": base["ess_logjoint_per_sweep"] * s["sweeps_per_s"],
                     "ess_coclust_per_s": None if base["ess_coclust_per_sweep"] is None
                     else base["ess_coclust_per_sweep"] * s["sweeps_per_s"]}
                note = "extrapolated: ESS/sweep at 1e5 x sweeps/s here"
            rows.append({
                "events": f"{s['events']:.0e}", "pairs": s["pairs"], "kernel": method, "compile s": _f(s["compile_s"]),
                "timed sweeps": s["sweeps"], "sweeps/s": _f(s["sweeps_per_s"]), "CPU s/sweep": _f(s["cpu_s_per_sweep"]),
                "peak RSS GB (data only)": f"{s['peak_gb']:.2f} ({s['peak_after_data_gb']:.2f})",
                "ESS/sweep log joint": _f(mix.get((method, n), {}).get("ess_logjoint_per_sweep")),
                "ESS/s log joint": _f(m and m["ess_logjoint_per_s"]),
                "min ESS/s coclust (live)": _f(m and m["ess_coclust_per_s"])
                + (f" ({mix[method, n]['n_coclust_live']})" if (method, n) in mix else ""),
                "burn-in sweeps (s)": _burn(mix.get((method, n))),
                "note": note})
    h.table(f"HLCR scale: collapsed `gibbs` vs blocked `gibbs_blocked` (F = {F}, K = {K}, sigma = {SIGMA:g})", rows,
            note="Speed: one chain, compile call apart; CPU s/sweep = user + system seconds of the process (all "
                 "threads) per sweep, less sensitive than wall time to the other jobs on a shared machine. ESS "
                 "(stationary): 2 chains started at the true labels, warm-up then kept sweeps, bulk ESS per run "
                 "second; "
                 "coclust = min over the co-clustering summaries with posterior sd > 0.01 (their count in brackets). "
                 "Burn-in: one chain from uniform random labels, sweeps until the log joint first reaches the 5 % "
                 "quantile of the stationary run (seconds at that run's rate). Peak RSS of the whole process, data "
                 "preparation alone in brackets.")
    goals = []
    if (("gibbs_blocked", 1_000_000) in speed) and ("gibbs", 1_000_000) in speed:
        b, c = speed["gibbs_blocked", 1_000_000], speed["gibbs", 1_000_000]
        mb = mix.get(("gibbs_blocked", 1_000_000))
        base = mix.get(("gibbs", 100_000))
        goals.append({"goal": "blocked >= 30 sweeps/s at 1e6 events",
                      "measured": f"{b['sweeps_per_s']:.1f} sweeps/s wall, "
                                  f"{b['cpu_s_per_sweep'] * 1e3:.0f} CPU-ms per sweep",
                      "met": b["sweeps_per_s"] >= 30})
        goals.append({"goal": "blocked sweeps/s vs collapsed at 1e6", "measured":
                      f"{b['sweeps_per_s'] / c['sweeps_per_s']:.0f}x", "met": ""})
        if mb and base:
            r = mb["ess_logjoint_per_s"] / (base["ess_logjoint_per_sweep"] * c["sweeps_per_s"])
            goals.append({"goal": "blocked ESS/s >= 50x collapsed at 1e6 (log joint; collapsed extrapolated)",
                          "measured": f"{r:.0f}x", "met": r >= 50})
    if ("gibbs_blocked", 10_000_000) in speed:
        s = speed["gibbs_blocked", 10_000_000]
        goals.append({"goal": "20 blocked sweeps on 1e7 events within 8 GB",
                      "measured": f"{s['sweeps']} sweeps, peak {s['peak_gb']:.2f} GB", "met": s["peak_gb"] <= 8})
    if goals:
        h.table("HLCR scale: issue 18 goals (2 cores)", goals)


def bench_overlap(h):
    """ESS per sweep and per second at 1e4 events for noise sd 1, 4, 8: when does collapsing pay?"""
    rows = []
    for sigma in (1.0, 4.0, 8.0):
        for method in ("gibbs_blocked", "gibbs"):
            m = _subprocess(method, 10_000, "mix", sigma)
            print(f"  overlap sigma {sigma} {method}: {m}", flush=True)
            rows.append({"sigma": sigma, "kernel": method, "kept sweeps": f"2 x {m['kept']}",
                         "ESS/sweep log joint": _f(m["ess_logjoint_per_sweep"]),
                         "ESS/s log joint": _f(m["ess_logjoint_per_s"]),
                         "min ESS/sweep coclust (live)": _f(m["ess_coclust_per_sweep"]) + f" ({m['n_coclust_live']})",
                         "min ESS/s coclust": _f(m["ess_coclust_per_s"]), "burn-in sweeps (s)": _burn(m)})
    h.table("HLCR mixing vs cluster overlap, 1e4 events (20 agents x 25 x 20), F = 10, K = 8", rows,
            note="2 chains from the true labels, 200 warm-up + 2000 kept sweeps each, bulk ESS; run seconds exclude "
                 "compilation. Burn-in as in the scale table (at most 1000 sweeps).")


def main(h):
    bench_scale(h)
    if not os.environ.get("HLCR_SCALE_SIZES"):
        bench_overlap(h)


if __name__ == "__main__":
    method, n_events, mode, sigma = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    print(json.dumps(one(method, n_events, mode, sigma)))
