"""Every teaching notebook runs in FAST mode through jupytext + nbclient (a real Jupyter kernel), and
its last cell asserts the notebook's headline result, so a statistically broken notebook fails here."""

from __future__ import annotations

import pytest

from notebooks.build import execute, sources

NOTEBOOKS = sources()
PAPER_NOTEBOOKS = {"hlcr", "mppca", "ssgp", "gp_alps", "dmfvi"}
TUTORIALS = {"posterior_quality_101", "prior_sensitivity"}


def test_every_paper_and_tutorial_has_a_notebook():
    assert {p.stem for p in NOTEBOOKS} >= PAPER_NOTEBOOKS | TUTORIALS


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_in_fast_mode(path, tmp_path):
    text = path.read_text()
    first_numpyro, first_arviz = text.find("import numpyro"), text.find("arviz")
    assert first_numpyro >= 0 and (first_arviz < 0 or first_numpyro < first_arviz), \
        "notebooks must import numpyro before arviz (notes/ecosystem.md 1.9)"
    assert "assert" in text.split("# %%")[-1], "the last cell must assert the notebook's headline result"
    execute(path, tmp_path, fast=True, timeout=180)
