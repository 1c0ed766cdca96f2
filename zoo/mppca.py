"""Bayesian mixtures of probabilistic PCA (Bruneau, Gelgon & Picarougne, "A low-cost variational-Bayes
technique for merging mixtures of probabilistic principal component analyzers", Information Fusion 14
(2013) 268-280; paper page ``docs/papers/mppca.md``, cited N<section>).

Generative story (N2.4, paper eqs. 24-28; k = 1..K components, j = 1..q loading columns)::

    omega        ~ Dirichlet(alpha0 1_K)                       mixture weights (alpha0 << 1 prunes components)
    nu_kj        ~ Gamma(a0, b0)                               ARD precision of column j of Lambda_k
    Lambda_k^j   ~ N(0, nu_kj^-1 I_d)                          loadings; site ``Wt`` = Lambda_k^T  (K, q, d)
    mu_k         ~ N(mu0_k, nu0^-1 I_d)                        component means
    tau          ~ Gamma(a_tau, b_tau)                         shared noise precision (learned by default;
                                                                ``tau_fixed=1.0`` is the paper's fixed tau)
    z_n          ~ Cat(omega),  x_n ~ N(0, I_q)
    y_n | z_n=k  ~ N(Lambda_k x_n + mu_k, tau^-1 I_d)

The NumPyro model marginalises z and x: y_n ~ sum_k omega_k N(mu_k, C_k), C_k = Lambda_k Lambda_k^T + tau^-1 I
(N2.6), so NUTS/SVI run on small problems. ``ppca`` is the single-component model (no omega).

Data contract: ``Y`` (N, d) finite floats, d >= 2. Hyperparameters: ``K`` (K_init), ``q`` (None = d - 1),
the priors above (``prior="weak"``, the default: alpha0 = a0 = b0 = a_tau = b_tau = 1, nu0 = 0.01, which NUTS
and SVI can sample; ``prior="paper"``: the notes' [VBmix] values, 1e-3 everywhere, see ``PRIORS``), ``mu0``
(None = the data mean for every component; the paper scatters mu0_k in the data box, which only matters as an
initialisation, N2.4).

Simulators (N5.1): ``simulate`` = SYN1 (4 well-separated 2-D Gaussian blobs embedded in 9-D by the VBmix
transform T, plus N(0, noise^2 I) noise; with noise = 1 = tau^-1 this is exactly an MPPCA with q = 2);
``simulate_syn2`` (noisy half-sphere in 3-D), ``simulate_syn3`` (noisy circle embedded in 9-D),
``simulate_small`` (the notes' T11 problem: d = 3, K = 2 separated by >= 8, q = 1), ``simulate_ppca``;
``load_digits_data`` (scikit-learn's bundled 8x8 digits rescaled per pixel to [-10, 10], N5.4).
Every simulator returns held-out points ``Y_test`` in ``truth``.

Label-invariant summaries (what diagnostics compare): components sorted by their mean's first coordinate:
``mu_sorted``, ``omega_sorted``, the upper triangle of ``C_sorted`` (C_k is invariant to rotations/signs of
Lambda_k), and ``tau``.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import xarray as xr

from zoo._datasets import SKLEARN, UCI, standardised_table
from zoo._registry import DataField, Hyper, ModelSpec, RealDataset, ZooSettings, register

# --------------------------------------------------------------------------------------------------
# The generative models
# --------------------------------------------------------------------------------------------------


def _components(mu, Wt, tau):
    """Component marginals N(mu_k, Lambda_k Lambda_k^T + tau^-1 I) (batch over leading axes)."""
    d = mu.shape[-1]
    W = jnp.swapaxes(Wt, -1, -2)                                   # (..., d, q)
    diag = jnp.broadcast_to(1.0 / tau, mu.shape[:-1] + (d,))
    return dist.LowRankMultivariateNormal(mu, W, diag)


def model(Y, K, q, mu0, tau_fixed=None, alpha0=1e-3, a0=1e-3, b0=1e-3, nu0=1e-3, a_tau=1e-3, b_tau=1e-3):
    """Bayesian MPPCA (N2.4) with z and x marginalised; ``mu0`` (K, d) prior means."""
    N, d = Y.shape
    omega = numpyro.sample("omega", dist.Dirichlet(jnp.full(K, alpha0)))                  # (K,)
    with numpyro.plate("component_k", K, dim=-2), numpyro.plate("column_j", q, dim=-1):
        nu = numpyro.sample("nu", dist.Gamma(a0, b0))                                      # (K, q)
        Wt = numpyro.sample("Wt", dist.Normal(0.0, 1.0 / jnp.sqrt(nu)[..., None])
                            .expand([K, q, d]).to_event(1))                                # (K, q, d)
    with numpyro.plate("component", K, dim=-1):
        mu = numpyro.sample("mu", dist.Normal(mu0, nu0 ** -0.5).to_event(1))              # (K, d)
    tau = numpyro.sample("tau", dist.Gamma(a_tau, b_tau)) if tau_fixed is None else tau_fixed
    mix = dist.MixtureSameFamily(dist.Categorical(probs=omega), _components(mu, Wt, tau))
    with numpyro.plate("row", N):
        numpyro.sample("y", mix, obs=Y)


def ppca_model(Y, q, mu0, tau_fixed=None, a0=1e-3, b0=1e-3, nu0=1e-3, a_tau=1e-3, b_tau=1e-3):
    """Bayesian PPCA (N2.2 with the priors of N2.4; single component), x marginalised."""
    N, d = Y.shape
    with numpyro.plate("column_j", q):
        nu = numpyro.sample("nu", dist.Gamma(a0, b0))                                      # (q,)
        Wt = numpyro.sample("Wt", dist.Normal(0.0, 1.0 / jnp.sqrt(nu)[:, None]).expand([q, d]).to_event(1))
    mu = numpyro.sample("mu", dist.Normal(mu0, nu0 ** -0.5).to_event(1))                  # (d,)
    tau = numpyro.sample("tau", dist.Gamma(a_tau, b_tau)) if tau_fixed is None else tau_fixed
    with numpyro.plate("row", N):
        numpyro.sample("y", _components(mu, Wt, tau), obs=Y)


def resolved_q(hyper, d):
    """The number of loading columns: ``hyper['q']`` or d - 1 when None."""
    return d - 1 if hyper.get("q") is None else int(hyper["q"])


def prior_means(data, hyper, K):
    """mu0 (K, d): ``hyper['mu0']`` broadcast, or the data mean for every component."""
    Y = np.asarray(data["Y"], float)
    mu0 = Y.mean(0) if hyper.get("mu0") is None else np.asarray(hyper["mu0"], float)
    return np.broadcast_to(mu0, (K, Y.shape[1])).copy()


def _common_inputs(data, hyper):
    out = {"Y": np.asarray(data["Y"], float), "q": resolved_q(hyper, data["Y"].shape[1]),
           "tau_fixed": None if hyper.get("tau_fixed") is None else float(hyper["tau_fixed"])}
    for k in ("a0", "b0", "nu0", "a_tau", "b_tau"):
        out[k] = float(hyper[k])
    return out


def model_inputs(data, hyper):
    K = int(hyper["K"])
    return {**_common_inputs(data, hyper), "K": K, "alpha0": float(hyper["alpha0"]),
            "mu0": prior_means(data, hyper, K)}


def ppca_inputs(data, hyper):
    return {**_common_inputs(data, hyper), "mu0": prior_means(data, hyper, 1)[0]}


# --------------------------------------------------------------------------------------------------
# Simulators (N5.1)
# --------------------------------------------------------------------------------------------------


def embedding(rng, dims=9):
    """VBmix ``generate2Dtransform``: Gram-Schmidt of a (dims, 2) N(0,1) matrix (redrawn if near-singular),
    then T[:2, :2] = I so the first two coordinates are the raw 2-D signal."""
    while True:
        A = rng.normal(size=(dims, 2))
        if np.linalg.det(A.T @ A) >= 1e-3:
            break
    T, _ = np.linalg.qr(A)
    T[:2, :2] = np.eye(2)
    return T


def _random_cov2(rng):
    """VBmix's random 2x2 covariance: diagonal ~ U(2, 10), off-diagonal ~ U(-m, m), m = mean diagonal, PD."""
    while True:
        dg = rng.uniform(2, 10, size=2)
        m = dg.mean()
        off = rng.uniform(-m, m)
        S = np.array([[dg[0], off], [off, dg[1]]])
        if np.linalg.eigvalsh(S)[0] > 0.2:
            return S


def simulate(seed, N=500, N_test=1000, d=9, noise=1.0, sep=10.0):
    """SYN1 (N5.1): x ~ 2-D GMM with 4 equal-weight components at (+-sep, +-sep) and VBmix random covariances;
    y = T x + N(0, noise^2 I_d). Component k of y is N(T m_k, T S_k T^T + noise^2 I): an MPPCA with q = 2.

    Returns ``(data, truth)``: data = {Y}; truth = {labels, mu (4, d), C (4, d, d), omega, T, S2 (2-D
    covariances), m2 (2-D means), Y_test, labels_test, hyperparameters}."""
    rng = np.random.default_rng(seed)
    T = embedding(rng, d)
    m2 = sep * np.array([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]])
    S2 = np.stack([_random_cov2(rng) for _ in range(4)])
    omega = np.full(4, 0.25)

    def draw(n):
        z = rng.choice(4, size=n, p=omega)
        x = m2[z] + np.einsum("nij,nj->ni", np.linalg.cholesky(S2)[z], rng.normal(size=(n, 2)))
        return x @ T.T + noise * rng.normal(size=(n, d)), z

    Y, z = draw(N)
    Yt, zt = draw(N_test)
    C = np.einsum("ia,kab,jb->kij", T, S2, T) + noise**2 * np.eye(d)
    truth = {"labels": z, "mu": m2 @ T.T, "C": C, "omega": omega, "T": T, "S2": S2, "m2": m2,
             "Y_test": Yt, "labels_test": zt, "hyperparameters": {"q": 2, "tau_fixed": 1.0 / noise**2}}
    return {"Y": Y}, truth


def simulate_syn2(seed, N=500, N_test=1000, r=10.0, s=1.0):
    """SYN2 (N5.1): noisy half-sphere in 3-D, theta ~ U(0, pi/2), phi ~ U(-pi, pi), noise variance s."""
    rng = np.random.default_rng(seed)

    def draw(n):
        th, ph = rng.uniform(0, np.pi / 2, n), rng.uniform(-np.pi, np.pi, n)
        y = r * np.stack([np.cos(th) * np.cos(ph), np.cos(th) * np.sin(ph), np.sin(th)], 1)
        return y + np.sqrt(s) * rng.normal(size=(n, 3))

    return {"Y": draw(N)}, {"Y_test": draw(N_test), "hyperparameters": {}}


def simulate_syn3(seed, N=500, N_test=1000, r=10.0, s=1.0, d=9):
    """SYN3 (N5.1): noisy circle u = r (cos t, sin t) + N(0, s I_2), y = T u + N(0, (sqrt(s)/10)^2 I_d)."""
    rng = np.random.default_rng(seed)
    T = embedding(rng, d)

    def draw(n):
        t = rng.uniform(0, 2 * np.pi, n)
        u = r * np.stack([np.cos(t), np.sin(t)], 1) + np.sqrt(s) * rng.normal(size=(n, 2))
        return u @ T.T + np.sqrt(s) / 10 * rng.normal(size=(n, d))

    return {"Y": draw(N)}, {"Y_test": draw(N_test), "T": T, "hyperparameters": {}}


def simulate_small(seed, N=200, N_test=1000):
    """The notes' T11 problem: d = 3, K = 2 well-separated components (|mu_1 - mu_2| = 10), q = 1, tau = 1."""
    rng = np.random.default_rng(seed)
    mu = np.array([[-5.0, 0.0, 1.0], [5.0, 1.0, -1.0]])
    W = np.array([[[2.0], [1.0], [0.5]], [[0.5], [-1.5], [2.0]]])       # (K, d, q)
    omega = np.array([0.4, 0.6])

    def draw(n):
        z = rng.choice(2, size=n, p=omega)
        x = rng.normal(size=(n, 1))
        return mu[z] + np.einsum("nij,nj->ni", W[z], x) + rng.normal(size=(n, 3)), z

    Y, z = draw(N)
    Yt, _ = draw(N_test)
    C = W @ np.swapaxes(W, 1, 2) + np.eye(3)
    return {"Y": Y}, {"labels": z, "mu": mu, "W": W, "C": C, "omega": omega, "Y_test": Yt,
                      "hyperparameters": {"K": 2, "q": 1, "tau_fixed": 1.0}}


def simulate_ppca(seed, N=200, N_test=1000, d=5, scales=(5.0, 3.0), tau=1.0):
    """PPCA: Lambda = orthonormal (d, q) diag(scales), mu ~ N(0, 4 I), y = Lambda x + mu + N(0, tau^-1 I)."""
    rng = np.random.default_rng(seed)
    q = len(scales)
    U, _ = np.linalg.qr(rng.normal(size=(d, q)))
    W = U * np.asarray(scales, float)
    mu = 2.0 * rng.normal(size=d)

    def draw(n):
        return rng.normal(size=(n, q)) @ W.T + mu + tau ** -0.5 * rng.normal(size=(n, d))

    return {"Y": draw(N)}, {"W": W, "mu": mu, "C": W @ W.T + np.eye(d) / tau, "tau": tau,
                            "Y_test": draw(N_test), "hyperparameters": {"q": q}}


def load_digits_data(seed=0, n_test=400):
    """scikit-learn's bundled digits (1797 x 64): constant pixels removed, each pixel rescaled to [-10, 10]
    (VBmix ``setDomain``, N5.4), a random held-out set of ``n_test`` images. Returns (data, truth) with truth
    {Y_test, labels, labels_test}."""
    from sklearn.datasets import load_digits

    X, lab = load_digits(return_X_y=True)
    X = X[:, X.std(0) > 0].astype(float)
    lo, hi = X.min(0), X.max(0)
    X = -10 + 20 * (X - lo) / (hi - lo)
    perm = np.random.default_rng(seed).permutation(len(X))
    te, tr = perm[:n_test], perm[n_test:]
    return {"Y": X[tr]}, {"Y_test": X[te], "labels": lab[tr], "labels_test": lab[te], "hyperparameters": {}}


# --------------------------------------------------------------------------------------------------
# Label-invariant summaries
# --------------------------------------------------------------------------------------------------


def _arr(posterior, name):
    return np.asarray(posterior[name].transpose("chain", "draw", ...).values)


def summaries(posterior, data, hyper):
    """Components sorted by the first coordinate of their mean: ``mu_sorted`` (rank, feature),
    ``omega_sorted``, ``C_sorted`` = upper triangle of Lambda_k Lambda_k^T + tau^-1 I (rank, entry; an entry is
    named by its two features, ``"Bwt,Hwt"``, or their positions ``"0,1"``), ``tau``."""
    mu, Wt = _arr(posterior, "mu"), _arr(posterior, "Wt")
    if mu.ndim == 3:                                                   # ppca: one component
        mu, Wt = mu[:, :, None], Wt[:, :, None]
    tau = _arr(posterior, "tau") if "tau" in posterior else np.full(mu.shape[:2], float(hyper["tau_fixed"]))
    C = np.einsum("cskqi,cskqj->cskij", Wt, Wt) + np.eye(mu.shape[-1]) / tau[..., None, None, None]
    order = np.argsort(mu[..., 0], axis=-1)
    take = lambda a: np.take_along_axis(a, order.reshape(order.shape + (1,) * (a.ndim - 3)), axis=2)  # noqa: E731
    iu = np.triu_indices(mu.shape[-1])
    out = {"mu_sorted": (("chain", "draw", "rank", "feature"), take(mu)),
           "C_sorted": (("chain", "draw", "rank", "entry"), take(C)[..., iu[0], iu[1]]),
           "tau": (("chain", "draw"), tau)}
    if "omega" in posterior:
        out["omega_sorted"] = (("chain", "draw", "rank"), take(_arr(posterior, "omega")))
    names = ([str(v) for v in posterior["feature"].values] if "feature" in posterior.coords
             else [str(i) for i in range(mu.shape[-1])])
    coords = {"chain": posterior["chain"].values, "draw": posterior["draw"].values,
              "rank": np.arange(mu.shape[2]), "feature": np.arange(mu.shape[-1]),
              "entry": [f"{names[i]},{names[j]}" for i, j in zip(*iu, strict=True)]}  # C_sorted[k,Bwt,Hwt]
    return xr.Dataset(out, coords=coords)


# --------------------------------------------------------------------------------------------------
# Checks, coordinates, hyperparameters and real data
# --------------------------------------------------------------------------------------------------


def check(data, hyper):
    """Model-specific input checks (before compilation)."""
    N, d = data["Y"].shape
    if d < 2:
        raise ValueError(f"data['Y']: PPCA needs at least 2 columns (q >= 1 loading columns and q < d), got d={d}")
    q = resolved_q(hyper, d)
    if not 1 <= q < d:
        raise ValueError(f"q: expected an integer with 1 <= q < d = {d} (None means d - 1), got {hyper.get('q')!r}")
    if N < 2:
        raise ValueError(f"data['Y']: need at least 2 rows, got {N}")
    mu0 = hyper.get("mu0")
    if mu0 is not None:
        m = np.asarray(mu0, float)
        if m.shape not in ((d,), (int(hyper.get("K", 1)), d)) or not np.all(np.isfinite(m)):
            raise ValueError(f"mu0: expected None, a finite ({d},) vector or a (K, d) array, got shape {m.shape}")


def coords(data, hyper):
    N, d = data["Y"].shape
    return {"feature": np.arange(d), "column": np.arange(resolved_q(hyper, d)), "row": np.arange(N),
            "component": np.arange(int(hyper.get("K", 1)))}


# Prior presets (hyperparameter ``prior``). "weak", the default: proper priors that NUTS and SVI can sample
# on the model's own simulated data. "paper": the notes' [VBmix] values, Gamma(1e-3, 1e-3) on every precision
# and alpha0 = 1e-3, what VB-EM's automatic pruning was designed with. They are too vague for the baselines:
# a Gamma(1e-3, 1e-3) draw of tau or nu underflows to 0 (its median is ~1e-300), so NUTS started from a prior
# draw meets an infinite covariance ("invalid cov_factor") and SVI from the prior median runs off to
# tau = 1e-107; alpha0 = 1e-3 puts omega at the simplex's corners, where NUTS produced 783,000 non-finite values.
PRIORS = {
    "weak": {"alpha0": 1.0, "a0": 1.0, "b0": 1.0, "nu0": 0.01, "a_tau": 1.0, "b_tau": 1.0},
    "paper": {"alpha0": 1e-3, "a0": 1e-3, "b0": 1e-3, "nu0": 1e-3, "a_tau": 1e-3, "b_tau": 1e-3},
}
PAPER_PRIORS = {"prior": "paper", **PRIORS["paper"]}   # for code that builds hyperparameter dicts itself


def _presets(mixture: bool):
    return {"prior": {name: {k: v for k, v in p.items() if mixture or k != "alpha0"} for name, p in PRIORS.items()}}


def _hypers(mixture: bool):
    w = PRIORS["weak"]
    h = {"q": Hyper(None, "positive_int|None", "loading columns per component (None = d - 1; ARD switches off "
                                               "extra ones)"),
         "tau_fixed": Hyper(None, "positive|None", "None: tau learned with Gamma(a_tau, b_tau); a number: fixed "
                                                  "noise precision (the paper's tau = 1)"),
         "prior": Hyper("weak", "string", "prior preset: 'weak' (default; NUTS/SVI can sample it) or 'paper' "
                                          "(Gamma(1e-3, 1e-3) precisions, alpha0 = 1e-3: VB-EM's pruning); "
                                          "explicit values below override it"),
         "a0": Hyper(w["a0"], "positive", "Gamma shape of the ARD precisions nu"),
         "b0": Hyper(w["b0"], "positive", "Gamma rate of the ARD precisions nu"),
         "nu0": Hyper(w["nu0"], "positive", "prior precision of the component means"),
         "a_tau": Hyper(w["a_tau"], "positive", "Gamma shape of tau's prior"),
         "b_tau": Hyper(w["b_tau"], "positive", "Gamma rate of tau's prior"),
         "mu0": Hyper(None, "real[]|None", "prior mean of the component means (None = data mean)")}
    if mixture:
        h = {"K": Hyper(10, "positive_int", "number of components K_init (pruned by the Dirichlet prior)"),
             "alpha0": Hyper(w["alpha0"], "positive", "Dirichlet concentration (<< 1 prunes components; the "
                                                     "paper's 1e-3 with prior='paper')"), **h}
    return h


PAPER = ("Bruneau, Gelgon & Picarougne, A low-cost variational-Bayes technique for merging mixtures of "
         "probabilistic principal component analyzers, Information Fusion 14 (2013) 268-280; errata: "
         "docs/papers/mppca.md")


DIGITS = RealDataset(
    loader=load_digits_data, source="sklearn.datasets.load_digits", licence=f"{SKLEARN}; {UCI}",
    description="8 x 8 images of handwritten digits (UCI test set, Alpaydin & Kaynak), constant pixels dropped, "
                "each pixel rescaled to [-10, 10] (N5.4); 400 random images held out. The paper's real data; too "
                "large for a NUTS reference, so not in the demo",
    sizes={"n": 1397, "d": 61}, hyper={"K": 10, "q": 4}, in_demo=False)
IRIS = RealDataset(
    loader=functools.partial(standardised_table, "iris"), source="sklearn.datasets.load_iris",
    licence=f"{SKLEARN}; {UCI}",
    description="sepal and petal length and width of 150 irises of 3 species (Fisher 1936), standardised; two "
                "components (setosa apart from the two others) of one loading each",
    sizes={"n": 150, "d": 4}, hyper={"K": 2, "q": 1},
    # NUTS from prior draws can leave a chain in a second mode; uniform(-2, 2) initial values do not
    # (benchmarks/results.md, run_lengths)
    reference_options={"init": "uniform"})
WINE = RealDataset(
    loader=functools.partial(standardised_table, "wine"), source="sklearn.datasets.load_wine",
    licence=f"{SKLEARN}; {UCI}",
    description="13 chemical measurements of 178 Italian wines from 3 cultivars (Forina et al.), standardised; a "
                "2-dimensional principal subspace",
    sizes={"n": 178, "d": 13}, hyper={"q": 2})


# --------------------------------------------------------------------------------------------------
# The zoo's settings of mppca and ppca (tuned option defaults, tiny data, the demo, the stored references): not
# part of the models (zoo.ZooSettings)
# --------------------------------------------------------------------------------------------------

NUTS_PRIORS = {"alpha0": 1.0, "a0": 1.0, "b0": 1.0, "nu0": 0.01, "tau_fixed": 1.0}   # notes T11 (no funnels)

T11_NUTS = {"num_warmup": 1000, "num_samples": 2000, "num_chains": 4, "K": 2, "q": 1, **NUTS_PRIORS,
            "a_tau": 1e-3, "b_tau": 1e-3, "mu0": None}


def reference_datasets():
    """Stored NUTS reference ``t11``: the notes' T11 problem (``simulate_small(0)``), 4 x 2000 draws thinned to
    4000."""
    return {"t11": (simulate_small(0)[0], dict(T11_NUTS))}


SETTINGS = ZooSettings(
    method_options={"nuts": {"target_accept_prob": 0.9}},
    tiny_sizes={"N": 40, "N_test": 2},
    tiny_hyperparameters={"K": 2, "q": 1},
    demo_sizes={"N": 200, "N_test": 200},
    # zoo compare/demo run on the T11 problem (the stored reference), every method on the same model.
    # NUTS 2 x 2000: ESS >= 400 on every summary (benchmarks/results.md, run_lengths).
    demo_options={"nuts": {"num_warmup": 500, "num_samples": 2000, "K": 2, "q": 1, **NUTS_PRIORS},
                  "svi": {"num_steps": 3000, "K": 2, "q": 1, **NUTS_PRIORS},
                  "vbem": {"K": 2, "q": 1, **NUTS_PRIORS},
                  "em": {"K": 2, "q": 1, "tau_fixed": 1.0},
                  "vbgmm": {"K": 2, "prior": "paper"}},
    reference_options=dict(T11_NUTS),
    reference_datasets=reference_datasets,
)

PPCA_SETTINGS = ZooSettings(
    method_options={"nuts": {"target_accept_prob": 0.9}},
    tiny_sizes={"N": 30},
    tiny_hyperparameters={"q": 1},
    demo_sizes={"N": 200},
    # NUTS 2 x 2000: R-hat < 1.01 and ESS >= 400 on every summary (benchmarks/results.md, run_lengths).
    demo_options={"nuts": {"num_warmup": 500, "num_samples": 2000, "q": 2, "prior": "paper", "a0": 1.0, "b0": 1.0,
                           "nu0": 0.01},
                  # init "uniform": the Gamma(1e-3, 1e-3) prior median of tau is ~1e-300, and SVI started
                  # there ran off to tau = 1e-107 (C = 1e107); from uniform(-2, 2) it converges.
                  "svi": {"num_steps": 3000, "q": 2, "prior": "paper", "a0": 1.0, "b0": 1.0, "nu0": 0.01,
                          "init": "uniform"}},
    reference_options={"num_warmup": 1000, "num_samples": 4000, "num_chains": 4, "q": 2, "a0": 1.0, "b0": 1.0,
                       "nu0": 0.01, "tau_fixed": None, "a_tau": 1e-3, "b_tau": 1e-3, "mu0": None},
)


# --------------------------------------------------------------------------------------------------
# The models' specs
# --------------------------------------------------------------------------------------------------

SPEC = register(ModelSpec(
    name="mppca",
    paper=PAPER,
    description="Bayesian mixture of probabilistic PCA: y_n ~ sum_k omega_k N(mu_k, Lambda_k Lambda_k^T + "
                "tau^-1 I), Dirichlet weights, ARD Gaussian-Gamma loadings, Gaussian means, shared noise "
                "precision tau (learned, or fixed as in the paper). VB-EM selects the number of components and "
                "their subspace dimensions automatically.",
    model=model,
    simulate=simulate,
    data_fields=(DataField("Y", ("n", "d"), doc="observations (N, d), finite"),),
    hyperparameters=_hypers(True),
    hyper_presets=_presets(True),
    likelihood_sites=("y",),
    observed_fields=("Y",),
    model_inputs=model_inputs,
    check=check,
    dims={"omega": ["component"], "nu": ["component", "column"], "Wt": ["component", "column", "feature"],
          "mu": ["component", "feature"], "y": ["row"]},
    coords=coords,
    axis_dims={"n": "row", "d": "feature"},
    summaries=summaries,
    bounded={"omega_sorted": (0.0, 1.0)},
    real_datasets={"iris": IRIS, "digits": DIGITS},
    settings=SETTINGS,
))

PPCA_SPEC = register(ModelSpec(
    name="ppca",
    paper=PAPER,
    description="Bayesian probabilistic PCA (one component of mppca): y_n ~ N(mu, Lambda Lambda^T + tau^-1 I), "
                "ARD Gaussian-Gamma loadings, Gaussian mean, noise precision tau (learned or fixed).",
    model=ppca_model,
    simulate=simulate_ppca,
    data_fields=(DataField("Y", ("n", "d"), doc="observations (N, d), finite"),),
    hyperparameters=_hypers(False),
    hyper_presets=_presets(False),
    likelihood_sites=("y",),
    observed_fields=("Y",),
    model_inputs=ppca_inputs,
    check=check,
    dims={"nu": ["column"], "Wt": ["column", "feature"], "mu": ["feature"], "y": ["row"]},
    coords=coords,
    axis_dims={"n": "row", "d": "feature"},
    summaries=summaries,
    real_datasets={"wine": WINE},
    settings=PPCA_SETTINGS,
))
