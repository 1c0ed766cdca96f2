"""Sphinx configuration of the bayes-zoo documentation site (``make docs``).

Before Sphinx reads a page, this file generates what must not be retyped:

* ``notebooks/<name>.ipynb``: every teaching notebook (``notebooks/*.py``, jupytext) executed by Jupyter's own
  machinery, FAST unless ``FULL=1``; or, with ``BAYES_ZOO_DOCS_NOTEBOOKS=DIR``, copies of notebooks already
  executed into DIR (the test suite executes them once and renders those);
* ``_generated/gallery.md``: a card per notebook with the first figure it draws as its thumbnail;
* ``_generated/cli.md``: ``zoo --help`` and every subcommand's help, as the command line prints them;
* ``_generated/api_*.md``: an autosummary of every name in ``zoo.__all__``, ``inference.__all__`` and
  ``diagnostics.__all__``;
* ``_generated/papers/<paper>_*.md``: each paper's models, their methods and options (from the registries),
  real datasets, the notebook's printed findings, and its sections of ``benchmarks/results.md``;
* ``_generated/results/*.md``: ``benchmarks/results.md`` whole and by section, and ``headlines.md``: its headline
  ratios, read from its tables (``docs/headlines.py``; a headline that is not found is a build warning).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = Path(os.environ.get("BAYES_ZOO_ROOT", DOCS.parent)).resolve()
GEN = DOCS / "_generated"
NOTEBOOKS = DOCS / "notebooks"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))
import headlines  # noqa: E402  (docs/headlines.py)

# The paper pages (docs/papers/<paper>.md), the zoo models each covers, its notebooks and its sections of
# benchmarks/results.md.
PAPERS = {
    "hlcr": {"models": ["hlcr"], "notebooks": ["hlcr", "fedhlcr"], "results": ["hlcr", "hlcr_scale", "fedhlcr"]},
    "mppca": {"models": ["mppca", "ppca"], "notebooks": ["mppca"], "results": ["mppca"]},
    "ssgp": {"models": ["ssgp_lmm", "ssgp_logit", "ssgp_probit"], "notebooks": ["ssgp"], "results": ["ssgp"]},
    "gp_alps": {"models": ["gp_alps"], "notebooks": ["gp_alps"], "results": ["gp_alps"]},
    "dmfvi": {"models": ["bpca"], "notebooks": ["dmfvi"], "results": ["dmfvi"]},
}

_pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
project = "bayes-zoo"
author = "the bayes-zoo authors"
copyright = "the bayes-zoo authors, MIT licence"
release = version = _pyproject["version"]

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx_design",
]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # executed by notebooks.build below, the same machinery as the test suite
nb_merge_streams = True
nb_output_stderr = "remove"  # library warnings and progress noise; the notebooks' findings are on stdout
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "_generated"]  # _generated/: included, not pages
# "more than one target found" for a word of a docstring read as a type (``default``): not a broken link
suppress_warnings = ["mystnb.unknown_mime_type", "ref.python"]

autosummary_generate = True
autosummary_imported_members = True
# a flag given here is on whatever its value ("undoc-members": False turns it on): only what is wanted is named.
# Undocumented members stay out: a dataclass's fields are documented by its docstring's Attributes section, which
# napoleon makes into the class's attribute entries (a bare entry of autodoc's would repeat each one).
autodoc_default_options = {"members": True}
autodoc_typehints = "none"
autodoc_mock_imports: list[str] = []
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_param = False
napoleon_use_rtype = False
napoleon_attr_annotations = False  # no type hints on the site (autodoc_typehints): each entry says what it holds

html_theme = "pydata_sphinx_theme"
html_title = "bayes-zoo"
html_static_path = ["_static"] if (DOCS / "_static").is_dir() else []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    # an outline beside the long pages; the notebooks and the card pages need the width more
    "secondary_sidebar_items": {page: ["page-toc"] for page in (
        "getting_started", "verdicts", "benchmarks", "cli", "papers/*", "api/*", "api/generated/*", "guide/*")},
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_sidebars = {"index": [], "getting_started": [], "verdicts": [], "benchmarks": [], "cli": []}


# ------------------------------------------------------------------------------------------------ notebooks


def _prepare_notebooks() -> list[Path]:
    import nbformat

    from notebooks.build import execute, sources

    NOTEBOOKS.mkdir(exist_ok=True)
    given = os.environ.get("BAYES_ZOO_DOCS_NOTEBOOKS")
    full = os.environ.get("FULL", "0") not in ("", "0")
    out = []
    for path in sources():
        target = NOTEBOOKS / f"{path.stem}.ipynb"
        if given:
            shutil.copyfile(Path(given) / f"{path.stem}.ipynb", target)
            nb = nbformat.read(target, as_version=4)
            if "language_info" not in nb.metadata:  # an executed notebook has it; the highlighter needs it
                nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
                nbformat.write(nb, target)
        else:
            print(f"docs: executing notebooks/{path.name} ({'full size' if full else 'FAST'}) ...", flush=True)
            with tempfile.TemporaryDirectory() as run_dir:  # the notebook's own output files stay out of docs/
                executed, _ = execute(path, Path(run_dir), fast=not full, timeout=3600 if full else 600)
                shutil.copyfile(executed, target)
        out.append(target)
    for stale in set(NOTEBOOKS.glob("*.ipynb")) - set(out):
        stale.unlink()
    return out


def _first_markdown(nb) -> tuple[str, str]:
    """(title, what the notebook teaches, as Markdown): the title cell's "What you will learn:" paragraph,
    else its first paragraph."""
    text = next(c.source for c in nb.cells if c.cell_type == "markdown")
    lines = text.splitlines()
    title = lines[0].lstrip("# ").strip()
    learn = [i for i, line in enumerate(lines) if line.startswith("**What you will learn")]
    start = learn[0] if learn else 1
    para: list[str] = []
    for line in lines[start:]:
        if not line.strip():
            if para:
                break
            continue
        para.append(line.strip())
    blurb = re.sub(r"\s+", " ", " ".join(para)).strip()
    if learn:
        blurb = blurb.replace("**What you will learn:**", "").strip()
        blurb = blurb[:1].upper() + blurb[1:]
    elif len(blurb) > 300:  # a first paragraph: its first sentences
        blurb = blurb[:300].rsplit(". ", 1)[0] + "."
    return title, blurb


def _images(nb) -> list[bytes]:
    return [base64.b64decode(out["data"]["image/png"]) for c in nb.cells if c.cell_type == "code"
            for out in c.get("outputs", []) if "image/png" in out.get("data", {})]


FIRST = ["posterior_quality_101", "prior_sensitivity", "cost_accuracy"]  # the tutorials, then the papers'


def _gallery(paths: list[Path]) -> None:
    import nbformat

    paths = sorted(paths, key=lambda p: (FIRST.index(p.stem) if p.stem in FIRST else len(FIRST), p.stem))

    thumbs = GEN / "thumbs"
    thumbs.mkdir(parents=True, exist_ok=True)
    cards = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        title, blurb = _first_markdown(nb)
        images = _images(nb)
        img = ""
        if images:
            (thumbs / f"{path.stem}.png").write_bytes(images[0])
            img = f":img-top: /_generated/thumbs/{path.stem}.png\n"
        cards.append(f":::{{grid-item-card}} {title}\n{img}:link: notebooks/{path.stem}\n:link-type: doc\n"
                     f":class-img-top: gallery-thumb\n\n{blurb}\n:::\n")
    (GEN / "gallery.md").write_text("::::{grid} 1 2 2 3\n:gutter: 3\n\n" + "\n".join(cards) + "::::\n")
    toc = "".join(f"notebooks/{path.stem}\n" for path in paths)  # the navigation in the gallery's order
    (GEN / "gallery_toc.md").write_text(f"```{{toctree}}\n:hidden:\n\n{toc}```\n")


def _findings(path: Path) -> str:
    """What the notebook's final "What we verified" cell printed in this build."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    text = "".join(out.get("text", "") for out in nb.cells[-1].get("outputs", []) if out.get("output_type") == "stream")
    return text.rstrip()


# ------------------------------------------------------------------------------------------------ command line


def _cli() -> None:
    # typer reads the width of its rich help once, when first imported
    os.environ["TERMINAL_WIDTH"] = "92"
    from typer.testing import CliRunner

    from zoo_cli.commands import app

    runner = CliRunner()
    env = {"COLUMNS": "92", "TERM": "dumb", "NO_COLOR": "1"}

    def help_of(args: list[str]) -> str:
        result = runner.invoke(app, [*args, "--help"], env=env, prog_name="zoo")
        if result.exit_code != 0:
            raise RuntimeError(f"zoo {' '.join(args)} --help failed: {result.output}")
        return result.output.rstrip()

    import typer.main

    group = typer.main.get_command(app)
    commands = sorted(group.commands) if hasattr(group, "commands") else []
    parts = ["## `zoo`\n", "```text", help_of([]), "```\n"]
    for name in commands:
        if group.commands[name].hidden:
            continue
        parts += [f"## `zoo {name}`\n", "```text", help_of([name]), "```\n"]
    (GEN / "cli.md").write_text("\n".join(parts) + "\n")


# ------------------------------------------------------------------------------------------------ API


def _api() -> None:
    """``api/<package>.md``: an autosummary of every public name (``__all__``) of the three library packages."""
    import diagnostics
    import inference
    import zoo

    for module in (zoo, inference, diagnostics):
        first = (module.__doc__ or "").strip().split("\n\n")[0]
        body = [f"# `{module.__name__}`\n", first, "",
                f"```{{eval-rst}}\n.. currentmodule:: {module.__name__}\n\n.. autosummary::\n   :toctree: generated\n"]
        body += [f"   {name}" for name in sorted(module.__all__)]
        body.append("```\n")
        (DOCS / "api" / f"{module.__name__}.md").write_text("\n".join(body) + "\n")


class _AnyOption(dict):
    """The options of a directive the reST check takes as given: every option, its value unchanged."""

    def __missing__(self, name):
        from docutils.parsers.rst import directives

        return directives.unchanged

    def __bool__(self):  # docutils reads a directive's options only when its option_spec is truthy
        return True


def _as_given(content_is_rst: bool):
    """The directive the reST check reads a Sphinx directive as. A Sphinx directive runs only inside the build (it
    reads the build environment, which a bare docutils parse does not have): its arguments and options are taken as
    given, its content is checked as reST where it is reST (an object's description: napoleon's ``.. attribute::``
    for each entry of an Attributes section) and taken as given otherwise (``.. math::``)."""
    from docutils import nodes
    from docutils.parsers.rst import Directive

    class AsGiven(Directive):
        has_content = True
        optional_arguments = 100
        final_argument_whitespace = True
        option_spec = _AnyOption()

        def run(self):
            node = nodes.container()
            if content_is_rst:
                self.state.nested_parse(self.content, self.content_offset, node)
            return [node]

    return AsGiven


def _role_as_given(name, rawtext, text, lineno, inliner, options=None, content=None):
    from docutils import nodes

    return [nodes.literal(rawtext, text)], []


def _valid_rst(lines: list[str]) -> bool:
    """Whether ``lines`` (a docstring as napoleon hands it on) are reST without a warning, judged by docutils; the
    directives and roles that Sphinx adds (its domains': ``.. attribute::``, ``:class:``) are read as given (see
    ``_as_given``), for they run only inside the build."""
    import io

    from docutils.core import publish_doctree
    from docutils.parsers.rst import directives, roles
    from sphinx.directives import ObjectDescription

    def sphinx_added(element) -> bool:
        return not getattr(element, "__module__", "docutils").startswith("docutils")

    lookup_directive, lookup_role = directives.directive, roles.role  # Sphinx's while it reads a page

    def directive(name, language, document):
        found, messages = lookup_directive(name, language, document)
        if found is not None and sphinx_added(found):
            found = _as_given(isinstance(found, type) and issubclass(found, ObjectDescription))
        return found, messages

    def role(name, language, lineno, reporter):
        found, messages = lookup_role(name, language, lineno, reporter)
        if found is not None and sphinx_added(found):
            found = _role_as_given
        return found, messages

    stream = io.StringIO()
    directives.directive, roles.role = directive, role
    try:
        publish_doctree("\n".join(lines), settings_overrides={"report_level": 2, "halt_level": 5,
                                                                "warning_stream": stream})
    finally:
        directives.directive, roles.role = lookup_directive, lookup_role
    return not stream.getvalue()


_RST_SPECIAL = re.compile(r"([\\`*|_\[\]<>:])")


def _docstring_as_text_when_not_rst(app, what, name, obj, options, lines):
    """Docstrings are written as plain text with reST markup where it helps; one that is not valid reST (a ``|x|``
    read as a substitution, a list indented as reST does not expect) is shown as written: its first paragraph
    (the summary; its markup characters escaped unless it is valid reST on its own) and the rest as a literal
    block. The check reads what napoleon made of the docstring (its numpydoc sections as reST); a check that fails
    (rather than finding the docstring invalid) stops the build, naming the docstring."""
    try:
        valid = not lines or _valid_rst(lines)
    except Exception as error:  # never show a docstring as text because the check itself broke
        raise RuntimeError(f"docs/conf.py could not check the docstring of {what} {name} as reST: {error!r}") from error
    if valid:
        return
    text = list(lines)
    try:
        cut = text.index("")
    except ValueError:
        cut = len(text)
    summary = " ".join(line.strip() for line in text[:cut])
    if not _valid_rst([summary]):
        summary = _RST_SPECIAL.sub(r"\\\1", summary)
    rest = [line for line in text[cut:]]
    while rest and not rest[0].strip():
        rest.pop(0)
    lines[:] = [summary, ""]
    if rest:
        lines += ["::", ""] + ["   " + line for line in rest] + [""]


# ------------------------------------------------------------------------------------------------ papers, results


def _results_sections() -> dict[str, str]:
    text = (ROOT / "benchmarks" / "results.md").read_text()
    sections: dict[str, str] = {}
    for block in re.split(r"(?m)^## ", text)[1:]:
        name, _, body = block.partition("\n")
        sections[name.strip()] = body
    return sections


def _shift_headings(text: str, by: int) -> str:
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,5} ", line):
            line = "#" * by + line
        out.append(line)
    return "\n".join(out)


_HEADLINES_MISSING: list[str] = []


def _warn_missing_headlines(app) -> None:
    from sphinx.util import logging

    for message in _HEADLINES_MISSING:
        logging.getLogger(__name__).warning(message)


def _results() -> None:
    results = GEN / "results"
    results.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "benchmarks" / "results.md").read_text()
    body = text.split("\n", 1)[1] if text.startswith("# ") else text
    (results / "all.md").write_text(body)
    for name, body in _results_sections().items():
        (results / f"{re.sub(r'[^A-Za-z0-9_]+', '_', name)}.md").write_text(body)
    _HEADLINES_MISSING[:] = headlines.write(ROOT / "benchmarks" / "results.md", results / "headlines.md")


def _cell(text: str) -> str:
    """Text for a cell of a Markdown table: a ``|`` (``positive|None``) would end the cell, even inside code."""
    return re.sub(r"\s+", " ", str(text)).replace("|", "\\|")


def _option_value(value) -> str:
    return _cell("`None`" if value is None else f"`{value!r}`")


def _paper_methods(paper: str) -> str:
    import inference
    import zoo
    from inference._methods import get_method

    parts = []
    for model in PAPERS[paper]["models"]:
        spec = zoo.get(model)
        parts += [f"### `{model}`\n"]
        hyper = [f"| `{k}` | {_option_value(h.default)} | {_cell(f'`{h.constraint}`')} | {_cell(h.doc)} |"
                 for k, h in spec.hyperparameters.items()]
        if hyper:
            parts += ["Hyperparameters (`hyper=` of `inference.fit`, `--hyper` of the command line):\n",
                      "| name | default | constraint | meaning |", "|---|---|---|---|", *hyper, ""]
        parts += ["| method | kind | what it does |", "|---|---|---|"]
        details = []
        for method in inference.methods_for(spec):
            meth = get_method(spec, method)
            doc = (meth.doc or meth.run.__doc__ or "").strip()
            parts.append(f"| `{method}` | {meth.kind} | {_cell(doc.split(chr(10) * 2)[0])} |")
            rows = [f"| `{k}` | {_option_value(o.default)} | " + _cell(
                    f"`{o.constraint}`" + (" one of " + ", ".join(f"`{c!r}`" for c in o.choices) if o.choices else ""))
                    + f" | {_cell(o.doc)} |" for k, o in meth.declared.items()]
            details += [f"`{model}` / `{method}` options:\n", "| option | default | constraint | meaning |",
                        "|---|---|---|---|", *rows, ""]
        parts += ["", "```{dropdown} Options of every method", "", *details, "```", ""]
        if spec.real_datasets:
            parts += ["Real datasets (`spec.real_data(name)`, shipped inside installed packages, no download):\n"]
            for name, ds in spec.real_datasets.items():
                parts.append(f"* **{name}** ({ds.source}; {ds.licence}): {ds.description}.")
            parts.append("")
    return "\n".join(parts) + "\n"


def _papers(notebooks: list[Path]) -> None:
    out = GEN / "papers"
    out.mkdir(parents=True, exist_ok=True)
    sections = _results_sections()
    by_stem = {p.stem: p for p in notebooks}
    for paper, info in PAPERS.items():
        (out / f"{paper}_methods.md").write_text(_paper_methods(paper))
        found = []
        for stem in info["notebooks"]:
            if stem in by_stem:
                found += [f"From [the `{stem}` notebook](../notebooks/{stem}.ipynb), as executed for this build:\n",
                          "```text", _findings(by_stem[stem]), "```", ""]
        (out / f"{paper}_findings.md").write_text("\n".join(found) + "\n")
        res = []
        for name in info["results"]:
            if name in sections:
                res += [f"### {name}\n", _shift_headings(sections[name], 1), ""]
        (out / f"{paper}_results.md").write_text("\n".join(res) + "\n")


def _guide_toc() -> None:
    """The guides (``guide/*.md``: layout, adding a model or a kernel, bad input, the command line in detail) in
    the navigation, when there are any."""
    toc = "```{toctree}\n:hidden:\n:glob:\n:caption: Guides\n\nguide/*\n```\n" if list(DOCS.glob("guide/*.md")) else ""
    (GEN / "guide_toc.md").write_text(toc)


def _generate() -> None:
    GEN.mkdir(exist_ok=True)
    _guide_toc()
    notebooks = _prepare_notebooks()
    _gallery(notebooks)
    _cli()
    _api()
    _results()
    _papers(notebooks)


_generate()


def setup(app):
    app.connect("builder-inited", _warn_missing_headlines)
    app.connect("autodoc-process-docstring", _docstring_as_text_when_not_rst)
    if (DOCS / "_static" / "gallery.css").exists():
        app.add_css_file("gallery.css")
