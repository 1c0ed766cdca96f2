"""Posterior predictive summaries of the ssgp models at new inputs (notes §3.6), registered with
``inference.predict`` for every ssgp model and computed from the tree's posterior draws, so a VB, NUTS or SVI
tree predicts the same way.

At draw s the linear predictor of a new point is eta*_s = z(x*; lam_s)^T alpha_s + a*^T beta_s with the
feature map z(x; lam) = [cos(t_r(x)^T lam), sin(t_r(x)^T lam)]_r, t_r(x) = s_r * x (notes §2.1),
alpha_s = sigma_s alpha_raw_s / sqrt(m), and the design row a* = [1, A*, random-effect columns of the point's
group] (zero random effect for a new group). Means and variances are over the draws.

Groups of new points are given by the labels the tree was fitted with (``inference.prediction.label_codes``):
subject names when the tree was fitted from a DataFrame with string labels, the integer ids of a dict (0..J-1 for
the simulators and loaders). A label the tree does not know is a ``ValueError`` naming ``group`` (and, for a
DataFrame of new rows, its column).
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, ndtr

from inference.prediction import label_codes, register_predictor
from inference.ssgp.problem import LIKELIHOOD_OF, MODELS
from inference.trees import problem_of
from zoo import ssgp
from zoo._validation import factorize

ROWS_PER_BLOCK = 2**22  # draws x new points x m features per block of the feature map


def new_design(data, hyper, X_new, group=None, A=None):
    """Scaled new inputs and their design rows [1, A, random effects]; ``group`` holds group **codes** 0..J-1
    (``group_codes_of``), zeros for None or -1."""
    X_new = np.atleast_2d(np.asarray(X_new, dtype=np.float64))
    X = np.asarray(data["X"])
    if X_new.shape[1] != X.shape[1]:
        raise ValueError(f"X: expected {X.shape[1]} columns like the training X, got {X_new.shape[1]}")
    if not np.all(np.isfinite(X_new)):
        raise ValueError("X: contains NaN/inf values")
    lo, span = ssgp.input_scaling(X)
    Xs = (X_new - lo) / span
    n = Xs.shape[0]
    cols = [np.ones((n, 1))]
    if data.get("A") is not None:
        if A is None:
            raise ValueError(f"A: the model was fitted with a design matrix A ({data['A'].shape[1]} columns); "
                             f"pass A for the new points")
        cols.append(np.asarray(A, dtype=np.float64).reshape(n, -1))
    if data.get("group") is not None:
        J = ssgp.n_groups_of(data, hyper)
        slopes = ssgp.random_slopes(hyper)
        T = 1 + len(slopes)
        R = np.zeros((n, J * T))
        if group is not None:
            g = np.asarray(group, dtype=np.int64).reshape(-1)
            if g.size not in (1, n):
                raise ValueError(f"group: expected one group per row of X ({n}), got {g.size}")
            g = np.broadcast_to(g, (n,))
            if np.any(g >= J) or np.any(g < -1):
                raise ValueError(f"group: expected indices in 0..{J - 1} (or -1 / None for a new group, i.e. "
                                 f"without random effect), got values in {int(g.min())}..{int(g.max())}")
            C = ssgp.re_covariates(Xs, slopes)
            rows = np.flatnonzero(g >= 0)
            for t in range(T):
                R[rows, g[rows] * T + t] = C[rows, t]
        cols.append(R)
    return Xs, np.concatenate(cols, axis=1)


def group_codes_of(data, hyper, labels):
    """Codes 0..J-1 of new points' group ``labels`` in the numbering of the training data
    (``zoo.ssgp.group_codes``: the sorted distinct labels, or the labels themselves when ``n_groups`` is given);
    -1 / None: no random effect."""
    if labels is None or data.get("group") is None:
        return None
    known = np.arange(int(hyper["n_groups"])) if hyper.get("n_groups") is not None else factorize(data["group"])[1]
    return label_codes("group", labels, known)


def _coefficients(post):
    """(S, s) draws of beta = (beta0, A-coefficients, random effects b flattened (group, term))."""
    coefs = [post["beta0"].values[:, None]]
    if "beta" in post:
        coefs.append(post["beta"].values)
    if "tau" in post:
        b = post["b_raw"].values * post["tau"].values[:, None, :]
        coefs.append(b.reshape(b.shape[0], -1))
    return np.concatenate(coefs, axis=1)


@register_predictor(*MODELS)
def predict(tree, new_data, **options):
    """Posterior predictive summaries at ``new_data = {"X": (n*, d), "group": (n*,) optional, "A": (n*, s)
    optional}`` (a ``"y"`` entry is ignored).

    ``group``: the group label of each new point, as in the training data (absent, None or -1: population
    level, no random effect; a known label adds its group's random effect; an unknown label is a
    ``ValueError``). Returns a dict of arrays over the new points: ``f_mean``/``f_var`` (the GP
    part f = Z alpha), ``mean``/``var`` of the linear predictor eta = beta0 + f (+ A beta + random effect),
    and ``y_var`` (LMM: var + E[gamma^2]) or ``prob`` (binary models: P(y = 1), the average over draws of
    Phi(eta) for probit, of the logistic sigma(eta) for logit)."""
    if options:
        raise ValueError(f"{sorted(options)[0]}: not an option of the ssgp predictor (it takes none)")
    unknown = sorted(set(new_data) - {"X", "group", "A", "y"})
    if unknown:
        raise ValueError(f"new_data: unknown field {unknown[0]!r}; expected 'X' and optionally 'group', 'A'")
    if new_data.get("X") is None:
        raise ValueError("X: new_data needs the new inputs 'X' (n*, d)")
    spec, data, hyper = problem_of(tree)
    codes = group_codes_of(data, hyper, new_data.get("group"))
    Xs, Arow = new_design(data, hyper, new_data["X"], codes, new_data.get("A"))
    S = ssgp.spectral_points(hyper["m"], Xs.shape[1], hyper["spectral_seed"])
    m = S.shape[0]
    post = tree["posterior"].to_dataset().stack(sample=("chain", "draw")).transpose("sample", ...)
    lam, alpha_raw, sigma = post["lam"].values, post["alpha_raw"].values, post["sigma"].values
    alpha = alpha_raw * (sigma / np.sqrt(m))[:, None]
    lin = _coefficients(post) @ Arow.T                                           # (S, n*)
    lik = LIKELIHOOD_OF[spec.name]
    block = max(1, ROWS_PER_BLOCK // (len(sigma) * m))
    out = {k: np.empty(len(Xs)) for k in ("f_mean", "f_var", "mean", "var")}
    if lik != "gaussian":
        out["prob"] = np.empty(len(Xs))
    for lo in range(0, len(Xs), block):
        rows = slice(lo, lo + block)
        ang = np.einsum("ik,sk,rk->sir", Xs[rows], lam, S)
        f = np.einsum("sir,sr->si", np.cos(ang), alpha[:, :m]) + np.einsum("sir,sr->si", np.sin(ang), alpha[:, m:])
        eta = f + lin[:, rows]
        out["f_mean"][rows], out["f_var"][rows] = f.mean(0), f.var(0)
        out["mean"][rows], out["var"][rows] = eta.mean(0), eta.var(0)
        if lik != "gaussian":
            out["prob"][rows] = (ndtr(eta) if lik == "probit" else expit(eta)).mean(0)
    if lik == "gaussian":
        out["y_var"] = out["var"] + np.mean(post["gamma"].values ** 2)
    return out
