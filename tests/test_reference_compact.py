"""Compact stored references (issue 32 item 4): a reference keeps what the comparison and its health record read
(the posterior sites the compared quantities come from, the health rule's sample stats, the data, the record) and
the model-check points, with draws rounded to 29 significant bits and zlib-compressed; zoo/references/ stays
within 20 MB."""

from __future__ import annotations

import numpy as np
import numpyro  # noqa: F401  (before arviz)
import pytest

import inference
from diagnostics import references
from diagnostics.health import mcmc_health
from diagnostics.view import compared_posterior
from inference._methods import Draws
from inference.trees import build_tree, problem_of

REFERENCE_FILES = sorted(references.REFERENCE_DIR.glob("*.nc"))
STORED_GROUPS = {"posterior", "sample_stats", "observed_data", "constant_data", references.CHECK_GROUP}


def test_round_mantissa_is_the_nearest_float_with_29_significant_bits():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(20_000) * np.exp(rng.normal(0.0, 30.0, 20_000))
    assert references.STORED_MANTISSA_BITS == 28
    got = references.round_mantissa(x)
    # oracle: x = m 2**e with m in [0.5, 1); keep 29 significant bits of m, ties away from zero
    m, e = np.frexp(x)
    scaled = m * 2.0 ** 29
    expected = np.ldexp(np.sign(scaled) * np.floor(np.abs(scaled) + 0.5), e - 29)
    np.testing.assert_array_equal(got, expected)
    assert np.max(np.abs(got / x - 1)) <= 2.0 ** -29
    np.testing.assert_array_equal(references.round_mantissa(got), got)          # idempotent
    special = np.array([np.nan, np.inf, -np.inf, 0.0, np.finfo(float).max])
    np.testing.assert_array_equal(references.round_mantissa(special), special)  # NaN, inf, no overflow to inf
    with pytest.raises(ValueError, match="bits"):
        references.round_mantissa(x, bits=52)


@pytest.fixture(scope="module")
def full_and_compact():
    """A reference as ``generate`` has it before storing (every site, pointwise log likelihood and log prior, the
    sampler's per-draw statistics and the run totals), and its compact form: ppca's stored draws of Wt, mu and tau
    (2 chains x 100 draws, moved by 0.1 % so that every mantissa bit is in use), with nu (the ARD precisions,
    which no compared quantity reads) drawn from a Gamma,
    assembled by ``inference.trees.build_tree`` (which evaluates the log densities), no sampler run."""
    ref = inference.load(references.reference_path("ppca"))
    spec, data, hyper = problem_of(ref)
    post = ref["posterior"].to_dataset().isel(chain=slice(0, 2), draw=slice(0, 100))
    rng = np.random.default_rng(0)
    draws = {k: post[k].values * (1 + 1e-3 * rng.standard_normal(post[k].shape)) for k in post.data_vars}  # all bits
    draws["nu"] = rng.gamma(2.0, 1.0, size=(2, 100) + references.check_points(ref)[0]["nu"].shape[2:])
    stats = {"diverging": np.zeros((2, 100), bool), "energy": rng.normal(size=(2, 100)).cumsum(axis=1)}
    tree = build_tree(spec, data, hyper, Draws(posterior=draws, sample_stats=stats), method="nuts", seed=0,
                      options={}, compile_seconds=0.0, run_seconds=0.0)
    tree = references._thin(tree, references.MAX_DRAWS)
    return tree, references.compact(tree)


def test_compact_keeps_what_the_comparison_reads_and_drops_the_rest(full_and_compact, tmp_path):
    full, small = full_and_compact
    assert set(small.children) <= STORED_GROUPS and references.CHECK_GROUP in small.children
    assert "log_likelihood" in full.children and "log_likelihood" not in small.children
    # nu (the ARD precisions) enters no compared quantity of ppca; Wt, mu and tau do
    assert "nu" in full["posterior"] and sorted(small["posterior"].data_vars) == ["Wt", "mu", "tau"]
    assert sorted(small["sample_stats"].data_vars) == ["divergences_run", "diverging", "ebfmi_run"]
    for k in ("Wt", "mu", "tau"):    # rounded to 29 significant bits, no further
        x, y = full["posterior"][k].values, small["posterior"][k].values
        assert not np.array_equal(x, y) and np.max(np.abs(y / x - 1)) <= 2.0 ** -29
    a, b = compared_posterior(full), compared_posterior(small)
    for k in a.data_vars:
        # 4 * 2**-29 (7.5e-9) of the quantity's largest magnitude: the draws' relative rounding (at most 2**-29)
        # through the summaries' products of two draws (W W^T) with room for their sums, far below a Monte Carlo
        # error (~1e-2 sd) and below a float32 cast (6e-8 per draw)
        np.testing.assert_allclose(b[k].values, a[k].values, rtol=0, atol=4 * 2.0 ** -29 * float(np.abs(a[k]).max()))
    h_full, h_small = mcmc_health(full), mcmc_health(small)
    # the same checks fail (their numbers are compared below; the sentences print them to 3 digits)
    assert [f.split(" ")[:2] for f in h_small["failures"]] == [f.split(" ")[:2] for f in h_full["failures"]]
    assert h_small["divergences"] == h_full["divergences"]
    for key in ("max_rhat", "min_ess_bulk", "min_ess_tail", "min_ebfmi"):
        assert h_small[key] == pytest.approx(h_full[key], rel=1e-6), key   # rank ties cannot move by 2e-9
    # the model-check points: every site (nu too) at the first, middle and last draw of each chain, with the
    # log density the fit computed; the same from the full tree's groups and from the compact group
    draws_f, lj_f = references.check_points(full)
    draws_s, lj_s = references.check_points(small)
    assert list(draws_s["draw"].values) == references.check_draws(100) == [0, 50, 99]
    assert set(draws_s.data_vars) == set(full["posterior"].data_vars)
    np.testing.assert_array_equal(lj_s.values, lj_f.values)
    for k in draws_f.data_vars:
        np.testing.assert_array_equal(draws_s[k].values, draws_f[k].values)  # stored exactly, not rounded
    assert references.check_log_density(small) <= 1e-8
    # stored and read back: the checksum holds, compression is on, and compacting again changes nothing
    path = inference.save(small, tmp_path / "ppca__t.nc")
    back = inference.load(path)
    assert back["posterior"]["Wt"].encoding.get("zlib") or back["posterior"]["Wt"].encoding.get("compression")
    again = references.compact(back)
    for group in small.children:
        for k in small[group].data_vars:
            np.testing.assert_array_equal(again[group][k].values, small[group][k].values)


@pytest.mark.parametrize("path", REFERENCE_FILES, ids=[p.stem for p in REFERENCE_FILES])
def test_every_stored_reference_is_compact(path):
    tree = inference.load(path)
    assert set(tree.children) <= STORED_GROUPS and references.CHECK_GROUP in tree.children, list(tree.children)
    assert tree["posterior"].attrs["stored_mantissa_bits"] == references.STORED_MANTISSA_BITS
    for k, v in tree["posterior"].data_vars.items():
        if v.dtype == np.float64:
            np.testing.assert_array_equal(references.round_mantissa(v.values), v.values, err_msg=k)


def test_stored_references_take_at_most_20_MB():
    total = sum(p.stat().st_size for p in references.REFERENCE_DIR.glob("*.nc"))
    assert total <= 20e6, f"zoo/references holds {total / 1e6:.1f} MB (budget 20 MB, issue 32)"
