"""The recipe of docs/guide/adding_a_model.md followed for real: a new kernel (``tests/toy_kernel.py``) and
this test are the only two files it takes; the registry finds the method, ``fit`` runs it through the shared
loop, and the contract test's checks apply unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import toy_kernel
from numpyro.infer.util import log_density
from scipy.optimize import brentq
from test_contract import check_contract

import inference
import zoo


@pytest.fixture(autouse=True, scope="module")
def registered():
    zoo.register(toy_kernel.SPEC, replace=True)
    yield
    zoo.unregister(toy_kernel.SPEC.name)


H = {"m0": 0.0, "k0": 1.0, "a0": 2.0, "b0": 2.0}


def fixed_point(y):
    """The CAVI fixed point solved directly (Bishop §10.1.3): with m = exact posterior mean, s = (k0 + n) a / b
    and a = a0 + (n + 1)/2, b solves b = b0 + (S + n/s + k0 ((m - m0)^2 + 1/s)) / 2; found with brentq."""
    n, k0, m0, a0, b0 = len(y), H["k0"], H["m0"], H["a0"], H["b0"]
    m = (k0 * m0 + y.sum()) / (k0 + n)
    a = a0 + 0.5 * (n + 1)
    S = np.sum((y - m) ** 2)

    def gap(b):
        s = (k0 + n) * a / b
        return b - b0 - 0.5 * (S + n / s + k0 * ((m - m0) ** 2 + 1 / s))

    b = brentq(gap, 1e-6, 1e6, xtol=1e-14)
    return m, (k0 + n) * a / b, a, b


def test_cavi_reaches_the_closed_form_fixed_point_and_its_mean_is_the_exact_posterior_mean():
    data, _ = toy_kernel.SPEC.default_data()
    tree = inference.fit("toy_normal_gamma", data, "cavi", seed=0, num_samples=20000)
    m, s, a, b = fixed_point(data["y"])
    post = tree["posterior"]
    mcse_mu = 1 / np.sqrt(s) / np.sqrt(20000)
    assert abs(float(post["mu"].mean()) - m) < 4 * mcse_mu
    lam_sd = np.sqrt(a) / b
    assert abs(float(post["lam"].mean()) - a / b) < 4 * lam_sd / np.sqrt(20000)
    # the exact Normal-Gamma posterior mean of mu (conjugate update) equals the mean-field one
    n, ybar = len(data["y"]), data["y"].mean()
    assert m == pytest.approx((H["k0"] * H["m0"] + n * ybar) / (H["k0"] + n))
    assert tree.attrs["converged"] == 1 and tree.attrs["n_iter"] < 100
    trace = tree["sample_stats"]["elbo"].values
    assert np.all(np.diff(trace) >= -1e-10 * np.abs(trace[1:])), "CAVI's ELBO must not decrease"


def test_the_reported_objective_is_the_elbo_by_monte_carlo():
    """ELBO = E_q[log p(y, mu, lam) - log q(mu, lam)], estimated from the kernel's own draws and log_q with
    NumPyro's log_density as the joint; agreement within 4 Monte Carlo standard errors."""
    data, _ = toy_kernel.SPEC.default_data()
    tree = inference.fit("toy_normal_gamma", data, "cavi", seed=1, num_samples=4000)
    post = tree["posterior"]
    log_q = tree["sample_stats"]["log_q"].values.ravel()
    joint = np.array([float(log_density(toy_kernel.model, (), {"y": data["y"], **H},
                                        {"mu": mu, "lam": lam})[0])
                      for mu, lam in zip(post["mu"].values.ravel(), post["lam"].values.ravel(), strict=True)])
    est = joint - log_q
    assert abs(est.mean() - tree.attrs["objective"]) < 4 * est.std() / np.sqrt(est.size)


def test_the_toy_pair_keeps_the_contract():
    check_contract("toy_normal_gamma", "cavi")
