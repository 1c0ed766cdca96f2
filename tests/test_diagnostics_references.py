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
    for key in ("model", "seed", "package_versions", "data_checksum", "validation", "reference_tag"):
        assert key in tree.attrs, key
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
    tree = references.generate("dq_normal", data, seed=3, num_warmup=300, num_samples=1500)
    path = tmp_path / "dq_normal__default.nc"
    assert path.is_file()
    record = json.loads(tree.attrs["validation"])
    assert record["reliable"] and record["min_ess_tail"] > 0
    assert tree["posterior"].sizes["draw"] * tree["posterior"].sizes["chain"] <= references.MAX_DRAWS  # thinned
    assert references.check_log_density(inference.load(path)) <= 1e-8

    # the checksum ties a reference to its data: other data -> None, the same data -> the stored tree
    assert references.load("dq_normal", {"y": data["y"] + 1.0}) is None
    loaded = references.load("dq_normal", data)
    np.testing.assert_array_equal(loaded["posterior"]["mu"].values, tree["posterior"]["mu"].values)

    # the model changes (a wider prior) without regenerating: the identity test fails
    def changed(y, mu0=0.0, tau0=1.0, sigma=2.0):
        mu = numpyro.sample("mu", dist.Normal(mu0, 2 * tau0))
        with numpyro.plate("obs", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, sigma), obs=y)

    zoo.register(dataclasses.replace(toy, model=changed), replace=True)
    with pytest.raises(AssertionError, match="regenerate"):
        references.check_log_density(inference.load(path))
