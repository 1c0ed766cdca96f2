"""Stored reference posteriors: every file in zoo/references/ still matches its model's log density
(a model changed without regenerating its reference fails here), passes the reference standard (health
recomputed from its stored draws equals its record; 4 chains, 4000 draws; second seed and Gibbs cross-check
within 4 MCSE), and the store/load/identity/refusal/resume machinery works on a toy model. Slow: every
reference's second seed rerun agrees with it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from diag_toys import NORMAL
from typer.testing import CliRunner

import inference
import zoo
from diagnostics import references
from diagnostics.health import Z_MAX, mcmc_health
from zoo_cli import app

REFERENCE_FILES = sorted(references.REFERENCE_DIR.glob("*.nc"))


@pytest.mark.parametrize("path", REFERENCE_FILES, ids=[p.stem for p in REFERENCE_FILES])
def test_stored_reference_matches_the_current_model_log_density(path: Path):
    tree = inference.load(path)
    # relative difference of log p(theta, y) at 3 stored draws; 1e-8 allows float64 re-association only
    assert references.check_log_density(tree, n_points=3) <= 1e-8


@pytest.mark.parametrize("path", REFERENCE_FILES, ids=[p.stem for p in REFERENCE_FILES])
def test_stored_reference_carries_its_validation_record(path: Path):
    tree = inference.load(path)
    for key in ("model", "seed", "package_versions", "validation", "reference_tag"):
        assert key in tree.attrs, key
    assert references.data_of(tree), "a stored reference carries the exact data arrays it was computed on"
    record = json.loads(tree.attrs["validation"])
    assert {"max_rhat", "min_ess_bulk", "divergences", "reliable", "settings", "seeds", "package_versions",
            "second_seed", "crosscheck", "nuts_reformulation", "standard"} <= set(record)
    assert {"means", "mcse", "max_abs_z", "health"} <= set(record["second_seed"])
    # thinned to its stored draws: MAX_DRAWS unless its settings raise it (a longer reference, stored_draws)
    assert tree["posterior"].sizes["chain"] * tree["posterior"].sizes["draw"] <= references.stored_draws(
        record["settings"])
    assert path.name == f"{tree.attrs['model']}__{tree.attrs['reference_tag']}.nc"


@pytest.mark.parametrize("path", REFERENCE_FILES, ids=[p.stem for p in REFERENCE_FILES])
def test_stored_reference_passes_the_standard_recomputed_from_its_draws(path: Path):
    """posteriordb's standard, stricter: >= 4 chains and 4000 stored draws, R-hat < 1.01 and bulk/tail ESS >= 400
    on every compared quantity, 0 divergences over the whole run, E-BFMI > 0.3 (recomputed here from the stored
    draws and run totals, and equal to the record within 1 %: rank ties); the second seed's and the Gibbs
    cross-check's means within 4 combined MCSE (from the record)."""
    tree = inference.load(path)
    assert references.verify(tree) == []
    record = json.loads(tree.attrs["validation"])
    assert record["n_chains"] >= 4 and record["n_draws"] >= 4000 and record["divergences"] == 0
    assert record["max_rhat"] < 1.01 and min(record["min_ess_bulk"], record["min_ess_tail"]) >= 400
    assert record["min_ebfmi"] > 0.3
    assert record["second_seed"]["max_abs_z"] < Z_MAX and record["second_seed"]["health"]["reliable"]
    if zoo.get(tree.attrs["model"]).settings.reference_crosscheck is not None:
        assert record["crosscheck"]["max_abs_z"] < Z_MAX and record["crosscheck"]["health"]["reliable"]


@pytest.mark.slow
@pytest.mark.parametrize("path", REFERENCE_FILES, ids=[p.stem for p in REFERENCE_FILES])
def test_second_seed_rerun_agrees_with_the_stored_reference(path: Path):
    """The recorded second run, redone here (same settings, seed + 1, the stored data): healthy, and its compared
    means within 4 combined Monte Carlo standard errors of the stored reference's."""
    check = references.rerun_second_seed(inference.load(path), progress=False)
    assert check["health"]["reliable"], check["health"]["failures"]
    assert check["max_abs_z"] < Z_MAX, check["failures"]


@pytest.fixture
def toy():
    zoo.register(NORMAL, replace=True)
    yield NORMAL
    zoo.register(NORMAL, replace=True)
    zoo.unregister(NORMAL.name)


def test_generate_store_load_and_detect_a_changed_model(toy, tmp_path, monkeypatch):
    monkeypatch.setattr(references, "REFERENCE_DIR", tmp_path)
    data, _ = toy.default_data()
    tree = references.generate("dq_normal", data, seed=3, num_warmup=300, num_samples=1000, num_chains=4)
    path = tmp_path / "dq_normal__default.nc"
    assert path.is_file()
    record = json.loads(tree.attrs["validation"])
    assert record["reliable"] and record["min_ess_tail"] > 0
    assert record["seeds"] == {"reference": 3, "second_seed": 4} and record["second_seed"]["max_abs_z"] < Z_MAX
    assert references.verify(inference.load(path)) == []
    assert not references.work_dir("dq_normal", "default").exists()   # checkpoints removed once stored
    assert tree["posterior"].sizes["draw"] * tree["posterior"].sizes["chain"] <= references.MAX_DRAWS  # thinned
    assert references.check_log_density(inference.load(path)) <= 1e-8

    # the stored arrays tie a reference to its data: other data -> None, the same data -> the stored tree
    assert references.load("dq_normal", {"y": data["y"] + 1.0}) is None
    loaded = references.load("dq_normal", data)
    np.testing.assert_array_equal(loaded["posterior"]["mu"].values, tree["posterior"]["mu"].values)
    stored, tag = references.reference_data("dq_normal")
    assert tag == "default"
    np.testing.assert_array_equal(stored["y"], data["y"])  # bit-exact: the arrays travel in the file

    # the model changes (a wider prior) without regenerating: the identity test fails
    def changed(y, mu0=0.0, tau0=1.0, sigma=2.0):
        mu = numpyro.sample("mu", dist.Normal(mu0, 2 * tau0))
        with numpyro.plate("obs", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, sigma), obs=y)

    zoo.register(dataclasses.replace(toy, model=changed), replace=True)
    with pytest.raises(AssertionError, match="regenerate"):
        references.check_log_density(inference.load(path))


def test_a_longer_reference_keeps_its_stored_draws_and_is_current_only_with_them(toy, tmp_path, monkeypatch):
    """``stored_draws`` raises what a reference keeps: 4 x 3000 draws thinned evenly to 8000 (not to MAX_DRAWS),
    recorded in its settings, so that the same options find it current and the default ones do not; a count that
    is not a positive integer is refused before anything runs."""
    monkeypatch.setattr(references, "REFERENCE_DIR", tmp_path)
    data, _ = toy.default_data()
    opts = {"num_warmup": 300, "num_samples": 3000, "num_chains": 4, "stored_draws": 8000}
    tree = references.generate("dq_normal", data, seed=3, **opts)
    assert (tree["posterior"].sizes["chain"], tree["posterior"].sizes["draw"]) == (4, 2000)
    stored = inference.load(tmp_path / "dq_normal__default.nc")
    assert json.loads(stored.attrs["validation"])["settings"]["stored_draws"] == 8000
    assert references.verify(stored) == []
    assert references.is_current("dq_normal", "default", data, opts) is None
    assert references.is_current("dq_normal", "default", data, {**opts, "stored_draws": 4000}) == \
        "its settings changed"
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="stored_draws"):
            references.generate("dq_normal", data, seed=3, **{**opts, "stored_draws": bad})
    assert not references.work_dir("dq_normal", "default").exists()   # refused before any run


def _last_bits(a: np.ndarray, ulps: int, rng: np.random.Generator) -> np.ndarray:
    """``a`` with every entry moved by up to ``ulps`` units in the last place (what another CPU's BLAS/LAPACK
    or libm gives a re-simulation)."""
    out = np.array(a, dtype=float)
    for _ in range(ulps):
        step = rng.integers(-1, 2, size=out.shape)
        out = np.where(step > 0, np.nextafter(out, np.inf), np.where(step < 0, np.nextafter(out, -np.inf), out))
    return out


@pytest.mark.parametrize("name", sorted({p.stem.split("__")[0] for p in REFERENCE_FILES}))
def test_a_resimulation_with_other_last_bits_still_finds_its_stored_reference(name):
    """Every stored reference is found from data whose floats differ in their last bits (up to 8 ulps, ~1e-15
    relative), and not from data that differ for real (one value moved by 1e-9 relative)."""
    rng = np.random.default_rng(0)
    spec = zoo.get(name)
    for tag in references.stored_tags(name):
        data, _ = references.reference_data(name, tag)
        floats = [f.name for f in spec.data_fields if f.name in data and f.kind == "float"]
        assert floats, name
        noisy = {k: (_last_bits(v, 8, rng) if k in floats else v) for k, v in data.items()}
        assert any(not np.array_equal(noisy[k], data[k], equal_nan=True) for k in floats)
        found = references.load(name, noisy)
        assert found is not None and found.attrs["reference_tag"] == tag
        other = dict(noisy)
        k = floats[0]
        moved = np.array(other[k], dtype=float)
        original = np.asarray(data[k], dtype=float)   # not an exact 0 of the data (real days 0..9): its last-bit
        i = np.flatnonzero(np.isfinite(original) & (original != 0))[0]   # neighbour is a denormal 1e-9 cannot move
        moved.flat[i] *= 1 + 1e-9
        other[k] = moved
        assert references.load(name, other, tag=tag) is None


def test_generate_refuses_an_unhealthy_reference_and_resumes_from_its_checkpoints(toy, tmp_path, monkeypatch):
    """2 chains x 300 draws: refused (nothing stored), the failure names the rule and what to try; asked again,
    the finished runs are reused from the work directory, not rerun."""
    monkeypatch.setattr(references, "REFERENCE_DIR", tmp_path)
    data, _ = toy.default_data()
    with pytest.raises(references.UnhealthyReference) as refused:
        references.generate("dq_normal", data, seed=3, num_warmup=200, num_samples=300, num_chains=2)
    text = str(refused.value)
    assert "2 chains (need at least 4)" in text and "600 stored draws (need at least 4000)" in text
    assert "try:" in text and "num_chains" in text
    assert not (tmp_path / "dq_normal__default.nc").exists()
    work = references.work_dir("dq_normal", "default")
    assert (work / "main.nc").is_file() and (work / "second_seed.nc").is_file()
    lines = []
    with pytest.raises(references.UnhealthyReference):
        references.generate("dq_normal", data, seed=3, num_warmup=200, num_samples=300, num_chains=2,
                            log=lines.append)
    assert sum("reusing the finished run" in line for line in lines) == 2
    # other settings: the checkpoints do not match and are not reused
    lines.clear()
    with pytest.raises(references.UnhealthyReference):
        references.generate("dq_normal", data, seed=3, num_warmup=200, num_samples=301, num_chains=2,
                            log=lines.append)
    assert not any("reusing" in line for line in lines)


def test_thinning_keeps_every_divergence_of_the_run(toy):
    """A divergence in a thinned-out iteration still fails the health rule (run totals travel with the draws)."""
    data, _ = toy.default_data()
    tree = inference.fit("dq_normal", data, "nuts", seed=0, num_warmup=200, num_samples=2000, num_chains=4,
                         progress=False)
    tree["sample_stats"]["diverging"][0, 0] = 1          # iteration 0 is not among the kept draws
    thin = references._thin(tree, references.MAX_DRAWS)
    assert thin["posterior"].sizes["draw"] == 1000 and int(thin["sample_stats"]["diverging"].sum()) == 0
    assert mcmc_health(thin)["divergences"] == 1


def test_zoo_references_check_verifies_the_stored_records():
    result = CliRunner().invoke(app, ["references", "--check", "ppca"])
    assert result.exit_code == 0, result.output
    assert "ppca/default: ok" in result.output


def test_verify_flags_a_record_that_does_not_belong_to_its_draws_and_tolerates_rank_tie_noise():
    # the record must describe its draws: 5 % off on ESS is another run; 0.1 % is the rank-tie noise of
    # recomputing the compared quantities on another CPU (3e-4 measured)
    path = min(REFERENCE_FILES, key=lambda p: p.stat().st_size)
    tree = inference.load(path)
    assert references.verify(tree) == []
    record = json.loads(tree.attrs["validation"])
    for factor, flagged in ((1.05, True), (1 / 1.05, True), (1.001, False)):
        tree.attrs["validation"] = json.dumps({**record, "min_ess_bulk": record["min_ess_bulk"] * factor})
        problems = references.verify(tree)
        assert any(p.startswith("min_ess_bulk: recomputed") for p in problems) == flagged, (factor, problems)
    tree.attrs["validation"] = json.dumps({**record, "max_rhat": record["max_rhat"] + 0.02})
    assert any(p.startswith("max_rhat: recomputed") for p in references.verify(tree))
