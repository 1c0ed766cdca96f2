"""Every teaching notebook runs in FAST mode through jupytext + nbclient (a real Jupyter kernel, Jupyter's inline
matplotlib backend, no ``DISPLAY``, as on a student's laptop or JupyterHub); every plotting cell shows its figure,
and the final "What we verified" cell checks the notebook's headline result, so a statistically broken notebook
fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import jupytext
import nbformat
import pytest
from notebook_runs import OPTIMISED, executed, kernel_env, session_dir

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


SHOW = re.compile(r"^plt\.show\(\)", re.MULTILINE)  # a figure shown whatever the mode (not inside an `if`)


def plotting_cells(nb) -> list[int]:
    """Indices of the code cells that show a figure unconditionally."""
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and SHOW.search(c.source)]


def has_image(cell) -> bool:
    return any("image/png" in out.get("data", {}) for out in cell.get("outputs", []))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_reads_as_a_lesson(path):
    """Title and what it teaches first; quiet configuration; no internal references; checks in a final
    "What we verified" cell that prints its findings."""
    text = path.read_text()
    first_numpyro, first_arviz = text.find("import numpyro"), text.find("arviz")
    assert first_numpyro >= 0 and (first_arviz < 0 or first_numpyro < first_arviz), \
        "notebooks must import numpyro before arviz (ArviZ picks its plotting backend at import)"
    nb = jupytext.read(path)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), "a notebook opens with its title"
    assert "**What you will learn:**" in first.source, "the title is followed by what the notebook teaches"
    for needle in ("notes/", "shared/", "notes §", "notes'", "notes test", "issue "):
        assert needle not in text, f"internal reference {needle!r} in {path.name}"
    headings = [c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## ")]
    assert headings and headings[-1].startswith("## What we verified"), headings[-1:]
    last = nb.cells[-1]
    assert last.cell_type == "code" and "print(" in last.source and "assert" in last.source, \
        "the last cell prints its findings and checks the headline result"
    assert plotting_cells(nb), "a teaching notebook shows at least one figure"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_in_fast_mode_and_every_plotting_cell_shows_its_figure(path, tmp_path_factory):
    nb = nbformat.read(executed(path, session_dir(tmp_path_factory)), as_version=4)
    cells = plotting_cells(nb)
    blank = [i for i in cells if not has_image(nb.cells[i])]
    assert not blank, f"plotting cells without a figure under the inline backend: {blank} of {cells}"
    assert any(out.output_type == "stream" for out in nb.cells[-1].outputs), "the findings were printed"


def test_only_the_run_bound_notebooks_lose_the_optimisation_level_flag_and_every_other_setting_stays(monkeypatch):
    """``kernel_env``: the notebooks of ``OPTIMISED`` start without ``--xla_backend_optimization_level`` (XLA's
    default optimisation), the others with this process's XLA flags; the other flags and variables are kept and
    ``DISPLAY`` is dropped for every notebook."""
    assert OPTIMISED and OPTIMISED <= {p.stem for p in NOTEBOOKS}
    flags = "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0 --xla_dump_to=/tmp/x"
    monkeypatch.setenv("XLA_FLAGS", flags)
    monkeypatch.setenv("DISPLAY", ":0")
    for path in NOTEBOOKS:
        env = kernel_env(path.stem)
        assert "DISPLAY" not in env and env["PATH"] == os.environ["PATH"]
        want = flags if path.stem not in OPTIMISED else \
            "--xla_force_host_platform_device_count=2 --xla_dump_to=/tmp/x"
        assert env["XLA_FLAGS"] == want, path.stem
    monkeypatch.delenv("XLA_FLAGS")
    assert all("XLA_FLAGS" not in kernel_env(p.stem) for p in NOTEBOOKS)


def test_plots_keep_a_backend_that_is_already_chosen():
    """``diagnostics.plots`` falls back to Agg only when nothing chose a backend and there is no display; the
    inline backend Jupyter sets (``MPLBACKEND``) is kept, as is an explicit ``matplotlib.use``."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "MPLBACKEND")}
    probe = ("import matplotlib, sys\n{setup}\nfrom diagnostics.plots import _mpl\n_mpl()\n"
             "print(matplotlib.get_backend())")

    def backend(setup, **extra):
        out = subprocess.run([sys.executable, "-c", probe.format(setup=setup)], env={**env, **extra},
                             capture_output=True, text=True, check=True, timeout=120)
        return out.stdout.strip().splitlines()[-1]

    inline = "module://matplotlib_inline.backend_inline"
    assert backend("", MPLBACKEND=inline) == inline
    assert backend("matplotlib.use('svg')") == "svg"
    assert backend("").lower() == "agg"



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
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask, oct(target.stat().st_mode)  # mkstemp's 0600 no more
    assert (tmp_path / "out" / "ran").read_text() != str(os.getpid())
