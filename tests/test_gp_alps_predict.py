"""``inference.predict`` for gp_alps (inference/gp_alps/predict.py) from a vbem tree (switch draws b ~ q(b)) and
a nuts tree (switches summed out by the model), against an independent NumPy/SciPy oracle: per draw, the exact
GP conditional mean of every latent at the new inputs given its values at the data, K(t*, t) K(t, t)^+ x_j,
with the kernels written out here; for nuts the switch posterior by brute-force enumeration of the 2^m patterns
with scipy densities; then the moments over draws (law of total variance)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

import inference
from zoo import gp_alps as za

KERNELS = [{"kind": "linper", "period": 20.0}, {"kind": "linper", "period": 10.0},
           {"kind": "rbf", "lengthscale": 1.5}]


def _gram(a, b, k):
    d = a[:, 0][:, None] - b[:, 0][None, :]
    if k["kind"] == "linper":
        return np.cos(2 * np.pi * d / k["period"])
    return np.exp(-0.5 * d ** 2 / k["lengthscale"] ** 2)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    t = np.arange(30) + 0.5
    sq = np.sign(np.sin(2 * np.pi * 0.05 * t))
    return {"t": t[:, None], "Y": np.stack([sq + 0.2 * rng.normal(size=30), -0.5 * sq + 0.2 * rng.normal(size=30)], 1)}


def _oracle(tree, data, t_new, sigma2=None):
    post = tree["posterior"]
    flat = lambda a: a.reshape((-1, *a.shape[2:]))
    u, H = flat(post["u"].values), flat(post["H"].values)
    S, p, m = H.shape
    sig2 = flat(post["sigma2"].values) if "sigma2" in post else np.full((S, p), sigma2)
    t, Y = data["t"], data["Y"]
    F = za.latent_factors(t, za.resolve_kernels(KERNELS))            # the model's x_j = F_j u_j at the data
    X = np.einsum("jnr,sjr->sjn", F, u)
    # exact GP conditional mean at t_new given x_j at the data
    weights = [_gram(t_new, t, k) @ np.linalg.pinv(_gram(t, t, k), rcond=1e-9, hermitian=True) for k in KERNELS]
    Xn = np.stack([np.einsum("nk,sk->sn", weights[j], X[:, j]) for j in range(len(KERNELS))], 1)
    if "b" in post:
        f = np.einsum("spj,sjn->spn", H * flat(post["b"].values)[:, None, :], Xn)
        Ef, Ef2 = f, f ** 2
    else:
        Ef, Ef2 = np.zeros((S, p, len(t_new))), np.zeros((S, p, len(t_new)))
        for s in range(S):
            pats = np.array(list(itertools.product((0.0, 1.0), repeat=m)))
            lj = np.array([stats.norm.logpdf(Y, ((H[s] * b) @ X[s]).T, np.sqrt(sig2[s])).sum()
                           + stats.bernoulli.logpmf(b, 0.5).sum() for b in pats])
            w = np.exp(lj - lj.max())
            w /= w.sum()
            fs = np.einsum("cpj,jn->cpn", H[s][None] * pats[:, None, :], Xn[s])
            Ef[s], Ef2[s] = np.einsum("c,cpn->pn", w, fs), np.einsum("c,cpn->pn", w, fs ** 2)
    mean = Ef.mean(0)
    f_var = Ef2.mean(0) - mean ** 2
    return mean.T, f_var.T, (f_var + sig2.mean(0)[:, None]).T


T_NEW = np.array([[-3.0], [0.25], [12.7], [31.0], [45.5]])


def _check(out, oracle):
    mean, f_var, var = oracle
    np.testing.assert_allclose(out["mean"], mean, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(out["f_mean"], mean, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(out["f_var"], f_var, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(out["var"], var, rtol=1e-6, atol=1e-8)


@pytest.fixture(scope="module")
def vbem_tree(data):
    return inference.fit("gp_alps", data, "vbem", seed=0, kernels=KERNELS, sigma2=0.04, num_samples=30, max_iter=30,
                         num_restarts=1)


def test_predict_from_a_vbem_tree_matches_the_exact_gp_conditional_of_each_draw(vbem_tree, data):
    tree = vbem_tree
    out = inference.predict(tree, {"t": T_NEW})
    assert set(out) == {"mean", "var", "f_mean", "f_var"} and out["mean"].shape == (5, 2)
    assert np.all(out["var"] > out["f_var"])
    _check(out, _oracle(tree, data, T_NEW, sigma2=0.04))


def test_predict_from_a_nuts_tree_sums_the_switches_out_like_brute_force_enumeration(data):
    tree = inference.fit("gp_alps", data, "nuts", seed=0, kernels=KERNELS, num_warmup=30, num_samples=8,
                         num_chains=1)
    assert "b" not in tree["posterior"]
    out = inference.predict(tree, {"t": T_NEW})
    _check(out, _oracle(tree, data, T_NEW))


def test_predict_rejects_inputs_of_the_wrong_shape(vbem_tree):
    with pytest.raises(ValueError, match="new_data\\['t'\\]"):
        inference.predict(vbem_tree, {"t": np.zeros((3, 2))})
