"""HLCR building blocks shared by the collapsed Gibbs, VB-EM and federated kernels (``inference.hlcr``).

Everything here is a pure function of per-pair sufficient statistics (``zoo.hlcr.pair_statistics``)
and per-cluster sums, so an agent can run it on its own pairs and a server on summed messages:

* ``PairData`` / ``pair_data``: the per-pair statistics scaled by 1/sigma^2 and the constant part of
  the pair's log likelihood;
* ``cluster_sums``: per-cluster sums D_k = sum_{e: z_e = k} G_e / sigma^2 (K, F, F), c_k (K, F), counts
  (K,) of a set of pairs (all pairs, or one agent's: the FedHLCR message), hard or soft labels;
* ``log_normaliser``: logZ(A, b) = 1/2 b^T A^-1 b - 1/2 log|A| by an unrolled Cholesky (batched);
* ``pair_log_predictive``: log p(y_e | z_e = k, other pairs' stats) for every k, by the normaliser
  ratio (notes §3.1, corrected Theorem 1);
* ``prior_logits``: the label prior, exact hierarchical (notes P1) or the paper's eq. (2);
* ``collapsed_log_joint``: log p(y | z) + log p(z | psi) + log p(psi), the objective of both Gibbs kernels;
* ``antoniak_table_totals`` / ``sample_log_dirichlet``: the auxiliary-variable psi update (notes P1);
* ``relabel``/``match_labels``: Hungarian matching of labels to a reference;
* ``cluster_posteriors``: Theorem 2's per-cluster posterior (m_k, H_k) for given labels;
* ``Config`` / ``make_config``: the static hyperparameters every kernel closes over;
* ``draw_conditionals``: w and theta from their conditionals given the labels, in a program (the blocked sweep);
  ``host_conditionals``: the same conditionals in NumPy on the host, from the statistics a chain kept (the
  collapsed sampler's draws);
* ``run_label_chains``: the one call that runs both Gibbs kernels' chains (``inference.base.Kernel`` with
  ``collect``) through ``inference.loop.sample_chains``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import linear_sum_assignment

from inference import host_draws
from inference.base import Kernel
from inference.loop import sample_chains
from inference.uniforms import GAMMA_TRIALS, box_muller, log_gamma_from_uniforms, log_gamma_mt, open_uniforms
from zoo.hlcr import LOG_2PI, resolve_hyper

TINY_LOG = float(np.log(np.finfo(np.float64).tiny))


class PairData(NamedTuple):
    """Per-pair sufficient statistics, scaled for the sampler (E pairs, F features).

    Gs: G_e / sigma^2 (E, F, F); gs: g_e / sigma^2 (E, F); const: -n_e/2 log(2 pi sigma^2) - q_e/(2 sigma^2)
    (E,); agent: agent index of each pair (E,)."""

    Gs: jax.Array
    gs: jax.Array
    const: jax.Array
    agent: jax.Array


def pair_data(inputs: dict) -> PairData:
    """``PairData`` from the model inputs (``zoo.hlcr.model_inputs``), as NumPy arrays (compiled programs take
    them as they are; no JAX operation runs one at a time)."""
    s2 = np.asarray(inputs["sigma"], float) ** 2
    const = -0.5 * np.asarray(inputs["n_ev"]) * (LOG_2PI + np.log(s2)) - 0.5 * np.asarray(inputs["q"]) / s2
    return PairData(np.asarray(inputs["G"] / s2, float), np.asarray(inputs["g"] / s2, float),
                    np.asarray(const, float), np.asarray(inputs["pair_agent"], dtype=np.int32))


def cluster_sums(Gs, gs, labels, K):
    """Per-cluster sums of pair statistics: D (K, F, F), c (K, F), counts (K,).

    ``labels``: hard labels (E,) int, or soft responsibilities (E, K). This is exactly an agent's FedHLCR
    upload when called on that agent's pairs (Algorithm 3 with the per-pair sums of erratum E7); the
    cluster precision is I/delta^2 + sum over agents of D."""
    if labels.ndim == 1:
        D = jax.ops.segment_sum(Gs, labels, num_segments=K)
        c = jax.ops.segment_sum(gs, labels, num_segments=K)
        n = jax.ops.segment_sum(jnp.ones(labels.shape[0]), labels, num_segments=K)
        return D, c, n
    return jnp.einsum("ek,eij->kij", labels, Gs), labels.T @ gs, labels.sum(0)


def _chol_unrolled(A):
    """Cholesky factor entries of a batch of small SPD matrices, unrolled over the static size F (XLA
    fuses it into one loop; much cheaper than a LAPACK call per matrix inside a scan)."""
    F = A.shape[-1]
    L = [[None] * F for _ in range(F)]
    for j in range(F):
        s = A[..., j, j]
        for k in range(j):
            s = s - L[j][k] ** 2
        d = jnp.sqrt(s)
        L[j][j] = d
        for i in range(j + 1, F):
            t = A[..., i, j]
            for k in range(j):
                t = t - L[i][k] * L[j][k]
            L[i][j] = t / d
    return L


UNROLL_MAX_F = 12


def log_normaliser(A, b):
    """logZ(A, b) = 1/2 b^T A^-1 b - 1/2 log|A| for a batch of SPD ``A`` (..., F, F) and ``b`` (..., F).

    The Gaussian integral int exp(-1/2 w^T A w + b^T w) dw = (2 pi)^{F/2} exp(logZ(A, b))."""
    F = A.shape[-1]
    if F > UNROLL_MAX_F:
        L = jnp.linalg.cholesky(A)
        v = jax.scipy.linalg.solve_triangular(L, b[..., None], lower=True)[..., 0]
        return 0.5 * jnp.sum(v**2, -1) - jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), -1)
    L = _chol_unrolled(A)
    v, quad, logdet = [], 0.0, 0.0
    for i in range(F):
        t = b[..., i]
        for k in range(i):
            t = t - L[i][k] * v[k]
        v.append(t / L[i][i])
        quad = quad + v[i] ** 2
        logdet = logdet + jnp.log(L[i][i])
    return 0.5 * quad - logdet


def prior_precision(F, delta):
    return jnp.eye(F) / delta**2


def cluster_state(Gs, gs, z, K, delta):
    """(D, c, logZ) of every cluster for labels ``z``: D_k = I/delta^2 + sum G_e/sigma^2 (exact sums)."""
    D, c, _ = cluster_sums(Gs, gs, z, K)
    D = D + prior_precision(Gs.shape[-1], delta)
    return D, c, log_normaliser(D, c)


def pair_log_predictive(D, c, logZ, Gs_e, gs_e, const_e):
    """log p(y_e | z_e = k, statistics of the other pairs) for every k (notes §3.1, normaliser ratio):

        logZ(D_k + G_e/s^2, c_k + g_e/s^2) - logZ(D_k, c_k) - n_e/2 log(2 pi s^2) - q_e/(2 s^2),

    where (D_k, c_k) must NOT contain pair e. Equals the product of the corrected sequential predictives
    N(y_n | b_{n-1}^T A_{n-1}^-1 x_n, s^2 + x_n^T A_{n-1}^-1 x_n) (paper eq. 3-4 with erratum E1: the
    paper prints the variance as s^2 + x^T A^-1 x / s^2). Cost O(K F^3), independent of n_e."""
    return log_normaliser(D + Gs_e, c + gs_e) - logZ + const_e


def prior_logits(n_agent_k, n_cluster, log_psi, alpha, beta, prior: str):
    """Log label prior of one pair (up to a constant), counts EXCLUDING the pair.

    ``prior="exact"`` (notes P1, semi-collapsed with psi explicit): log(N_i^(k) + beta psi_k).
    ``prior="paper"`` (paper eq. 2, ALDA's approximation, erratum E2):
    log(N_i^(k) + beta (N^(k) + alpha/K) / (sum_k N^(k) + alpha))."""
    K = n_cluster.shape[-1]
    if prior == "exact":
        return jnp.logaddexp(jnp.log(n_agent_k), jnp.log(beta) + log_psi)
    return jnp.log(n_agent_k + beta * (n_cluster + alpha / K) / (n_cluster.sum(-1, keepdims=True) + alpha))


def paper_eq2(n_agent_k, n_cluster, alpha, beta):
    """Paper eq. (2) as normalised probabilities (denominator sum_k N_i^(k) + beta)."""
    K = n_cluster.shape[-1]
    num = n_agent_k + beta * (n_cluster + alpha / K) / (n_cluster.sum(-1, keepdims=True) + alpha)
    return num / (n_agent_k.sum(-1, keepdims=True) + beta)


def at_once(fn, *arrays):
    """``[fn(a) for a in arrays]`` for an elementwise ``fn`` (``gammaln``, ``digamma``, ``erf_inv``) computed by
    ONE call of ``fn`` on all their entries (flattened and joined): the same numbers, and one copy of the
    function's long series in the compiled program instead of one per call (a lgamma is ~40 HLO ops, an erf_inv
    ~150)."""
    arrays = [jnp.asarray(a, jnp.float64) for a in arrays]
    out = fn(jnp.concatenate([jnp.ravel(a) for a in arrays]))
    pieces, start = [], 0
    for a in arrays:
        pieces.append(out[start:start + a.size].reshape(a.shape))
        start += a.size
    return pieces


_NORMAL_LO = np.nextafter(np.float64(-1.0), np.float64(0.0))


def normals(*draws):
    """``[jax.random.normal(key, shape) for key, shape in draws]``, the same numbers (JAX's own construction:
    sqrt(2) erf_inv(u), u uniform on (-1, 1)), with one erf_inv for all of them (``at_once``). A function of its
    own in the program (as ``jax.random.normal``), so calls with the same shapes (a kernel's init and step) share
    one copy."""
    keys, shapes = zip(*draws, strict=True)
    return _normals(keys, shapes)


@functools.partial(jax.jit, static_argnums=1)
def _normals(keys, shapes):
    us = [jax.random.uniform(k, shape, jnp.float64, _NORMAL_LO, np.float64(1.0)) for k, shape in zip(keys, shapes,
                                                                                                    strict=True)]
    return [np.float64(np.sqrt(2)) * e for e in at_once(jax.lax.erf_inv, *us)]


def sample_log_gamma(key, a, x=None):
    """log of Gamma(a, 1) draws (any shape ``a`` > 0), cheap to compile.

    Marsaglia & Tsang (2000) squeeze/rejection for shape a + 1 with ``GAMMA_TRIALS`` proposals drawn at once
    (acceptance >= 0.95 per proposal, so all fail with probability < 1e-15; then the last proposal is used),
    and the boost G(a) = G(a + 1) U^(1/a) in log space, so tiny shapes (beta psi_k ~ 1e-5) do not underflow.
    ``jax.random.loggamma`` is exact too but its rejection sampler is costly to compile (benchmarks/results.md,
    "lab notes from inference/"), and the Gibbs and VB-EM kernels compile it once per data shape.
    ``key``: a key, or its split ``gamma_keys(key)`` where the caller has it; ``x``: the proposals' standard
    normals where the caller draws them with others (``normals``): those of ``jax.random.normal(gamma_keys(key)[0],
    (GAMMA_TRIALS, *a.shape))`` (``gamma_normals``). The kernels' sweeps use ``log_gamma_from_uniforms`` (the same
    law from one block of uniforms, no erf_inv)."""
    k_x, k_u, k_boost = key if isinstance(key, tuple) else gamma_keys(key)
    if x is None:
        x = jax.random.normal(k_x, (GAMMA_TRIALS, *jnp.shape(a)))
    u = jax.random.uniform(k_u, (GAMMA_TRIALS, *jnp.shape(a)), minval=jnp.finfo(jnp.float64).tiny)
    u_b = jax.random.uniform(k_boost, jnp.shape(a), minval=jnp.finfo(jnp.float64).tiny)
    return log_gamma_mt(a, x, u, u_b)


def log_dirichlet_from_uniforms(u, conc):
    """log of a Dirichlet(conc) draw along the last axis from ``u`` (GAMMA_UNIFORMS, *conc.shape) uniforms on
    (0, 1) (``log_gamma_from_uniforms``), floored at log(tiny) as ``sample_log_dirichlet``."""
    lg = log_gamma_from_uniforms(u, conc)
    return jnp.maximum(lg - jax.nn.logsumexp(lg, axis=-1, keepdims=True), TINY_LOG)


def gamma_keys(key) -> tuple:
    """The keys ``sample_log_gamma(key, ...)`` uses: its proposals' normals, their uniforms, the boost."""
    return tuple(jax.random.split(key, 3))


def gamma_normals(keys: tuple, shape):
    """``(key, shape)`` of the standard normals ``sample_log_gamma(keys, a)`` draws for ``a`` of this shape
    (``keys = gamma_keys(key)``), for ``normals``."""
    return keys[0], (GAMMA_TRIALS, *shape)


def sample_log_dirichlet(key, conc, x=None):
    """log of a Dirichlet(conc) draw along the last axis, in log space (no underflow to log 0 for tiny
    concentrations), floored at log(tiny) so log densities stay finite (``x``: as ``sample_log_gamma``'s)."""
    lg = sample_log_gamma(key, conc, x)
    return jnp.maximum(lg - jax.nn.logsumexp(lg, axis=-1, keepdims=True), TINY_LOG)


def step_uniforms(key, n_fixed: int, n_pairs: int, per_pair: int):
    """Every uniform a sweep reads, from one call (``open_uniforms``: one random-bits function in the program, not
    one per draw): ``n_fixed`` first (those of draws whose shapes do not depend on the pairs: psi, w, theta), then
    ``per_pair`` for each pair, so pair e's uniforms (entries n_fixed + e * per_pair + j) do not depend on the
    number of pairs (padding). Returns ((n_fixed,), (n_pairs, per_pair))."""
    u = open_uniforms(key, (n_fixed + n_pairs * per_pair,))
    return u[:n_fixed], u[n_fixed:].reshape(n_pairs, per_pair)


def gumbel_from_uniforms(u):
    """Standard Gumbel variates -log(-log u) of uniforms on (0, 1) (``jax.random.gumbel``'s construction)."""
    return -jnp.log(-jnp.log(u))


def host_uniform_labels(words, n: int, K: int) -> np.ndarray:
    """``jax.random.randint(key, (n,), 0, K)`` (int64, JAX's default partitionable threefry-2x32) in NumPy, bit for
    bit, for the key data ``words`` (..., 2): shape (..., n). JAX's recipe: two keys ``split(key)``, 64 random bits
    per entry from each (``host_draws.threefry_normal``'s bits), offset = ((hi mod K) (2^64 mod K) + lo mod K) mod
    K. Entry e does not depend on n."""
    from inference.host_draws import threefry_bits, threefry_split

    halves = threefry_split(np.asarray(words, np.uint32))                 # (..., 2, 2)
    bits = lambda k: threefry_bits(k, (n,))  # noqa: E731
    span = np.uint64(K)
    multiplier = np.uint64((2**32 % K) ** 2 % K)
    with np.errstate(over="ignore"):
        return (((bits(halves[..., 0, :]) % span) * multiplier + bits(halves[..., 1, :]) % span) % span).astype(
            np.int64)


def host_log_normaliser(A, b):
    """``log_normaliser`` in NumPy: 1/2 b^T A^-1 b - 1/2 log|A| for a batch of SPD ``A`` (..., F, F)."""
    L = np.linalg.cholesky(A)
    v = np.linalg.solve(L, b[..., None])[..., 0]
    return 0.5 * np.sum(v**2, -1) - np.sum(np.log(np.diagonal(L, axis1=-2, axis2=-1)), -1)


def host_label_statistics(z, Gs, gs, agent, K: int, n_agents: int, delta: float):
    """Per-cluster statistics of labels ``z`` (..., E) in NumPy (a label K, a padded pair's, is not counted): D
    (..., K, F, F) including I/delta^2, c (..., K, F), agent counts N_i^(k) (..., n_agents, K)."""
    z = np.asarray(z)
    onehot = (z[..., None] == np.arange(K)).astype(float)                 # (..., E, K); label K: all zero
    F = np.shape(gs)[-1]
    D = np.einsum("...ek,eij->...kij", onehot, np.asarray(Gs, float)) + np.eye(F) / delta**2
    c = np.einsum("...ek,ei->...ki", onehot, np.asarray(gs, float))
    flat = z.reshape(-1, z.shape[-1])
    n_agent = np.zeros((flat.shape[0], n_agents, K))
    rows, pairs = np.nonzero(flat < K)
    np.add.at(n_agent, (rows, np.asarray(agent)[pairs], flat[rows, pairs]), 1.0)
    return D, c, n_agent.reshape(*z.shape[:-1], n_agents, K)


def host_table_totals(rng: np.random.Generator, z, agent, log_psi, beta, K: int, n_agents: int):
    """``antoniak_table_totals`` in NumPy for labels ``z`` (E,) (label K: a padded pair, in no group and no
    count), one ``rng`` uniform per pair with a label below K, in pair order. Returns m (K,)."""
    z, agent = np.asarray(z), np.asarray(agent)
    pairs = np.flatnonzero(z < K)
    group = agent[pairs] * K + z[pairs]
    order = np.argsort(group, kind="stable")
    g_sorted = group[order]
    rank = np.empty(len(pairs), np.int64)
    rank[order] = np.arange(len(pairs)) - np.searchsorted(g_sorted, g_sorted, side="left")
    bp = beta * np.exp(np.asarray(log_psi)[z[pairs]])
    new = rng.random(len(pairs)) < bp / (bp + rank)
    return np.bincount(z[pairs][new], minlength=K)[:K].astype(float)


def antoniak_table_totals(key, z, agent, log_psi, beta, K, n_agents, real=None, u=None):
    """Sum over agents of auxiliary table counts m_ik (notes P1), one Bernoulli per pair:

    within each (agent, label) group the pairs are taken in index order; the l-th (l = 0, 1, ...) opens a
    new table with probability beta psi_k / (beta psi_k + l). Returns m_k = sum_i m_ik (K,). Memory O(E).
    ``real`` (E,) bool: padded pairs (False) form a group of their own past every real one and have label K,
    which no count holds; pair e's uniform draw does not depend on the padding. ``u``: the pairs' uniforms (E,)
    where the caller draws them with others (``key`` unused)."""
    E = z.shape[0]
    group = agent * K + z
    if real is not None:
        group = jnp.where(real, group, n_agents * K)
    order = jnp.argsort(group, stable=True)
    g_sorted = group[order]
    starts = jnp.searchsorted(g_sorted, g_sorted, side="left")
    rank = jnp.zeros(E, dtype=jnp.int32).at[order].set((jnp.arange(E) - starts).astype(jnp.int32))
    bp = beta * jnp.exp(log_psi[z])
    p_new = bp / (bp + rank)
    new = (jax.random.uniform(key, (E,)) if u is None else u) < p_new
    return jax.ops.segment_sum(new.astype(jnp.float64), z, num_segments=K)


def log_prior_labels(n_agent, log_psi, beta, alpha=None):
    """log p(z | psi) = sum_i [lgamma(beta) - lgamma(beta + N_i) + sum_k lgamma(beta psi_k + N_ik)
    - lgamma(beta psi_k)] (theta integrated out). With ``alpha``: (log p(z | psi), log Dir(psi | alpha/K)), the
    lgammas of both in one call (``at_once``)."""
    from jax.scipy.special import gammaln

    bp = beta * jnp.exp(log_psi)
    Ni = n_agent.sum(-1)
    if alpha is None:
        g_beta, g_Ni, g_bpn, g_bp = at_once(gammaln, beta, beta + Ni, bp + n_agent, bp)
        return jnp.sum(g_beta - g_Ni) + jnp.sum(g_bpn - g_bp)
    K = log_psi.shape[-1]
    a = alpha / K
    g_beta, g_Ni, g_bpn, g_bp, g_alpha, g_a = at_once(gammaln, beta, beta + Ni, bp + n_agent, bp, alpha, a)
    return (jnp.sum(g_beta - g_Ni) + jnp.sum(g_bpn - g_bp),
            g_alpha - K * g_a + (a - 1) * jnp.sum(log_psi))


def collapsed_log_joint(D, c, const_total, n_agent, log_psi, hyper, logZ=None):
    """log p(y | z) + log p(z | psi) + log Dir(psi | alpha/K) with w and theta integrated out (notes §3.4,
    [ours]): sum_k logZ(D_k, c_k) - K F log delta + sum_e const_e + ``log_prior_labels`` + the Dirichlet density
    of psi. ``D`` (K, F, F) includes the prior precision I/delta^2; ``const_total`` = sum_e const_e (``PairData``);
    ``logZ``: ``log_normaliser(D, c)`` where the caller has it. The objective of both Gibbs kernels (collapsed
    ``gibbs`` and blocked ``gibbs_blocked``)."""
    K, F = D.shape[0], D.shape[-1]
    logZ = log_normaliser(D, c) if logZ is None else logZ
    ev = jnp.sum(logZ) - K * F * jnp.log(hyper.delta) + const_total
    labels, lp_psi = log_prior_labels(n_agent, log_psi, hyper.beta, hyper.alpha)
    return ev + labels + lp_psi


def host_collapsed_log_joint(D, c, const_total, n_agent, log_psi, hyper):
    """``collapsed_log_joint`` in NumPy/SciPy, batched over leading axes: D (..., K, F, F) including the prior
    precision, c (..., K, F), n_agent (..., N, K), log_psi (..., K); ``const_total`` = sum_e const_e of the real
    pairs. The collapsed sampler's log joint of its kept sweeps, from the statistics they keep (the chains' program
    computes none)."""
    from scipy.special import gammaln

    D, c, n_agent, log_psi = (np.asarray(a, float) for a in (D, c, n_agent, log_psi))
    K, F = D.shape[-3], D.shape[-1]
    ev = host_log_normaliser(D, c).sum(-1) - K * F * np.log(hyper.delta) + const_total
    bp = hyper.beta * np.exp(log_psi)
    labels = (np.sum(gammaln(hyper.beta) - gammaln(hyper.beta + n_agent.sum(-1)), -1)
              + np.sum(gammaln(bp[..., None, :] + n_agent) - gammaln(bp)[..., None, :], (-2, -1)))
    a = hyper.alpha / K
    return ev + labels + gammaln(hyper.alpha) - K * gammaln(a) + (a - 1) * log_psi.sum(-1)


def log_evidence(D, c, n_events, q_total, sigma, delta):
    """log p(y | z) = sum_k [logZ(D_k, c_k) - logZ(I/delta^2, 0)] - M/2 log(2 pi sigma^2) - sum q/(2 sigma^2)."""
    F = D.shape[-1]
    return (jnp.sum(log_normaliser(D, c)) - D.shape[0] * F * jnp.log(delta)
            - 0.5 * n_events * (LOG_2PI + 2 * jnp.log(sigma)) - 0.5 * q_total / sigma**2)


# --------------------------------------------------------------------------------------------------
# Label switching
# --------------------------------------------------------------------------------------------------

def match_labels(reference, labels, K):
    """Permutation ``perm`` (K,) maximising agreement between hard labels: ``perm[labels]`` ~ reference
    (Hungarian algorithm on the K x K contingency table)."""
    table = np.zeros((K, K))
    np.add.at(table, (np.asarray(labels), np.asarray(reference)), 1)
    rows, cols = linear_sum_assignment(-table)
    perm = np.arange(K)
    perm[rows] = cols
    return perm


def relabel(draws: dict, reference_w, *, cluster_axis: dict | None = None) -> dict:
    """Undo label switching draw by draw: permute clusters so that each draw's ``w`` (chain, draw, K, F)
    is closest (squared distance, Hungarian algorithm) to ``reference_w`` (K, F).

    ``draws``: arrays with leading (chain, draw) axes: ``w`` (K, F), optional ``psi`` (K,), ``theta``
    (N, K) and labels ``z`` (E,). Returns the permuted copies and ``perm`` (chain, draw, K) with
    new_label = perm[old_label]. Per-cluster quantities are meaningful only after this step;
    label-invariant summaries (``zoo.hlcr.summaries``) never need it."""
    w = np.asarray(draws["w"])
    C, S, K, _ = w.shape
    ref = np.asarray(reference_w)
    perm = np.empty((C, S, K), dtype=np.int64)
    for c in range(C):
        for s in range(S):
            cost = ((w[c, s][:, None, :] - ref[None, :, :]) ** 2).sum(-1)
            rows, cols = linear_sum_assignment(cost)
            perm[c, s, rows] = cols
    inv = np.argsort(perm, axis=-1)   # inv[new] = old
    out = dict(draws)
    out["w"] = np.take_along_axis(w, inv[..., None], axis=2)
    if "psi" in draws:
        out["psi"] = np.take_along_axis(np.asarray(draws["psi"]), inv, axis=2)
    if "theta" in draws:
        th = np.asarray(draws["theta"])
        out["theta"] = np.take_along_axis(th, inv[:, :, None, :], axis=3)
    if "z" in draws:
        z = np.asarray(draws["z"])
        out["z"] = np.take_along_axis(perm, z, axis=2)
    out["perm"] = perm
    return out


def cluster_posteriors(Gs, gs, z, K, delta):
    """Per-cluster posterior mean m_k = H_k c_k and covariance H_k = D_k^-1 for labels z (Theorem 2)."""
    D, c, _ = cluster_sums(Gs, gs, z, K)
    D = D + prior_precision(Gs.shape[-1], delta)
    H = jnp.linalg.inv(D)
    return jnp.einsum("kij,kj->ki", H, c), H


class Config(NamedTuple):
    """The model's hyperparameters as static numbers for the kernels, and the number of agents."""

    K: int
    alpha: float
    beta: float
    delta: float
    sigma: float
    n_agents: int


def make_config(ctx_hyper: dict, n_agents: int) -> Config:
    h = resolve_hyper(ctx_hyper)
    return Config(int(h["K"]), float(h["alpha"]), float(h["beta"]), float(h["delta"]), float(h["sigma"]),
                 int(n_agents))


def conditional_keys(key) -> tuple:
    """The keys ``draw_conditionals(key, ...)`` uses: w's noise, and ``gamma_keys`` of theta's Gamma draws."""
    k_w, k_theta = jax.random.split(key)
    return k_w, gamma_keys(k_theta)


def conditional_normals(keys: tuple, c_shape, conc_shape):
    """The ``(key, shape)`` pairs of the standard normals ``draw_conditionals(keys, ...)`` draws (w's noise, the
    proposals of theta's Gamma draws; ``keys = conditional_keys(key)``), for ``normals``."""
    return (keys[0], c_shape), gamma_normals(keys[1], conc_shape)


def draw_conditionals(key, D, c, n_agent, log_psi, beta, drawn=None):
    """w_k ~ N(D_k^-1 c_k, D_k^-1) and theta_i ~ Dir(beta psi + N_i) given the labels' statistics (D includes
    the prior precision) and psi: the conditionals of the parameters that Gibbs integrates out. ``key``: a key or
    its split ``conditional_keys(key)``; ``drawn``: its standard normals (``conditional_normals``) where the
    caller draws them with others; else one ``normals`` draws them."""
    keys = key if isinstance(key, tuple) else conditional_keys(key)
    conc = beta * jnp.exp(log_psi) + n_agent
    eps, x = normals(*conditional_normals(keys, c.shape, conc.shape)) if drawn is None else drawn
    log_theta = sample_log_dirichlet(keys[1], conc, x)
    L = jnp.linalg.cholesky(D)
    mean = jax.scipy.linalg.cho_solve((L, True), c[..., None])[..., 0]
    w = mean + jax.scipy.linalg.solve_triangular(jnp.swapaxes(L, -1, -2), eps[..., None], lower=False)[..., 0]
    return w, jnp.exp(log_theta)


def conditionals_from_uniforms(u_w, u_theta, D, c, n_agent, log_psi, beta):
    """``draw_conditionals`` (the same conditionals) from uniforms on (0, 1): ``u_w`` (2, K, F) for w's standard
    normals (``box_muller``), ``u_theta`` (GAMMA_UNIFORMS, N, K) for theta's Gamma variates
    (``log_dirichlet_from_uniforms``). Returns w (K, F) and log theta (N, K), floored at log(tiny)."""
    log_theta = log_dirichlet_from_uniforms(u_theta, beta * jnp.exp(log_psi) + n_agent)
    L = jnp.linalg.cholesky(D)
    mean = jax.scipy.linalg.cho_solve((L, True), c[..., None])[..., 0]
    eps = box_muller(u_w[0], u_w[1])
    w = mean + jax.scipy.linalg.solve_triangular(jnp.swapaxes(L, -1, -2), eps[..., None], lower=False)[..., 0]
    return w, log_theta


def host_conditionals(rng: np.random.Generator, D, c, n_agent, log_psi, beta):
    """``draw_conditionals`` in NumPy on the host, one draw per set of statistics: w_k ~ N(D_k^-1 c_k, D_k^-1)
    and theta_i ~ Dir(beta psi + N_i), log theta floored at log(tiny) (as ``sample_log_dirichlet``). ``D`` (...,
    K, F, F) includes the prior precision, ``c`` (..., K, F), ``n_agent`` (..., N, K), ``log_psi`` (..., K), with
    the same leading axes (a chain's kept sweeps: (chain, draw)). The draws come from ``rng`` (``np.random.
    default_rng(seed)``: reproducible), so no program compiles them (``inference.host_draws``). Returns w (...,
    K, F), theta (..., N, K)."""
    D, c, n_agent, log_psi = (np.asarray(a, float) for a in (D, c, n_agent, log_psi))
    L = np.linalg.cholesky(D)                                                  # D_k = L_k L_k^T
    Lt = np.swapaxes(L, -1, -2)
    mean = np.linalg.solve(Lt, np.linalg.solve(L, c[..., None]))[..., 0]
    eps = rng.standard_normal(c.shape)
    w = mean + np.linalg.solve(Lt, eps[..., None])[..., 0]                     # Cov L^-T L^-1 = D^-1
    conc = beta * np.exp(log_psi)[..., None, :] + n_agent
    theta = np.exp(host_draws.log_dirichlet_variates(rng, conc, conc.shape, floor=TINY_LOG))
    return w, theta


def run_label_chains(kernel: Kernel, problem, key, *, num_warmup: int, num_samples: int, num_chains: int,
                     thinning: int, init_state, progress, chunk: int, desc: str):
    """Run ``num_chains`` chains of a Gibbs kernel (``inference.base.Kernel`` with ``collect``: the dict kept per
    sweep, the labels, psi, what the draws of (w, theta) need, and the stats) as ``kernel.chains`` says, for
    ``num_warmup`` + ``num_samples * thinning`` sweeps (``inference.loop.sample_chains``). Returns (posterior
    dict with leading (chain, draw) axes: everything the kernel's ``collect`` keeps but its stats; stats dict:
    those of log_joint_collapsed, n_changed it keeps; last state)."""
    out, state = sample_chains(kernel.init, kernel.step, problem, key, num_chains=num_chains, num_warmup=num_warmup,
                               num_samples=num_samples, thinning=thinning, collect=kernel.collect, chunk=chunk,
                               progress=progress, desc=desc, init_state=init_state, chains=kernel.chains)
    stat_names = ("log_joint_collapsed", "n_changed")
    posterior = {name: value for name, value in out.items() if name not in stat_names}
    stats = {name: out[name] for name in stat_names if name in out}
    return posterior, stats, state
