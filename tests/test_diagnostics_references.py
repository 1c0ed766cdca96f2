"""Stored reference posteriors: every file in zoo/references/ still matches its model's log density
(a model changed without regenerating its reference fails here), carries its validation record, and the
store/load/identity machinery works on a toy model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from diag_toys import NORMAL

import inference
import zoo
from diagnostics import references

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
    assert {"max_rhat", "min_ess_bulk", "divergences", "reliable"} <= set(record)
    assert tree["posterior"].sizes["chain"] * tree["posterior"].sizes["draw"] <= references.MAX_DRAWS
    assert path.name == f"{tree.attrs['model']}__{tree.attrs['reference_tag']}.nc"


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
        i = np.flatnonzero(np.isfinite(moved) & (moved != 0))[0]
        moved.flat[i] *= 1 + 1e-9
        other[k] = moved
        assert references.load(name, other, tag=tag) is None
