"""The tail ESS of the health rule and of every table is Vehtari et al.'s (2021, sec. 4.3): the smaller ESS of
the indicators I(x <= q05) and I(x <= q95), whatever ArviZ's ``rcParams["stats.ci_prob"]`` says (its default,
0.89, would give the 11 %/89 % quantiles)."""

from __future__ import annotations

import numpy as np
import numpyro  # noqa: F401  (before arviz: docs/ecosystem note)
import pytest
import xarray as xr
from arviz_base import rc_context

from diagnostics.health import mcmc_health
from diagnostics.view import scalar_stats


def _skewed_ar1(seed: int, n_chain: int = 4, n_draw: int = 1000) -> np.ndarray:
    """(chain, draw) draws of exp(AR(1)) with phi = 0.9 plus a slowly drifting chain offset: log-normal tails
    and an autocorrelation that differs between the 5 % and the 11 % quantile indicators."""
    rng = np.random.default_rng(seed)
    x = np.empty((n_chain, n_draw))
    x[:, 0] = rng.normal(size=n_chain)
    for t in range(1, n_draw):
        x[:, t] = 0.9 * x[:, t - 1] + np.sqrt(1 - 0.81) * rng.normal(size=n_chain)
    return np.exp(x) + 0.2 * np.sin(np.arange(n_draw) / 150.0)[None, :] * np.arange(n_chain)[:, None]


def _indicator_ess(x: np.ndarray, p: float) -> float:
    """ESS of I(x <= q_p) (q_p the pooled empirical quantile, linear interpolation): ArviZ's bulk ESS of the
    two-valued indicator (rank-normalising a two-valued series is an affine map, which leaves ESS unchanged),
    computed without ArviZ's tail code."""
    import arviz_stats as azs

    ind = (x <= np.quantile(x, p)).astype(float)
    return float(azs.ess(ind, method="bulk", chain_axis=0, draw_axis=1))


@pytest.fixture
def draws():
    return {"a": _skewed_ar1(0), "b": _skewed_ar1(1) ** 2}


def _tree(draws):
    ds = xr.Dataset({k: (("chain", "draw"), v) for k, v in draws.items()})
    return xr.DataTree.from_dict({"posterior": ds}), ds


def test_tail_ess_is_the_smaller_indicator_ess_at_the_5_and_95_percent_quantiles(draws):
    tree, ds = _tree(draws)
    health = mcmc_health(tree, ds)
    stats = scalar_stats(draws)
    expected = {k: min(_indicator_ess(v, 0.05), _indicator_ess(v, 0.95)) for k, v in draws.items()}
    at_89 = {k: min(_indicator_ess(v, 0.11), _indicator_ess(v, 0.89)) for k, v in draws.items()}
    # the guard is sharp: on these draws the 11 %/89 % tail ESS (the old ArviZ default) differs by > 5 %
    assert min(abs(at_89[k] / expected[k] - 1) for k in draws) > 0.05
    for k in draws:
        # 1e-9 relative: the same estimator on the same indicators, only summation order differs
        assert stats.at[k, "ess_tail"] == pytest.approx(expected[k], rel=1e-9), k
    assert health["min_ess_tail"] == pytest.approx(min(expected.values()), rel=1e-9)
    assert health["worst_ess_tail"] == min(expected, key=expected.get)


@pytest.mark.parametrize("ci_prob", [0.5, 0.94])
def test_arviz_ci_prob_setting_changes_no_health_figure_or_table(draws, ci_prob):
    tree, ds = _tree(draws)
    health, stats = mcmc_health(tree, ds), scalar_stats(draws)
    with rc_context({"stats.ci_prob": ci_prob}):
        health_rc, stats_rc = mcmc_health(tree, ds), scalar_stats(draws)
    assert health_rc["min_ess_tail"] == health["min_ess_tail"] and health_rc["failures"] == health["failures"]
    np.testing.assert_array_equal(stats_rc["ess_tail"].to_numpy(), stats["ess_tail"].to_numpy())
