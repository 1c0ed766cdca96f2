"""The in-process runner: nodes stacked on a leading axis, ``local_step`` vmapped, one round = one kernel step.

A synchronous round (package docstring) is the ``step`` of a kernel on ``Carry`` (nodes' states and
messages, the inboxes, the server, the round number) and ``run_inprocess`` runs it with the one loop,
``inference.loop.run_until_converged``: compiled chunks of ``chunk`` rounds, a progress bar between chunks,
and one stopping rule (``StopRule``: relative change of the summary's objective ``protocol.objective`` below
``tol`` and, when ``tol_residual`` is given, the summary's ``"residual"`` below it). Every round records the
protocol's summary, the bytes every node sent (its message size if it was active, else 0) and the active mask.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from inference import programs
from inference.base import Kernel
from inference.distributed.protocol import Protocol, RunResult, node_key, tree_nbytes
from inference.loop import StopRule, run_until_converged


class Carry(NamedTuple):
    """The kernel state of a distributed run: everything that lives between rounds."""

    states: Any
    messages: Any
    inbox: Any
    server: Any
    alive: jax.Array      # (J,) bool
    t: jax.Array          # int: rounds completed


class Problem(NamedTuple):
    shards: Any           # stacked node data (J, ...)
    key: jax.Array        # the run's key: node i of round t uses fold_in(fold_in(key, t), i)


class Info(NamedTuple):
    objective: jax.Array  # summary[protocol.objective] (0 when the protocol monitors none)
    residual: jax.Array   # summary["residual"] (0 when absent)
    summary: Any          # the protocol's per-round record
    active: jax.Array     # (J,) bool: nodes that took part in the round


def node_keys(key: jax.Array, t, J: int) -> jax.Array:
    """Keys of nodes 0..J-1 in round ``t``: ``fold_in(fold_in(key, t), i)`` (the same in every runner)."""
    return jax.vmap(lambda i: node_key(key, t, i))(jnp.arange(J))


def _where_active(active, new, old):
    def pick(n, o):
        a = active.reshape(active.shape + (1,) * (n.ndim - 1))
        return jnp.where(a, n, o)
    return jax.tree.map(pick, new, old)


def _summarize(protocol: Protocol, states, shards, messages, server, active):
    if protocol.summarize is None:
        return {}
    reports = jax.vmap(protocol.report)(states, shards) if protocol.report is not None else None
    return protocol.summarize(reports, messages, server, active)


def _info(protocol: Protocol, summary, active) -> Info:
    objective = summary[protocol.objective] if protocol.objective is not None else jnp.asarray(0.0)
    return Info(jnp.asarray(objective, float), jnp.asarray(summary.get("residual", 0.0), float), summary, active)


def initial_carry(protocol: Protocol, shards, key: jax.Array, alive=None) -> Carry:
    """Round 0: every node's ``init``, the server's state and the first inboxes."""
    J = jax.tree.leaves(shards)[0].shape[0]
    alive = jnp.ones(J, bool) if alive is None else jnp.asarray(alive, bool)
    states, messages = jax.vmap(protocol.init)(shards, node_keys(key, 0, J))
    server = protocol.init_server(messages, alive) if protocol.init_server is not None else None
    server, inbox = protocol.aggregate(server, messages, alive)
    return Carry(states, messages, inbox, server, alive, jnp.asarray(0))


def make_round(protocol: Protocol, participation=None):
    """``round(carry, shards, key) -> (carry, Info)``: one synchronous round (not jitted; the loop jits it).

    ``participation(t, round_key, alive) -> active`` (J,) bool, default: every alive node."""

    def one_round(carry: Carry, shards, key):
        J = carry.alive.shape[0]
        t = carry.t + 1
        round_key = jax.random.fold_in(key, t)
        active = carry.alive if participation is None else carry.alive & participation(t, round_key, carry.alive)
        new_states, new_messages = jax.vmap(protocol.local_step)(carry.states, shards, carry.inbox,
                                                                  node_keys(key, t, J))
        states = _where_active(active, new_states, carry.states)
        messages = _where_active(active, new_messages, carry.messages)
        server, inbox = protocol.aggregate(carry.server, messages, active)
        summary = _summarize(protocol, states, shards, messages, server, active)
        return Carry(states, messages, inbox, server, carry.alive, t), _info(protocol, summary, active)

    return one_round


@programs.cached(maxsize=32)
def kernel(protocol: Protocol, participation=None) -> Kernel:
    """``init``/``step`` of the round kernel (built once per protocol, so the loop's compiled chunks are reused).
    The loop's per-step key is not used: the keys come from ``Problem.key`` and the round number, as in
    ``run_ray``."""
    one_round = make_round(protocol, participation)

    def init(key, problem: Problem) -> Carry:
        return initial_carry(protocol, problem.shards, problem.key)

    def step(key, carry: Carry, problem: Problem):
        return one_round(carry, problem.shards, problem.key)

    return Kernel(init, step)


def message_nbytes(protocol: Protocol, shards) -> int:
    """Bytes of one node's message, from ``protocol.init``'s abstract trace on one shard's shapes (no JAX
    operation runs: indexing the shards or making a key would each run a program)."""
    one_shard = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:], jnp.result_type(a)), shards)
    key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype)
    return tree_nbytes(jax.eval_shape(protocol.init, one_shard, key)[1])


def run_inprocess(protocol: Protocol, shards: Any, key: jax.Array, *, max_rounds: int, tol: float = 0.0,
                  tol_residual: float | None = None, participation=None, chunk: int = 50,
                  progress: bool | None = None, carry: Carry | None = None) -> RunResult:
    """Run ``protocol`` on stacked ``shards`` (pytree with leading node axis J) for at most ``max_rounds``
    rounds or until the stopping rule (module docstring) fires. ``carry`` resumes from a previous carry."""
    nbytes = message_nbytes(protocol, shards)
    k = kernel(protocol, participation)
    start = 0 if carry is None else int(carry.t)
    rule = StopRule(max(1, max_rounds - start), tol, "relative", tol_residual)
    run = run_until_converged(k.init, k.step, Problem(shards, key), key, rule, chunk=chunk, progress=progress,
                              desc=protocol.name,
                              init_state=None if carry is None else jax.tree.map(lambda a: jnp.asarray(a)[None], carry))
    c = run.state
    history = {k: np.asarray(v) for k, v in dict(run.info.summary).items()}
    history["active"] = np.asarray(run.info.active)
    history["bytes_sent"] = np.asarray(run.info.active, dtype=np.int64) * nbytes
    return RunResult(states=c.states, messages=c.messages, server_state=c.server, history=history, rounds=int(c.t),
                     converged=run.converged, alive=np.asarray(c.alive), message_nbytes=nbytes)
