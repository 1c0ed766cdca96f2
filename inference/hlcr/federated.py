"""The federated pieces both FedHLCR algorithms share (``fedgibbs``, ``fedvb``): the agents' private shards,
the server's participation rule, the method options, and the protocol run as a kernel of ``inference.loop``.

A protocol (``inference.distributed.Protocol``: ``local_step`` per agent, ``aggregate`` at the server) becomes
a kernel with ``protocol_kernel``: the ``State`` is the in-process runner's carry (agents' states, their last
messages, the inboxes, the server state) plus the agents' key, and one ``step`` is one synchronous round
(``inference.distributed.make_round``). Agent i's key in round t is ``fold_in(fold_in(k_agents, t), i)``
(``k_agents, k_server = split(key)`` when the server draws random numbers, else
``k_agents = key``), the scheme of the Ray runner too, so the in-process and Ray runs give the same iterates:
the step key the loop passes is not used. ``Info.objective`` is the protocol's summary of the round (the collapsed
log joint for fedgibbs, the bound for fedvb), computed by the server from cluster-indexed
messages and per-agent monitoring scalars only. ``run_protocol`` runs ``max_iter`` rounds with
``inference.loop.run_until_converged``, ``num_restarts`` restarts vectorised (the highest final objective is
kept); with ``runner="ray"`` the rounds run on Ray actors (``inference.distributed.run_ray``) and restarts one
after another (actors are processes, they cannot be vectorised).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from inference import host_keys, programs
from inference._methods import Option
from inference.base import Kernel
from inference.distributed.inprocess import Carry, initial_carry, make_round
from inference.distributed.protocol import Protocol, RunResult, tree_nbytes
from inference.loop import StopRule, run_until_converged
from zoo.hlcr import LOG_2PI, pair_statistics, pair_structure

RUNNERS = ("inprocess", "ray")

OPTIONS: dict[str, Option] = {
    "participation": Option(1.0, "unit_interval", "fraction of the agents the server picks per round"),
    "dropout": Option(0.0, "probability", "probability that a picked agent's upload is lost (below 1)"),
    "runner": Option("inprocess", "string", "agents vectorised in one process, or one Ray actor per agent",
                     choices=RUNNERS),
    "on_node_failure": Option("continue", "string", "Ray: a dead agent actor is dropped, or stops the run",
                              choices=("continue", "raise")),
    "chunk": Option(50, "positive_int", "rounds per compiled chunk (progress is shown between chunks)"),
    "num_agents": Option(None, "positive_int|None", "number of agents (ids 0..num_agents-1 must all hold data); "
                         "default: the agent ids in the data"),
    "num_samples": Option(100, "positive_int", "draws stored from the final state", tiny=10),
    "num_restarts": Option(1, "positive_int", "independent federated runs, vectorised; the highest final "
                           "objective is kept", tiny=1),
}


def check_dropout(o: dict) -> None:
    if o["dropout"] >= 1:
        raise ValueError(f"dropout: expected a probability in [0, 1), got {o['dropout']!r}")


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
    # P: programs.bucket of the largest agent's pairs, so data sets of similar size share the compiled rounds (a
    # padded slot is masked out like those of the smaller agents)
    J, P, F = len(agents), programs.bucket(max(len(s[3]) for s in stats)), np.shape(agents[0]["X"])[1]
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
    return Shard(Gs, gs, const, mask, z0, tG, tg, tq, tn), index   # host arrays: the programs take them as they are


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


def global_labels(res, index) -> np.ndarray:
    """Every agent's final labels in the global pair order (the simulation's view; in a real deployment the
    labels never leave the agents)."""
    z = np.asarray(res.states.z)
    E = int((index >= 0).sum())
    out = np.full(E, -1, np.int64)
    valid = index >= 0
    out[index[valid]] = z[valid]
    return out


# --------------------------------------------------------------------------------------------------
# A protocol as a kernel of inference.loop
# --------------------------------------------------------------------------------------------------

class State(NamedTuple):
    carry: Carry      # the runner's carry: agents' states, last messages, inboxes, server state, round count
    key: jax.Array    # the agents' key (round t, agent i: fold_in(fold_in(key, t), i))


class Info(NamedTuple):
    objective: jax.Array  # the protocol's summary[objective] after the round
    summary: Any          # the protocol's per-round summary
    active: jax.Array     # (J,) agents whose upload arrived


def protocol_kernel(protocol: Protocol, participation, objective: str, seed_server=None) -> Kernel:
    """``init(key, shards)``, ``step(key, state, shards)`` running ``protocol`` round by round (module
    docstring). ``seed_server(server, k_server)`` puts the server's key into its state (fedgibbs's psi draws).
    Callers build it once per static configuration (``inference.programs.cached``), so the loop compiles it once."""
    one_round = make_round(protocol, participation)

    def init(key, shards) -> State:
        if seed_server is None:   # a server without randomness: the agents get the key itself
            return State(initial_carry(protocol, shards, key), key)
        k_agents, k_server = jax.random.split(key)
        carry = initial_carry(protocol, shards, k_agents)
        return State(carry._replace(server=seed_server(carry.server, k_server)), k_agents)

    def step(key, state: State, shards):
        carry, info = one_round(state.carry, shards, state.key)
        return State(carry, state.key), Info(info.summary[objective], info.summary, info.active)

    return Kernel(init, step)


def message_nbytes(protocol: Protocol, shards) -> int:
    one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:], jnp.result_type(a)), shards)
    key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype)   # abstract: nothing runs
    return tree_nbytes(jax.eval_shape(protocol.init, one, key)[1])


@programs.cached(maxsize=32)
def _init_program(init):
    """Every restart's ``init``, compiled once per kernel (kernels are cached per configuration), not per fit."""
    return jax.jit(jax.vmap(init, in_axes=(0, None)))


@programs.cached(maxsize=32)
def _with_server_key(init, step, seed_server=None, configure=None):
    """(init, step) of the loop on the problem ``(shards, server_key, settings)``: ``init`` then, with
    ``seed_server``, the server's key put in its state, and with ``configure(carry, settings)``, the run's
    runtime settings (e.g. fedgibbs's learning rate, in the server's state and its first broadcast): both
    arguments of the program, not constants."""

    def start(key, problem):
        shards, server_key, settings = problem
        state = init(key, shards)
        carry = state.carry
        if seed_server is not None:
            carry = carry._replace(server=seed_server(carry.server, server_key))
        if configure is not None:
            carry = configure(carry, settings)
        return state._replace(carry=carry)

    def one(key, state, problem):
        return step(key, state, problem[0])

    return start, one


def start_keys(key, num_restarts: int) -> np.ndarray:
    """The words (R, 2) of every restart's start key as the loop makes them (``key`` itself for one restart,
    ``split(key, R)`` for more), on the host (``inference.host_keys``): no program runs."""
    words = host_keys.words(key)
    return words[None] if num_restarts == 1 else host_keys.words(host_keys.split(key, num_restarts))


def run_protocol(kernel: Kernel, protocol: Protocol, shards, key, *, max_iter: int, num_restarts: int = 1,
                 chunk: int = 50, progress=None, server_key=None, seed_server=None, restart_keys=None, settings=None,
                 configure=None, host_start=None) -> tuple[RunResult, np.ndarray]:
    """``max_iter`` rounds of ``kernel`` (``protocol_kernel(protocol, ...)``) in process
    (``inference.loop.run_until_converged``; the objective never stops the rounds early). One run
    (``num_restarts=1``) starts from ``kernel.init(key)`` itself; restarts from ``split(key, num_restarts)``,
    or from ``restart_keys`` (one per restart) when given;
    ``server_key`` overrides every run's server key; ``configure(carry, settings)`` puts runtime settings into
    every run's round-0 carry (``settings`` a pytree of arrays: runs that differ only in them share the
    program). Returns the ``RunResult`` of the kept run and every restart's final objective. Without
    ``restart_keys`` the start (every restart's ``init``, the server's key and settings) is part of the loop's
    one program; with them, a program of its own.

    ``host_start(keys, shards, server_key, settings)`` (optional; ``keys`` the words (R, 2) of ``start_keys``):
    that same start, every restart's round-0 ``State`` with a leading restart axis, built on the host (NumPy),
    or None where it cannot be (the program then starts the runs itself). Given and not None, the loop's program
    holds no start: tracing, lowering and compiling the protocol's ``init`` and round-0 ``aggregate`` cost more
    than building their values once on the host."""
    if restart_keys is None:
        init, step = _with_server_key(kernel.init, kernel.step, seed_server if server_key is not None else None,
                                      configure)
        problem = (shards, server_key, settings if configure is not None else None)
        state = None if host_start is None else host_start(start_keys(key, num_restarts), shards, server_key,
                                                            settings)
        run = run_until_converged(init, step, problem, key, StopRule(max_iter),
                                  num_restarts=num_restarts, chunk=chunk, progress=progress,
                                  desc=protocol.name, start_from_key=num_restarts == 1,
                                  init_state=state)
    else:
        num_restarts = int(restart_keys.shape[0])
        state = _init_program(kernel.init)(restart_keys, shards)
        if server_key is not None:
            server = seed_server(state.carry.server, jnp.broadcast_to(server_key, (num_restarts,)))
            state = state._replace(carry=state.carry._replace(server=server))
        if configure is not None:
            every = jax.tree.map(lambda a: np.broadcast_to(a, (num_restarts, *np.shape(a))), settings)
            state = state._replace(carry=configure(state.carry, every))
        run = run_until_converged(kernel.init, kernel.step, shards, key, StopRule(max_iter),
                                  num_restarts=num_restarts, chunk=chunk, progress=progress,
                                  desc=protocol.name, init_state=state)
    nbytes = message_nbytes(protocol, shards)
    history = {k: np.asarray(v) for k, v in dict(run.info.summary).items()}
    history["active"] = np.asarray(run.info.active)
    history["bytes_sent"] = history["active"].astype(np.int64) * nbytes
    c = run.state.carry
    res = RunResult(states=c.states, messages=c.messages, server_state=c.server, history=history,
                    rounds=int(c.t), converged=run.converged, alive=np.asarray(c.alive), message_nbytes=nbytes)
    return res, np.asarray(run.objective_per_restart)


def audit_of(log, res: RunResult) -> dict:
    """The records of what crossed the transport (``inference.distributed.audit``) and the bytes per round."""
    audit = log.as_dict()
    audit["bytes_uploaded_per_round"] = np.asarray(res.history.get("bytes_sent", np.zeros((0, 1)))).sum(1).tolist()
    audit["message_nbytes"] = int(res.message_nbytes)
    return audit
