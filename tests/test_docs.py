"""The documentation site builds with warnings as errors (Sphinx, myst-nb, the PyData theme; ``make docs``) from the
teaching notebooks this test session executed (tests/notebook_runs.py: executed once, shared with
tests/test_notebooks.py, so the site costs only Sphinx here), and has the pages it promises: a page per paper
covering every registered model, the verdict page with the measured error-rate table, an API page for every
public name of ``zoo``, ``inference`` and ``diagnostics``, the command line's help for every command, and every
notebook rendered with its figures and shown in the gallery with a thumbnail."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from notebook_runs import all_executed, session_dir

import diagnostics
import inference
import zoo
from notebooks.build import sources

ROOT = Path(__file__).resolve().parents[1]
PAPERS = ["hlcr", "mppca", "ssgp", "gp_alps", "dmfvi"]
pytestmark = pytest.mark.notebook  # renders the executed notebooks
GENERATED = ("_build", "_generated", "notebooks", "generated", "zoo.md", "inference.md", "diagnostics.md")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built from a copy of docs/ (nothing is written into the checkout)."""
    runs = session_dir(tmp_path_factory)
    all_executed(runs, reverse=True)
    work = tmp_path_factory.mktemp("docs")
    shutil.copytree(ROOT / "docs", work / "docs", ignore=shutil.ignore_patterns(*GENERATED))
    env = {**os.environ, "BAYES_ZOO_ROOT": str(ROOT), "BAYES_ZOO_DOCS_NOTEBOOKS": str(runs),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                          "-d", str(work / "doctrees"), str(work / "docs"), str(work / "html")],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"sphinx failed (warnings are errors):\n{out.stdout[-4000:]}\n{out.stderr[-8000:]}"
    return work / "html"


def _headlines():
    """docs/headlines.py, the parser the site's build reads the headline ratios of results.md with."""
    spec = importlib.util.spec_from_file_location("docs_headlines", ROOT / "docs" / "headlines.py")
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


def page(site: Path, name: str) -> str:
    path = site / f"{name}.html"
    assert path.is_file(), f"no page {name}.html"
    return path.read_text()


def test_landing_getting_started_benchmarks_and_a_page_per_paper(site):
    index = page(site, "index")
    for name in ("getting_started", "gallery", "papers/index", "verdicts", "benchmarks", "api/index", "cli"):
        assert f'href="{name}.html"' in index, name
    start = page(site, "getting_started")
    for heading in ("Install", "The two commands", "From Python, on your own table", "From the command line"):
        assert re.search(rf"<h2[^>]*>{heading}", start), heading
    results = (ROOT / "benchmarks" / "results.md").read_text()
    sections = re.findall(r"(?m)^## (.+)$", results)
    bench = page(site, "benchmarks")
    assert sections and all(s.split()[0] in bench for s in sections), "benchmarks.html includes results.md"
    found, _ = _headlines().extract(results)
    assert found and all(f"<strong>{f.value}</strong>" in bench for f in found), "the headline ratios table"
    models = [m for m in zoo.list_models() if zoo.get(m).model.__module__.startswith("zoo.")]
    headings = {p: re.findall(r"<h3[^>]*>(.*?)</h3>", page(site, f"papers/{p}"), re.S) for p in PAPERS}
    for model in models:
        on = [p for p, hs in headings.items() if any(f">{model}<" in h for h in hs)]
        assert on, f"model {model} has no section on any paper page"
    hlcr = page(site, "papers/hlcr")
    assert "Errata and ambiguities" in hlcr and "gibbs_blocked" in hlcr and "dietox" in hlcr


def test_the_verdict_page_has_the_four_verdicts_and_the_measured_error_rate_table(site):
    html = page(site, "verdicts")
    for verdict in ("PASS", "FAIL", "NOT CONVERGED", "NOT JUDGED"):
        assert verdict in html
    tables = re.findall(r"<table.*?</table>", html, re.S)
    rates = [t for t in tables if "false alarms: PASS" in t]
    assert rates, "the error-rate table of benchmarks/results.md ('verdicts') is on the page"
    assert len(re.findall(r"<tr", rates[0])) >= 5


def test_the_api_reference_covers_every_public_name(site):
    for module in (zoo, inference, diagnostics):
        listing = page(site, f"api/{module.__name__}")
        for name in module.__all__:
            target = f"{module.__name__}.{name}"
            assert f'href="generated/{target}.html' in listing, f"{target} is not listed"
            html = page(site, f"api/generated/{target}")
            assert f'id="{target}"' in html or f'id="module-{target}"' in html, f"{target} is not documented"


def _article(html: str):
    """The page's main text (the PyData theme's ``<article>``), parsed."""
    from bs4 import BeautifulSoup

    return BeautifulSoup(html, "html.parser").find("article")


def test_api_pages_show_docstrings_rendered_not_as_raw_rest(site):
    """No API page shows reST source: a docstring judged not reST by docs/conf.py is shown as its text (a literal
    block, its summary escaped), which is how the numpydoc Attributes sections of ``ModelSpec`` and ``ZooSettings``
    once came out: napoleon's ``.. attribute::`` entries printed in a grey block, the summary's double backticks
    raw."""
    pages = sorted((site / "api" / "generated").glob("*.html"))
    assert len(pages) >= sum(len(m.__all__) for m in (zoo, inference, diagnostics))
    pages += [site / "api" / f"{m.__name__}.html" for m in (zoo, inference, diagnostics)]  # the summary tables
    for path in pages:
        text = _article(path.read_text()).get_text()
        assert "``" not in text, f"{path.name}: raw double backticks: {text[text.index('``') - 80:][:200]!r}"
        directive = re.search(r"(?m)^\s*\.\. [\w:-]+::", text)
        assert not directive, f"{path.name}: a reST directive shown as text: {directive.group()!r}"


def _documented_attributes(cls) -> list[str]:
    """The names an ``Attributes`` section of ``cls``'s docstring lists (numpydoc: ``name:`` at the section's
    indentation, its description indented below)."""
    doc = inspect.getdoc(cls) or ""
    section = re.search(r"(?ms)^Attributes\n-+\n(.*?)(?:^\S[^\n]*\n-+\n|\Z)", doc)
    if not section:
        return []
    return [n.strip() for line in section.group(1).splitlines() if re.match(r"\S", line)
            for n in line.split(":")[0].split(",")]


def test_class_attributes_sections_are_rendered_definitions_of_every_field(site):
    """A public class whose docstring has a numpydoc ``Attributes`` section (``ModelSpec``, ``ZooSettings``,
    ``Draws``, ``SBCResult``) lists each of its dataclass fields on its page as an attribute definition with an
    anchor and a description, in the docstring's order (napoleon's entries, not autodoc's bare field entries)."""
    classes = [(m, name) for m in (zoo, inference, diagnostics) for name in m.__all__
               if inspect.isclass(getattr(m, name)) and _documented_attributes(getattr(m, name))]
    names = {name for _, name in classes}
    assert {"ModelSpec", "ZooSettings", "Draws", "SBCResult"} <= names, names
    for module, name in classes:
        cls = getattr(module, name)
        target = f"{module.__name__}.{name}"
        article = _article(page(site, f"api/generated/{target}"))
        entries = article.select("dl.py.attribute > dt[id]")
        shown = [dt["id"].removeprefix(f"{target}.") for dt in entries]
        fields = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
        assert set(fields) <= set(shown), f"{target}: fields without an attribute entry: {set(fields) - set(shown)}"
        assert shown == _documented_attributes(cls), f"{target}: {shown}"
        for dt in entries:
            description = dt.find_next_sibling("dd").get_text(" ", strip=True)
            assert len(description) > 10, f"{dt['id']}: no description"
    spec = _article(page(site, "api/generated/zoo.ModelSpec"))
    model = spec.select_one('dt[id="zoo.ModelSpec.model"]').find_next_sibling("dd")
    assert model.select_one("code.literal").get_text() == "model(**spec.model_inputs(data, hyper))"


def test_function_parameters_are_rendered_as_name_and_description(site):
    """Each entry of a public function's Parameters section shows the function's own parameter names, then its
    description (``name – text``, napoleon's reading of a numpydoc ``name:`` line with the description indented
    below). Written ``name:   text`` on one line, napoleon once took the text for a type (in parentheses, in
    italics), and a paragraph after the section for one more parameter."""
    checked = 0
    for module in (zoo, inference, diagnostics):
        for name in module.__all__:
            obj = getattr(module, name)
            if not inspect.isfunction(obj) or not re.search(r"(?m)^Parameters\n-+$", inspect.getdoc(obj) or ""):
                continue
            parameters = set(inspect.signature(obj).parameters)
            article = _article(page(site, f"api/generated/{module.__name__}.{name}"))
            field = next(dt for dt in article.select("dl.field-list > dt") if dt.get_text(strip=True) == "Parameters:")
            for item in field.find_next_sibling("dd").select("li"):
                names = item.find("strong").get_text()
                assert set(names.split(", ")) <= parameters, f"{module.__name__}.{name}: {names!r} is no parameter"
                text = item.get_text(" ", strip=True)
                assert text.startswith(f"{names} – "), f"{module.__name__}.{name}: {text[:150]!r}"
                checked += 1
    assert checked >= 40, checked


def test_the_cli_reference_is_the_help_of_every_command(site):
    import typer.main

    from zoo_cli.commands import app

    group = typer.main.get_command(app)
    html = page(site, "cli")
    assert "Usage: zoo" in html
    for name, command in group.commands.items():
        if not command.hidden:
            assert f"Usage: zoo {name}" in html, name


def test_every_notebook_is_rendered_with_its_figures_and_has_a_thumbnail(site):
    gallery = page(site, "gallery")
    for path in sources():
        html = page(site, f"notebooks/{path.stem}")
        assert "<img" in html, f"{path.stem}: no figure on its page"
        card = re.search(rf'<a[^>]*href="notebooks/{path.stem}.html"', gallery)
        assert card, f"{path.stem}: no card in the gallery"
        assert re.search(rf"<img[^>]*src=\"_images/{path.stem}.png\"", gallery), f"{path.stem}: no thumbnail"
