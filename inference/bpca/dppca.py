"""D-PPCA (method ``dppca``): distributed maximum-likelihood probabilistic PCA by consensus ADMM (Yoon & Pavlovic,
NIPS 2012), the baseline of the D-MFVI paper; paper page ``docs/papers/dmfvi.md`` section 3.7
(missing-data version of ``dppca_m*``: EM with per-row masks).

Node i holds point estimates (W_i, mu_i, tau_i) (tau a precision) under Forero-simplified consensus ADMM with
per-edge duals (Lambda for W, gamma for mu, beta for tau), same schedule and runners as ``badmm``:

* duals: Lambda_ij += (eta/2)(W_i - W_j), gamma_ij, beta_ij likewise (with the round t-1 parameters);
* E-step on the node's rows: Lambda_n = I + tau W_O^T W_O (O = observed columns of row n), E[z_n] =
  tau Lambda_n^-1 W_O^T (x_n - mu)_O, E[z z^T] = Lambda_n^-1 + E[z] E[z]^T (= tau^-1 M^-1 + ..., M = W^T W + I/tau);
* W row d: [tau sum_{n in O^d} E[z_n z_n^T] + 2 eta k I] w_d = tau sum_{n in O^d} (x_dn - mu_d) E[z_n] - 2 Lambda_d
  + eta sum_j (w_{i,d} + w_{j,d});
* mu_d = [tau sum_{n in O^d} (x_dn - w_d^T E z_n) - 2 gamma_d + eta sum_j (mu_{i,d} + mu_{j,d})]
  / (|O^d| tau + 2 eta k);
* tau = positive root of 2 eta k tau^2 + [2 beta - eta sum_j (tau_i + tau_j) + A/2] tau - n_obs/2 = 0 with A the
  expected squared residual over the node's observed entries (n_obs, not N D: erratum E28); when the model's tau is
  fixed (``tau=`` given) it stays fixed.

Messages: D M + D + 1 floats per node (about half of D-MFVI's). The objective (``Info.objective`` of the round
kernel run by ``inference.distributed.run_inprocess`` through ``inference.loop``, summary ``"loglik"``; the
stopping rule: relative change <= ``tol`` and consensus residual < ``tol_consensus``, max over edges of
|W_i - W_j|, |mu_i - mu_j| and |log tau_i - log tau_j|) is the sum over nodes of the
marginal log-likelihood of the observed entries, log N(x_O; mu_O, W_O W_O^T + I/tau), by Woodbury from the
E-step. Returns a point estimate (one draw): the node-average W, mu, tau and every row's E[z].
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from inference import host_keys
from inference._methods import Draws, FitContext, register_method
from inference.bpca import nodes
from inference.bpca.common import (
    LOG_2PI,
    Globals,
    Shard,
    expected_sq_residual,
    globals_from_words,
    positive_root,
    second_moments,
    start_words,
    z_step,
)
from inference.distributed import Protocol, gossip, make_graph


class PPCAState(NamedTuple):
    W: jax.Array        # (D, M)
    mu: jax.Array       # (D,)
    tau: jax.Array      # ()
    duals: Any          # dict W (K, D, M), mu (K, D), tau (K,)
    Ez: jax.Array       # (n, M)
    Sz: jax.Array       # (n, M, M) posterior covariance of z_n
    loglik: jax.Array   # marginal log-likelihood of the shard at the parameters entering the round


def local_em(W, mu, tau, shard: Shard, pen, learn_tau: bool):
    """One penalised EM step at a node (module docstring); ``pen`` = {k, eta, G (dict), anchor (dict)}."""
    D, M = W.shape
    k, eta = pen["k"], pen["eta"]
    g = Globals(W, jnp.zeros_like(W), mu, jnp.zeros_like(mu))
    Ez, Sz, logdet = z_step(g, tau, shard)
    # marginal log-likelihood at the entering parameters (Woodbury): quad = tau |r|^2 - tau r^T W E[z]
    R = (shard.X - mu) * shard.O
    n_o = shard.O.sum(1)
    quad = tau * jnp.sum(R * R, 1) - tau * jnp.sum((R @ W) * Ez, 1)
    loglik = jnp.sum(shard.row * -0.5 * (n_o * LOG_2PI - n_o * jnp.log(tau) + logdet + quad))
    S = second_moments(Ez, Sz, shard)
    b = R.T @ Ez
    A_rows = tau * S + (2.0 * eta * k + 1e-10) * jnp.eye(M)
    W = jnp.linalg.solve(A_rows, (tau * b - 2.0 * pen["G"]["W"] + eta * pen["anchor"]["W"])[..., None])[..., 0]
    n_d = shard.O.sum(0)
    L_mu = tau * jnp.sum(shard.O * (shard.X - Ez @ W.T), 0)
    mu = (L_mu - 2.0 * pen["G"]["mu"] + eta * pen["anchor"]["mu"]) / jnp.maximum(n_d * tau + 2.0 * eta * k, 1e-12)
    if learn_tau:
        A = expected_sq_residual(Globals(W, jnp.zeros_like(W), mu, jnp.zeros_like(mu)), Ez, S, shard)
        n_obs = jnp.sum(shard.O)
        tau = positive_root(2.0 * eta * k, 2.0 * pen["G"]["tau"] - eta * pen["anchor"]["tau"] + 0.5 * A,
                            0.5 * n_obs)
    return W, mu, tau, Ez, Sz, loglik


@nodes.memoised_protocol
def make_protocol(graph, *, M: int, tau0: float, learn_tau: bool, eta: float) -> Protocol:
    """The D-PPCA protocol on ``graph``. Node j holds ``nodes.NodeData(shard, start)`` with ``start`` the key data
    of the common initial W (``nodes.with_start``, ``common.start_words``; every node derives W from it in its
    ``init``). Built once per static configuration."""
    K = graph.max_degree
    J = graph.J
    route = gossip(graph)
    stats = nodes.agreement(graph)

    def msg(st):
        return {"W": st.W, "mu": st.mu, "tau": st.tau}

    def init_fn(node, key):
        n, D = node.shard.X.shape
        W0 = globals_from_words(node.start, D, M).mw
        duals = {"W": jnp.zeros((K, D, M)), "mu": jnp.zeros((K, D)), "tau": jnp.zeros(K)}
        st = PPCAState(W0, jnp.zeros(D), jnp.asarray(tau0, float), duals, jnp.zeros((n, M)),
                       jnp.tile(jnp.eye(M), (n, 1, 1)), jnp.asarray(jnp.nan))
        return st, msg(st)

    def local_step(st, node, inbox, key):
        mask = inbox["mask"]
        k = jnp.sum(mask).astype(float)
        eta_t = inbox["eta"]
        own, nbr = msg(st), inbox["nbr"]
        upd = jax.tree.map(lambda d, o, n: d + 0.5 * eta_t * (o[None] - n), st.duals, own, nbr)
        duals = nodes.slot_where(mask, upd, st.duals)
        G = jax.tree.map(lambda d: nodes.slot_sum(mask, d), duals)
        anchor = jax.tree.map(lambda o, n: k * o + nodes.slot_sum(mask, n), own, nbr)
        pen = {"k": k, "eta": eta_t, "G": G, "anchor": anchor}
        W, mu, tau, Ez, Sz, ll = local_em(st.W, st.mu, st.tau, node.shard, pen, learn_tau)
        new = PPCAState(W, mu, tau, duals, Ez, Sz, ll)
        return new, msg(new)

    def init_server(messages, active):
        return {"eta": jnp.asarray(eta, float)}

    def aggregate(server, messages, active):
        server, inbox = route(server, messages, active)
        inbox["eta"] = jnp.full(active.shape, server["eta"])
        return server, inbox

    def report(st, node):
        return {"loglik": st.loglik}

    def summarize(reports, messages, server, active):
        ll_node = reports["loglik"]
        total = jnp.sum(jnp.where(active, ll_node, 0.0))
        P = jnp.concatenate([messages["W"].reshape(J, -1), messages["mu"],
                             jnp.log(messages["tau"])[:, None]], 1)   # tau relatively (scale-free)
        res, max_angle = stats(P, messages["W"], active)
        return {"loglik": total, "loglik_node": ll_node, "residual": res, "max_angle": max_angle,
                "eta": server["eta"]}

    return Protocol(init=init_fn, local_step=local_step, aggregate=aggregate, init_server=init_server,
                    report=report, summarize=summarize, graph=graph, name="bpca dppca", objective="loglik")


def fit_dppca(Y, node, J, hyper, key, o, participation=None, callback=None):
    """D-PPCA on the data; returns (RunResult, shards, index)."""
    M = int(hyper["M"])
    graph = make_graph(o["graph"], J)
    shards, index = nodes.make_shards(Y, node, J)
    learn_tau = hyper.get("tau") is None
    proto = make_protocol(graph, M=M, tau0=1.0 if learn_tau else float(hyper["tau"]), learn_tau=learn_tau,
                          eta=float(o["eta"]))
    res = nodes.run_distributed(proto, nodes.with_start(shards, start_words(key)), host_keys.fold_in(key, 1), o,
                                participation, callback)
    index, shards, states = nodes.cut_slots(index, shards, res.states, ("Ez", "Sz"))
    return dataclasses.replace(res, states=states), shards, index


@register_method("dppca", kind="point", models=("bpca",), options=nodes.NETWORK_OPTIONS)
def run_dppca(ctx: FitContext) -> Draws:
    """D-PPCA (Yoon & Pavlovic 2012): distributed ML-PPCA by consensus ADMM with missing-data EM; point estimate."""
    o = ctx.options
    Y = ctx.data["Y"]
    N = Y.shape[0]
    node, J = nodes.node_assignment(ctx.data, o["num_nodes"], "dppca")
    make_graph(o["graph"], J)
    res, _, index = fit_dppca(Y, node, J, ctx.hyper, ctx.key, o)
    alive = np.asarray(res.alive)
    W = np.asarray(res.messages["W"])[alive].mean(0)
    mu = np.asarray(res.messages["mu"])[alive].mean(0)
    tau = np.asarray(res.messages["tau"])[alive].mean(0)
    z = nodes.to_rows(res.states.Ez, index, np.zeros((N, W.shape[1])))
    post = {"W": W[None, None], "mu": mu[None, None], "z": z[None, None]}
    if ctx.hyper.get("tau") is None:
        post["tau"] = np.asarray(tau)[None, None]
    h = res.history
    traces = {k: h[k] for k in ("loglik", "loglik_node", "residual", "max_angle") if k in h}
    traces["bytes_sent"] = h["bytes_sent"]
    per_node = xr.Dataset({"W": (("node", "feature", "component"), np.asarray(res.messages["W"])),
                        "mu": (("node", "feature"), np.asarray(res.messages["mu"])),
                        "tau": (("node",), np.asarray(res.messages["tau"])),
                        "alive": (("node",), alive.astype(np.int8))})
    attrs = nodes.run_attrs(res, J)
    if len(h.get("residual", [])):
        attrs["consensus_residual"] = float(h["residual"][-1])
    return Draws(posterior=post, traces=traces, dims={"loglik_node": ["iteration", "node"],
                                                      "bytes_sent": ["iteration", "node"]},
                 groups={"nodes": per_node}, attrs=attrs, objective=float(h["loglik"][-1]) if res.rounds else None,
                 converged=res.converged, n_iter=res.rounds)
