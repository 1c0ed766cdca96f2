"""VB-EM for the Bayesian mixture of PPCA (VBMPPCA, Bruneau, Gelgon & Picarougne 2013, sec. 4.3 and appendix
A), vectorised over components, as a kernel run by ``inference.loop``; paper page ``docs/papers/mppca.md``
(N<section>). The family, the M step and the bound are in ``inference.mppca.common``.

One sweep (``sweep``, the kernel's ``step``; order alpha, (X, Z), statistics, mu, Lambda, nu, tau; each step is an
exact coordinate ascent step, so the bound F never decreases):

* X/Z (eq. 53, corrected, erratum E4):  Sx_k = (I + E tau EL_k)^-1,  EL_k = d SL_k + M_k^T M_k,
  m_nk = E tau Sx_k M_k^T (y_n - m_mu_k),
  ln rho_nk = E ln omega_k - 1/2 tr(Sx_k + m m^T) + **1/2 ln|Sx_k|**
              - E tau/2 [|y|^2 + E|mu_k|^2 - 2 y^T m_mu_k - 2 (y - m_mu_k)^T M_k m_nk + tr(EL_k (Sx_k + m m^T))].
  The paper (and VBmix) omit +1/2 ln|Sx_k|, the entropy of q(x | z = k); then the Z step is not the coordinate
  optimum and the bound can decrease (what the paper's sec. 7 blames on "coupled moments").
  ``paper_literal=True`` reproduces the omission (tests only).
* statistics (eq. 54), then the M step (eq. 55) and tau of ``common``; ``Info.objective`` is the bound F (N3.3)
  after the sweep.

Initialisation (``init``): k-means (random distinct rows as centres, Lloyd iterations) then per-cluster PCA for
M_k (a non-zero M is required: q(Lambda) at the prior is a fixed point, E17); ``num_restarts`` restarts run in
parallel (vmap, ``inference.loop``), the highest final bound wins. Draws for the DataTree come from the q factors
(unrotated) with their log density ``log_q`` (``draw``).

Spaces: ``log_q`` is the density of q(omega) q(nu) q(Lambda) q(mu) q(tau) at the draws of the model's sites
(omega, nu, Wt = Lambda^T, mu, tau); the NumPyro model marginalises z and x, so these are exactly the variables
its log density is evaluated on. The bound F is the ELBO on the augmented space (omega, nu, Lambda, mu, tau, z,
x), E_q[log p(Y, x, z, theta) - log q(theta) - log q(z, x)]; the ELBO of q(theta) on the model's space is >= F.
Every parameter of q is stored in group ``variational`` (tests/test_log_q.py rebuilds both from it).

Rows are padded to ``programs.bucket(N)`` (``fit_vbem``), so data sets of similar size share the compiled run: the
row mask ``w`` multiplies every responsibility (a padded row has r_n = 0, so it adds nothing to the statistics of
eq. 54, to the Z part of F or to the k-means centres, and N counts the real rows only); the fitted state is cut
back to the real rows.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from inference import host_draws as hd
from inference import host_keys, programs
from inference._methods import Draws, FitContext, Option, register_method
from inference.base import Kernel
from inference.loop import Run, StopRule, run_until_converged
from inference.mppca.common import (
    Config,
    Stats,
    VBState,
    bound_from,
    cfg_from,
    chol_inv_logdet,
    e_lambda,
    e_log_omega,
    summary_of,
    tau_moments,
    update_alpha,
    update_lambda,
    update_mu,
    update_nu,
    update_tau,
)
from zoo.mppca import prior_means


class Problem(NamedTuple):
    """What a VB-EM run is given: the data, the prior means of the components and the row mask (1.0 on a real
    row, 0.0 on padding, ``programs.pad_rows``; None: every row is real)."""

    Y: jax.Array        # (N, d)
    mu0: jax.Array      # (K, d)
    w: jax.Array | None = None   # (N,)


def row_mask(Y, w):
    """The row mask: ``w``, or ones for every row of ``Y`` when None."""
    return jnp.ones(Y.shape[0]) if w is None else w


class Info(NamedTuple):
    objective: jax.Array    # the bound F (N3.3) after the sweep


# --------------------------------------------------------------------------------------------------
# One sweep (eq. 53 corrected, eq. 54, eq. 55)
# --------------------------------------------------------------------------------------------------


def update_xz(cfg: Config, st: VBState, Y, w=None) -> VBState:
    """q(x, z) given the parameter factors (eq. 53 with the +1/2 ln|Sx_k| of erratum E4); a padded row (``w_n =
    0``) gets r_n = 0."""
    Et, _ = tau_moments(cfg, st)
    EL = e_lambda(cfg, st)
    Sx, logdet_Px = chol_inv_logdet(jnp.eye(cfg.q) + Et * EL)                     # ln|Sx| = -logdet_Px
    D = Y[:, None, :] - st.m_mu[None]                                               # (N, K, d)
    m = Et * jnp.einsum("kab,kdb,nkd->nka", Sx, st.M, D)                            # (N, K, q)
    Emu2 = jnp.sum(st.m_mu**2, -1) + cfg.d * st.s2_mu                               # (K,)
    y2 = jnp.sum(Y**2, -1)[:, None]
    quad = (y2 + Emu2[None] - 2 * Y @ st.m_mu.T - 2 * jnp.einsum("nkd,kdq,nkq->nk", D, st.M, m)
            + jnp.einsum("kij,kji->k", EL, Sx)[None] + jnp.einsum("nki,kij,nkj->nk", m, EL, m))
    trxx = jnp.trace(Sx, axis1=-2, axis2=-1)[None] + jnp.sum(m**2, -1)
    logrho = e_log_omega(cfg, st)[None] - 0.5 * trxx - 0.5 * Et * quad
    if not cfg.paper_literal:
        logrho = logrho - 0.5 * logdet_Px[None]
    r = (jax.nn.softmax(logrho, axis=-1) if cfg.mixture else jnp.ones_like(logrho)) * row_mask(Y, w)[:, None]
    return st._replace(r=r, m=m, Sx=Sx)


def stats_of(st: VBState, Y) -> Stats:
    r, m = st.r, st.m
    N = jnp.sum(r, 0)
    rm = r[..., None] * m
    return Stats(N=N, y=r.T @ Y, s=jnp.sum(rm, 0), SY=jnp.einsum("nd,nkq->kdq", Y, rm),
                 S=N[:, None, None] * st.Sx + jnp.einsum("nki,nkj->kij", rm, m), y2=r.T @ jnp.sum(Y**2, -1))


def bound(cfg: Config, st: VBState, problem: Problem):
    """The variational lower bound F (N3.3, all constants) at the current state."""
    Y, mu0, w = problem
    s = stats_of(st, Y)
    zpart = jnp.sum(st.r * (e_log_omega(cfg, st)[None] - jnp.log(jnp.clip(st.r, 1e-300)))) if cfg.mixture else 0.0
    return bound_from(cfg, st, s, jnp.sum(row_mask(Y, w)), zpart, mu0)


def sweep(cfg: Config, st: VBState, problem: Problem, record: bool = False):
    """One VB-EM sweep: alpha; X/Z; stats; mu; Lambda; nu; tau. Returns (state, bound) or, with ``record``,
    (state, bounds after each factor update: [alpha, xz, mu, Lambda, nu, tau])."""
    Y, mu0, w = problem
    rec = []
    st = update_alpha(cfg, st, stats_of(st, Y)) if cfg.mixture else st
    rec.append(st)
    st = update_xz(cfg, st, Y, w)
    rec.append(st)
    s = stats_of(st, Y)
    st = update_mu(cfg, st, s, mu0)
    rec.append(st)
    st = update_lambda(cfg, st, s)
    rec.append(st)
    st = update_nu(cfg, st)
    rec.append(st)
    st = update_tau(cfg, st, s, jnp.sum(row_mask(Y, w)))
    rec.append(st)
    if record:
        return st, jnp.stack([bound(cfg, x, problem) for x in rec])
    return st, bound(cfg, st, problem)


# --------------------------------------------------------------------------------------------------
# Initialisation, the kernel, draws from q
# --------------------------------------------------------------------------------------------------


def distinct_rows(key, w, K):
    """K distinct rows drawn uniformly among the real ones (``w > 0``): the K rows of smallest random 32-bit word
    (``jax.random.choice(key, N, (K,), replace=False)`` for unpadded rows), a padded row given the largest word
    (ties go to the lower, real row). The words of row n do not depend on the padding, so the real rows pick the
    same rows whatever the bucket."""
    _, sub = jax.random.split(key)
    bits = jnp.where(w > 0, jax.random.bits(sub, w.shape, jnp.uint32), jnp.iinfo(jnp.uint32).max)
    return jnp.argsort(bits, stable=True)[:K]


def kmeans_labels(key, Y, K, iters=20, w=None):
    """Lloyd's k-means from K distinct random rows (vectorised; empty clusters keep their centre); padded rows
    (``w_n = 0``) are neither centres nor members."""
    w = row_mask(Y, w)
    C = Y[distinct_rows(key, w, K)]

    def body(C, _):
        lab = jnp.argmin(jnp.sum((Y[:, None] - C[None]) ** 2, -1), -1)
        R = jax.nn.one_hot(lab, K) * w[:, None]
        n = R.sum(0)
        C = jnp.where(n[:, None] > 0, (R.T @ Y) / jnp.maximum(n, 1)[:, None], C)
        return C, None

    C, _ = jax.lax.scan(body, C, None, length=iters)
    return jnp.argmin(jnp.sum((Y[:, None] - C[None]) ** 2, -1), -1), C


def initial_state(cfg: Config, key, Y, w=None) -> VBState:
    """k-means responsibilities, per-cluster PCA loadings (notes E17: M must not start at 0); padded rows (``w_n =
    0``) have r_n = 0."""
    d = Y.shape[1]
    w = row_mask(Y, w)
    N = jnp.sum(w)
    K, q = cfg.K, cfg.q
    if cfg.mixture:
        lab, C = kmeans_labels(key, Y, K, w=w)
        r = jax.nn.one_hot(lab, K) * w[:, None]
    else:
        r, C = w[:, None], (w @ Y / N)[None]
    n = r.sum(0)
    D = Y[:, None] - C[None]
    cov = jnp.einsum("nk,nki,nkj->kij", r, D, D) / jnp.maximum(n, 1)[:, None, None]
    total_var = jnp.sum(w[:, None] * (Y - w @ Y / N) ** 2) / (N - 1)     # tr cov(Y), the real rows
    cov = cov + 1e-6 * total_var / d * jnp.eye(d)
    lam, U = jnp.linalg.eigh(cov)                                  # ascending
    lam, U = lam[:, ::-1], U[:, :, ::-1]
    if cfg.learn_tau:
        resid = jnp.sum(n[:, None] * lam[:, q:]) / (N * (d - q))
        sig2 = jnp.maximum(resid, 1e-3 * jnp.mean(lam[:, 0]))
    else:
        sig2 = 1.0 / cfg.tau
    M = U[:, :, :q] * jnp.sqrt(jnp.maximum(lam[:, :q] - sig2, 1e-2 * sig2))[:, None, :]
    a_nu = jnp.full((K, q), cfg.a0 + d / 2)
    b_nu = a_nu * jnp.sum(M**2, 1) / d
    c_tau = jnp.asarray(cfg.a_tau + N * d / 2)
    return VBState(r=r, m=jnp.zeros((Y.shape[0], K, q)), Sx=jnp.broadcast_to(jnp.eye(q), (K, q, q)),
                   alpha=cfg.alpha0 + n, m_mu=C, s2_mu=1.0 / (cfg.nu0 + n / sig2), M=M,
                   SL=jnp.zeros((K, q, q)) + 1e-12 * jnp.eye(q), a_nu=a_nu, b_nu=b_nu, c_tau=c_tau,
                   e_tau=c_tau * sig2)


@programs.cached(maxsize=64)
def kernel(cfg: Config) -> Kernel:
    """The VB-EM kernel for one static configuration (cached, so ``inference.loop`` compiles it once)."""

    def init(key, problem: Problem) -> VBState:
        return initial_state(cfg, key, problem.Y, problem.w)

    def step(key, state: VBState, problem: Problem):
        state, F = sweep(cfg, state, problem)
        return state, Info(F)

    def draw(seed, state: VBState, n: int):
        return _draw_q(cfg, state, seed, n)

    return Kernel(init, step, draw)


def fit_vbem(Y, hyper, key, *, mixture=True, num_restarts=1, max_iter=1000, tol=1e-7, paper_literal=False,
             chunk=None, progress=None) -> tuple[Config, Run]:
    """Run VB-EM on ``Y`` (no DataTree) from ``num_restarts`` k-means initialisations in parallel until every
    restart's relative bound change is <= ``tol`` or ``max_iter``: returns (cfg, ``inference.loop.Run``; its
    ``info.objective`` is the bound after every sweep of the best restart). The rows are padded to
    ``programs.bucket(N)`` for the run; the returned state has the N real rows."""
    Y = np.asarray(Y, float)
    cfg = cfg_from(hyper, Y.shape[1], mixture, paper_literal)
    if cfg.mixture and cfg.K > Y.shape[0]:
        raise ValueError(f"K: at most N = {Y.shape[0]} components can be initialised by k-means, got {cfg.K}")
    Yp, w = programs.pad_rows(Y)
    problem = Problem(Yp, np.asarray(prior_means({"Y": Y}, hyper, cfg.K), float), w)
    kern = kernel(cfg)
    run = run_until_converged(kern.init, kern.step, problem, key, StopRule(int(max_iter), float(tol)),
                              num_restarts=num_restarts, chunk=chunk, progress=progress, desc="vbem")
    n, st = Y.shape[0], jax.device_get(run.state)     # on the host: cutting a device array compiles a program
    return cfg, run._replace(state=st._replace(r=st.r[:n], m=st.m[:n]))


def _draw_q(cfg: Config, st: VBState, seed, S: int):
    """S draws of (omega, nu, Wt, mu, tau) from the q factors and log q at each (constrained space), in NumPy from
    ``np.random.default_rng(seed)`` (``inference.host_draws``: a one-shot job, not worth compiling)."""
    rng = np.random.default_rng(seed)
    st = jax.tree.map(lambda a: np.asarray(a, float), jax.device_get(st))
    K, q = cfg.K, cfg.q
    post, lq = {}, np.zeros(S)
    if cfg.mixture:   # omega_k >= e^-700: finite log densities
        om = np.exp(hd.log_dirichlet_variates(rng, st.alpha, (S, K), floor=-700.0))
        om = om / om.sum(-1, keepdims=True)
        post["omega"] = om
        lq += hd.dirichlet_log_pdf(om, st.alpha)
    nu = np.maximum(np.exp(hd.log_gamma_variates(rng, st.a_nu, (S, K, q))) / st.b_nu, 1e-300)
    post["nu"] = nu
    lq += hd.gamma_log_pdf(nu, st.a_nu, st.b_nu).sum((-2, -1))
    Lc = np.linalg.cholesky(st.SL + 1e-300 * np.eye(q))[:, None]                 # (K, 1, q, q): every row i
    Wrows = hd.mvn_variates(rng, st.M, Lc, (S,))                                  # rows ~ N(M^i, SL)
    post["Wt"] = np.swapaxes(Wrows, -1, -2)                                        # (S, K, q, d)
    lq += hd.mvn_tril_log_pdf(Wrows, st.M, Lc).sum((-2, -1))
    sd = np.sqrt(st.s2_mu)[:, None]
    mu = st.m_mu + sd * rng.standard_normal((S, *st.m_mu.shape))
    post["mu"] = mu
    lq += hd.normal_log_pdf(mu, st.m_mu, sd).sum((-2, -1))
    if cfg.learn_tau:
        tau = np.exp(hd.log_gamma_variates(rng, st.c_tau, (S,))) / st.e_tau
        post["tau"] = tau
        lq += hd.gamma_log_pdf(tau, st.c_tau, st.e_tau)
    if not cfg.mixture:
        post = {k: (v[:, 0] if k != "tau" else v) for k, v in post.items()}
    return post, lq


def _variational_group(cfg: Config, st: VBState, summ: dict) -> xr.Dataset:
    """Group ``variational``: the point summary (N_k, kept, rank, weight, E_nu, E_tau) and every parameter of
    q, so that ``log_q`` and the bound can be recomputed from the tree: alpha (Dirichlet q(omega); absent for
    ppca), a_nu, b_nu (Gamma shape/rate of q(nu)), M, SL (q(Lambda_k) rows N(M_k^i, SL_k)), m_mu, s2_mu
    (q(mu_k) = N(m_mu_k, s2_k I)), c_tau, e_tau (Gamma shape/rate of q(tau); absent when tau is fixed) and the
    local factors r (row, component) = q(z_n = k), m_x (row, component, column), Sx (component, column,
    column) of q(x_n | z_n = k) = N(m_x_nk, Sx_k)."""
    K = cfg.K
    st = jax.device_get(st)
    ds = {
        "N_k": (("component",), np.asarray(summ["N_k"])),
        "kept": (("component",), np.isin(np.arange(K), summ["keep"])),
        "m_mu": (("component", "feature"), np.asarray(st.m_mu)),
        "s2_mu": (("component",), np.asarray(st.s2_mu)),
        "M": (("component", "feature", "column"), np.asarray(st.M)),
        "SL": (("component", "column", "column_bis"), np.asarray(st.SL)),
        "E_nu": (("component", "column"), np.asarray(st.a_nu / st.b_nu)),
        "a_nu": (("component", "column"), np.asarray(st.a_nu)),
        "b_nu": (("component", "column"), np.asarray(st.b_nu)),
        "r": (("row", "component"), np.asarray(st.r)),
        "m_x": (("row", "component", "column"), np.asarray(st.m)),
        "Sx": (("component", "column", "column_bis"), np.asarray(st.Sx)),
        "rank": (("kept_component",), summ["ranks"]),
        "weight": (("kept_component",), summ["weights"]),
    }
    if cfg.mixture:
        ds["alpha"] = (("component",), np.asarray(st.alpha))
    if cfg.learn_tau:
        ds["c_tau"], ds["e_tau"] = ((), np.asarray(st.c_tau)), ((), np.asarray(st.e_tau))
    return xr.Dataset(ds, attrs={"E_tau": summ["tau"]})


VBEM_OPTIONS = {
    "max_iter": Option(1000, "positive_int", "most VB-EM sweeps per restart", tiny=50),
    "tol": Option(1e-7, "positive", "stop when the relative change of the bound is at most this"),
    "num_samples": Option(1000, "positive_int", "draws from q stored in the posterior", tiny=20),
    "num_restarts": Option(1, "positive_int", "k-means restarts run in parallel; the highest final bound wins",
                           tiny=1),
    "prune_below": Option(2.0, "nonnegative", "components with N_k at most this are reported pruned (VBmix: 2)"),
    "rank_threshold": Option(0.1, "nonnegative", "Algorithm 1: stop adding columns when 2 KL is at most this"),
    "paper_literal": Option(False, "bool", "omit +1/2 ln|Sigma_x| in the responsibilities as the paper does "
                                           "(erratum E4; the bound may then decrease)"),
}


@register_method("vbem", kind="variational", models=("mppca", "ppca"), options=VBEM_OPTIONS)
def run_vbem(ctx: FitContext) -> Draws:
    """VB-EM for Bayesian (M)PPCA with automatic pruning of components and ARD columns (notes 3.3; erratum E4
    fixed: +1/2 ln|Sigma_x| in the responsibilities, so the bound is monotone); restarts ``num_restarts``."""
    o = ctx.options
    mixture = ctx.spec.name != "ppca"
    cfg, res = fit_vbem(ctx.data["Y"], ctx.hyper, host_keys.fold_in(ctx.key, 1), mixture=mixture,
                        num_restarts=o["num_restarts"], max_iter=o["max_iter"], tol=o["tol"],
                        paper_literal=o["paper_literal"], progress=o["progress"])
    post, log_q = kernel(cfg).draw((ctx.seed, 2), res.state, o["num_samples"])
    summ = summary_of(cfg, res.state, o["prune_below"], o["rank_threshold"])
    return Draws(posterior={k: np.asarray(v)[None] for k, v in post.items()},
                 sample_stats={"log_q": np.asarray(log_q)[None]}, traces={"bound": res.info.objective},
                 groups={"variational": _variational_group(cfg, res.state, summ)},
                 objective=res.objective, converged=res.converged, n_iter=res.n_iter,
                 attrs={"K_eff": int(len(summ["keep"])), "ranks": summ["ranks"].tolist(),
                        "restart_bounds": res.objective_per_restart.tolist()})
