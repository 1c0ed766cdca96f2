"""Communication graphs (ring, complete, star, chain, or any adjacency matrix) and the gossip aggregate.

A ``Graph`` holds the symmetric 0/1 adjacency of J nodes and, for the runners, a padded neighbour table:
``neighbours`` (J, K) with K = max degree (padding slots point at the node itself) and ``neighbour_mask``
(J, K). ``gossip(graph)`` is the aggregate of a decentralised algorithm: it only routes, giving node i
the messages of its active neighbours (stacked in its slots) and a mask.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

TOPOLOGIES = ("ring", "complete", "star", "chain")


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    adjacency: np.ndarray        # (J, J) bool, symmetric, zero diagonal
    name: str = "custom"

    @property
    def J(self) -> int:
        return self.adjacency.shape[0]

    @property
    def degree(self) -> np.ndarray:
        return self.adjacency.sum(1).astype(np.int64)

    @property
    def edges(self) -> np.ndarray:
        """(E, 2) undirected edges i < j."""
        i, j = np.nonzero(np.triu(self.adjacency, 1))
        return np.stack([i, j], 1).astype(np.int64)

    @property
    def max_degree(self) -> int:
        return max(1, int(self.degree.max(initial=0)))

    @property
    def neighbours(self) -> np.ndarray:
        """(J, K) neighbour ids in increasing order; padding slots hold the node's own id."""
        K = self.max_degree
        out = np.tile(np.arange(self.J)[:, None], (1, K))
        for i in range(self.J):
            nb = np.nonzero(self.adjacency[i])[0]
            out[i, :len(nb)] = nb
        return out

    @property
    def neighbour_mask(self) -> np.ndarray:
        K = self.max_degree
        return np.arange(K)[None, :] < self.degree[:, None]

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, J={self.J}, edges={len(self.edges)})"


def _from_edges(J: int, edges, name: str) -> Graph:
    A = np.zeros((J, J), bool)
    for i, j in edges:
        if i != j:
            A[i, j] = A[j, i] = True
    return Graph(A, name)


def ring(J: int) -> Graph:
    return _from_edges(J, [(i, (i + 1) % J) for i in range(J)] if J > 1 else [], "ring")


def complete(J: int) -> Graph:
    return _from_edges(J, [(i, j) for i in range(J) for j in range(i + 1, J)], "complete")


def star(J: int, hub: int = 0) -> Graph:
    return _from_edges(J, [(hub, j) for j in range(J) if j != hub], "star")


def chain(J: int) -> Graph:
    return _from_edges(J, [(i, i + 1) for i in range(J - 1)], "chain")


def is_connected(adjacency, alive=None) -> bool:
    """Whether the nodes in ``alive`` (default all) form a connected graph (breadth-first search)."""
    A = np.asarray(adjacency, bool)
    alive = np.ones(A.shape[0], bool) if alive is None else np.asarray(alive, bool)
    nodes = np.nonzero(alive)[0]
    if len(nodes) <= 1:
        return True
    seen = {int(nodes[0])}
    frontier = [int(nodes[0])]
    while frontier:
        i = frontier.pop()
        for j in np.nonzero(A[i] & alive)[0]:
            if int(j) not in seen:
                seen.add(int(j))
                frontier.append(int(j))
    return len(seen) == len(nodes)


def make_graph(graph, J: int, *, name: str = "graph") -> Graph:
    """A ``Graph`` from a topology name (``ring``, ``complete``, ``star`` (hub 0), ``chain``), a J x J 0/1
    adjacency matrix, or a ``Graph``; ``ValueError`` naming ``name`` unless it is a connected graph on J nodes."""
    if isinstance(graph, Graph):
        g = graph
    elif isinstance(graph, str):
        makers = {"ring": ring, "complete": complete, "star": star, "chain": chain}
        if graph not in makers:
            raise ValueError(f"{name}: expected one of {list(TOPOLOGIES)} or a J x J 0/1 adjacency matrix, "
                             f"got {graph!r}")
        g = makers[graph](J)
    else:
        try:
            A = np.asarray(graph, dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected a topology name or a J x J 0/1 adjacency matrix, "
                             f"got {type(graph).__name__}") from None
        if A.shape != (J, J):
            raise ValueError(f"{name}: the adjacency matrix must be {J} x {J} (one row per node), got shape "
                             f"{A.shape}")
        if not np.all((A == 0) | (A == 1)):
            raise ValueError(f"{name}: the adjacency matrix must hold only 0/1 entries")
        if not np.array_equal(A, A.T):
            raise ValueError(f"{name}: the adjacency matrix must be symmetric (undirected edges)")
        if np.any(np.diag(A) != 0):
            raise ValueError(f"{name}: the adjacency matrix must have a zero diagonal (no self-loops)")
        g = Graph(A.astype(bool), "adjacency")
    if g.J != J:
        raise ValueError(f"{name}: the graph has {g.J} nodes but the data has {J}")
    if not is_connected(g.adjacency):
        raise ValueError(f"{name}: the graph is not connected; consensus needs a connected graph")
    return g


def gossip(graph: Graph):
    """The routing aggregate of a decentralised algorithm on ``graph``.

    ``(server_state, messages (J, ...), active (J,)) -> (server_state, inbox)`` where inbox (stacked over
    nodes) is ``{"nbr": messages of the neighbours (J, K, ...), "mask": (J, K) bool (slot holds an active
    neighbour), "n_active": (J,) number of active nodes}``. No arithmetic on the messages: it only moves them.
    """
    nbr = np.asarray(graph.neighbours)   # NumPy constants of the compiled round (no eager JAX operation)
    nmask = np.asarray(graph.neighbour_mask)

    def aggregate(server_state, messages, active):
        gathered = jax.tree.map(lambda m: m[nbr], messages)
        mask = nmask & active[nbr]
        n_active = jnp.full(active.shape, jnp.sum(active))
        return server_state, {"nbr": gathered, "mask": mask, "n_active": n_active}

    return aggregate
