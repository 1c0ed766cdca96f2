"""Posterior predictive of new HLCR events (paper Theorem 2, §4.4; notes §3.5 and erratum E10), from any tree.

Registered as the ``hlcr`` predictor of ``inference.predict(tree, new_data)``, with ``new_data = {"X",
"agent", "entity"}``. It works from the tree's posterior draws and the training data and hyperparameters
that ``inference.trees.problem_of`` recovers, so a Gibbs, VB-EM, FedHLCR, NUTS or SVI tree predicts the
same way:

* trees with label draws ``z`` (gibbs, gibbs_blocked, vbem, fedgibbs, fedvb): for each kept draw s the cluster
  statistics are rebuilt from the draw's labels and Theorem 2 gives the per-cluster predictive
  N(m_k^T x, sigma^2 + x^T H_k x) with m_k = H_k c_k, H_k = D_k^-1 (w integrated out given z; erratum E10:
  the paper conditions on one Gibbs state and leaves the variance implicit). A known pair uses its label
  z_e^(s); a new pair of a known agent the prior p(k) proportional to N_i^(k) + beta psi_k; a new agent psi
  (cold start);
* trees without labels (nuts, svi: the model sums z out): for each draw of (w, theta, psi) the per-cluster
  predictive is N(w_k^T x, sigma^2); a known pair uses its label posterior p(z_e = k | y_e, w, theta)
  proportional to theta_{i(e)k} N(y_e | X_e w_k, sigma^2 I); a new pair of a known agent theta_i; a new
  agent psi.

The predictive is the equal-weight mixture over draws (and over k). Returns ``mean``, ``sd``, ``lower``,
``upper`` (central ``prob`` interval; mixture quantiles by bisection) and ``known_pair`` (bool per event).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from inference.hlcr.common import cluster_posteriors, pair_data
from inference.prediction import is_integer_label, label_key, register_predictor
from inference.trees import problem_of
from zoo.hlcr import model_inputs, pair_loglik, pair_structure, resolve_hyper


def _flat(post, name, tail):
    return np.asarray(post[name].values).reshape(-1, *tail)


@register_predictor("hlcr")
def predict(tree, new_data: dict, *, prob: float = 0.9, max_draws: int = 200) -> dict:
    """Posterior predictive of the events ``new_data = {"X", "agent", "entity"}`` (module docstring)."""
    for k in ("X", "agent", "entity"):
        if k not in new_data:
            raise ValueError(f"new_data: missing {k!r} (HLCR predicts from X, agent and entity)")
    spec, data, hyper = problem_of(tree)
    hyper = resolve_hyper(hyper)
    inp = model_inputs(data, hyper)
    K, sigma = int(hyper["K"]), float(hyper["sigma"])
    post = tree["posterior"]
    psi = _flat(post, "psi", (K,))
    keep = np.unique(np.linspace(0, len(psi) - 1, min(max_draws, len(psi))).round().astype(int))
    ps = pair_structure(data["agent"], data["entity"])
    X = np.asarray(new_data["X"], float)
    agent_new, pair_new = new_event_codes(ps, data, new_data["agent"], new_data["entity"])
    known, agent_known = pair_new[:, None] >= 0, agent_new[:, None] >= 0
    pair_idx, agent_idx = jnp.maximum(pair_new, 0), jnp.maximum(agent_new, 0)

    if "z" in post:
        pdat = pair_data(inp)

        def per_draw(zs, psi_s):
            m, H = cluster_posteriors(pdat.Gs, pdat.gs, zs, K, hyper["delta"])
            var = sigma**2 + jnp.einsum("nf,kfg,ng->nk", X, H, X)
            n_agent = jax.ops.segment_sum(jax.nn.one_hot(zs, K), pdat.agent, num_segments=ps["n_agents"])
            prior = jnp.where(agent_known, n_agent[agent_idx] + hyper["beta"] * psi_s, psi_s)
            prior = prior / prior.sum(-1, keepdims=True)
            return X @ m.T, var, jnp.where(known, jax.nn.one_hot(zs[pair_idx], K), prior)

        draws = (jnp.asarray(_flat(post, "z", (post["z"].shape[-1],))[keep]), jnp.asarray(psi[keep]))
    else:
        G, g, q, n_ev = (jnp.asarray(inp[k]) for k in ("G", "g", "q", "n_ev"))
        pair_agent = jnp.asarray(inp["pair_agent"])

        def per_draw(w, theta, psi_s):
            log_r = jnp.log(theta[pair_agent]) + pair_loglik(w, G, g, q, n_ev, sigma)     # (E, K)
            resp = jax.nn.softmax(log_r, axis=-1)
            prior = jnp.where(agent_known, theta[agent_idx], psi_s)
            return X @ w.T, jnp.full((X.shape[0], K), sigma**2), jnp.where(known, resp[pair_idx], prior)

        F = X.shape[1]
        draws = (jnp.asarray(_flat(post, "w", (K, F))[keep]),
                 jnp.asarray(_flat(post, "theta", (ps["n_agents"], K))[keep]), jnp.asarray(psi[keep]))
    mu, var, weight = map(np.asarray, jax.jit(jax.vmap(per_draw))(*draws))   # (S, n, K)
    weight = weight / weight.sum((0, 2), keepdims=True)
    mean = np.sum(weight * mu, (0, 2))
    sd = np.sqrt(np.sum(weight * (var + mu**2), (0, 2)) - mean**2)
    lower = _mixture_quantile(weight, mu, np.sqrt(var), (1 - prob) / 2, mean, sd)
    upper = _mixture_quantile(weight, mu, np.sqrt(var), (1 + prob) / 2, mean, sd)
    return {"mean": mean, "sd": sd, "lower": lower, "upper": upper, "known_pair": pair_new >= 0}


def new_event_codes(ps: dict, data: dict, agent, entity) -> tuple[np.ndarray, np.ndarray]:
    """Agent and pair indices of new events in the training data's numbering (``pair_structure``), -1 for a new
    agent or a new pair (cold start). Labels are those the tree was fitted with: store names when it was fitted
    from a DataFrame with text labels, integer ids otherwise. A label of another kind (an integer where the tree
    knows text, a float, text where it knows integers) is a ``ValueError`` naming ``new_data['agent']`` or
    ``new_data['entity']``, never a silent conversion or a silent cold start."""
    agent = np.atleast_1d(np.asarray(agent, dtype=object))
    entity = np.atleast_1d(np.asarray(entity, dtype=object))
    if agent.ndim != 1 or agent.shape != entity.shape:
        raise ValueError(f"new_data['entity']: expected one agent and one entity label per new event, got shapes "
                         f"{agent.shape} and {entity.shape}")
    for field, new in (("agent", agent), ("entity", entity)):
        text = np.asarray(data[field]).dtype.kind in "US"
        of_kind = (lambda v: isinstance(v, str | np.str_)) if text else is_integer_label
        wrong = next((v for v in new if not of_kind(v)), None)
        if wrong is not None:
            raise ValueError(f"new_data[{field!r}]: label {wrong!r} ({type(wrong).__name__}), but the tree was "
                             f"fitted with {'text' if text else 'integer'} labels")
    agents = {label_key(a): i for i, a in enumerate(ps["agent_ids"].tolist())}
    pairs = {(label_key(a), label_key(e)): p for p, (a, e) in enumerate(ps["pair_ids"].tolist())}
    agent_idx = np.array([agents.get(label_key(a), -1) for a in agent], dtype=np.int64)
    pair_idx = np.array([pairs.get((label_key(a), label_key(e)), -1) for a, e in zip(agent, entity, strict=True)],
                        dtype=np.int64)
    return agent_idx, pair_idx


def _mixture_quantile(weight, mu, sd, p, mean, total_sd, iters=80):
    from scipy.special import ndtr

    lo, hi = mean - 12 * total_sd, mean + 12 * total_sd
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        cdf = np.sum(weight * ndtr((mid[None, :, None] - mu) / sd), (0, 2))
        lo, hi = np.where(cdf < p, mid, lo), np.where(cdf < p, hi, mid)
    return 0.5 * (lo + hi)


__all__ = ["predict"]
