"""Runners for distributed algorithms: they move messages between nodes and never contain model math.

The interface (shared by D-MFVI/D-PPCA on a graph and the federated HLCR server/agents)
---------------------------------------------------------------------------------------
An algorithm is a ``Protocol`` (``protocol.py``) of pure JAX functions on pytrees:

``init(shard, key) -> (node_state, message)``
    a node's initial state and its first outgoing message.
``local_step(node_state, shard, message_in, key) -> (node_state, message_out)``
    one round at one node: read the inbox, update the local state, emit the outgoing message.
    ``shard`` is the node's private data (never sent anywhere); ``key`` is the node's key of this round.
``aggregate(server_state, messages, active) -> (server_state, inboxes)``
    the network/server side, run once per round on all messages stacked on a leading node axis
    (J, ...) with ``active`` (J,) bool marking the nodes that took part in this round; returns every
    node's next inbox stacked (J, ...). For a decentralised graph it only routes (``graphs.gossip``:
    inbox i = the messages of i's neighbours, padded to the maximum degree, with a mask); for a
    federated star it is the server's update (e.g. a weighted sum of the active agents' statistics,
    broadcast to every agent).
``init_server(messages, active) -> server_state`` (optional; default ``None``)
``report(node_state, shard) -> info`` (optional): small per-node diagnostics (a local ELBO, ...);
    not part of the communication, reported to the driver for monitoring only.
``summarize(reports, messages, server_state, active) -> summary`` (optional): the per-round record
    (a dict of arrays: residuals, objective, ...) that becomes the history.
``objective`` (optional): the name of the summary entry that is the run's objective. The stopping rule is
    not the protocol's: the runners apply ``inference.loop.StopRule`` (relative change of the objective below
    ``tol``, and the summary's ``"residual"`` below ``tol_residual`` when given; no objective: ``max_rounds``).

Round t (1-based): every active node runs ``local_step`` on the inbox of round t-1 (synchronous,
Jacobi schedule); inactive nodes keep their state and message; then ``aggregate`` computes the
inboxes of round t+1. Keys are ``fold_in(fold_in(key, t), node)``, so every runner gives the same
per-node keys.

Runners
-------
``run_inprocess`` (``inprocess.py``): nodes stacked on a leading axis, ``local_step`` ``vmap``-ped and the
whole round (local steps, aggregate, summary) one kernel step, run by ``inference.loop.run_until_converged``
in compiled chunks of rounds. Records the bytes each node sends every round. ``participation(t, key,
alive) -> active`` gives partial participation / dropouts (federated learning).

``run_ray`` (``ray_runner.py``, needs ``pip install 'bayes-zoo[distributed]'``): one Ray actor per node
holding its shard and state; the driver calls ``aggregate`` and routes the inboxes. Same functions,
same keys, so the same iterates as ``run_inprocess`` (to rounding). A node whose actor dies makes the
run fail with ``NodeFailureError`` naming it (``on_node_failure="raise"``, the result of the last
completed round attached as ``.result``), or, with ``on_node_failure="continue"``, the node is dropped
(``active`` False from then on) and the run proceeds if the remaining graph stays connected.

Both return a ``RunResult``: final node states and messages (stacked), server state, history (the
summaries, one row per round), rounds run, whether the stopping rule fired, bytes sent per node per
round, which nodes are alive, and the failures met.
"""

from inference.distributed.graphs import Graph, gossip, is_connected, make_graph
from inference.distributed.inprocess import make_round, node_keys, run_inprocess
from inference.distributed.protocol import NodeFailureError, Protocol, RunResult, tree_nbytes
from inference.distributed.ray_runner import ray_available, run_ray

__all__ = ["Graph", "NodeFailureError", "Protocol", "RunResult", "gossip", "is_connected", "make_graph",
           "make_round", "node_keys", "ray_available", "run_inprocess", "run_ray", "tree_nbytes"]
