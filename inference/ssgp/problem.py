"""The static description (``Config``) and the arrays (``Data``, the kernel's ``problem``) of an ssgp VB fit,
built from the model's inputs: the full design [1 | A | random effects] and the padding of the observations
into chunks (notes §2.6, §3.7).

The observations are padded to ``programs.bucket(n)`` rows (and on to a whole number of chunks) with ``mask`` = 0,
so data sets of similar size share the compiled programs: every per-observation term of the sweep and the bound
is weighted by the mask, so a padded row adds nothing, and the number of observations ``n`` (the LMM's q(gamma)
shape and bound constant) is ``Data.n_obs``, a value of the data, not a constant of the programs: they are built
from ``program_config(cfg)``."""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from inference import programs

MODELS = ("ssgp_lmm", "ssgp_logit", "ssgp_probit")
LIKELIHOOD_OF = {"ssgp_lmm": "gaussian", "ssgp_logit": "logit", "ssgp_probit": "probit"}


class Config(NamedTuple):
    """The static (hashable) configuration of a fit (``inference.base``): sizes, likelihood, prior scales,
    chunking, and the VB's step options (``inference.ssgp.vb.step``; defaults = the method's)."""
    likelihood: str
    n: int
    m: int
    d: int
    s: int            # columns of the full design [1, A, random effects]
    J: int            # groups (0: none)
    T: int            # random-effect terms per group (0: none)
    A_sigma: float
    A_gamma: float
    A_tau: float
    chunk: int        # observations per chunk
    n_chunks: int     # chunks: n_chunks * chunk >= bucket(n) rows
    factorisation: str = "joint"  # "joint": q(alpha, beta) one Gaussian block; "mean_field": q(alpha) q(beta)
    warm_start: int = 3           # VB: first sweeps with q(lam) frozen
    step_max: float = 1e4         # VB: largest over-relaxed NCVMP step on the lam mean
    backtrack: bool = True        # VB: adaptive step with backtracking (False: plain NCVMP, a = 1)
    mu_lam_init: tuple[float, ...] = (0.5,)  # VB: initial mean of q(lam)


class Data(NamedTuple):
    """Arrays, padded to n_chunks * chunk rows (``mask`` = 0 on padding)."""
    X: jax.Array          # (Np, d) inputs scaled to [0, 1]
    y: jax.Array          # (Np,)
    mask: jax.Array       # (Np,)
    Af: jax.Array         # (Np, s) full design: intercept, A, random-effect columns (group j, term t) at 1+sA+j*T+t
    S: jax.Array          # (m, d) spectral points
    prec_fixed: jax.Array  # (s,) prior precision of the non-random coefficients (0 for random ones)
    re_term: jax.Array    # (s, T) one-hot term of each random coefficient (zero rows for fixed ones)
    mu_lam0: jax.Array    # (d,)
    P_lam0: jax.Array     # (d, d) prior precision of lam
    AtA: jax.Array        # (s, s) A_f^T A_f over the real rows
    n_obs: jax.Array | None = None   # () the number of real observations n (float)


def program_config(cfg: Config) -> Config:
    """``cfg`` as the compiled programs see it: without ``n`` (-1), which they read from ``Data.n_obs``, so fits
    on data sets of other sizes in the same bucket share them."""
    return cfg._replace(n=-1)


def design(inputs, hyper):
    """Full design [1 | A | random effects] (n, s), prior precision of the fixed columns, term one-hots."""
    X = np.asarray(inputs["X"])
    n = X.shape[0]
    cols = [np.ones((n, 1))]
    prec = [1.0 / float(hyper["var_fixed"])]
    if inputs.get("A") is not None:
        cols.append(np.asarray(inputs["A"], dtype=np.float64))
        prec += [1.0 / float(hyper["var_beta"])] * inputs["A"].shape[1]
    J = T = 0
    s_fixed = len(prec)
    if inputs.get("group") is not None:
        J, C = int(inputs["n_groups"]), np.asarray(inputs["C"])
        T = C.shape[1]
        R = np.zeros((n, J * T))
        R[np.repeat(np.arange(n), T), (inputs["group"][:, None] * T + np.arange(T)).ravel()] = C.ravel()
        cols.append(R)
        prec += [0.0] * (J * T)
    Af = np.concatenate(cols, axis=1)
    re_term = np.zeros((Af.shape[1], T))
    if T:
        re_term[s_fixed + np.arange(J * T), np.tile(np.arange(T), J)] = 1.0
    return Af, np.asarray(prec), re_term, J, T


def setup(inputs, hyper, likelihood, chunk_size=None, factorisation="joint"):
    """(Config, Data) from the model's keyword arguments (``spec.inputs(data, hyper)``)."""
    X = np.asarray(inputs["X"], dtype=np.float64)
    S = np.asarray(inputs["S"], dtype=np.float64)
    n, d = X.shape
    m = S.shape[0]
    Af, prec, re_term, J, T = design(inputs, hyper)
    rows = programs.bucket(n)
    chunk = int(chunk_size) if chunk_size else max(1, min(rows, 2**18 // (m * m)))
    n_chunks = -(-rows // chunk)
    pad = n_chunks * chunk - n
    padr = lambda a: np.concatenate([a, np.zeros((pad, *a.shape[1:]))]) if pad else a
    y = np.asarray(inputs["y"], dtype=np.float64)
    cfg = Config(likelihood, n, m, d, Af.shape[1], J, T, float(hyper["A_sigma"]),
                 float(hyper.get("A_gamma", 25.0)), float(hyper["A_tau"]), chunk, n_chunks, factorisation)
    # NumPy arrays: the compiled programs take them as they are (no JAX operation run on its own)
    data = Data(X=np.asarray(padr(X), float), y=padr(y), mask=padr(np.ones(n)), Af=np.asarray(padr(Af), float),
                S=np.asarray(S, float), prec_fixed=np.asarray(prec, float), re_term=np.asarray(re_term),
                mu_lam0=np.full(d, float(hyper["mu_lam0"])), P_lam0=np.eye(d) / float(hyper["var_lam0"]),
                AtA=np.asarray(Af.T @ Af, float), n_obs=np.asarray(float(n)))
    return cfg, data
