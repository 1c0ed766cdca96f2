"""The pieces every package has (LICENSE, CITATION.cff, CHANGELOG, one version), and no file of the project
cites a path the project does not contain (the engineering notes outside the repository were cited as
``shared/notes/...``; the paper pages ``docs/papers/<paper>.md`` carry their errata and equations)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import yaml

import zoo

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".cfg", ".txt", ".cff", ".yml", ".yaml", ".json", ".ipynb", ".rst", ".html"}


def tracked_text_files() -> list[Path]:
    """The repository's own text files: git's list where this is a checkout, else the tree without build output."""
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                               timeout=60).stdout.decode().split("\0")
        files = [ROOT / n for n in names if n]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", ".jax_cache", "_build", "build", "node_modules", ".pytest_cache"}
        files = [p for p in ROOT.rglob("*") if not skip & set(p.relative_to(ROOT).parts)]
    return [p for p in files if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name == "Makefile")]


def test_no_tracked_file_cites_the_notes_outside_the_project():
    pattern = re.compile(r"shared/notes|\.\./shared\b")
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}"
            for p in tracked_text_files() if p != Path(__file__).resolve()
            for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if pattern.search(line)]
    assert hits == []


def test_every_path_of_the_repository_that_a_file_cites_exists():
    """A cited ``notes/<name>.md``, paper page ``docs/papers/<paper>.md``, test, benchmark or module path names a
    file of this repository (templates such as ``zoo/<model>.py`` are not paths)."""
    pattern = re.compile(r"(?<![\w./-])((?:notes|zoo|inference|diagnostics|zoo_cli|notebooks|benchmarks|tests|docs)"
                         r"/[\w/.-]*\w\.(?:py|md|json|png|cff|toml))\b")
    fixtures = {"zoo/bad.py", "tests/test_x.py"}   # tests/test_layers.py writes them as forbidden imports
    missing = sorted({f"{p.relative_to(ROOT)}: {m}" for p in tracked_text_files() if p != Path(__file__).resolve()
                      for m in pattern.findall(p.read_text(encoding="utf-8", errors="replace"))
                      if m not in fixtures and not (ROOT / m).exists()})
    assert missing == []


def test_license_is_the_mit_licence_pyproject_declares():
    assert PYPROJECT["license"] == {"text": "MIT"}
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Permission is hereby granted, free of charge" in text


def test_citation_cff_names_the_project_at_its_version_and_the_paper_of_every_model():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert str(cff["version"]) == PYPROJECT["version"] == zoo.__version__
    assert cff["license"] == "MIT" and cff["authors"] and cff["title"].startswith("bayes-zoo")
    titles = [ref["title"].lower() for ref in cff["references"]]
    assert all(ref["authors"] and ref["type"] for ref in cff["references"])
    for name in zoo.list_models():           # the paper a model's page and `zoo list` name is cited
        paper = zoo.get(name).paper.lower()
        assert any(title in paper for title in titles), (name, paper)
    assert len({t for t in titles if any(t in zoo.get(n).paper.lower() for n in zoo.list_models())}) == 5


def test_changelog_has_a_section_for_the_current_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(PYPROJECT['version'])}\b", text, flags=re.M)
