"""Blocked (uncollapsed) Gibbs sampling for HLCR: every pair's label in parallel (issue 18).

The collapsed kernel (``inference.hlcr.gibbs``) integrates w and theta out, so each pair's label depends on
every other pair's: one sweep is a ``lax.scan`` over the E pairs, ~23 us of latency per pair whatever the
hardware. Here w and theta stay in the state. Given them the labels are conditionally independent across
pairs (the model, ``zoo/hlcr.py``: z_e ~ Cat(theta_{i(e)}), y_e | z_e ~ N(X_e w_{z_e}, sigma^2 I)), and given
the labels w and theta are conjugate. The chain's state is (z, w, theta, psi) and one sweep (``step``) is:

1. labels, all pairs at once (``draw_labels``), from the per-pair sufficient statistics G_e = X_e^T X_e,
   g_e = X_e^T y_e, q_e = y_e^T y_e, n_e (notes §2.3, "sufficient-statistic variant"):

       log p(z_e = k | w, theta, y) = log theta_{i(e)k} + const_e + w_k^T g_e / s^2 - w_k^T G_e w_k / (2 s^2) + c

   with const_e = -n_e/2 log(2 pi s^2) - q_e / (2 s^2). The (E, K) logits are one matrix product of the
   packed statistics [upper triangle of G_e / s^2, g_e / s^2] (E, F(F+1)/2 + F) with per-cluster
   coefficients [-w_ka w_kb (1/2 on the diagonal), w_k]: O(E K F^2) flops in one GEMM, no scan over pairs.
   One uniform per pair draws the label by inverse CDF.
2. the labels' sufficient statistics, one ``segment_sum`` over pairs: D_k = I/delta^2 + sum_{z_e = k} G_e/s^2,
   c_k = sum g_e / s^2, N^(k); agent counts N_i^(k).
3. psi | z with theta integrated out, by the collapsed kernel's auxiliary-variable step (notes P1,
   ``common.antoniak_table_totals`` then ``common.log_dirichlet_from_uniforms``): table counts
   m_ik ~ sum_l Bernoulli(beta psi_k / (beta psi_k + l)), psi ~ Dir(alpha/K + sum_i m_ik).
4. w_k ~ N(D_k^-1 c_k, D_k^-1) (batched Cholesky) and theta_i ~ Dir(beta psi + N_i) given the new psi
   (``common.conditionals_from_uniforms``, the conditionals the collapsed kernel's kept sweeps draw on the host).

A sweep's random numbers are one block of uniforms (``sweep_uniforms``): the Gamma variates of psi and theta
(Marsaglia-Tsang with Box-Muller normals) and w's normals (Box-Muller), then each pair's label and table draw: one
random-bits function in the compiled sweep (benchmarks/results.md, "hlcr_gibbs_sweep"). ``run`` starts the chains
from a state built in NumPy on the host (``host_start``: the labels of ``init`` bit for bit, then (psi, w, theta)
given them from their conditionals), so the chains' program holds no start (a second copy of steps 2-4).

Steps 3-4 are one block update of (psi, theta, w) given z: psi moves by a kernel that leaves p(psi | z, y)
invariant and theta, w are then drawn fresh from p(theta | psi, z) and p(w | z, y), so the sweep leaves the
joint posterior p(z, w, theta, psi | y) invariant; it targets exactly the collapsed kernel's posterior.

``Info.objective`` is the collapsed log joint log p(y | z) + log p(z | psi) + log Dir(psi) of the state
(``common.collapsed_log_joint``; ``run`` computes it for the kept sweeps on the host, ``host_log_joint``): the
same quantity the collapsed kernel reports, so the two kernels' traces (and effective sample sizes) compare directly;
the uncollapsed log joint would carry log Dir(theta_i | beta psi), which is unbounded at the simplex boundary
(``zoo.hlcr.summaries``).

Cost per sweep O(E K F^2 + K F^3 + N K) after one O(events F^2) pass, memory O(E F^2) for the statistics.
When to prefer which kernel (``benchmarks/bench_hlcr_scale.py``; docs/guide/models.md): a blocked sweep is
a handful of dense array operations, so it is several times cheaper than a collapsed one from a few hundred
pairs on; but with w and theta held fixed while the labels move it mixes worse per sweep, and it burns in
much more slowly: a label can move to a cluster only where theta_ik is not negligible, and theta_ik ~
Gamma(beta psi_k + N_ik) underflows for clusters an agent does not use, so merged or split clusters are undone
only by rare moves (from all labels equal on 2,000 agents it stays in the merged state; from random labels it
needs ~10x the collapsed kernel's sweeps to reach the stationary log joint on 5,000 pairs).

The pairs are padded to ``programs.bucket(E)`` (``run``), so data sets of similar size share the compiled chains:
a padded pair (``Problem.real`` False) has the label K, which no statistic, count or table holds, and its const is
not in the log joint; the random numbers of pair e do not depend on the padding, so the real pairs follow the
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
    TINY_LOG,
    Config,
    antoniak_table_totals,
    collapsed_log_joint,
    conditional_keys,
    conditional_normals,
    conditionals_from_uniforms,
    draw_conditionals,
    gamma_keys,
    gamma_normals,
    host_conditionals,
    host_label_statistics,
    host_table_totals,
    host_uniform_labels,
    log_dirichlet_from_uniforms,
    make_config,
    normals,
    pair_data,
    prior_precision,
    run_label_chains,
    sample_log_dirichlet,
    step_uniforms,
)
from inference.uniforms import GAMMA_UNIFORMS, split_uniforms, uniforms_size


class State(NamedTuple):
    z: jax.Array          # (E,) labels
    w: jax.Array          # (K, F) regression weights
    log_theta: jax.Array  # (N, K) log of each agent's cluster proportions
    log_psi: jax.Array    # (K,) log of the global proportions


class Info(NamedTuple):
    objective: jax.Array  # collapsed log joint log p(y, z | psi) + log p(psi) after the sweep
    n_changed: jax.Array  # number of pairs whose label changed in the sweep


class Problem(NamedTuple):
    """What a sweep reads, precomputed once (``problem_from_inputs``).

    stats: (E, P + F + 1) per pair [upper triangle of G_e / s^2 (P = F(F+1)/2, row-major ``triu_indices``),
    g_e / s^2, 1]; const: (E,) -n_e/2 log(2 pi s^2) - q_e / (2 s^2); agent: (E,) agent index of each pair."""

    stats: jax.Array
    const: jax.Array
    agent: jax.Array
    real: jax.Array | None = None   # (E,) bool, False on padded pairs (None: every pair is real)


def problem_from_inputs(inputs: dict) -> Problem:
    """``Problem`` from the model inputs (``zoo.hlcr.model_inputs``): the packed per-pair statistics."""
    pdat = pair_data(inputs)
    F = pdat.gs.shape[-1]
    iu = np.triu_indices(F)
    ones = np.ones((pdat.gs.shape[0], 1))   # NumPy: no JAX operation runs one at a time
    return Problem(np.concatenate([pdat.Gs[:, iu[0], iu[1]], pdat.gs, ones], axis=1), pdat.const, pdat.agent)


def n_features(problem: Problem) -> int:
    """F from the packed width P + F + 1 = F(F+1)/2 + F + 1 (static)."""
    width = problem.stats.shape[-1]
    return int(round((-3 + np.sqrt(9 + 8 * (width - 1))) / 2))


def label_coefficients(w):
    """(P + F + 1, K) coefficients such that ``stats @ coef`` = w_k^T g_e / s^2 - w_k^T G_e w_k / (2 s^2):
    -w_ka w_kb for a < b (each off-diagonal entry stands for two), -w_ka^2 / 2 on the diagonal, then w_k,
    then 0 for the count column."""
    K, F = w.shape
    iu = np.triu_indices(F)
    scale = np.where(iu[0] == iu[1], -0.5, -1.0)
    quad = w[:, iu[0]] * w[:, iu[1]] * scale                                  # (K, P)
    return jnp.concatenate([quad, w, jnp.zeros((K, 1))], axis=1).T


def draw_labels(key, w, log_theta, problem: Problem, u=None):
    """z_e ~ p(z_e | w, theta, y_e) for every pair at once (step 1; inverse CDF, one uniform per pair; ``u``: the
    pairs' uniforms on (0, 1) where the caller draws them with others, ``key`` unused)."""
    logits = problem.stats @ label_coefficients(w) + log_theta[problem.agent]     # (E, K); const_e cancels
    p = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
    cdf = jnp.cumsum(p, axis=-1)
    if u is None:
        u = jax.random.uniform(key, cdf.shape[:1], minval=jnp.finfo(cdf.dtype).tiny)
    u = u * cdf[:, -1]
    z = jnp.minimum(jnp.sum(cdf < u[:, None], axis=-1), w.shape[0] - 1).astype(jnp.int32)
    return _padded_label(z, problem, w.shape[0])


def _padded_label(z, problem: Problem, K: int):
    """``z`` with the label K on padded pairs (none without a mask)."""
    return z if problem.real is None else jnp.where(problem.real, z, K)


def label_statistics(z, problem: Problem, hyper: Config):
    """Step 2: D (K, F, F) including I/delta^2, c (K, F), agent counts N_i^(k) (N, K) of labels ``z``."""
    K, F = hyper.K, n_features(problem)
    sums = jax.ops.segment_sum(problem.stats, z, num_segments=K)                  # (K, P + F + 1)
    iu = np.triu_indices(F)
    P = len(iu[0])
    D = jnp.zeros((K, F, F)).at[:, iu[0], iu[1]].set(sums[:, :P]).at[:, iu[1], iu[0]].set(sums[:, :P])
    real = 1.0 if problem.real is None else problem.real.astype(sums.dtype)      # a padded pair counts 0
    counts = jnp.zeros(hyper.n_agents * K).at[problem.agent * K + jnp.minimum(z, K - 1)].add(
        jnp.broadcast_to(real, z.shape)).reshape(hyper.n_agents, K)
    return D + prior_precision(F, hyper.delta), sums[:, P:P + F], counts


def parameters_given_labels(key, z, log_psi, problem: Problem, hyper: Config):
    """Steps 2-4: (psi, w, theta) given the labels. Returns the new log psi, w, log theta and (D, c, counts)."""
    k_tables, k_psi, k_cond = jax.random.split(key, 3)
    D, c, n_agent = label_statistics(z, problem, hyper)
    # every standard normal of the block (psi's and theta's Gamma proposals, w's noise) through one erf_inv
    k_psi, k_cond = gamma_keys(k_psi), conditional_keys(k_cond)
    x_psi, *drawn = normals(gamma_normals(k_psi, log_psi.shape), *conditional_normals(k_cond, c.shape, n_agent.shape))
    m = antoniak_table_totals(k_tables, z, problem.agent, log_psi, hyper.beta, hyper.K, hyper.n_agents, problem.real)
    log_psi = sample_log_dirichlet(k_psi, hyper.alpha / hyper.K + m, x_psi)
    w, theta = draw_conditionals(k_cond, D, c, n_agent, log_psi, hyper.beta, drawn)
    return log_psi, w, jnp.log(theta), (D, c, n_agent)


def sweep_uniforms(key, problem: Problem, hyper: Config):
    """Every uniform of one sweep from one call (``common.step_uniforms``): psi's Gamma variates (GAMMA_UNIFORMS, K),
    theta's (GAMMA_UNIFORMS, N, K) and w's normals (2, K, F) first, then two per pair (its label, its table draw),
    so pair e's do not depend on the padding."""
    K, N, F = hyper.K, hyper.n_agents, n_features(problem)
    shapes = ((GAMMA_UNIFORMS, K), (GAMMA_UNIFORMS, N, K), (2, K, F))
    fixed, pair = step_uniforms(key, uniforms_size(shapes), problem.const.shape[0], 2)
    return (*split_uniforms(fixed, shapes), pair)


def params_from_uniforms(u_psi, u_theta, u_w, u_tables, z, log_psi, problem: Problem, hyper: Config):
    """Steps 2-4 from the sweep's uniforms (``sweep_uniforms``): the labels' statistics, psi by the table counts,
    then w and theta given the labels and the new psi (``common.conditionals_from_uniforms``). Returns the new log
    psi, w, log theta and (D, c, counts)."""
    D, c, n_agent = label_statistics(z, problem, hyper)
    m = antoniak_table_totals(None, z, problem.agent, log_psi, hyper.beta, hyper.K, hyper.n_agents, problem.real,
                              u=u_tables)
    log_psi = log_dirichlet_from_uniforms(u_psi, hyper.alpha / hyper.K + m)
    w, log_theta = conditionals_from_uniforms(u_w, u_theta, D, c, n_agent, log_psi, hyper.beta)
    return log_psi, w, log_theta, (D, c, n_agent)


def state_from_labels(key, z, problem: Problem, hyper: Config) -> State:
    """A state for labels ``z``: psi uniform, then (psi, w, theta) drawn given z (steps 2-4)."""
    log_psi, w, log_theta, _ = parameters_given_labels(key, z, jnp.full(hyper.K, -jnp.log(hyper.K)), problem,
                                                       hyper)
    return State(z, w, log_theta, log_psi)


def sweep(key, state: State, problem: Problem, hyper: Config):
    """One blocked sweep: labels given (w, theta), then (psi, w, theta) given the labels. ``(State, Info)``."""
    u_psi, u_theta, u_w, u_pair = sweep_uniforms(key, problem, hyper)
    z = draw_labels(None, state.w, state.log_theta, problem, u=u_pair[:, 0])
    log_psi, w, log_theta, (D, c, n_agent) = params_from_uniforms(u_psi, u_theta, u_w, u_pair[:, 1], z,
                                                                  state.log_psi, problem, hyper)
    const = problem.const if problem.real is None else jnp.where(problem.real, problem.const, 0.0)
    objective = collapsed_log_joint(D, c, jnp.sum(const), n_agent, log_psi, hyper)
    return State(z, w, log_theta, log_psi), Info(objective, jnp.sum(z != state.z))


@programs.cached(maxsize=32)
def kernel(hyper: Config) -> Kernel:
    """The blocked kernel for one static configuration (built once, so ``inference.loop`` compiles it once); ``run``
    picks how its chains run (``CHAINS_MAP_MAX_PAIRS``)."""

    def init(key, problem: Problem) -> State:
        k_z, k_params = jax.random.split(key)
        z = jax.random.randint(k_z, problem.const.shape, 0, hyper.K).astype(jnp.int32)   # z ~ U{1..K}
        return state_from_labels(k_params, _padded_label(z, problem, hyper.K), problem, hyper)

    def step(key, state: State, problem: Problem):
        return sweep(key, state, problem, hyper)

    def collect(key, state: State, info: Info):
        """The state and the labels changed; ``run`` computes the log joint on the host (``host_log_joint``), so
        ``info.objective`` is not kept and the chains' program drops it."""
        return {"z": state.z, "w": state.w, "log_psi": state.log_psi, "log_theta": state.log_theta,
                "n_changed": info.n_changed}

    return Kernel(init, step, collect=collect)


CHAINS_MAP_MAX_PAIRS = 512
"""Up to this many (padded) pairs ``run`` steps the chains one after another (``chains="map"``), above it batched
(``"vmap"``): the batched sweep takes about twice as long to compile, and the mapped one runs slower where a
sweep's dense operations over many pairs gain from the batch (benchmarks/results.md, "hlcr_gibbs_host")."""


def run(key, problem: Problem, hyper: Config, *, num_warmup: int, num_samples: int, num_chains: int = 1,
        thinning: int = 1, z_init=None, progress=None, chunk: int = 100):
    """The blocked chains (``common.run_label_chains``; one after another in each sweep up to
    ``CHAINS_MAP_MAX_PAIRS`` padded pairs, else batched); ``z_init`` (labels per pair) starts every chain, its
    (psi, w, theta) drawn given those labels. The pairs are padded to ``programs.bucket(E)``; the labels returned
    are the E real pairs'."""
    k_init, k_run = host_keys.parts(key)
    E = problem.const.shape[0]
    stats, const, agent, mask = programs.pad_rows(problem.stats, problem.const, problem.agent)
    k = kernel(hyper)._replace(chains="map" if len(mask) <= CHAINS_MAP_MAX_PAIRS else "vmap")
    problem = Problem(stats, const, agent, mask > 0)
    init_state = host_start(k_init, k_run, problem, hyper, num_chains, z_init)
    posterior, stats, state = run_label_chains(
        k, problem, k_run, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains, thinning=thinning,
        init_state=init_state, progress=progress, chunk=chunk, desc="hlcr gibbs_blocked")
    stats = {"log_joint_collapsed": host_log_joint(posterior["z"], posterior["log_psi"], problem, hyper), **stats}
    return ({"z": posterior["z"][..., :E], "w": posterior["w"], "psi": np.exp(posterior["log_psi"]),
             "theta": np.exp(posterior["log_theta"])}, stats, state)


def _host_pair_statistics(problem: Problem):
    """G_e / s^2 (E, F, F) and g_e / s^2 (E, F) unpacked from ``problem.stats`` (NumPy)."""
    F = n_features(problem)
    iu = np.triu_indices(F)
    P = len(iu[0])
    stats = np.asarray(problem.stats)
    Gs = np.zeros((stats.shape[0], F, F))
    Gs[:, iu[0], iu[1]] = stats[:, :P]
    Gs[:, iu[1], iu[0]] = stats[:, :P]
    return Gs, stats[:, P:P + F]


def host_log_joint(z, log_psi, problem: Problem, hyper: Config, block: int = 256):
    """The collapsed log joint (``sweep``'s ``Info.objective``: ``common.collapsed_log_joint``) of kept labels ``z``
    (..., E) (the label K on padded pairs) and ``log_psi`` (..., K), in NumPy on the host
    (``common.host_label_statistics``, ``common.host_collapsed_log_joint``), ``block`` draws at a time (memory
    O(block E K))."""
    from inference.hlcr.common import host_collapsed_log_joint

    z = np.asarray(z)
    lead = z.shape[:-1]
    z, log_psi = z.reshape(-1, z.shape[-1]), np.asarray(log_psi).reshape(-1, hyper.K)
    Gs, gs = _host_pair_statistics(problem)
    real = np.ones(len(gs), bool) if problem.real is None else np.asarray(problem.real)
    const_total = float(np.sum(np.asarray(problem.const)[real]))
    out = np.empty(len(z))
    for lo in range(0, len(z), block):
        D, c, n_agent = host_label_statistics(z[lo:lo + block], Gs, gs, problem.agent, hyper.K, hyper.n_agents,
                                              hyper.delta)
        out[lo:lo + block] = host_collapsed_log_joint(D, c, const_total, n_agent, log_psi[lo:lo + block], hyper)
    return out.reshape(lead)


def host_start(k_init, k_run, problem: Problem, hyper: Config, num_chains: int, z_init=None):
    """Every chain's first state (leading chain axis), in NumPy on the host, so that the chains' program holds no
    start of its own: chain c's labels are ``z_init`` (the real pairs'; chain keys ``split(k_init, num_chains)``) or
    the kernel's ``init`` draw z ~ U{1..K} bit for bit (``common.host_uniform_labels``, chain keys those
    ``inference.loop.sample_chains`` gives the inits of the chains run from ``k_run``), padded pairs the label K;
    then (psi, w, theta) given the labels as ``state_from_labels`` draws them (psi uniform, then the table counts,
    psi, w and theta from their conditionals: ``common.host_table_totals``, ``host_draws.log_dirichlet_variates``,
    ``common.host_conditionals``), from ``np.random.default_rng`` seeded by the words of the chain key's
    ``fold_in(., 1)`` (other random numbers than the kernel's ``init``, the same law). None where the keys are not
    JAX's default threefry and no ``z_init`` is given (the program's ``init`` then starts the chains)."""
    real = np.asarray(problem.real)
    E = len(real)
    if z_init is None and not host_draws.threefry_native():
        return None
    chain_keys = host_keys.split(k_init if z_init is not None else host_keys.fold_in(k_run, 0), num_chains)
    words = host_keys.words(chain_keys)
    if z_init is None:
        z0 = host_uniform_labels(host_draws.threefry_split(words)[:, 0], E, hyper.K)
    else:
        z0 = np.zeros((num_chains, E), np.int64)
        z0[:, :int(real.sum())] = np.asarray(z_init)
    z0 = np.where(real, z0, hyper.K).astype(np.int32)
    Gs, gs = _host_pair_statistics(problem)
    D, c, n_agent = host_label_statistics(z0, Gs, gs, problem.agent, hyper.K, hyper.n_agents, hyper.delta)
    uniform = np.full(hyper.K, -np.log(hyper.K))
    log_psi, w, log_theta = [], [], []
    for ch in range(num_chains):
        rng = np.random.default_rng(host_keys.words(host_keys.fold_in(host_keys.wrap(words[ch]), 1)))
        m = host_table_totals(rng, z0[ch], problem.agent, uniform, hyper.beta, hyper.K, hyper.n_agents)
        lp = host_draws.log_dirichlet_variates(rng, hyper.alpha / hyper.K + m, (hyper.K,), floor=TINY_LOG)
        wc, theta = host_conditionals(rng, D[ch], c[ch], n_agent[ch], lp, hyper.beta)
        log_psi.append(lp)
        w.append(wc)
        log_theta.append(np.log(theta))
    # device_put: NumPy leaves would each compile a ``stage`` program in the loop's ``strongly_typed``
    return jax.device_put(State(z0, np.stack(w), np.stack(log_theta), np.stack(log_psi)))


@register_method("gibbs_blocked", kind="sampler", models=("hlcr",), options={
    "num_warmup": Option(500, "nonnegative_int", "sweeps dropped before the kept ones", tiny=5),
    "num_samples": Option(2000, "positive_int", "sweeps kept per chain (after thinning)", tiny=20),
    "num_chains": Option(2, "positive_int", "independent chains", tiny=2),
    "thinning": Option(1, "positive_int", "keep every thinning-th sweep"),
    "z_init": Option(None, "any", "initial label per pair (default: uniform random)"),
})
def run_gibbs_blocked(ctx: FitContext) -> Draws:
    """Blocked Gibbs for HLCR: all pair labels in parallel given (w, theta), then (psi, w, theta) given the
    labels (w, theta explicit; psi by the exact auxiliary-variable step). Exact MCMC for the same posterior as
    ``gibbs``; cheaper sweeps, more of them needed when clusters overlap.

    Options: ``z_init`` (initial labels per pair, default uniform random). Draws: z, w, psi, theta;
    sample_stats: collapsed log joint (the same quantity as ``gibbs``), labels changed per sweep."""
    o = ctx.options
    inputs = ctx.model_kwargs
    hyper = make_config(ctx.hyper, inputs["n_agents"])
    E = inputs["g"].shape[0]
    z_init = o["z_init"]
    if z_init is not None:
        z_init = np.asarray(z_init)
        if z_init.shape != (E,) or not np.issubdtype(z_init.dtype, np.integer) or z_init.min() < 0 \
                or z_init.max() >= hyper.K:
            raise ValueError(f"z_init: expected {E} integer labels in 0..{hyper.K - 1} (one per pair)")
    posterior, stats, _ = run(ctx.key, problem_from_inputs(inputs), hyper, num_warmup=o["num_warmup"],
                              num_samples=o["num_samples"], num_chains=o["num_chains"], thinning=o["thinning"],
                              z_init=z_init, progress=o["progress"])
    return Draws(posterior={k: np.asarray(v) for k, v in posterior.items()},
                 sample_stats={k: np.asarray(v) for k, v in stats.items()}, attrs={"prior": "exact"})


__all__ = ["Info", "Problem", "State", "draw_labels", "kernel", "label_coefficients", "label_statistics",
           "problem_from_inputs", "run", "state_from_labels", "sweep"]
