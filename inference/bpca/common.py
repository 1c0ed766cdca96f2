"""Bayesian PCA, mean-field family: the pieces shared by ``vbem``, ``badmm`` and ``dppca`` (data shards, q and its
moments, the sweep's closed-form pieces, the closed-form ELBO, draws from q); notes
``docs/papers/dmfvi.md`` (N = notes section), paper arXiv 1507.00824.

Variational family (N2.1, paper eq. 14): q(W) = prod_{d,m} N(m^w_dm, v^w_dm) (per entry), q(mu) = prod_d
N(m^mu_d, v^mu_d), q(z_n) = N(m^z_n, Sigma^z_n) (full M x M), and, when learned, q(tau) = Gamma(shape, rate),
q(alpha_m) = Gamma(shape_m, rate_m). O_n = observed entries of row n, O^d = rows observing column d.

ELBO (N3.1 step 4) with every constant, the global part weighted by c (c = 1 centralised, 1/J per node of
``badmm``, erratum E3):
   E log p(x | .) + sum_n [M/2 - 1/2 (|m^z_n|^2 + tr Sigma^z_n) - 1/2 log|Lambda_n|]
   + c [sum_{dm} (1/2 E log alpha_m - 1/2 E alpha_m E w_dm^2 + 1/2 log v^w_dm + 1/2)
        + sum_d (1/2 log theta - 1/2 theta E mu_d^2 + 1/2 log v^mu_d + 1/2) - KL(q(alpha) || p(alpha))]
   - c_tau KL(q(tau) || p(tau)).
It equals NumPyro's ``TraceMeanField_ELBO`` of ``zoo.bpca.model`` with ``inference.bpca.guide.guide`` at the
same parameters (test 2).

Spaces: z_n is a site of the model, so ``log_q`` (``draw``) is the density of the whole q at draws of every
model site (W, mu, z, tau, alpha) and the ELBO is on the model's space. Every parameter of q is stored in group
``variational`` (``q_groups``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import scipy.special as ssp

from inference import host_draws as hd
from inference import host_keys, programs

LOG_2PI = float(np.log(2 * np.pi))


class Config(NamedTuple):
    """Static configuration (model hyperparameters and variant); closed over, never traced."""

    M: int
    D: int
    learn_tau: bool
    learn_alpha: bool
    tau: float               # fixed tau (unused if learned)
    alpha: tuple             # fixed alpha per column (unused if learned)
    theta: float
    a_tau: float
    b_tau: float
    a_alpha: float
    b_alpha: float
    penalty: str = "quadratic"
    tau_consensus: bool = True
    kl_inner: int = 3


class Shard(NamedTuple):
    """One node's data: ``X`` (n, D) with missing entries 0, ``O`` (n, D) 1 = observed, ``row`` (n,) 1 = a real
    row (0 = padding, so shards of different sizes stack)."""

    X: jax.Array
    O: jax.Array
    row: jax.Array


class Globals(NamedTuple):
    """The global variational parameters (what consensus acts on)."""

    mw: jax.Array     # (D, M) means of q(W)
    vw: jax.Array     # (D, M) variances of q(W)
    mmu: jax.Array    # (D,) means of q(mu)
    vmu: jax.Array    # (D,) variances of q(mu)


class VBState(NamedTuple):
    """The state of a node's (or the centralised) coordinate ascent: q and the ELBO after the sweep."""

    g: Globals
    tau: jax.Array     # (2,) shape, rate of q(tau) (fixed tau: unused)
    alpha: jax.Array   # (2, M) shape, rate of q(alpha) (fixed alpha: unused)
    mz: jax.Array      # (n, M)
    Sz: jax.Array      # (n, M, M)
    logdet: jax.Array  # (n,) log |Lambda_n|
    elbo: jax.Array    # local (c-weighted) ELBO after the sweep


class Q(NamedTuple):
    """A q of the family (module docstring): the global factors, q(tau) and q(alpha) (shape, rate; None when
    the model fixes them) and every row's q(z_n)."""

    g: Globals
    tau: jax.Array | None     # (2,) shape, rate
    alpha: jax.Array | None   # (2, M) shape, rate
    mz: jax.Array             # (N, M)
    Sz: jax.Array             # (N, M, M)


def q_of(cfg: Config, g: Globals, tau, alpha, mz, Sz) -> Q:
    """The q of a state (``tau`` / ``alpha`` dropped when fixed by the model)."""
    return Q(g, tau if cfg.learn_tau else None, alpha if cfg.learn_alpha else None, mz, Sz)


def cfg_from(hyper: dict, D: int, **variant) -> Config:
    M = int(hyper["M"])
    alpha = hyper.get("alpha")
    tau = hyper.get("tau")
    return Config(M=M, D=D, learn_tau=tau is None, learn_alpha=alpha is None,
               tau=1.0 if tau is None else float(tau),
               alpha=tuple(np.broadcast_to(np.asarray(1.0 if alpha is None else alpha, float), (M,)).tolist()),
               theta=float(hyper["theta"]), a_tau=float(hyper["a_tau"]), b_tau=float(hyper["b_tau"]),
               a_alpha=float(hyper["a_alpha"]), b_alpha=float(hyper["b_alpha"]), **variant)


def shard_of(Y) -> Shard:
    Y = np.asarray(Y, float)
    O = ~np.isnan(Y)
    return Shard(np.where(O, Y, 0.0), O.astype(float), np.ones(Y.shape[0]))


def padded_shard(shard: Shard, size: int | None = None) -> Shard:
    """``shard`` with rows added up to ``size`` (default ``programs.bucket(n)``, so data sets of similar size share
    the compiled programs): a padded row observes nothing (``O = 0``) and has ``row = 0``, so it adds nothing to a
    sweep's statistics, to n_obs or to the ELBO."""
    n = shard.X.shape[0]
    size = programs.bucket(n) if size is None else size
    extra = lambda a: np.concatenate([np.asarray(a, float), np.zeros((size - n, *np.shape(a)[1:]))])  # noqa: E731
    return Shard(extra(shard.X), extra(shard.O), extra(shard.row))


def init_globals(key: jax.Array, D: int, M: int) -> Globals:
    """m^w = orth(randn(D, M)), v^w = 1, m^mu = 0, v^mu = 1 (N6 defaults; the same on every node)."""
    q, _ = jnp.linalg.qr(jax.random.normal(key, (D, M)))
    return Globals(q, jnp.ones((D, M)), jnp.zeros(D), jnp.ones(D))


def start_words(key: jax.Array) -> np.ndarray:
    """The key of the common start (``init_key(key)``) as host words, to hand to every node of a distributed run:
    the nodes derive the same start from it inside the run's program (``globals_from_words``), so the start costs
    no program of its own and stays an argument (fits with other seeds reuse the run)."""
    return host_keys.words(init_key(key))


def globals_from_words(words, D: int, M: int) -> Globals:
    """``init_globals`` of the key whose data are ``words`` (traced inside the run's program)."""
    return init_globals(jax.random.wrap_key_data(words), D, M)


def init_state(cfg: Config, g0: Globals, n: int) -> VBState:
    """Initial state: q(tau) = q(alpha) = Gamma(1, 1) (mean 1), q(z) = N(0, I) (replaced by the first sweep)."""
    M = cfg.M
    return VBState(g0, jnp.array([1.0, 1.0]), jnp.ones((2, M)), jnp.zeros((n, M)), jnp.tile(jnp.eye(M), (n, 1, 1)),
                   jnp.zeros(n), jnp.asarray(jnp.nan))


def init_key(key: jax.Array) -> jax.Array:
    """The key of the initial W (the same for ``vbem``, ``badmm`` and ``dppca`` with the same seed)."""
    return host_keys.fold_in(key, 0)


def _special(xp):
    """The special functions of the array namespace ``xp``: ``jax.scipy.special`` inside the compiled sweeps,
    ``scipy.special`` for the one-shot ELBO of a fit's q on the host (``elbo_of``)."""
    return jsp if xp is jnp else ssp


def expectations(cfg: Config, tau_q, alpha_q, xp=jnp):
    """E[tau], E[log tau], E[alpha] (M,), E[log alpha] (M,) (fixed values when not learned)."""
    digamma = _special(xp).digamma
    if cfg.learn_tau:
        Etau, Elogtau = tau_q[0] / tau_q[1], digamma(tau_q[0]) - xp.log(tau_q[1])
    else:
        Etau, Elogtau = xp.asarray(cfg.tau), xp.log(cfg.tau)
    if cfg.learn_alpha:
        Ealpha, Elogalpha = alpha_q[0] / alpha_q[1], digamma(alpha_q[0]) - xp.log(alpha_q[1])
    else:
        a = xp.asarray(cfg.alpha)
        Ealpha, Elogalpha = a, xp.log(a)
    return Etau, Elogtau, Ealpha, Elogalpha


def kl_gamma(s1, r1, s2, r2, xp=jnp):
    """KL(Gamma(s1, r1) || Gamma(s2, r2)), shape-rate."""
    sp = _special(xp)
    return ((s1 - s2) * sp.digamma(s1) - sp.gammaln(s1) + sp.gammaln(s2) + s2 * (xp.log(r1) - xp.log(r2))
            + s1 * (r2 - r1) / r1)


def z_step(g: Globals, Etau, shard: Shard):
    """q(z_n) for every row (step 1): (m^z (n, M), Sigma^z (n, M, M), log|Lambda_n| (n,))."""
    M = g.mw.shape[1]
    Q = g.mw[:, :, None] * g.mw[:, None, :] + jax.vmap(jnp.diag)(g.vw)             # (D, M, M) E[w_d w_d^T]
    Lam = jnp.eye(M) + Etau * jnp.einsum("nd,dij->nij", shard.O, Q)
    L = jnp.linalg.cholesky(Lam)
    Sz = jax.vmap(lambda l: jax.scipy.linalg.cho_solve((l, True), jnp.eye(M)))(L)
    h = Etau * (((shard.X - g.mmu) * shard.O) @ g.mw)                               # (n, M)
    mz = jnp.einsum("nij,nj->ni", Sz, h)
    logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=1, axis2=2)), axis=1)
    return mz, Sz, logdet


def second_moments(mz, Sz, shard: Shard, xp=jnp):
    """S_d = sum_{n in O^d} E[z_n z_n^T] (D, M, M)."""
    Ezz = mz[:, :, None] * mz[:, None, :] + Sz
    return xp.einsum("nd,nij->dij", shard.O, Ezz)


def expected_sq_residual(g: Globals, mz, S, shard: Shard, xp=jnp):
    """A = sum over observed (n, d) of E[(x_dn - w_d^T z_n - mu_d)^2] (bracket of N3.1 step 4)."""
    R = (shard.X - g.mmu) * shard.O
    n_d = shard.O.sum(0)
    # sum_d tr(E[w_d w_d^T] S_d), E[w_d w_d^T] = m_d m_d^T + diag(v_d)
    wSw = xp.einsum("dm,dmk,dk->", g.mw, S, g.mw) + xp.sum(g.vw * xp.diagonal(S, axis1=1, axis2=2))
    return xp.sum(R * R) + xp.sum(n_d * g.vmu) - 2.0 * xp.sum(R * (mz @ g.mw.T)) + wSw


def positive_root(a, b, c):
    """Root of a x^2 + b x - c = 0 (c >= 0) by the notes' rule: the positive root when a >= 0, the smaller
    positive root when a < 0 (erratum E23; a naive larger root picks a local maximum). Computed without
    cancellation.

    No real root (a < 0, b^2 + 4 a c < 0; only in the ``penalty="kl"`` variance steps, whose duals are linear in
    the variance): the subproblem is unbounded below (its derivative (a x^2 + b x - c) / (2 x^2) < 0 for all
    x > 0) and has no minimiser; we return the vertex -b / (2 a), the real part of the complex root pair, where
    the derivative is closest to 0. (Clipping the discriminant to 0 instead returned 2 c / b, a large
    variance: on LR20, ring J = 5, this fired at every node from round 2 and the KL variant diverged at
    eta = 10, NaN from round 18; with the vertex it reaches residual 4.5e-4 in 800 rounds, the notes'
    prototype's 5e-4.) The quadratic penalty (a = 2 eta k >= 0) never has a negative discriminant."""
    disc = b * b + 4.0 * a * c
    s = jnp.sqrt(jnp.maximum(disc, 0.0))
    safe_a = jnp.where(a == 0, 1.0, a)
    root = jnp.where(b > 0, 2.0 * c / jnp.where(b > 0, b + s, 1.0), (s - b) / (2.0 * safe_a))
    return jnp.where(disc < 0, -b / (2.0 * safe_a), root)


def elbo_from(cfg: Config, st: VBState, shard: Shard, A, c, c_tau, xp=jnp):
    """The closed-form ELBO (step 6) of the state, with the expected squared residual ``A`` given (``xp``: the
    array namespace, ``jax.numpy`` in the sweeps, ``numpy`` in ``elbo_of``)."""
    g = st.g
    Etau, Elogtau, Ealpha, Elogalpha = expectations(cfg, st.tau, st.alpha, xp)
    n_obs = xp.sum(shard.O)
    ell = 0.5 * n_obs * (Elogtau - LOG_2PI) - 0.5 * Etau * A
    trS = xp.trace(st.Sz, axis1=1, axis2=2)
    zt = xp.sum(shard.row * (0.5 * cfg.M - 0.5 * (xp.sum(st.mz**2, 1) + trS) - 0.5 * st.logdet))
    wt = xp.sum(0.5 * Elogalpha - 0.5 * Ealpha * (g.mw**2 + g.vw) + 0.5 * xp.log(g.vw) + 0.5)
    mut = xp.sum(0.5 * xp.log(cfg.theta) - 0.5 * cfg.theta * (g.mmu**2 + g.vmu) + 0.5 * xp.log(g.vmu) + 0.5)
    glob = wt + mut
    if cfg.learn_alpha:
        glob = glob - xp.sum(kl_gamma(st.alpha[0], st.alpha[1], cfg.a_alpha, cfg.b_alpha, xp))
    out = ell + zt + c * glob
    if cfg.learn_tau:
        out = out - c_tau * kl_gamma(st.tau[0], st.tau[1], cfg.a_tau, cfg.b_tau, xp)
    return out


def elbo(cfg: Config, st: VBState, shard: Shard, c=1.0, c_tau=None, xp=jnp):
    """The closed-form ELBO at arbitrary variational parameters (``st``'s g, tau, alpha, mz, Sz; logdet is
    recomputed from Sz)."""
    st = st._replace(logdet=-xp.linalg.slogdet(st.Sz)[1])
    S = second_moments(st.mz, st.Sz, shard, xp)
    A = expected_sq_residual(st.g, st.mz, S, shard, xp)
    return elbo_from(cfg, st, shard, A, c, c if c_tau is None else c_tau, xp)

def elbo_of(cfg: Config, q: Q, shard: Shard) -> float:
    """The centralised (c = 1) closed-form ELBO of a q on the whole data, in NumPy and SciPy (``elbo`` with
    ``xp=numpy``): it runs once per fit, where a compiled program would cost more to build than to run."""
    q = jax.tree.map(lambda a: np.asarray(a, float), jax.device_get(q))
    tau = q.tau if q.tau is not None else np.ones(2)
    alpha = q.alpha if q.alpha is not None else np.ones((2, cfg.M))
    shard = Shard(*(np.asarray(a, float) for a in shard))
    st = VBState(q.g, tau, alpha, q.mz, q.Sz, np.zeros(q.mz.shape[0]), np.asarray(np.nan))
    return float(elbo(cfg, st, shard, xp=np))


# --------------------------------------------------------------------------------------------------
# Draws from q, and q as a group of the tree
# --------------------------------------------------------------------------------------------------

def draw(seed, q: Q, n: int):
    """``n`` joint draws from q (dict site -> (n, ...)) and log q at each draw (n,), in NumPy from
    ``np.random.default_rng(seed)`` (``inference.host_draws``: a one-shot job, not worth compiling)."""
    rng = np.random.default_rng(seed)
    q = jax.tree.map(np.asarray, jax.device_get(q))
    g = q.g
    sw, smu = np.sqrt(g.vw), np.sqrt(g.vmu)
    W = g.mw + sw * rng.standard_normal((n, *g.mw.shape))
    mu = g.mmu + smu * rng.standard_normal((n, *g.mmu.shape))
    Lz = np.linalg.cholesky(q.Sz)
    z = hd.mvn_variates(rng, q.mz, Lz, (n,))
    log_q = (hd.normal_log_pdf(W, g.mw, sw).sum((1, 2)) + hd.normal_log_pdf(mu, g.mmu, smu).sum(1)
             + hd.mvn_tril_log_pdf(z, q.mz, Lz).sum(1))
    post = {"W": W, "mu": mu, "z": z}
    if q.tau is not None:
        post["tau"] = np.exp(hd.log_gamma_variates(rng, q.tau[0], (n,))) / q.tau[1]
        log_q = log_q + hd.gamma_log_pdf(post["tau"], q.tau[0], q.tau[1])
    if q.alpha is not None:
        post["alpha"] = np.exp(hd.log_gamma_variates(rng, q.alpha[0], (n, *q.alpha[0].shape))) / q.alpha[1]
        log_q = log_q + hd.gamma_log_pdf(post["alpha"], q.alpha[0], q.alpha[1]).sum(1)
    return post, log_q


def q_groups(q: Q) -> dict:
    """Variables of group ``variational``: every parameter of q, so that ``log_q`` and the ELBO can be recomputed
    from the tree: m_W, v_W (feature, component) of q(W_dm) = N(m, v); m_mu, v_mu (feature) of q(mu_d);
    m_z (row, component), S_z (row, component, component_bis) of q(z_n) = N(m_z, S_z); tau_shape, tau_rate and
    alpha_shape, alpha_rate of the Gamma q(tau), q(alpha_m) when learned."""
    q = jax.device_get(q)
    g = q.g
    ds = {"m_z": (("row", "component"), np.asarray(q.mz)),
          "S_z": (("row", "component", "component_bis"), np.asarray(q.Sz)),
          "m_W": (("feature", "component"), np.asarray(g.mw)), "v_W": (("feature", "component"), np.asarray(g.vw)),
          "m_mu": (("feature",), np.asarray(g.mmu)), "v_mu": (("feature",), np.asarray(g.vmu))}
    if q.tau is not None:
        ds["tau_shape"], ds["tau_rate"] = ((), np.asarray(q.tau[0])), ((), np.asarray(q.tau[1]))
    if q.alpha is not None:
        ds["alpha_shape"] = (("component",), np.asarray(q.alpha[0]))
        ds["alpha_rate"] = (("component",), np.asarray(q.alpha[1]))
    return ds
