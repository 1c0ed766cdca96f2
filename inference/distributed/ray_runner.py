"""The Ray runner: one actor per node holding its shard and state; the driver routes messages.

``run_ray(protocol, shards, key, max_rounds=...)`` gives the same iterates as ``run_inprocess`` (same
``local_step``, same per-node keys; the node step runs jitted on one node instead of vmapped, so the two
agree to rounding). Each round the driver sends node i its inbox, gathers the messages of the active
nodes, calls ``aggregate`` (jitted) and the protocol's ``summarize``, and applies the same stopping rule
(``inference.loop.StopRule``) to the summary.

Failures: an actor that dies (``ray.kill``, a crashed process, a lost machine) raises in the driver's
``ray.get``. With ``on_node_failure="raise"`` (default) the survivors roll back to the last completed
round and ``NodeFailureError`` (naming the node and the round) carries that round's ``RunResult``
(``.result``). With ``"continue"`` the node is dropped from the network (``active`` False from then on,
its neighbours stop hearing from it) and the run proceeds, provided the remaining graph is connected
(``protocol.graph``); otherwise ``NodeFailureError``. Dead nodes' entries in the returned states are NaN
(their state died with them; their last message is kept in ``messages``).

Ray is started on first use with ``ray.init(num_cpus=2, include_dashboard=False)`` unless it is already
running (pass ``ray_init`` kwargs to change this); it is left running for the next call (``ray.shutdown()``).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from inference.distributed.graphs import is_connected
from inference.distributed.protocol import NodeFailureError, Protocol, RunResult, node_key, stack_history, tree_nbytes
from inference.loop import StopRule
from inference.progress import progress_enabled

FAILURE_MODES = ("raise", "continue")
_ENV_KEYS = ("XLA_FLAGS", "JAX_PLATFORMS", "BAYES_ZOO_JAX_CACHE", "JAX_ENABLE_X64")


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def _require_ray():
    try:
        import ray
    except ImportError:
        raise ImportError("runner='ray' needs Ray: pip install 'bayes-zoo[distributed]' (ray>=2.60)") from None
    return ray


def _to_numpy(tree):
    return jax.tree.map(np.asarray, tree)


class _NodeActor:
    """One node: its shard, its state (and the previous round's, for rollback), the jitted protocol steps."""

    def __init__(self, protocol: Protocol, shard, node: int, key_data):
        from zoo import _runtime  # noqa: F401  (float64, JAX set-up, before any array is made)

        self.protocol = protocol
        self.node = int(node)
        self.shard = jax.tree.map(jnp.asarray, shard)
        self.key = jax.random.wrap_key_data(jnp.asarray(key_data))
        self._init = jax.jit(protocol.init)
        self._step = jax.jit(protocol.local_step)
        self._report = jax.jit(protocol.report) if protocol.report is not None else None
        self.state = None
        self.prev = None
        self.t = 0

    def _out(self, msg):
        rep = self._report(self.state, self.shard) if self._report is not None else None
        return _to_numpy(msg), _to_numpy(rep)

    def init(self):
        self.state, msg = self._init(self.shard, node_key(self.key, 0, self.node))
        return self._out(msg)

    def step(self, t: int, inbox):
        self.prev, prev_t = self.state, self.t
        self.state, msg = self._step(self.state, self.shard, jax.tree.map(jnp.asarray, inbox),
                                     node_key(self.key, t, self.node))
        self.t = t
        self._prev_t = prev_t
        return self._out(msg)

    def rollback(self, t: int):
        """Back to the state after round ``t`` (only the last round can be undone)."""
        if self.t > t and self.prev is not None:
            self.state, self.t = self.prev, self._prev_t
        return self.t

    def get_state(self):
        return _to_numpy(self.state)

    def pid(self):
        return os.getpid()


def _slice(tree, i):
    return jax.tree.map(lambda a: np.asarray(a)[i], tree)


def _stack(items):
    return jax.tree.map(lambda *a: np.stack([np.asarray(x) for x in a]), *items)


def _nan_like(tree):
    return jax.tree.map(lambda a: np.full_like(a, np.nan) if np.issubdtype(np.asarray(a).dtype, np.floating)
                        else np.zeros_like(a), tree)


class RayRun:
    """Handle given to ``callback(t, run)`` after every round: ``run.actors`` (list of actor handles),
    ``run.alive`` (J,) bool; tests use it to kill an actor (``ray.kill(run.actors[i])``)."""

    def __init__(self, actors, alive):
        self.actors = actors
        self.alive = alive


def run_ray(protocol: Protocol, shards: Any, key: jax.Array, *, max_rounds: int, tol: float = 0.0,
            tol_residual: float | None = None, on_node_failure: str = "raise", participation=None, callback=None,
            progress: bool | None = None, ray_init: dict | None = None) -> RunResult:
    """Run ``protocol`` with one Ray actor per node (see the module docstring); ``tol``, ``tol_residual``: the
    stopping rule, as for ``run_inprocess``. ``shards``: a pytree with a
    leading node axis J (as for ``run_inprocess``; a NamedTuple of stacked arrays counts as one pytree) or a
    Python list of J per-node pytrees."""
    if on_node_failure not in FAILURE_MODES:
        raise ValueError(f"on_node_failure: expected one of {list(FAILURE_MODES)}, got {on_node_failure!r}")
    ray = _require_ray()
    from ray.exceptions import RayActorError, RayTaskError

    if isinstance(shards, list):    # not tuple: a NamedTuple of stacked arrays is a stacked pytree
        shard_list = [_to_numpy(s) for s in shards]
    else:
        J0 = jax.tree.leaves(shards)[0].shape[0]
        shard_list = [_slice(shards, i) for i in range(J0)]
    J = len(shard_list)
    if not ray.is_initialized():
        env = {k: os.environ[k] for k in _ENV_KEYS if k in os.environ}
        env["JAX_ENABLE_X64"] = "1"
        kwargs = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False,
                  "runtime_env": {"env_vars": env}}
        kwargs.update(ray_init or {})
        ray.init(**kwargs)
    Actor = ray.remote(num_cpus=0, max_restarts=0)(_NodeActor)
    key_data = np.asarray(jax.random.key_data(key))
    actors = [Actor.remote(protocol, shard_list[i], i, key_data) for i in range(J)]
    aggregate = jax.jit(protocol.aggregate)
    summarize = jax.jit(protocol.summarize) if protocol.summarize is not None else None
    rule = StopRule(max_rounds, tol, "relative", tol_residual)
    alive = np.ones(J, bool)
    failures: list[tuple[int, int, str]] = []

    def gather(refs: dict[int, Any]):
        ok, failed = {}, {}
        for i, ref in refs.items():
            try:
                ok[i] = ray.get(ref)
            except (RayActorError, RayTaskError) as exc:   # a dead actor, or a node step that raised
                lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                # the first line names the task, the last one holds the remote exception's message
                failed[i] = f"{type(exc).__name__}: {lines[-1].strip() if lines else ''}"
        return ok, failed

    init_out, failed = gather({i: a.init.remote() for i, a in enumerate(actors)})
    if failed:
        i, why = next(iter(failed.items()))
        raise NodeFailureError(f"node {i} failed during initialisation ({why})", node=i, round=0)
    messages = _stack([init_out[i][0] for i in range(J)])
    reports = _stack([init_out[i][1] for i in range(J)]) if protocol.report is not None else None
    nbytes = tree_nbytes(_slice(messages, 0))
    server = protocol.init_server(messages, jnp.asarray(alive)) if protocol.init_server is not None else None
    server, inbox = aggregate(server, messages, jnp.asarray(alive))
    objective = -np.inf
    rows: list[dict] = []
    done = False
    t = 0

    def result(rounds: int, conv: bool) -> RunResult:
        live = [i for i in range(J) if alive[i]]
        states_live = dict(zip(live, ray.get([actors[i].get_state.remote() for i in live]), strict=True))
        template = states_live[live[0]]
        states = _stack([states_live.get(i, _nan_like(template)) if alive[i] else _nan_like(template)
                         for i in range(J)])
        history = stack_history(rows)
        return RunResult(states=states, messages=messages, server_state=server, history=history, rounds=rounds,
                         converged=conv, alive=alive.copy(), failures=list(failures), message_nbytes=nbytes)

    bar = tqdm(total=max_rounds, desc=f"{protocol.name} (ray)", disable=not progress_enabled(progress), leave=False)
    while t < max_rounds and not done:
        t += 1
        active = alive.copy()
        if participation is not None:
            active &= np.asarray(participation(jnp.asarray(t), jax.random.fold_in(key, t), jnp.asarray(alive)))
        refs = {i: actors[i].step.remote(t, _slice(inbox, i)) for i in range(J) if active[i]}
        out, failed = gather(refs)
        if failed:
            for i, why in failed.items():
                failures.append((t, i, why))
            if on_node_failure == "raise":
                ray.get([actors[i].rollback.remote(t - 1) for i in out])
                i, why = next(iter(failed.items()))
                alive[list(failed)] = False
                bar.close()
                raise NodeFailureError(
                    f"node {i} failed in round {t} ({why}); the result of round {t - 1} is attached as .result "
                    f"(on_node_failure='continue' proceeds without the node)", node=i, round=t,
                    result=result(t - 1, False))
            alive[list(failed)] = False
            active[list(failed)] = False
            if protocol.graph is not None and not is_connected(protocol.graph.adjacency, alive):
                ray.get([actors[i].rollback.remote(t - 1) for i in out])
                i = next(iter(failed))
                bar.close()
                raise NodeFailureError(
                    f"node {i} failed in round {t} and the remaining nodes {np.nonzero(alive)[0].tolist()} no "
                    f"longer form a connected graph; the result of round {t - 1} is attached as .result",
                    node=i, round=t, result=result(t - 1, False))
        msg_list = [out[i][0] if i in out else _slice(messages, i) for i in range(J)]
        messages = _stack(msg_list)
        if protocol.report is not None:
            reports = _stack([out[i][1] if i in out else _slice(reports, i) for i in range(J)])
        server, inbox = aggregate(server, messages, jnp.asarray(active))
        summary = summarize(reports, messages, server, jnp.asarray(active)) if summarize is not None else {}
        if protocol.objective is not None:
            previous, objective = objective, float(summary[protocol.objective])
            done = bool(rule.reached(previous, objective, summary.get("residual")))
        row = {k: np.asarray(v) for k, v in dict(summary).items()}
        row["active"] = active.copy()
        row["bytes_sent"] = active.astype(np.int64) * nbytes
        rows.append(row)
        bar.update(1)
        if callback is not None:
            callback(t, RayRun(actors, alive))
    bar.close()
    res = result(t, done)
    for a in actors:
        ray.kill(a)
    return res
