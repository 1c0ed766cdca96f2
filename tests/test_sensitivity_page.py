"""Prior sensitivity on your own data (issue 19, part 4): ``zoo sensitivity MODEL --data FILE`` and
``diagnostics.sensitivity_report`` fit the data and write the power-scaling page.

The page is parsed (``html.parser``) and checked against ``diagnostics.sensitivity`` run on the fit the command
saved (a two-parameter model whose tight prior on mu fights the data, as in the prior_sensitivity notebook):
one row per compared quantity with its prior and likelihood sensitivity to the page's printed precision,
the Pareto k-hat of the power-scaling weights, and the flag in words; selective scaling (``--prior-sites``) is
named on the page and changes the k-hat of the prior weights (other log-prior components, other weights)."""

from __future__ import annotations

import html.parser
import json

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pandas as pd
import pytest
from test_frames import HLCR_COLUMNS, hlcr_frame
from typer.testing import CliRunner

import diagnostics
import inference
import zoo
from zoo_cli import app

runner = CliRunner()
GIBBS = {"num_warmup": 100, "num_samples": 500, "num_chains": 2}


class Tables(html.parser.HTMLParser):
    """Every <table> of a page as a list of rows of cell texts (header row first)."""

    def __init__(self):
        super().__init__()
        self.tables, self._row, self._cell = [], None, None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._row is not None:
            self._row.append(self._cell.strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[-1].append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def parse(page) -> tuple[str, list[list[list[str]]]]:
    text = page.read_text()
    parser = Tables()
    parser.feed(text)
    return text, parser.tables


def conflict_model(y, mu_scale=0.5):
    """mu ~ N(0, mu_scale^2), sigma ~ HalfNormal(5), y ~ N(mu, sigma^2): with data centred at 4 the tight prior on mu
    fights the data (the prior_sensitivity notebook's example)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, mu_scale))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


CONFLICT = zoo.ModelSpec(name="psense_conflict", model=conflict_model, simulate=lambda seed: ({}, {}),
                         data_fields=(zoo.DataField("y", ("n",)),), hyperparameters={"mu_scale": zoo.Hyper(0.5)})
NUTS = {"num_warmup": 300, "num_samples": 1000, "num_chains": 2}


@pytest.fixture
def conflict():
    zoo.register(CONFLICT, replace=True)
    yield
    zoo.unregister(CONFLICT.name)


def test_zoo_sensitivity_writes_the_power_scaling_page_of_selected_prior_sites(tmp_path, conflict):
    path = tmp_path / "measurements.csv"
    pd.DataFrame({"y": np.random.default_rng(0).normal(4.0, 1.5, 25)}).to_csv(path, index=False)
    args = ["sensitivity", "psense_conflict", "--data", str(path), "--method", "nuts", "--prior-sites", "mu",
            "--out", str(tmp_path / "out"), *[a for k, v in NUTS.items() for a in ("--set", f"{k}={v}")]]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    folder = tmp_path / "out" / "psense_conflict" / "sensitivity"
    text, tables = parse(folder / "sensitivity.html")
    assert "only the prior site(s) <b>mu</b>" in text
    assert (folder / "sensitivity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    header, *rows = tables[0]
    assert header == ["quantity", "prior", "likelihood", "khat_prior", "khat_likelihood", "flag"]
    # the oracle: the table function on the fit the command saved, selective scaling of mu
    tree = inference.load(folder / "nuts.nc")
    expected = diagnostics.sensitivity(tree, prior_sites=["mu"])
    assert [r[0] for r in rows] == list(expected.index) == ["mu", "sigma"]
    for row in rows:
        want = expected.loc[row[0]]
        for col, value in zip(header[1:5], row[1:5], strict=True):
            assert float(value) == pytest.approx(float(want[col]), rel=5e-3, abs=1e-3), (row[0], col)
        assert row[5] == want["flag"]
    assert rows[0][5].startswith("prior-data conflict")          # the tight prior on mu fights the data
    summary = json.loads((folder / "sensitivity.json").read_text())
    assert summary["prior_sites"] == ["mu"] and summary["khat_prior"] == pytest.approx(expected.attrs["khat_prior"])
    # every prior site: the same fit reused, other prior weights
    lines = []
    page = diagnostics.sensitivity_report("psense_conflict", pd.read_csv(path), "nuts", out=tmp_path / "out",
                                          options=NUTS, progress=False, log=lines.append)
    assert any("reusing" in line for line in lines)
    text_all, _ = parse(page)
    assert "scaling every prior site" in text_all
    every = json.loads((folder / "sensitivity.json").read_text())
    assert sorted(every["prior_sites"]) == ["mu", "sigma"]
    assert every["khat_prior"] != pytest.approx(summary["khat_prior"], rel=1e-6)


XLA_COMPILES: list[str] = []
XLA_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
jax.monitoring.register_event_time_span_listener(
    lambda event, *a, **k: XLA_COMPILES.append(event) if event == XLA_COMPILE_EVENT else None)


@pytest.mark.parametrize("sites", [["nope"], []])
def test_an_unknown_prior_site_is_rejected_before_the_fit(sites, tmp_path, monkeypatch):
    """The prior sites are listed by tracing the model abstractly (``jax.eval_shape``): one jaxpr trace, no XLA
    compilation, no fit."""
    monkeypatch.setattr(inference, "fit_prepared", lambda *a, **k: pytest.fail("the fit ran"))
    before = len(XLA_COMPILES)
    with pytest.raises(ValueError, match=r"^prior_sites: .* not among the prior sites of 'hlcr' "
                                         r"\(\['w', 'psi', 'theta'\]\)"):
        diagnostics.sensitivity_report("hlcr", hlcr_frame(), "gibbs", out=tmp_path, columns=HLCR_COLUMNS,
                                       prior_sites=sites, options=GIBBS)
    assert len(XLA_COMPILES) == before
    assert not any(tmp_path.iterdir())
