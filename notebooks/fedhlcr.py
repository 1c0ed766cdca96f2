# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # FedHLCR: hierarchical latent class regression without moving the data
#
# **What you will learn:** how collapsed Gibbs becomes a federated protocol of sums that never moves an event;
# that FedHLCR matches centralised Gibbs; what the learning rate does under partial participation.
#
# Yang, Carette, Jimbo & Maruyama, *Federated Latent Class Regression for Hierarchical Data*, §5 and
# Algorithm 3. The model (the `hlcr` notebook tells the generative story in full) is a mixture of $K$
# Bayesian linear regressions for agent → entity → event data: every (agent $i$, entity $j$) pair has one
# label $z_{ij}$ with an LDA-style prior, $w_k \sim \mathcal N(0, \delta^2 I)$ and
# $y_{ijn} \sim \mathcal N(w_{z_{ij}}^\top x_{ijn}, \sigma^2)$.
#
# Collapsed Gibbs needs, for every pair, only the **per-cluster sufficient statistics**
# $D_k = I/\delta^2 + \sum_{z_{ij}=k} X_{ij}^\top X_{ij}/\sigma^2$ and
# $c_k = \sum_{z_{ij}=k} X_{ij}^\top y_{ij}/\sigma^2$ of all the *other* pairs:
#
# $$\log p(z_{ij}=k\mid\cdot) = \log \text{prior}_k + \log Z(D_k + G_{ij}/\sigma^2,\ c_k + g_{ij}/\sigma^2)
# - \log Z(D_k, c_k) + \text{const}, \qquad \log Z(A,b) = \tfrac12 b^\top A^{-1} b - \tfrac12\log|A|.$$
#
# Sums of sums are sums, so a server can add the agents' per-cluster sums and broadcast them; each agent
# re-samples its own labels. Each round: broadcast $(D, c, N^{(k)}, \psi)$ → agents sweep their pairs →
# agents upload $(D_i, c_i, n_i, m_i)$, shapes $(K,F,F), (K,F), (K,), (K,)$ → the server sums and smooths
# them with a learning rate $\gamma$ (an EMA, which is how the paper handles partial participation).
#
# What we changed relative to the paper (the errata E5–E8 on the HLCR paper page):
#
# * **G1 / E6**: eq. (2) needs the global counts $N^{(k)}$, which Algorithm 3 never sends: agents upload them.
# * **E7**: the printed upload is per event inside a loop over pairs; it is $X_{ij}^\top X_{ij}$ per pair.
# * **E8 / G4**: the paper samples against statistics that still contain the pair's own data (no
#   leave-one-out). Our default `leave_own_out=True` lets the agent subtract its own contribution (it can
#   track exactly what the server holds of it, even under the EMA and partial participation), which turns a
#   one-agent, full-participation, $\gamma = 1$ run into *exactly* the centralised collapsed Gibbs sampler
#   (tested label for label, `tests/test_fedhlcr.py`).
# * **E1**: the predictive variance of Theorem 1 is $\sigma^2 + x^\top A^{-1}x$, not
#   $\sigma^2 + x^\top A^{-1}x/\sigma^2$ (the normaliser-ratio form above is the corrected one).

# %%
import os

FAST = os.environ.get("FAST", "0") == "1"  # FAST=1: the quick sizes the test suite runs
N_AGENTS = 32 if FAST else 64
ROUNDS = 10
SWEEP_ROUNDS = 20 if FAST else 40
GAMMAS = [0.2, 1.0] if FAST else [0.1, 0.2, 0.5, 0.75, 1.0]

# %%
import time

import jax
import matplotlib.pyplot as plt
import numpy as np
import numpyro  # noqa: F401  (numpyro before arviz)
from sklearn.metrics import adjusted_rand_score

import inference
from inference.hlcr import federated
from inference.hlcr import fedgibbs as hf
from zoo.hlcr import simulate, split_events

# %% [markdown]
# ## Data: the C1 set-up of the HLCR paper page
#
# $K = 3$ clusters, $F = 3$ features, $N$ agents with on average 4 entities and 20 events per entity,
# $\sigma = 0.3$, $\delta = 2$; 20 % of each pair's events are held out (every pair keeps one training event).

# %%
data, truth = simulate(0, n_agents=N_AGENTS, mean_entities=4.0, mean_events=20.0, K=3, F=3, sigma=0.3, delta=2.0)
train, test = split_events(data, 0.2, seed=0)
HYPER = {"K": 3, "sigma": 0.3, "delta": 2.0}
print(f"{N_AGENTS} agents, {len(truth['z'])} pairs, {len(train['y'])} training events")

# %% [markdown]
# ## Centralised collapsed Gibbs versus FedHLCR
#
# The centralised sampler sees all the data; FedHLCR (`method="fedgibbs"`) runs the same conditionals with
# the data split by agent on the in-process runner (agents `vmap`-ped, one compiled round). Three restarts;
# our criterion C2 picks the restart with the best final collapsed log joint (a training quantity).

# %%
t0 = time.time()
gibbs = inference.fit("hlcr", train, "gibbs", seed=0, num_warmup=ROUNDS, num_samples=1, num_chains=1, **HYPER)
t_gibbs = time.time() - t0
t0 = time.time()
runs = [hf.run_federated(federated.split_by_agent(train), HYPER, jax.random.key(r), max_iter=ROUNDS)
        for r in range(3)]   # three restarts, kept apart to show their curves (fit's num_restarts keeps the best)
t_fed = time.time() - t0
ari_central = adjusted_rand_score(truth["z"], gibbs["posterior"]["z"].values[0, -1])
lj = np.stack([res.history["log_joint"] for res, _, _ in runs], 1)
best = int(np.argmax(lj[-1]))
ari_fed = [adjusted_rand_score(truth["z"], federated.global_labels(res, index)) for res, index, _ in runs]
print(f"centralised Gibbs after {ROUNDS + 1} sweeps: ARI {ari_central:.3f} ({t_gibbs:.1f} s incl. compile)")
print(f"FedHLCR after {ROUNDS} rounds: ARI per restart {np.round(ari_fed, 3)}, best-by-log-joint restart {best}: "
      f"ARI {ari_fed[best]:.3f} ({t_fed:.1f} s incl. compile)")
fed_tree = inference.fit("hlcr", train, "fedgibbs", seed=0, num_restarts=3, max_iter=ROUNDS, **HYPER)

# %%
fig, ax = plt.subplots(figsize=(6, 3))
for r in range(lj.shape[1]):
    ax.plot(np.arange(1, len(lj) + 1), lj[:, r], marker="o", label=f"restart {r} (ARI {ari_fed[r]:.2f})")
ax.set_xlabel("round")
ax.set_ylabel("collapsed log joint")
ax.set_ylim(np.percentile(lj, 10) - 50, lj.max() + 20)
ax.legend()
plt.show()

# %% [markdown]
# The collapsed log joint $\log p(y\mid z) + \log p(z\mid\psi) + \log p(\psi)$ of every agent's current labels,
# computed from their uploads, per round. The paper's claim C-a ("converges in less than 10 iterations")
# holds here: the curves flatten within a few rounds. A restart stuck in a merged/split mode shows a
# visibly lower plateau, which is why the best restart is chosen by this training quantity (our first prototype saw
# FedHLCR stick in 2 of 11 single runs).

# %% [markdown]
# ## What crosses the network
#
# Every pytree that reaches the transport is recorded (`inference.distributed.audit`). Nothing is indexed
# by pair or event: the uplink is $(K,F,F), (K,F), (K,), (K,)$ per agent and round.

# %%
audit = __import__("json").loads(fed_tree.attrs["protocol_audit"])
for channel in ("uplink", "downlink", "monitoring"):
    print(channel, [(r["path"], tuple(r["shape"])) for r in audit[channel]])
print("bytes per agent message:", audit["message_nbytes"], "| total uploaded:", fed_tree.attrs["bytes_uploaded_total"])

# %% [markdown]
# The sums still reveal something: an agent with a single pair in cluster $k$ uploads
# $D_i^{(k)} = X_{ij}^\top X_{ij}/\sigma^2$ and $c_i^{(k)} = X_{ij}^\top y_{ij}/\sigma^2$ of that pair (with one
# event, $x$ up to sign and then $y$). Secure aggregation (the server needs only $\sum_i$) or the optional
# Gaussian noise `dp_noise_scale` on the uploads reduce this; the noise is not a formal differential-privacy
# guarantee (no clipping, so no bounded sensitivity).

# %% [markdown]
# ## Partial participation and the learning rate (paper Fig. 3b, small scale)
#
# 15 % of agents per round, chosen by the server; the smoothed statistics then hold only about 15 % of
# the data (the paper does not rescale). Held-out MSE per round for several $\gamma$ (each agent evaluates
# its own held-out events and reports only its summed squared error).

# %%
agents = federated.split_by_agent(train)
tests = federated.split_test_like(test, train)
curves = {}
for gamma in GAMMAS:
    res, _, _ = hf.run_federated(agents, HYPER, jax.random.key(1), max_iter=SWEEP_ROUNDS, gamma=gamma,
                                 participation=0.15, test=tests, chunk=SWEEP_ROUNDS)
    curves[gamma] = res.history["mse"]
fig, ax = plt.subplots(figsize=(6, 3))
for gamma, mse in curves.items():
    ax.plot(np.arange(1, len(mse) + 1), mse, label=f"gamma = {gamma}")
ax.axhline(0.3**2, color="k", ls=":", label="noise floor sigma^2")
ax.set_xlabel("round")
ax.set_ylabel("held-out MSE")
ax.set_yscale("log")
ax.legend()
plt.show()
last = {g: (float(np.mean(m[-10:])), float(np.std(m[-10:]))) for g, m in curves.items()}
print({g: f"mean {a:.3f}, sd {b:.4f} over the last 10 rounds" for g, (a, b) in last.items()})

# %% [markdown]
# The paper (Fig. 3b) reports smooth convergence for $\gamma = 0.1$, faster for $0.2$, and instability from
# $0.5$ on, without numbers. Here (printed above, one seed) the small $\gamma$ gives a lower and steadier
# held-out MSE over the last rounds than $\gamma = 1$, whose statistics are rebuilt from a fresh 15 % of
# the agents every round; neither reaches the noise floor $\sigma^2 = 0.09$ that full participation
# reaches, because the statistics hold only a fraction of the data. Our first prototype found the
# $\gamma$ effect weak, so we read Fig. 3b qualitatively; `benchmarks/bench_fedhlcr.py` runs the paper's
# $\gamma$ grid over 3 seeds (D5) and measures the MSE cost of `dp_noise_scale`.

# %% [markdown]
# ## What we verified
# Federated learning matches centralised Gibbs on the C1 data (claim C2: ARI at least 0.99 in 10 rounds), and
# what an agent uploads is only per-cluster sums: arrays of shape (K, F, F), (K, F) and (K,), never an event.

# %%
checks = {
    f"federated ARI {ari_fed[best]:.3f} >= 0.99 after {ROUNDS} rounds": ari_fed[best] >= 0.99,
    f"federated ARI within 0.01 of centralised Gibbs ({ari_central:.3f})": ari_fed[best] >= ari_central - 0.01,
    f"the uplink carries only shapes {sorted({tuple(r['shape']) for r in audit['uplink']})}":
    all(tuple(r["shape"]) in {(3, 3, 3), (3, 3), (3,)} for r in audit["uplink"]),
}
for claim, ok in checks.items():
    print("yes " if ok else "NO  ", claim)
assert all(checks.values()), [claim for claim, ok in checks.items() if not ok]
