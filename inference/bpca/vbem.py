"""Centralised mean-field VI (VB-EM) for Bayesian PCA: the sweep of ``inference.bpca.sweep`` with no neighbours and
c = 1, every sweep a step of the one loop (paper page ``docs/papers/dmfvi.md`` N3.1).

Kernel: ``State`` = ``VBState`` (q and the ELBO after the sweep), ``Info.objective`` = the closed-form ELBO
(``inference.bpca.common``; monotone, test 1), ``problem`` = the data ``Shard``; ``init``/``step`` are built once
per static configuration ``Config`` (``kernel(cfg)``). The stopping rule: relative ELBO change <= ``tol``.
Draws from q: ``inference.bpca.common.draw``.

The rows are padded to ``programs.bucket(N)`` (``padded_shard``), so data sets of similar size share the compiled
run: a padded row has no observed entry (``O = 0``) and ``row = 0``, so it adds nothing to the statistics of the
sweep, to n_obs or to the ELBO; its q(z_n) stays N(0, I) and is cut off the result.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from inference import programs
from inference._methods import Draws, FitContext, Option, register_method
from inference.base import Kernel
from inference.bpca.common import (
    Config,
    Shard,
    VBState,
    cfg_from,
    draw,
    init_globals,
    init_key,
    init_state,
    padded_shard,
    q_groups,
    q_of,
    shard_of,
)
from inference.bpca.sweep import no_penalty, sweep
from inference.loop import Run, StopRule, run_until_converged

State = VBState


class Info(NamedTuple):
    objective: jax.Array   # the ELBO after the sweep


@programs.cached(maxsize=32)
def kernel(cfg: Config) -> Kernel:
    """``init(key, shard)``: m^w = orth(randn(D, M)) from ``key``, v = 1, m^mu = 0, q(tau) = q(alpha) = Gamma(1, 1);
    ``step(key, state, shard)``: one centralised sweep = the node sweep with no neighbours and c = 1."""

    def init(key, shard: Shard) -> State:
        return init_state(cfg, init_globals(key, cfg.D, cfg.M), shard.X.shape[0])

    def step(key, state: State, shard: Shard) -> tuple[State, Info]:
        tau_pen = {"k": 0.0, "G": jnp.zeros(2), "anchor": jnp.zeros(2)} if cfg.learn_tau else None
        new = sweep(cfg, state, shard, 1.0, no_penalty(cfg, state.g), 1.0, tau_pen)
        return new, Info(new.elbo)

    return Kernel(init, step)


def run(cfg: Config, shard: Shard, key: jax.Array, *, max_iter: int, tol: float, chunk: int | None = None,
        progress: bool | None = None) -> Run:
    """Sweeps from ``init(key, shard)`` until the relative ELBO change is <= ``tol`` (0: never) or ``max_iter``,
    on the rows padded to ``programs.bucket(n)``; the state returned has q(z_n) of the n real rows."""
    k, n = kernel(cfg), shard.X.shape[0]
    res = run_until_converged(k.init, k.step, padded_shard(shard), key, StopRule(max_iter, tol), chunk=chunk,
                              progress=progress, desc="bpca vbem", start_from_key=True)
    st = jax.device_get(res.state)     # on the host: cutting a device array compiles a program
    return res._replace(state=st._replace(mz=st.mz[:n], Sz=st.Sz[:n], logdet=st.logdet[:n]))


@register_method("vbem", kind="variational", models=("bpca",), options={
    "max_iter": Option(5000, "positive_int", "maximum number of sweeps", tiny=50),
    "tol": Option(1e-8, "positive", "stop when the relative ELBO change is at most tol"),
    "num_samples": Option(1000, "positive_int", "draws from q", tiny=20)})
def run_vbem(ctx: FitContext) -> Draws:
    """Centralised mean-field VI (VB-EM) for BPCA with closed-form updates and the ELBO every sweep (notes 3.1)."""
    o = ctx.options
    Y = ctx.data["Y"]
    cfg = cfg_from(ctx.hyper, Y.shape[1])
    r = run(cfg, shard_of(Y), init_key(ctx.key), max_iter=o["max_iter"], tol=o["tol"], progress=o["progress"])
    st = r.state
    q = q_of(cfg, st.g, st.tau, st.alpha, st.mz, st.Sz)
    post, log_q = draw((ctx.seed, 2), q, o["num_samples"])
    return Draws(posterior={k: np.asarray(v)[None] for k, v in post.items()},
                 sample_stats={"log_q": np.asarray(log_q)[None]}, traces={"elbo": r.info.objective},
                 groups={"variational": xr.Dataset(q_groups(q))}, objective=r.objective, converged=r.converged,
                 n_iter=r.n_iter)
