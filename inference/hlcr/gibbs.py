"""Collapsed Gibbs sampling for HLCR (paper §4.2, Algorithms 1-2, corrected per notes §3).

State (``State``): labels z (E,), per-cluster exact sums D_k = I/delta^2 + sum_{z_e=k} G_e/sigma^2
(K, F, F), c_k = sum g_e/sigma^2 (K, F), their cached log normalisers logZ_k = 1/2 c^T D^-1 c - 1/2 log|D|,
agent counts N_i^(k) (N, K), cluster counts N^(k) (K,), and log psi (K,). w and theta are integrated
out; psi is explicit (auxiliary-variable sampler of notes P1).

One sweep (``step``):

1. for each pair e in turn (``lax.scan``), with counts and statistics EXCLUDING e (erratum E5: the paper's
   Algorithm 2 never updates the counts):

       log p(z_e = k | ...) = log prior_k + logZ(D_k + G_e/s^2, c_k + g_e/s^2) - logZ(D_k, c_k) + const_e

   (notes §3.1; the normaliser ratio equals the corrected Theorem 1 product of per-event predictives
   N(y_n | b^T A^-1 x_n, s^2 + x_n^T A^-1 x_n); erratum E1: the paper's eq. (4) prints the variance
   s^2 + x^T A^-1 x / s^2). Only K log normalisers (one unrolled Cholesky each) per pair: the candidate
   clusters k != z_e get D_k + G_e, the current cluster gets D_k - G_e (its "with e" value is cached),
   so a sweep costs O(E K F^3) independent of the number of events. Sampling is Gumbel-max on the log
   probabilities (erratum E4: the paper multiplies raw densities and underflows).
   Prior (``prior=``): ``"exact"``: log(N_i^(k) + beta psi_k) (notes P1, exact for the stated model);
   ``"paper"``: eq. (2), log(N_i^(k) + beta (N^(k) + alpha/K)/(N + alpha)), ALDA's approximation
   (erratum E2: biased, e.g. 0.035 co-clustering error on the notes' B2 toy).
2. refresh D, c, logZ from the new z (exact sums, so rank-one drift never accumulates; erratum E11): the state
   a sweep starts from (``init``, ``state_from_labels`` or the last sweep) holds the exact sums, and the log joint
   reads them;
3. psi update (both priors; with ``"paper"`` psi is only reported): Antoniak table counts
   m_ik ~ sum_l Bernoulli(beta psi_k / (beta psi_k + l)), then psi ~ Dir(alpha/K + sum_i m_ik), in log space.

A sweep's random numbers are one block of uniforms (``common.step_uniforms``): psi's Gamma variates
(``common.log_dirichlet_from_uniforms``: Marsaglia-Tsang with Box-Muller normals), then each pair's Gumbel noise
(-log(-log u)) and table draw. One random-bits function and no erf_inv in the compiled sweep (each draw of its own
added one; the psi draw alone was a quarter of the program: benchmarks/results.md, "hlcr_gibbs_sweep").

Kernel shape (``inference.loop``): ``kernel(hyper, prior, kernel_name)`` (cached per static configuration)
gives ``init(key, problem) -> State`` (z ~ U{1..K}, Algorithm 2's initialisation), ``step(key, state, problem)
-> (State, Info)`` (one sweep; ``Info.objective`` is the collapsed log joint) and ``collect`` (what each kept
sweep keeps: the labels, psi, the statistics (D, c, N_i^(k)) and the stats); ``problem`` is a ``Problem`` (pair
statistics, and the events for ``kernel="paper"``). Chains, warm-up and thinning are
``inference.loop.sample_chains``'s. ``run`` starts the chains from the state ``init`` would give, built in NumPy
on the host (``first_labels``: the same labels bit for bit; ``host_state``), so the chains' program holds no start.

``kernel="paper"`` replaces step 1's block update by the paper's per-event rank-one Algorithm 1/2 on
H_k = D_k^-1: remove the pair's events from its cluster by eq. (9), evaluate the sequential predictive for
every k with eq. (8) updates (predictive BEFORE the update, erratum E3), then add the events to the
chosen cluster by eq. (8); O(K N_ij F^2) per pair. Same conditionals, so with the same keys it follows
the same label path (a test oracle) and serves as the speed baseline.

Each kept sweep adds w_k ~ N(D_k^-1 c_k, D_k^-1) and theta_i ~ Dir(beta psi + N_i) from their conditionals
given its labels and psi, so (z, w, psi, theta) is a joint posterior draw of the model's latent sites. ``run``
draws them after the chains, in NumPy on the host (``common.host_conditionals``), from the statistics each kept
sweep holds (its state's exact D_k, c_k and counts N_i^(k)), with ``np.random.default_rng`` seeded by the words
of ``fold_in(key, 2)``: the chains' program keeps no draw of them (a Cholesky solve and a Gamma rejection
sampler per kept sweep, which doubled its compile; benchmarks/results.md, "hlcr_program_size").

The pairs are padded to ``programs.bucket(E)`` (``run``; the events to ``programs.bucket(M)``), so data sets of
similar size share the compiled chains: a padded pair (``Problem.real`` False) has the label K, which no cluster
or agent count holds and no statistic sums (``segment_sum`` drops it), its update in the scan leaves the state as
it is, it opens no table and its const is not in the log joint; its events are none. The random numbers of pair
e (initial label, Gumbel noise, table draw) are the same whatever the padding, so the real pairs follow the
unpadded chain; the labels are cut back to E.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from inference import host_draws, host_keys, programs
from inference._methods import Draws, FitContext, Option, register_method
from inference.base import Kernel
from inference.hlcr.common import (
    Config,
    PairData,
    antoniak_table_totals,
    cluster_state,
    collapsed_log_joint,
    gumbel_from_uniforms,
    host_collapsed_log_joint,
    host_conditionals,
    host_label_statistics,
    host_log_normaliser,
    host_uniform_labels,
    log_dirichlet_from_uniforms,
    log_normaliser,
    make_config,
    pair_data,
    prior_logits,
    run_label_chains,
    step_uniforms,
)
from inference.uniforms import GAMMA_UNIFORMS
from zoo.hlcr import pair_structure

PRIORS = ("exact", "paper")
KERNELS = ("block", "paper")


class State(NamedTuple):
    z: jax.Array          # (E,) labels
    D: jax.Array          # (K, F, F) I/delta^2 + sum G_e / sigma^2
    c: jax.Array          # (K, F) sum g_e / sigma^2
    logZ: jax.Array       # (K,) log normaliser of (D_k, c_k)
    n_agent: jax.Array    # (N, K) N_i^(k)
    n_cluster: jax.Array  # (K,) N^(k)
    log_psi: jax.Array    # (K,)


class Info(NamedTuple):
    objective: jax.Array  # log p(y, z | psi) + log p(psi): collapsed log joint after the sweep
    n_changed: jax.Array  # number of pairs whose label changed in the sweep


class Events(NamedTuple):
    """Events sorted by pair (only for ``kernel="paper"``): X (M, F), y (M,), start/count per pair (E,)."""

    X: jax.Array
    y: jax.Array
    start: jax.Array
    count: jax.Array


class Problem(NamedTuple):
    """What a sweep reads: the per-pair statistics, and the events sorted by pair for ``kernel="paper"``
    (None for ``"block"``)."""

    pdat: PairData
    events: Events | None = None
    real: jax.Array | None = None   # (E,) bool, False on padded pairs (None: every pair is real)


def state_from_labels(z, pdat: PairData, hyper: Config) -> State:
    """State for labels ``z`` (psi starts uniform)."""
    K = hyper.K
    D, c, logZ = cluster_state(pdat.Gs, pdat.gs, z, K, hyper.delta)
    onehot = jax.nn.one_hot(z, K)
    n_agent = jax.ops.segment_sum(onehot, pdat.agent, num_segments=hyper.n_agents)
    return State(z, D, c, logZ, n_agent, onehot.sum(0), jnp.full(K, -jnp.log(K)))


def _keep_padded(update):
    """``update(carry, xs)`` that leaves the carry as it is (and reports no change) for a padded pair."""

    def guarded(carry, xs):
        new, changed = update(carry, xs[:-1])
        real = xs[-1]
        return jax.tree.map(lambda a, b: jnp.where(real, a, b), new, carry), changed & real

    return guarded


def _block_pair_update(state: State, xs, hyper: Config, prior: str):
    """One pair's collapsed update from sufficient statistics (K log normalisers). A padded pair (``real_e`` False,
    label K) keeps its label K, so its move is zero and the state stays as it is (no guard over the whole carry)."""
    Gs_e, gs_e, const_e, a, gumbel, e, real_e = xs
    K = hyper.K
    k0 = state.z[e]
    is0 = jnp.arange(K) == k0
    sign = jnp.where(is0, -1.0, 1.0)
    lz = log_normaliser(state.D + sign[:, None, None] * Gs_e, state.c + sign[:, None] * gs_e)
    logZ_with = jnp.where(is0, state.logZ, lz)     # cluster stats including pair e
    logZ_without = jnp.where(is0, lz, state.logZ)  # ... excluding pair e
    n_agent_k = state.n_agent[a] - is0
    n_cluster = state.n_cluster - is0
    logits = prior_logits(n_agent_k, n_cluster, state.log_psi, hyper.alpha, hyper.beta, prior) \
        + logZ_with - logZ_without + const_e
    k1 = jnp.where(real_e, jnp.argmax(logits + gumbel), k0).astype(state.z.dtype)
    move = (jnp.arange(K) == k1).astype(state.D.dtype) - is0
    new = state._replace(
        z=state.z.at[e].set(k1),
        D=state.D + move[:, None, None] * Gs_e,
        c=state.c + move[:, None] * gs_e,
        logZ=jnp.where(jnp.arange(K) == k1, logZ_with, logZ_without),
        n_agent=state.n_agent.at[a].add(move),
        n_cluster=state.n_cluster + move,
    )
    return new, k1 != k0


def _paper_pair_update(carry, xs, hyper: Config, prior: str, ev: Events):
    """One pair's update as in the paper's Algorithms 1-2: per-event rank-one (Sherman-Morrison) updates
    of H_k = D_k^-1, corrected (variance s^2 + x^T H x, predictive before the update, log space)."""
    state, H = carry
    _, gs_e, _, a, gumbel, e = xs
    K, s2 = hyper.K, hyper.sigma**2
    k0 = state.z[e]
    lo, hi = ev.start[e], ev.start[e] + ev.count[e]

    def remove(n, hc):                                      # eq. (9)
        Hk, ck = hc
        x, y = ev.X[n], ev.y[n]
        u = Hk @ x
        return Hk + jnp.outer(u, u) / (s2 - x @ u), ck - x * y / s2

    Hk0, ck0 = jax.lax.fori_loop(lo, hi, remove, (H[k0], state.c[k0]))
    H_rm, c_rm = H.at[k0].set(Hk0), state.c.at[k0].set(ck0)

    def predictive(n, acc):                                 # Algorithm 1 inner loop, all k at once
        Hc, b, ll = acc
        x, y = ev.X[n], ev.y[n]
        u = Hc @ x                                          # (K, F)
        v = u @ x
        mean, var = jnp.sum(b * u, -1), s2 + v
        ll = ll - 0.5 * (jnp.log(2 * jnp.pi * var) + (y - mean) ** 2 / var)
        return Hc - u[:, :, None] * u[:, None, :] / var[:, None, None], b + x * y / s2, ll

    _, _, loglik = jax.lax.fori_loop(lo, hi, predictive, (H_rm, c_rm, jnp.zeros(K)))
    is0 = jnp.arange(K) == k0
    logits = prior_logits(state.n_agent[a] - is0, state.n_cluster - is0, state.log_psi, hyper.alpha,
                          hyper.beta, prior) + loglik
    k1 = jnp.argmax(logits + gumbel).astype(state.z.dtype)

    def add(n, hc):                                         # eq. (8)
        Hk, ck = hc
        x, y = ev.X[n], ev.y[n]
        u = Hk @ x
        return Hk - jnp.outer(u, u) / (s2 + x @ u), ck + x * y / s2

    Hk1, ck1 = jax.lax.fori_loop(lo, hi, add, (H_rm[k1], c_rm[k1]))
    move = (jnp.arange(K) == k1).astype(H.dtype) - is0
    state = state._replace(
        z=state.z.at[e].set(k1), c=c_rm.at[k1].set(ck1), n_agent=state.n_agent.at[a].add(move),
        n_cluster=state.n_cluster + move)
    return (state, H_rm.at[k1].set(Hk1)), k1 != k0


def sweep(key, state: State, problem: Problem, hyper: Config, prior: str = "exact", kernel: str = "block"):
    """One systematic-scan sweep over all pairs, then the psi update. Returns ``(state, Info)``. ``state``'s
    (D, c, logZ) must be the exact sums of its labels (``state_from_labels``; every sweep returns them so)."""
    pdat, events, real = problem
    E, K = state.z.shape[0], hyper.K
    # every uniform of the sweep in one call: psi's (fixed size) first, then K + 1 per pair (its Gumbel noise and its
    # table draw), so pair e's do not depend on the padding
    u_psi, u_pair = step_uniforms(key, GAMMA_UNIFORMS * K, E, K + 1)
    gumbel = gumbel_from_uniforms(u_pair[:, :K])
    xs = (pdat.Gs, pdat.gs, pdat.const, pdat.agent, gumbel, jnp.arange(E))
    if kernel == "block":
        xs = (*xs, jnp.ones(E, bool) if real is None else real)
        state, changed = jax.lax.scan(lambda s, x: _block_pair_update(s, x, hyper, prior), state, xs)
    else:
        guard = (lambda f: f) if real is None else _keep_padded
        xs = xs if real is None else (*xs, real)
        (state, _), changed = jax.lax.scan(guard(lambda s, x: _paper_pair_update(s, x, hyper, prior, events)),
                                           (state, jnp.linalg.inv(state.D)), xs)
    # exact sums of the new labels (the block updates' D carries the rounding of E additions and removals; the
    # rank-one updates carry H_k = D_k^-1, not D_k), so the draws (collect) pair a current D_k with c_k
    D, c, logZ = cluster_state(pdat.Gs, pdat.gs, state.z, hyper.K, hyper.delta)
    m = antoniak_table_totals(None, state.z, pdat.agent, state.log_psi, hyper.beta, K, hyper.n_agents, real,
                              u=u_pair[:, K])
    log_psi = log_dirichlet_from_uniforms(u_psi.reshape(GAMMA_UNIFORMS, K), hyper.alpha / K + m)
    state = state._replace(D=D, c=c, logZ=logZ, log_psi=log_psi)
    return state, Info(log_joint(state, pdat, hyper, real, exact=True), jnp.sum(changed))


def log_joint(state: State, pdat: PairData, hyper: Config, real=None, exact: bool = False):
    """Collapsed log joint log p(y | z) + log p(z | psi) + log Dir(psi | alpha/K) (notes §3.4, [ours];
    ``common.collapsed_log_joint``); ``real``: the pair mask (padded pairs' const left out). ``exact``: the
    state's (D, c, logZ) are the exact sums of its labels (as ``sweep`` returns them), else they are recomputed."""
    D, c, logZ = (state.D, state.c, state.logZ) if exact else cluster_state(pdat.Gs, pdat.gs, state.z, hyper.K,
                                                                            hyper.delta)
    const = pdat.const if real is None else jnp.where(real, pdat.const, 0.0)
    return collapsed_log_joint(D, c, jnp.sum(const), state.n_agent, state.log_psi, hyper, logZ)


def events_by_pair(X, y, pair, n_pairs) -> Events:
    order = np.argsort(pair, kind="stable")
    count = np.bincount(pair, minlength=n_pairs)
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    return Events(jnp.asarray(X[order]), jnp.asarray(y[order]), jnp.asarray(start, dtype=jnp.int32),
                  jnp.asarray(count, dtype=jnp.int32))


@programs.cached(maxsize=32)
def kernel(hyper: Config, prior: str = "exact", kernel: str = "block") -> Kernel:
    """The Gibbs kernel for one static configuration (built once, so ``inference.loop`` compiles it once). Its
    chains run one after another in each sweep (``chains="map"``): a sweep is a scan over pairs that gains nothing
    from batching the chains, and the batched sweep takes longer to compile (benchmarks/results.md,
    "hlcr_gibbs_host")."""

    def init(key, problem: Problem) -> State:
        E = problem.pdat.gs.shape[0]
        z = jax.random.randint(key, (E,), 0, hyper.K).astype(jnp.int32)   # z ~ U{1..K} (Algorithm 2 init)
        if problem.real is not None:
            z = jnp.where(problem.real, z, hyper.K)                         # padded pairs: label K, never counted
        return state_from_labels(z, problem.pdat, hyper)

    def step(key, state: State, problem: Problem):
        return sweep(key, state, problem, hyper, prior, kernel)

    def collect(key, state: State, info: Info):
        """The labels, log psi and the statistics (w, theta)'s conditionals read (``run`` draws them on the host and
        computes the log joint from them: ``info.objective`` is not kept, so the chains' program drops it)."""
        return {"z": state.z, "log_psi": state.log_psi, "D": state.D, "c": state.c, "n_agent": state.n_agent,
                "n_changed": info.n_changed}

    return Kernel(init, step, collect=collect, chains="map")


def run(key, problem: Problem, hyper: Config, *, num_warmup: int, num_samples: int, num_chains: int = 1,
        thinning: int = 1, prior: str = "exact", kernel_name: str = "block", z_init=None, progress=None,
        chunk: int = 100):
    """The collapsed chains (``common.run_label_chains``); ``z_init`` (labels per pair) starts every chain. The
    pairs are padded to ``programs.bucket(E)`` (``padded``); the labels returned are the E real pairs'. Each kept
    sweep's (w, theta) are drawn from their conditionals on the host (``common.host_conditionals``, from
    ``np.random.default_rng`` seeded by the words of ``fold_in(key, 2)``). Returns (posterior: z, w, psi, theta
    with leading (chain, draw) axes; stats; the last state)."""
    k = kernel(hyper, prior, kernel_name)
    E = problem.pdat.gs.shape[0]
    problem = padded(problem)
    z0 = first_labels(key, problem, hyper, num_chains, z_init, E)
    # device_put: NumPy leaves would each compile a ``stage`` program in the loop's ``strongly_typed``
    init_state = None if z0 is None else jax.device_put(host_state(z0, problem.pdat, hyper))
    posterior, stats, state = run_label_chains(
        k, problem, key, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains, thinning=thinning,
        init_state=init_state, progress=progress, chunk=chunk, desc="hlcr gibbs")
    const_total = float(np.sum(np.asarray(problem.pdat.const)[np.asarray(problem.real)]))   # padded pairs: none
    stats = {"log_joint_collapsed": host_collapsed_log_joint(posterior["D"], posterior["c"], const_total,
                                                             posterior["n_agent"], posterior["log_psi"], hyper),
             **stats}
    rng = np.random.default_rng(host_keys.words(host_keys.fold_in(key, 2)))
    w, theta = host_conditionals(rng, posterior["D"], posterior["c"], posterior["n_agent"], posterior["log_psi"],
                                 hyper.beta)
    return ({"z": posterior["z"][..., :E], "w": w, "psi": np.exp(posterior["log_psi"]), "theta": theta}, stats,
            state)


def first_labels(key, problem: Problem, hyper: Config, num_chains: int, z_init=None, n_real: int | None = None):
    """Every chain's first labels (num_chains, E) in NumPy: ``z_init`` (the first ``n_real`` pairs) for every
    chain, else the kernel's ``init`` draw z ~ U{1..K} bit for bit (``common.host_uniform_labels`` with the keys
    ``inference.loop.sample_chains`` gives the chains' inits); padded pairs get the label K. None where the keys
    are not JAX's default threefry (the chains' program then draws them itself)."""
    real = np.ones(problem.pdat.gs.shape[0], bool) if problem.real is None else np.asarray(problem.real)
    if z_init is not None:
        z0 = np.full(len(real), hyper.K, np.int32)
        z0[:n_real] = np.asarray(z_init)
        return np.broadcast_to(z0, (num_chains, len(real)))
    if not host_draws.threefry_native():
        return None
    chain_keys = host_keys.words(host_keys.split(host_keys.fold_in(key, 0), num_chains))
    return np.where(real, host_uniform_labels(chain_keys, len(real), hyper.K), hyper.K).astype(np.int32)


def host_state(z, pdat: PairData, hyper: Config) -> State:
    """``state_from_labels`` in NumPy for labels ``z`` (..., E) (the label K, a padded pair's, counted nowhere):
    the chains' first state, built on the host so that the chains' program holds no start of its own."""
    D, c, n_agent = host_label_statistics(z, pdat.Gs, pdat.gs, pdat.agent, hyper.K, hyper.n_agents, hyper.delta)
    z = np.asarray(z, np.int32)
    return State(z, D, c, host_log_normaliser(D, c), n_agent, n_agent.sum(-2),
                 np.full((*z.shape[:-1], hyper.K), -np.log(hyper.K)))


def padded(problem: Problem) -> Problem:
    """``problem`` with its pairs padded to ``programs.bucket(E)`` (copies of the last pair, ``real`` False) and its
    events to ``programs.bucket(M)`` (zeros; a padded pair has none)."""
    *pairs, real = programs.pad_rows(*problem.pdat)
    events = problem.events
    if events is not None:
        X, y = (np.asarray(a) for a in (events.X, events.y))
        X, y, _ = programs.pad_rows(X, y)
        extra = np.zeros(len(real) - len(events.start), np.int32)       # padded pairs: no events
        events = Events(X, y, np.concatenate([np.asarray(events.start), extra]),
                        np.concatenate([np.asarray(events.count), extra]))
    return Problem(PairData(*pairs), events, real > 0)


@register_method("gibbs", kind="sampler", models=("hlcr",), options={
    "num_warmup": Option(200, "nonnegative_int", "sweeps dropped before the kept ones", tiny=5),
    "num_samples": Option(1000, "positive_int", "sweeps kept per chain (after thinning)", tiny=20),
    "num_chains": Option(2, "positive_int", "independent chains", tiny=2),
    "thinning": Option(1, "positive_int", "keep every thinning-th sweep"),
    "prior": Option("exact", "string", "label prior: exact auxiliary-variable psi sampler (notes P1), or the "
                    "paper's approximate eq. (2)", choices=PRIORS),
    "kernel": Option("block", "string", "per-pair block update from sufficient statistics, or the paper's "
                     "per-event rank-one Algorithm 1/2 (same conditionals)", choices=KERNELS),
    "z_init": Option(None, "any", "initial label per pair (default: uniform random)"),
})
def run_gibbs(ctx: FitContext) -> Draws:
    """Collapsed Gibbs for HLCR (w, theta integrated out; exact hierarchical prior by default).

    Options: ``prior="exact"|"paper"`` (label prior: exact auxiliary-variable psi sampler, or the
    paper's approximate eq. 2), ``kernel="block"|"paper"`` (per-pair block update from sufficient
    statistics, or the paper's per-event rank-one Algorithm 1/2), ``z_init`` (initial labels per pair,
    default uniform random). Draws: z, w, psi, theta; sample_stats: collapsed log joint."""
    o = ctx.options
    inputs = ctx.model_kwargs
    pdat = pair_data(inputs)
    hyper = make_config(ctx.hyper, inputs["n_agents"])
    z_init = o["z_init"]
    if z_init is not None:
        z_init = np.asarray(z_init)
        if z_init.shape != (pdat.gs.shape[0],) or z_init.min() < 0 or z_init.max() >= hyper.K:
            raise ValueError(f"z_init: expected {pdat.gs.shape[0]} labels in 0..{hyper.K - 1} (one per pair)")
    events = None
    if o["kernel"] == "paper":
        ps = pair_structure(ctx.data["agent"], ctx.data["entity"])
        events = events_by_pair(ctx.data["X"], ctx.data["y"], ps["pair"], ps["n_pairs"])
    posterior, stats, _ = run(ctx.key, Problem(pdat, events), hyper, num_warmup=o["num_warmup"],
                              num_samples=o["num_samples"], num_chains=o["num_chains"], thinning=o["thinning"],
                              prior=o["prior"], kernel_name=o["kernel"], z_init=z_init, progress=o["progress"])
    return Draws(posterior={k: np.asarray(v) for k, v in posterior.items()},
                 sample_stats={k: np.asarray(v) for k, v in stats.items()},
                 attrs={"prior": o["prior"], "kernel": o["kernel"]})


__all__ = ["Events", "Info", "Problem", "State", "events_by_pair", "kernel", "log_joint", "run",
           "state_from_labels", "sweep"]
