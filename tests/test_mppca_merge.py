"""VB merging of MPPCA models from parameters only (notes T6, T7, T8, E15, T9; incremental merging)."""

import jax
import numpy as np
import pytest

import inference
from inference.mppca import common as V
from inference.mppca import merge as MG
from inference.mppca import vbem
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
    out = MG.merge_mppca(models, K=20, variant=variant, num_restarts=4)
    F = out["bound"]
    assert np.all(np.diff(F)[1:] >= -1e-7 * np.abs(F).max())
    assert out["K_eff"] == 4
    ll, ll_pooled = _heldout(out, truth["Y_test"]), _heldout(pooled, truth["Y_test"])
    assert abs(ll - ll_pooled) <= (1e-3 if variant == "ess" else 1.5e-2) * abs(ll_pooled), (ll, ll_pooled)


def test_merging_identical_copies_returns_the_input_model(syn1_split):
    # T7: 5 copies of one 4-component model (N = 200000 virtual points, K = 20, best of 4): K' = 4, output means
    # equal the input means to 1e-5 absolute (data range ~ 40), C_k to 1e-3 relative, weights to 1e-6.
    _, pooled, _ = syn1_split
    out = MG.merge_mppca([pooled] * 5, K=20, num_restarts=4, n_virtual=200000.0)
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
    out = MG.merge_incremental(models, K=12, num_restarts=2)
    assert out["K_eff"] == 4
    ll, ll_pooled = _heldout(out, truth["Y_test"]), _heldout(pooled, truth["Y_test"])
    assert abs(ll - ll_pooled) <= 5e-3 * abs(ll_pooled)
    data, _ = mppca.simulate_small(0, N=200)
    trees = [inference.fit("mppca", {"Y": data["Y"][i::2]}, "vbem", seed=i, K=4, q=1, tau_fixed=1.0, prior="paper",
                           num_samples=20) for i in range(2)]
    merged = MG.merge_mppca(trees, K=6, num_restarts=2)
    assert 2 <= merged["K_eff"] <= sum(int(t.attrs["K_eff"]) for t in trees)
    assert np.all(np.isfinite(merged["covariances"]))
    with pytest.raises(ValueError, match="variant"):
        MG.merge_mppca(models, variant="x")
    with pytest.raises(ValueError, match="models"):
        MG.merge_mppca([])


# --------------------------------------------------------------------------------------------------
# T8 at the notes' splits, E15, T9 (slow)
# --------------------------------------------------------------------------------------------------


def _cov(m):
    return np.einsum("kiq,kjq->kij", m["loadings"], m["loadings"]) + np.eye(m["means"].shape[1]) / m["tau"]


def _heldout_2d(m, Yt):
    """The notes' held-out measure (E22): log-lik of the first two coordinates under the plug-in GMM marginal."""
    w = m["weights"] if "weights" in m else m["counts"] / m["counts"].sum()
    return V.gmm_logpdf(Yt[:, :2], w, m["means"][:, :2], _cov(m)[:, :2, :2]).sum()


# SYN1 process 4: its third cluster is nearly isotropic (embedded eigenvalues 11.9 and 9.7), like the notes'
# prototype set (9.9 and 7.6) on which the fixed-x2 failure of E15 was measured.
T8_SEED = 4


@pytest.fixture(scope="module")
def t8_runs():
    """For M_in in (2, 10, 50): oracle inputs on M_in subsets of 100 points of one SYN1 process, the pooled
    per-cluster PPCA fit, and both merges (K = min(4 M_in, 20), best of 4, the notes' virtual sample N = 200000
    for both variants). The fixed-x2 means approach the weighted input means slowly (the x1 / mean coupling
    contracts by ~ 1 - Sx per sweep), hence 10000 sweeps for it."""
    out = {}
    for M in (2, 10, 50):
        data, truth = mppca.simulate(T8_SEED, N=100 * M)
        Y, z = data["Y"], truth["labels"]
        models = [_oracle(Y[i::M], z[i::M]) for i in range(M)]
        K = min(4 * M, 20)
        merged = {"paper": MG.merge_mppca(models, K=K, variant="paper", num_restarts=4, max_iter=10000,
                                                 tol=1e-14),
                  "ess": MG.merge_mppca(models, K=K, variant="ess", num_restarts=4, n_virtual=200000.0)}
        out[M] = (models, _oracle(Y, z), truth, merged)
    return out


def _t8_merge(t8_runs, M, variant):
    """(models, pooled, truth, merged output) at split M, after the checks both variants share: T6 (bound
    monotone after sweep 1) at this split and K' = 4."""
    models, pooled, truth, merged = t8_runs[M]
    out = merged[variant]
    F = out["bound"]
    assert np.all(np.diff(F)[1:] >= -1e-7 * np.abs(F).max())
    assert out["K_eff"] == 4
    return models, pooled, truth, out


def _match(out, pooled):
    """For each output component, the index of the nearest pooled (true-cluster) mean."""
    return [int(np.argmin(np.linalg.norm(pooled["means"] - m, axis=1))) for m in out["means"]]


@pytest.mark.slow
@pytest.mark.parametrize("M", [2, 10, 50])
def test_paper_merge_recovers_pooled_estimates_at_the_notes_splits(t8_runs, M):
    # T8, fixed x2 (the paper's VBMPPCA-A): K' = 4; purity 1.0 (each output component collects the inputs of
    # one true cluster); output means = the w r-weighted input means to 1e-6 relative; held-out 2-D log-lik
    # within 1.5 % (M_in <= 10) / 4 % (M_in = 50) of the pooled per-cluster PPCA fit.
    models, pooled, truth, out = _t8_merge(t8_runs, M, "paper")
    cluster = np.tile(np.arange(4), M)                           # input l = component l % 4 of model l // 4
    hard = np.argmax(out["assignment"], axis=1)
    assert np.all(out["assignment"].max(1) > 0.5)                # every input sits in a kept component
    assert all(len(set(cluster[hard == j])) == 1 for j in range(4)), [set(cluster[hard == j]) for j in range(4)]
    assert sorted(_match(out, pooled)) == [0, 1, 2, 3]
    mus = np.concatenate([m["means"] for m in models])
    wr = np.concatenate([m["counts"] for m in models])[:, None] * out["assignment"]
    wmean = wr.T @ mus / wr.sum(0)[:, None]
    rel = np.linalg.norm(out["means"] - wmean, axis=1) / np.linalg.norm(wmean, axis=1)
    assert rel.max() <= 1e-6, rel
    ll, ll_pooled = _heldout_2d(out, truth["Y_test"]), _heldout_2d(pooled, truth["Y_test"])
    tol = 1.5e-2 if M <= 10 else 4e-2
    print(f"T8 paper M={M}: held-out 2-D {ll:.1f} vs pooled {ll_pooled:.1f} ({(ll_pooled - ll) / abs(ll_pooled):.2%})"
          f", means rel {rel.max():.1e}")
    assert abs(ll - ll_pooled) <= tol * abs(ll_pooled), (ll, ll_pooled)


@pytest.mark.slow
@pytest.mark.parametrize("M", [2, 10, 50])
def test_ess_merge_recovers_pooled_estimates_at_the_notes_splits(t8_runs, M):
    # T8, ESS variant: held-out 2-D log-lik within 0.1 % of the pooled fit for every M_in; relative Frobenius
    # error of every output C_k against the matched pooled C_k <= 0.07. (With merge_mppca's default virtual size
    # for ESS, the inputs' total count, M_in = 2 is 0.23 % off: ~50 points per cluster leave the VB loadings
    # visibly shrunk against the ML pooled fit; with N = 200000 the pseudo-posterior is a point mass.)
    models, pooled, truth, out = _t8_merge(t8_runs, M, "ess")
    order = _match(out, pooled)
    assert sorted(order) == [0, 1, 2, 3]
    Cp = _cov(pooled)
    err = [np.linalg.norm(out["covariances"][j] - Cp[k]) / np.linalg.norm(Cp[k]) for j, k in enumerate(order)]
    ll, ll_pooled = _heldout_2d(out, truth["Y_test"]), _heldout_2d(pooled, truth["Y_test"])
    print(f"T8 ess M={M}: held-out 2-D {ll:.1f} vs pooled {ll_pooled:.1f} ({(ll_pooled - ll) / abs(ll_pooled):.3%})"
          f", C errors {np.round(err, 3)}")
    assert max(err) <= 0.07, err
    assert abs(ll - ll_pooled) <= 1e-3 * abs(ll_pooled), (ll, ll_pooled)


@pytest.mark.slow
@pytest.mark.parametrize("M", [2, 10, 50])
def test_fixed_x2_errs_more_than_ess_on_the_near_isotropic_cluster(t8_runs, M):
    # E15 (documenting): with near-equal eigenvalues the eq.-5 column order and sign of the inputs are unstable,
    # so the fixed-x2 average of loadings columns mixes misaligned columns; ESS is rotation-invariant. The
    # relative Frobenius error of C_k on the most isotropic cluster is larger for fixed x2 than for ESS.
    models, pooled, truth, merged = t8_runs[M]
    ev = np.linalg.eigvalsh(truth["C"] - np.eye(9))[:, -2:]           # embedded eigenvalues T S2 T^T
    iso = int(np.argmax(ev[:, 0] / ev[:, 1]))
    Cp = _cov(pooled)[iso]
    err = {}
    for v, out in merged.items():
        j = int(np.argmin(np.linalg.norm(out["means"] - pooled["means"][iso], axis=1)))
        err[v] = np.linalg.norm(out["covariances"][j] - Cp) / np.linalg.norm(Cp)
    print(f"E15 M={M}: cluster {iso} (eigenvalues {np.round(ev[iso], 2)}): C error paper {err['paper']:.3f}, "
          f"ess {err['ess']:.3f}")
    assert err["paper"] > err["ess"], err


@pytest.fixture(scope="module")
def t9_models():
    """T9 inputs: VB-EM fits (K_init = 10, q = 8, tau = 1, one restart: realistic, occasionally imperfect inputs)
    on 10 SYN1 sets of 1000 points from one process, as parameter dicts, with their held-out 2-D log-liks."""
    data, truth = mppca.simulate(0, N=10000)
    hyper = {"K": 10, "q": 8, "tau_fixed": 1.0, "alpha0": 1e-3, "a0": 1e-3, "b0": 1e-3, "nu0": 1e-3,
             "a_tau": 1e-3, "b_tau": 1e-3}
    models = []
    for i in range(10):
        cfg, res = vbem.fit_vbem(data["Y"][1000 * i:1000 * (i + 1)], hyper, jax.random.key(i), max_iter=1500, tol=1e-8)
        s = V.summary_of(cfg, res.state)
        models.append({"counts": s["N_k"][s["keep"]], "means": s["means"], "loadings": s["loadings"],
                       "tau": s["tau"]})
    lls = np.array([_heldout_2d(m, truth["Y_test"]) for m in models])
    return models, lls, truth


T9_PAPER_XFAIL = ("measured: fixed-x2 K' = 7 (2 models) and 13 (10 models), held-out 2-D -6086.2 (1.5 % below the "
                  "input median -5996.7) and -5994.0; ESS: K' = 4 and 5, -5992.4 and -5986.1; cause: the single-"
                  "restart inputs split clusters (input K' 4-8; model 2 cuts cluster 0 into 5 pieces of rank 0-1) "
                  "and fixed x2 matches loadings column by column, so pieces whose columns describe sub-cluster "
                  "spreads cannot share an output component (4 output components on cluster 0); not the virtual "
                  "size: with N = 2000 (the true count) instead of 200000 still K' = 7, -6083.3")


@pytest.mark.slow
@pytest.mark.parametrize("variant", [pytest.param("paper", marks=pytest.mark.xfail(strict=True, reason=T9_PAPER_XFAIL)),
                                     "ess"])
@pytest.mark.parametrize("n_models", [2, 10])
def test_merging_vbem_models_is_as_good_as_a_typical_input(t9_models, variant, n_models):
    # T9: aggregate the first 2 / 10 of the 10 VB-EM models (K = 20, best of 4): 4 <= K' <= 6 and held-out 2-D
    # log-lik >= the median input model's minus 1 %. Inputs are single-restart VB-EM fits (realistic: some
    # keep a cluster split in two components).
    models, lls, truth = t9_models
    out = MG.merge_mppca(models[:n_models], K=20, variant=variant, num_restarts=4)
    ll, med = _heldout_2d(out, truth["Y_test"]), float(np.median(lls))
    print(f"T9 {variant} {n_models} models: K' {out['K_eff']}, held-out 2-D {ll:.1f}; input median {med:.1f}, "
          f"inputs K' {[len(m['counts']) for m in models]}")
    assert 4 <= out["K_eff"] <= 6
    assert ll >= med - 1e-2 * abs(med), (ll, med)
