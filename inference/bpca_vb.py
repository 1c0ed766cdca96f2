"""Mean-field VI for Bayesian PCA: centralised VB-EM (``vbem``) and distributed D-MFVI by ADMM over a graph
of nodes (``badmm``); notes ``shared/notes/004_dmfvi_badmm.md`` (N = notes section), paper arXiv 1507.00824.

Variational family (N2.1, paper eq. 14): q(W) = prod_{d,m} N(m^w_dm, v^w_dm) (per entry), q(mu) = prod_d
N(m^mu_d, v^mu_d), q(z_n) = N(m^z_n, Sigma^z_n) (full M x M), and, when learned, q(tau) = Gamma(shape, rate),
q(alpha_m) = Gamma(shape_m, rate_m). O_n = observed entries of row n, O^d = rows observing column d.

One coordinate-ascent sweep (``sweep``; N3.1 with errata E12-E15, E21, E26, E28 fixed), E[.] under q:

1. q(z_n): Lambda_n = I + E[tau] sum_{d in O_n} (m_d m_d^T + diag v_d),  m^z_n = E[tau] Lambda_n^-1 sum_{d in O_n}
   m_d (x_dn - m^mu_d) (paper eqs. 30-33; eq. 32's undefined sum of inverses is diag(sum_d v_d), E15).
2. q(mu_d): precision |O^d| E[tau] + c theta, mean E[tau] sum_{n in O^d} (x_dn - m_d^T m^z_n) / precision.
3. q(w_d): S_d = sum_{n in O^d} E[z z^T], b_d = sum_{n in O^d} (x_dn - m^mu_d) m^z_n;
   m_d = (E[tau] S_d + c diag E[alpha])^-1 E[tau] b_d (exact block update: the row-mean problem is quadratic),
   v_dm = c / (E[tau] (S_d)_mm + c E[alpha_m]).
4. q(alpha_m) = Gamma(a_alpha + D/2, b_alpha + 1/2 sum_d E[w_dm^2]) (N3.6; its mean is shape/rate, not
   shape/(2 rate), E26).
5. q(tau) = Gamma(a_tau + n_obs/(2 c), b_tau + A/(2 c)), A = sum_{(n,d) observed} E[(x_dn - w_d^T z_n - mu_d)^2]
   (n_obs = observed entries, not N D: E28).
6. ELBO (N3.1 step 4) with every constant, the global part weighted by c:
   E log p(x | .) + sum_n [M/2 - 1/2 (|m^z_n|^2 + tr Sigma^z_n) - 1/2 log|Lambda_n|]
   + c [sum_{dm} (1/2 E log alpha_m - 1/2 E alpha_m E w_dm^2 + 1/2 log v^w_dm + 1/2)
        + sum_d (1/2 log theta - 1/2 theta E mu_d^2 + 1/2 log v^mu_d + 1/2) - KL(q(alpha) || p(alpha))]
   - c_tau KL(q(tau) || p(tau)).
   The centralised ELBO (c = 1) is monotone under these updates (test 1) and equals NumPyro's
   ``TraceMeanField_ELBO`` of ``model`` with ``guide`` at the same parameters (test 2).

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

Spaces: z_n is a site of the model, so ``log_q`` (``draw_q``) is the density of the whole q at draws of every model
site (W, mu, z, tau, alpha) and the ELBO is on the model's space (``elbo_final`` for ``vbem``; for ``badmm`` the
closed-form ELBO of the q the draws come from is ``elbo_consensus``, ``elbo_final`` being the sum of the node
objectives, equal to it only at exact consensus). Every parameter of q is stored in group ``variational``.

The centralised sweep IS the node sweep with no neighbours (k = 0, zero duals, c = 1), so ``badmm`` with
J = 1 reproduces ``vbem`` iterate for iterate (test 3).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import xarray as xr
from jax.scipy.special import digamma, gammaln

from inference._methods import Draws, FitContext, register_method
from inference.distributed import Protocol, gossip, make_graph, run_inprocess, run_ray
from inference.progress import progress_enabled
from zoo._validation import factorize

LOG_2PI = float(np.log(2 * np.pi))
PENALTIES = ("quadratic", "kl")
PRIOR_WEIGHTS = ("split", "replicate")
TAU_SHARING = ("consensus", "per-node")
RUNNERS = ("inprocess", "ray")
TAU_RHO = 1.0      # ADMM penalty of the q(tau) averaging (unit curvature)
GUIDE_INIT_SCALE = 0.1   # initial scales of ``guide`` (as NumPyro's autoguides)


# --------------------------------------------------------------------------------------------------
# Data, configuration, state
# --------------------------------------------------------------------------------------------------

class Cfg(NamedTuple):
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
    g: Globals
    tau: jax.Array     # (2,) shape, rate of q(tau) (fixed tau: unused)
    alpha: jax.Array   # (2, M) shape, rate of q(alpha) (fixed alpha: unused)
    mz: jax.Array      # (n, M)
    Sz: jax.Array      # (n, M, M)
    logdet: jax.Array  # (n,) log |Lambda_n|
    elbo: jax.Array    # local (c-weighted) ELBO after the sweep


class VBInfo(NamedTuple):
    elbo: jax.Array


def cfg_from(hyper: dict, D: int, **variant) -> Cfg:
    M = int(hyper["M"])
    alpha = hyper.get("alpha")
    tau = hyper.get("tau")
    return Cfg(M=M, D=D, learn_tau=tau is None, learn_alpha=alpha is None,
               tau=1.0 if tau is None else float(tau),
               alpha=tuple(np.broadcast_to(np.asarray(1.0 if alpha is None else alpha, float), (M,)).tolist()),
               theta=float(hyper["theta"]), a_tau=float(hyper["a_tau"]), b_tau=float(hyper["b_tau"]),
               a_alpha=float(hyper["a_alpha"]), b_alpha=float(hyper["b_alpha"]), **variant)


def shard_of(Y) -> Shard:
    Y = np.asarray(Y, float)
    O = ~np.isnan(Y)
    return Shard(jnp.asarray(np.where(O, Y, 0.0)), jnp.asarray(O, dtype=float), jnp.ones(Y.shape[0]))


def make_shards(Y, node, J: int) -> tuple[Shard, np.ndarray]:
    """Stacked, padded shards (J, n_max, D) and the row index of every slot (J, n_max; -1 = padding)."""
    Y = np.asarray(Y, float)
    node = np.asarray(node, np.int64)
    idx = [np.nonzero(node == j)[0] for j in range(J)]
    n_max = max(len(i) for i in idx)
    D = Y.shape[1]
    X, O, row = np.zeros((J, n_max, D)), np.zeros((J, n_max, D)), np.zeros((J, n_max))
    index = np.full((J, n_max), -1, np.int64)
    for j, rows in enumerate(idx):
        obs = ~np.isnan(Y[rows])
        X[j, :len(rows)] = np.where(obs, Y[rows], 0.0)
        O[j, :len(rows)] = obs
        row[j, :len(rows)] = 1.0
        index[j, :len(rows)] = rows
    return Shard(jnp.asarray(X), jnp.asarray(O), jnp.asarray(row)), index


def init_globals(key: jax.Array, D: int, M: int) -> Globals:
    """m^w = orth(randn(D, M)), v^w = 1, m^mu = 0, v^mu = 1 (N6 defaults; the same on every node)."""
    q, _ = jnp.linalg.qr(jax.random.normal(key, (D, M)))
    return Globals(q, jnp.ones((D, M)), jnp.zeros(D), jnp.ones(D))


def init_state(cfg: Cfg, g0: Globals, n: int) -> VBState:
    """Initial state: q(tau) = q(alpha) = Gamma(1, 1) (mean 1), q(z) = N(0, I) (replaced by the first sweep)."""
    M = cfg.M
    return VBState(g0, jnp.array([1.0, 1.0]), jnp.ones((2, M)), jnp.zeros((n, M)), jnp.tile(jnp.eye(M), (n, 1, 1)),
                   jnp.zeros(n), jnp.asarray(jnp.nan))


# --------------------------------------------------------------------------------------------------
# The closed-form pieces
# --------------------------------------------------------------------------------------------------

def expectations(cfg: Cfg, tau_q, alpha_q):
    """E[tau], E[log tau], E[alpha] (M,), E[log alpha] (M,) (fixed values when not learned)."""
    if cfg.learn_tau:
        Etau, Elogtau = tau_q[0] / tau_q[1], digamma(tau_q[0]) - jnp.log(tau_q[1])
    else:
        Etau, Elogtau = jnp.asarray(cfg.tau), jnp.log(cfg.tau)
    if cfg.learn_alpha:
        Ealpha, Elogalpha = alpha_q[0] / alpha_q[1], digamma(alpha_q[0]) - jnp.log(alpha_q[1])
    else:
        a = jnp.asarray(cfg.alpha)
        Ealpha, Elogalpha = a, jnp.log(a)
    return Etau, Elogtau, Ealpha, Elogalpha


def kl_gamma(s1, r1, s2, r2):
    """KL(Gamma(s1, r1) || Gamma(s2, r2)), shape-rate."""
    return ((s1 - s2) * digamma(s1) - gammaln(s1) + gammaln(s2) + s2 * (jnp.log(r1) - jnp.log(r2))
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


def second_moments(mz, Sz, shard: Shard):
    """S_d = sum_{n in O^d} E[z_n z_n^T] (D, M, M)."""
    Ezz = mz[:, :, None] * mz[:, None, :] + Sz
    return jnp.einsum("nd,nij->dij", shard.O, Ezz)


def expected_sq_residual(g: Globals, mz, S, shard: Shard):
    """A = sum over observed (n, d) of E[(x_dn - w_d^T z_n - mu_d)^2] (bracket of N3.1 step 4)."""
    R = (shard.X - g.mmu) * shard.O
    Q = g.mw[:, :, None] * g.mw[:, None, :] + jax.vmap(jnp.diag)(g.vw)
    n_d = shard.O.sum(0)
    return (jnp.sum(R * R) + jnp.sum(n_d * g.vmu) - 2.0 * jnp.sum(R * (mz @ g.mw.T)) + jnp.sum(Q * S))


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


def _mean_pen(cfg: Cfg, pen, name: str, v_old):
    """(extra precision, extra linear term) the penalty adds to a mean update."""
    k, eta = pen["k"], pen["eta"]
    if cfg.penalty == "quadratic":
        return 2.0 * eta * k, -2.0 * getattr(pen["G"], name) + eta * getattr(pen["anchor"], name)
    return 2.0 * eta * k / v_old, -getattr(pen["g"], name) + eta * getattr(pen["srho"], name) / v_old


def _var_update(cfg: Cfg, pen, mname: str, vname: str, P, prior_prec_c, c, m_new):
    """Variance of a scalar factor with data precision P and (c-weighted) prior precision."""
    k, eta = pen["k"], pen["eta"]
    if cfg.penalty == "quadratic":
        a = 2.0 * eta * k
        b = 0.5 * (P + prior_prec_c) + 2.0 * getattr(pen["G"], vname) - eta * getattr(pen["anchor"], vname)
        return positive_root(a, b, 0.5 * c)
    a = P + prior_prec_c + 2.0 * getattr(pen["g"], vname)
    b = 2.0 * eta * k - c
    srho, srho2 = getattr(pen["srho"], mname), getattr(pen["srho2"], mname)
    cc = eta * (getattr(pen["srho"], vname) + srho2 - 2.0 * m_new * srho + 2.0 * k * m_new**2)
    return positive_root(a, b, cc)


def no_penalty(cfg: Cfg, g: Globals):
    """The penalty of a node without neighbours (centralised VB-EM)."""
    z = jax.tree.map(jnp.zeros_like, g)
    if cfg.penalty == "quadratic":
        return {"k": 0.0, "eta": 0.0, "G": z, "anchor": z}
    return {"k": 0.0, "eta": 0.0, "g": z, "srho": z, "srho2": z}


def sweep(cfg: Cfg, st: VBState, shard: Shard, c, pen, c_tau=None, tau_pen=None) -> VBState:
    """One coordinate-ascent sweep at a node (module docstring steps 1-6), with a consensus penalty."""
    c_tau = c if c_tau is None else c_tau
    g = st.g
    Etau, _, Ealpha, _ = expectations(cfg, st.tau, st.alpha)
    # 1. q(z)
    mz, Sz, logdet = z_step(g, Etau, shard)
    # 2. q(mu)
    n_d = shard.O.sum(0)
    P_mu = Etau * n_d
    L_mu = Etau * jnp.sum(shard.O * (shard.X - mz @ g.mw.T), axis=0)
    prec, lin = _mean_pen(cfg, pen, "mmu", g.vmu)
    mmu = (L_mu + lin) / (P_mu + c * cfg.theta + prec)
    vmu = _var_update(cfg, pen, "mmu", "vmu", P_mu, c * cfg.theta, c, mmu)
    # 3. q(W), row by row (exact block update of the row means, then the per-entry variances)
    S = second_moments(mz, Sz, shard)
    b = ((shard.X - mmu) * shard.O).T @ mz                                           # (D, M)
    prec, lin = _mean_pen(cfg, pen, "mw", g.vw)
    A_rows = Etau * S + jax.vmap(jnp.diag)(c * Ealpha + prec * jnp.ones_like(g.vw))
    mw = jnp.linalg.solve(A_rows, (Etau * b + lin)[..., None])[..., 0]
    P_w = Etau * jnp.diagonal(S, axis1=1, axis2=2)
    vw = _var_update(cfg, pen, "mw", "vw", P_w, c * Ealpha, c, mw)
    g = Globals(mw, vw, mmu, vmu)
    # 4. q(alpha) from this node's copy of q(W) (c cancels)
    alpha = st.alpha
    if cfg.learn_alpha:
        alpha = jnp.stack([jnp.full(cfg.M, cfg.a_alpha + 0.5 * cfg.D),
                           cfg.b_alpha + 0.5 * jnp.sum(mw**2 + vw, axis=0)])
    # 5. q(tau)
    A = expected_sq_residual(g, mz, S, shard)
    tau = st.tau
    if cfg.learn_tau:
        n_obs = jnp.sum(shard.O)
        target = jnp.stack([cfg.a_tau + 0.5 * n_obs / c_tau, cfg.b_tau + 0.5 * A / c_tau])
        tau = target if tau_pen is None else (target - 2.0 * tau_pen["G"] + TAU_RHO * tau_pen["anchor"]) / (
            1.0 + 2.0 * TAU_RHO * tau_pen["k"])
    new = VBState(g, tau, alpha, mz, Sz, logdet, st.elbo)
    return new._replace(elbo=elbo_from(cfg, new, shard, A, c, c_tau))


def elbo_from(cfg: Cfg, st: VBState, shard: Shard, A, c, c_tau):
    """The closed-form ELBO (step 6) of the state, with the expected squared residual ``A`` given."""
    g = st.g
    Etau, Elogtau, Ealpha, Elogalpha = expectations(cfg, st.tau, st.alpha)
    n_obs = jnp.sum(shard.O)
    ell = 0.5 * n_obs * (Elogtau - LOG_2PI) - 0.5 * Etau * A
    trS = jnp.trace(st.Sz, axis1=1, axis2=2)
    zt = jnp.sum(shard.row * (0.5 * cfg.M - 0.5 * (jnp.sum(st.mz**2, 1) + trS) - 0.5 * st.logdet))
    wt = jnp.sum(0.5 * Elogalpha - 0.5 * Ealpha * (g.mw**2 + g.vw) + 0.5 * jnp.log(g.vw) + 0.5)
    mut = jnp.sum(0.5 * jnp.log(cfg.theta) - 0.5 * cfg.theta * (g.mmu**2 + g.vmu) + 0.5 * jnp.log(g.vmu) + 0.5)
    glob = wt + mut
    if cfg.learn_alpha:
        glob = glob - jnp.sum(kl_gamma(st.alpha[0], st.alpha[1], cfg.a_alpha, cfg.b_alpha))
    out = ell + zt + c * glob
    if cfg.learn_tau:
        out = out - c_tau * kl_gamma(st.tau[0], st.tau[1], cfg.a_tau, cfg.b_tau)
    return out


def elbo(cfg: Cfg, st: VBState, shard: Shard, c=1.0, c_tau=None):
    """The closed-form ELBO at arbitrary variational parameters (``st``'s g, tau, alpha, mz, Sz; logdet is
    recomputed from Sz)."""
    st = st._replace(logdet=-jnp.linalg.slogdet(st.Sz)[1])
    S = second_moments(st.mz, st.Sz, shard)
    return elbo_from(cfg, st, shard, expected_sq_residual(st.g, st.mz, S, shard), c, c if c_tau is None else c_tau)


# --------------------------------------------------------------------------------------------------
# Centralised VB-EM (kernel shape: init / step / run)
# --------------------------------------------------------------------------------------------------

def init_key(key: jax.Array) -> jax.Array:
    """The key of the initial W (the same for ``vbem``, ``badmm`` and ``dppca`` with the same seed)."""
    return jax.random.fold_in(key, 0)


def init(cfg: Cfg, shard: Shard, key: jax.Array) -> VBState:
    return init_state(cfg, init_globals(key, cfg.D, cfg.M), shard.X.shape[0])


def step(cfg: Cfg, state: VBState, shard: Shard) -> tuple[VBState, VBInfo]:
    """One centralised sweep = the node sweep with no neighbours and c = 1."""
    new = sweep(cfg, state, shard, 1.0, no_penalty(cfg, state.g), 1.0,
                None if not cfg.learn_tau else {"k": 0.0, "G": jnp.zeros(2), "anchor": jnp.zeros(2)})
    return new, VBInfo(new.elbo)


def run(cfg: Cfg, shard: Shard, key: jax.Array, *, max_iter: int, tol: float, chunk: int = 200,
        progress: bool | None = None, state: VBState | None = None):
    """Sweeps until the relative ELBO change is below ``tol`` or ``max_iter``; returns (state, elbo trace)."""
    from tqdm.auto import tqdm

    st = init(cfg, shard, key) if state is None else state

    def body(carry, _):
        st, done, t = carry

        def adv(c):
            st, _, t = c
            new, info = step(cfg, st, shard)
            rel = jnp.abs(new.elbo - st.elbo) / jnp.abs(new.elbo)
            return (new, (t >= 1) & (rel < tol), t + 1), info.elbo

        def frozen(c):
            return c, jnp.nan
        return jax.lax.cond(done | (t >= max_iter), frozen, adv, carry)

    chunk = max(1, min(chunk, max_iter))
    run_chunk = jax.jit(lambda c: jax.lax.scan(body, c, None, length=chunk))
    carry = (st, jnp.asarray(False), jnp.asarray(0))
    traces = []
    bar = tqdm(total=max_iter, desc="bpca vbem", disable=not progress_enabled(progress), leave=False)
    while True:
        t0 = int(carry[2])
        carry, tr = run_chunk(carry)
        traces.append(np.asarray(tr))
        bar.update(int(carry[2]) - t0)
        if bool(carry[1]) or int(carry[2]) >= max_iter:
            break
    bar.close()
    n = int(carry[2])
    return carry[0], np.concatenate(traces)[:n], bool(carry[1])


# --------------------------------------------------------------------------------------------------
# Distributed D-MFVI: the protocol (pure functions; runners in inference/distributed move the messages)
# --------------------------------------------------------------------------------------------------

class NodeState(NamedTuple):
    vb: VBState
    duals: Any        # quadratic: Globals with a leading slot axis K; kl: edge variables (see _kl_edges)
    tau_duals: jax.Array  # (K, 2) duals of the q(tau) averaging


def message_of(cfg: Cfg, vb: VBState, dual_norm=None) -> dict:
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


def _slot_where(mask, new, old):
    return jax.tree.map(lambda n, o: jnp.where(mask.reshape(mask.shape + (1,) * (n.ndim - 1)), n, o), new, old)


def _slot_sum(mask, x):
    return jnp.sum(jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, 0.0), axis=0)


def make_protocol(cfg: Cfg, graph, *, g0: Globals, eta: float, prior_weight: str, adaptive_eta: bool,
                  tol: float, tol_consensus: float | None) -> Protocol:
    """The D-MFVI protocol on ``graph`` (module docstring). ``g0``: the common initial global parameters."""
    K = graph.max_degree
    route = gossip(graph)
    edges = jnp.asarray(graph.edges) if len(graph.edges) else jnp.zeros((0, 2), jnp.int64)
    J = graph.J
    pairs = jnp.asarray(np.stack(np.triu_indices(J, 1), 1)) if J > 1 else jnp.zeros((0, 2), jnp.int64)
    learn_tau_cons = cfg.learn_tau and cfg.tau_consensus

    def weights(n_active):
        c = 1.0 / n_active if prior_weight == "split" else jnp.asarray(1.0)
        return c, (c if cfg.tau_consensus else jnp.asarray(1.0))

    def init_fn(shard: Shard, key):
        vb = init_state(cfg, g0, shard.X.shape[0])
        if cfg.penalty == "quadratic":
            duals = jax.tree.map(lambda a: jnp.zeros((K,) + a.shape), g0)
        else:
            duals = _kl_edges_init(g0, K)
        st = NodeState(vb, duals, jnp.zeros((K, 2)))
        return st, message_of(cfg, vb, jnp.asarray(0.0) if adaptive_eta else None)

    def local_step(st: NodeState, shard: Shard, inbox, key):
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
            duals = _slot_where(mask, upd, st.duals)
            G = jax.tree.map(lambda d: _slot_sum(mask, d), duals)
            anchor = jax.tree.map(lambda o, n: k * o + _slot_sum(mask, n), own, nbr)
            pen = {"k": k, "eta": eta_t, "G": G, "anchor": anchor}
        else:
            new_edges = {}
            g_lin, srho, srho2 = {}, {}, {}
            for m, v in (("mw", "vw"), ("mmu", "vmu")):
                e_out, e_in = st.duals[m]
                mi, vi, mj, vj = getattr(own, m)[None], getattr(own, v)[None], getattr(nbr, m), getattr(nbr, v)
                o2 = edge_update(mi, vi, mj, vj, e_out, eta_t, cfg.kl_inner)       # edge (i, j)
                i2 = edge_update(mj, vj, mi, vi, e_in, eta_t, cfg.kl_inner)        # edge (j, i)
                o2, i2 = _slot_where(mask, o2, e_out), _slot_where(mask, i2, e_in)
                new_edges[m] = (o2, i2)
                g_lin[m] = _slot_sum(mask, o2[2] - i2[3])       # sum_j gamma_ij1 - gamma_ji2
                g_lin[v] = _slot_sum(mask, o2[4] - i2[5])       # sum_j beta_ij1 - beta_ji2
                srho[m] = _slot_sum(mask, o2[0] + i2[0])
                srho[v] = _slot_sum(mask, o2[1] + i2[1])        # sum of phi over C_i
                srho2[m] = _slot_sum(mask, o2[0] ** 2 + i2[0] ** 2)
                srho2[v] = jnp.zeros_like(srho[v])
            duals = new_edges
            pen = {"k": k, "eta": eta_t, "g": Globals(**g_lin), "srho": Globals(**srho), "srho2": Globals(**srho2)}
        tau_duals, tau_pen = st.tau_duals, None
        if learn_tau_cons:
            nt = inbox["nbr"]["tau"]
            upd = st.tau_duals + 0.5 * TAU_RHO * (vb.tau[None] - nt)
            tau_duals = jnp.where(mask[:, None], upd, st.tau_duals)
            tau_pen = {"k": k, "G": _slot_sum(mask, tau_duals), "anchor": k * vb.tau + _slot_sum(mask, nt)}
        dual_norm = None
        if adaptive_eta:
            lin = [2.0 * x for x in pen["G"]] if cfg.penalty == "quadratic" else list(pen["g"])
            dual_norm = jnp.sqrt(sum(jnp.sum(x**2) for x in lin))
        vb = sweep(cfg, vb, shard, c, pen, c_tau, tau_pen)
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

    def report(st: NodeState, shard):
        return {"elbo": st.vb.elbo}

    def summarize(reports, messages, server, active):
        elbo_node = reports["elbo"]
        total = jnp.sum(jnp.where(active, elbo_node, 0.0))
        if len(graph.edges):
            P = _flat(messages)
            if learn_tau_cons:
                # log E[tau]: tau's scale is the data's (1e10 at the cube's sigma = 1e-5), so its disagreement
                # is measured relatively
                P = jnp.concatenate([P, jnp.log(messages["tau"][:, 0] / messages["tau"][:, 1])[:, None]], 1)
            both = active[edges[:, 0]] & active[edges[:, 1]]
            res = jnp.max(jnp.where(both, jnp.max(jnp.abs(P[edges[:, 0]] - P[edges[:, 1]]), axis=1), 0.0))
            both_p = active[pairs[:, 0]] & active[pairs[:, 1]]
            Q = jax.vmap(_orth)(messages["mw"])
            ang = jax.vmap(lambda a, b: _angle(Q[a], Q[b]))(pairs[:, 0], pairs[:, 1])
            max_angle = jnp.max(jnp.where(both_p, ang, 0.0))
        else:
            res = jnp.asarray(0.0)
            max_angle = jnp.asarray(0.0)
        return {"elbo": total, "elbo_node": elbo_node, "residual": res, "max_angle": max_angle, "eta": server["eta"]}

    def converged(summary, prev, t):
        rel = jnp.abs(summary["elbo"] - prev["elbo"]) / jnp.abs(summary["elbo"])
        ok = rel < tol
        if tol_consensus is not None:
            ok = ok & (summary["residual"] < tol_consensus)
        return ok & (t >= 2)

    return Protocol(init=init_fn, local_step=local_step, aggregate=aggregate, init_server=init_server, report=report,
                    summarize=summarize, converged=converged, graph=graph, name="bpca badmm")


def _orth(A):
    return jnp.linalg.qr(A)[0]


def _angle(Qa, Qb):
    """Largest principal angle (degrees) between orthonormal bases of equal rank (arcsin form)."""
    resid = Qb - Qa @ (Qa.T @ Qb)
    s = jnp.linalg.norm(resid, 2)
    return jnp.rad2deg(jnp.arcsin(jnp.minimum(1.0, s)))


# --------------------------------------------------------------------------------------------------
# Draws from q, and the NumPyro guide of the same family
# --------------------------------------------------------------------------------------------------

def draw_q(cfg: Cfg, key: jax.Array, g: Globals, tau_q, alpha_q, mz, Sz, num_samples: int):
    """``num_samples`` joint draws from q (posterior dict, leading (1, S) axes) and log q at each draw."""
    kw, km, kz, kt, ka = jax.random.split(key, 5)
    S = num_samples
    W = g.mw + jnp.sqrt(g.vw) * jax.random.normal(kw, (S,) + g.mw.shape)
    mu = g.mmu + jnp.sqrt(g.vmu) * jax.random.normal(km, (S,) + g.mmu.shape)
    qz = dist.MultivariateNormal(mz, covariance_matrix=Sz)
    z = qz.sample(kz, (S,))
    log_q = (dist.Normal(g.mw, jnp.sqrt(g.vw)).log_prob(W).sum((1, 2)) + dist.Normal(g.mmu, jnp.sqrt(g.vmu))
             .log_prob(mu).sum(1) + qz.log_prob(z).sum(1))
    post = {"W": W, "mu": mu, "z": z}
    if cfg.learn_tau:
        qt = dist.Gamma(tau_q[0], tau_q[1])
        post["tau"] = qt.sample(kt, (S,))
        log_q = log_q + qt.log_prob(post["tau"])
    if cfg.learn_alpha:
        qa = dist.Gamma(alpha_q[0], alpha_q[1])
        post["alpha"] = qa.sample(ka, (S,))
        log_q = log_q + qa.log_prob(post["alpha"]).sum(1)
    return {k: np.asarray(v)[None] for k, v in post.items()}, np.asarray(log_q)[None]


def guide(X, mask, M, tau=None, alpha=1.0, theta=0.01, a_tau=1e-3, b_tau=1e-3, a_alpha=1e-3, b_alpha=1e-3):
    """NumPyro guide of the MFVI family (per-entry Normal W and mu, full-covariance MVN per z_n, Gamma tau/alpha)
    for ``zoo.bpca.model``: ``TraceMeanField_ELBO`` with it is the closed-form ELBO (test 2), and SVI with it
    optimises the same objective as ``vbem`` (test 14)."""
    N, D = X.shape
    # initial values as NumPyro's autoguides (median of prior draws for W's locations: W = 0 is a saddle point of
    # the ELBO; scales init_scale = 0.1); fitted values are substituted for them in test 2
    W_loc = numpyro.param("W_loc", lambda key: jnp.median(jax.random.normal(key, (15, D, M)), axis=0)
                          * jnp.broadcast_to(jnp.asarray(alpha if alpha is not None else 1.0, float), (M,)) ** -0.5)
    W_scale = numpyro.param("W_scale", jnp.full((D, M), GUIDE_INIT_SCALE), constraint=dist.constraints.positive)
    mu_loc = numpyro.param("mu_loc", jnp.zeros(D))
    mu_scale = numpyro.param("mu_scale", jnp.full(D, GUIDE_INIT_SCALE), constraint=dist.constraints.positive)
    numpyro.sample("mu", dist.Normal(mu_loc, mu_scale).to_event(1))
    if alpha is None:
        sa = numpyro.param("alpha_shape", jnp.ones(M), constraint=dist.constraints.positive)
        ra = numpyro.param("alpha_rate", jnp.ones(M), constraint=dist.constraints.positive)
        numpyro.sample("alpha", dist.Gamma(sa, ra).to_event(1))
    numpyro.sample("W", dist.Normal(W_loc, W_scale).to_event(2))
    if tau is None:
        st = numpyro.param("tau_shape", jnp.asarray(1.0), constraint=dist.constraints.positive)
        rt = numpyro.param("tau_rate", jnp.asarray(1.0), constraint=dist.constraints.positive)
        numpyro.sample("tau", dist.Gamma(st, rt))
    z_loc = numpyro.param("z_loc", jnp.zeros((N, M)))
    z_tril = numpyro.param("z_scale_tril", jnp.tile(GUIDE_INIT_SCALE * jnp.eye(M), (N, 1, 1)),
                           constraint=dist.constraints.lower_cholesky)
    with numpyro.plate("row", N):
        numpyro.sample("z", dist.MultivariateNormal(z_loc, scale_tril=z_tril))


def guide_params(cfg: Cfg, st: VBState) -> dict:
    """The guide's parameters (constrained) at a VB state."""
    p = {"W_loc": st.g.mw, "W_scale": jnp.sqrt(st.g.vw), "mu_loc": st.g.mmu, "mu_scale": jnp.sqrt(st.g.vmu),
         "z_loc": st.mz, "z_scale_tril": jnp.linalg.cholesky(st.Sz)}
    if cfg.learn_tau:
        p["tau_shape"], p["tau_rate"] = st.tau[0], st.tau[1]
    if cfg.learn_alpha:
        p["alpha_shape"], p["alpha_rate"] = st.alpha[0], st.alpha[1]
    return p


# --------------------------------------------------------------------------------------------------
# fit() methods
# --------------------------------------------------------------------------------------------------

def _check_vbem(o):
    pass


def _q_groups(cfg: Cfg, g: Globals, tau_q, alpha_q, mz, Sz) -> dict:
    """Variables of group ``variational``: every parameter of q, so that ``log_q`` and the ELBO can be recomputed
    from the tree: m_W, v_W (feature, component) of q(W_dm) = N(m, v); m_mu, v_mu (feature) of q(mu_d);
    m_z (row, component), S_z (row, component, component_bis) of q(z_n) = N(m_z, S_z); tau_shape, tau_rate and
    alpha_shape, alpha_rate of the Gamma q(tau), q(alpha_m) when learned."""
    ds = {"m_z": (("row", "component"), np.asarray(mz)),
          "S_z": (("row", "component", "component_bis"), np.asarray(Sz)),
          "m_W": (("feature", "component"), np.asarray(g.mw)), "v_W": (("feature", "component"), np.asarray(g.vw)),
          "m_mu": (("feature",), np.asarray(g.mmu)), "v_mu": (("feature",), np.asarray(g.vmu))}
    if cfg.learn_tau:
        ds["tau_shape"], ds["tau_rate"] = ((), np.asarray(tau_q[0])), ((), np.asarray(tau_q[1]))
    if cfg.learn_alpha:
        ds["alpha_shape"] = (("component",), np.asarray(alpha_q[0]))
        ds["alpha_rate"] = (("component",), np.asarray(alpha_q[1]))
    return ds


@register_method("vbem", kind="variational", models=("bpca",), check=_check_vbem,
                 options={"max_iter": 5000, "tol": 1e-8, "num_samples": 1000})
def run_vbem(ctx: FitContext) -> Draws:
    """Centralised mean-field VI (VB-EM) for BPCA with closed-form updates and the ELBO every sweep (notes 3.1)."""
    o = ctx.options
    Y = ctx.data["Y"]
    cfg = cfg_from(ctx.hyper, Y.shape[1])
    shard = shard_of(Y)
    st, trace, conv = run(cfg, shard, init_key(ctx.key), max_iter=o["max_iter"], tol=o["tol"],
                          progress=o["progress"])
    post, log_q = draw_q(cfg, jax.random.fold_in(ctx.key, 2), st.g, st.tau, st.alpha, st.mz, st.Sz,
                         o["num_samples"])
    ds = _q_groups(cfg, st.g, st.tau, st.alpha, st.mz, st.Sz)
    return Draws(posterior=post, sample_stats={"log_q": log_q}, traces={"elbo": trace},
                 groups={"variational": xr.Dataset(ds)},
                 attrs={"elbo_final": float(trace[-1]), "n_iter": len(trace), "converged": int(conv)})


def _check_badmm(o):
    for name, allowed in (("penalty", PENALTIES), ("prior_weight", PRIOR_WEIGHTS), ("tau_sharing", TAU_SHARING),
                          ("runner", RUNNERS), ("on_node_failure", ("raise", "continue"))):
        if o[name] not in allowed:
            raise ValueError(f"{name}: expected one of {list(allowed)}, got {o[name]!r}")
    _check_common(o)
    if not isinstance(o["adaptive_eta"], bool):
        raise ValueError(f"adaptive_eta: expected True or False, got {o['adaptive_eta']!r}")
    if not isinstance(o["kl_inner"], int) or o["kl_inner"] < 1:
        raise ValueError(f"kl_inner: expected a positive integer, got {o['kl_inner']!r}")


def _check_common(o):
    eta = o["eta"]
    if isinstance(eta, bool) or not isinstance(eta, int | float) or not np.isfinite(eta) or eta <= 0:
        raise ValueError(f"eta: expected a positive penalty, got {eta!r}")
    tc = o["tol_consensus"]
    if tc is not None and (isinstance(tc, bool) or not isinstance(tc, int | float) or not tc > 0):
        raise ValueError(f"tol_consensus: expected a positive number or None (no consensus criterion), got {tc!r}")
    nn = o["num_nodes"]
    if nn is not None and (isinstance(nn, bool) or not isinstance(nn, int) or nn < 1):
        raise ValueError(f"num_nodes: expected a positive integer or None (use data['node']), got {nn!r}")
    if not isinstance(o["chunk"], int) or o["chunk"] < 1:
        raise ValueError(f"chunk: expected a positive integer, got {o['chunk']!r}")


def node_assignment(data: dict, num_nodes: int | None, method: str) -> tuple[np.ndarray, int]:
    """(node of every row, J) from ``data['node']`` (labels numbered 0..J-1 in sorted order, ``factorize``) or,
    without it, ``num_nodes`` contiguous shards."""
    N = data["Y"].shape[0]
    if data.get("node") is None:
        if num_nodes is None:
            raise ValueError(f"data['node']: method {method!r} needs the node of every row (integers 0..J-1), "
                             f"or the option num_nodes=J to split the rows into J contiguous shards")
        from zoo.bpca import node_split
        return node_split(N, num_nodes), num_nodes
    node, labels = factorize(data["node"])  # node labels (any integers or strings) -> nodes 0..J-1
    J = len(labels)
    if num_nodes is not None and num_nodes != J:
        raise ValueError(f"num_nodes: {num_nodes} disagrees with data['node'], which has J = {J} nodes")
    return node, J


def run_distributed(protocol: Protocol, shards, key, o, participation=None, callback=None):
    """Run on the chosen runner (``o['runner']``)."""
    if o["runner"] == "ray":
        return run_ray(protocol, shards, key, max_rounds=o["max_iter"], on_node_failure=o["on_node_failure"],
                       participation=participation, callback=callback, progress=o["progress"])
    return run_inprocess(protocol, shards, key, max_rounds=o["max_iter"], participation=participation,
                         chunk=o["chunk"], progress=o["progress"])


def fit_badmm(Y, node, J, hyper, key, o, participation=None, callback=None):
    """D-MFVI on the data; returns (cfg, RunResult, shards, index) (used by ``fit`` and the tests)."""
    D = Y.shape[1]
    cfg = cfg_from(hyper, D, penalty=o["penalty"], tau_consensus=o["tau_sharing"] == "consensus",
                   kl_inner=o["kl_inner"])
    graph = make_graph(o["graph"], J)
    shards, index = make_shards(Y, node, J)
    g0 = init_globals(init_key(key), D, cfg.M)
    proto = make_protocol(cfg, graph, g0=g0, eta=float(o["eta"]), prior_weight=o["prior_weight"],
                          adaptive_eta=o["adaptive_eta"], tol=float(o["tol"]), tol_consensus=o["tol_consensus"])
    res = run_distributed(proto, shards, jax.random.fold_in(key, 1), o, participation, callback)
    return cfg, res, shards, index


def consensus_q(res, cfg: Cfg):
    """The consensus q: node average (over nodes alive at the end) of the global parameters."""
    alive = np.asarray(res.alive)
    g = Globals(*(np.asarray(res.messages[k])[alive].mean(0) for k in ("mw", "vw", "mmu", "vmu")))
    tau = np.asarray(res.states.vb.tau)[alive].mean(0)
    alpha = np.asarray(res.states.vb.alpha)[alive].mean(0)
    return g, tau, alpha


def rows_of(res, index, N):
    """q(z) of every row, from the node that holds it: (m^z (N, M), Sigma^z (N, M, M))."""
    mz_nodes = np.asarray(res.states.vb.mz)
    Sz_nodes = np.asarray(res.states.vb.Sz)
    M = mz_nodes.shape[-1]
    mz, Sz = np.zeros((N, M)), np.tile(np.eye(M), (N, 1, 1))
    valid = index >= 0
    mz[index[valid]] = mz_nodes[valid]
    Sz[index[valid]] = Sz_nodes[valid]
    return mz, Sz


def _distributed_draws(ctx: FitContext, cfg, res, index, extra_attrs):
    o = ctx.options
    N = ctx.data["Y"].shape[0]
    g, tau, alpha = consensus_q(res, cfg)
    mz, Sz = rows_of(res, index, N)
    post, log_q = draw_q(cfg, jax.random.fold_in(ctx.key, 2), Globals(*map(jnp.asarray, g)), jnp.asarray(tau),
                         jnp.asarray(alpha), jnp.asarray(mz), jnp.asarray(Sz), o["num_samples"])
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
    attrs = {"n_iter": res.rounds, "converged": int(res.converged),
             "message_bytes_per_node": res.message_nbytes, "message_floats_per_node": res.message_nbytes // 8,
             "bytes_total": int(h["bytes_sent"].sum()) if len(h.get("bytes_sent", [])) else 0,
             "failures": [list(f) for f in res.failures], **extra_attrs}
    if len(h.get("residual", [])):
        attrs.update({"elbo_final": float(h["elbo"][-1]), "residual_final": float(h["residual"][-1]),
                      "max_angle_final": float(h["max_angle"][-1])})
    # elbo_final sums the node objectives, each at the node's own copy of q; it is the ELBO of the q the draws
    # come from (node average of the globals, every row's q(z_n) from its node) only at exact consensus.
    # elbo_consensus is that q's closed-form ELBO on the whole data (c = 1).
    q_st = VBState(Globals(*map(jnp.asarray, g)), jnp.asarray(tau), jnp.asarray(alpha), jnp.asarray(mz),
                   jnp.asarray(Sz), jnp.zeros(N), jnp.asarray(jnp.nan))
    attrs["elbo_consensus"] = float(elbo(cfg, q_st, shard_of(ctx.data["Y"])))
    return Draws(posterior=post, sample_stats={"log_q": log_q}, traces=traces, dims=dims,
                 groups={"nodes": xr.Dataset(nodes), "variational": xr.Dataset(_q_groups(cfg, g, tau, alpha, mz, Sz))},
                 attrs=attrs)


BADMM_OPTIONS = {"graph": "ring", "eta": 10.0, "penalty": "quadratic", "prior_weight": "split",
                 "adaptive_eta": False, "tau_sharing": "consensus", "max_iter": 2000, "tol": 1e-6,
                 "tol_consensus": 1e-3, "runner": "inprocess", "on_node_failure": "raise", "num_nodes": None,
                 "num_samples": 1000, "chunk": 50, "kl_inner": 3}


@register_method("badmm", kind="variational", models=("bpca",), check=_check_badmm, options=BADMM_OPTIONS)
def run_badmm(ctx: FitContext) -> Draws:
    """D-MFVI: distributed mean-field VI over a graph of nodes by (Bregman) ADMM consensus on the variational
    parameters (notes 3.4-3.5; prior split 1/J per node, erratum E3)."""
    o = ctx.options
    Y = ctx.data["Y"]
    node, J = node_assignment(ctx.data, o["num_nodes"], "badmm")
    make_graph(o["graph"], J)  # validate before compiling
    cfg, res, _, index = fit_badmm(Y, node, J, ctx.hyper, ctx.key, o)
    return _distributed_draws(ctx, cfg, res, index, {"num_nodes": J})
