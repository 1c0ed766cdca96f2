# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # GP-ALPS: which latent processes does a multi-output GP need?
#
# **What you will learn:** Bayesian selection of the latent processes of a multi-output GP; why the paper's
# relaxation is unnecessary; how exact enumeration, NUTS, Gibbs and VB-EM agree on the switches; the paper's
# three experiments.
#
# Berkovich, Perim & Bruinsma (AABI 2019) put a **switch** on every latent process of the linear mixing
# model (LMM) for multi-output GPs:
#
# $$x_j \sim \mathcal{GP}(0, k_j),\quad b_j \sim \text{Bern}(\theta_j),\quad H_{ij} \sim \mathcal N(0, 1),\quad
# y_i(t) \sim \mathcal N\Big(\sum_j H_{ij}\, b_j\, x_j(t),\ \sigma_i^2\Big).$$
#
# The posterior over the $2^m$ switch patterns is Bayesian model selection over "which kernels are
# needed". The paper fits it with a relaxed (binary Concrete) stochastic variational scheme and checks it
# against a Gibbs sampler. Our reading of the paper (the GP-ALPS paper page lists every erratum) found three things that
# shape this notebook:
#
# * **E3**: the paper's Gibbs conditional for $b_j$ (App. C.3) is mis-normalised; the correct one is
#   $\sigma(\text{logit}\,\theta_j + c_j)$.
# * **§3.2**: the Concrete relaxation is unnecessary. Under a *true* Bernoulli $q(b)$ the expected
#   log-likelihood is closed form, so a deterministic coordinate-ascent VB-EM with a monotone ELBO exists.
# * **E12**: "only one of two duplicate latents switches on" is mean-field VI picking a mode; the exact
#   posterior is exchangeable between duplicates.
#
# In `zoo` the switches are summed out exactly (the likelihood is a quadratic form in $b$, so the
# $2^m$-term log-sum-exp costs $O(2^m m^2)$), which lets NUTS run on $(u, H)$; each latent is written in
# weight space $x_j = F_j u_j$ (the paper's "linear-periodic" kernel is a random sinusoid of fixed
# frequency, rank 2, erratum E1).

# %%
import os

FAST = os.environ.get("FAST", "0") == "1"  # FAST=1: the quick sizes the test suite runs
NUM_WARMUP = 150 if FAST else 1000
NUM_SAMPLES = 150 if FAST else 1000
N_SEEDS_MIXTURE = 1 if FAST else 3
GIBBS_SWEEPS = 3000
SVI_STEPS = 5000

# %%
import matplotlib.pyplot as plt
import numpy as np
import numpyro  # noqa: F401  (before arviz)

import inference
from inference.gp_alps.common import exact_inclusion_orthogonal
from zoo import gp_alps as za

# %% [markdown]
# ## Experiment 4.1: a square wave and 8 harmonics
#
# One output, $y = \text{sign}(\sin 2\pi 0.05 t) + 0.1\,\varepsilon$ on $t = 0.5, \dots, 99.5$; latent $j$
# is a sinusoid of frequency $j \cdot 0.05$ Hz. A square wave contains only odd harmonics, so the
# switches of latents 1, 3, 5, 7 should be on. With the noise variance fixed at 0.0285 (§5.1 on the paper page) the
# sinusoids are orthogonal on this grid and the exact posterior factorises, giving an **exact oracle**.

# %%
data, truth = za.simulate(0)
SIGMA2 = 0.0285
F = za.model_inputs(data, za.SPEC.default_hyper)["F"]
exact = exact_inclusion_orthogonal(data["Y"], F, SIGMA2, 0.5)
vb_tree = inference.fit("gp_alps", data, "vbem", seed=0, sigma2=SIGMA2)
nuts_tree = inference.fit("gp_alps", data, "nuts", seed=0, sigma2=SIGMA2, num_warmup=NUM_WARMUP,
                          num_samples=NUM_SAMPLES)
hyper = {**za.SPEC.default_hyper, "sigma2": SIGMA2}
p_nuts = za.summaries(nuts_tree["posterior"].dataset, data, hyper)["p_on"].mean(("chain", "draw")).values
rho_vb = np.array(vb_tree["sample_stats"]["rho"].values[-1])
print("exact :", np.round(exact, 3))
print("NUTS  :", np.round(p_nuts, 3))
print("VB-EM :", np.round(rho_vb, 3))

# %%
fig, ax = plt.subplots(1, 2, figsize=(10, 3.2))
j = np.arange(1, 9)
ax[0].bar(j - 0.25, exact, 0.25, label="exact", color="k")
ax[0].bar(j, p_nuts, 0.25, label="NUTS (b summed out)")
ax[0].bar(j + 0.25, rho_vb, 0.25, label="VB-EM rho")
ax[0].set_xlabel("harmonic j"), ax[0].set_ylabel("P(b_j = 1 | y)"), ax[0].legend(fontsize=8)
e = vb_tree["sample_stats"]["elbo"].values
ax[1].plot(e), ax[1].set_xlabel("sweep"), ax[1].set_ylabel("ELBO"), ax[1].set_xscale("log")
plt.tight_layout()
plt.show()

# %% [markdown]
# **Left**: the paper's Fig. 1(b) reproduced (the paper gives no numbers, only "high for the odd
# harmonics"). The exact posterior puts the even harmonics at about 0.03, not 0: a latent that is on
# with a tiny amplitude is almost the same model as one that is off. NUTS recovers these small
# probabilities; mean-field VB-EM says exactly 0, it is **over-confident about "off"** (§3.2 on the paper page).
# **Right**: the closed-form ELBO rises monotonically in a few sweeps; there is no Monte Carlo noise and
# no temperature schedule.

# %%
D = np.einsum("jnr,jr->jn", F, vb_tree["posterior"]["u"].mean(("chain", "draw")).values)
f_vb = np.mean(vb_tree["posterior"]["H"].values[0] * vb_tree["posterior"]["b"].values[0], axis=0) @ D
plt.figure(figsize=(8, 2.8))
plt.plot(data["t"][:, 0], data["Y"][:, 0], ".", ms=3, label="data")
plt.plot(data["t"][:, 0], truth["f"][:, 0], "k", lw=1, label="square wave")
plt.plot(data["t"][:, 0], f_vb[0], label="VB-EM reconstruction")
plt.legend(fontsize=8)
plt.show()
rmse = float(np.sqrt(np.mean((f_vb[0] - truth["f"][:, 0]) ** 2)))
print(f"reconstruction RMSE vs the noiseless wave: {rmse:.3f} (best 4-odd-harmonic fit on this grid: 0.143)")

# %% [markdown]
# The reconstruction (the paper's Fig. 1(a)) uses the first four odd Fourier terms, the "first 4 terms
# of the Fourier series" of the paper. The RMSE is close to the best least-squares fit with those four
# harmonics.
#
# ## Gibbs (App. C, corrected) and the scorecard against NUTS
#
# The collapsed Gibbs sampler (`method="gibbs"`, move G1 on the paper page: the latent is integrated out of
# each switch update) is the paper's MCMC reference with erratum E3 fixed. Since f depends on a column of H and its
# latent only through their product, each sweep also moves along that ridge, (H_.j, u_j) -> (c H_.j, u_j / c) with c
# drawn from its conditional law (Liu & Sabatti's generalised Gibbs step): without it |H| mixes over tens of
# thousands of sweeps, with it over a few. The scorecard compares every
# method with NUTS on the model's invariant summaries (`p_on` = P(b_j = 1 | u, H, y) per draw, `n_on`,
# `f` at 12 points, `|H|`), since H and the latents are only identified up to sign.

# %%
import diagnostics  # noqa: E402

gibbs_tree = inference.fit("gp_alps", data, "gibbs", seed=0, sigma2=SIGMA2, num_warmup=1000,
                           num_samples=GIBBS_SWEEPS)
p_gibbs = gibbs_tree["posterior"]["b"].mean(("chain", "draw")).values
print("Gibbs :", np.round(p_gibbs, 3))
fits = {"vbem": vb_tree, "gibbs": gibbs_tree}
card = diagnostics.scorecard(nuts_tree, fits, var_names=["p_on", "n_on", "f"])
card.groupby("method")[["std_mean_error", "sd_ratio"]].describe().round(2)

# %% [markdown]
# Gibbs agrees with NUTS on every summary (standardised mean errors are Monte Carlo noise). VB-EM agrees on
# the function f and on the odd harmonics, but its `p_on` for the even harmonics is a point mass at 0 (sd
# ratio 0): the usual mean-field over-confidence, here about switches that are "off".
#
# ## The paper's Concrete SVI (App. B)
#
# `method="svi_concrete"` is the paper's scheme: binary-Concrete q(b) with a Concrete prior at temperature
# 1/2, the App. B.7 temperature schedule (a bump to 10 at 75 % of training), reparameterised gradients.
# It is slow to settle on the small "off" probabilities and its objective is an ELBO of the relaxed model
# (E15). Not run in FAST mode (a few minutes on 2 cores).

# %%
if not FAST:
    svi_tree = inference.fit("gp_alps", data, "svi_concrete", seed=0, sigma2=SIGMA2, num_steps=SVI_STEPS)
    rho_svi = np.array(svi_tree["posterior"].attrs["rho"] if isinstance(svi_tree["posterior"].attrs["rho"], list)
                       else eval(svi_tree["posterior"].attrs["rho"]))
    print("Concrete SVI rho:", np.round(rho_svi, 3))
    fig, ax = plt.subplots(figsize=(8, 2.5))
    ax.plot(svi_tree["sample_stats"]["temperature"].values)
    ax.set_xlabel("Adam step"), ax.set_ylabel("lambda_q (App. B.7)")
    plt.show()

# %% [markdown]
# The temperature schedule of App. B.7 as printed: low (0.66) for most of training, a bump to 10 at 75 %,
# back to 0.66 (erratum E14: this does not match the paper's stated rationale). Above: the SVI
# activation probabilities rho_j = P_q(b_j > 1/2) after training.
#
# ## Experiment 4.2: 9 outputs mixed from periods 7, 17, 23
#
# Nine latents with periods 3, 7, 7, 11, 13, 17, 19, 23, 23 (two duplicate pairs), noise variances
# learned. The paper reports that one latent of each duplicate pair and T = 17 switch on.

# %%
rhos = []
for seed in range(N_SEEDS_MIXTURE):
    d2, _ = za.simulate(seed, setup="periodic_mixture")
    t2 = inference.fit("gp_alps", d2, "vbem", seed=seed, kernels="periodic_mixture", num_samples=100)
    rhos.append(np.array(t2["sample_stats"]["rho"].values[-1]))
    print("seed", seed, "periods", za.MIXTURE_PERIODS, "\n  rho", np.round(rhos[-1], 2))

# %% [markdown]
# `vbem` keeps the best of 4 initialisations by final ELBO: single CAVI runs sometimes stall with both
# T = 7 copies on, at a lower ELBO. VB-EM then reproduces the paper's Fig. 3(c): exactly one copy of
# each duplicate pair is on. This is the mode-seeking of mean-field VI (E12): the two copies are
# exchangeable, so the exact marginals are equal.
#
# The exact posterior is exchangeable between duplicates. With the swap move (G3) the Gibbs sampler shows it:
# equal marginals for the two T = 7 copies. On our simulation it also has *both* copies on most of the time
# (measured P(both) = 0.92 on seed 0, slow test `test_duplicate_pair_rarely_both_on_t9`, strict xfail): the
# latent noise is mixed through H*, so it is coherent across the 9 outputs, and a second copy fits it. The
# paper's "one copy on" is a property of its VI, not of the posterior.

# %%
if not FAST:
    d2, _ = za.simulate(0, setup="periodic_mixture")
    g2 = inference.fit("gp_alps", d2, "gibbs", seed=0, kernels="periodic_mixture", num_warmup=1000,
                       num_samples=3000)
    b2 = g2["posterior"]["b"].values
    print("Gibbs + swap, P(b_j = 1):", np.round(b2.mean((0, 1)), 2))
    print("P(both T=7 on) =", (b2[..., 1] * b2[..., 2]).mean().round(2))

# %% [markdown]
# ## Experiment 4.3: which features does an additive GP need? (Boston / diabetes)
#
# One unit-lengthscale RBF latent per standardised feature, p = 1: an additive GP with spike-and-slab
# selection of its components. The paper says the selected Boston subset {CHAS, RM, PTRATIO, LSTAT} ranks in
# the **top 0.05 %** of all 8192 subset kernel-ridge models by test RMSE. The protocol is not stated (E10);
# ours: 80/20 split (seed 0), joint unit-lengthscale RBF KRR with alpha = 0.1 on each subset
# (`inference.gp_alps.subsets`). Measured on scikit-learn's diabetes data (1023 subsets): VB-EM selects
# {bmi, bp, s5}, **rank 7 / 1023 (top 0.7 %)** with the joint kernel, 11 / 1023 with the additive kernel; all
# 10 features rank 313. On MASS Boston without the `black` column (12 features, 4095 subsets;
# `python -m inference.gp_alps.subsets boston`) VB-EM selects {crim, chas, nox, rm, ptratio, lstat}, the
# paper's four plus crim and nox, but under this protocol that subset ranks 911 / 4095 (the paper's own
# 4-subset: 948; all features: 356): the "top 0.05 %" claim is not reproduced. Run outside FAST mode
# (about a minute of small solves).

# %%
if not FAST:
    import pandas as pd

    from inference.gp_alps import subsets

    rows = subsets.reproduce("diabetes")
    print("rho:", rows[-1]["rho"])
    print(pd.DataFrame(rows[:-1]).to_string(index=False))

# %% [markdown]
# ## Real data: which of 10 baseline variables predict diabetes progression? (scikit-learn's `diabetes`)
# `zoo.get("gp_alps").real_data("diabetes")` gives the 442 patients' standardised data (an 80 % training split)
# with one unit-lengthscale RBF latent per variable (`kernels="additive_rbf"`). Efron et al. (2004), where the
# data come from, find bmi and s5 (log serum triglycerides) the first two variables LARS selects.
# (`real_data("boston")`, MASS's Boston tracts with 12 features, is the second real dataset; not fitted here.)

# %%
# FAST (CI) mode skips this section's fits: tests/test_real_data.py fits every real dataset with its kernel
if not FAST:
    diab, diab_hyper = za.SPEC.real_data("diabetes")
    diab_fit = inference.fit("gp_alps", diab, "vbem", seed=0, num_samples=200, **diab_hyper)
    diab_features = za.SPEC.real_datasets["diabetes"].loader()[1]["features"]
    diab_p = za.SPEC.summaries(diab_fit["posterior"].to_dataset(), diab,
                               {**za.SPEC.default_hyper, **diab_hyper})["p_on"].values.mean(axis=(0, 1))
    fig, ax = plt.subplots(figsize=(6, 2.8))
    ax.bar(diab_features, diab_p)
    ax.set(ylabel="P(switch on)", title="VB-EM inclusion probabilities, diabetes")
    plt.show()
    on = dict(zip(diab_features, diab_p, strict=True))
    print({k: round(float(v), 2) for k, v in on.items()})

# %% [markdown]
# A NUTS reference on all 10 variables (1024 switch patterns per evaluation) is beyond `make references`' budget,
# so the demo's real-data section uses `diabetes4`: the same patients, 4 of the variables (age, bmi, bp, s5:
# LARS's first three and its last). Its stored NUTS reference (`zoo/references/gp_alps__real_diabetes4.nc`,
# cross-checked by 4 x 100,000 Gibbs sweeps) is the exact posterior to hold VB-EM against: VB-EM's mean-field
# q(b) is sure about the switch of age, where the exact posterior is not.

# %%
# FAST (CI) mode skips this fit: the demo's real-data section (zoo demo) judges every gp_alps kernel on diabetes4
if not FAST:
    from diagnostics import references
    from diagnostics.scoring import compared_posterior

    d4_ref = references.load("gp_alps", tag="real_diabetes4")
    d4, d4_hyper = za.SPEC.real_data("diabetes4")
    d4_vb = inference.fit("gp_alps", d4, "vbem", seed=0, num_samples=200, **d4_hyper)
    print("P(switch on)", za.DIABETES4)
    for label, tree in (("NUTS reference", d4_ref), ("VB-EM", d4_vb)):
        print(f"  {label:15s}", compared_posterior(tree)["p_on"].mean(("chain", "draw")).values.round(3))

# %% [markdown]
# ## What we verified
# Exact, NUTS, Gibbs and VB-EM agree on the square-wave switch decisions; NUTS and Gibbs match the exact
# inclusion probabilities (including the small even-harmonic ones) within 0.03; VB-EM reconstructs the square
# wave; in experiment 4.2 it switches T = 17 and one of the two T = 7 copies on. At full size, on the
# diabetes data, bmi and s5 are selected.

# %%
checks = {
    f"VB-EM switches the odd harmonics on ({rho_vb[::2].round(3).tolist()} > 0.99) and the even ones off "
    f"({rho_vb[1::2].round(3).tolist()} < 0.05)": bool(np.all(rho_vb[::2] > 0.99) and np.all(rho_vb[1::2] < 0.05)),
    f"NUTS within {np.max(np.abs(p_nuts - exact)):.3f} < 0.03 of the exact inclusion probabilities":
    np.max(np.abs(p_nuts - exact)) < 0.03,
    f"VB-EM reconstruction RMSE {rmse:.3f} < 0.17": rmse < 0.17,
    "experiment 4.2: T = 17 on and exactly one of the two T = 7 copies on, in every seed":
    all(r[5] > 0.95 and min(r[1], r[2]) < 0.1 and max(r[1], r[2]) > 0.95 for r in rhos),
    f"Gibbs within {np.max(np.abs(p_gibbs - exact)):.3f} < 0.03 of the exact probabilities":
    np.max(np.abs(p_gibbs - exact)) < 0.03,
}
if not FAST:
    checks[f"diabetes: bmi ({on['bmi']:.2f}) and s5 ({on['s5']:.2f}) switched on (> 0.9)"] = (
        on["bmi"] > 0.9 and on["s5"] > 0.9)
for claim, ok in checks.items():
    print("yes " if ok else "NO  ", claim)
assert all(checks.values()), [claim for claim, ok in checks.items() if not ok]
