"""The network side shared by ``badmm`` and ``dppca`` (consensus ADMM on a graph of nodes): the node of every row,
padded per-node shards, slot helpers for the per-neighbour duals, the consensus diagnostics (residual, max
principal angle between the nodes' W), the runner call with the joint stopping rule (relative change of the
summed objective <= ``tol`` AND max consensus residual < ``tol_consensus``, erratum E27), and the options both
methods declare.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from inference import programs
from inference._methods import Option
from inference.bpca.common import Shard
from inference.distributed import Protocol, run_inprocess, run_ray
from zoo._validation import factorize

RUNNERS = ("inprocess", "ray")

NETWORK_OPTIONS = {
    "graph": Option("ring", "any", "topology: 'ring', 'complete', 'star', 'chain', or a J x J 0/1 adjacency matrix"),
    "eta": Option(10.0, "positive", "ADMM penalty"),
    "max_iter": Option(2000, "positive_int", "maximum number of ADMM rounds", tiny=30),
    "tol": Option(1e-6, "positive", "stop when the relative change of the summed objective is at most tol "
                                    "(and the consensus residual is below tol_consensus)"),
    "tol_consensus": Option(1e-3, "positive|None", "max consensus residual to stop (None: objective only)"),
    "runner": Option("inprocess", "string", "in-process vmap + jit, or one Ray actor per node", choices=RUNNERS),
    "on_node_failure": Option("raise", "string", "Ray runner: fail, or drop a lost node and go on",
                              choices=("raise", "continue")),
    "num_nodes": Option(None, "positive_int|None", "split the rows into J contiguous shards (None: data['node'])"),
    "chunk": Option(50, "positive_int", "rounds per compiled chunk (progress bar granularity)"),
}


def make_shards(Y, node, J: int) -> tuple[Shard, np.ndarray]:
    """Stacked, padded shards (J, n_max, D) and the row index of every slot (J, n_max; -1 = padding). ``n_max`` is
    ``programs.bucket`` of the largest shard, so data sets of similar size share the compiled rounds; a padded slot
    observes nothing (``O = 0``, ``row = 0``): it adds nothing to a node's statistics, ELBO or log-likelihood."""
    Y = np.asarray(Y, float)
    node = np.asarray(node, np.int64)
    idx = [np.nonzero(node == j)[0] for j in range(J)]
    n_max = programs.bucket(max(len(i) for i in idx))
    D = Y.shape[1]
    X, O, row = np.zeros((J, n_max, D)), np.zeros((J, n_max, D)), np.zeros((J, n_max))
    index = np.full((J, n_max), -1, np.int64)
    for j, rows in enumerate(idx):
        obs = ~np.isnan(Y[rows])
        X[j, :len(rows)] = np.where(obs, Y[rows], 0.0)
        O[j, :len(rows)] = obs
        row[j, :len(rows)] = 1.0
        index[j, :len(rows)] = rows
    return Shard(X, O, row), index   # host arrays: the programs take them as they are


def cut_slots(index: np.ndarray, shards: Shard, states, fields: tuple[str, ...]):
    """``(index, shards, states)`` with the slot axis cut from ``programs.bucket`` back to the largest shard's
    rows: the padding ``make_shards`` added for the bucket goes, so per-row results have the sizes the data give.
    ``fields``: the per-row fields of the node states (``vb.mz`` reaches into a nested state)."""
    n = int((index >= 0).sum(1).max())

    def cut(state, path):
        head, _, rest = path.partition(".")
        inner = getattr(state, head)
        return state._replace(**{head: cut(inner, rest) if rest else np.asarray(inner)[:, :n]})

    for field in fields:
        states = cut(states, field)
    return index[:, :n], Shard(*(np.asarray(a)[:, :n] for a in shards)), states


class NodeData(NamedTuple):
    """What node j holds: its rows, and what all nodes agreed on before the run to start from (the same at
    every node; the bpca protocols: the key data of the common initial W, ``common.start_words``, from which every
    node derives that W inside the run's program). The start is data, not a constant of the compiled round, so
    fits with other seeds reuse it."""

    shard: Shard
    start: Any


def with_start(shards: Shard, start: Any) -> NodeData:
    """Stacked ``NodeData``: every node's shard beside its copy of ``start`` (broadcast to the J nodes)."""
    J = shards.X.shape[0]
    return NodeData(shards, jax.tree.map(lambda a: np.broadcast_to(np.asarray(a), (J, *np.shape(a))), start))


def _graph_key(v):
    return ("graph", v.name, v.adjacency.shape, v.adjacency.tobytes()) if hasattr(v, "adjacency") else v


def memoised_protocol(factory):
    """``factory(..., graph, ...)`` built once per value of its static arguments (a graph by its adjacency), in
    the registry of compiled programs (``inference.programs``), so repeated fits get the same ``Protocol`` and
    the loop's compiled rounds."""
    return programs.cached(factory, maxsize=256, argument_key=_graph_key)


def slot_where(mask, new, old):
    """Per-slot select: slot k of ``new`` where ``mask[k]`` (an active neighbour), else of ``old``."""
    return jax.tree.map(lambda n, o: jnp.where(mask.reshape(mask.shape + (1,) * (n.ndim - 1)), n, o), new, old)


def slot_sum(mask, x):
    """Sum over the active slots (leading axis) of ``x``."""
    return jnp.sum(jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, 0.0), axis=0)


def agreement(graph):
    """``stats(P, W, active) -> (residual, max_angle)``: the consensus residual max over active edges of
    max |p_i - p_j| (P: (J, p) the flattened messages) and the max principal angle (degrees) between the nodes'
    W (J, D, M) over active pairs; both 0 without edges."""
    J = graph.J
    # NumPy constants of the compiled round (as JAX arrays, each ran a program when the protocol was built)
    edges = np.asarray(graph.edges) if len(graph.edges) else np.zeros((0, 2), np.int64)
    pairs = np.stack(np.triu_indices(J, 1), 1) if J > 1 else np.zeros((0, 2), np.int64)

    def stats(P, W, active):
        if not len(graph.edges):
            return jnp.asarray(0.0), jnp.asarray(0.0)
        both = active[edges[:, 0]] & active[edges[:, 1]]
        res = jnp.max(jnp.where(both, jnp.max(jnp.abs(P[edges[:, 0]] - P[edges[:, 1]]), axis=1), 0.0))
        Q = jax.vmap(_orth)(W)
        ang = jax.vmap(lambda a, b: _angle(Q[a], Q[b]))(pairs[:, 0], pairs[:, 1])
        both_p = active[pairs[:, 0]] & active[pairs[:, 1]]
        return res, jnp.max(jnp.where(both_p, ang, 0.0))

    return stats


def _orth(A):
    return jnp.linalg.qr(A)[0]


def _angle(Qa, Qb):
    """Largest principal angle (degrees) between orthonormal bases of equal rank (arcsin form)."""
    resid = Qb - Qa @ (Qa.T @ Qb)
    s = jnp.linalg.norm(resid, 2)
    return jnp.rad2deg(jnp.arcsin(jnp.minimum(1.0, s)))


def node_assignment(data: dict, num_nodes: int | None, method: str) -> tuple[np.ndarray, int]:
    """(node of every row, J) from ``data['node']`` (labels numbered 0..J-1 in sorted order, ``factorize``) or,
    without it, ``num_nodes`` contiguous shards."""
    N = data["Y"].shape[0]
    if data.get("node") is None:
        if num_nodes is None:
            raise ValueError(f"data['node']: method {method!r} needs the node of every row (integers 0..J-1), "
                             f"or the option num_nodes=J to split the rows into J contiguous shards")
        from zoo.bpca import node_split
        return node_split(N, num_nodes), num_nodes
    node, labels = factorize(data["node"])  # node labels (any integers or strings) -> nodes 0..J-1
    J = len(labels)
    if num_nodes is not None and num_nodes != J:
        raise ValueError(f"num_nodes: {num_nodes} disagrees with data['node'], which has J = {J} nodes")
    return node, J


def run_distributed(protocol: Protocol, shards, key, o, participation=None, callback=None):
    """Run on the chosen runner (``o['runner']``) with the joint stopping rule (module docstring)."""
    rule = {"max_rounds": o["max_iter"], "tol": float(o["tol"]), "tol_residual": o["tol_consensus"],
            "participation": participation, "progress": o["progress"]}
    if o["runner"] == "ray":
        return run_ray(protocol, shards, key, on_node_failure=o["on_node_failure"], callback=callback, **rule)
    return run_inprocess(protocol, shards, key, chunk=o["chunk"], **rule)


def to_rows(per_node, index: np.ndarray, fill: np.ndarray) -> np.ndarray:
    """Per-node row values (J, n_max, ...) back in data order: row ``index[j, s]`` gets slot s of node j; rows
    that no node holds keep ``fill`` (N, ...)."""
    out = np.array(fill, dtype=float)
    valid = index >= 0
    out[index[valid]] = np.asarray(per_node)[valid]
    return out


def run_attrs(res, J: int) -> dict:
    """Attributes of a distributed run: nodes, message size, lost nodes (``n_iter``/``converged`` are Draws fields)."""
    return {"num_nodes": J, "message_bytes_per_node": res.message_nbytes,
            "failures": [list(f) for f in res.failures]}
