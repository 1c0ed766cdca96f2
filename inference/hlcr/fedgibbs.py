"""FedHLCR: federated collapsed Gibbs for HLCR (paper §5, Algorithm 3, corrected per notes §3.6 and §4 E5-E8).

Every agent keeps its events, its pair labels z_ij, its entity ids and its per-pair statistics. One round t:

1. the server broadcasts the cluster statistics of round t-1 (notes §3.6): D_k = I/delta^2 + Dbar_k (K, F, F),
   c_k (K, F), smoothed label counts N^(k) (K,) (gap G1: eq. 2 needs them, the paper never sends them),
   log psi (K,) and the number of server updates so far;
2. each participating agent re-samples its own labels in one sequential sweep over its pairs (``local_step``):

       log p(z_ij = k | .) = log prior_k + logZ(D_k + G_ij/s^2, c_k + g_ij/s^2) - logZ(D_k, c_k) + const_ij

   (the normaliser-ratio form of the corrected Theorem 1, erratum E1, shared with the centralised kernel via
   ``inference.hlcr_common``), prior ``"exact"`` log(N_i^(k) + beta psi_k) (notes P1) or ``"paper"`` eq. (2)
   log(N_i^(k) + beta (N^(k) + alpha/K) / (N + alpha)); the agent counts N_i^(k) exclude the pair and follow the
   agent's own sweep (gap G2). Two variants:

   * ``leave_own_out=False`` (the paper's Algorithm 3, erratum E8): (D, c, N) are the broadcast values, fixed
     during the sweep; the pair's own data sits in its previous cluster's statistics and is used again;
   * ``leave_own_out=True`` (gap G4): the agent subtracts its own effective contribution from the broadcast
     (which it can track exactly: see ``AgentState``) and adds its current labels' sums back, updating them
     pair by pair, so it samples from the exact collapsed conditional given the other agents' statistics.
     One agent, full participation, gamma = 1: exactly the centralised sweep of ``inference.hlcr_gibbs``.

3. the agent uploads per-cluster sums of its pairs (erratum E7: per pair X^T X, not per event): D_i^(k) =
   sum_{z_ij = k} G_ij / s^2 (K, F, F), c_i^(k) (K, F), counts N_i^(k) (K,) and Antoniak table counts m_ik (K,)
   for the psi update (notes P1); optional Gaussian noise of sd ``dp_noise_scale`` on D_i (symmetrised) and c_i;
4. the server (``aggregate``) sums the uploads of the active agents S and smooths with learning rate gamma
   (Algorithm 3 line 13): Dbar <- (1 - gamma) Dbar + gamma S_D, the same for c, N and m (the first,
   initialisation round takes S as is); no active agent: nothing changes. It draws
   psi ~ Dir(alpha/K + m) (notes P1) and broadcasts.

Partial participation (a fraction of agents chosen by the server per round) and dropouts (a chosen agent
whose upload never arrives: its state does not advance) are the runner's ``participation`` mask. As in the
paper (notes G3), the sums are not rescaled by the participation fraction.

What crosses agent -> server: only arrays indexed by cluster ((K, F, F), (K, F), (K,)); plus, for the driver's
monitoring only, a few per-agent scalars and (K,) vectors (labels changed, sum of pair constants, label counts, held-out
squared error and count) (``report``).
The run records both channels (``inference.distributed.audit``) in the fit's attributes.

Initialisation (round 0): every agent draws z ~ U{1..K} (or takes ``z_init``) and uploads its sums; the server
takes their sum as is (Algorithm 3's "t == 1" branch; its own first round against H = delta^2 I is a draw
from the prior, i.e. a random initialisation too).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from inference._methods import Draws, FitContext, register_method
from inference.distributed.audit import audited, message_spec
from inference.distributed.inprocess import run_inprocess
from inference.distributed.protocol import Protocol
from inference.hlcr_common import log_normaliser, log_prior_labels, prior_logits, sample_log_dirichlet
from zoo.hlcr import LOG_2PI, SPEC, pair_statistics, pair_structure, resolve_hyper

PRIORS = ("exact", "paper")
RUNNERS = ("inprocess", "ray")


# --------------------------------------------------------------------------------------------------
# Agents' private data (one shard per agent; pairs padded to the largest agent, with a mask)
# --------------------------------------------------------------------------------------------------

class Shard(NamedTuple):
    """One agent's private data: per-pair statistics of its P (padded) pairs. Never sent anywhere.

    Gs: G_ij / s^2 (P, F, F); gs: g_ij / s^2 (P, F); const: -n_ij/2 log(2 pi s^2) - q_ij/(2 s^2) (P,);
    mask: real pair (P,) bool (padding has zero statistics); z0: initial labels (P,) (-1: draw at random);
    tG, tg, tq, tn: optional held-out events of the same pairs (unscaled X^T X, X^T y, y^T y, count; zeros when
    absent), for the agents' own evaluation (each reports only its summed squared error and count)."""

    Gs: jax.Array
    gs: jax.Array
    const: jax.Array
    mask: jax.Array
    z0: jax.Array
    tG: jax.Array
    tg: jax.Array
    tq: jax.Array
    tn: jax.Array


def check_agents(agents, F: int | None = None) -> int:
    """Bad-input checks of per-agent datasets (before any round): every agent has events, every agent's
    ``X`` is (n_i, F) with the same F, y and entity match. Returns F."""
    if not isinstance(agents, list | tuple) or len(agents) == 0:
        raise ValueError("agents: expected a non-empty list of per-agent dicts with X, y, entity")
    for i, a in enumerate(agents):
        for k in ("X", "y", "entity"):
            if k not in a:
                raise ValueError(f"agents[{i}]: missing {k!r} (each agent needs X, y, entity)")
        X = np.asarray(a["X"])
        if X.ndim != 2:
            raise ValueError(f"agents[{i}]['X']: expected a 2-D array (events, F), got shape {X.shape}")
        if X.shape[0] == 0:
            raise ValueError(f"agents[{i}]: agent has no data (0 events); drop it or give it events")
        if F is None:
            F = X.shape[1]
        if X.shape[1] != F:
            raise ValueError(f"agents[{i}]['X']: expected F = {F} features (as the other agents), got {X.shape[1]}")
        if np.shape(a["y"]) != (X.shape[0],) or np.shape(a["entity"]) != (X.shape[0],):
            raise ValueError(f"agents[{i}]: y and entity must have one entry per row of X ({X.shape[0]})")
        if not (np.all(np.isfinite(X)) and np.all(np.isfinite(a["y"]))):
            raise ValueError(f"agents[{i}]: X and y must be finite")
    return int(F)


def make_shards(agents, sigma: float, z_init=None, test=None) -> tuple[Shard, np.ndarray]:
    """Stacked shards (leading agent axis J) from per-agent datasets ``[{X, y, entity}, ...]`` and ``index``
    (J, P): the position of each (agent, slot) pair in the global pair order (agents in list order, pairs by
    entity id), -1 for padding. ``z_init``: global labels (E,) or None. ``test``: optional held-out events per
    agent (same list order); events of entities the agent has no training pair for are ignored."""
    F = check_agents(agents)
    if test is not None:
        if len(test) != len(agents):
            raise ValueError(f"test: expected one held-out dict per agent ({len(agents)}), got {len(test)}")
        check_agents([t for t in test if len(t["y"])] or agents, F)
    stats, tstats = [], []
    for i, a in enumerate(agents):
        ps = pair_structure(np.zeros(len(a["y"]), np.int64), a["entity"])
        stats.append(pair_statistics(a["X"], a["y"], ps["pair"], ps["n_pairs"]))
        if test is not None:
            ents = np.unique(np.asarray(a["entity"]))
            te = np.asarray(test[i]["entity"])
            pos = np.searchsorted(ents, te)
            keep = (pos < len(ents)) & (ents[np.minimum(pos, len(ents) - 1)] == te)
            tstats.append(pair_statistics(np.asarray(test[i]["X"])[keep].reshape(-1, F),
                                          np.asarray(test[i]["y"])[keep], pos[keep], len(ents)))
    J, P, F = len(agents), max(len(s[3]) for s in stats), np.shape(agents[0]["X"])[1]
    s2 = sigma**2
    Gs, gs = np.zeros((J, P, F, F)), np.zeros((J, P, F))
    const, mask, z0 = np.zeros((J, P)), np.zeros((J, P), bool), np.full((J, P), -1, np.int32)
    tG, tg, tq, tn = np.zeros((J, P, F, F)), np.zeros((J, P, F)), np.zeros((J, P)), np.zeros((J, P))
    index = np.full((J, P), -1, np.int64)
    start = 0
    for i, (G, g, q, n) in enumerate(stats):
        E_i = len(n)
        Gs[i, :E_i], gs[i, :E_i] = G / s2, g / s2
        const[i, :E_i] = -0.5 * n * (LOG_2PI + np.log(s2)) - 0.5 * q / s2
        mask[i, :E_i] = True
        index[i, :E_i] = start + np.arange(E_i)
        start += E_i
        if tstats:
            tG[i, :E_i], tg[i, :E_i], tq[i, :E_i], tn[i, :E_i] = tstats[i]
    if z_init is not None:
        z_init = np.asarray(z_init)
        valid = index >= 0
        z0[valid] = z_init[index[valid]]
    return Shard(*(jnp.asarray(v) for v in (Gs, gs, const, mask, z0, tG, tg, tq, tn))), index


def split_by_agent(data: dict, num_agents: int | None = None) -> list[dict]:
    """The simulation's view: the centralised event arrays split into per-agent datasets (agents in sorted id
    order, so the global pair order equals ``zoo.hlcr.pair_structure``'s). ``num_agents``: agent ids must
    then lie in 0..num_agents-1 and every one of them must have data."""
    agent = np.asarray(data["agent"])
    if num_agents is None:
        ids = np.unique(agent)
    else:
        ids = np.arange(num_agents)
        if agent.dtype.kind not in "iu":
            raise ValueError(f"num_agents: with num_agents given, data['agent'] must hold the agent ids "
                             f"0..{num_agents - 1} (integers), got labels of dtype {agent.dtype}")
        if agent.size and agent.max() >= num_agents:
            raise ValueError(f"num_agents: {num_agents} agents, but data['agent'] holds id {int(agent.max())}")
        empty = np.setdiff1d(ids, agent)
        if empty.size:
            raise ValueError(f"num_agents: agent(s) {empty.tolist()} have no data (no events); every agent must "
                             f"hold at least one event")
    return [{k: np.asarray(data[k])[agent == i] for k in ("X", "y", "entity")} for i in ids]


def split_test_like(test: dict, train: dict) -> list[dict]:
    """Held-out events split like ``split_by_agent(train)`` (agents in sorted id order of the training data)."""
    ids = np.unique(np.asarray(train["agent"]))
    agent = np.asarray(test["agent"])
    return [{k: np.asarray(test[k])[agent == i] for k in ("X", "y", "entity")} for i in ids]


# --------------------------------------------------------------------------------------------------
# The protocol
# --------------------------------------------------------------------------------------------------

class Config(NamedTuple):
    K: int
    F: int
    alpha: float
    beta: float
    delta: float
    gamma: float
    leave_own_out: bool
    prior: str
    dp_noise_scale: float


class AgentState(NamedTuple):
    """An agent's private state. ``own_*``: its effective contribution to the server's smoothed statistics
    after server update ``t_own`` (its upload U enters as gamma U and then decays by (1 - gamma) per server
    update, so at update t it is (1 - gamma)^(t - t_own) own; needed by ``leave_own_out``)."""

    z: jax.Array          # (P,) labels
    own_D: jax.Array      # (K, F, F)
    own_c: jax.Array      # (K, F)
    own_n: jax.Array      # (K,)
    t_own: jax.Array      # () int
    n_changed: jax.Array  # () labels changed in the last sweep
    sse: jax.Array        # () held-out squared error of the new labels under the broadcast cluster means
    dp: jax.Array         # () sd of the noise the agent adds to its uploads (runtime value; used if cfg's > 0)


class ServerState(NamedTuple):
    """Smoothed sums over agents (prior not included), psi, number of updates applied (t = 0 after the
    initialisation round, -1 before), and the server's key (for the psi draw)."""

    D: jax.Array
    c: jax.Array
    n: jax.Array
    m: jax.Array
    log_psi: jax.Array
    t: jax.Array
    gamma: jax.Array      # () learning rate (runtime value, so one compilation serves every gamma)
    key: jax.Array


def _upload(z, shard: Shard, K: int, m, key=None, scale=None):
    """Per-cluster sums of the agent's pairs (the FedHLCR message); with ``scale`` (noise sd), Gaussian noise
    on D (symmetrised: off-diagonal entries get sd ``scale``) and on c."""
    D = jax.ops.segment_sum(shard.Gs, z, num_segments=K)       # padding has zero statistics
    c = jax.ops.segment_sum(shard.gs, z, num_segments=K)
    n = jax.ops.segment_sum(shard.mask.astype(D.dtype), z, num_segments=K)
    if scale is not None:
        kD, kc = jax.random.split(key)
        eD = jax.random.normal(kD, D.shape) * scale
        D = D + (eD + jnp.swapaxes(eD, -1, -2)) / jnp.sqrt(2.0)
        c = c + jax.random.normal(kc, c.shape) * scale
    return {"D": D, "c": c, "n": n, "m": m}


def table_counts(key, z, mask, log_psi, beta, K):
    """Antoniak table counts m_k of one agent (notes P1; as ``hlcr_common.antoniak_table_totals`` for one
    agent, same random numbers, with padding excluded): the l-th pair (l = 0, 1, ...) of label k opens a
    table with probability beta psi_k / (beta psi_k + l)."""
    P = z.shape[0]
    order = jnp.argsort(z, stable=True)
    z_sorted = z[order]
    starts = jnp.searchsorted(z_sorted, z_sorted, side="left")
    rank = jnp.zeros(P, dtype=jnp.int32).at[order].set((jnp.arange(P) - starts).astype(jnp.int32))
    bp = beta * jnp.exp(log_psi[z])
    new = (jax.random.uniform(key, (P,)) < bp / (bp + rank)) & mask
    return jax.ops.segment_sum(new.astype(jnp.float64), z, num_segments=K)


def local_sweep(z, shard: Shard, D, c, logZ, n_cluster, log_psi, gumbel, cfg: Config):
    """One sequential sweep over the agent's pairs; returns the new labels and the number changed.

    With ``cfg.leave_own_out`` (D, c, n_cluster) include the agent's current labels and are updated pair by
    pair (exact collapsed conditional: the pair is removed from its cluster first, as in
    ``hlcr_gibbs._block_pair_update``); otherwise they are the broadcast values, fixed (paper Algorithm 3)."""
    K = cfg.K
    ks = jnp.arange(K)
    n_agent = jax.ops.segment_sum(shard.mask.astype(D.dtype), z, num_segments=K)

    def pair(carry, xs):
        z, D, c, logZ, n_agent, n_cluster = carry
        Gs_e, gs_e, const_e, mask_e, gumbel_e, e = xs
        k0 = z[e]
        is0 = ks == k0
        if cfg.leave_own_out:
            sign = jnp.where(is0, -1.0, 1.0)
            lz = log_normaliser(D + sign[:, None, None] * Gs_e, c + sign[:, None] * gs_e)
            logZ_with = jnp.where(is0, logZ, lz)
            logZ_without = jnp.where(is0, lz, logZ)
            nc = n_cluster - is0
        else:
            logZ_with = log_normaliser(D + Gs_e, c + gs_e)
            logZ_without = logZ
            nc = n_cluster
        logits = prior_logits(n_agent - is0, nc, log_psi, cfg.alpha, cfg.beta, cfg.prior) \
            + logZ_with - logZ_without + const_e
        k1 = jnp.where(mask_e, jnp.argmax(logits + gumbel_e), k0).astype(z.dtype)
        move = (ks == k1).astype(D.dtype) - is0
        n_agent = n_agent + move
        if cfg.leave_own_out:
            D = D + move[:, None, None] * Gs_e
            c = c + move[:, None] * gs_e
            logZ = jnp.where(ks == k1, logZ_with, logZ_without)
            n_cluster = n_cluster + move
        return (z.at[e].set(k1), D, c, logZ, n_agent, n_cluster), k1 != k0

    P = z.shape[0]
    xs = (shard.Gs, shard.gs, shard.const, shard.mask, gumbel, jnp.arange(P))
    (z_new, *_), changed = jax.lax.scan(pair, (z, D, c, logZ, n_agent, n_cluster), xs)
    return z_new, jnp.sum(changed)


def make_protocol(cfg: Config, server_key: jax.Array) -> Protocol:
    """FedHLCR as a ``local_step``/``aggregate`` protocol (module docstring)."""
    K, F = cfg.K, cfg.F
    prior_prec = jnp.eye(F) / cfg.delta**2
    i32 = jnp.int32
    noisy = cfg.dp_noise_scale > 0

    def init(shard: Shard, key):
        k_z, k_noise = jax.random.split(key)
        P = shard.mask.shape[0]
        z = jnp.where(shard.z0 >= 0, shard.z0, jax.random.randint(k_z, (P,), 0, K)).astype(jnp.int32)
        dp = jnp.asarray(cfg.dp_noise_scale, jnp.float64)
        msg = _upload(z, shard, K, jnp.zeros(K), k_noise, dp if noisy else None)
        st = AgentState(z, msg["D"], msg["c"], msg["n"], jnp.zeros((), i32), jnp.zeros((), i32), jnp.zeros(()), dp)
        return st, msg

    def local_step(st: AgentState, shard: Shard, inbox, key):
        # the same key split as hlcr_gibbs.step (gumbel, tables, psi), so one agent reproduces it exactly;
        # the third key (the server draws psi) perturbs the upload when dp_noise_scale > 0
        k_gumbel, k_tables, k_noise = jax.random.split(key, 3)
        P = shard.mask.shape[0]
        gumbel = jax.random.gumbel(k_gumbel, (P, K))
        D, c, n, g = inbox["D"], inbox["c"], inbox["n"], inbox["gamma"]
        w = jnp.linalg.solve(D, c[..., None])[..., 0]             # broadcast cluster means (Theorem 2)
        decay = (1.0 - g) ** (inbox["t"] - st.t_own)   # own upload's weight now, relative to when it entered
        if cfg.leave_own_out:
            mine = _upload(st.z, shard, K, None)
            D = D - decay * st.own_D + mine["D"]
            c = c - decay * st.own_c + mine["c"]
            n = n - decay * st.own_n + mine["n"]
        logZ = log_normaliser(D, c)
        z, n_changed = local_sweep(st.z, shard, D, c, logZ, n, inbox["log_psi"], gumbel, cfg)
        m = table_counts(k_tables, z, shard.mask, inbox["log_psi"], cfg.beta, K)
        msg = _upload(z, shard, K, m, k_noise, st.dp if noisy else None)
        own = [(1.0 - g) * decay * o + g * msg[k] for o, k in ((st.own_D, "D"), (st.own_c, "c"), (st.own_n, "n"))]
        W = w[z]                                                   # (P, F) held-out evaluation, local
        sse = jnp.sum(shard.tq - 2 * jnp.sum(W * shard.tg, -1) + jnp.einsum("pf,pfg,pg->p", W, shard.tG, W))
        return AgentState(z, *own, (inbox["t"] + 1).astype(i32), n_changed.astype(i32), sse, st.dp), msg

    def init_server(messages, active):
        return ServerState(jnp.zeros((K, F, F)), jnp.zeros((K, F)), jnp.zeros(K), jnp.zeros(K),
                           jnp.full(K, -jnp.log(K)), -jnp.ones((), i32), jnp.asarray(cfg.gamma, jnp.float64),
                           server_key)

    def aggregate(server: ServerState, messages, active):
        w = active.astype(jnp.float64)
        S = {k: jnp.tensordot(w, messages[k], axes=1) for k in ("D", "c", "n", "m")}
        first = server.t < 0
        any_active = jnp.any(active)
        rate = jnp.where(first, 1.0, jnp.where(any_active, server.gamma, 0.0))
        D = (1 - rate) * server.D + rate * S["D"]
        if noisy:   # noisy sums can be indefinite: project onto the PSD cone
            lam, V = jnp.linalg.eigh(0.5 * (D + jnp.swapaxes(D, -1, -2)))
            D = jnp.einsum("kij,kj,klj->kil", V, jnp.maximum(lam, 0.0), V)
        c = (1 - rate) * server.c + rate * S["c"]
        n = (1 - rate) * server.n + rate * S["n"]
        m = (1 - rate) * server.m + rate * S["m"]
        t = jnp.where(first | any_active, server.t + 1, server.t).astype(i32)
        drawn = sample_log_dirichlet(jax.random.fold_in(server.key, t), cfg.alpha / K + m)
        log_psi = jnp.where(first, server.log_psi, jnp.where(any_active, drawn, server.log_psi))
        server = ServerState(D, c, n, m, log_psi, t, server.gamma, server.key)
        J = active.shape[0]
        bcast = {"D": prior_prec + D, "c": c, "n": n, "log_psi": log_psi, "t": t, "gamma": server.gamma}
        return server, jax.tree.map(lambda a: jnp.broadcast_to(a, (J, *jnp.shape(a))), bcast)

    def report(st: AgentState, shard: Shard):
        n_agent = jax.ops.segment_sum(shard.mask.astype(jnp.float64), st.z, num_segments=K)
        return {"n_changed": st.n_changed.astype(i32), "const": jnp.sum(jnp.where(shard.mask, shard.const, 0.0)),
                "n_agent": n_agent, "sse": st.sse, "n_test": jnp.sum(shard.tn)}

    def summarize(reports, messages, server: ServerState, active):
        """Collapsed log joint of every agent's current labels (from their last uploads; with dp_noise_scale > 0
        from the server's projected statistics, an approximation): log p(y | z) + log p(z | psi) + log Dir(psi),
        as ``hlcr_gibbs.log_joint``."""
        from jax.scipy.special import gammaln

        if noisy:   # noisy sums may be indefinite: use the server's PSD-projected statistics instead
            D, c = prior_prec + server.D, server.c
        else:
            D = prior_prec + messages["D"].sum(0)
            c = messages["c"].sum(0)
        ev = jnp.sum(log_normaliser(D, c)) - K * F * jnp.log(cfg.delta) + jnp.sum(reports["const"])
        a = cfg.alpha / K
        lp_psi = gammaln(cfg.alpha) - K * gammaln(a) + (a - 1) * jnp.sum(server.log_psi)
        log_joint = ev + log_prior_labels(reports["n_agent"], server.log_psi, cfg.beta) + lp_psi
        n_test = jnp.sum(reports["n_test"])
        mse = jnp.where(n_test > 0, jnp.sum(reports["sse"]) / jnp.maximum(n_test, 1.0), jnp.nan)
        return {"log_joint": log_joint, "mse": mse,
                "n_changed": jnp.sum(jnp.where(active, reports["n_changed"], 0)),
                "n_active": jnp.sum(active), "server_updates": server.t}

    return Protocol(init=init, local_step=local_step, aggregate=aggregate, init_server=init_server, report=report,
                    summarize=summarize, name="fedhlcr")


def participation_fn(fraction: float, dropout: float):
    """The server's per-round choice: ceil(fraction * J) agents uniformly among the alive ones; then each
    chosen agent's upload is lost with probability ``dropout`` (the agent's state does not advance)."""
    if fraction >= 1.0 and dropout <= 0.0:
        return None

    def participation(t, key, alive):
        J = alive.shape[0]
        k_sel, k_drop = jax.random.split(key)
        n_sel = int(np.ceil(fraction * J))
        score = jnp.where(alive, jax.random.uniform(k_sel, (J,)), 2.0)
        rank = jnp.argsort(jnp.argsort(score))
        chosen = (rank < n_sel) & alive
        return chosen & (jax.random.uniform(k_drop, (J,)) >= dropout)

    return participation


# --------------------------------------------------------------------------------------------------
# Driver: build shards and protocol, run, assemble the result
# --------------------------------------------------------------------------------------------------

def check_options(o: dict) -> None:
    """Method-specific option checks (before any round)."""
    def unit(name, v, lo_open=True):
        if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v) or not (0 < v <= 1):
            raise ValueError(f"{name}: expected a number in (0, 1], got {v!r}")

    unit("gamma", o["gamma"])
    unit("participation", o["participation"])
    d = o["dropout"]
    if isinstance(d, bool) or not isinstance(d, int | float) or not (0 <= d < 1):
        raise ValueError(f"dropout: expected a probability in [0, 1), got {d!r}")
    s = o["dp_noise_scale"]
    if isinstance(s, bool) or not isinstance(s, int | float) or not np.isfinite(s) or s < 0:
        raise ValueError(f"dp_noise_scale: expected a number >= 0 (0 = off), got {s!r}")
    if o["prior"] not in PRIORS:
        raise ValueError(f"prior: expected one of {list(PRIORS)}, got {o['prior']!r}")
    if o["runner"] not in RUNNERS:
        raise ValueError(f"runner: expected one of {list(RUNNERS)}, got {o['runner']!r}")
    if o["on_node_failure"] not in ("raise", "continue"):
        raise ValueError(f"on_node_failure: expected 'raise' or 'continue', got {o['on_node_failure']!r}")
    if not isinstance(o["leave_own_out"], bool):
        raise ValueError(f"leave_own_out: expected True or False, got {o['leave_own_out']!r}")


DEFAULTS: dict[str, Any] = {
    "max_iter": 20, "num_chains": 1, "gamma": 1.0, "participation": 1.0, "dropout": 0.0, "leave_own_out": True,
    "prior": "exact", "dp_noise_scale": 0.0, "runner": "inprocess", "on_node_failure": "continue", "chunk": 50,
    "z_init": None, "num_agents": None, "num_samples": 100,
}


def run_federated(agents, hyper: dict, key: jax.Array, *, max_iter: int = 20, gamma: float = 1.0,
                  participation: float = 1.0, dropout: float = 0.0, leave_own_out: bool = True,
                  prior: str = "exact", dp_noise_scale: float = 0.0, runner: str = "inprocess",
                  on_node_failure: str = "continue", chunk: int = 50, z_init=None, progress=None,
                  callback=None, ray_init: dict | None = None, server_key: jax.Array | None = None,
                  test=None):
    """Run FedHLCR on per-agent datasets ``agents = [{X, y, entity}, ...]``. Every input is checked before any
    round. The runner gets ``k_agents = split(key)[0]`` (agent i's key in round t is
    ``fold_in(fold_in(k_agents, t), i)``); ``server_key`` (default ``split(key)[1]``) seeds the server's psi
    draws. Returns ``(RunResult, index, audit)``: ``index`` (J, P) maps agent slots to global pairs, ``audit``
    the records of everything that crossed the transport (``uplink``, ``downlink``, ``monitoring``).
    ``test``: optional per-agent held-out events (``split_by_agent`` of a test split); the history then has
    ``mse``, the held-out mean squared error of every agent's latest labels under the cluster means it was
    sent (each agent reports only its sum of squared errors and its count)."""
    check_options({"gamma": gamma, "participation": participation, "dropout": dropout,
                   "dp_noise_scale": dp_noise_scale, "prior": prior, "runner": runner,
                   "on_node_failure": on_node_failure, "leave_own_out": leave_own_out})
    h = resolve_hyper({**SPEC.default_hyper, **hyper})
    F = check_agents(agents)
    if z_init is not None:
        z = np.asarray(z_init)
        E = sum(len(np.unique(a["entity"])) for a in agents)
        if z.shape != (E,) or z.min() < 0 or z.max() >= int(h["K"]):
            raise ValueError(f"z_init: expected {E} labels in 0..{int(h['K']) - 1} (one per pair)")
    shards, index = make_shards(agents, float(h["sigma"]), z_init, test)
    cfg = Config(int(h["K"]), F, float(h["alpha"]), float(h["beta"]), float(h["delta"]), float(gamma),
                 bool(leave_own_out), prior, float(dp_noise_scale))
    k_agents, k_server = jax.random.split(key)
    k_server = k_server if server_key is None else server_key
    proto, log = audited(make_protocol(cfg, k_server))
    part = participation_fn(float(participation), float(dropout))
    if runner == "ray":
        from inference.distributed.ray_runner import run_ray

        res = run_ray(proto, shards, k_agents, max_rounds=max_iter, on_node_failure=on_node_failure,
                      participation=part, callback=callback, progress=progress, ray_init=ray_init)
    else:
        res = run_inprocess(proto, shards, k_agents, max_rounds=max_iter, participation=part, chunk=chunk,
                            progress=progress)
    audit = log.as_dict()
    audit["bytes_uploaded_per_round"] = np.asarray(res.history.get("bytes_sent", np.zeros((0, 1)))).sum(1).tolist()
    audit["message_nbytes"] = int(res.message_nbytes)
    return res, index, audit


def global_labels(res, index) -> np.ndarray:
    """Every agent's final labels in the global pair order (the simulation's view; in a real deployment the
    labels never leave the agents)."""
    z = np.asarray(res.states.z)
    E = int((index >= 0).sum())
    out = np.full(E, -1, np.int64)
    valid = index >= 0
    out[index[valid]] = z[valid]
    return out


def _check(o: dict) -> None:
    check_options(o)
    if o["num_agents"] is not None and (isinstance(o["num_agents"], bool) or not isinstance(o["num_agents"], int)
                                        or o["num_agents"] < 1):
        raise ValueError(f"num_agents: expected a positive integer or None, got {o['num_agents']!r}")


@register_method("fedgibbs", kind="point", models=("hlcr",), check=_check, options=DEFAULTS)
def run_fedgibbs(ctx: FitContext) -> Draws:
    """FedHLCR (paper Algorithm 3, corrected): agents re-sample their own labels against broadcast cluster
    statistics and upload per-cluster sums; the server sums and smooths them (learning rate ``gamma``).

    Options: ``max_iter`` (rounds), ``num_chains`` (independent restarts; ``attrs['best_chain']`` is the one
    with the highest final collapsed log joint), ``gamma``, ``participation`` (fraction of agents per
    round), ``dropout`` (probability a chosen agent's upload is lost), ``leave_own_out`` (notes G4),
    ``prior`` (``"exact"`` | ``"paper"``), ``dp_noise_scale`` (Gaussian noise on the uploaded sums),
    ``runner`` (``"inprocess"`` | ``"ray"``), ``on_node_failure`` (Ray: a dead agent actor is dropped
    (``"continue"``) or stops the run (``"raise"``)), ``z_init`` (initial labels per pair), ``num_agents``.
    Agents are the data's agent ids. Draws (``num_samples`` per restart = chain): the final labels z and psi
    from the server, with w_k ~ N(D_k^-1 c_k, D_k^-1) from the server's statistics (mean: Theorem 2's m_k) and
    theta_i ~ Dir(beta psi + N_i): conditional on the final labels, so they understate the label uncertainty."""
    o = ctx.options
    agents = split_by_agent(ctx.data, o["num_agents"])
    h = resolve_hyper(ctx.hyper)
    K = int(h["K"])
    zs, ws, psis, thetas, hist, audits = [], [], [], [], [], []
    for r in range(o["num_chains"]):
        res, index, audit = run_federated(
            agents, h, jax.random.fold_in(ctx.key, r), server_key=jax.random.fold_in(ctx.key, 10**6),
            max_iter=o["max_iter"], gamma=o["gamma"],
            participation=o["participation"], dropout=o["dropout"], leave_own_out=o["leave_own_out"],
            prior=o["prior"], dp_noise_scale=o["dp_noise_scale"], runner=o["runner"],
            on_node_failure=o["on_node_failure"], chunk=o["chunk"], z_init=o["z_init"], progress=o["progress"])
        z = global_labels(res, index)
        sv = res.server_state
        D = np.eye(agents[0]["X"].shape[1]) / h["delta"] ** 2 + np.asarray(sv.D)
        w = np.linalg.solve(D, np.asarray(sv.c)[..., None])[..., 0]
        psi = np.exp(np.asarray(sv.log_psi))
        ps = pair_structure(ctx.data["agent"], ctx.data["entity"])
        n_agent = np.zeros((ps["n_agents"], K))
        np.add.at(n_agent, (ps["pair_agent"], z), 1.0)
        # draws of (w, theta) from their conditionals given the final labels and psi (as hlcr_gibbs's
        # draw_parameters): w_k ~ N(D_k^-1 c_k, D_k^-1) with the server's statistics, theta_i ~ Dir(beta psi + N_i)
        S = o["num_samples"]
        k_w, k_t = jax.random.split(jax.random.fold_in(ctx.key, 2 * 10**6 + r))
        L = np.linalg.cholesky(np.linalg.inv(D))
        eps = np.asarray(jax.random.normal(k_w, (S, *w.shape)))
        conc = np.broadcast_to(h["beta"] * psi + n_agent, (S, *n_agent.shape))
        zs.append(np.broadcast_to(z, (S, len(z))))
        ws.append(w + np.einsum("kij,skj->ski", L, eps))
        psis.append(np.broadcast_to(psi, (S, K)))
        thetas.append(np.exp(np.asarray(sample_log_dirichlet(k_t, jnp.asarray(conc)))))
        hist.append(res.history)
        audits.append(audit)
    log_joint = np.stack([hh["log_joint"] for hh in hist], 1)           # (iteration, chain)
    best = int(np.argmax(log_joint[-1]))
    traces = {"log_joint": log_joint, "n_changed": np.stack([hh["n_changed"] for hh in hist], 1),
              "n_active": np.stack([hh["n_active"] for hh in hist], 1),
              "bytes_uploaded": np.stack([hh["bytes_sent"].sum(1) for hh in hist], 1)}
    post = {"z": np.stack(zs), "w": np.stack(ws), "psi": np.stack(psis), "theta": np.stack(thetas)}
    a0 = audits[0]
    attrs = {"best_chain": best, "rounds": int(len(log_joint)), "num_agents": len(agents),
             "protocol_audit": json.dumps({k: a0[k] for k in ("uplink", "downlink", "monitoring", "message_nbytes")}),
             "bytes_uploaded_total": int(sum(sum(a["bytes_uploaded_per_round"]) for a in audits)),
             "gamma": float(o["gamma"]), "participation": float(o["participation"]), "dropout": float(o["dropout"]),
             "leave_own_out": int(o["leave_own_out"]), "dp_noise_scale": float(o["dp_noise_scale"])}
    return Draws(posterior=post, traces=traces, dims={k: ["iteration", "chain"] for k in traces}, attrs=attrs)


# --------------------------------------------------------------------------------------------------
# FedVB: federated VB-EM (notes §3.8, E3), reusing inference.hlcr_vb's blocks
# --------------------------------------------------------------------------------------------------

class VBAgentState(NamedTuple):
    r: jax.Array      # (P, K) responsibilities q(z = k) of the agent's pairs (0 on padding)
    a: jax.Array      # (K,) Dirichlet parameters of q(theta_i)


def make_vb_protocol(hyper, K: int, F: int) -> Protocol:
    """Federated VB-EM (notes §3.8): the same iteration as ``inference.hlcr_vb.step``, split in two.

    Server (``aggregate``): q(w) from the summed soft statistics, S_k^-1 = I/delta^2 + sum_i sum_j r_ijk G_ij/s^2,
    m_k = S_k sum_i sum_j r_ijk g_ij/s^2; psi by the same monotone ascent as ``hlcr_vb._update_psi`` on
    sum_i E[log theta_i]; broadcast (m, S, log psi). Agent (``local_step``): a_i = beta psi + sum_j r_ij (its
    previous responsibilities), then r_ij from (m, S, a_i) (``hlcr_vb._update_z``); upload the soft sums
    sum_j r_ijk G_ij/s^2 (K, F, F), sum_j r_ijk g_ij/s^2 (K, F), sum_j r_ijk (K,) and E[log theta_i] (K,).
    With every agent reporting, round t leaves the agents with exactly the centralised iterate t (notes E3).
    Under partial participation the server sums every agent's latest upload (stale for the absent ones)."""
    from inference.hlcr_vb import _elogtheta, _expected_loglik, _psi_objective

    prior_prec = jnp.eye(F) / hyper.delta**2

    def upload(r, a, shard):
        return {"D": jnp.einsum("pk,pij->kij", r, shard.Gs), "c": r.T @ shard.gs, "n": r.sum(0),
                "elog": _elogtheta(a)}

    def local_pdat(shard):
        from inference.hlcr_common import PairData

        return PairData(shard.Gs, shard.gs, shard.const, jnp.zeros(shard.mask.shape[0], jnp.int32))

    def init(shard: Shard, key):
        P = shard.mask.shape[0]
        r = jax.random.dirichlet(key, jnp.ones(K), (P,)) * shard.mask[:, None]
        a = hyper.beta / K + r.sum(0)                                  # psi uniform at the start
        return VBAgentState(r, a), upload(r, a, shard)

    def local_step(st: VBAgentState, shard: Shard, inbox, key):
        a = hyper.beta * jnp.exp(inbox["log_psi"]) + st.r.sum(0)
        logits = _expected_loglik(inbox["m"], inbox["S"], local_pdat(shard)) + _elogtheta(a)[None, :]
        r = jax.nn.softmax(logits, axis=-1) * shard.mask[:, None]
        return VBAgentState(r, a), upload(r, a, shard)

    def init_server(messages, active):
        return {"log_psi": jnp.full(K, -jnp.log(K))}

    def aggregate(server, messages, active):
        D = prior_prec + messages["D"].sum(0)
        S = jnp.linalg.inv(D)
        S = 0.5 * (S + jnp.swapaxes(S, -1, -2))
        m = jnp.einsum("kij,kj->ki", S, messages["c"].sum(0))
        elog_sum = messages["elog"].sum(0)
        f = lambda u: _psi_objective(u, elog_sum, hyper)  # noqa: E731
        grad = jax.grad(f)

        def body(_, carry):
            u, fu, lr = carry
            v = u + lr * grad(u)
            fv = f(v)
            ok = fv >= fu
            return jnp.where(ok, v, u), jnp.where(ok, fv, fu), jnp.where(ok, lr * 1.5, lr * 0.25)

        u0 = server["log_psi"]
        u, _, _ = jax.lax.fori_loop(0, 30, body, (u0, f(u0), 0.1))
        log_psi = jax.nn.log_softmax(u)
        J = active.shape[0]
        bcast = {"m": m, "S": S, "log_psi": log_psi}
        return {"log_psi": log_psi}, jax.tree.map(lambda x: jnp.broadcast_to(x, (J, *x.shape)), bcast)

    def summarize(reports, messages, server, active):
        return {"n_active": jnp.sum(active), "soft_counts": messages["n"].sum(0)}

    return Protocol(init=init, local_step=local_step, aggregate=aggregate, init_server=init_server,
                    summarize=summarize, name="fedhlcr vb")


def run_federated_vb(agents, hyper: dict, key: jax.Array, *, max_iter: int = 100, participation: float = 1.0,
                     dropout: float = 0.0, runner: str = "inprocess", on_node_failure: str = "continue",
                     chunk: int = 50, progress=None, callback=None):
    """Run federated VB-EM on per-agent datasets. Returns ``(RunResult, index, audit)`` as ``run_federated``."""
    from inference.hlcr_gibbs import make_hyper

    check_options({**DEFAULTS, "participation": participation, "dropout": dropout, "runner": runner,
                   "on_node_failure": on_node_failure})
    h = resolve_hyper({**SPEC.default_hyper, **hyper})
    F = check_agents(agents)
    shards, index = make_shards(agents, float(h["sigma"]))
    proto, log = audited(make_vb_protocol(make_hyper(h, len(agents)), int(h["K"]), F))
    part = participation_fn(float(participation), float(dropout))
    if runner == "ray":
        from inference.distributed.ray_runner import run_ray

        res = run_ray(proto, shards, key, max_rounds=max_iter, on_node_failure=on_node_failure,
                      participation=part, callback=callback, progress=progress)
    else:
        res = run_inprocess(proto, shards, key, max_rounds=max_iter, participation=part, chunk=chunk,
                            progress=progress)
    audit = log.as_dict()
    audit["bytes_uploaded_per_round"] = np.asarray(res.history.get("bytes_sent", np.zeros((0, 1)))).sum(1).tolist()
    audit["message_nbytes"] = int(res.message_nbytes)
    return res, index, audit


@register_method("fedvb", kind="variational", models=("hlcr",), check=_check, options={
    **{k: DEFAULTS[k] for k in ("participation", "dropout", "runner", "on_node_failure", "chunk", "num_agents")},
    "max_iter": 200, "num_samples": 1000, "gamma": 1.0, "dp_noise_scale": 0.0, "prior": "exact",
    "leave_own_out": True, "num_restarts": 1,
})
def run_fedvb(ctx: FitContext) -> Draws:
    """Federated VB-EM for HLCR (notes §3.8/E3): agents send soft per-cluster statistics and E[log theta_i];
    with full participation every round equals the centralised ``vbem`` iteration. Options: ``max_iter``
    (rounds), ``num_samples`` (draws from q), ``participation``, ``dropout``, ``runner``, ``num_agents``
    (``gamma``, ``dp_noise_scale``, ``prior``, ``leave_own_out`` are accepted for a shared option check and
    must keep their defaults), ``num_restarts`` (independent federated runs from random soft labels; the one with
    the highest final bound is kept, as ``vbem`` does: each agent's share of the bound, sum over its pairs of
    r (E log N + E log theta) - r log r plus its q(theta) terms, is one scalar, and the server adds the q(w) and
    psi terms). Draws from q as ``vbem`` (w ~ q(w), theta ~ q(theta), z ~ Cat(r), psi point); the fitted q is in
    group ``vbem``, the bound of the kept restart in attribute ``elbo``."""
    from inference.hlcr_common import pair_data
    from inference.hlcr_gibbs import make_hyper
    from inference.hlcr_vb import VBState, draw, elbo, q_dataset

    o = ctx.options
    for k, v in (("gamma", 1.0), ("dp_noise_scale", 0.0), ("prior", "exact"), ("leave_own_out", True)):
        if o[k] != v:
            raise ValueError(f"{k}: not used by fedvb (keep the default {v!r}), got {o[k]!r}")
    if isinstance(o["num_restarts"], bool) or not isinstance(o["num_restarts"], int) or o["num_restarts"] < 1:
        raise ValueError(f"num_restarts: expected a positive integer, got {o['num_restarts']!r}")
    agents = split_by_agent(ctx.data, o["num_agents"])
    h = resolve_hyper(ctx.hyper)
    K = int(h["K"])
    F = agents[0]["X"].shape[1]
    pdat = pair_data(ctx.model_kwargs)
    vb_hyper = make_hyper(ctx.hyper, ctx.model_kwargs["n_agents"])
    k_run, k_draw = jax.random.split(ctx.key)
    runs = []
    for key in jax.random.split(k_run, o["num_restarts"]):
        res, index, audit = run_federated_vb(agents, h, key, max_iter=o["max_iter"], participation=o["participation"],
                                             dropout=o["dropout"], runner=o["runner"],
                                             on_node_failure=o["on_node_failure"], chunk=o["chunk"],
                                             progress=o["progress"])
        r_all = np.asarray(res.states.r)
        valid = index >= 0
        r = np.zeros((int(valid.sum()), K))
        r[index[valid]] = r_all[valid]
        D = np.eye(F) / h["delta"] ** 2 + np.asarray(res.messages["D"]).sum(0)
        S = np.linalg.inv(D)
        S = 0.5 * (S + np.swapaxes(S, -1, -2))
        m = np.einsum("kij,kj->ki", S, np.asarray(res.messages["c"]).sum(0))
        log_psi = np.asarray(res.server_state["log_psi"])
        state = VBState(jnp.asarray(r), jnp.asarray(m), jnp.asarray(S), jnp.asarray(res.states.a),
                        jnp.asarray(log_psi))
        runs.append((float(elbo(state, pdat, vb_hyper)), res, audit, state))
    bound, res, audit, state = max(runs, key=lambda run: run[0])
    log_psi = np.asarray(state.log_psi)
    n = o["num_samples"]
    w, theta, z, log_q = jax.jit(draw, static_argnums=2)(k_draw, state, n)
    psi = np.broadcast_to(np.exp(log_psi), (n, K))
    add = lambda x: np.asarray(x)[None]  # noqa: E731
    attrs = {"rounds": res.rounds, "num_agents": len(agents),
             "protocol_audit": json.dumps({k: audit[k] for k in ("uplink", "downlink", "monitoring",
                                                                 "message_nbytes")}),
             "bytes_uploaded_total": int(sum(audit["bytes_uploaded_per_round"])),
             "elbo": bound, "restart_elbos": [run[0] for run in runs]}
    return Draws(posterior={"w": add(w), "psi": add(psi), "theta": add(theta), "z": add(z)},
                 sample_stats={"log_q": add(log_q)},
                 traces={"n_active": res.history["n_active"], "bytes_uploaded": res.history["bytes_sent"].sum(1)},
                 attrs=attrs, groups={"vbem": q_dataset(state)})


__all__ = ["AgentState", "Config", "ServerState", "Shard", "check_agents", "global_labels", "local_sweep",
           "make_protocol", "make_shards", "message_spec", "participation_fn", "run_federated", "split_by_agent",
           "split_test_like", "table_counts", "make_vb_protocol", "run_federated_vb", "VBAgentState"]
