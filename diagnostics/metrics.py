"""Per-method posterior-quality metrics: what one number per (method, model) says about a posterior.

* ``psis_khat(tree)``: Pareto k-hat of the importance ratios r_s = log p(theta_s, y) - log q(theta_s)
  at the method's own draws theta_s ~ q (Yao, Vehtari, Simpson & Gelman 2018, "Yes, but did it
  work?", sec. 2). log p(theta, y) is the sum of the tree's ``log_prior`` and ``log_likelihood``
  groups (which equal NumPyro's ``log_density``, see ``inference.trees``); log q is the method's
  ``sample_stats.log_q``. Reading: k < 0.5 good, 0.5-0.7 usable, > 0.7 the approximation misses
  mass the posterior has and importance sampling cannot repair it.
  Sign trap: ArviZ's ``psislw`` negates its input (it expects a log
  likelihood), so it is called on ``-r``; ``pareto_khat(r, log_weights=True)`` would fit the log
  weights themselves and is not used.
* ``joint_wasserstein``: 1-Wasserstein distance between the two joint sample sets, in
  reference-sd units (each component standardised by the reference's mean and sd). For two equally
  sized, equally weighted sample sets the optimal transport plan is a permutation, so the distance
  is an assignment problem (``scipy.optimize.linear_sum_assignment``); this is the same number
  ``arviz_stats.wasserstein`` (``scipy.stats.wasserstein_distance_nd``, a linear program) returns,
  faster by a wide margin (``benchmarks/results.md``, diagnostics).
* ``joint_kl``: KL(reference || method) by ArviZ's 1-nearest-neighbour estimator
  (``arviz_stats.kl_divergence``, Perez-Cruz 2008) on the standardised draws. It is the inclusive
  direction, large when the method misses reference mass (a too-narrow approximation).
* ``mmd``: maximum mean discrepancy with a Gaussian kernel (bandwidth: median heuristic on the
  pooled standardised draws), unbiased estimate of MMD^2, reported as sqrt(max(MMD^2, 0)). ArviZ has
  no MMD.
* ``final_bound``: the objective at convergence (the tree's ``objective`` attribute, written by every
  optimisation kernel through ``inference.Draws(objective=...)``, else the last finite value of a
  per-iteration ``elbo``/``bound`` trace).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist

from diagnostics.quantities import SAMPLE_DIMS

JOINT_MAX_DRAWS = 500  # draws per side used by the joint metrics (as ArviZ: num_samples=500)
JOINT_MAX_DIM = 200  # at most this many scalar components enter the joint metrics (the first ones)
KHAT_GOOD, KHAT_BAD = 0.5, 0.7
BOUND_NAMES = ("elbo", "bound", "lower_bound", "free_energy")


def log_joint(tree: xr.DataTree) -> np.ndarray:
    """log p(theta, y) at every draw, shape (chain, draw): the sum of the ``log_prior`` and
    ``log_likelihood`` groups over every variable and non-sample axis."""
    total = 0.0
    for group in ("log_prior", "log_likelihood"):
        if group not in tree.children:
            raise ValueError(f"tree: has no {group!r} group; fit it with inference.fit (which adds it)")
        for da in tree[group].to_dataset().data_vars.values():
            extra = [d for d in da.dims if d not in SAMPLE_DIMS]
            total = total + da.sum(extra).transpose(*SAMPLE_DIMS).values
    return np.asarray(total, dtype=float)


def log_importance_ratios(tree: xr.DataTree) -> np.ndarray | None:
    """r = log p(theta, y) - log q(theta) at the method's draws (chain, draw), or None without log_q."""
    if "sample_stats" not in tree.children or "log_q" not in tree["sample_stats"]:
        return None
    log_q = tree["sample_stats"]["log_q"].transpose(*SAMPLE_DIMS).values
    return log_joint(tree) - np.asarray(log_q, dtype=float)


def khat_of_log_ratios(lw: np.ndarray) -> float:
    """Pareto k-hat of importance ratios given as log ratios (any shape, pooled; draws independent,
    r_eff = 1). Constant ratios (q equal to the posterior up to its normalising constant) give -inf:
    the weights have no tail at all."""
    lw = np.asarray(lw, dtype=float).ravel()
    if not np.all(np.isfinite(lw)):
        raise ValueError("log importance ratios contain non-finite values (log q or log p is -inf/NaN)")
    if np.ptp(lw) <= 1e-9 * max(1.0, float(np.abs(lw).max())):
        return float("-inf")
    from arviz_stats.base import array_stats

    _, khat = array_stats.psislw(-lw, r_eff=1.0)  # psislw negates its input: pass -lw (ecosystem.md 1.2)
    return float(khat)


def psis_khat(tree: xr.DataTree) -> float | None:
    """Yao et al. (2018) k-hat of a variational/approximate posterior, or None when the tree has no
    ``sample_stats.log_q`` (samplers)."""
    lw = log_importance_ratios(tree)
    return None if lw is None else khat_of_log_ratios(lw)


def khat_reading(k: float | None) -> str:
    """The k-hat thresholds of Yao et al. (2018) in words."""
    if k is None or (isinstance(k, float) and np.isnan(k)):
        return "n/a"
    if k < KHAT_GOOD:
        return "good"
    if k <= KHAT_BAD:
        return "usable"
    return "unreliable"


def standardised_matrix(draws: dict[str, np.ndarray], ref: dict[str, np.ndarray], labels: Sequence[str],
                        n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, d) matrix of ``draws`` at ``labels``, each column centred/scaled by the reference's mean/sd,
    rows subsampled without replacement (the same rows for every column, keeping the joint)."""
    total = len(next(iter(draws.values())))
    rows = rng.choice(total, size=n, replace=False) if n < total else np.arange(total)
    cols = []
    for label in labels:
        r = ref[label]
        sd = float(np.std(r, ddof=1))
        cols.append((draws[label][rows] - float(np.mean(r))) / (sd if sd > 0 else 1.0))
    return np.stack(cols, axis=1)


def w1_assignment(a: np.ndarray, b: np.ndarray) -> float:
    """Exact 1-Wasserstein distance between two equally sized empirical measures (rows of a, b)."""
    if a.shape != b.shape:
        raise ValueError(f"w1_assignment: sample sets must have equal shapes, got {a.shape} and {b.shape}")
    cost = cdist(a, b)
    r, c = linear_sum_assignment(cost)
    return float(cost[r, c].mean())


def kl_nn(a: np.ndarray, b: np.ndarray) -> float:
    """KL(a || b) by ArviZ's 1-nearest-neighbour estimator (``arviz_stats.kl_divergence``)."""
    import arviz_stats as azs

    def tree(x):
        return xr.DataTree.from_dict({"posterior": xr.Dataset({"x": (("chain", "draw", "component"), x[None])})})

    n = min(len(a), len(b))
    return float(azs.kl_divergence(tree(a[:n]), tree(b[:n]), num_samples=n, round_to="none"))


def mmd(a: np.ndarray, b: np.ndarray, bandwidth: float | None = None) -> float:
    """Maximum mean discrepancy between the rows of ``a`` and ``b`` with a Gaussian kernel
    k(x, y) = exp(-|x - y|^2 / (2 h^2)); ``h`` defaults to the median pairwise distance of the pooled
    rows (median heuristic). Unbiased MMD^2 (Gretton et al. 2012, eq. 3), returned as sqrt(max(., 0))."""
    a, b = np.atleast_2d(a), np.atleast_2d(b)
    pooled = np.concatenate([a, b])
    if bandwidth is None:
        d = cdist(pooled, pooled)
        bandwidth = float(np.median(d[np.triu_indices_from(d, k=1)]))
        bandwidth = bandwidth if bandwidth > 0 else 1.0
    gamma = 1.0 / (2 * bandwidth**2)
    kaa = np.exp(-gamma * cdist(a, a, "sqeuclidean"))
    kbb = np.exp(-gamma * cdist(b, b, "sqeuclidean"))
    kab = np.exp(-gamma * cdist(a, b, "sqeuclidean"))
    m, n = len(a), len(b)
    mmd2 = ((kaa.sum() - np.trace(kaa)) / (m * (m - 1)) + (kbb.sum() - np.trace(kbb)) / (n * (n - 1))
            - 2 * kab.mean())
    return float(np.sqrt(max(mmd2, 0.0)))


def joint_metrics(ref: dict[str, np.ndarray], cand: dict[str, np.ndarray], *, seed: int = 0,
                  max_draws: int = JOINT_MAX_DRAWS, max_dim: int = JOINT_MAX_DIM) -> dict[str, float]:
    """``w1_joint`` (reference-sd units), ``kl_joint`` (nats), ``mmd`` and ``joint_dim`` (how many
    components entered) between two dicts label -> pooled 1-D draws (as ``scorecard`` builds them)."""
    labels = [k for k in ref if k in cand][:max_dim]
    if not labels:
        return {"w1_joint": np.nan, "kl_joint": np.nan, "mmd": np.nan, "joint_dim": 0}
    rng = np.random.default_rng(seed)
    if len(cand[labels[0]]) < 2:
        # A point estimate (em, vbgmm, dppca): W1 to a point mass is the mean distance of the reference
        # draws to it; the nearest-neighbour KL and the unbiased MMD need two draws on each side.
        a = standardised_matrix(ref, ref, labels, min(max_draws, len(ref[labels[0]])), rng)
        b = standardised_matrix(cand, ref, labels, 1, rng)
        return {"w1_joint": float(np.linalg.norm(a - b, axis=1).mean()), "kl_joint": np.nan, "mmd": np.nan,
                "joint_dim": len(labels)}
    n = min(max_draws, len(ref[labels[0]]), len(cand[labels[0]]))
    a = standardised_matrix(ref, ref, labels, n, rng)
    b = standardised_matrix(cand, ref, labels, n, rng)
    return {"w1_joint": w1_assignment(a, b), "kl_joint": kl_nn(a, b), "mmd": mmd(a, b), "joint_dim": len(labels)}


def final_bound(tree: xr.DataTree) -> tuple[str | None, float]:
    """(name, value) of the objective at convergence: the tree's ``objective`` attribute when the method set
    one (``inference.Draws.objective``; SVI: the mean ELBO of the last 5 % of steps), named like the method's
    trace (``"objective"`` without one), else the last finite value of a per-iteration trace named like
    ``elbo``/``bound`` in ``sample_stats``; (None, nan) when there is neither."""
    name, values = trace_of(tree)
    if "objective" in tree.attrs:
        return name or "objective", float(tree.attrs["objective"])
    if name is None:
        return None, float("nan")
    finite = values[np.isfinite(values)]
    return name, (float(finite[-1]) if finite.size else float("nan"))


def trace_of(tree: xr.DataTree) -> tuple[str | None, np.ndarray]:
    """The method's per-iteration objective trace (name, 1-D values), or (None, empty)."""
    if "sample_stats" not in tree.children:
        return None, np.array([])
    ss = tree["sample_stats"].to_dataset()
    candidates = [k for k in ss.data_vars if "iteration" in ss[k].dims]
    for wanted in BOUND_NAMES:
        for k in candidates:
            if k.lower() == wanted or k.lower().startswith(wanted):
                da = ss[k]
                extra = [d for d in da.dims if d != "iteration"]
                values = da.mean(extra).values if extra else da.values  # per-chain traces: averaged
                return k, np.asarray(values, dtype=float)
    return None, np.array([])


def clustering_error(labels_a, labels_b) -> float:
    """The clustering error of Bruneau et al. 2013 (VBmix ``getCouple``, notes erratum E21): the fraction of point
    pairs on which two partitions disagree (same cluster in one, different in the other), i.e. 1 - the
    (unadjusted) Rand index, computed by scikit-learn's ``rand_score``."""
    from sklearn.metrics import rand_score

    a, b = np.asarray(labels_a), np.asarray(labels_b)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError("labels: expected two 1-D label arrays of the same length >= 2")
    return float(1.0 - rand_score(a, b))
