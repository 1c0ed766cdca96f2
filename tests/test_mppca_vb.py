"""VB-EM for Bayesian (M)PPCA: bound monotonicity (T2), erratum E4, Algorithm 1 (T12), VB vs NUTS (T11),
model selection and subspace recovery on SYN1 (T4, T5), robustness (T14)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import inference
import zoo
from diagnostics import references
from diagnostics.scoring import compared_posterior, scorecard
from inference.mppca import common as V
from inference.mppca import vbem
from zoo import mppca


def _hyper(**kw):
    return {**zoo.get("mppca").default_hyper, **mppca.PAPER_PRIORS, **kw}


def _recorded_sweeps(cfg, Y, mu0, key, n):
    """Bounds after every factor update of n sweeps (n, 6) from a k-means initialisation."""
    problem = vbem.Problem(Y, mu0)
    st = jax.jit(vbem.kernel(cfg).init)(key, problem)

    def body(st, _):
        return vbem.sweep(cfg, st, problem, record=True)

    return np.asarray(jax.jit(lambda s: jax.lax.scan(body, s, None, length=n)[1])(st))


@pytest.mark.parametrize("seed, tau_fixed", [(0, 1.0), pytest.param(1, None, marks=pytest.mark.slow)])
def test_bound_never_decreases_after_any_factor_update_on_syn1(seed, tau_fixed):
    # T2: N = 300, K = 10, q = 8; every single factor update is a coordinate-ascent step, so the bound may
    # only decrease by round-off (1e-8 relative, the notes' tolerance).
    data, _ = mppca.simulate(seed, N=300)
    Y = jnp.asarray(data["Y"])
    hyper = _hyper(K=10, q=8, tau_fixed=tau_fixed)
    cfg = V.cfg_from(hyper, 9, True)
    mu0 = jnp.asarray(mppca.prior_means(data, hyper, 10))
    F = _recorded_sweeps(cfg, Y, mu0, jax.random.key(seed), 80).reshape(-1)[1:]   # after the first update
    drops = np.diff(F)
    assert np.all(np.isfinite(F))
    assert drops.min() >= -1e-8 * np.abs(F).max(), drops.min()


def test_paper_responsibilities_without_half_logdet_sigma_x_decrease_the_bound_at_the_vb_fixed_point():
    # Erratum E4: at a converged state of the corrected algorithm, q(x, z) is the exact coordinate optimum, so
    # the corrected X/Z step keeps the bound (to round-off) while the paper's step (no +1/2 ln|Sigma_x|)
    # must lower it. The decrease is strictly positive (a fraction of a nat here, 1e-3 nats is far above
    # round-off, which is ~1e-9 nats at |F| ~ 5e3).
    data, _ = mppca.simulate(3, N=300)
    hyper = _hyper(K=6, q=4, tau_fixed=1.0)
    cfg, res = vbem.fit_vbem(data["Y"], hyper, jax.random.key(0), max_iter=3000, tol=1e-12)
    Y = jnp.asarray(data["Y"])
    problem = vbem.Problem(Y, jnp.asarray(mppca.prior_means(data, hyper, 6)))
    bound = jax.jit(lambda c, st: vbem.bound(c, st, problem), static_argnums=0)          # one program each
    update_xz = jax.jit(lambda c, st: vbem.update_xz(c, st, Y), static_argnums=0)
    F0 = float(bound(cfg, res.state))
    F_ok = float(bound(cfg, update_xz(cfg, res.state)))
    F_paper = float(bound(cfg._replace(paper_literal=True), update_xz(cfg._replace(paper_literal=True), res.state)))
    assert F_ok >= F0 - 1e-7 * abs(F0)
    assert F_paper < F0 - 1e-3, (F0, F_paper)


def test_algorithm_1_ranks_follow_the_vbmix_semantics():
    # T12: column norms (5, 3, 0.01, 0) in d = 9, tau = 1 -> 2; all entries <= 0.1 -> 0 (void);
    # four strong columns -> 4.
    rng = np.random.default_rng(0)
    U, _ = np.linalg.qr(rng.normal(size=(9, 4)))
    assert V.effective_rank(V.rotate(U * [5, 3, 0.01, 0]), 1.0) == 2
    assert V.effective_rank(0.1 * rng.uniform(-1, 1, (9, 4)) * 0.99, 1.0) == 0
    assert V.effective_rank(V.rotate(U * [5, 4, 3, 2]), 1.0) == 4
    M = V.rotate(U * [5, 3, 0, 0])
    assert np.all(np.diff(np.linalg.norm(M, axis=0)) <= 1e-12) and np.all(M[0] >= 0)
    np.testing.assert_allclose(M @ M.T, (U * [5, 3, 0, 0]) @ (U * [5, 3, 0, 0]).T, atol=1e-10)


def test_vbem_ppca_recovers_the_covariance_and_pruned_ard_columns():
    # 2000 points, true rank 2 in d = 5: sampling error of C is ~ |C| sqrt(2/N) ~ 3 %; 10 % relative Frobenius
    # leaves room for it; the two spare ARD columns (q = 4) must be switched off (Algorithm-1 rank 2).
    data, truth = mppca.simulate_ppca(0, N=2000)
    tree = inference.fit("ppca", data, "vbem", seed=0, q=4, tau_fixed=None, num_samples=200, prior="paper")
    var = tree["variational"].to_dataset()
    assert int(var["rank"].values[0]) == 2
    C = compared_posterior(tree)["C_sorted"].mean(("chain", "draw")).values[0]
    iu = np.triu_indices(5)
    assert np.linalg.norm(C - truth["C"][iu]) / np.linalg.norm(truth["C"][iu]) < 0.1
    assert abs(var.attrs["E_tau"] - 1.0) < 0.1        # tau = 1, sd of E tau ~ sqrt(2/(N(d-q))) ~ 2 %
    bound = tree["sample_stats"]["bound"].values
    assert np.all(np.diff(bound)[1:] >= -1e-8 * np.abs(bound).max())
    assert "log_q" in tree["sample_stats"]


@pytest.fixture(scope="module")
def syn1_fits():
    """T4/T5: VB-EM (K_init = 10, q = 8, tau = 1, best of 3 restarts) on 5 SYN1 sets of N = 1000."""
    out = []
    for seed in range(5):
        data, truth = mppca.simulate(seed, N=1000)
        tree = inference.fit("mppca", data, "vbem", seed=seed, K=10, q=8, tau_fixed=1.0, num_restarts=3, num_samples=10,
                             prior="paper",
                             max_iter=1500, tol=1e-8)
        out.append((tree["variational"].to_dataset(), truth))
    return out


@pytest.mark.slow
def test_vbem_selects_four_components_on_syn1(syn1_fits):
    # T4: exactly 4 components with N_k > 2 in >= 4 of 5 data sets; Algorithm-1 ranks of all kept components in
    # {1, 2} with mean >= 1.5.
    n_comp = [int(var["kept"].sum()) for var, _ in syn1_fits]
    ranks = np.concatenate([var["rank"].values for var, _ in syn1_fits])
    print(f"T4: K' per set {n_comp}, ranks {ranks.tolist()} (mean {ranks.mean():.2f})")
    assert sum(k == 4 for k in n_comp) >= 4, n_comp
    assert set(ranks.tolist()) <= {1, 2} and ranks.mean() >= 1.5, ranks


def _t5_components(syn1_fits):
    """Per kept component: (set, matched true cluster, mean error, first-column angle to the true first axis, the
    same angle for the cluster's own sample PCA axis, largest angle of span(first 2 columns) to span(T), the two
    embedded eigenvalues)."""
    from scipy.linalg import subspace_angles

    deg = lambda u, v: np.degrees(np.arccos(min(1.0, abs(u @ v) / np.linalg.norm(u) / np.linalg.norm(v))))  # noqa
    rows = []
    for seed, (var, truth) in enumerate(syn1_fits):
        Y = mppca.simulate(seed, N=1000)[0]["Y"]
        for k in np.flatnonzero(var["kept"].values):
            m = var["m_mu"].values[k]
            t = int(np.argmin(np.linalg.norm(truth["mu"] - m, axis=1)))
            M = V.rotate(var["M"].values[k])
            # the embedded cluster covariance T S2 T^T (rank 2); its top eigenvector is the first principal axis
            # (T is not orthonormal after T[:2, :2] = I, so T v1 itself is only close to it)
            ev, vec = np.linalg.eigh(truth["C"][t] - np.eye(9))
            sample_axis = np.linalg.eigh(np.cov(Y[truth["labels"] == t].T))[1][:, -1]
            span = np.degrees(subspace_angles(M[:, :2], truth["T"])).max()
            rows.append((seed, t, np.linalg.norm(truth["mu"][t] - m), deg(M[:, 0], vec[:, -1]),
                         deg(sample_axis, vec[:, -1]), span, ev[-1], ev[-2]))
    return np.array(rows)


@pytest.mark.slow
def test_vbem_recovers_syn1_means_and_subspaces(syn1_fits):
    # T5 (same fits, N = 1000), every kept component matched to the nearest true mean: mean error <= 1.0 (data
    # range ~ 40); for clusters whose smaller embedded eigenvalue exceeds 2 / tau, the largest principal angle
    # between span(first 2 rotated loading columns) and span(T) <= 10 degrees.
    r = _t5_components(syn1_fits)
    big = r[:, 7] > 2.0
    print(f"T5: worst mean error {r[:, 2].max():.3f}; worst 2-D span angle {r[big, 5].max():.2f} deg over "
          f"{int(big.sum())} of {len(r)} components")
    assert r[:, 2].max() <= 1.0
    assert r[big, 5].max() <= 10.0


T5_FIRST_AXIS_XFAIL = ("measured: worst first-column angle 29.6 deg (set 3, cluster 1: embedded eigenvalues 16.3 "
                       "and 11.1), the other 19 components 1.9-9.2 deg; cause: sampling, not the fit -- that "
                       "cluster's own sample PCA axis (~250 points) is already 26.0 deg from the true axis (a 2.8 "
                       "sd draw: sd ~ sqrt(l1 l2 / n) / (l1 - l2) ~ 9.4 deg); span(first 2 columns) is recovered "
                       "(<= 9.4 deg, test above)")


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=T5_FIRST_AXIS_XFAIL)
def test_vbem_first_loading_column_is_within_10_degrees_of_the_first_principal_axis(syn1_fits):
    # T5: for each recovered component the angle between its first (eq.-5 rotated) loading column and the
    # matched true cluster's first principal axis <= 10 degrees (the notes' tolerance, on all 5 sets).
    r = _t5_components(syn1_fits)
    for row in r:
        print(f"T5 set {row[0]:.0f} cluster {row[1]:.0f}: first-column angle {row[3]:.2f} deg, sample-PCA axis "
              f"{row[4]:.2f} deg, eigenvalues {row[6]:.2f} {row[7]:.2f}")
    assert r[:, 3].max() <= 10.0


def test_vbem_agrees_with_stored_nuts_reference_on_the_t11_problem():
    # T11 (notes): d = 3, K = 2, q = 1, N = 200, tau = 1, alpha0 = a0 = b0 = 1, nu0 = 0.01. Label-sorted
    # means within 3 NUTS posterior sd per coordinate; E[C_k] within 10 % relative Frobenius; VB sd of the
    # means between 0.3x and 1.2x the NUTS sd (mean-field VB under-disperses).
    _, opts = mppca.reference_datasets()["t11"]
    data, _ = references.reference_data("mppca", "t11")
    ref = references.load("mppca", data, tag="t11")
    hyper = {k: v for k, v in opts.items() if k in zoo.get("mppca").hyperparameters}
    tree = inference.fit("mppca", data, "vbem", seed=0, num_samples=4000, **hyper)
    sc = scorecard(ref, {"vbem": tree})
    mu = sc[sc.parameter.str.startswith("mu_sorted")]
    assert len(mu) == 6 and mu["reliable"].all()
    assert mu["std_mean_error"].max() <= 3.0, mu[["parameter", "std_mean_error"]]
    assert mu["sd_ratio"].between(0.3, 1.2).all(), mu[["parameter", "sd_ratio"]]
    Cr = compared_posterior(ref)["C_sorted"].mean(("chain", "draw")).values
    Cv = compared_posterior(tree)["C_sorted"].mean(("chain", "draw")).values
    assert np.all(np.linalg.norm(Cv - Cr, axis=1) / np.linalg.norm(Cr, axis=1) <= 0.1)


def test_empty_components_stay_finite_and_bad_options_are_rejected():
    # T14: K = 8 on 2 clusters leaves empty components (N_k -> 0): no NaN anywhere in the tree, and some
    # components are pruned (N_k <= 2).
    data, _ = mppca.simulate_small(1, N=80)
    tree = inference.fit("mppca", data, "vbem", seed=0, K=8, q=2, num_samples=50, prior="paper")
    assert 2 <= int(tree.attrs["K_eff"]) < 8
    assert tree["variational"]["N_k"].values.min() < 1e-8           # the edge case is exercised: N_k = 0
    for g in ("posterior", "log_likelihood", "log_prior", "variational"):
        assert all(np.all(np.isfinite(v.values)) for v in tree[g].to_dataset().data_vars.values())
    with pytest.raises(ValueError, match="num_restarts"):
        inference.fit("mppca", data, "vbem", seed=0, num_restarts=0)
    with pytest.raises(ValueError, match="K: at most"):
        inference.fit("mppca", {"Y": data["Y"][:5]}, "vbem", seed=0, K=8, q=2)


def test_bound_is_below_the_monte_carlo_evidence_bracket():
    # T3: F <= E_q[ln p(Y | theta)] + E_q[ln p(theta) - ln q(theta)] + 3 SE, the bracket estimated from 2000
    # draws of q (the tree's log_likelihood, log_prior and log_q); the gap is E_q KL(q(x,z) || p(x,z | Y, theta)).
    data, opts = mppca.reference_datasets()["t11"]
    hyper = {k: v for k, v in opts.items() if k in zoo.get("mppca").hyperparameters}
    tree = inference.fit("mppca", data, "vbem", seed=0, num_samples=2000, **hyper)
    ll = tree["log_likelihood"]["y"].values.sum(-1)
    lp = sum(v.values for v in tree["log_prior"].to_dataset().data_vars.values())
    lq = tree["sample_stats"]["log_q"].values
    x = (ll + lp - lq).ravel()
    F = float(tree.attrs["objective"])
    se = x.std(ddof=1) / np.sqrt(x.size)
    assert F <= x.mean() + 3 * se, (F, x.mean(), se)
