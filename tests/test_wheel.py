"""The project installs and runs from a built wheel, not only from the editable checkout (issue 32 item 5).

``python -m build --wheel`` makes the wheel (at most 25 MB, the stored references inside as package data, no
tests, notebooks or caches); it is installed, not editable, into a fresh virtual environment, and ``zoo list``,
``zoo compare ppca --methods vbem,em`` and ``import zoo, inference, diagnostics`` run there from a directory
outside the checkout, with the references found inside the installed package.

How the fresh environment gets its dependencies without seeing the checkout: it is made by ``python -m venv``
from the base interpreter (no system site-packages: the base interpreter has none of our dependencies anyway),
and one ``.pth`` line in it names the site-packages directory of the environment running the tests as a plain
path. The dependencies (jax, numpyro, arviz, ...) are imported from there, already installed, so the test needs
no network and no 2 GB download; that directory's own ``.pth`` files, among them the editable install's hook
that puts the checkout on ``sys.path``, are not executed for a directory named by a path line (``site`` runs
``.pth`` files of site directories only). The wheel goes in with ``pip install --no-deps --no-index``, into the
fresh environment's own site-packages, which comes first on ``sys.path``; ``PYTHONPATH`` is removed from the
children's environment, and each import is checked to come from the fresh environment. Slow: building the wheel,
the environment and a comparison's first compile take about a minute on an idle machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from diagnostics import references

ROOT = Path(__file__).resolve().parents[1]
MAX_WHEEL_BYTES = 25e6


def _run(cmd, cwd, env, timeout=900):
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_environment_and_runs_outside_the_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, ROOT], tmp_path, env)
    (wheel,) = dist.glob("bayes_zoo-*.whl")
    size = wheel.stat().st_size
    assert size <= MAX_WHEEL_BYTES, f"wheel {size / 1e6:.1f} MB (budget 25 MB)"
    names = zipfile.ZipFile(wheel).namelist()
    stored = sorted(p.name for p in references.REFERENCE_DIR.glob("*.nc"))
    assert stored and sorted(Path(n).name for n in names if n.startswith("zoo/references/") and n.endswith(".nc")) \
        == stored
    assert {n.split("/")[0] for n in names} == {"zoo", "inference", "diagnostics", "zoo_cli",
                                                 wheel.name.split("-py3")[0] + ".dist-info"}
    assert not [n for n in names if "__pycache__" in n or ".jax_cache" in n or "/.work/" in n]

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env)
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path,
                     env).strip())
    deps = Path(sysconfig.get_paths()["purelib"])          # where this environment's jax, numpyro, ... live
    (site / "_bayes_zoo_test_deps.pth").write_text(f"{deps}\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "--quiet", wheel],
         tmp_path, env)

    work = tmp_path / "elsewhere"          # outside the checkout: nothing of it on sys.path
    work.mkdir()
    probe = ("import numpyro, zoo, inference, diagnostics, zoo_cli\n"
             "from diagnostics import references\n"
             "print(zoo.__file__); print(inference.__file__); print(diagnostics.__file__); print(zoo_cli.__file__)\n"
             "print(references.REFERENCE_DIR)\n"
             "print(sorted(p.name for p in references.REFERENCE_DIR.glob('*.nc')))\n"
             "tree = references.load('ppca'); print(tree.attrs['reference_tag'])\n")
    lines = _run([python, "-c", probe], work, env).splitlines()
    for path in lines[:5]:
        assert Path(path).is_relative_to(site), f"{path} is not the installed package in {site}"
    assert lines[5] == repr(stored) and lines[6] == "default"    # the references are package data, checksums ok

    listing = _run([venv / "bin" / "zoo", "list"], work, env)
    assert "ppca" in listing and "hlcr" in listing
    out = work / "out"
    report = _run([venv / "bin" / "zoo", "compare", "ppca", "--methods", "vbem,em", "--out", out], work, env)
    for method in ("vbem", "em"):   # a verdict (PASS or FAIL, not NOT JUDGED): judged against the stored reference
        assert re.search(rf"ppca/{method}: (PASS|FAIL)", report), report[-2000:]
    assert (out / "ppca" / "report.html").is_file()
