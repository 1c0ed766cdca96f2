"""Independent NumPy/SciPy oracles for the HLCR tests (no code under test is used here).

* ``b2_toy``: the notes' §6 B2 enumeration toy (8 pairs in 3 agents, K = 2, F = 2);
* ``exact_coclustering``: the exact posterior co-clustering matrix by enumerating all K^E labelings,
  each weighted by the block-Gaussian evidence p(y | z) = prod_k N(y_k; 0, sigma^2 I + delta^2 X_k X_k^T)
  times p(z) = int prod_i DirMult(N_i | beta psi) Dir(psi | alpha/K) dpsi (K = 2: 1-D Gauss-Legendre
  quadrature after the substitution psi_1 = sin^2 t, which removes the Beta(a, a) endpoint singularity);
* ``exact_label_conditional``: p(z_new = k | other labels) of a new item by the same quadrature (E2);
* ``ari``: adjusted Rand index.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
from scipy.special import gammaln


def b2_toy():
    """Notes §6 B2 (``zoo.hlcr.b2_toy``): 8 pairs in 3 agents, K = 2, F = 2; returns (data, hyper)."""
    from zoo.hlcr import B2_TOY
    from zoo.hlcr import b2_toy as make

    return make(), dict(B2_TOY)


def _log_evidence(X, y, pair, z, K, sigma, delta):
    out = 0.0
    for k in range(K):
        idx = np.isin(pair, np.flatnonzero(z == k))
        if idx.any():
            Xk = X[idx]
            cov = sigma**2 * np.eye(idx.sum()) + delta**2 * Xk @ Xk.T
            _, logdet = np.linalg.slogdet(cov)
            yk = y[idx]
            out += -0.5 * (len(yk) * np.log(2 * np.pi) + logdet + yk @ np.linalg.solve(cov, yk))
    return out


def _log_dirmult(counts, conc):
    """log p(labels | conc) for a sequence with these counts (theta ~ Dir(conc) integrated out), (..., K)."""
    return (gammaln(conc.sum(-1)) - gammaln(conc.sum(-1) + counts.sum(-1))
            + np.sum(gammaln(conc + counts) - gammaln(conc), -1))


@functools.lru_cache(maxsize=8)
def _psi_nodes(alpha, n=400):
    """Gauss-Legendre nodes psi_1 = sin^2 t on t in (0, pi/2) with weights for Beta(alpha/2, alpha/2)."""
    t, wt = np.polynomial.legendre.leggauss(n)
    t = (t + 1) * np.pi / 4
    wt = wt * np.pi / 4
    p = np.sin(t) ** 2
    a = alpha / 2
    # Beta(a, a) density * dp/dt = p^(a-1)(1-p)^(a-1)/B(a, a) * 2 sin t cos t
    logw = ((a - 1) * np.log(p) + (a - 1) * np.log1p(-p) - (2 * gammaln(a) - gammaln(2 * a))
            + np.log(2 * np.sin(t) * np.cos(t)) + np.log(wt))
    return np.stack([p, 1 - p], -1), logw


def log_prior_labels_k2(z, pair_agent, alpha, beta):
    """log p(z) for K = 2 with psi and theta integrated out (quadrature over psi)."""
    psi, logw = _psi_nodes(alpha)
    n_agents = pair_agent.max() + 1
    counts = np.zeros((n_agents, 2))
    np.add.at(counts, (pair_agent, z), 1)
    lp = _log_dirmult(counts[None], beta * psi[:, None, :]).sum(-1)
    return np.logaddexp.reduce(lp + logw)


def exact_coclustering(data, hyper):
    """Exact P(z_e = z_e' | y) over all 2^E labelings (K = 2 only). Returns (E, E) matrix."""
    assert hyper["K"] == 2
    agent, entity = data["agent"], data["entity"]
    keys = np.unique(np.stack([agent, entity], 1), axis=0)
    pair = np.array([np.flatnonzero((keys == (a, e)).all(1))[0] for a, e in zip(agent, entity, strict=True)])
    pair_agent = keys[:, 0]
    E = len(keys)
    logp, configs = [], []
    for z in itertools.product(range(2), repeat=E):
        z = np.array(z)
        logp.append(_log_evidence(data["X"], data["y"], pair, z, 2, hyper["sigma"], hyper["delta"])
                    + log_prior_labels_k2(z, pair_agent, hyper["alpha"], hyper["beta"]))
        configs.append(z)
    logp = np.array(logp)
    p = np.exp(logp - logp.max())
    p /= p.sum()
    Z = np.array(configs)
    same = (Z[:, :, None] == Z[:, None, :]).astype(float)
    return np.einsum("c,cij->ij", p, same)


def exact_label_conditional(agent_counts, new_agent, alpha, beta):
    """Exact p(z_new = k | other labels) (K = 2) for a new item of agent ``new_agent``: ratio of
    quadratures of p(z) (notes erratum E2)."""
    counts = np.asarray(agent_counts, float)
    psi, logw = _psi_nodes(alpha)
    out = []
    for k in range(2):
        c = counts.copy()
        c[new_agent, k] += 1
        out.append(np.logaddexp.reduce(_log_dirmult(c[None], beta * psi[:, None, :]).sum(-1) + logw))
    out = np.array(out)
    return np.exp(out - np.logaddexp.reduce(out))


def ari(a, b):
    """Adjusted Rand index of two labelings."""
    from scipy.special import comb

    a, b = np.asarray(a), np.asarray(b)
    table = np.zeros((a.max() + 1, b.max() + 1))
    np.add.at(table, (a, b), 1)
    s = comb(table, 2).sum()
    sa, sb = comb(table.sum(1), 2).sum(), comb(table.sum(0), 2).sum()
    expected = sa * sb / comb(len(a), 2)
    return float((s - expected) / (0.5 * (sa + sb) - expected))
