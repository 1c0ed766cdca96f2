"""HLCR (issue 3): block collapsed Gibbs vs the paper's per-event kernel and a plain NumPy block sampler;
Gibbs vs NUTS effective samples per second; the 1,000,000-event scale run.

Env ``HLCR_BENCH_SMALL=1`` shrinks every size (for a quick check); the issue's goals:
block >= 20x the paper kernel at N_** = 20 (F = 5, K = 8), growing with N_**; Gibbs >= 10x NUTS in ESS/s;
20 sweeps on 1e6 events within 2 GB.
"""

from __future__ import annotations

import os
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

import zoo
from inference import fit
from inference.hlcr import gibbs as hg
from inference.hlcr.common import make_config, pair_data
from zoo.hlcr import model_inputs, pair_structure

SMALL = os.environ.get("HLCR_BENCH_SMALL", "0") == "1"


def _problem(n_agents, n_events, K, F, sigma=0.5, seed=0):
    data, _ = zoo.get("hlcr").simulate(seed, n_agents=n_agents, mean_entities=4.0, mean_events=n_events, K=K, F=F,
                                       sigma=sigma)
    hyper = {"K": K, "alpha": float(K), "beta": 1.0, "delta": 1.0, "sigma": sigma}
    inp = model_inputs(data, hyper)
    pdat = pair_data(inp)
    H = make_config(hyper, inp["n_agents"])
    ps = pair_structure(data["agent"], data["entity"])
    events = hg.events_by_pair(data["X"], data["y"], ps["pair"], ps["n_pairs"])
    return data, pdat, H, events


def _sweeper(pdat, H, kernel, events, n_sweeps):
    """A compiled function running ``n_sweeps`` sweeps of one chain from a fixed state."""
    state0 = hg.state_from_labels(jnp.zeros(pdat.gs.shape[0], jnp.int32), pdat, H)

    @jax.jit
    def run(key):
        keys = jax.random.split(key, n_sweeps)
        problem = hg.Problem(pdat, events)
        s, _ = jax.lax.scan(lambda s, k: (hg.sweep(k, s, problem, H, "exact", kernel)[0], None), state0, keys)
        return s.z

    return lambda: run(jax.random.key(0))


def _numpy_block_sweep(z, Gs, gs, const, agent, log_psi, K, delta, beta, rng):
    """The same block sampler in plain NumPy (one Python iteration per pair, batched Cholesky over K)."""
    F = Gs.shape[-1]
    D = np.stack([np.eye(F) / delta**2 + Gs[z == k].sum(0) for k in range(K)])
    c = np.stack([gs[z == k].sum(0) for k in range(K)])
    n_agent = np.zeros((agent.max() + 1, K))
    np.add.at(n_agent, (agent, z), 1)

    def logZ(A, b):
        L = np.linalg.cholesky(A)
        v = np.linalg.solve(L, b[..., None])[..., 0]
        return 0.5 * (v**2).sum(-1) - np.log(np.diagonal(L, axis1=-2, axis2=-1)).sum(-1)

    for e in range(len(z)):
        k0 = z[e]
        D[k0] -= Gs[e]
        c[k0] -= gs[e]
        n_agent[agent[e], k0] -= 1
        logits = (np.log(n_agent[agent[e]] + beta * np.exp(log_psi)) + logZ(D + Gs[e], c + gs[e]) - logZ(D, c)
                  + const[e])
        k1 = int(np.argmax(logits + rng.gumbel(size=K)))
        z[e] = k1
        D[k1] += Gs[e]
        c[k1] += gs[e]
        n_agent[agent[e], k1] += 1
    return z


def bench_kernels(h):
    K, F = 8, 5
    n_agents = 40 if SMALL else 100
    rows = []
    n_sweeps = 2
    for n_ev in ((5.0, 20.0) if SMALL else (5.0, 20.0, 100.0)):
        data, pdat, H, events = _problem(n_agents, n_ev, K, F)
        M = len(data["y"])
        np_args = [np.asarray(a) for a in (pdat.Gs, pdat.gs, pdat.const, pdat.agent)]

        def numpy_side(np_args=np_args, E=pdat.gs.shape[0]):
            rng = np.random.default_rng(0)
            z = np.zeros(E, int)
            for _ in range(n_sweeps):
                z = _numpy_block_sweep(z, *np_args, np.full(K, -np.log(K)), K, 1.0, 1.0, rng)
            return z

        title = f"HLCR Gibbs sweep, {M} events, {pdat.gs.shape[0]} pairs, N_** = {n_ev:g}, F = {F}, K = {K}"
        out = h.compare(title,
                        {"block (JAX)": _sweeper(pdat, H, "block", None, n_sweeps),
                         "paper per-event (JAX)": _sweeper(pdat, H, "paper", events, n_sweeps),
                         "block (NumPy)": numpy_side},
                        baseline="paper per-event (JAX)", work=n_sweeps * M, work_unit="events")
        rows.append({"N_**": n_ev, "events": M,
                     "block vs paper": f"{out['block (JAX)']['speedup_vs_baseline']:.1f}x",
                     "block JAX vs NumPy": f"{out['block (NumPy)']['median_s'] / out['block (JAX)']['median_s']:.1f}x",
                     "goal": ">= 20x at N_** = 20, growing"})
    h.table("HLCR block sampler speed-up (events/s ratios)", rows)


def bench_ess(h):
    """ESS/s of the z-marginal log likelihood summary (the same quantity for both), C1 data."""
    import arviz_stats  # noqa: F401  (the .azstats accessor)

    from diagnostics.scoring import compared_posterior

    n_agents = 16 if SMALL else 64
    data, _ = zoo.get("hlcr").simulate(0, n_agents=n_agents, mean_entities=4.0, mean_events=20.0, K=3, F=3,
                                       sigma=0.3, delta=2.0, psi=np.full(3, 1 / 3))
    hyper = {"K": 3, "sigma": 0.3, "delta": 2.0}
    n = 300 if SMALL else 1000
    rows = []
    for name, method, opts in [("gibbs", "gibbs", {"num_warmup": 100, "num_samples": n, "num_chains": 2}),
                               ("nuts", "nuts", {"num_warmup": n, "num_samples": n, "num_chains": 2})]:
        tree = fit("hlcr", data, method, seed=0, **opts, **hyper)
        ll = compared_posterior(tree)["log_lik"]
        ess = float(ll.azstats.ess(method="bulk"))
        rows.append({"method": name, "compile s": tree.attrs["compile_seconds"], "run s": tree.attrs["run_seconds"],
                     "ESS bulk (log_lik)": ess, "ESS/s (run)": ess / tree.attrs["run_seconds"]})
    ratio = rows[0]["ESS/s (run)"] / rows[1]["ESS/s (run)"]
    rows.append({"method": "gibbs / nuts", "ESS/s (run)": ratio})
    h.table(f"HLCR ESS per second, C1 data ({n_agents} agents): Gibbs vs NUTS (goal: >= 10x)", rows,
            note="Run seconds exclude compilation (reported apart).")


def bench_scale(h):
    """20 Gibbs sweeps on ~1e6 events (2000 agents x 25 entities x 20 events, F = 10, K = 8)."""
    n_agents, n_ent, n_ev = (200, 25, 20) if SMALL else (2000, 25, 20)
    rng = np.random.default_rng(0)
    K, F, sigma = 8, 10, 0.5
    E = n_agents * n_ent
    t0 = time.perf_counter()
    W = rng.normal(size=(K, F))
    z = rng.integers(0, K, E)
    pair = np.repeat(np.arange(E), n_ev)
    X = rng.normal(size=(E * n_ev, F))
    y = np.einsum("mf,mf->m", X, W[z[pair]]) + sigma * rng.normal(size=E * n_ev)
    data = {"X": X, "y": y, "agent": pair // n_ent, "entity": pair % n_ent}
    t_sim = time.perf_counter() - t0
    tree = fit("hlcr", data, "gibbs", seed=0, num_warmup=19, num_samples=1, num_chains=1, K=K, sigma=sigma)
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    h.table("HLCR scale: 20 Gibbs sweeps", [{
        "events": len(y), "pairs": E, "F": F, "K": K, "simulate s": t_sim,
        "compile s": tree.attrs["compile_seconds"], "run s (20 sweeps)": tree.attrs["run_seconds"],
        "peak RSS GB (process)": peak_gb, "goal": "<= 2 GB"}])


def main(h):
    bench_kernels(h)
    bench_ess(h)
    bench_scale(h)
