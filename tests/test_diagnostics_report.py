"""The HTML report, parsed: every section is there, every table has rows, every image is a valid PNG
file next to the page, the words say which methods pass; the index links every model; `zoo compare`
and `zoo demo` write them."""

from __future__ import annotations

import dataclasses
from html.parser import HTMLParser
from pathlib import Path

import pytest
from diag_toys import LINREG, NORMAL
from typer.testing import CliRunner

import diagnostics
import inference
import zoo

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """What a test needs from a page: section ids, rows per table, image sources, links, text."""

    def __init__(self, text: str):
        super().__init__()
        self.sections, self.tables, self.images, self.links, self.scripts = [], [], [], [], 0
        self._in_tbody = False
        self._skip = 0
        self.text = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.sections.append(a.get("id"))
        elif tag == "table":
            self.tables.append(0)
        elif tag == "tbody":
            self._in_tbody = True
        elif tag == "tr" and self._in_tbody:
            self.tables[-1] += 1
        elif tag == "img":
            self.images.append(a["src"])
        elif tag == "a":
            self.links.append(a.get("href"))
        elif tag in ("script", "link", "iframe"):
            self.scripts += 1
        if tag in ("style", "title"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag == "tbody":
            self._in_tbody = False
        if tag in ("style", "title"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)

    @property
    def words(self) -> str:
        return " ".join(" ".join(self.text).split())


def check_page(path: Path) -> Page:
    """The structural claims of the issue for one page."""
    page = Page(path.read_text(encoding="utf-8"))
    assert page.scripts == 0  # static: no JavaScript, no external stylesheet
    assert "http://" not in path.read_text() and "https://" not in path.read_text()  # nothing from the network
    assert page.tables and all(rows > 0 for rows in page.tables), page.tables
    for src in page.images:
        img = path.parent / src
        assert img.is_file(), src
        assert img.read_bytes()[:8] == PNG_MAGIC, src
        from PIL import Image

        with Image.open(img) as im:
            im.verify()
    return page


@pytest.fixture(scope="module", autouse=True)
def toys():
    for spec in (LINREG, NORMAL):
        zoo.register(spec, replace=True)
    yield
    for spec in (LINREG, NORMAL):
        zoo.unregister(spec.name)


@pytest.fixture(scope="module")
def trees():
    data, _ = LINREG.default_data()
    return {
        "reference (exact)": inference.fit("dq_linreg", data, "exact", seed=1, num_samples=1000, num_chains=4),
        "nuts": inference.fit("dq_linreg", data, "nuts", seed=2, num_warmup=300, num_samples=500),
        "meanfield": inference.fit("dq_linreg", data, "meanfield", seed=3),
        "exact_q": inference.fit("dq_linreg", data, "exact_q", seed=4),
    }


@pytest.fixture(scope="module")
def built(trees, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    vsbc = diagnostics.vsbc("dq_linreg", "meanfield", n_sims=30, seed=0, directory=out / "sims", num_samples=100)
    page = diagnostics.report("dq_linreg", trees, out / "dq_linreg", sbc_results=[vsbc])
    return out, page


def test_model_page_has_every_section_non_empty_tables_and_valid_pngs(built):
    _, page_path = built
    assert page_path.name == "report.html"
    page = check_page(page_path)
    assert page.sections == ["verdict", "reference", "hyperparameters", "methods", "scorecard", "plots",
                             "sensitivity", "sbc", "glossary"]
    names = {Path(src).name for src in page.images}
    assert {"marginals.png", "forest.png", "traces.png", "sensitivity.png"} <= names
    assert any(n.startswith("sbc_") for n in names)
    assert (page_path.parent / "scorecard.csv").is_file() and (page_path.parent / "methods.csv").is_file()


def test_the_page_says_in_words_which_methods_pass(built):
    page = check_page(built[1])
    words = page.words
    assert "Of 3 method(s) compared with the reference reference (exact)" in words
    assert "PASS exact_q" in words and "FAIL meanfield" in words
    assert "too narrow: sd of beta[" in words and "overconfident" in words and "rule: sd ratio 0.8-1.25" in words
    assert "The reference is healthy" in words
    # nuts at 2 x 500 draws: tail ESS below 400, so it is told how much longer to run
    assert "NOT CONVERGED nuts" in words and "What to change: run about" in words
    for verdict in ("PASS", "FAIL", "NOT CONVERGED", "NOT JUDGED"):  # the legend explains all four
        assert verdict in words
    assert "Two kinds of rule" in words


def test_index_links_every_model_page(built, trees, tmp_path):
    out, linreg_page = built
    data, _ = NORMAL.default_data()
    # NUTS of this run is the reference when none is stored: 4 x 1000 draws for the health rule
    normal = {"nuts": inference.fit("dq_normal", data, "nuts", seed=1, num_warmup=300, num_samples=1000,
                                    num_chains=4),
              "shifted": inference.fit("dq_normal", data, "shifted", seed=2)}
    normal_page = diagnostics.report("dq_normal", normal, out / "dq_normal")
    index = diagnostics.report_index({"dq_linreg": linreg_page, "dq_normal": normal_page}, out)
    page = check_page(index)
    assert page.tables == [2]  # one row per model
    assert {"dq_linreg/report.html", "dq_normal/report.html"} <= set(page.links)
    assert "FAIL shifted" in page.words and "mean of mu is" in page.words  # what is wrong, in a few words
    # the four verdicts counted over the 4 (model, method) pairs, and explained
    assert "4 (model, method) pairs: PASS 1 FAIL 2 NOT CONVERGED 1 NOT JUDGED 0" in page.words
    assert "the MCMC reference itself failed its health check" in page.words
    check_page(normal_page)


def test_without_a_reference_nothing_is_judged(trees, tmp_path):
    page_path = diagnostics.report("dq_linreg", {"meanfield": trees["meanfield"]}, tmp_path / "alone")
    page = Page(page_path.read_text())
    assert "nothing is judged" in page.words or "no method is judged" in page.words
    assert (tmp_path / "alone" / "marginals.png").is_file()
    assert "all models" not in page.words and not [link for link in page.links if "index" in link]  # none written


def test_a_compared_models_page_links_an_index_that_exists_and_lists_it(trees, tmp_path):
    """`zoo compare` writes one model's page (and a section's, one folder deeper): its "all models" link resolves
    to an index that lists every page in the folder, written with the page (`zoo demo` rewrites it at the end)."""
    from diagnostics.comparison import write_comparison

    chosen = {k: trees[k] for k in ("reference (exact)", "meanfield")}
    page_path = write_comparison("dq_linreg", chosen, tmp_path, log=lambda _: None)
    section_path = write_comparison("dq_linreg", chosen, tmp_path, section="real_toy", log=lambda _: None)
    for path, link in ((page_path, "../index.html"), (section_path, "../../index.html")):
        links = [href for href in Page(path.read_text()).links if href.endswith("index.html")]
        assert links == [link]
        assert (path.parent / link).resolve() == (tmp_path / "index.html").resolve()
    index = check_page(tmp_path / "index.html")
    assert {"dq_linreg/report.html", "dq_linreg/real_toy/report.html"} <= set(index.links)
    assert "dq_linreg / real data: toy" in index.words


def test_zoo_compare_and_demo_write_parsable_reports(tmp_path):
    from diagnostics.demo import run_demo

    # no stored reference: this run's NUTS is the reference, 4 chains x 1000 draws for the health rule
    nuts = {"nuts": {"num_warmup": 300, "num_samples": 1000, "num_chains": 4}}
    methods = {"dq_linreg": ["nuts", "meanfield", "exact_q"], "dq_normal": ["nuts", "shifted"]}
    for spec in (LINREG, NORMAL):
        zoo.register(dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, demo_options=nuts)),
                     replace=True)
    try:
        index_path = run_demo(tmp_path, ["dq_linreg", "dq_normal"], methods=methods, progress=False)
        assert index_path == tmp_path / "index.html"
        index = check_page(tmp_path / "index.html")
        assert index.tables == [2]
        for name in methods:
            page = check_page(tmp_path / name / "report.html")
            bad = "meanfield" if name == "dq_linreg" else "shifted"
            assert "verdict" in page.sections and f"FAIL {bad}" in page.words
    finally:
        for spec in (LINREG, NORMAL):
            zoo.register(spec, replace=True)


def test_compare_help_explains_the_four_verdicts_and_the_two_kinds_of_rule():
    from zoo_cli import app

    result = CliRunner().invoke(app, ["compare", "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for words in ("PASS", "FAIL", "NOT CONVERGED", "NOT JUDGED", "Two kinds of rule", "Samplers", "Approximations",
                  "Bonferroni", "0.2 reference sd", "sd ratio 0.8-1.25", "k-hat <= 0.7", "1 % of their range"):
        assert words in text, words
