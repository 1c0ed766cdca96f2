"""Power-scaling sensitivity: strong prior flagged, weak prior passes, prior-data conflict found, the
k-hat ArviZ discards is recovered (and flags unreliable weights), selective scaling of chosen priors."""

from __future__ import annotations

import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import xarray as xr
from diag_toys import LINREG, NORMAL

import diagnostics
import inference
import zoo
from diagnostics.power_scaling import power_scaling_khat, sensitive


def two_prior_model(y, mu_scale=0.5, sigma_scale=10.0):
    """mu ~ N(0, mu_scale^2) (deliberately tight), sigma ~ HalfNormal(sigma_scale) (weak); y ~ N(mu, sigma^2)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, mu_scale))
    sigma = numpyro.sample("sigma", dist.HalfNormal(sigma_scale))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def two_prior_simulate(seed, n=30):
    rng = np.random.default_rng(seed)
    return {"y": rng.normal(4.0, 1.0, n)}, {"mu": 4.0, "sigma": 1.0}  # data far from the prior on mu


TWO = zoo.ModelSpec(name="dq_conflict", model=two_prior_model, simulate=two_prior_simulate,
                    data_fields=(zoo.DataField("y", ("n",)),),
                    hyperparameters={"mu_scale": zoo.Hyper(0.5), "sigma_scale": zoo.Hyper(10.0)})


@pytest.fixture(scope="module", autouse=True)
def toys():
    zoo.register(NORMAL, replace=True)
    zoo.register(TWO, replace=True)
    yield
    zoo.unregister(NORMAL.name)
    zoo.unregister(TWO.name)


@pytest.fixture(scope="module")
def normal_data():
    return {"y": np.random.default_rng(0).normal(0.3, 2.0, 20)}


def test_strong_prior_is_flagged(normal_data):
    # prior sd 0.05 against a likelihood sd 2/sqrt(20) = 0.45: the prior decides mu
    tree = inference.fit("dq_normal", normal_data, "exact", seed=1, tau0=0.05)
    table = diagnostics.sensitivity(tree)
    assert table.loc["mu", "prior"] >= 0.05  # the threshold of Kallioinen et al. (2024), in CJS per log2(alpha)
    assert table.loc["mu", "diagnosis"].startswith("potential strong prior")
    assert "strong prior" in table.loc["mu", "flag"] and sensitive(table)


def test_weak_prior_passes(normal_data):
    tree = inference.fit("dq_normal", normal_data, "exact", seed=1, tau0=10.0)
    table = diagnostics.sensitivity(tree)
    assert table.loc["mu", "prior"] < 0.05 and table.loc["mu", "likelihood"] >= 0.05
    assert table.loc["mu", "diagnosis"] == "✓" and table.loc["mu", "reliable"] and not sensitive(table)


@pytest.fixture(scope="module")
def conflict_tree():
    data, _ = TWO.default_data()
    return inference.fit("dq_conflict", data, "nuts", seed=2, num_warmup=500, num_samples=1000)


def test_prior_data_conflict_is_found_and_traced_to_the_prior_of_mu(conflict_tree):
    full = diagnostics.sensitivity(conflict_tree)
    assert full.loc["mu", "diagnosis"] == "potential prior-data conflict"
    # selective power-scaling: scaling only sigma's weak prior leaves every quantity insensitive ...
    only_sigma = diagnostics.sensitivity(conflict_tree, prior_sites=["sigma"])
    assert (only_sigma["prior"] < 0.05).all() and only_sigma.attrs["prior_sites"] == ["sigma"]
    # ... while scaling only mu's prior reproduces the conflict
    only_mu = diagnostics.sensitivity(conflict_tree, prior_sites=["mu"])
    assert only_mu.loc["mu", "prior"] >= 0.05


def test_bad_site_names_are_rejected(conflict_tree):
    with pytest.raises(ValueError, match="prior_sites"):
        diagnostics.sensitivity(conflict_tree, prior_sites=["tau"])


def test_power_scaling_khat_equals_what_arviz_computes_and_throws_away():
    """Same log weights, tail length and r_eff as arviz_stats' private _power_scale_lw, keeping k-hat."""
    from arviz_stats.base import array_stats

    rng = np.random.default_rng(3)
    for lc in (3 * rng.normal(size=(2, 1000)), 100 * rng.exponential(size=(2, 1000))):
        ks = []
        for alpha in (0.99, 1.01):
            ary = lc.ravel()
            lw = (alpha - 1) * ary
            r_eff = array_stats._ess_tail(ary, prob=0.05, relative=True)
            m = array_stats._get_ps_tails(len(lw), r_eff, tail="both")
            ks.append(array_stats._ps_tail(lw, len(lw), m, smooth_draws=True, log_weights=True)[1])
        assert power_scaling_khat(lc) == pytest.approx(max(ks), abs=1e-12)


def test_heavy_tailed_power_scaling_weights_make_the_check_unreliable(normal_data):
    """A log prior with an exponential tail of scale 100 gives weights exp(0.01 * lp) with a Pareto tail
    of shape k = 0.01 * 100 = 1 > 0.7: the sensitivity values cannot be trusted and are flagged."""
    tree = inference.fit("dq_normal", normal_data, "exact", seed=1, tau0=10.0)
    heavy = 100 * np.random.default_rng(4).exponential(size=tree["log_prior"]["mu"].shape)
    tree["log_prior"] = xr.DataTree(xr.Dataset({"mu": (("chain", "draw"), heavy)},
                                               coords=tree["log_prior"].to_dataset().coords))
    table = diagnostics.sensitivity(tree)
    assert table.attrs["khat_prior"] > 0.7
    assert not table["reliable"].any() and "UNRELIABLE" in table.loc["mu", "flag"] and sensitive(table)


def test_float_coordinates_give_readable_positional_labels(normal_data):
    """ssgp's curve grid has float coordinates; ArviZ labelled its rows g[0.1245105123]. Rows are labelled by
    position, as the scorecard labels the same quantities."""
    data = LINREG.default_data()[0]
    zoo.register(LINREG, replace=True)
    try:
        tree = inference.fit("dq_linreg", data, "exact", seed=1)
        post = tree["posterior"].to_dataset()
        dim = [d for d in post["beta"].dims if d not in ("chain", "draw")][0]
        tree["posterior"] = xr.DataTree(post.assign_coords({dim: [0.1245105123, 0.73]}))
        table = diagnostics.sensitivity(tree)
        assert list(table.index) == ["beta[0]", "beta[1]"]
        # a dim named like ArviZ's own "component" (bpca's summaries) used to make psense_summary fail
        tree["posterior"] = xr.DataTree(post.rename({dim: "component"}))
        assert list(diagnostics.sensitivity(tree).index) == ["beta[0]", "beta[1]"]
        card = diagnostics.scorecard(tree, {"same": tree})
        assert set(card["parameter"]) == set(table.index)
    finally:
        zoo.unregister(LINREG.name)


def test_sensitivity_plot_is_a_png(conflict_tree, tmp_path):
    path = tmp_path / "psense.png"
    diagnostics.plots.plot_sensitivity(conflict_tree, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sensitivity_plot_leaves_out_quantities_whose_draws_are_all_equal(conflict_tree, tmp_path):
    # a GP-ALPS switch the data pin at p_on = 1 has no density: its panel drew nothing but density warnings
    import warnings

    tree = conflict_tree.copy()
    post = tree["posterior"].to_dataset()
    pinned = np.random.default_rng(0).uniform(size=(post.sizes["chain"], post.sizes["draw"], 3))
    pinned[..., 1] = 1.0 - 1e-10 * pinned[..., 0]          # the gp_alps real-data p_on[1]: 1 - O(1e-10)
    other = np.random.default_rng(1).normal(size=pinned.shape)     # shares the dim: alignment must not refill it
    tree["posterior"] = xr.DataTree(post.assign(pinned=(("chain", "draw", "switch"), pinned),
                                                loading=(("chain", "draw", "switch"), other)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pc = diagnostics.plots.plot_sensitivity(tree, tmp_path / "psense.png")
    messages = [str(w.message) for w in caught]
    assert not any("single value" in m or "bins" in m for m in messages), messages
    notes = [t.get_text() for t in pc.viz["figure"].item().texts]
    assert any(n.endswith("(no density to scale): pinned[1]") for n in notes), notes
    pinned_panels = {ax.get_title() for ax in pc.viz["figure"].item().axes if ax.get_title().startswith("pinned")}
    # titled as the scorecard names the quantity (issue 29: ArviZ's "pinned\n0, prior" was a third spelling)
    assert pinned_panels == {f"pinned[{i}], {side} scaled" for i in (0, 2) for side in ("prior", "likelihood")}
    for ax in pc.viz["figure"].item().axes:                        # every panel drawn has a curve
        assert any(len(line.get_xdata()) > 1 for line in ax.get_lines()), ax.get_title()
    assert (tmp_path / "psense.png").is_file()
