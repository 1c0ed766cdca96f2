"""Every teaching notebook runs in FAST mode through jupytext + nbclient (a real Jupyter kernel), and
its last cell asserts the notebook's headline result, so a statistically broken notebook fails here. The notebooks
start in background kernels as soon as the tests are collected (``tests/conftest.py``, ``run_notebook``)."""

from __future__ import annotations

import os

import pytest

import zoo
from notebooks.build import sources

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
def test_notebook_executes_in_fast_mode(path, run_notebook):
    text = path.read_text()
    first_numpyro, first_arviz = text.find("import numpyro"), text.find("arviz")
    assert first_numpyro >= 0 and (first_arviz < 0 or first_numpyro < first_arviz), \
        "notebooks must import numpyro before arviz (notes/ecosystem.md 1.9)"
    assert "assert" in text.split("# %%")[-1], "the last cell must assert the notebook's headline result"
    run_notebook(path)


def test_background_runs_give_each_kernel_fast_mode_and_leave_this_process_environment_alone(tmp_path):
    """``execute_in_background`` (how the suite runs the notebooks beside its other tests): two notebooks at once,
    each kernel sees FAST=1 and the inline backend, and this process's environment is not touched (the old
    ``execute`` set and restored os.environ around the kernel start, a race once runs overlap)."""
    from notebooks.build import execute_in_background

    before = dict(os.environ)
    paths = []
    for name in ("first", "second"):
        path = tmp_path / f"{name}.py"
        path.write_text("# %%\nimport os\nassert os.environ['FAST'] == '1', os.environ.get('FAST')\n"
                        "assert 'inline' in os.environ['MPLBACKEND']\n"
                        f"open('ran_{name}', 'w').write(str(os.getpid()))\n")
        paths.append(path)
    futures, pool = execute_in_background(paths, tmp_path / "out", fast=True, timeout=60, workers=2)
    try:
        results = {path: futures[path].result(timeout=120) for path in paths}
    finally:
        pool.shutdown()
    assert dict(os.environ) == before
    pids = set()
    for path, (target, seconds) in results.items():
        assert target == tmp_path / "out" / path.stem / f"{path.stem}.ipynb" and target.exists() and seconds > 0
        pids.add((tmp_path / "out" / path.stem / f"ran_{path.stem}").read_text())
    assert len(pids) == 2 and str(os.getpid()) not in pids
