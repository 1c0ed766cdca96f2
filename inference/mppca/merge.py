"""VB merging of fitted MPPCA models from their parameters only (Bruneau, Gelgon & Picarougne 2013, sec. 5,
appendix B: VBMPPCA-A; paper page ``docs/papers/mppca.md`` N2.5, N3.4, N3.5).

The L input components (pooled from several models) are a "virtual sample": input l stands for w_l points
(w_l = N_virtual alpha_l / sum alpha, N_virtual = 200000 as in VBmix) that share one assignment z_l. The output
is a Bayesian MPPCA with the priors of ``zoo.mppca``, fitted by VB-EM with data statistics replaced by
weighted parameter statistics; the M step, the parameter part of the bound and the post-processing are those of
``inference.mppca.common``; the sweep is a kernel run by ``inference.loop``. Two variants:

* ``variant="ess"`` (default; notes N3.5, "expected sufficient statistics"): input l is w_l virtual points
  y ~ N(mu_l, C_l), C_l = Lambda_l Lambda_l^T + tau_l^-1 I. With B_k = E tau Sx_k M_k^T, c_k the output mean at
  the E step, delta_lk = mu_l - c_k, G_lk = C_l + delta delta^T:
  ln rho_lk = w_l [E ln omega_k - E tau/2 Q_lk - 1/2 (tr Sx_k + tr(B^T B G)) + 1/2 ln|Sx_k|],
  Q_lk = |mu_l|^2 + tr C_l + E|mu_k|^2 - 2 mu_l^T m_mu_k - 2 tr(M_k B_k G) + tr(EL_k Sx_k) + tr(B^T EL_k B G);
  statistics N_k = sum wr, y_k = sum wr mu_l, s_k = sum wr B delta, SY_k = sum wr (C_l + mu_l delta^T) B^T,
  S_k = N_k Sx_k + sum wr B G B^T, y2_k = sum wr (|mu_l|^2 + tr C_l). Invariant to rotations/signs of the
  input loadings; it matched pooled fits far better in the notes' prototype (E15).
* ``variant="paper"`` (the paper's VBMPPCA-A as run, fixed x2 = e_j; N3.4 with erratum E14 fixed, i.e. the
  +1/2 ln|Sx_k| term and the w_l factors placed correctly): column j of an input loading is a noisy copy of
  column j of the output loading, so inputs must be rotated (eq. 5) and sign-normalised; ``m1_lk =
  E tau Sx_k M_k^T (mu_l - m_mu_k)`` and the statistics of N3.4.

Both are exact coordinate ascent on their bound, so the bound is monotone (tested). tau is fixed during merging
to the weighted mean of the inputs' noise precisions (or ``tau``). Incremental merging (sec. 6.3):
``merge_incremental`` folds models one at a time into a reference, weighting the reference by the number of
models it already summarises (the count-weighted variant of E16; ``equal_mass=True`` is VBmix's choice).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from inference import programs
from inference.base import Kernel
from inference.loop import StopRule, run_until_converged
from inference.mppca import common as V


class Inputs(NamedTuple):
    w: jax.Array      # (L,) virtual counts
    mu: jax.Array     # (L, d)
    Lam: jax.Array    # (L, d, q) rotated, sign-normalised, zero-padded loadings
    C: jax.Array      # (L, d, d) input covariances Lambda Lambda^T + tau_l^-1 I


def model_params(model: Any) -> dict:
    """{counts (L,), means (L, d), loadings (L, d, q_l), tau} of one fitted model: a ``vbem`` DataTree (kept
    components of its ``variational`` group), a ``merge_mppca`` result, or a dict with those keys (``counts``
    may be given as ``weights`` times ``n``)."""
    if isinstance(model, xr.DataTree):
        var = model["variational"].to_dataset()
        keep = np.asarray(var["kept"].values, bool)
        return {"counts": np.asarray(var["N_k"].values)[keep], "means": np.asarray(var["m_mu"].values)[keep],
                "loadings": np.asarray(var["M"].values)[keep], "tau": float(var.attrs["E_tau"])}
    if isinstance(model, Mapping):
        counts = model.get("counts")
        if counts is None:
            if "weights" not in model or "n" not in model:
                raise ValueError("models: a parameter dict needs 'counts' (L,) or 'weights' (L,) and 'n'")
            counts = np.asarray(model["weights"], float) * float(model["n"])
        return {"counts": np.asarray(counts, float), "means": np.asarray(model["means"], float),
                "loadings": np.asarray(model["loadings"], float), "tau": float(model["tau"])}
    raise ValueError(f"models: expected vbem DataTrees or parameter dicts, got {type(model).__name__}")


def prepare(models: Sequence[Any], n_virtual: float, weights: Sequence[float] | None = None) -> tuple[Inputs, float]:
    """Pool the components of all models: eq.-5 rotation and sign (first coordinate >= 0), zero-padding to the
    largest q, w_l = n_virtual * count_l / sum counts (optionally per-model ``weights`` re-scale each model's
    total mass). Returns (inputs, count-weighted mean tau)."""
    if len(models) == 0:
        raise ValueError("models: need at least one fitted model to merge")
    ps = [model_params(m) for m in models]
    d = ps[0]["means"].shape[1]
    if any(p["means"].shape[1] != d for p in ps):
        raise ValueError("models: all models must have the same data dimension d")
    q = max(p["loadings"].shape[2] for p in ps)
    counts, mus, lams, taus = [], [], [], []
    for i, p in enumerate(ps):
        c = np.asarray(p["counts"], float)
        if weights is not None:
            c = c / c.sum() * float(weights[i])
        for k in range(len(c)):
            L = V.rotate(p["loadings"][k])
            lams.append(np.pad(L, ((0, 0), (0, q - L.shape[1]))))
            mus.append(p["means"][k])
            counts.append(c[k])
            taus.append(p["tau"])
    counts = np.asarray(counts)
    if counts.sum() <= 0 or np.any(counts < 0):
        raise ValueError("models: component counts must be non-negative with a positive total")
    tau = float(np.sum(counts * np.asarray(taus)) / counts.sum())
    lam = np.stack(lams)
    C = np.einsum("liq,ljq->lij", lam, lam) + np.eye(d)[None] / np.asarray(taus)[:, None, None]
    return Inputs(jnp.asarray(n_virtual * counts / counts.sum()), jnp.asarray(np.stack(mus)), jnp.asarray(lam),
                  jnp.asarray(C)), tau


class State(NamedTuple):
    vb: V.VBState     # r (L, K), m unused, Sx and the parameter factors
    B: jax.Array      # (K, q, d) E-step map (ESS) / m1 (L, K, q) (paper)
    c: jax.Array      # (K, d) output means at the E step


class Info(NamedTuple):
    objective: jax.Array    # the merging bound F_A after the sweep


class Problem(NamedTuple):
    inp: Inputs
    mu0: jax.Array    # (K, d) prior means of the output components


def _xz_ess(cfg: V.Config, st: V.VBState, inp: Inputs):
    Et, _ = V.tau_moments(cfg, st)
    EL = V.e_lambda(cfg, st)
    Sx, ldP = V.chol_inv_logdet(jnp.eye(cfg.q) + Et * EL)
    B = Et * jnp.einsum("kab,kdb->kad", Sx, st.M)                                  # (K, q, d)
    delta = inp.mu[:, None] - st.m_mu[None]                                         # (L, K, d)
    G = inp.C[:, None] + jnp.einsum("lki,lkj->lkij", delta, delta)                  # (L, K, d, d)
    BtB = jnp.einsum("kqi,kqj->kij", B, B)
    BtELB = jnp.einsum("kqi,kqp,kpj->kij", B, EL, B)
    MB = jnp.einsum("kdq,kqe->kde", st.M, B)
    Emu2 = jnp.sum(st.m_mu**2, -1) + cfg.d * st.s2_mu
    trC = jnp.trace(inp.C, axis1=-2, axis2=-1)
    Q = (jnp.sum(inp.mu**2, -1)[:, None] + trC[:, None] + Emu2[None] - 2 * inp.mu @ st.m_mu.T
         - 2 * jnp.einsum("kij,lkji->lk", MB, G) + jnp.einsum("kij,kji->k", EL, Sx)[None]
         + jnp.einsum("kij,lkji->lk", BtELB, G))
    per = (V.e_log_omega(cfg, st)[None] - Et / 2 * Q
           - 0.5 * (jnp.trace(Sx, axis1=-2, axis2=-1)[None] + jnp.einsum("kij,lkji->lk", BtB, G)) - 0.5 * ldP[None])
    logrho = inp.w[:, None] * per
    r = jax.nn.softmax(logrho, axis=-1)
    return State(st._replace(r=r, Sx=Sx), B, st.m_mu)


def _stats_ess(ms: State, inp: Inputs) -> V.Stats:
    wr = inp.w[:, None] * ms.vb.r                                                    # (L, K)
    N = wr.sum(0)
    delta = inp.mu[:, None] - ms.c[None]
    G = inp.C[:, None] + jnp.einsum("lki,lkj->lkij", delta, delta)
    Bd = jnp.einsum("kqd,lkd->lkq", ms.B, delta)
    s = jnp.einsum("lk,lkq->kq", wr, Bd)
    SY = (jnp.einsum("lk,lij,kqj->kiq", wr, inp.C, ms.B) + jnp.einsum("lk,li,lkq->kiq", wr, inp.mu, Bd))
    S = N[:, None, None] * ms.vb.Sx + jnp.einsum("lk,kqi,lkij,kpj->kqp", wr, ms.B, G, ms.B)
    y2 = wr.T @ (jnp.sum(inp.mu**2, -1) + jnp.trace(inp.C, axis1=-2, axis2=-1))
    return V.Stats(N=N, y=wr.T @ inp.mu, s=s, SY=SY, S=S, y2=y2)


def _xz_paper(cfg: V.Config, st: V.VBState, inp: Inputs):
    Et, _ = V.tau_moments(cfg, st)
    EL = V.e_lambda(cfg, st)
    Sx, ldP = V.chol_inv_logdet(jnp.eye(cfg.q) + Et * EL)
    D = inp.mu[:, None] - st.m_mu[None]                                             # (L, K, d)
    m1 = Et * jnp.einsum("kab,kdb,lkd->lka", Sx, st.M, D)                           # (L, K, q)
    Emu2 = jnp.sum(st.m_mu**2, -1) + cfg.d * st.s2_mu
    inner = (jnp.sum(inp.mu**2, -1)[:, None] + jnp.sum(inp.Lam**2, (-2, -1))[:, None] + Emu2[None]
             - 2 * inp.mu @ st.m_mu.T - 2 * jnp.einsum("lkd,kdq,lkq->lk", D, st.M, m1)
             - 2 * jnp.einsum("ldq,kdq->lk", inp.Lam, st.M) + jnp.einsum("lki,kij,lkj->lk", m1, EL, m1)
             + jnp.trace(EL, axis1=-2, axis2=-1)[None])
    logrho = (inp.w[:, None] * (V.e_log_omega(cfg, st)[None] - 0.5 * jnp.sum(m1**2, -1) - Et / 2 * inner)
              - 0.5 * jnp.trace(Sx, axis1=-2, axis2=-1)[None] - Et / 2 * jnp.einsum("kij,kji->k", EL, Sx)[None]
              - 0.5 * ldP[None])
    r = jax.nn.softmax(logrho, axis=-1)
    return State(st._replace(r=r, Sx=Sx, m=m1), jnp.zeros((cfg.K, cfg.q, cfg.d)), st.m_mu)


def _stats_paper(ms: State, inp: Inputs, q: int) -> V.Stats:
    r, m1 = ms.vb.r, ms.vb.m
    wr = inp.w[:, None] * r
    N = wr.sum(0)
    wm = wr[..., None] * m1
    SY = jnp.einsum("li,lkq->kiq", inp.mu, wm) + jnp.einsum("lk,liq->kiq", wr, inp.Lam)
    S = (r.sum(0)[:, None, None] * ms.vb.Sx + jnp.einsum("lki,lkj->kij", wm, m1)
         + N[:, None, None] * jnp.eye(q))
    y2 = wr.T @ (jnp.sum(inp.mu**2, -1) + jnp.sum(inp.Lam**2, (-2, -1)))
    return V.Stats(N=N, y=wr.T @ inp.mu, s=wm.sum(0), SY=SY, S=S, y2=y2)


def merge_bound(cfg: V.Config, ms: State, inp: Inputs, mu0, variant: str):
    st = ms.vb
    Elo = V.e_log_omega(cfg, st)
    zpart = jnp.sum(st.r * (inp.w[:, None] * Elo[None] - jnp.log(jnp.clip(st.r, 1e-300))))
    if variant == "ess":
        return V.bound_from(cfg, st, _stats_ess(ms, inp), jnp.sum(inp.w), zpart, mu0)
    # paper (fixed x2, N3.4): F_A = Z part + sum_l (1+q)(d/2) ln(w_l tau / 2 pi) - tau/2 sum_k Q_k
    #   + sum_l (q/2) ln(w_l / 2 pi) - 1/2 [sum wr |m1|^2 + sum_k (sum_l r_lk) tr Sx_k]
    #   + sum_lk r_lk 1/2 [ln|Sx_k| - q ln w_l + q (1 + ln 2 pi)] + parameter terms
    s = _stats_paper(ms, inp, cfg.q)
    q, d = cfg.q, cfg.d
    _, ldSx = V.chol_inv_logdet(st.Sx)
    F = V.bound_from(cfg, st, s, 0.0, zpart, mu0)
    F += 0.5 * jnp.sum(jnp.trace(s.S, axis1=-2, axis2=-1)) - jnp.sum(s.N * 0.5 * (ldSx + q * (1 + V.LOG_2PI)))
    wm2 = jnp.sum(inp.w[:, None] * st.r * jnp.sum(st.m**2, -1))
    rsum = st.r.sum(0)
    F += (jnp.sum((1 + q) * d / 2 * jnp.log(inp.w * cfg.tau / (2 * np.pi)))
          + jnp.sum(q / 2 * jnp.log(inp.w / (2 * np.pi)))
          - 0.5 * (wm2 + jnp.sum(rsum * jnp.trace(st.Sx, axis1=-2, axis2=-1)))
          + jnp.sum(st.r * 0.5 * (ldSx[None] - q * jnp.log(inp.w)[:, None] + q * (1 + V.LOG_2PI))))
    return F


def merge_sweep(cfg: V.Config, ms: State, inp: Inputs, mu0, variant: str, record: bool = False):
    """alpha; X/Z; statistics; mu; Lambda; nu (tau fixed). Returns (state, bound) or all per-factor bounds."""
    stats = (lambda m: _stats_ess(m, inp)) if variant == "ess" else (lambda m: _stats_paper(m, inp, cfg.q))
    rec = []
    ms = ms._replace(vb=V.update_alpha(cfg, ms.vb, stats(ms)))
    rec.append(ms)
    ms = (_xz_ess if variant == "ess" else _xz_paper)(cfg, ms.vb, inp)
    rec.append(ms)
    s = stats(ms)
    ms = ms._replace(vb=V.update_mu(cfg, ms.vb, s, mu0))
    rec.append(ms)
    ms = ms._replace(vb=V.update_lambda(cfg, ms.vb, s))
    rec.append(ms)
    ms = ms._replace(vb=V.update_nu(cfg, ms.vb))
    rec.append(ms)
    if record:
        return ms, jnp.stack([merge_bound(cfg, x, inp, mu0, variant) for x in rec])
    return ms, merge_bound(cfg, ms, inp, mu0, variant)


INITS = ("leader", "box", "inputs")


def initial_partition(init: str, inp: Inputs, K: int, rng: np.random.Generator):
    """Starting hard assignment of the L inputs to K components: (labels (L,), centres (K, d)).

    * ``"leader"`` (default): inputs in random order; an input joins the nearest existing group if that group's
      leader mean is a typical point of the input's own distribution (squared Mahalanobis distance under C_l
      below d, its expectation), else it founds a new group (while fewer than K). Inputs describing the same
      cluster (from different models) start together, distinct clusters apart; the order varies over restarts.
    * ``"box"`` is drawn in JAX by the kernel's ``init`` (``box_partition``; in high d and with small K distinct
      clusters often share a centre).
    * ``"inputs"``: K input means drawn with probability w as centres (with K >= L every input starts as its own
      component, a local optimum VB-EM rarely leaves when w_l is large)."""
    mu, C, w = np.asarray(inp.mu), np.asarray(inp.C), np.asarray(inp.w)
    L, d = mu.shape
    cen = mu[rng.choice(L, K, replace=K > L, p=w / w.sum())] + 1e-3 * rng.normal(size=(K, d))
    if init == "inputs":
        return np.argmin(((mu[:, None] - cen[None]) ** 2).sum(-1), 1), cen
    Cinv = np.linalg.inv(C)
    leaders, lab = [], np.zeros(L, int)
    for l in rng.permutation(L):
        if leaders:
            D = mu[leaders] - mu[l]
            m2 = np.einsum("ci,ij,cj->c", D, Cinv[l], D)
            j = int(np.argmin(m2))
            if m2[j] < d or len(leaders) == K:
                lab[l] = j
                continue
        lab[l] = len(leaders)
        cen[len(leaders)] = mu[l]
        leaders.append(l)
    return lab, cen


def merge_init(cfg: V.Config, inp: Inputs, lab, cen) -> State:
    """State from a hard assignment ``lab`` (L,) of inputs to components (empty ones sit at ``cen``), loadings from
    the assigned inputs' covariance (a non-zero M, E17)."""
    L, d = inp.mu.shape
    r = jax.nn.one_hot(lab, cfg.K)
    wr = inp.w[:, None] * r
    n = wr.sum(0)
    mean = jnp.where(n[:, None] > 0, wr.T @ inp.mu / jnp.maximum(n, 1e-12)[:, None], cen)
    D = inp.mu[:, None] - mean[None]
    cov = jnp.einsum("lk,lij->kij", wr, inp.C) + jnp.einsum("lk,lki,lkj->kij", wr, D, D)
    cov = cov / jnp.maximum(n, 1e-12)[:, None, None] + 1e-6 * jnp.eye(d)
    lam, U = jnp.linalg.eigh(cov)
    lam, U = lam[:, ::-1], U[:, :, ::-1]
    sig2 = 1.0 / cfg.tau
    M = U[:, :, :cfg.q] * jnp.sqrt(jnp.maximum(lam[:, :cfg.q] - sig2, 1e-2 * sig2))[:, None, :]
    M = M * jnp.where(M[:, :1, :] < 0, -1.0, 1.0)       # the inputs' sign convention (``prepare``): fixed x2 needs it
    a_nu = jnp.full((cfg.K, cfg.q), cfg.a0 + d / 2)
    # components that start empty start at their no-data fixed point (M = 0, SL = I b0/a0, E nu = a0/b0): the
    # nu <-> SL iteration contracts there only by ~1 - 2 a0 / d per sweep, which kept the relative-tol stop
    # waiting ~800 sweeps on bound changes of ~1e-4 nats
    empty = (n <= 0)[:, None]
    M = jnp.where(empty[:, :, None], 0.0, M)
    SL = jnp.where(empty[:, :, None], cfg.b0 / cfg.a0 * jnp.eye(cfg.q), 1e-12 * jnp.eye(cfg.q))
    b_nu = jnp.where(empty, cfg.b0 + d / 2 * cfg.b0 / cfg.a0, a_nu * jnp.sum(M**2, 1) / d)
    st = V.VBState(r=r, m=jnp.zeros((L, cfg.K, cfg.q)), Sx=jnp.broadcast_to(jnp.eye(cfg.q), (cfg.K, cfg.q, cfg.q)),
                   alpha=cfg.alpha0 + n, m_mu=mean, s2_mu=1.0 / (cfg.nu0 + n * cfg.tau), M=M, SL=SL, a_nu=a_nu,
                   b_nu=b_nu, c_tau=jnp.asarray(1.0), e_tau=jnp.asarray(1.0))
    return State(st, jnp.zeros((cfg.K, cfg.q, d)), mean)


def box_partition(key, mu, K: int):
    """VBmix's start (N3.4): K centres uniform in the box of the input means enlarged by half its span; each input
    to the nearest centre. Returns (labels (L,), centres (K, d))."""
    lo, hi = mu.min(0), mu.max(0)
    cen = jax.random.uniform(key, (K, mu.shape[1]), minval=lo - (hi - lo) / 2, maxval=hi + (hi - lo) / 2)
    return jnp.argmin(((mu[:, None] - cen[None]) ** 2).sum(-1), 1), cen


@programs.cached(maxsize=32)
def kernel(cfg: V.Config, variant: str) -> Kernel:
    """The merging kernel for one static configuration and variant (cached: ``inference.loop`` compiles once)."""

    def init(key, problem: Problem) -> State:
        return merge_init(cfg, problem.inp, *box_partition(key, problem.inp.mu, cfg.K))

    def step(key, state: State, problem: Problem):
        state, F = merge_sweep(cfg, state, problem.inp, problem.mu0, variant)
        return state, Info(F)

    return Kernel(init, step)


@programs.cached(maxsize=32)
def _starts(cfg: V.Config):
    """States from host-drawn partitions (labels (R, L), centres (R, K, d)), one per restart."""
    return jax.jit(jax.vmap(lambda lab, cen, inp: merge_init(cfg, inp, lab, cen), in_axes=(0, 0, None)))


def merge_mppca(models: Sequence[Any], *, K: int = 20, variant: str = "ess", n_virtual: float | None = None,
                num_restarts: int = 4, max_iter: int = 1000, tol: float = 1e-9, seed: int = 0,
                tau: float | None = None, weights: Sequence[float] | None = None,
                hyper: Mapping[str, float] | None = None, prune_below: float = 2.0, chunk: int = 25,
                init: str = "leader", progress: bool | None = None) -> dict:
    """Merge fitted MPPCA models into one parsimonious MPPCA using only their parameters (VBMPPCA-A).

    ``models``: ``vbem`` DataTrees, results of this function, or parameter dicts (``counts``, ``means``,
    ``loadings``, ``tau``). ``variant``: ``"ess"`` (default) or ``"paper"`` (fixed x2, as in the paper).
    ``n_virtual``: virtual sample size; default 200000 for ``"paper"`` (VBmix) and the total count of the inputs
    for ``"ess"`` (it treats the inputs as that many data points; N = 200000 makes the pseudo-posterior a point
    mass, closer to a pooled ML fit when clusters have few points: 0.013 % vs 0.23 % held-out loss at 2 x 100
    points, T8; the over-splitting once seen with 200000 came from the old input-means initialisation). Best
    bound of ``num_restarts`` restarts (vectorised, ``inference.loop``) wins.
    ``init``: starting partition of the inputs, ``"leader"`` (default), ``"inputs"`` (see ``initial_partition``;
    drawn on the host from ``seed``) or ``"box"`` (VBmix, ``box_partition``: the kernel's own ``init``, drawn
    from ``jax.random.key(seed)``); restarts draw different partitions.

    Returns a dict: ``counts`` (kept N_k, so the result can be merged again), ``weights``, ``means``,
    ``loadings`` (rotated), ``ranks`` (Algorithm 1), ``covariances``, ``tau``, ``K_eff``, ``bound`` (trace
    of the best restart), ``restart_bounds``, ``assignment`` (L, K responsibilities)."""
    if variant not in ("ess", "paper"):
        raise ValueError(f"variant: expected 'ess' or 'paper', got {variant!r}")
    if init not in INITS:
        raise ValueError(f"init: expected one of {INITS}, got {init!r}")
    if len(models) == 0:
        raise ValueError("models: need at least one fitted model to merge")
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise ValueError(f"K: expected a positive number of output components, got {K!r}")
    if n_virtual is None:
        n_virtual = 200000.0 if variant == "paper" else sum(float(np.sum(model_params(m)["counts"])) for m in models)
    if not n_virtual > 0:
        raise ValueError(f"n_virtual: expected a positive virtual sample size, got {n_virtual!r}")
    inp, tau_in = prepare(models, n_virtual, weights)
    d, q = inp.mu.shape[1], inp.Lam.shape[2]
    h = {"alpha0": 1e-3, "a0": 1e-3, "b0": 1e-3, "nu0": 1e-3, "a_tau": 1e-3, "b_tau": 1e-3, **(hyper or {}),
         "K": K, "q": q, "tau_fixed": float(tau if tau is not None else tau_in)}
    cfg = V.cfg_from(h, d, True)
    lo, hi = inp.mu.min(0), inp.mu.max(0)
    mu0 = jnp.broadcast_to((lo + hi) / 2, (K, d))
    kern = kernel(cfg, variant)
    starts = None
    if init != "box":
        rng = np.random.default_rng(seed)
        labs, cens = zip(*[initial_partition(init, inp, K, rng) for _ in range(num_restarts)], strict=True)
        starts = _starts(cfg)(jnp.asarray(np.stack(labs)), jnp.asarray(np.stack(cens)), inp)
    res = run_until_converged(kern.init, kern.step, Problem(inp, mu0), jax.random.key(seed),
                              StopRule(int(max_iter), float(tol)), num_restarts=num_restarts, chunk=chunk,
                              progress=progress, desc="merge_mppca", init_state=starts)
    best = res.state
    summ = V.summary_of(cfg, best.vb, prune_below)
    return {"counts": summ["N_k"][summ["keep"]] * sum(float(np.sum(model_params(m)["counts"])) for m in models)
            / float(n_virtual), "weights": summ["weights"], "means": summ["means"], "loadings": summ["loadings"],
            "ranks": summ["ranks"], "covariances": summ["covariances"], "tau": summ["tau"],
            "K_eff": len(summ["keep"]), "bound": res.info.objective,
            "restart_bounds": res.objective_per_restart, "assignment": np.asarray(best.vb.r)[:, summ["keep"]]}


def merge_incremental(models: Sequence[Any], *, equal_mass: bool = False, **kw) -> dict:
    """Sec. 6.3: reference <- merge(reference, new model) for each model in turn. The reference carries the
    mass of the t models it summarises (``equal_mass=True``: VBmix's equal halves, exponential forgetting, E16)."""
    ref = models[0]
    for t, new in enumerate(models[1:], start=1):
        w = (1.0, 1.0) if equal_mass else (float(t), 1.0)
        tot = [float(np.sum(model_params(m)["counts"])) for m in (ref, new)]
        ref = merge_mppca([ref, new], weights=[w[0] / sum(w) * sum(tot), w[1] / sum(w) * sum(tot)], **kw)
    return ref
