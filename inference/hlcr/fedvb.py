"""FedVB: federated VB-EM for HLCR (notes §3.8, E3 [ours]; not in the paper), reusing ``inference.hlcr.vb``'s blocks.

The centralised iteration (``vb.iterate``) split in two. Server (``aggregate``): q(w) from the summed soft
statistics, S_k^-1 = I/delta^2 + sum_i sum_j r_ijk G_ij/s^2, m_k = S_k sum_i sum_j r_ijk g_ij/s^2; psi by the same
monotone ascent as ``vb._update_psi`` on sum_i E[log theta_i]; broadcast (m, S, log psi). Agent (``local_step``):
a_i = beta psi + sum_j r_ij (its previous responsibilities), then r_ij from (m, S, a_i) (``vb._update_z``); upload
the soft sums sum_j r_ijk G_ij/s^2 (K, F, F), sum_j r_ijk g_ij/s^2 (K, F), sum_j r_ijk (K,) and E[log theta_i]
(K,). With every agent reporting, round t leaves the agents with exactly the centralised iterate t (notes E3).
Under partial participation the server sums every agent's latest upload (stale for the absent ones).

The bound (``Info.objective``, the ``vb.elbo`` of the agents' (r, a), the server's q(w) from their latest uploads
and its psi) is assembled by the server from cluster-indexed sums: the expected log likelihood
sum_k [sum_j r_ijk const_ij + c_k^T m_k - 1/2 tr(D_k E[w_k w_k^T])] from the uploaded soft sums, plus each agent's
monitoring report (sum_j r_ijk const_ij (K,), the entropy of its q(z) and a_i (K,)). Rounds and restarts run
through ``inference.loop`` (``inference.hlcr.federated``); the restart with the highest final bound is kept.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from inference import host_keys, programs
from inference._methods import Draws, FitContext, Option, register_method
from inference.distributed.audit import audited
from inference.distributed.protocol import Protocol
from inference.hlcr.common import Config, PairData, make_config
from inference.hlcr.federated import (
    OPTIONS,
    Shard,
    audit_of,
    check_agents,
    check_dropout,
    make_shards,
    participation_fn,
    protocol_kernel,
    run_protocol,
    split_by_agent,
)
from inference.hlcr.vb import (
    State,
    _elogtheta,
    _expected_loglik,
    _update_psi_from,
    draw,
    entropy_z,
    flat_dirichlet,
    q_dataset,
    theta_terms,
    w_psi_terms,
)
from zoo.hlcr import SPEC, resolve_hyper


class AgentState(NamedTuple):
    r: jax.Array      # (P, K) responsibilities q(z = k) of the agent's pairs (0 on padding)
    a: jax.Array      # (K,) Dirichlet parameters of q(theta_i)


def make_protocol(hyper: Config, F: int) -> Protocol:
    """Federated VB-EM as a ``local_step``/``aggregate`` protocol (module docstring)."""
    K = hyper.K
    prior_prec = np.eye(F) / hyper.delta**2   # NumPy: built once, a constant of the compiled round

    def upload(r, a, shard, elog=None):
        return {"D": jnp.einsum("pk,pij->kij", r, shard.Gs), "c": r.T @ shard.gs, "n": r.sum(0),
                "elog": _elogtheta(a) if elog is None else elog}

    def init(shard: Shard, key):
        P = shard.mask.shape[0]
        r = flat_dirichlet(key, (P, K)) * shard.mask[:, None]
        a = hyper.beta / K + r.sum(0)                                  # psi uniform at the start
        return AgentState(r, a), upload(r, a, shard)

    def local_step(st: AgentState, shard: Shard, inbox, key):
        a = hyper.beta * jnp.exp(inbox["log_psi"]) + st.r.sum(0)
        pdat = PairData(shard.Gs, shard.gs, shard.const, jnp.zeros(shard.mask.shape[0], jnp.int32))
        elog = _elogtheta(a)
        logits = _expected_loglik(inbox["m"], inbox["S"], pdat) + elog[None, :]
        r = jax.nn.softmax(logits, axis=-1) * shard.mask[:, None]
        return AgentState(r, a), upload(r, a, shard, elog)

    def init_server(messages, active):
        return {"log_psi": jnp.full(K, -jnp.log(K)), "m": jnp.zeros((K, F)), "S": jnp.zeros((K, F, F))}

    def aggregate(server, messages, active):
        S = jnp.linalg.inv(prior_prec + messages["D"].sum(0))
        S = 0.5 * (S + jnp.swapaxes(S, -1, -2))
        m = jnp.einsum("kij,kj->ki", S, messages["c"].sum(0))
        log_psi = _update_psi_from(server["log_psi"], messages["elog"].sum(0), hyper)
        J = active.shape[0]
        bcast = {"m": m, "S": S, "log_psi": log_psi}
        return dict(bcast), jax.tree.map(lambda x: jnp.broadcast_to(x, (J, *x.shape)), bcast)

    def report(st: AgentState, shard: Shard):
        return {"rconst": st.r.T @ shard.const, "entropy": entropy_z(st.r), "a": st.a}

    def summarize(reports, messages, server, active):
        m, S = server["m"], server["S"]
        second = S + m[:, :, None] * m[:, None, :]
        D, c, n, elog = messages["D"].sum(0), messages["c"].sum(0), messages["n"], messages["elog"]
        t_z = (jnp.sum(reports["rconst"]) + jnp.sum(c * m) - 0.5 * jnp.einsum("kij,kij->", D, second)
               + jnp.sum(n * elog) + jnp.sum(reports["entropy"]))
        bound = t_z + theta_terms(reports["a"], elog, server["log_psi"], hyper.beta) \
            + w_psi_terms(m, S, server["log_psi"], hyper)
        return {"elbo": bound, "n_active": jnp.sum(active), "soft_counts": n.sum(0)}

    return Protocol(init=init, local_step=local_step, aggregate=aggregate, init_server=init_server, report=report,
                    summarize=summarize, name="fedhlcr vb")


@programs.cached(maxsize=32)
def kernel(hyper: Config, F: int, participation: float = 1.0, dropout: float = 0.0):
    """The federated VB-EM kernel (``federated.protocol_kernel``), its protocol and audit log, once per
    configuration."""
    proto, log = audited(make_protocol(hyper, F))
    return protocol_kernel(proto, participation_fn(participation, dropout), "elbo"), proto, log


def run_federated_vb(agents, hyper: dict, key: jax.Array, *, max_iter: int = 100, participation: float = 1.0,
                     dropout: float = 0.0, runner: str = "inprocess", on_node_failure: str = "continue",
                     chunk: int = 50, progress=None, callback=None, num_restarts: int = 1):
    """Run federated VB-EM on per-agent datasets. Returns ``(RunResult, index, audit)`` as
    ``fedgibbs.run_federated``; restarts keep the highest final bound."""
    given = {"participation": participation, "dropout": dropout, "runner": runner,
             "on_node_failure": on_node_failure, "num_restarts": num_restarts}
    for name, value in given.items():
        OPTIONS[name].check(name, value)
    check_dropout(given)
    h = resolve_hyper({**SPEC.default_hyper, **hyper})
    F = check_agents(agents)
    shards, index = make_shards(agents, float(h["sigma"]))
    vb_hyper = make_config(h, len(agents))
    if runner == "ray":
        from inference.distributed.ray_runner import run_ray

        results = []
        for k in host_keys.parts(key, num_restarts) if num_restarts > 1 else [key]:   # actors: one run at a time
            proto, log = audited(make_protocol(vb_hyper, F))
            res = run_ray(proto, shards, k, max_rounds=max_iter, on_node_failure=on_node_failure,
                          participation=participation_fn(float(participation), float(dropout)), callback=callback,
                          progress=progress)
            results.append((float(res.history["elbo"][-1]), res, log))
        finals = np.array([r[0] for r in results])
        _, res, log = results[int(np.argmax(finals))]
    else:
        kern, proto, log = kernel(vb_hyper, F, float(participation), float(dropout))
        res, finals = run_protocol(kern, proto, shards, key, max_iter=max_iter, num_restarts=num_restarts, chunk=chunk,
                                   progress=progress)
    audit = audit_of(log, res)
    audit["objective_per_restart"] = [float(v) for v in finals]
    return res, index, audit


@register_method("fedvb", kind="variational", models=("hlcr",), check=check_dropout, options={
    "max_iter": Option(200, "positive_int", "rounds", tiny=3),
    **{k: OPTIONS[k] for k in ("participation", "dropout", "runner", "on_node_failure", "chunk", "num_agents")},
    "num_samples": Option(1000, "positive_int", "draws from q", tiny=20),
    "num_restarts": OPTIONS["num_restarts"],
})
def run_fedvb(ctx: FitContext) -> Draws:
    """Federated VB-EM for HLCR (notes §3.8/E3): agents send soft per-cluster statistics and E[log theta_i];
    with full participation every round equals the centralised ``vbem`` iteration. ``num_restarts`` independent
    federated runs from random soft labels (vectorised); the one with the highest final bound is kept, as
    ``vbem`` does. Draws from q as ``vbem`` (w ~ q(w), theta ~ q(theta), z ~ Cat(r), psi point); the fitted q is
    in group ``vbem``, the bound of the kept restart in attribute ``objective``."""
    o = ctx.options
    agents = split_by_agent(ctx.data, o["num_agents"])
    K = int(ctx.hyper["K"])
    k_run = host_keys.fold_in(ctx.key, 0)   # split(key)[0]
    res, index, audit = run_federated_vb(agents, ctx.hyper, k_run, max_iter=o["max_iter"],
                                         participation=o["participation"], dropout=o["dropout"], runner=o["runner"],
                                         on_node_failure=o["on_node_failure"], chunk=o["chunk"],
                                         progress=o["progress"], num_restarts=o["num_restarts"])
    valid = index >= 0
    r = np.zeros((int(valid.sum()), K))
    r[index[valid]] = np.asarray(res.states.r)[valid]
    sv = res.server_state
    state = State(r, np.asarray(sv["m"]), np.asarray(sv["S"]), np.asarray(res.states.a),   # host: no eager op
                  np.asarray(sv["log_psi"]))
    n = o["num_samples"]
    w, theta, z, log_q = draw((ctx.seed, 2), state, n)
    psi = np.broadcast_to(np.exp(np.asarray(state.log_psi)), (n, K))
    add = lambda x: np.asarray(x)[None]  # noqa: E731
    attrs = {"num_agents": len(agents), "objective_per_restart": audit["objective_per_restart"],
             "protocol_audit": json.dumps({k: audit[k] for k in ("uplink", "downlink", "monitoring",
                                                                 "message_nbytes")}),
             "bytes_uploaded_total": int(sum(audit["bytes_uploaded_per_round"]))}
    return Draws(posterior={"w": add(w), "psi": add(psi), "theta": add(theta), "z": add(z)},
                 sample_stats={"log_q": add(log_q)},
                 traces={"elbo": res.history["elbo"], "n_active": res.history["n_active"],
                         "bytes_uploaded": res.history["bytes_sent"].sum(1)},
                 attrs=attrs, groups={"vbem": q_dataset(state)}, objective=float(res.history["elbo"][-1]),
                 converged=False, n_iter=res.rounds)


__all__ = ["AgentState", "kernel", "make_protocol", "run_federated_vb"]
