"""The in-process runner: nodes stacked on a leading axis, ``local_step`` vmapped, one jit-compiled round.

``run_inprocess(protocol, shards, key, max_rounds=...)`` runs synchronous rounds (package docstring) in
compiled chunks of ``chunk`` rounds (a ``lax.scan`` whose steps are skipped with ``lax.cond`` once the
stopping rule fired or ``max_rounds`` is reached, so one compilation serves every chunk), with a
progress bar between chunks. Every round records the protocol's summary, the bytes every node sent
(its message size if it was active, else 0) and the active mask.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from inference.distributed.protocol import Protocol, RunResult, node_key, tree_nbytes
from inference.progress import progress_enabled


class Carry(NamedTuple):
    states: Any
    messages: Any
    inbox: Any
    server: Any
    alive: jax.Array      # (J,) bool
    summary: Any          # summary of the last completed round (or of the initial state)
    done: jax.Array       # bool: the stopping rule fired
    t: jax.Array          # int: rounds completed


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


def initial_carry(protocol: Protocol, shards, key: jax.Array, alive=None) -> Carry:
    """Round 0: every node's ``init``, the server's state and the first inboxes."""
    J = jax.tree.leaves(shards)[0].shape[0]
    alive = jnp.ones(J, bool) if alive is None else jnp.asarray(alive, bool)
    states, messages = jax.vmap(protocol.init)(shards, node_keys(key, 0, J))
    server = protocol.init_server(messages, alive) if protocol.init_server is not None else None
    server, inbox = protocol.aggregate(server, messages, alive)
    summary = _summarize(protocol, states, shards, messages, server, alive)
    return Carry(states, messages, inbox, server, alive, summary, jnp.asarray(False), jnp.asarray(0))


def make_round(protocol: Protocol, participation=None):
    """``round(carry, shards, key) -> (carry, row)``: one synchronous round (not jitted; the runner jits it).

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
        done = protocol.converged(summary, carry.summary, t) if protocol.converged is not None else False
        new = Carry(states, messages, inbox, server, carry.alive, summary, jnp.asarray(done), t)
        return new, (summary, active)

    return one_round


def run_inprocess(protocol: Protocol, shards: Any, key: jax.Array, *, max_rounds: int, participation=None,
                  chunk: int = 50, progress: bool | None = None, carry: Carry | None = None) -> RunResult:
    """Run ``protocol`` on stacked ``shards`` (pytree with leading node axis J) for at most ``max_rounds``
    rounds or until ``protocol.converged`` fires. ``carry`` resumes from a previous carry."""
    J = jax.tree.leaves(shards)[0].shape[0]
    one_shard = jax.tree.map(lambda a: a[0], shards)
    msg_shape = jax.eval_shape(protocol.init, one_shard, jax.random.key(0))[1]
    nbytes = tree_nbytes(msg_shape)
    one_round = make_round(protocol, participation)

    def step(c: Carry, shards, key, max_rounds):
        stop = c.done | (c.t >= max_rounds)

        def frozen(c):
            return c, (c.summary, jnp.zeros(J, bool))

        return jax.lax.cond(stop, frozen, lambda c: one_round(c, shards, key), c)

    chunk = max(1, min(chunk, max_rounds))
    run_chunk = jax.jit(lambda c, shards, key, mr: jax.lax.scan(lambda cc, _: step(cc, shards, key, mr), c, None,
                                                                length=chunk))
    c = carry if carry is not None else jax.jit(lambda s, k: initial_carry(protocol, s, k))(shards, key)
    start = int(c.t)
    rows = []
    bar = tqdm(total=max_rounds - start, desc=protocol.name, disable=not progress_enabled(progress), leave=False)
    while True:
        before = int(c.t)
        c, out = run_chunk(c, shards, key, max_rounds)
        rows.append(out)
        bar.update(int(c.t) - before)
        if bool(c.done) or int(c.t) >= max_rounds:
            break
    bar.close()
    n = int(c.t) - start
    summaries, active = jax.tree.map(lambda *a: np.concatenate([np.asarray(x) for x in a], 0)[:n], *rows)
    history = {k: np.asarray(v) for k, v in dict(summaries).items()}
    history["active"] = np.asarray(active)
    history["bytes_sent"] = np.asarray(active, dtype=np.int64) * nbytes
    return RunResult(states=c.states, messages=c.messages, server_state=c.server, history=history, rounds=int(c.t),
                     converged=bool(c.done), alive=np.asarray(c.alive), message_nbytes=nbytes)
