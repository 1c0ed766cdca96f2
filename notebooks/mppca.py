# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Bayesian mixtures of PPCA by variational Bayes (Bruneau, Gelgon & Picarougne 2013)
#
# **What you will learn:** how VB-EM for a mixture of probabilistic PCA switches off the components and subspace
# directions the data do not need; how close it is to NUTS; the paper's comparison with a Gaussian mixture; real
# data from scikit-learn.
#
# **The model.** Each observation $y_n \in \mathbb R^d$ comes from one of $K$ probabilistic PCA analysers:
#
# $$\omega \sim \mathrm{Dir}(\alpha_0 1_K),\quad \nu_{kj} \sim \mathrm{Ga}(a_0, b_0),\quad
# \Lambda_k^{j} \sim \mathcal N(0, \nu_{kj}^{-1} I_d),\quad \mu_k \sim \mathcal N(\mu_0, \nu_0^{-1} I_d),$$
# $$z_n \sim \mathrm{Cat}(\omega),\quad x_n \sim \mathcal N(0, I_q),\quad
# y_n \mid z_n = k \sim \mathcal N(\Lambda_k x_n + \mu_k, \tau^{-1} I_d).$$
#
# Marginally $y_n \sim \sum_k \omega_k \mathcal N(\mu_k, \Lambda_k\Lambda_k^\top + \tau^{-1} I)$: a Gaussian
# mixture whose covariances are "low rank + noise". With a tiny Dirichlet concentration ($\alpha_0 = 10^{-3}$)
# superfluous components empty themselves, and the ARD precisions $\nu_{kj}$ switch off superfluous loading
# columns, so VB-EM started with many components and $q = d - 1$ columns picks both the number of components
# and each component's subspace dimension. The zoo model marginalises $z$ and $x$ so that NUTS can run it.

# %%
import os

FAST = os.environ.get("FAST", "0") == "1"  # FAST=1: the quick sizes the test suite runs
N_SYN = 500 if FAST else 1000          # training points of the synthetic sets
K_SYN3 = 10 if FAST else 20            # K_init on SYN3
MAX_ITER = 1500                        # VB-EM sweeps on SYN1 (emptying components takes many sweeps)
MAX_ITER_SYN3 = 300 if FAST else 1500
N_INIT = 1 if FAST else 3              # VB restarts
N_SETS = 1 if FAST else 5              # SYN3 training sets in the paper's comparison
RUN_NUTS = not FAST                    # FAST: use the stored NUTS reference instead of refitting
VB_DRAWS = 2000 if FAST else 4000

# %%
import numpyro  # noqa: F401,I001  (numpyro before arviz)
import jax
import matplotlib.pyplot as plt
import numpy as np
from sklearn.mixture import BayesianGaussianMixture

import inference
from diagnostics import references
from diagnostics.scoring import compared_posterior, scorecard
from inference.mppca import common as V
from inference.mppca import vbem
from zoo import mppca

# %% [markdown]
# ## SYN1: four blobs in a 2-D plane embedded in 9-D
#
# The paper's first synthetic process (SYN1 on the MPPCA paper page): a 2-D mixture of 4 well-separated
# Gaussians mapped into $\mathbb R^9$ by a fixed linear map $T$ (whose top 2x2 block is the identity), plus
# unit-variance noise. Each cluster is then exactly a PPCA with $q = 2$ and $\tau = 1$.

# %%
data, truth = mppca.simulate(0, N=N_SYN)
tree = inference.fit("mppca", data, "vbem", seed=0, K=10, q=8, tau_fixed=1.0, num_restarts=N_INIT, num_samples=200,
                     prior="paper",
                     max_iter=MAX_ITER, tol=1e-8)
var = tree["variational"].to_dataset()
print("kept components K' =", tree.attrs["K_eff"], " Algorithm-1 ranks:", var["rank"].values)
print("N_k:", np.round(var["N_k"].values, 1))

# %%
fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
bound = tree["sample_stats"]["bound"].values
ax[0].plot(bound)
ax[0].set(xlabel="VB-EM sweep", ylabel="lower bound F", title="bound (monotone)")
ax[1].scatter(data["Y"][:, 0], data["Y"][:, 1], s=4, c="0.6")
summ_means = var["m_mu"].values[var["kept"].values]
ax[1].scatter(summ_means[:, 0], summ_means[:, 1], c="r", marker="x", s=80, label="kept VB means")
ax[1].scatter(truth["mu"][:, 0], truth["mu"][:, 1], facecolors="none", edgecolors="k", s=120, label="truth")
ax[1].legend()
ax[1].set(title="first two coordinates (the 2-D signal)")
plt.show()

# %% [markdown]
# Left: the lower bound after every sweep. With the corrected responsibilities (the $+\tfrac12\ln|\Sigma_{x_k}|$
# term the paper omits, erratum E4) every factor update is an exact coordinate-ascent step, so the curve never
# goes down; the paper attributes its decreasing bound to "strongly coupled moments", but it is this missing
# term. Right: of the 10 initial components, four survive, on the four true means; their subspace ranks are
# chosen by Algorithm 1 (most are 2, the true rank; a cluster whose second 2-D eigenvalue is small can get 1).

# %% [markdown]
# ## VB against NUTS on a small problem (T11 on the MPPCA paper page)
#
# $d = 3$, $K = 2$ components 10 apart, $q = 1$, $N = 200$, $\tau = 1$ known and moderate priors
# ($\alpha_0 = a_0 = b_0 = 1$, $\nu_0 = 0.01$; the $10^{-3}$ priors give NUTS funnels). Components are
# compared after sorting them by their mean's first coordinate (label switching), and the covariances
# $C_k = \Lambda_k\Lambda_k^\top + \tau^{-1}I$, which do not depend on the rotation of $\Lambda_k$.

# %%
small, _ = references.reference_data("mppca", "t11")   # the arrays stored with the NUTS reference
opts = dict(mppca.T11_NUTS)
hyper = {k: opts.pop(k) for k in list(opts) if k in ("K", "q", "alpha0", "a0", "b0", "nu0", "tau_fixed")}
ref = inference.fit("mppca", small, "nuts", seed=0, **opts, **hyper) if RUN_NUTS else \
    references.load("mppca", small, tag="t11")
vb = inference.fit("mppca", small, "vbem", seed=0, num_samples=VB_DRAWS, **hyper)
cands = {"vbem": vb}
if not FAST:
    cands["svi"] = inference.fit("mppca", small, "svi", seed=0, num_steps=5000, **hyper)
sc = scorecard(ref, cands)
sc[["method", "parameter", "mean_ref", "mean", "std_mean_error", "sd_ratio", "w1_sd"]].round(3)

# %%
pv, pr = compared_posterior(vb), compared_posterior(ref)
fig, axes = plt.subplots(1, 3, figsize=(12, 3))
for i, ax in enumerate(axes):
    for k in range(2):
        ax.hist(pr["mu_sorted"].values[..., k, i].ravel(), bins=40, density=True, color="k", alpha=0.4,
                label="NUTS" if k == 0 else None)
        ax.hist(pv["mu_sorted"].values[..., k, i].ravel(), bins=40, density=True, histtype="step", color="C1",
                label="VB" if k == 0 else None)
    ax.set(title=f"mu[:, {i}]")
axes[0].legend()
plt.show()

# %% [markdown]
# Posterior marginals of the two (sorted) component means, NUTS in grey, VB-EM outlined. The means agree;
# VB is somewhat narrower (mean-field under-dispersion, expected: we accept 0.3x-1.2x of the NUTS sd).

# %% [markdown]
# ## The paper's main experiment at small scale: SYN3 (claim C3)
#
# A noisy circle embedded in 9-D. A Gaussian mixture needs many full-covariance blobs to follow it; a mixture
# of PPCA follows it with elongated rank-1 analysers. The paper (Table 3, N = 1000) reports a held-out
# log-likelihood on the first two coordinates of **-5138 for VBMPPCA vs -6335 for VBGMM** (sums over 1000
# validation points; the absolute values depend on unreported generator settings, so compare the ordering).
# Our VBGMM is scikit-learn's `BayesianGaussianMixture` (full covariances, same K_init, Dirichlet-distribution
# prior with concentration 10^-3).


# %%
def marginal_2d(Y, w, m, C):
    return V.gmm_logpdf(Y[:, :2], w, m[:, :2], C[:, :2, :2]).sum()


rows = []
for s in range(N_SETS):
    d3, t3 = mppca.simulate_syn3(100 + s, N=N_SYN)
    hyper3 = {**mppca.SPEC.default_hyper, **mppca.PAPER_PRIORS, "K": K_SYN3, "q": 8, "tau_fixed": 1.0}
    cfg, res = vbem.fit_vbem(d3["Y"], hyper3,
                             jax.random.key(s), num_restarts=N_INIT, max_iter=MAX_ITER_SYN3, tol=1e-8)
    sm = V.summary_of(cfg, res.state)
    g = BayesianGaussianMixture(n_components=K_SYN3, covariance_type="full", weight_concentration_prior=1e-3,
                                weight_concentration_prior_type="dirichlet_distribution", max_iter=1000,
                                random_state=s).fit(d3["Y"])
    keep = g.weights_ > 2 / len(d3["Y"])
    rows.append((marginal_2d(t3["Y_test"], sm["weights"], sm["means"], sm["covariances"]),
                 marginal_2d(t3["Y_test"], g.weights_[keep] / g.weights_[keep].sum(), g.means_[keep],
                             g.covariances_[keep]), len(sm["keep"]), int(keep.sum())))
rows = np.array(rows)
ll, kk = rows[:, :2].mean(0), rows[:, 2:].mean(0)
print(f"held-out 2-D log-lik  VBMPPCA {ll[0]:.0f}   VBGMM {ll[1]:.0f}   (paper: -5138 vs -6335)")
print(f"K'  VBMPPCA {kk[0]:.1f}   VBGMM {kk[1]:.1f}   (paper: 6.5 vs 1.03)")

# %%
fig, ax = plt.subplots(figsize=(5, 3))
ax.bar(["VBMPPCA\n(ours)", "VBGMM\n(sklearn)"], rows[:, :2].mean(0), color=["C1", "C0"])
ax.axhline(-5138, color="C1", ls="--", label="paper VBMPPCA")
ax.axhline(-6335, color="C0", ls="--", label="paper VBGMM")
ax.set(ylabel="held-out 2-D log-lik (1000 pts)")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# Bars: our held-out log-likelihoods on SYN3; dashed lines: the paper's Table 3 values at N = 1000. The
# ordering (MPPCA above GMM on manifold-like data) is the paper's claim C3.
#
# **What the errata changed.** (E4) the $+\tfrac12\ln|\Sigma_x|$ term in the responsibilities makes the bound
# monotone (tested after every single factor update); (E5) the loading update uses the matrix
# $\sum_n r_{nk} y_n m_{nk}^\top$; (E8, E9) components are kept when $N_k > 2$ and Algorithm 1 compares
# successive truncations; the noise precision is learned by default here (the paper fixes $\tau = 1$, which
# ties results to the data scale, E3; `tau_fixed=1.0` reproduces the paper).

# %% [markdown]
# ## Real data: irises, wines and handwritten digits (scikit-learn's bundled sets)
# Each model names its real datasets (`zoo list`): files inside scikit-learn, no download.
# `spec.real_data(name)` returns the data in the model's contract and the hyperparameters that suit them.
# * **iris** (mppca, K = 2, q = 1): 150 flowers, 4 standardised measurements. Setosa is linearly separable from
#   the two other species, so the two components should be "setosa" and "the rest".
# * **wine** (ppca, q = 2): 178 wines, 13 standardised chemical measurements; its first two principal components
#   are known to explain 55.4 % of the variance.
# * **digits** (mppca, K = 10, q = 4): the paper's real data (N5.4), 1397 training images of 61 pixels; fitted
#   only outside FAST mode.
#
# `zoo demo` judges the kernels on iris and wine against stored NUTS references of those data.

# %%
# FAST (CI) mode skips this section's fits: tests/test_real_data.py fits every real dataset with its kernel
if not FAST:
    from sklearn.decomposition import PCA  # noqa: E402
    from sklearn.metrics import adjusted_rand_score  # noqa: E402

    import zoo  # noqa: E402

    iris, iris_hyper = zoo.get("mppca").real_data("iris")
    iris_labels = zoo.get("mppca").real_datasets["iris"].loader()[1]["labels"]
    iris_fit = inference.fit("mppca", iris, "vbem", seed=0, num_samples=200, **iris_hyper)
    iris_mu = iris_fit["posterior"]["mu"].values.mean(axis=(0, 1))
    nearest = np.argmin(((iris["Y"][:, None, :] - iris_mu[None]) ** 2).sum(-1), axis=1)
    ari = adjusted_rand_score(iris_labels == 0, nearest)

    wine, wine_hyper = zoo.get("ppca").real_data("wine")
    wine_fit = inference.fit("ppca", wine, "vbem", seed=0, num_samples=200, **wine_hyper)
    W_wine = np.linalg.qr(wine_fit["posterior"]["Wt"].values.mean(axis=(0, 1)).T)[0]
    P_wine = PCA(2).fit(wine["Y"])
    cosines = np.linalg.svd(W_wine.T @ P_wine.components_.T, compute_uv=False)
    angle = np.degrees(np.arccos(np.clip(cosines.min(), -1, 1)))
    print(f"iris: adjusted Rand index of the 2 components vs setosa / the rest = {ari:.3f}")
    print(f"wine: largest angle between VB-PPCA's plane and scikit-learn's first two PCs = {angle:.2f} deg "
          f"(PCs explain {P_wine.explained_variance_ratio_.sum():.3f} of the variance)")

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    axes[0].scatter(iris["Y"][:, 2], iris["Y"][:, 3], c=nearest, s=10, cmap="coolwarm")
    axes[0].set(title="iris: nearest VB component", xlabel="petal length (std.)", ylabel="petal width (std.)")
    wine_labels = zoo.get("ppca").real_datasets["wine"].loader()[1]["labels"]
    proj = (wine["Y"] - wine["Y"].mean(0)) @ W_wine
    axes[1].scatter(proj[:, 0], proj[:, 1], c=wine_labels, s=10, cmap="viridis")
    axes[1].set(title="wine on VB-PPCA's plane (colour: cultivar)", xlabel="axis 1", ylabel="axis 2")
    plt.tight_layout()
    plt.show()

    if not FAST:
        digits, digits_hyper = zoo.get("mppca").real_data("digits")
        digits_fit = inference.fit("mppca", digits, "vbem", seed=0, num_samples=200, **digits_hyper)
        print("digits: components kept", digits_fit.attrs.get("K_eff"))

# %% [markdown]
# ## What we verified
# At full size: VB-EM keeps $K' = 4$ components on SYN1 with a lower bound that never goes down; on T11 its
# component means are within 3 NUTS sd of NUTS's with sd ratios in 0.3-1.2; on iris the two components are
# setosa and the rest (adjusted Rand index above 0.9), and VB-PPCA's plane on wine is scikit-learn's first two
# principal components within 5 degrees. FAST mode runs the small sizes and checks the bound.

# %%
checks = {f"the SYN1 bound never goes down over {len(bound)} sweeps":
          bool(np.all(np.diff(bound)[1:] >= -1e-8 * np.abs(bound).max()))}
if not FAST:
    mu_rows = sc[(sc.method == "vbem") & sc.parameter.str.startswith("mu_sorted")]
    checks[f"SYN1: K' = {int(tree.attrs['K_eff'])} components kept (4 true)"] = int(tree.attrs["K_eff"]) == 4
    checks[f"T11: VB means within {mu_rows['std_mean_error'].max():.3f} <= 3 NUTS sd, sd ratios "
           f"{mu_rows['sd_ratio'].min():.2f}-{mu_rows['sd_ratio'].max():.2f} in 0.3-1.2"] = bool(
        mu_rows["std_mean_error"].max() <= 3.0 and mu_rows["sd_ratio"].between(0.3, 1.2).all())
    checks[f"iris: adjusted Rand index {ari:.3f} > 0.9"] = ari > 0.9
    checks[f"wine: plane within {angle:.2f} < 5 degrees of the first two PCs"] = angle < 5.0
for claim, ok in checks.items():
    print("yes " if ok else "NO  ", claim)
assert all(checks.values()), [claim for claim, ok in checks.items() if not ok]
