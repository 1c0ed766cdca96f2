"""VB merging of MPPCA models from parameters only (notes T6, T7, T8; incremental merging)."""

import numpy as np
import pytest

import inference
from inference import mppca_merge as MG
from inference import mppca_vb as V
from zoo import mppca


def _oracle(Y, z, q=2):
    """Per-cluster ML PPCA with tau = 1 (closed form), counts = cluster sizes (the notes' oracle inputs)."""
    counts, means, loads = [], [], []
    for k in range(4):
        yk = Y[z == k]
        lam, U = np.linalg.eigh(np.cov(yk.T, bias=True))
        counts.append(len(yk))
        means.append(yk.mean(0))
        loads.append(U[:, -q:][:, ::-1] * np.sqrt(np.maximum(lam[-q:][::-1] - 1.0, 0.0)))
    return {"counts": np.array(counts, float), "means": np.array(means), "loadings": np.array(loads), "tau": 1.0}


def _heldout(m, Yt):
    C = np.einsum("kiq,kjq->kij", m["loadings"], m["loadings"]) + np.eye(Yt.shape[1]) / m["tau"]
    w = m["weights"] if "weights" in m else m["counts"] / m["counts"].sum()
    return V.gmm_logpdf(Yt, w, m["means"], C).sum()


@pytest.fixture(scope="module")
def syn1_split():
    data, truth = mppca.simulate(0, N=1000)
    Y, z = data["Y"], truth["labels"]
    return [_oracle(Y[i::5], z[i::5]) for i in range(5)], _oracle(Y, z), truth


@pytest.mark.parametrize("variant", ["ess", "paper"])
def test_merge_bound_is_monotone_and_recovers_the_pooled_fit(syn1_split, variant):
    # T6: bound non-decreasing (1e-7 relative) after the first sweep. T8 (5 subsets of 200 SYN1 points, oracle
    # inputs, K = 20, best of 4): K' = 4, held-out log-lik within 0.1 % (ESS) / 1.5 % (paper, fixed x2) of the
    # pooled per-cluster PPCA fit (the notes' tolerances).
    models, pooled, truth = syn1_split
    out = inference.merge_mppca(models, K=20, variant=variant, n_init=4)
    F = out["bound"]
    assert np.all(np.diff(F)[1:] >= -1e-7 * np.abs(F).max())
    assert out["K_eff"] == 4
    ll, ll_pooled = _heldout(out, truth["Y_test"]), _heldout(pooled, truth["Y_test"])
    assert abs(ll - ll_pooled) <= (1e-3 if variant == "ess" else 1.5e-2) * abs(ll_pooled), (ll, ll_pooled)


def test_merging_identical_copies_returns_the_input_model(syn1_split):
    # T7: 5 copies of one 4-component model (N = 200000 virtual points, K = 20, best of 4): K' = 4, output means
    # equal the input means to 1e-5 absolute (data range ~ 40), C_k to 1e-3 relative, weights to 1e-6.
    _, pooled, _ = syn1_split
    out = inference.merge_mppca([pooled] * 5, K=20, n_init=4, n_virtual=200000.0)
    assert out["K_eff"] == 4
    order = [int(np.argmin(np.linalg.norm(pooled["means"] - m, axis=1))) for m in out["means"]]
    assert sorted(order) == [0, 1, 2, 3]
    np.testing.assert_allclose(out["means"], pooled["means"][order], atol=1e-5)
    C_in = np.einsum("kiq,kjq->kij", pooled["loadings"], pooled["loadings"]) + np.eye(9)
    for j, k in enumerate(order):
        assert np.linalg.norm(out["covariances"][j] - C_in[k]) / np.linalg.norm(C_in[k]) <= 1e-3
    np.testing.assert_allclose(out["weights"], (pooled["counts"] / pooled["counts"].sum())[order], atol=1e-6)


def test_incremental_merge_and_merging_vbem_trees(syn1_split):
    # Sec. 6.3: folding the 5 subset models in one at a time (count-weighted reference) keeps K' = 4 and stays
    # within 0.5 % of the pooled held-out log-lik; merging returns something mergeable again; vbem trees are
    # accepted as inputs; bad input is rejected.
    models, pooled, truth = syn1_split
    out = MG.merge_incremental(models, K=12, n_init=2)
    assert out["K_eff"] == 4
    ll, ll_pooled = _heldout(out, truth["Y_test"]), _heldout(pooled, truth["Y_test"])
    assert abs(ll - ll_pooled) <= 5e-3 * abs(ll_pooled)
    data, _ = mppca.simulate_small(0, N=200)
    trees = [inference.fit("mppca", {"Y": data["Y"][i::2]}, "vbem", seed=i, K=4, q=1, tau_fixed=1.0,
                           num_samples=20) for i in range(2)]
    merged = inference.merge_mppca(trees, K=6, n_init=2)
    assert 2 <= merged["K_eff"] <= sum(int(t.attrs["K_eff"]) for t in trees)
    assert np.all(np.isfinite(merged["covariances"]))
    with pytest.raises(ValueError, match="variant"):
        inference.merge_mppca(models, variant="x")
    with pytest.raises(ValueError, match="models"):
        inference.merge_mppca([])
