"""FedHLCR: federated collapsed Gibbs for HLCR (paper §5, Algorithm 3, corrected per notes §3.6 and §4 E5-E8).

Every agent keeps its events, its pair labels z_ij, its entity ids and its per-pair statistics. One round t:

1. the server broadcasts the cluster statistics of round t-1 (notes §3.6): D_k = I/delta^2 + Dbar_k (K, F, F),
   c_k (K, F), smoothed label counts N^(k) (K,) (gap G1: eq. 2 needs them, the paper never sends them),
   log psi (K,) and the number of server updates so far;
2. each participating agent re-samples its own labels in one sequential sweep over its pairs (``local_step``):

       log p(z_ij = k | .) = log prior_k + logZ(D_k + G_ij/s^2, c_k + g_ij/s^2) - logZ(D_k, c_k) + const_ij

   (the normaliser-ratio form of the corrected Theorem 1, erratum E1, shared with the centralised kernel via
   ``inference.hlcr.common``), prior ``"exact"`` log(N_i^(k) + beta psi_k) (notes P1) or ``"paper"`` eq. (2)
   log(N_i^(k) + beta (N^(k) + alpha/K) / (N + alpha)); the agent counts N_i^(k) exclude the pair and follow the
   agent's own sweep (gap G2). Two variants:

   * ``leave_own_out=False`` (the paper's Algorithm 3, erratum E8): (D, c, N) are the broadcast values, fixed
     during the sweep; the pair's own data sits in its previous cluster's statistics and is used again;
   * ``leave_own_out=True`` (gap G4): the agent subtracts its own effective contribution from the broadcast
     (which it can track exactly: see ``AgentState``) and adds its current labels' sums back, updating them
     pair by pair, so it samples from the exact collapsed conditional given the other agents' statistics.
     One agent, full participation, gamma = 1: exactly the centralised sweep of ``inference.hlcr.gibbs``.

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

Rounds run as a kernel of ``inference.loop`` (``inference.hlcr.federated``): ``Info.objective`` is the
collapsed log joint of the agents' current labels (``summarize``), restarts (``num_restarts``) are vectorised and
the highest final log joint is kept.

Initialisation (round 0): every agent draws z ~ U{1..K} (or takes ``z_init``) and uploads its sums; the server
takes their sum as is (Algorithm 3's "t == 1" branch; its own first round against H = delta^2 I is a draw
from the prior, i.e. a random initialisation too) and keeps psi uniform: ``init_server`` hands the round-0
``aggregate`` its t = -1 as a host constant, so that round compiles no psi draw. In process (``run_federated``)
this start is built on the host in NumPy (``host_start``: the same labels bit for bit, the same sums up to
rounding), so the compiled rounds hold no start; with ``dp_noise_scale > 0``, keys other than JAX's default
threefry, or ``restart_keys``, it stays a JAX computation.

Random numbers: an agent's round reads one block of uniforms laid out as ``gibbs.sweep``'s (each pair's Gumbel noise
and table draw; ``common.step_uniforms``), the server's psi draw one block of its own
(``common.log_dirichlet_from_uniforms``): no erf_inv and one random-bits function per draw site in the compiled
rounds (benchmarks/results.md, "hlcr_gibbs_sweep").
"""


from __future__ import annotations

import json
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from inference import host_draws as hd
from inference import host_keys, programs
from inference._methods import Draws, FitContext, Option, register_method
from inference.distributed.audit import audited, message_spec
from inference.distributed.inprocess import Carry
from inference.distributed.protocol import Protocol
from inference.hlcr.common import (
    TINY_LOG,
    gumbel_from_uniforms,
    host_uniform_labels,
    log_dirichlet_from_uniforms,
    log_normaliser,
    log_prior_labels,
    prior_logits,
    step_uniforms,
)
from inference.hlcr.federated import (
    OPTIONS,
    Shard,
    audit_of,
    check_agents,
    check_dropout,
    global_labels,
    make_shards,
    participation_fn,
    protocol_kernel,
    run_protocol,
    split_by_agent,
)
from inference.hlcr.federated import State as FedState
from inference.uniforms import GAMMA_UNIFORMS, open_uniforms
from zoo.hlcr import SPEC, pair_structure, resolve_hyper

PRIORS = ("exact", "paper")


class Config(NamedTuple):
    """The protocol's static configuration. ``gamma`` (the server's learning rate) is the value
    ``make_protocol``'s server starts with; the in-process runs (``run_federated``) build their kernel with
    ``gamma=None`` and pass the rate as an argument of the compiled program (``set_rate``), so runs that differ
    only in gamma share it."""

    K: int
    F: int
    alpha: float
    beta: float
    delta: float
    gamma: float | None
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


def table_counts(key, z, mask, log_psi, beta, K, u=None):
    """Antoniak table counts m_k of one agent (notes P1; as ``common.antoniak_table_totals`` for one
    agent, same random numbers, with padding excluded): the l-th pair (l = 0, 1, ...) of label k opens a
    table with probability beta psi_k / (beta psi_k + l). ``u``: the pairs' uniforms (P,) where the caller draws
    them with others (``key`` unused)."""
    P = z.shape[0]
    order = jnp.argsort(z, stable=True)
    z_sorted = z[order]
    starts = jnp.searchsorted(z_sorted, z_sorted, side="left")
    rank = jnp.zeros(P, dtype=jnp.int32).at[order].set((jnp.arange(P) - starts).astype(jnp.int32))
    bp = beta * jnp.exp(log_psi[z])
    new = ((jax.random.uniform(key, (P,)) if u is None else u) < bp / (bp + rank)) & mask
    return jax.ops.segment_sum(new.astype(jnp.float64), z, num_segments=K)


def local_sweep(z, shard: Shard, D, c, logZ, n_cluster, log_psi, gumbel, cfg: Config):
    """One sequential sweep over the agent's pairs; returns the new labels and the number changed.

    With ``cfg.leave_own_out`` (D, c, n_cluster) include the agent's current labels and are updated pair by
    pair (exact collapsed conditional: the pair is removed from its cluster first, as in
    ``gibbs._block_pair_update``); otherwise they are the broadcast values, fixed (paper Algorithm 3)."""
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


def make_protocol(cfg: Config, server_key: jax.Array | None = None) -> Protocol:
    """FedHLCR as a ``local_step``/``aggregate`` protocol (module docstring). ``server_key`` seeds the server's
    psi draws (None: a placeholder, which ``protocol_kernel``'s init replaces by the run's key)."""
    K, F = cfg.K, cfg.F
    prior_prec = np.eye(F) / cfg.delta**2   # NumPy: built once, a constant of the compiled round
    i32 = jnp.int32
    noisy = cfg.dp_noise_scale > 0

    def init(shard: Shard, key):
        k_z, k_noise = jax.random.split(key) if noisy else (key, None)
        P = shard.mask.shape[0]
        z = jnp.where(shard.z0 >= 0, shard.z0, jax.random.randint(k_z, (P,), 0, K)).astype(jnp.int32)
        dp = jnp.asarray(cfg.dp_noise_scale, jnp.float64)
        msg = _upload(z, shard, K, jnp.zeros(K), k_noise, dp if noisy else None)
        st = AgentState(z, msg["D"], msg["c"], msg["n"], jnp.zeros((), i32), jnp.zeros((), i32), jnp.zeros(()), dp)
        return st, msg

    def local_step(st: AgentState, shard: Shard, inbox, key):
        # the uniforms laid out as gibbs.sweep's (psi's first, here unused: the server draws psi; then each pair's
        # Gumbel noise and table draw), so one agent reproduces it exactly; with dp_noise_scale > 0 a second key
        # perturbs the upload
        k_u, k_noise = jax.random.split(key) if noisy else (key, None)
        P = shard.mask.shape[0]
        _, u_pair = step_uniforms(k_u, GAMMA_UNIFORMS * K, P, K + 1)
        gumbel = gumbel_from_uniforms(u_pair[:, :K])
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
        m = table_counts(None, z, shard.mask, inbox["log_psi"], cfg.beta, K, u=u_pair[:, K])
        msg = _upload(z, shard, K, m, k_noise, st.dp if noisy else None)
        own = [(1.0 - g) * decay * o + g * msg[k] for o, k in ((st.own_D, "D"), (st.own_c, "c"), (st.own_n, "n"))]
        W = w[z]                                                   # (P, F) held-out evaluation, local
        sse = jnp.sum(shard.tq - 2 * jnp.sum(W * shard.tg, -1) + jnp.einsum("pf,pfg,pg->p", W, shard.tG, W))
        return AgentState(z, *own, (inbox["t"] + 1).astype(i32), n_changed.astype(i32), sse, st.dp), msg

    def init_server(messages, active):
        gamma = jnp.nan if cfg.gamma is None else cfg.gamma   # None: the run sets it (``set_rate``)
        # t = -1 as a host constant: the round-0 aggregate that follows knows it is the first (``aggregate``)
        return ServerState(jnp.zeros((K, F, F)), jnp.zeros((K, F)), jnp.zeros(K), jnp.zeros(K),
                           jnp.full(K, -jnp.log(K)), np.asarray(-1, np.int32), jnp.asarray(gamma, jnp.float64),
                           jax.random.key(0) if server_key is None else server_key)

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
        if isinstance(server.t, np.ndarray):   # init_server's state: the initialisation round keeps psi, no draw
            log_psi = server.log_psi
        else:
            u = open_uniforms(jax.random.fold_in(server.key, t), (GAMMA_UNIFORMS, K))
            drawn = log_dirichlet_from_uniforms(u, cfg.alpha / K + m)
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
        as ``gibbs.log_joint``."""
        if noisy:   # noisy sums may be indefinite: use the server's PSD-projected statistics instead
            D, c = prior_prec + server.D, server.c
        else:
            D = prior_prec + messages["D"].sum(0)
            c = messages["c"].sum(0)
        ev = jnp.sum(log_normaliser(D, c)) - K * F * jnp.log(cfg.delta) + jnp.sum(reports["const"])
        labels, lp_psi = log_prior_labels(reports["n_agent"], server.log_psi, cfg.beta, cfg.alpha)
        log_joint = ev + labels + lp_psi
        n_test = jnp.sum(reports["n_test"])
        mse = jnp.where(n_test > 0, jnp.sum(reports["sse"]) / jnp.maximum(n_test, 1.0), jnp.nan)
        return {"log_joint": log_joint, "mse": mse,
                "n_changed": jnp.sum(jnp.where(active, reports["n_changed"], 0)),
                "n_active": jnp.sum(active), "server_updates": server.t}

    return Protocol(init=init, local_step=local_step, aggregate=aggregate, init_server=init_server, report=report,
                    summarize=summarize, name="fedhlcr")


def _seed_server(server: ServerState, key) -> ServerState:
    return server._replace(key=key)


def set_rate(carry, gamma):
    """The runner's round-0 carry with the learning rate ``gamma`` (a runtime value of the compiled rounds) in the
    server's state and in its first broadcast (``gamma`` () or, for a leading restart axis, (R,))."""
    gamma = jnp.asarray(gamma, jnp.float64)
    inbox = carry.inbox
    inbox = {**inbox, "gamma": jnp.broadcast_to(gamma[..., None], jnp.shape(inbox["gamma"]))}
    return carry._replace(server=carry.server._replace(gamma=gamma), inbox=inbox)


def host_start(cfg: Config, keys, shards: Shard, server_key, gamma):
    """The in-process run's round-0 ``federated.State`` of every restart, with a leading restart axis, in NumPy:
    the values ``protocol_kernel``'s ``init`` followed by ``_seed_server`` and ``set_rate`` give in the loop's
    program (``federated.run_protocol``'s ``host_start``), so that program holds no start.

    Restart r starts from the key words ``keys[r]``: ``k_agents, k_server = split(keys[r])``; agent i draws its
    labels z ~ U{0..K-1} with ``randint(fold_in(fold_in(k_agents, 0), i), (P,), 0, K)``, bit for bit
    (``common.host_uniform_labels``), where its ``z0`` gives none; its upload is the per-cluster sums
    D_i^(k) = sum_{z_ij = k} G_ij / s^2, c_i^(k), N_i^(k) and m_i = 0; the round-0 ``aggregate`` takes the sum over
    agents as is (rate 1), keeps psi uniform and broadcasts D = I/delta^2 + sum_i D_i, c, N, log psi, t = 0 and
    the learning rate ``gamma``; the server's key is ``server_key`` (None: ``k_server``). The floating sums equal
    the program's up to the order of summation.

    None (the program then starts the runs itself, as it did before) where the keys are not JAX's default
    threefry (``host_draws.threefry_native``: no bit-exact replay of ``randint``) or with ``dp_noise_scale > 0``:
    the noisy start draws normal noise (erf_inv, replayed only up to its last bits) and projects the round-0 sums
    onto the PSD cone (``eigh``), not worth a host copy for a variant the demo does not run."""
    if cfg.dp_noise_scale > 0 or not hd.threefry_native():
        return None
    K, F = cfg.K, cfg.F
    Gs, gs, mask, z0 = (np.asarray(a) for a in (shards.Gs, shards.gs, shards.mask, shards.z0))
    J, P = mask.shape
    R = keys.shape[0]
    halves = hd.threefry_split(keys)                                        # (R, 2, 2): k_agents, k_server
    k_agents = halves[:, 0]
    round0 = hd.threefry_split(k_agents, 1)[:, 0]                            # fold_in(k_agents, 0)
    a, b = host_keys.threefry2x32(round0[:, None, 0], round0[:, None, 1], np.zeros(J, np.uint32),
                                  np.arange(J, dtype=np.uint32))             # fold_in(., i): (R, J)
    drawn = host_uniform_labels(np.stack([a, b], -1), P, K)                  # (R, J, P)
    z = np.where(z0 >= 0, z0, drawn).astype(np.int32)
    onehot = (z[..., None] == np.arange(K)).astype(np.float64)               # (R, J, P, K)
    D = np.einsum("rjpk,jpab->rjkab", onehot, Gs)                           # padding: zero statistics
    c = np.einsum("rjpk,jpa->rjka", onehot, gs)
    n = np.einsum("rjpk,jp->rjk", onehot, mask.astype(np.float64))
    zero_f, zero_i = np.zeros((R, J)), np.zeros((R, J), np.int32)
    msg = {"D": D, "c": c, "n": n, "m": np.zeros((R, J, K))}
    states = AgentState(z, D, c, n, zero_i, zero_i, zero_f, np.full((R, J), cfg.dp_noise_scale))
    S = {k: v.sum(1) for k, v in msg.items()}
    log_psi = np.full((R, K), -np.log(K))
    rate = np.full(R, gamma, np.float64)
    if server_key is None:
        skey = host_keys.wrap(halves[:, 1])
    else:
        skey = host_keys.wrap(np.broadcast_to(host_keys.words(server_key), (R, 2)))
    server = ServerState(S["D"], S["c"], S["n"], S["m"], log_psi, np.zeros(R, np.int32), rate, skey)
    bcast = {"D": np.eye(F) / cfg.delta**2 + S["D"], "c": S["c"], "n": S["n"], "log_psi": log_psi,
             "t": np.zeros(R, np.int32), "gamma": rate}
    inbox = {k: np.broadcast_to(v[:, None], (R, J, *v.shape[1:])) for k, v in bcast.items()}
    carry = Carry(states, msg, inbox, server, np.ones((R, J), bool),
                  np.zeros(R, jax.dtypes.canonicalize_dtype(jnp.int_)))
    return FedState(carry, host_keys.wrap(k_agents))


@programs.cached(maxsize=32)
def kernel(cfg: Config, participation: float = 1.0, dropout: float = 0.0):
    """The FedHLCR kernel (``federated.protocol_kernel``), its protocol and audit log, once per static configuration
    (``cfg.gamma`` None where the run sets the rate with ``set_rate``). The log records every message shape when
    the round is traced; the shapes depend only on (K, F)."""
    proto, log = audited(make_protocol(cfg))
    return protocol_kernel(proto, participation_fn(participation, dropout), "log_joint", _seed_server), proto, log


OPTIONS_FEDGIBBS: dict[str, Option] = {
    "max_iter": Option(20, "positive_int", "rounds", tiny=3),
    "gamma": Option(1.0, "unit_interval", "server learning rate: the EMA weight of a round's summed uploads"),
    "leave_own_out": Option(True, "bool", "agents remove their own contribution from the broadcast (notes G4); "
                            "False: the paper's Algorithm 3"),
    "prior": Option("exact", "string", "label prior: exact (notes P1) or the paper's eq. (2)", choices=PRIORS),
    "dp_noise_scale": Option(0.0, "nonnegative", "sd of Gaussian noise on the uploaded sums (0: off)"),
    "z_init": Option(None, "any", "initial label per pair (default: uniform random)"),
    **OPTIONS,
}


def run_federated(agents, hyper: dict, key: jax.Array, *, max_iter: int = 20, gamma: float = 1.0,
                  participation: float = 1.0, dropout: float = 0.0, leave_own_out: bool = True,
                  prior: str = "exact", dp_noise_scale: float = 0.0, runner: str = "inprocess",
                  on_node_failure: str = "continue", chunk: int = 50, z_init=None, progress=None,
                  callback=None, ray_init: dict | None = None, server_key: jax.Array | None = None,
                  test=None, num_restarts: int = 1, restart_keys=None):
    """Run FedHLCR on per-agent datasets ``agents = [{X, y, entity}, ...]``. Every input is checked before any
    round. The agents get ``k_agents = split(key)[0]`` (agent i's key in round t is
    ``fold_in(fold_in(k_agents, t), i)``); ``server_key`` (default ``split(key)[1]``) seeds the server's psi
    draws; ``num_restarts > 1`` runs restarts from ``split(key, num_restarts)`` (or from ``restart_keys``, one
    key per restart) and keeps the highest final log joint. Returns ``(RunResult, index, audit)``: ``index``
    (J, P) maps agent slots to global pairs, ``audit`` the records of everything that crossed the transport
    (``uplink``, ``downlink``, ``monitoring``) and ``objective_per_restart``.
    ``test``: optional per-agent held-out events (``split_by_agent`` of a test split); the history then has
    ``mse``, the held-out mean squared error of every agent's latest labels under the cluster means it was
    sent (each agent reports only its sum of squared errors and its count)."""
    given = {"gamma": gamma, "participation": participation, "dropout": dropout, "dp_noise_scale": dp_noise_scale,
             "prior": prior, "runner": runner, "on_node_failure": on_node_failure, "leave_own_out": leave_own_out,
             "num_restarts": num_restarts}
    for name, value in given.items():
        OPTIONS_FEDGIBBS[name].check(name, value)
    check_dropout(given)
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
    if runner == "ray":
        from inference.distributed.ray_runner import run_ray

        results = []
        if restart_keys is None:
            restart_keys = jax.random.split(key, num_restarts) if num_restarts > 1 else key[None]
        for k in restart_keys:   # actors: one run at a time
            k_agents, k_server = jax.random.split(k)
            proto, log = audited(make_protocol(cfg, k_server if server_key is None else server_key))
            res = run_ray(proto, shards, k_agents, max_rounds=max_iter, on_node_failure=on_node_failure,
                          participation=participation_fn(float(participation), float(dropout)), callback=callback,
                          progress=progress, ray_init=ray_init)
            results.append((float(res.history["log_joint"][-1]), res, log))
        finals = np.array([r[0] for r in results])
        _, res, log = results[int(np.argmax(finals))]
    else:
        kern, proto, log = kernel(cfg._replace(gamma=None), float(participation), float(dropout))
        res, finals = run_protocol(kern, proto, shards, key, max_iter=max_iter, num_restarts=num_restarts, chunk=chunk,
                                   progress=progress, server_key=server_key, seed_server=_seed_server,
                                   restart_keys=restart_keys, settings=np.float64(gamma), configure=set_rate,
                                   host_start=lambda keys, sh, sk, g: host_start(cfg, keys, sh, sk, g))
    audit = audit_of(log, res)
    audit["objective_per_restart"] = [float(v) for v in finals]
    return res, index, audit


def parameter_draws(seed, D_data, c, z, pair_agent, log_psi, prior, n_agents: int, num_samples: int):
    """``num_samples`` draws of (w, theta) from their conditionals given the final labels and the server's
    statistics (those of ``common.draw_conditionals``): w_k ~ N(D_k^-1 c_k, D_k^-1) with D_k = I / delta^2 + the
    data's D_k, theta_i ~ Dir(beta psi + N_i) floored at the smallest normal float (as the samplers'). In NumPy from
    ``np.random.default_rng(seed)`` (``inference.host_draws``: a one-shot job, not worth compiling).
    Returns w (S, K, F), theta (S, n_agents, K)."""
    rng = np.random.default_rng(seed)
    delta, beta = prior
    D_data, c, log_psi = (np.asarray(jax.device_get(a), float) for a in (D_data, c, log_psi))
    K, F = c.shape
    L = np.linalg.cholesky(np.eye(F) / delta ** 2 + D_data)                      # D_k = L_k L_k^T
    mean = np.linalg.solve(np.swapaxes(L, -1, -2), np.linalg.solve(L, c[..., None]))[..., 0]
    eps = rng.standard_normal((num_samples, K, F))
    w = mean + np.linalg.solve(np.swapaxes(L, -1, -2)[None], eps[..., None])[..., 0]   # Cov L^-T L^-1 = D^-1
    n_agent = np.zeros((n_agents, K))
    np.add.at(n_agent, (np.asarray(pair_agent), np.asarray(z)), 1.0)
    conc = beta * np.exp(log_psi) + n_agent
    theta = np.exp(hd.log_dirichlet_variates(rng, conc, (num_samples, *conc.shape), floor=TINY_LOG))
    return w, theta


@register_method("fedgibbs", kind="point", models=("hlcr",), check=check_dropout, options=OPTIONS_FEDGIBBS)
def run_fedgibbs(ctx: FitContext) -> Draws:
    """FedHLCR (paper Algorithm 3, corrected): agents re-sample their own labels against broadcast cluster
    statistics and upload per-cluster sums; the server sums and smooths them (learning rate ``gamma``).

    Agents are the data's agent ids. ``num_restarts`` independent runs (vectorised); the one with the highest
    final collapsed log joint is kept (``attrs['objective_per_restart']``). Draws (``num_samples``): the final
    labels z and psi from the server, with w_k ~ N(D_k^-1 c_k, D_k^-1) from the server's statistics (mean:
    Theorem 2's m_k) and theta_i ~ Dir(beta psi + N_i): conditional on the final labels, so they understate the
    label uncertainty."""
    o = ctx.options
    agents = split_by_agent(ctx.data, o["num_agents"])
    h = resolve_hyper(ctx.hyper)
    K = int(h["K"])
    # restart r runs from fold_in(key, r) with one server key for all (the keys of the earlier per-restart
    # loop, so the labels for a seed are unchanged) (split(key, R)[r] = fold_in(key, r); one restart: the key
    # fold_in(key, 0) itself; made on the host); the (w, theta) draws come from default_rng((seed, 2))
    R = o["num_restarts"]
    res, index, audit = run_federated(
        agents, h, ctx.key if R > 1 else host_keys.fold_in(ctx.key, 0), server_key=host_keys.fold_in(ctx.key, 10**6),
        max_iter=o["max_iter"], gamma=o["gamma"], participation=o["participation"],
        dropout=o["dropout"], leave_own_out=o["leave_own_out"], prior=o["prior"], dp_noise_scale=o["dp_noise_scale"],
        runner=o["runner"], on_node_failure=o["on_node_failure"], chunk=o["chunk"], z_init=o["z_init"],
        progress=o["progress"], num_restarts=o["num_restarts"])
    z = global_labels(res, index)
    sv = res.server_state
    ps = pair_structure(ctx.data["agent"], ctx.data["entity"])
    S = o["num_samples"]
    w, theta = parameter_draws((ctx.seed, 2), sv.D, sv.c, z, ps["pair_agent"], sv.log_psi,
                               (float(h["delta"]), float(h["beta"])), int(ps["n_agents"]), S)
    hist = res.history
    traces = {"log_joint": hist["log_joint"], "n_changed": hist["n_changed"], "n_active": hist["n_active"],
              "bytes_uploaded": hist["bytes_sent"].sum(1)}
    post = {"z": np.broadcast_to(z, (1, S, len(z))), "w": np.asarray(w)[None],
            "psi": np.broadcast_to(np.exp(np.asarray(sv.log_psi)), (1, S, K)), "theta": np.asarray(theta)[None]}
    attrs = {"num_agents": len(agents), "objective_per_restart": audit["objective_per_restart"],
             "protocol_audit": json.dumps({k: audit[k] for k in ("uplink", "downlink", "monitoring",
                                                                 "message_nbytes")}),
             "bytes_uploaded_total": int(sum(audit["bytes_uploaded_per_round"])),
             "gamma": float(o["gamma"]), "participation": float(o["participation"]), "dropout": float(o["dropout"]),
             "leave_own_out": int(o["leave_own_out"]), "dp_noise_scale": float(o["dp_noise_scale"])}
    return Draws(posterior=post, traces=traces, attrs=attrs, objective=float(hist["log_joint"][-1]),
                 converged=False, n_iter=res.rounds)


__all__ = ["AgentState", "Config", "ServerState", "host_start", "kernel", "local_sweep", "make_protocol",
           "message_spec", "run_federated", "set_rate", "table_counts"]
