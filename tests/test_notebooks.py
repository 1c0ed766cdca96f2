"""Every teaching notebook runs in FAST mode through jupytext + nbclient (a real Jupyter kernel), and
its last cell asserts the notebook's headline result, so a statistically broken notebook fails here."""

from __future__ import annotations

import os

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



def test_the_kernel_gets_fast_mode_and_this_process_environment_is_left_alone(tmp_path):
    """``execute`` hands FAST=1 and the inline backend to the kernel's own environment; it used to set and restore
    them in os.environ around the kernel start, which changes this process for the run's length."""
    before = dict(os.environ)
    path = tmp_path / "probe.py"
    path.write_text("# %%\nimport os\nassert os.environ['FAST'] == '1', os.environ.get('FAST')\n"
                    "assert 'inline' in os.environ['MPLBACKEND']\nopen('ran', 'w').write(str(os.getpid()))\n")
    target, seconds = execute(path, tmp_path / "out", fast=True, timeout=60)
    assert dict(os.environ) == before
    assert target == tmp_path / "out" / "probe.ipynb" and target.exists() and seconds > 0
    assert (tmp_path / "out" / "ran").read_text() != str(os.getpid())
