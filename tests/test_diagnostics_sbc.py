"""SBC and VSBC on conjugate toys (tests/diag_toys.py): biased samplers and shifted approximations are
flagged, exact ones pass, a blind spot of SBC is documented, runs resume, and the ranks feed ArviZ."""

from __future__ import annotations

import numpy as np
import pytest
from diag_toys import BETA, LINREG, NORMAL

import diagnostics
import diagnostics.calibration as sbc_module
import zoo


@pytest.fixture(scope="module", autouse=True)
def toys():
    for spec in (NORMAL, LINREG, BETA):
        zoo.register(spec, replace=True)
    yield
    for spec in (NORMAL, LINREG, BETA):
        zoo.unregister(spec.name)


# Settings of the conjugate normal where the prior matters: prior precision 1/0.25^2 = 16 against a
# likelihood precision n / sigma^2 = 4 / 4 = 1. A prior counted twice then gives a posterior sd
# sqrt(17/33) = 0.72 of the right one. Over seeds 0-2 with 300 simulations the pot_c p-value of that
# sampler was 1e-9, 6e-6 and 1e-9; of the exact sampler 0.28, 0.36 and 0.09 (alpha = 0.01).
STRONG = {"tau0": 0.25, "num_samples": 100, "num_chains": 1}


def test_sbc_flags_a_sampler_that_counts_the_prior_twice(tmp_path):
    res = diagnostics.sbc("dq_normal", "doubleprior", n_sims=300, seed=0, directory=tmp_path, **STRONG)
    assert not res.passed
    row = res.table.iloc[0]
    assert row["p_value"] < 0.01 and "too narrow" in row["reading"]
    assert row["pit_sd"] > 1 / np.sqrt(12)  # ranks pile up at both ends


def test_sbc_passes_the_exact_sampler(tmp_path):
    res = diagnostics.sbc("dq_normal", "exact", n_sims=300, seed=0, directory=tmp_path, **STRONG)
    assert res.passed, res.table
    # the prior_sbc group holds PIT values in (0, 1), one per simulation
    u = res.tree["prior_sbc"]["mu"].values
    assert u.shape == (1, 300) and (u > 0).all() and (u < 1).all()


def test_sbc_cannot_see_a_dropped_prior_when_the_likelihood_alone_is_a_pivot(tmp_path):
    """The issue's example bias is invisible here: without its prior the sampler draws N(ybar, sigma^2/n),
    a confidence distribution whose PIT is exactly uniform given mu, hence also over the prior. SBC tests
    calibration averaged over the prior, not the posterior itself (the scorecard against NUTS sees it)."""
    res = diagnostics.sbc("dq_normal", "noprior", n_sims=300, seed=0, directory=tmp_path, **STRONG)
    assert res.passed


def test_sbc_flags_an_overconfident_approximation_on_both_coefficients(tmp_path):
    res = diagnostics.sbc("dq_linreg", "meanfield", n_sims=100, seed=0, directory=tmp_path, num_samples=200)
    assert not res.passed and res.table["flagged"].all()
    assert set(res.table["parameter"]) == {"beta[0]", "beta[1]"}


@pytest.mark.slow
def test_sbc_passes_nuts_on_the_conjugate_normal(tmp_path):
    # 100 NUTS fits (~1 s each, compilation dominated); automatic thinning to about the bulk ESS
    res = diagnostics.sbc("dq_normal", "nuts", n_sims=100, seed=1, directory=tmp_path, tau0=0.25,
                          num_warmup=300, num_samples=300, num_chains=1)
    assert res.passed, res.table
    assert res.table.iloc[0]["p_value"] > 0.01


def test_vsbc_flags_a_shifted_approximation(tmp_path):
    res = diagnostics.vsbc("dq_normal", "shifted", n_sims=200, seed=0, directory=tmp_path, shift=0.5,
                           num_samples=200)
    assert not res.passed
    row = res.table.iloc[0]
    # q sits 0.5 sd above the posterior, so the truth is mostly below q's draws: p_j < 1/2 on average
    assert row["pit_mean"] < 0.45 and "biased high" in row["reading"]


@pytest.mark.parametrize("method,opts", [("exact_q", {}), ("narrow", {"factor": 0.5})])
def test_vsbc_passes_centred_approximations_even_too_narrow_ones(method, opts, tmp_path):
    # VSBC tests the point estimate only (Yao et al. 2018, sec. 3): a centred, too narrow q is symmetric
    res = diagnostics.vsbc("dq_normal", method, n_sims=200, seed=0, directory=tmp_path, num_samples=200, **opts)
    assert res.passed, res.table


def test_runs_resume_each_simulation_is_a_file_and_reruns_skip_finished_ones(tmp_path, monkeypatch):
    args = dict(seed=3, directory=tmp_path, num_samples=50, num_chains=1)
    first = diagnostics.sbc("dq_normal", "exact", n_sims=6, **args)
    files = sorted(p.name for p in tmp_path.glob("sim_*.npz"))
    assert files == [f"sim_{j:05d}.npz" for j in range(6)]
    assert not list(tmp_path.glob(".*tmp"))  # atomic writes leave no temporary files

    calls = []
    real = sbc_module._one_simulation
    monkeypatch.setattr(sbc_module, "_one_simulation", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    again = diagnostics.sbc("dq_normal", "exact", n_sims=6, **args)
    assert calls == []  # nothing refitted
    np.testing.assert_array_equal(first.tree["sbc_ranks"]["mu_less"].values, again.tree["sbc_ranks"]["mu_less"].values)
    more = diagnostics.sbc("dq_normal", "exact", n_sims=9, **args)
    assert calls == [6, 7, 8] and more.table.iloc[0]["n_sims"] == 9

    # an interrupted simulation leaves no file and is simply redone
    (tmp_path / "sim_00008.npz").unlink()
    diagnostics.sbc("dq_normal", "exact", n_sims=9, **args)
    assert calls[-1] == 8

    with pytest.raises(ValueError, match="other arguments"):
        diagnostics.sbc("dq_normal", "exact", n_sims=9, seed=4, directory=tmp_path, num_samples=50, num_chains=1)


def test_model_simulator_draws_parameters_from_the_prior_with_the_fit_hyperparameters(tmp_path):
    res = diagnostics.sbc("dq_normal", "exact", n_sims=300, seed=5, directory=tmp_path, tau0=0.25, mu0=3.0,
                          num_samples=20, num_chains=1)
    truth = res.tree["sbc_ranks"]["mu_truth"].values.ravel()
    # mu ~ N(3, 0.25^2): the sample mean is within 4 standard errors (0.25/sqrt(300) = 0.014) of 3
    assert abs(truth.mean() - 3.0) < 4 * 0.25 / np.sqrt(300)
    assert abs(truth.std() - 0.25) < 0.05


def test_spec_simulator_is_used_when_asked(tmp_path):
    res = diagnostics.sbc("dq_beta", "exact", n_sims=50, seed=0, directory=tmp_path, simulator="spec",
                          num_samples=50, num_chains=1)
    with np.load(tmp_path / "sim_00000.npz") as f:
        assert str(f["__simulator__"]) == "spec"
    assert res.passed


def test_sbc_ranks_plot_with_arviz_ecdf_pit(tmp_path):
    res = diagnostics.sbc("dq_linreg", "exact", n_sims=40, seed=0, directory=tmp_path / "sims", num_samples=50,
                          num_chains=1)
    path = tmp_path / "sbc.png"
    res.plot(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "SBC dq_linreg/exact: passed" in res.summary()


@pytest.mark.parametrize("kwargs,needle", [
    ({"n_sims": 1}, "n_sims"),
    ({"n_sims": 5, "seed": -1}, "seed"),
    ({"n_sims": 5, "simulator": "magic"}, "simulator"),
    ({"n_sims": 5, "thin": 0}, "thin"),
    ({"n_sims": 5, "num_samples": -3}, "num_samples"),
    ({"n_sims": 5, "tau0": -1.0}, "tau0"),
])
def test_bad_arguments_raise_value_errors_naming_them(kwargs, needle, tmp_path):
    kwargs = {"seed": 0, **kwargs}
    with pytest.raises(ValueError, match=needle):
        diagnostics.sbc("dq_normal", "exact", directory=tmp_path, **kwargs)


def test_unknown_method_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="supports methods"):
        diagnostics.sbc("dq_normal", "gibbs", n_sims=5, seed=0, directory=tmp_path)
