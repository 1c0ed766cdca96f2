# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # Posterior quality 101: how, and how much, is an approximate posterior wrong?
#
# **What you will learn:** how the `diagnostics` scorecard and verdicts tell an exact sampler, NUTS, a full-rank
# and a mean-field variational approximation apart on a posterior known exactly; what PSIS $\hat k$ measures;
# the four verdicts and the two kinds of rule.
#
# Every method in this zoo hands back posterior *draws*. A Gibbs sampler, a variational
# approximation and NUTS can all look plausible in a histogram; this notebook shows how the
# `diagnostics` scorecard tells them apart, number by number, on a posterior where the truth is known
# exactly and where the most common variational approximation fails visibly.
#
# **The model.** Bayesian linear regression with two strongly correlated predictors and a known
# noise level:
#
# $$\beta \sim \mathcal N(0, s_0^2 I_2), \qquad y_i \mid \beta \sim \mathcal N(x_i^\top \beta, \sigma^2),
# \quad i = 1..n, \qquad \operatorname{corr}(x_{i1}, x_{i2}) = 0.95 .$$
#
# It is conjugate: the posterior is exactly Gaussian, $\beta \mid y \sim \mathcal N(m, \Sigma)$ with
# $\Sigma^{-1} = \Lambda = X^\top X/\sigma^2 + I/s_0^2$ and $m = \Sigma X^\top y / \sigma^2$. Because the
# predictors move together, the data pin down $\beta_1 + \beta_2$ well but $\beta_1 - \beta_2$ badly: the
# posterior is a long thin ellipse with correlation close to $-0.95$.
#
# **What a mean-field approximation does to it.** A mean-field Gaussian $q(\beta) = q_1(\beta_1)
# q_2(\beta_2)$ fitted by maximising the ELBO (minimising KL(q || p)) has exact means but variances
# $1/\Lambda_{jj}$, so its sd is $\sqrt{1 - \rho^2}$ times the true marginal sd (Bishop, *PRML*, sec.
# 10.1.2). With $\rho = -0.95$ that is 0.31: the approximation is three times too confident.

# %%
import os

FAST = os.environ.get("FAST", "0") == "1"  # FAST=1: the quick sizes the test suite runs
NUM_DRAWS = 16000  # draws of each variational q (k-hat needs many, see below)
SVI_STEPS = 3000 if FAST else 10000
NUTS_SAMPLES = 2500 if FAST else 4000  # enough for ESS >= 400 on every quantity

# %%
import numpyro  # noqa: I001  (numpyro before arviz)
import numpyro.distributions as dist
import jax
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import diagnostics
import inference
import zoo
from inference import Draws, register_method

pd.set_option("display.width", 160)
pd.set_option("display.precision", 3)

# %% [markdown]
# ## The model, its simulator, and an exact "sampler"
#
# The model is registered as a `zoo.ModelSpec` inside this notebook only (the zoo's own models live in
# `zoo/`). Because the posterior is known, we also register an `exact` method that draws from it
# directly: it plays the part of the perfect reference.

# %%
RHO_X, S0, SIGMA = 0.95, 3.0, 1.0


def model(X, y, s0=S0, sigma=SIGMA):
    beta = numpyro.sample("beta", dist.Normal(0.0, s0).expand([2]).to_event(1))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, sigma), obs=y)


def simulate(seed, n=40):
    rng = np.random.default_rng(seed)
    X = rng.multivariate_normal([0, 0], [[1, RHO_X], [RHO_X, 1]], size=n)
    beta = rng.normal(0, S0, 2)
    return {"X": X, "y": X @ beta + SIGMA * rng.normal(size=n)}, {"beta": beta}


def exact_posterior(X, y, s0=S0, sigma=SIGMA):
    cov = np.linalg.inv(X.T @ X / sigma**2 + np.eye(2) / s0**2)
    return cov @ X.T @ y / sigma**2, cov


SPEC = zoo.register(zoo.ModelSpec(
    name="pq101", model=model, simulate=simulate, paper="(tutorial: correlated Gaussian regression)",
    data_fields=(zoo.DataField("X", ("n", 2)), zoo.DataField("y", ("n",))),
    hyperparameters={"s0": zoo.Hyper(S0), "sigma": zoo.Hyper(SIGMA)},
    settings=zoo.ZooSettings(demo_sizes={"n": 40})), replace=True)


@register_method("exact", kind="sampler", models=("pq101",), options={"num_samples": 2000, "num_chains": 2})
def exact(ctx):
    """iid draws from the closed-form Gaussian posterior."""
    m, c = exact_posterior(ctx.data["X"], ctx.data["y"], **ctx.hyper)
    shape = (ctx.options["num_chains"], ctx.options["num_samples"])
    return Draws(posterior={"beta": np.asarray(jax.random.multivariate_normal(ctx.key, m, c, shape))})


data, truth = SPEC.default_data()
m, cov = exact_posterior(data["X"], data["y"])
rho = cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1])
print("true beta", truth["beta"].round(2), "| posterior mean", m.round(2), "| posterior sd",
      np.sqrt(np.diag(cov)).round(3), "| correlation", round(rho, 3))

# %% [markdown]
# ## Four fits of the same posterior
#
# * `exact`: the closed form (our reference, 4 chains x 1000 independent draws: the health rule a reference
#   must pass asks for at least 4 chains and 4000 draws);
# * `nuts`: NumPyro's NUTS, the usual MCMC reference in this zoo;
# * `svi` with a mean-field guide (`AutoNormal`);
# * `svi` with a full-rank guide (`AutoMultivariateNormal`), which *can* represent the correlation.
#
# Every fit returns an ArviZ DataTree with the same groups; variational methods also store `log_q`,
# the density of their approximation at each draw.

# %%
fits = {
    "exact": inference.fit("pq101", data, "exact", seed=1, num_chains=4, num_samples=1000),
    "nuts": inference.fit("pq101", data, "nuts", seed=2, num_warmup=500, num_samples=NUTS_SAMPLES),
    "svi mean-field": inference.fit("pq101", data, "svi", seed=3, guide="normal", num_steps=SVI_STEPS,
                                    learning_rate=0.02, num_samples=NUM_DRAWS),
    "svi full-rank": inference.fit("pq101", data, "svi", seed=4, guide="mvn", num_steps=SVI_STEPS,
                                   learning_rate=0.02, num_samples=NUM_DRAWS),
}
reference = fits.pop("exact")

# %%
fig, ax = plt.subplots(figsize=(5.5, 4.5))
for (name, tree), colour in zip({"exact": reference, **fits}.items(), ["k", "C0", "C3", "C2"], strict=True):
    b = tree["posterior"]["beta"].values.reshape(-1, 2)[:1500]
    ax.scatter(b[:, 0], b[:, 1], s=3, alpha=0.25, color=colour, label=name)
ax.set_xlabel(r"$\beta_1$")
ax.set_ylabel(r"$\beta_2$")
ax.legend(markerscale=4, fontsize=8)
plt.show()

# %% [markdown]
# The exact posterior (black) is the thin diagonal ellipse. NUTS (blue) and the full-rank guide (green)
# cover it. The mean-field guide (red) is a small round blob in its middle: it has the right centre but
# cannot tilt, so it shrinks to fit *inside* the ellipse. That is what minimising KL(q || p) does: it
# punishes q for putting mass where p has little, never for missing mass p has.

# %% [markdown]
# ## The scorecard: one row per (method, parameter)
#
# `diagnostics.scorecard(reference, {name: tree})` compares each method's marginals with the
# reference's:
#
# * `std_mean_error` = |E_q - E_ref| / sd_ref: how far the mean is, in posterior standard deviations;
# * `sd_ratio` = sd_q / sd_ref: below 1 means overconfident;
# * `w1_sd`: the 1-D Wasserstein distance in reference sd (how much mass has to move);
# * `cover50` / `cover90`: the share of the reference draws inside the method's central 50 % / 90 %
#   interval (0.5 / 0.9 if they agree);
# * `ess_bulk`, `mcse_mean_sd`: how many effective draws the method has, and the resulting Monte Carlo
#   error of the mean difference in reference sd, $\sqrt{\text{sd ratio}^2/\text{ESS}_q + 1/\text{ESS}_{ref}}$;
# * `z_mean`, `z_sd`: the differences of the means and of the sds in combined Monte Carlo standard errors;
# * `rule` and `ok`: which of the two kinds of rule judges the row (below), and whether the row meets it.

# %%
card = diagnostics.scorecard(reference, fits)
card[["method", "parameter", "mean_ref", "mean", "std_mean_error", "sd_ratio", "w1_sd", "cover50", "cover90",
      "ess_bulk", "mcse_mean_sd", "z_mean", "z_sd", "rule", "ok"]]

# %% [markdown]
# Read the mean-field rows: the means are close (small `std_mean_error`), but `sd_ratio` is about 0.3 and
# only ~17 % of the reference draws fall inside its 50 % interval. A report that looked only at posterior
# means would call this approximation excellent.
#
# The theory gives the number to expect: sd ratio $\sqrt{1-\rho^2}$ for both coordinates.

# %%
mf = card[card["method"] == "svi mean-field"]
pd.DataFrame({"theory sqrt(1 - rho^2)": [np.sqrt(1 - rho**2)] * 2, "measured": mf["sd_ratio"].values},
             index=mf["parameter"].values)

# %% [markdown]
# ## Per-method scores: joint distances, PSIS k-hat, cost, and a verdict
#
# Every method gets one of **four verdicts**:
#
# * **PASS**: every compared quantity of the reference was compared and meets the method's rule;
# * **FAIL**: the posterior disagrees with the reference (or lacks some of its quantities); the reason names
#   the quantity, the number and the rule;
# * **NOT CONVERGED**: a sampler whose own chains have not mixed (R-hat $\ge 1.01$ or ESS $< 400$ on some
#   quantity); its numbers are not yet worth comparing, and the reason says how much longer to run;
# * **NOT JUDGED**: the reference itself fails the MCMC health rule (4 chains, 4000 draws, R-hat $< 1.01$ and
#   bulk and tail ESS $\ge 400$ on every quantity, no divergences), so nothing is judged against it.
#
# And **two kinds of rule**, by the kind of method:
#
# * **samplers** (NUTS, Gibbs, our `exact`) are exact in the limit, so the only question is whether a
#   difference is bigger than Monte Carlo noise: $z = (m_q - m_{ref}) / \sqrt{\text{mcse}_q^2 +
#   \text{mcse}_{ref}^2}$ for the means, the same with the Monte Carlo error of the sd for the spreads, and a
#   quantity fails when $|z|$ exceeds a Bonferroni-corrected critical value (family-wise false-alarm
#   probability 1 % over all the method's tests: 3.02 for the 4 tests here). A long enough run finds any
#   bias; an exact sampler fails at most 1 run in 100;
# * **approximations** (variational methods, point estimates) are never exact, so they are judged on
#   *practical* thresholds: mean within 0.2 reference sd, sd ratio 0.8-1.25, PSIS k-hat at most 0.7.
#
#
# Marginals can agree while the joint distribution does not (a mean-field q with the right marginal sds
# would still miss the correlation). `diagnostics.method_scores` adds, per method:
#
# * `w1_joint`, `kl_joint`, `mmd`: distances between the whole 2-D sample sets (each coordinate scaled by
#   the reference sd); 0 for identical distributions;
# * `khat`: the **PSIS k-hat** (Yao et al. 2018). For draws $\theta_s \sim q$, the importance ratios
#   $r_s = p(\theta_s, y) / q(\theta_s)$ would turn q into the posterior if their tail were light. The
#   shape $k$ of a generalised Pareto fitted to the largest ratios measures the tail: $k < 0.5$ good,
#   $0.5$-$0.7$ usable, $> 0.7$ q misses mass p has and no re-weighting can repair it. It needs only
#   $\log p(\theta, y)$ (the tree's `log_prior` + `log_likelihood`) and $\log q$ (`sample_stats.log_q`), no
#   reference at all: it is the check you can run on a model too big for NUTS. For a Gaussian q with sd
#   ratio $f$ in one direction the true value is $1 - f^2$; for the mean-field q here it is $|\rho|$.
# * the objective at convergence (ELBO), compile and run seconds, and ESS per second for samplers.

# %%
scores = diagnostics.method_scores(reference, fits, card=card)
scores[["method", "kind", "verdict", "max_std_mean_error", "min_sd_ratio", "w1_joint", "kl_joint", "mmd", "khat",
        "bound", "ess_per_second", "run_seconds"]]

# %%
print(scores)   # the verdict list, one line per method, as `zoo compare` prints it (full reasons: scores["reasons"])

# %% [markdown]
# The mean-field guide fails on two independent counts: the scorecard sees it is too narrow, and its
# k-hat is above 0.7 (close to the theoretical $|\rho| = 0.95$; single k-hat estimates are noisy, which
# is why we kept 16000 draws of q). The full-rank guide and NUTS pass.
#
# ## The other two verdicts
#
# A NUTS run of 2 x 60 draws is too short to say anything: it is **NOT CONVERGED**, and told how much longer
# to run. A reference of 2 chains fails the health rule, so against it every method is **NOT JUDGED**.

# %%
short = inference.fit("pq101", data, "nuts", seed=5, num_warmup=60, num_samples=60)
weak_reference = inference.fit("pq101", data, "exact", seed=6, num_chains=2, num_samples=2000)
others = pd.concat([diagnostics.method_scores(reference, {"nuts, 2 x 60": short}, joint=False),
                    diagnostics.method_scores(weak_reference, {"svi full-rank": fits["svi full-rank"]}, joint=False)])
for row in others.itertuples():
    print(f"{row.method:15s} {row.verdict:13s} {row.reasons}")

# %% [markdown]
# ## The same story as pictures
#
# `diagnostics.plots` draws every method over the reference (black). The forest plot is in units of the
# reference sd around the reference mean, so every row reads the same way.

# %%
trees = {"exact": reference, **fits}
diagnostics.plots.plot_marginals(trees)
plt.show()

# %% [markdown]
# The red (mean-field) densities are tall and narrow; the others lie on top of the black reference.

# %%
diagnostics.plots.plot_forest(trees)
plt.show()

# %% [markdown]
# In the forest plot the mean-field intervals sit at 0 (right centre) but span a third of the reference's
# width. `diagnostics.report("pq101", trees, "out/pq101")` writes all of this, plus the ELBO traces and a
# prior-sensitivity check, as one static HTML page.

# %% [markdown]
# ## What we verified
#
# Mean-field SVI: sd ratio about $\sqrt{1 - \rho^2} = 0.31$ (theory) and k-hat > 0.7, FAIL; full-rank SVI
# (practical rule) and NUTS (MCSE rule): mean error < 0.1 sd, sd ratio within 0.8-1.25, PASS; a 2 x 60 NUTS
# run is NOT CONVERGED; against a 2-chain reference, NOT JUDGED. The cell below checks each claim on this run
# and prints what it found.

# %%
s, o = scores.set_index("method"), others.set_index("method")
mf = card[card["method"] == "svi mean-field"]
good = {m: card[card["method"] == m] for m in ("nuts", "svi full-rank")}
checks = {
    f"mean-field sd ratios {mf['sd_ratio'].round(3).tolist()} = sqrt(1 - rho^2) = {np.sqrt(1 - rho**2):.3f} "
    "within 0.05": np.allclose(mf["sd_ratio"], np.sqrt(1 - rho**2), atol=0.05),
    f"mean-field k-hat {s.loc['svi mean-field', 'khat']:.2f} > 0.7 and verdict "
    f"{s.loc['svi mean-field', 'verdict']}": s.loc["svi mean-field", "khat"] > 0.7
    and s.loc["svi mean-field", "verdict"] == "FAIL",
    **{f"{m}: mean error {r['std_mean_error'].max():.3f} < 0.1 sd, sd ratio {r['sd_ratio'].min():.2f}-"
       f"{r['sd_ratio'].max():.2f} in 0.8-1.25, verdict {s.loc[m, 'verdict']}":
       (r["std_mean_error"] < 0.1).all() and r["sd_ratio"].between(0.8, 1.25).all() and s.loc[m, "verdict"] == "PASS"
       for m, r in good.items()},
    "NUTS judged by the MCSE rule, full-rank SVI by the practical rule":
    s.loc["nuts", "rule"] == "MCSE" and s.loc["svi full-rank", "rule"] == "practical",
    f"2 x 60 NUTS: {o.loc['nuts, 2 x 60', 'verdict']}, told how long to run":
    o.loc["nuts, 2 x 60", "verdict"] == "NOT CONVERGED" and "run about" in o.loc["nuts, 2 x 60", "reasons"],
    f"against a 2-chain reference: {o.loc['svi full-rank', 'verdict']}":
    o.loc["svi full-rank", "verdict"] == "NOT JUDGED" and "2 chains" in o.loc["svi full-rank", "reasons"],
}
for claim, ok in checks.items():
    print("yes " if ok else "NO  ", claim)
assert all(checks.values()), [claim for claim, ok in checks.items() if not ok]
