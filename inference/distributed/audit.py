"""Protocol audit: record what crosses the network, without touching the runners.

``audited(protocol) -> (protocol', log)`` wraps a ``Protocol`` so that every pytree that reaches the
transport is recorded in ``log`` (an ``AuditLog``) by leaf path, per-node shape, dtype and bytes:

* ``uplink``: the messages nodes send (what ``aggregate`` receives, stacked (J, ...); the leading node
  axis is dropped in the record);
* ``downlink``: the inboxes ``aggregate`` hands back (per node);
* ``monitoring``: the ``report`` pytrees (driver-only diagnostics; on the Ray runner they also leave the
  node, so they are audited too).

Recording happens when the wrapped functions are traced (shapes and dtypes are static, and every new
shape or dtype is a new trace), so it works unchanged under ``jit``/``vmap`` in ``run_inprocess`` and in
``run_ray``'s driver. ``message_spec(protocol, shard)`` gives the same records ahead of any run (by
``jax.eval_shape``), e.g. to store in a fit's attributes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from inference.distributed.protocol import Protocol

CHANNELS = ("uplink", "downlink", "monitoring")


def leaf_records(tree: Any, *, drop_leading: bool) -> list[dict]:
    """``[{"path", "shape", "dtype", "nbytes"}]`` for every leaf of ``tree`` (arrays, tracers or
    ``ShapeDtypeStruct``s); ``drop_leading`` removes the stacked node axis."""
    out = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        shape = tuple(int(s) for s in np.shape(leaf))
        if drop_leading:
            shape = shape[1:]
        dtype = np.dtype(leaf.dtype)
        out.append({"path": jax.tree_util.keystr(path), "shape": list(shape), "dtype": dtype.name,
                    "nbytes": int(np.prod(shape, dtype=np.int64)) * dtype.itemsize})
    return out


@dataclasses.dataclass
class AuditLog:
    """Distinct records seen per channel (a record is added once per distinct (path, shape, dtype))."""

    records: dict[str, list[dict]] = dataclasses.field(default_factory=lambda: {c: [] for c in CHANNELS})

    def add(self, channel: str, tree: Any, *, drop_leading: bool = True) -> None:
        seen = self.records[channel]
        for r in leaf_records(tree, drop_leading=drop_leading):
            if r not in seen:
                seen.append(r)

    def shapes(self, channel: str) -> set[tuple[int, ...]]:
        return {tuple(r["shape"]) for r in self.records[channel]}

    def as_dict(self) -> dict[str, list[dict]]:
        return {c: [dict(r) for r in rs] for c, rs in self.records.items()}


def audited(protocol: Protocol, log: AuditLog | None = None) -> tuple[Protocol, AuditLog]:
    """``protocol`` with ``aggregate`` (and ``summarize``, which sees the reports) wrapped to record every
    pytree that crosses the transport into ``log``. Same results as the unwrapped protocol."""
    log = AuditLog() if log is None else log
    aggregate = protocol.aggregate

    def aggregate_spy(server, messages, active):
        log.add("uplink", messages)
        server, inbox = aggregate(server, messages, active)
        log.add("downlink", inbox)
        return server, inbox

    summarize = protocol.summarize
    if summarize is not None:
        def summarize_spy(reports, messages, server, active):
            if reports is not None:
                log.add("monitoring", reports)
            return summarize(reports, messages, server, active)
    else:
        summarize_spy = None
    return dataclasses.replace(protocol, aggregate=aggregate_spy, summarize=summarize_spy), log


def message_spec(protocol: Protocol, shard: Any, key: jax.Array | None = None) -> dict[str, list[dict]]:
    """The uplink (``init`` and ``local_step`` messages), downlink (one inbox) and monitoring records of
    one node, by ``jax.eval_shape`` (nothing runs). ``shard``: one node's shard (no node axis)."""
    key = jax.random.key(0) if key is None else key
    state, msg = jax.eval_shape(protocol.init, shard, key)
    stacked = jax.tree.map(lambda a: jax.ShapeDtypeStruct((1, *a.shape), a.dtype), msg)
    active = jax.ShapeDtypeStruct((1,), bool)
    server = (jax.eval_shape(protocol.init_server, stacked, active) if protocol.init_server is not None else None)
    _, inbox = jax.eval_shape(protocol.aggregate, server, stacked, active)
    inbox1 = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), inbox)
    _, msg2 = jax.eval_shape(protocol.local_step, state, shard, inbox1, key)
    log = AuditLog()
    log.add("uplink", msg, drop_leading=False)
    log.add("uplink", msg2, drop_leading=False)
    log.add("downlink", inbox1, drop_leading=False)
    if protocol.report is not None:
        log.add("monitoring", jax.eval_shape(protocol.report, state, shard), drop_leading=False)
    return log.as_dict()
