"""The uniform draws on the simplex that start the HLCR VB kernels (``inference.hlcr.vb.flat_dirichlet``): their
law is Dir(1, ..., 1), checked against SciPy's Beta(1, K - 1) marginal and the Dirichlet's closed-form moments."""

import jax
import numpy as np
import numpyro  # noqa: F401  (before arviz, via inference)
import scipy.stats

from inference.hlcr.vb import flat_dirichlet


def test_flat_dirichlet_rows_are_uniform_on_the_simplex():
    K, n = 4, 20000
    r = np.asarray(flat_dirichlet(jax.random.key(11), (n, K)))
    assert r.shape == (n, K) and np.all(r >= 0)
    np.testing.assert_allclose(r.sum(1), 1.0, rtol=1e-12)
    # each coordinate of Dir(1,...,1) is Beta(1, K - 1): a KS test per coordinate against SciPy
    for k in range(K):
        assert scipy.stats.kstest(r[:, k], scipy.stats.beta(1, K - 1).cdf).pvalue > 1e-3
    # closed-form moments: E r_k = 1/K, Var r_k = (K - 1)/(K^2 (K + 1)), Cov(r_j, r_k) = -1/(K^2 (K + 1))
    var, cov = (K - 1) / (K**2 * (K + 1)), -1.0 / (K**2 * (K + 1))
    mcse = np.sqrt(var / n)
    assert np.all(np.abs(r.mean(0) - 1 / K) < 4 * mcse)
    C = np.cov(r, rowvar=False)
    # sd of a sample covariance ~ sqrt(E[(x-mu)^2 (y-mu)^2] / n); bounded by var / sqrt(n) * 2 for these
    assert np.all(np.abs(np.diag(C) - var) < 4 * 2 * var / np.sqrt(n))
    off = C[~np.eye(K, dtype=bool)]
    assert np.all(np.abs(off - cov) < 4 * 2 * var / np.sqrt(n))
    # a Dir(2, 1, 1, 1)-like bias (e.g. a forgotten normalisation or an off-by-one shape) moves a mean by 0.05
    assert 0.05 > 10 * mcse
