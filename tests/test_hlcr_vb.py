"""HLCR mean-field VB-EM (issue 3, notes §3.8 and §6 E1-E2): monotone closed-form bound, recovery on C1,
agreement with the collapsed Gibbs posterior means, draws and log q, bad input."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hlcr_oracles import ari

import zoo
from inference import fit
from inference.hlcr.common import cluster_posteriors, match_labels, pair_data
from zoo.hlcr import model_inputs

C1 = dict(n_agents=64, mean_entities=4.0, mean_events=20.0, K=3, F=3, sigma=0.3, delta=2.0)
K4 = dict(n_agents=128, mean_entities=4.0, mean_events=5.0, K=4, F=5, sigma=0.5, delta=1.0)


def _fit(kw, seed, **options):
    data, truth = zoo.get("hlcr").simulate(seed, **kw, psi=np.full(kw["K"], 1 / kw["K"]))
    tree = fit("hlcr", data, "vbem", seed=seed, K=kw["K"], sigma=kw["sigma"], delta=kw["delta"], max_iter=60,
               tol=1e-300, num_samples=200, **options)
    return data, truth, tree


def _assert_monotone(tree):
    """E1: every iteration's bound change >= -1e-8 |bound| (round-off allowance, relative)."""
    e = tree["sample_stats"]["elbo"].values
    assert e.shape == (60,)
    assert np.all(np.diff(e) >= -1e-8 * np.abs(e[1:])), np.diff(e).min()


def test_vbem_bound_is_monotone_recovers_c1_and_matches_gibbs_means():
    """C1 seed 0: E1 (bound non-decreasing over 60 iterations), E2 (ARI of argmax r >= 0.99; the VB means
    m_k match the collapsed Gibbs posterior means H_k c_k at the Gibbs labels after 10 sweeps to 0.05
    absolute, labels matched by contingency)."""
    data, truth, tree = _fit(C1, 0)
    _assert_monotone(tree)
    r = tree["vbem"]["r"].values
    assert ari(r.argmax(1), truth["z"]) >= 0.99
    g = fit("hlcr", data, "gibbs", seed=0, num_warmup=9, num_samples=1, num_chains=1, K=3, sigma=0.3, delta=2.0)
    zg = g["posterior"]["z"].values[0, -1]
    pdat = pair_data(model_inputs(data, {"K": 3, "alpha": 3.0, "beta": 1.0, "delta": 2.0, "sigma": 0.3}))
    mg, _ = cluster_posteriors(pdat.Gs, pdat.gs, jnp.asarray(zg), 3, 2.0)
    perm = match_labels(zg, r.argmax(1), 3)          # perm[vb label] = gibbs label
    m_vb = np.zeros((3, 3))
    m_vb[perm] = tree["vbem"]["m"].values
    assert np.abs(m_vb - np.asarray(mg)).max() < 0.05
    # draws: q's sites plus labels; log q is the density of q at the stored draws
    post = tree["posterior"]
    assert post["w"].shape == (1, 200, 3, 3) and post["theta"].shape[-1] == 3 and post["z"].shape[:2] == (1, 200)
    assert np.all(np.isfinite(tree["sample_stats"]["log_q"].values))


@pytest.mark.slow
def test_vbem_bound_is_monotone_on_k4_setup():
    """E1 on the K = 4, F = 5, N = 128, N_** = 5, sigma = 0.5 set-up, seed 0 (ARI is not required here:
    the notes observed 0.78-0.93 for VB-EM on this low-information set-up)."""
    _, _, tree = _fit(K4, 0)
    _assert_monotone(tree)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_vbem_bound_is_monotone_other_seeds(seed):
    """E1/E2, seeds 1-2: monotone bound on both set-ups and ARI >= 0.99 on C1."""
    _, truth, tree = _fit(C1, seed)
    _assert_monotone(tree)
    assert ari(tree["vbem"]["r"].values.argmax(1), truth["z"]) >= 0.99
    _assert_monotone(_fit(K4, seed)[2])


@pytest.mark.parametrize("options, match", [
    ({"num_restarts": 0}, "num_restarts"),
    ({"max_iter": 0}, "max_iter"),
    ({"tol": -1.0}, "tol"),
    ({"prior": "exact"}, "prior"),
])
def test_vbem_rejects_bad_options(options, match):
    data, _ = zoo.get("hlcr").simulate(0, n_agents=4)
    with pytest.raises(ValueError, match=match):
        fit("hlcr", data, "vbem", seed=0, **options)
