"""ML EM for (M)PPCA (T1) and the scikit-learn VBGMM baseline; VBMPPCA vs VBGMM on digits (claim C3, slow)."""

import jax
import numpy as np
import pytest

import inference
import zoo
from diagnostics.metrics import clustering_error
from inference.mppca import baselines, em, vbem
from inference.mppca import common as V
from zoo import mppca


def test_ppca_em_with_fixed_tau_converges_to_the_closed_form_solution():
    # T1: N = 2000, d = 9, q = 2, column norms 5 and 3, tau = 1 fixed: Lambda Lambda^T -> U_q (L_q - I) U_q^T of
    # the (1/N) sample covariance, relative Frobenius error <= 1e-6 (notes' tolerance, exact oracle).
    data, _ = mppca.simulate_ppca(0, N=2000, d=9, scales=(5.0, 3.0))
    Y = data["Y"]
    hyper = {**zoo.get("ppca").default_hyper, "q": 2, "tau_fixed": 1.0}
    cfg, run = em.fit_em(Y, hyper, jax.random.key(0), mixture=False, max_iter=5000, tol=1e-15)
    st, trace = run.state, run.info.objective
    S = np.cov(Y.T, bias=True)
    lam, U = np.linalg.eigh(S)
    closed = U[:, -2:] @ np.diag(lam[-2:] - 1.0) @ U[:, -2:].T
    W = np.asarray(st.W[0])
    assert np.linalg.norm(W @ W.T - closed) / np.linalg.norm(closed) <= 1e-6
    assert np.all(np.diff(trace)[1:] >= -1e-9 * np.abs(trace).max())     # EM log-likelihood is monotone
    R = V.rotate(W)                                                         # eq. 5: orthogonal, decreasing
    cos = (R[:, 0] @ R[:, 1]) / np.prod(np.linalg.norm(R, axis=0))
    assert abs(cos) <= 1e-8 and np.linalg.norm(R[:, 0]) >= np.linalg.norm(R[:, 1])
    np.testing.assert_allclose(R @ R.T, W @ W.T, atol=1e-10)


def test_mppca_em_and_vbgmm_methods_return_model_shaped_trees_on_syn1():
    # Both baselines run through fit(): one point draw of every model site, finite log densities; on SYN1
    # (4 separated clusters, N = 400) the ML mixture's held-out log-lik is within 2 % of the true mixture's.
    data, truth = mppca.simulate(1, N=400)
    em = inference.fit("mppca", data, "em", seed=0, K=4, q=2)
    post = em["posterior"].to_dataset()
    assert post["Wt"].shape == (1, 1, 4, 2, 9) and np.isfinite(em["log_likelihood"]["y"].values).all()
    w = post["omega"].values[0, 0]
    C = np.einsum("kqi,kqj->kij", post["Wt"].values[0, 0], post["Wt"].values[0, 0]) + np.eye(9) / float(
        post["tau"].values[0, 0])
    ll_em = V.gmm_logpdf(truth["Y_test"], w, post["mu"].values[0, 0], C).sum()
    ll_true = V.gmm_logpdf(truth["Y_test"], truth["omega"], truth["mu"], truth["C"]).sum()
    assert ll_em >= ll_true - 0.02 * abs(ll_true)
    vg = inference.fit("mppca", data, "vbgmm", seed=0, K=6, q=2, prior="paper")
    assert vg["posterior"]["Wt"].shape == (1, 1, 6, 2, 9) and "gmm" in vg.children
    vp = inference.fit("mppca", data, "vbgmm", seed=0, K=6, q=2, covariance_prior="vbmix", prior="paper")
    assert vp.attrs["converged"] == 1
    with pytest.raises(ValueError, match="covariance_prior"):
        inference.fit("mppca", data, "vbgmm", seed=0, K=6, covariance_prior="wide")


@pytest.fixture(scope="module")
def digits_vbmppca():
    data, truth = mppca.load_digits_data(0)
    hyper = {**zoo.get("mppca").default_hyper, **mppca.PAPER_PRIORS, "K": 30, "q": 8}
    cfg, res = vbem.fit_vbem(data["Y"], hyper, jax.random.key(0), num_restarts=1, max_iter=3000, tol=1e-8)
    assert res.converged
    s = V.summary_of(cfg, res.state)
    return data, truth, V.gmm_logpdf(truth["Y_test"], s["weights"], s["means"], s["covariances"]).sum(), s


DIGITS_VBMIX_XFAIL = ("measured: VB-MPPCA -59648 (K' = 30) vs VBGMM with the paper's prior -55853 (K' = 27, 35 "
                      "iterations, converged); not under-fitting: 4 restarts give -59648 again, q = 16 -58209, tau "
                      "fixed at the paper's 1 -82487; cause: with W0^-1 = diag(d range^2 / 64) every GMM component "
                      "gets a broad full covariance, a better density model of the 61-pixel digits than a few "
                      "loadings plus isotropic noise (the paper compares clustering error on real data, not log-lik)")


@pytest.mark.slow
@pytest.mark.parametrize("prior", ["sklearn", pytest.param("vbmix", marks=pytest.mark.xfail(
    strict=True, reason=DIGITS_VBMIX_XFAIL))])
def test_vbmppca_beats_vbgmm_in_held_out_log_likelihood_on_digits(digits_vbmppca, prior):
    # Issue acceptance: digits scaled to [-10, 10], 400 held out, K_init = 30 for both; VB-MPPCA (q = 8, tau
    # learned) vs sklearn's full-covariance BayesianGaussianMixture (same alpha0), both run to convergence with
    # comparable stopping rules (vbem: relative bound change < 1e-8; sklearn: absolute change of its total bound
    # < 1e-3, ~1e-8 relative), both scored by the plug-in mixture density (sklearn's score() is its Jensen-
    # lowered E-step quantity, 4381 nats lower here). Wishart scale: sklearn's default (empirical covariance):
    # VB-MPPCA -59648 vs VBGMM -178407 (sklearn stops after 2 iterations: the k-means partition is an exact
    # fixed point, the bound change is 0 and 30 forced iterations leave it unchanged; the data-covariance
    # prior / (nu0 + N_k) leaves tiny variances off each ~46-point cluster's span). The paper's VBGMM prior
    # (notes 3.7): see the xfail reason.
    data, truth, ll_vb, s = digits_vbmppca
    g = baselines.fit_vbgmm(data["Y"], 30, seed=0, tol=1e-3, max_iter=2000, covariance_prior=prior)
    assert g.converged_
    ll_gmm = V.gmm_logpdf(truth["Y_test"], g.weights_, g.means_, g.covariances_).sum()
    print(f"digits held-out log-lik: VB-MPPCA {ll_vb:.0f} (K'={len(s['keep'])}), VBGMM ({prior} prior) {ll_gmm:.0f} "
          f"(K'={int(np.sum(g.weights_ * len(data['Y']) > 2))}, {g.n_iter_} iterations)")
    assert ll_vb > ll_gmm


def test_clustering_error_is_one_minus_the_rand_index():
    # T13: equals 1 - sklearn rand_score exactly; identical partitions -> 0; invariant to relabelling.
    from sklearn.metrics import rand_score

    rng = np.random.default_rng(0)
    a, b = rng.integers(4, size=300), rng.integers(6, size=300)
    assert abs(clustering_error(a, b) - (1 - rand_score(a, b))) <= 1e-12
    i, j = np.triu_indices(a.size, 1)                    # independent oracle: count the disagreeing pairs
    assert abs(clustering_error(a, b) - np.mean((a[i] == a[j]) != (b[i] == b[j]))) <= 1e-12
    assert clustering_error(a, a) == 0.0
    assert clustering_error(a, (a + 2) % 4) == 0.0


@pytest.mark.slow
def test_vbmppca_beats_vbgmm_on_syn3_circle_data():
    # T10 (paper claim C3, qualitative): SYN3, N = 1000, 5 sets, tau = 1 fixed, K_init = 20: mean held-out 2-D
    # log-lik of VBMPPCA > VBGMM (sklearn, full covariances), and VBMPPCA keeps K' >= 4.
    res = []
    for s in range(5):
        data, truth = mppca.simulate_syn3(100 + s, N=1000)
        hyper = {**zoo.get("mppca").default_hyper, **mppca.PAPER_PRIORS, "K": 20, "q": 8, "tau_fixed": 1.0}
        cfg, r = vbem.fit_vbem(data["Y"], hyper, jax.random.key(s), max_iter=1500, tol=1e-8)
        sm = V.summary_of(cfg, r.state)
        g = baselines.fit_vbgmm(data["Y"], 20, seed=s)
        keep = g.weights_ * len(data["Y"]) > 2
        Yt = truth["Y_test"][:, :2]
        ll_vb = V.gmm_logpdf(Yt, sm["weights"], sm["means"][:, :2], sm["covariances"][:, :2, :2]).sum()
        ll_g = V.gmm_logpdf(Yt, g.weights_[keep] / g.weights_[keep].sum(), g.means_[keep][:, :2],
                            g.covariances_[keep][:, :2, :2]).sum()
        res.append((ll_vb, ll_g, len(sm["keep"])))
    res = np.array(res)
    m = res.mean(0)
    print(f"SYN3 held-out 2-D log-lik VBMPPCA {m[0]:.0f} VBGMM {m[1]:.0f} K' {m[2]:.1f}")
    assert res[:, 0].mean() > res[:, 1].mean() and res[:, 2].min() >= 4
