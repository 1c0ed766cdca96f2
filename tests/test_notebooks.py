"""Every teaching notebook runs in FAST mode through jupytext + nbclient (a real Jupyter kernel), and
its last cell asserts the notebook's headline result, so a statistically broken notebook fails here."""

from __future__ import annotations

import pytest

import zoo
from notebooks.build import execute, sources

NOTEBOOKS = sources()
TUTORIALS = {"posterior_quality_101", "prior_sensitivity"}
# The paper notebook that teaches each registered model (issue 10: one notebook per paper).
NOTEBOOK_OF_MODEL = {"hlcr": "hlcr", "mppca": "mppca", "ppca": "mppca", "ssgp_lmm": "ssgp", "ssgp_logit": "ssgp",
                     "ssgp_probit": "ssgp", "gp_alps": "gp_alps", "bpca": "dmfvi"}


def test_tutorials_exist():
    assert {p.stem for p in NOTEBOOKS} >= TUTORIALS


def test_every_registered_model_has_its_paper_notebook():
    have = {p.stem for p in NOTEBOOKS}
    # Only the zoo's own models (tests register toy models of their own).
    models = [m for m in zoo.list_models() if zoo.get(m).model.__module__.startswith("zoo.")]
    unmapped = [m for m in models if m not in NOTEBOOK_OF_MODEL]
    assert not unmapped, f"models with no paper notebook assigned in NOTEBOOK_OF_MODEL: {unmapped}"
    missing = {m: NOTEBOOK_OF_MODEL[m] for m in models if NOTEBOOK_OF_MODEL[m] not in have}
    assert not missing, f"registered models whose notebook does not exist (notebooks/<name>.py): {missing}"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_in_fast_mode(path, tmp_path):
    text = path.read_text()
    first_numpyro, first_arviz = text.find("import numpyro"), text.find("arviz")
    assert first_numpyro >= 0 and (first_arviz < 0 or first_numpyro < first_arviz), \
        "notebooks must import numpyro before arviz (notes/ecosystem.md 1.9)"
    assert "assert" in text.split("# %%")[-1], "the last cell must assert the notebook's headline result"
    execute(path, tmp_path, fast=True, timeout=180)
