"""Distributed mean-field VI for Bayesian PCA (D-MFVI, ``badmm``): consensus (Bregman) ADMM on the variational
parameters of the global factors over a graph of nodes; paper page ``docs/papers/dmfvi.md`` (N = notes
section) N3.4-3.8, paper arXiv 1507.00824 (the family, the sweep and the ELBO: ``inference.bpca.common`` and
``inference.bpca.sweep``).

Distributed D-MFVI (``badmm``). Node i holds a shard (rows ``node == i``), its own q(z_in), and a local copy
(m^w, v^w, m^mu, v^mu)_i of the global factors; consensus is imposed on these variational parameters.
Every node weights the global prior and entropy by ``c``: c = 1/J (``prior_weight="split"``, default), so
that the sum of the node objectives at consensus IS the centralised ELBO (erratum E3: the paper's
``"replicate"``, c = 1, counts the prior J times and its consensus is the 1/J-tempered posterior,
lambda^mu = 1/(N tau / J + theta)). Two penalties:

* ``penalty="quadratic"`` (default; N3.5, what the authors' code runs, E24): Forero-Cano-Giannakis consensus
  ADMM on p = (m^w, v^w, m^mu, v^mu) with per-edge duals g_ij (the slot of neighbour j at node i):
  g_ij += (eta/2)(p_i - p_j), then the node step adds 2 sum_j g_ij p + eta sum_j |p - (p_i^old + p_j^old)/2|^2
  to its negative local objective: means m = [L - 2 G + eta sum_j (p_i^old + p_j^old)] / (P + c pi + 2 eta k),
  variances = the positive root of 2 eta k v^2 + [(P + c pi)/2 + 2 G - eta sum_j (v_i^old + v_j^old)] v - c/2 = 0
  (k = active degree; P, L: the data precision and linear term of step 2/3; pi the prior precision).
* ``penalty="kl"`` (N3.4, the paper's appendix B with errata E16-E23 fixed): per directed edge (i, j)
  auxiliaries (rho_ij, phi_ij) with four duals, KL(edge || node) in the node step, KL(node || edge) in the
  edge step (2-3 alternations, started from the previous phi), dual updates of E22/E7, roots chosen per
  E23 (the smaller positive root when the leading coefficient is negative; when no real root exists, the
  subproblem is unbounded and the vertex is taken, see ``positive_root``). Edge variables are computed
  identically at both ends (never sent). It reaches consensus but not the centralised optimum (LR20, ring J = 5,
  eta = 10, 800 rounds: residual 4.5e-4, ELBO gap -4.7 %, lambda^w 3x too large; N3.4 prototype: 1.6-2 %);
  kept as an option for that comparison.

q(tau) (learned, ``tau_sharing="consensus"``): the node's local optimum is Gamma(lambda_i) with
lambda_i = (a_tau + n_obs_i/(2c), b_tau + A_i/(2c)); the centralised q(tau) is their average when c = 1/J,
so the (shape, rate) pairs are driven to their average by ADMM averaging (unit curvature, penalty 1),
exact at the joint fixed point (+2 floats per message). ``"per-node"`` gives every node its own tau_i
(a different, heteroscedastic model; N3.6). q(alpha) is computed by every node from its own copy of q(W)
and agrees at consensus without communication (N3.6).

Schedule: synchronous (every node reads its neighbours' round t-1 parameters); per round node i first
updates its duals/edges with (p_i^{t-1}, p_j^{t-1}), then runs the sweep above with the penalty, then
broadcasts p_i^t: 2 (D M + D) floats (N3.8). Same seed-derived initial W (orth(randn(D, M))) on every node,
v = 1, m^mu = 0. Stopping rule (E27): relative change of the summed objective < ``tol`` AND max consensus
residual max_edges max |p_i - p_j| < ``tol_consensus`` (p = the message; for q(tau), log E[tau]).
``adaptive_eta``: residual balancing (Boyd et al. 2011, sec. 3.4.1, with
Wohlberg's 2017 relative residuals and factor sqrt(r/s) clipped to [1/10, 10]) computed by the coordinator
from the messages every 10 rounds when the primal and dual residuals differ by more than 10x, eta kept
within [eta/100, 100 eta]; it makes eta a global quantity, so the strict locality of a round no longer holds.

The run: ``make_protocol`` gives the node functions (``init``/``local_step``) and the coordinator's
(``aggregate``/``summarize``) of ``inference.distributed``; one synchronous round is the step of the round kernel
that ``inference.distributed.run_inprocess`` runs with ``inference.loop.run_until_converged`` (``Info.objective``
= the sum of the node objectives, summary ``"elbo"``; ``Info.residual`` = the consensus residual). The draws
come from the consensus q (node average of the globals, every row's q(z_n) from its node); the tree's
``objective`` is the sum of the node objectives, equal to that q's closed-form ELBO (attribute ``elbo_consensus``)
only at exact consensus.

The centralised sweep IS the node sweep with no neighbours (k = 0, zero duals, c = 1), so ``badmm`` with
J = 1 reproduces ``vbem`` iterate for iterate (test 3).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from inference import host_keys
from inference._methods import Draws, FitContext, Option, register_method
from inference.bpca.common import (
    Config,
    Globals,
    Q,
    VBState,
    cfg_from,
    draw,
    elbo_of,
    globals_from_words,
    init_state,
    positive_root,
    q_groups,
    q_of,
    shard_of,
    start_words,
)
from inference.bpca.nodes import (
    NETWORK_OPTIONS,
    NodeData,
    agreement,
    cut_slots,
    make_shards,
    memoised_protocol,
    node_assignment,
    run_attrs,
    run_distributed,
    slot_sum,
    slot_where,
    to_rows,
    with_start,
)
from inference.bpca.sweep import TAU_RHO, sweep
from inference.distributed import Protocol, gossip, make_graph

PENALTIES = ("quadratic", "kl")
PRIOR_WEIGHTS = ("split", "replicate")
TAU_SHARING = ("consensus", "per-node")

class NodeState(NamedTuple):
    vb: VBState
    duals: Any        # quadratic: Globals with a leading slot axis K; kl: edge variables (see _kl_edges)
    tau_duals: jax.Array  # (K, 2) duals of the q(tau) averaging


def message_of(cfg: Config, vb: VBState, dual_norm=None) -> dict:
    """What a node broadcasts: 2 (D M + D) floats (+ 2 for q(tau) under consensus, + 1, the norm of its dual
    term, with ``adaptive_eta``)."""
    msg = {"mw": vb.g.mw, "vw": vb.g.vw, "mmu": vb.g.mmu, "vmu": vb.g.vmu}
    if cfg.learn_tau and cfg.tau_consensus:
        msg["tau"] = vb.tau
    if dual_norm is not None:
        msg["dual"] = dual_norm
    return msg


def _globals(msg) -> Globals:
    return Globals(msg["mw"], msg["vw"], msg["mmu"], msg["vmu"])


def _kl_edges_init(g: Globals, K: int):
    """Edge variables of the K slots, both directions: rho = m, phi = v (endpoint averages of a common init),
    duals 0. Layout: dict name -> (out, in) with out/in each a tuple (rho, phi, gamma1, gamma2, beta1, beta2)."""
    out = {}
    for m, v in (("mw", "vw"), ("mmu", "vmu")):
        rho = jnp.broadcast_to(getattr(g, m), (K,) + getattr(g, m).shape)
        phi = jnp.broadcast_to(getattr(g, v), (K,) + getattr(g, v).shape)
        z = jnp.zeros_like(rho)
        e = (rho, phi, z, z, z, z)
        out[m] = (e, e)
    return out


def edge_update(m_a, v_a, m_b, v_b, e, eta, inner: int):
    """B-ADMM edge step of the directed edge (a, b) (N3.4, E16/E17 fixed) and its dual steps (E22/E7).

    rho = (m_a + m_b)/2 - phi (gamma2 - gamma1)/(2 eta); phi = root of 2(beta2 - beta1) phi^2 + 2 eta phi
    - eta sum_k [(m_k - rho)^2 + v_k] = 0 (E23 root rule); alternated ``inner`` times from the previous phi.
    Duals: gamma1 += eta (m_a - rho), gamma2 += eta (rho - m_b), beta1 += eta (v_a - phi), beta2 += eta (phi - v_b).
    """
    rho, phi, g1, g2, b1, b2 = e
    for _ in range(inner):
        rho = 0.5 * (m_a + m_b) - phi * (g2 - g1) / (2.0 * eta)
        phi = positive_root(2.0 * (b2 - b1), 2.0 * eta, eta * ((m_a - rho) ** 2 + v_a + (m_b - rho) ** 2 + v_b))
    return (rho, phi, g1 + eta * (m_a - rho), g2 + eta * (rho - m_b), b1 + eta * (v_a - phi), b2 + eta * (phi - v_b))


@memoised_protocol
def make_protocol(cfg: Config, graph, *, eta: float, prior_weight: str, adaptive_eta: bool) -> Protocol:
    """The D-MFVI protocol on ``graph`` (module docstring). Node j holds ``NodeData(shard, start)``; ``start``
    is the key data of the common initial global parameters (``nodes.with_start``, ``common.start_words``), from
    which every node derives them in its ``init``. Built once per static configuration."""
    K = graph.max_degree
    route = gossip(graph)
    edges = np.asarray(graph.edges) if len(graph.edges) else np.zeros((0, 2), np.int64)   # NumPy: no eager op
    J = graph.J
    stats = agreement(graph)
    learn_tau_cons = cfg.learn_tau and cfg.tau_consensus

    def weights(n_active):
        c = 1.0 / n_active if prior_weight == "split" else jnp.asarray(1.0)
        return c, (c if cfg.tau_consensus else jnp.asarray(1.0))

    def init_fn(node: NodeData, key):
        g0 = globals_from_words(node.start, cfg.D, cfg.M)
        vb = init_state(cfg, g0, node.shard.X.shape[0])
        if cfg.penalty == "quadratic":
            duals = jax.tree.map(lambda a: jnp.zeros((K,) + a.shape), g0)
        else:
            duals = _kl_edges_init(g0, K)
        st = NodeState(vb, duals, jnp.zeros((K, 2)))
        return st, message_of(cfg, vb, jnp.asarray(0.0) if adaptive_eta else None)

    def local_step(st: NodeState, node: NodeData, inbox, key):
        vb = st.vb
        mask = inbox["mask"]
        k = jnp.sum(mask).astype(float)
        eta_t = inbox["eta"]
        c, c_tau = weights(inbox["n_active"])
        own = vb.g
        nbr = _globals(inbox["nbr"])
        if cfg.penalty == "quadratic":
            # Forero duals: g_ij += (eta/2)(p_i - p_j) on active slots; inactive slots keep theirs and drop out
            upd = jax.tree.map(lambda d, o, n: d + 0.5 * eta_t * (o[None] - n), st.duals, own, nbr)
            duals = slot_where(mask, upd, st.duals)
            G = jax.tree.map(lambda d: slot_sum(mask, d), duals)
            anchor = jax.tree.map(lambda o, n: k * o + slot_sum(mask, n), own, nbr)
            pen = {"k": k, "eta": eta_t, "G": G, "anchor": anchor}
        else:
            new_edges = {}
            g_lin, srho, srho2 = {}, {}, {}
            for m, v in (("mw", "vw"), ("mmu", "vmu")):
                e_out, e_in = st.duals[m]
                mi, vi, mj, vj = getattr(own, m)[None], getattr(own, v)[None], getattr(nbr, m), getattr(nbr, v)
                o2 = edge_update(mi, vi, mj, vj, e_out, eta_t, cfg.kl_inner)       # edge (i, j)
                i2 = edge_update(mj, vj, mi, vi, e_in, eta_t, cfg.kl_inner)        # edge (j, i)
                o2, i2 = slot_where(mask, o2, e_out), slot_where(mask, i2, e_in)
                new_edges[m] = (o2, i2)
                g_lin[m] = slot_sum(mask, o2[2] - i2[3])       # sum_j gamma_ij1 - gamma_ji2
                g_lin[v] = slot_sum(mask, o2[4] - i2[5])       # sum_j beta_ij1 - beta_ji2
                srho[m] = slot_sum(mask, o2[0] + i2[0])
                srho[v] = slot_sum(mask, o2[1] + i2[1])        # sum of phi over C_i
                srho2[m] = slot_sum(mask, o2[0] ** 2 + i2[0] ** 2)
                srho2[v] = jnp.zeros_like(srho[v])
            duals = new_edges
            pen = {"k": k, "eta": eta_t, "g": Globals(**g_lin), "srho": Globals(**srho), "srho2": Globals(**srho2)}
        tau_duals, tau_pen = st.tau_duals, None
        if learn_tau_cons:
            nt = inbox["nbr"]["tau"]
            upd = st.tau_duals + 0.5 * TAU_RHO * (vb.tau[None] - nt)
            tau_duals = jnp.where(mask[:, None], upd, st.tau_duals)
            tau_pen = {"k": k, "G": slot_sum(mask, tau_duals), "anchor": k * vb.tau + slot_sum(mask, nt)}
        dual_norm = None
        if adaptive_eta:
            lin = [2.0 * x for x in pen["G"]] if cfg.penalty == "quadratic" else list(pen["g"])
            dual_norm = jnp.sqrt(sum(jnp.sum(x**2) for x in lin))
        vb = sweep(cfg, vb, node.shard, c, pen, c_tau, tau_pen)
        return NodeState(vb, duals, tau_duals), message_of(cfg, vb, dual_norm)

    def init_server(messages, active):
        return {"eta": jnp.asarray(eta, float), "prev": messages, "t": jnp.asarray(0)}

    def aggregate(server, messages, active):
        server2, inbox = route(server, messages, active)
        eta_t = server["eta"]
        t = server["t"] + 1
        if adaptive_eta:
            eta_t = _balance(eta_t, t, messages, server["prev"], active)
        inbox["eta"] = jnp.full(active.shape, eta_t)
        return {"eta": eta_t, "prev": messages, "t": t}, inbox

    def _flat(messages):
        parts = [messages[k].reshape(J, -1) for k in ("mw", "vw", "mmu", "vmu")]
        return jnp.concatenate(parts, axis=1)

    def _balance(eta_t, t, messages, prev, active):
        if len(graph.edges) == 0:
            return eta_t
        # Boyd et al. sec. 3.4.1 with the Forero edge variables z_ij = (p_i + p_j)/2: primal r = |p_i - z_ij|,
        # dual s = eta |z_ij^t - z_ij^{t-1}| (root mean square over the active edges)
        P, Pp = _flat(messages), _flat(prev)
        both = (active[edges[:, 0]] & active[edges[:, 1]])[:, None]
        n_e = jnp.maximum(1, both.sum())
        z, zp = 0.5 * (P[edges[:, 0]] + P[edges[:, 1]]), 0.5 * (Pp[edges[:, 0]] + Pp[edges[:, 1]])
        # relative residuals (Wohlberg 2017): r / max(|p|, |z|), s / |dual|; the dual norms come in the messages
        r = jnp.sqrt(jnp.sum(jnp.where(both, (P[edges[:, 0]] - z) ** 2, 0.0)) / n_e)
        s = eta_t * jnp.sqrt(jnp.sum(jnp.where(both, (z - zp) ** 2, 0.0)) / n_e)
        scale_p = jnp.maximum(jnp.sqrt(jnp.sum(jnp.where(both, P[edges[:, 0]] ** 2, 0.0)) / n_e),
                              jnp.sqrt(jnp.sum(jnp.where(both, z ** 2, 0.0)) / n_e))
        scale_d = jnp.sqrt(jnp.sum(jnp.where(active, messages["dual"] ** 2, 0.0)) / jnp.maximum(1, active.sum()))
        r = r / jnp.maximum(scale_p, 1e-300)
        s = s / jnp.maximum(scale_d, 1e-300)
        # Wohlberg's adaptive factor: eta *= sqrt(r/s) (within [1/10, 10]) when r and s differ by more than 10x
        ratio = jnp.sqrt(r / jnp.maximum(s, 1e-300))
        factor = jnp.clip(ratio, 0.1, 10.0)
        change = ((r > 10.0 * s) | (s > 10.0 * r)) & (t % 10 == 0)
        new = jnp.where(change, eta_t * factor, eta_t)
        return jnp.clip(new, eta / 100.0, eta * 100.0)

    def report(st: NodeState, node: NodeData):
        return {"elbo": st.vb.elbo}

    def summarize(reports, messages, server, active):
        elbo_node = reports["elbo"]
        total = jnp.sum(jnp.where(active, elbo_node, 0.0))
        P = _flat(messages)
        if learn_tau_cons:
            # log E[tau]: tau's scale is the data's (1e10 at the cube's sigma = 1e-5), so its disagreement
            # is measured relatively
            P = jnp.concatenate([P, jnp.log(messages["tau"][:, 0] / messages["tau"][:, 1])[:, None]], 1)
        res, max_angle = stats(P, messages["mw"], active)
        return {"elbo": total, "elbo_node": elbo_node, "residual": res, "max_angle": max_angle, "eta": server["eta"]}

    return Protocol(init=init_fn, local_step=local_step, aggregate=aggregate, init_server=init_server, report=report,
                    summarize=summarize, graph=graph, name="bpca badmm", objective="elbo")


def fit_badmm(Y, node, J, hyper, key, o, participation=None, callback=None):
    """D-MFVI on the data; returns (cfg, RunResult, shards, index) (used by ``fit`` and the tests)."""
    D = Y.shape[1]
    cfg = cfg_from(hyper, D, penalty=o["penalty"], tau_consensus=o["tau_sharing"] == "consensus",
                   kl_inner=o["kl_inner"])
    graph = make_graph(o["graph"], J)
    shards, index = make_shards(Y, node, J)
    proto = make_protocol(cfg, graph, eta=float(o["eta"]), prior_weight=o["prior_weight"],
                          adaptive_eta=o["adaptive_eta"])
    res = run_distributed(proto, with_start(shards, start_words(key)), host_keys.fold_in(key, 1), o, participation,
                          callback)
    index, shards, states = cut_slots(index, shards, res.states, ("vb.mz", "vb.Sz", "vb.logdet"))
    return cfg, dataclasses.replace(res, states=states), shards, index


def consensus_q(res, cfg: Config, index: np.ndarray, N: int) -> Q:
    """The consensus q: node average (over nodes alive at the end) of the global parameters and of q(tau),
    q(alpha); every row's q(z_n) from the node that holds it."""
    alive = np.asarray(res.alive)
    # host arrays throughout (as JAX operations one at a time, each ran a program of its own)
    g = Globals(*(np.asarray(res.messages[k])[alive].mean(0) for k in ("mw", "vw", "mmu", "vmu")))
    tau = np.asarray(res.states.vb.tau)[alive].mean(0)
    alpha = np.asarray(res.states.vb.alpha)[alive].mean(0)
    M = cfg.M
    mz = to_rows(res.states.vb.mz, index, np.zeros((N, M)))
    Sz = to_rows(res.states.vb.Sz, index, np.tile(np.eye(M), (N, 1, 1)))
    return q_of(cfg, g, tau, alpha, mz, Sz)


def _distributed_draws(ctx: FitContext, cfg, res, index, J):
    o = ctx.options
    q = consensus_q(res, cfg, index, ctx.data["Y"].shape[0])
    post, log_q = draw((ctx.seed, 2), q, o["num_samples"])
    h = res.history
    traces = {k: h[k] for k in ("elbo", "elbo_node", "residual", "max_angle", "eta") if k in h}
    traces["bytes_sent"] = h["bytes_sent"]
    dims = {"elbo_node": ["iteration", "node"], "bytes_sent": ["iteration", "node"]}
    nodes = {"m_W": (("node", "feature", "component"), np.asarray(res.messages["mw"])),
             "v_W": (("node", "feature", "component"), np.asarray(res.messages["vw"])),
             "m_mu": (("node", "feature"), np.asarray(res.messages["mmu"])),
             "v_mu": (("node", "feature"), np.asarray(res.messages["vmu"])),
             "alive": (("node",), np.asarray(res.alive).astype(np.int8))}
    if cfg.learn_tau:
        nodes["tau_shape"] = (("node",), np.asarray(res.states.vb.tau)[:, 0])
        nodes["tau_rate"] = (("node",), np.asarray(res.states.vb.tau)[:, 1])
    attrs = {**run_attrs(res, J), "message_floats_per_node": res.message_nbytes // 8,
             "bytes_total": int(h["bytes_sent"].sum()) if len(h.get("bytes_sent", [])) else 0,
             # the closed-form ELBO (c = 1) of the q the draws come from; the objective sums the node objectives,
             # each at the node's own copy of q, and equals it only at exact consensus
             "elbo_consensus": elbo_of(cfg, q, shard_of(ctx.data["Y"]))}
    if len(h.get("residual", [])):
        attrs.update({"consensus_residual": float(h["residual"][-1]),
                      "max_angle_between_nodes": float(h["max_angle"][-1])})
    return Draws(posterior={k: np.asarray(v)[None] for k, v in post.items()},
                 sample_stats={"log_q": np.asarray(log_q)[None]}, traces=traces, dims=dims,
                 groups={"nodes": xr.Dataset(nodes), "variational": xr.Dataset(q_groups(q))}, attrs=attrs,
                 objective=float(h["elbo"][-1]) if res.rounds else None, converged=res.converged, n_iter=res.rounds)


BADMM_OPTIONS = {
    **NETWORK_OPTIONS,
    "penalty": Option("quadratic", "string", "consensus penalty: quadratic (Forero ADMM, N3.5) or the paper's KL "
                      "(Bregman ADMM, N3.4)", choices=PENALTIES),
    "prior_weight": Option("split", "string", "global prior per node: 1/J ('split', erratum E3) or 1 "
                           "('replicate', paper-literal: a tempered posterior)", choices=PRIOR_WEIGHTS),
    "adaptive_eta": Option(False, "bool", "residual balancing of eta every 10 rounds (makes eta global)"),
    "tau_sharing": Option("consensus", "string", "learned q(tau): one by consensus, or one per node",
                          choices=TAU_SHARING),
    "num_samples": Option(1000, "positive_int", "draws from the consensus q", tiny=20),
    "kl_inner": Option(3, "positive_int", "edge-step alternations of penalty='kl'"),
}
BADMM_DEFAULTS = {k: o.default for k, o in BADMM_OPTIONS.items()} | {"progress": None}


@register_method("badmm", kind="variational", models=("bpca",), options=BADMM_OPTIONS)
def run_badmm(ctx: FitContext) -> Draws:
    """D-MFVI: distributed mean-field VI over a graph of nodes by (Bregman) ADMM consensus on the variational
    parameters (notes 3.4-3.5; prior split 1/J per node, erratum E3)."""
    o = ctx.options
    node, J = node_assignment(ctx.data, o["num_nodes"], "badmm")
    make_graph(o["graph"], J)  # validate before compiling
    cfg, res, _, index = fit_badmm(ctx.data["Y"], node, J, ctx.hyper, ctx.key, o)
    return _distributed_draws(ctx, cfg, res, index, J)
