"""The protocol a distributed algorithm implements, and what a runner returns (see the package docstring)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Protocol:
    """A distributed algorithm as pure functions on pytrees (package docstring: signatures and schedule).

    ``graph`` (optional, an ``inference.distributed.Graph``) lets a runner check that the network stays
    connected after a node failure; without it (a server topology) a failure never disconnects.
    ``name`` is used in progress bars and error messages. ``objective`` names the entry of the summary that
    is the run's objective (the stopping rule's; None: the protocol monitors none, and
    runs stop after ``max_rounds``); a summary entry ``"residual"`` is the consensus residual of a joint rule.
    """

    init: Callable[[Any, jax.Array], tuple[Any, Any]]
    local_step: Callable[[Any, Any, Any, jax.Array], tuple[Any, Any]]
    aggregate: Callable[[Any, Any, jax.Array], tuple[Any, Any]]
    init_server: Callable[[Any, jax.Array], Any] | None = None
    report: Callable[[Any, Any], Any] | None = None
    summarize: Callable[[Any, Any, Any, jax.Array], Any] | None = None
    graph: Any = None
    objective: str | None = None
    name: str = "protocol"


@dataclasses.dataclass
class RunResult:
    """What a runner returns.

    states:      final node states, stacked on a leading node axis (J, ...);
    messages:    the last message of every node (J, ...);
    server_state: the aggregate's state;
    history:     per-round summaries, dict of arrays with a leading ``round`` axis (length ``rounds``),
                 plus ``bytes_sent`` (rounds, J) and ``active`` (rounds, J);
    rounds:      number of completed rounds;  converged: whether the stopping rule fired;
    alive:       (J,) bool, nodes still in the network at the end;
    failures:    list of ``(round, node, reason)`` for nodes lost during the run;
    message_nbytes: bytes of one node's message (payload of one send).
    """

    states: Any
    messages: Any
    server_state: Any
    history: dict[str, np.ndarray]
    rounds: int
    converged: bool
    alive: np.ndarray
    failures: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)
    message_nbytes: int = 0


class NodeFailureError(RuntimeError):
    """A node was lost during a distributed run. ``node``, ``round`` and ``result`` (a ``RunResult`` of the
    last completed round, so nothing already computed is lost) are attributes."""

    def __init__(self, message: str, *, node: int, round: int, result: RunResult | None = None):
        super().__init__(message)
        self.node = node
        self.round = round
        self.result = result


def tree_nbytes(tree: Any) -> int:
    """Bytes of a pytree of arrays (or of ``jax.ShapeDtypeStruct``s)."""
    return int(sum(np.prod(leaf.shape, dtype=np.int64) * np.dtype(leaf.dtype).itemsize
                   for leaf in jax.tree.leaves(tree)))


def node_key(key: jax.Array, t, i) -> jax.Array:
    """The key of node ``i`` in round ``t`` (round 0 = init): ``fold_in(fold_in(key, t), i)``."""
    return jax.random.fold_in(jax.random.fold_in(key, t), i)


def stack_history(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    if not rows:
        return {}
    return {k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]}
