"""The compared view: every tree's summaries, draws and statistics are computed once per report and handed to
the scorecard, the method scores, the plots and the sensitivity check; its statistics equal ArviZ's; the hlcr
summaries reuse their compiled function."""

from __future__ import annotations

import collections
import dataclasses
import json

import numpy as np
import pytest
import xarray as xr
from diag_toys import LINREG

import diagnostics
import inference
import zoo
from diagnostics.view import compared_view


def _sorted_beta(post, data, hyper):
    s = np.sort(post["beta"].transpose("chain", "draw", ...).values, axis=-1)
    return xr.Dataset({"beta_low": (("chain", "draw"), s[..., 0]), "beta_high": (("chain", "draw"), s[..., 1])})


@pytest.fixture()
def counted():
    """dq_linreg with label-free summaries that count their calls by tree shape (chain, draw)."""
    calls = collections.Counter()

    def summaries(post, data, hyper):
        calls[(post.sizes["chain"], post.sizes["draw"])] += 1
        return _sorted_beta(post, data, hyper)

    zoo.register(dataclasses.replace(LINREG, summaries=summaries), replace=True)
    yield calls
    zoo.unregister(LINREG.name)


def test_a_report_computes_each_trees_summaries_once(counted, tmp_path):
    """Before the view, a report computed the summaries of the reference 6 times and of each candidate 4-5
    times (scorecard, method scores, joint metrics, sampler R-hat, two plots, sensitivity and its plot)."""
    data = LINREG.default_data()[0]
    trees = {"reference": inference.fit("dq_linreg", data, "exact", seed=1, num_samples=1000, num_chains=4),
             "exact": inference.fit("dq_linreg", data, "exact", seed=2, num_samples=500, num_chains=3),
             "meanfield": inference.fit("dq_linreg", data, "meanfield", seed=3, num_samples=700)}
    counted.clear()
    page = diagnostics.report("dq_linreg", trees, tmp_path / "r")
    assert dict(counted) == {(4, 1000): 1, (3, 500): 1, (1, 700): 1}
    assert "beta_low" in page.read_text()  # the summaries are what was compared


def test_view_statistics_equal_arviz_on_the_compared_quantities(counted):
    import arviz_stats as azs

    data = LINREG.default_data()[0]
    tree = inference.fit("dq_linreg", data, "ar1", seed=4, num_samples=800, phi=0.7)
    view = compared_view(tree)
    assert view.labels == ["beta_low", "beta_high"] and view.kind == "sampler"
    sub = xr.DataTree.from_dict({"posterior": view.ds})
    for col, ours in (("ess_bulk", azs.ess(sub, method="bulk")),
                      ("ess_tail", azs.ess(sub, method="tail", prob=(0.05, 0.95))),
                      ("rhat", azs.rhat(sub)), ("mcse_mean", azs.mcse(sub)), ("mcse_sd", azs.mcse(sub, method="sd"))):
        for label in view.labels:
            assert view.stats.at[label, col] == pytest.approx(float(ours[label]), rel=1e-10), (col, label)
    assert json.dumps(view.health, sort_keys=True) == json.dumps(diagnostics.health.mcmc_health(tree, view.ds),
                                                                 sort_keys=True)  # NaN E-BFMI: compare as text


def test_hlcr_summaries_reuse_their_compiled_function():
    """Same data and draw count: the second call compiles nothing (the jitted function is module-level; it
    used to be built inside ``summaries`` and re-traced at every call)."""
    from zoo import hlcr

    spec = zoo.get("hlcr")
    data, _ = spec.simulate(0, n_agents=4, mean_entities=2.0, mean_events=4.0, K=2, F=2)
    hyper = {**spec.default_hyper, "K": 2}
    n_agents = len(np.unique(data["agent"]))
    rng = np.random.default_rng(0)

    def posterior():
        return xr.Dataset({"w": (("chain", "draw", "cluster", "feature"), rng.normal(size=(2, 30, 2, 2))),
                           "psi": (("chain", "draw", "cluster"), rng.dirichlet([1, 1], size=(2, 30))),
                           "theta": (("chain", "draw", "agent", "cluster"),
                                     rng.dirichlet([1, 1], size=(2, 30, n_agents)))})

    first = hlcr.summaries(posterior(), data, hyper)
    size = hlcr._summaries_batched._cache_size()
    second = hlcr.summaries(posterior(), data, hyper)
    assert hlcr._summaries_batched._cache_size() == size
    assert not np.allclose(first["log_lik"].values, second["log_lik"].values)  # new draws, same compiled code
