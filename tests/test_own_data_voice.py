"""Issue 29, items 3-5: the user's names in every verdict, table and plot; Python results that speak (the reprs
of ``compare`` and ``method_scores``, the scorecard's warning on an unhealthy reference, tolerance columns in the
units of the method's rule); quiet off a terminal (no progress bar, warnings a user cannot act on said once).

Cheap data throughout: the Gaussian toys of ``diag_toys`` (closed-form posteriors, iid "exact" draws) and hand-made
trees; the command-line run is the conjugate toy of ``test_spine`` in a subprocess whose stderr is a pipe."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from diag_toys import LINREG

import diagnostics
import inference
import zoo
from diagnostics.scoring import NOT_JUDGED, SD_RATIO_RANGE, MethodScores, method_scores
from inference.progress import explained_warnings


@pytest.fixture(scope="module", autouse=True)
def toys():
    zoo.register(LINREG, replace=True)
    yield
    zoo.unregister(LINREG.name)


@pytest.fixture(scope="module")
def data():
    return LINREG.default_data()[0]


@pytest.fixture(scope="module")
def reference(data):
    return inference.fit("dq_linreg", data, "exact", seed=1, num_samples=1000, num_chains=4)


@pytest.fixture(scope="module")
def fits(data):
    return {"exact_q": inference.fit("dq_linreg", data, "exact_q", seed=2),
            "narrow": inference.fit("dq_linreg", data, "narrow", seed=4, factor=0.5, num_samples=4000)}


def test_method_scores_repr_is_the_verdict_list_and_the_table_stays_a_dataframe(reference, fits):
    scores = method_scores(reference, fits, joint=False)
    text = repr(scores)
    lines = text.splitlines()
    assert lines[0] == "exact_q: PASS" and len(lines) == 2, text
    assert lines[1].startswith("narrow: FAIL: too narrow: sd of beta[") and "x the reference's" in lines[1], text
    assert scores._repr_html_().startswith("<pre>exact_q: PASS\nnarrow: FAIL: too narrow")
    # still the DataFrame every caller uses: columns, .loc, set_index, to_csv
    assert isinstance(scores, MethodScores) and list(scores["verdict"]) == ["PASS", "FAIL"]
    indexed = scores.set_index("method")
    assert indexed.loc["narrow", "verdict"] == "FAIL" and "max_std_mean_error" in indexed.columns
    assert "max_std_mean_error" in scores.to_string() and type(scores.table) is pd.DataFrame
    assert type(scores[scores["verdict"] == "FAIL"]) is pd.DataFrame     # derived frames are plain DataFrames


def test_scorecard_warns_naming_the_failed_check_when_its_reference_is_unhealthy(data, fits):
    two_chains = inference.fit("dq_linreg", data, "exact", seed=8, num_samples=3000, num_chains=2)
    with pytest.warns(UserWarning, match=r"health rule \(2 chains \(need at least 4\)"):
        card = diagnostics.scorecard(two_chains, {"exact_q": fits["exact_q"]})
    assert not card["reliable"].any()
    scores = method_scores(two_chains, {"exact_q": fits["exact_q"]}, card=card, joint=False)
    assert scores.loc[0, "verdict"] == NOT_JUDGED
    assert repr(scores).splitlines()[-1] == "reference NOT healthy, nothing judged: 2 chains (need at least 4)"


def test_a_healthy_reference_gives_no_warning(reference, fits):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        diagnostics.scorecard(reference, fits)


def test_tolerance_columns_are_the_rule_of_the_methods_kind(reference, fits):
    """An approximation's sd rule is the ratio range 0.8-1.25: ``sd_tol`` is the |sd - sd_ref| it allows on the
    side the method is on (0.2 sd_ref below, 0.25 sd_ref above), not the 1e-9 float floor; a sampler's is
    z_crit combined Monte Carlo errors of the sd."""
    card = diagnostics.scorecard(reference, {**fits, "ref_again": reference})
    lo, hi = SD_RATIO_RANGE
    approx = card[card["rule"] == "practical"]
    below = approx["sd"] < approx["sd_ref"]
    expected = np.where(below, (1 - lo) * approx["sd_ref"], (hi - 1) * approx["sd_ref"])
    np.testing.assert_allclose(approx["sd_tol"], expected, rtol=1e-12)
    assert (approx["sd_tol"] > 1e-3).all()
    assert (approx["sd_ok"] == ((approx["sd"] - approx["sd_ref"]).abs() <= approx["sd_tol"])).all()
    mcse = card[card["rule"] == "MCSE"]
    z_crit = card.attrs["z_critical"]["ref_again"]
    assert (mcse["sd_tol"] <= z_crit * np.sqrt(2) * mcse["sd_ref"]).all()   # of order an MCSE, not of the sd


def test_explained_warnings_says_once_what_a_warning_nobody_can_act_on_means_and_keeps_the_others():
    said = []
    with pytest.warns(RuntimeWarning, match="act on this") as record:
        with explained_warnings(said.append):
            for _ in range(3):
                warnings.warn("Out-of-support values provided to log prob method. The value argument should be "
                              "within the support.", UserWarning, stacklevel=1)
            warnings.warn("act on this", RuntimeWarning, stacklevel=1)
    assert not [w for w in record if "Out-of-support" in str(w.message)]
    assert len(said) == 1 and "Out-of-support" not in said[0] and "outside its distribution's support" in said[0]
    assert "nothing to change" in said[0]


DRIVER = ("import sys; sys.path.insert(0, 'tests'); import test_spine, zoo; "
          "zoo.register(test_spine.SPEC, replace=True); from zoo_cli import app; app(prog_name='zoo')")


def test_zoo_compare_off_a_terminal_prints_no_progress_bar_and_no_unexplained_warning(tmp_path):
    """``zoo compare --data`` with stderr a pipe (as under cron, CI or a notebook's subprocess): the NUTS reference
    and its second seed, the method and the report print their lines and verdicts, and nothing on stderr."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "toy.csv"
    pd.DataFrame({"y": np.random.default_rng(0).normal(0.7, 1.0, 30)}).to_csv(path, index=False)
    args = ["compare", "toy_normal", "--data", str(path), "--methods", "exact", "--out", str(tmp_path / "out"),
            "--cache-dir", str(tmp_path / "cache"), "--reference", "num_warmup=300", "--reference", "num_samples=1000"]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", DRIVER, *args], cwd=root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "toy_normal/exact: " in run.stdout and "comparison written to" in run.stdout
    assert "it/s" not in run.stderr and "%|" not in run.stderr, run.stderr[-2000:]   # tqdm's bars
    assert "Warning" not in run.stderr and "warn" not in run.stderr.lower(), run.stderr[-2000:]


# ------------------------------------------------------------------------------------------- the user's names


def _abs_and_sorted(post, data, hyper):
    """Summaries of the labelled toy: |beta| per feature (indexed by position, as zoo's summaries index a feature
    dim) and beta sorted (ranks: positional by nature)."""
    b = post["beta"].transpose("chain", "draw", ...).values
    return xr.Dataset({"abs_beta": (("chain", "draw", "feature"), np.abs(b)),
                       "beta_sorted": (("chain", "draw", "rank"), np.sort(b, axis=-1))},
                      coords={"feature": np.arange(b.shape[-1]), "rank": np.arange(b.shape[-1])})


LABELLED = dataclasses.replace(
    LINREG, data_fields=(zoo.DataField("X", ("n", "F")), zoo.DataField("y", ("n",))), dims={"beta": ["feature"]},
    axis_dims={"F": "feature"}, summaries=_abs_and_sorted)
POSITIONAL = re.compile(r"(abs_beta|beta)\[[01]\]")   # a feature named by its position where the table names it


@pytest.fixture(scope="module")
def labelled_page(tmp_path_factory, data):
    """The report of a comparison on a table with named columns (Bwt, Hwt): the reference made on the bare arrays
    (as ``diagnostics.compare`` makes it), the candidates fitted from the table; one too narrow, one shifted, so
    that verdicts name quantities."""
    frame = pd.DataFrame({"Bwt": data["X"][:, 0], "Hwt": data["X"][:, 1], "heart": data["y"]})
    columns = {"X": ["Bwt", "Hwt"], "y": "heart"}
    zoo.register(LABELLED, replace=True)
    try:
        ref = inference.fit("dq_linreg", data, "exact", seed=1, num_samples=1000, num_chains=4)
        trees = {"reference": ref,
                 "narrow": inference.fit("dq_linreg", frame, "narrow", seed=4, factor=0.5, num_samples=4000,
                                         columns=columns),
                 "shifted": inference.fit("dq_linreg", frame, "shifted", seed=5, shift=0.6, columns=columns),
                 "two_chains": inference.fit("dq_linreg", frame, "ar1", seed=6, num_samples=300, columns=columns)}
        out = tmp_path_factory.mktemp("labelled")
        page = diagnostics.report("dq_linreg", trees, out)
        yield page, json.loads((out / "summary.json").read_text()), trees
    finally:
        zoo.register(LINREG, replace=True)


def test_every_verdict_and_table_of_a_labelled_table_names_its_columns(labelled_page):
    page, summary, _ = labelled_page
    html = page.read_text()
    reasons = " ".join(v["reasons"] for v in summary["methods"].values())
    assert summary["methods"]["narrow"]["verdict"] == "FAIL", reasons
    assert "abs_beta[Hwt]" in reasons and "abs_beta[Bwt]" in reasons, reasons
    assert "beta_sorted[0]" in html or "beta_sorted[1]" in html        # ranks stay positions
    for where, text in (("verdicts", reasons), ("summary.json", json.dumps(summary)), ("report.html", html),
                        ("scorecard.csv", (page.parent / "scorecard.csv").read_text()),
                        ("methods.csv", (page.parent / "methods.csv").read_text())):
        assert not POSITIONAL.search(text), (where, POSITIONAL.search(text).group(0))
    for label in ("abs_beta[Bwt]", "abs_beta[Hwt]"):
        assert label in (page.parent / "scorecard.csv").read_text() and html.count(label) >= 2


def test_the_glossary_explains_every_quantity_a_verdict_names(labelled_page):
    page, summary, _ = labelled_page
    named = set()
    for v in summary["methods"].values():
        named |= set(re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)\[[^\]]*\]", v["reasons"]))
    assert {"abs_beta", "beta_sorted"} & named, summary["methods"]
    terms = summary["glossary"]
    for name in named:
        assert any(t == name or t.startswith(name + "[") for t in terms), (name, list(terms))
    glossary = page.read_text().split("id='glossary'")[1]
    assert all(f"<dt>{name}" in glossary for name in named)


def test_the_glossary_has_an_entry_for_every_summary_of_every_model():
    """Every variable a registered model's summaries return (read from its stored reference: no fit) has its own
    entry in ``diagnostics.report_pages.QUANTITIES``, not the generic one."""
    from diagnostics.references import reference_path, stored_tags
    from diagnostics.report_pages import QUANTITIES
    from diagnostics.view import compared_posterior

    for name in zoo.list_models():
        if name == LINREG.name:
            continue
        tags = stored_tags(name)
        assert tags, name
        ds = compared_posterior(inference.load(reference_path(name, tags[0])))
        missing = [k for k in ds.data_vars if k not in QUANTITIES.get(name, {})]
        assert not missing, (name, missing)


def test_mppca_summaries_name_a_covariance_entry_by_its_two_features():
    from zoo.mppca import summaries

    rng = np.random.default_rng(0)
    post = xr.Dataset({"mu": (("chain", "draw", "feature"), rng.normal(size=(1, 5, 2))),
                       "Wt": (("chain", "draw", "column", "feature"), rng.normal(size=(1, 5, 1, 2))),
                       "tau": (("chain", "draw"), rng.gamma(2.0, size=(1, 5)))},
                      coords={"feature": ["Bwt", "Hwt"]})
    ds = diagnostics.view.with_user_labels(summaries(post, {}, {}), post)
    labels = list(diagnostics.view.per_scalar_draws(ds))
    assert labels == ["mu_sorted[0,Bwt]", "mu_sorted[0,Hwt]", "C_sorted[0,Bwt,Bwt]", "C_sorted[0,Bwt,Hwt]",
                      "C_sorted[0,Hwt,Hwt]", "tau"]
    C = ds["C_sorted"].sel(entry="Bwt,Hwt").values[0, :, 0]     # the covariance of the two features, by hand
    W = post["Wt"].values[0, :, 0, :]
    np.testing.assert_allclose(C, W[:, 0] * W[:, 1], rtol=1e-12)


def test_sensitivity_rows_and_plot_titles_use_the_scorecard_labels(labelled_page, tmp_path):
    _, _, trees = labelled_page
    zoo.register(LABELLED, replace=True)
    try:
        view = diagnostics.compared_view(trees["shifted"])
        table = diagnostics.sensitivity(view)
        assert list(table.index) == view.labels == ["abs_beta[Bwt]", "abs_beta[Hwt]", "beta_sorted[0]",
                                                    "beta_sorted[1]"]
        pc = diagnostics.plots.plot_sensitivity(view, tmp_path / "s.png")
        titles = {ax.get_title() for ax in pc.viz["figure"].item().axes} - {""}
        assert "abs_beta[Hwt], prior scaled" in titles and "beta_sorted[0], likelihood scaled" in titles, titles
    finally:
        zoo.register(LINREG, replace=True)


def test_compare_returns_a_result_whose_repr_is_the_verdict_list_and_shows_no_bar_off_a_terminal(tmp_path, capfd):
    """In process (pytest's stderr is not a terminal): the default progress shows no bar, and ``repr`` of the
    result is the verdict lines ``compare`` logged, one per method (as ``zoo compare`` prints them), then the
    page."""
    from test_spine import SPEC

    zoo.register(SPEC, replace=True)
    try:
        y = np.random.default_rng(0).normal(0.7, 1.0, 30)
        logged = []
        result = diagnostics.compare("toy_normal", {"y": y}, ["exact"], out=tmp_path / "out",
                                     cache_dir=tmp_path / "cache", log=logged.append,
                                     reference={"num_warmup": 300, "num_samples": 1000})
    finally:
        zoo.unregister(SPEC.name)
    verdicts = [line.strip().removeprefix("toy_normal/") for line in logged if line.startswith("  toy_normal/")]
    lines = repr(result).splitlines()
    assert lines == [*verdicts, f"report: {result.page}"] and lines[0].startswith("exact: "), (lines, logged)
    assert lines[0].split(": ")[1] == result.verdicts["exact"]
    assert result._repr_html_().startswith("<pre>exact: ")
    err = capfd.readouterr().err
    assert "it/s" not in err and "%|" not in err, err[-2000:]


def test_an_unhealthy_reference_made_on_the_bare_arrays_names_its_failures_by_the_tables_labels(data, tmp_path):
    """The validation record of a reference made on the bare arrays (``diagnostics.compare`` makes it so) names
    positions; next to candidates fitted from the table, its failures and advice read in the table's labels."""
    frame = pd.DataFrame({"Bwt": data["X"][:, 0], "Hwt": data["X"][:, 1], "heart": data["y"]})
    zoo.register(LABELLED, replace=True)
    try:
        ref = inference.fit("dq_linreg", data, "exact", seed=1, num_samples=1000, num_chains=4)
        ref.attrs["validation"] = json.dumps({
            "failures": ["second seed: means differ by 5.2 combined MCSE on abs_beta[1] (need < 4; 1 quantities "
                         "fail)"],
            "advice": ["abs_beta[1] and beta_sorted[0] disagree between seeds: run longer"]})
        cand = inference.fit("dq_linreg", frame, "exact_q", seed=2, columns={"X": ["Bwt", "Hwt"], "y": "heart"})
        diagnostics.report("dq_linreg", {"reference": ref, "exact_q": cand}, tmp_path)
    finally:
        zoo.register(LINREG, replace=True)
    summary = json.loads((tmp_path / "summary.json").read_text())
    health = summary["reference_health"]
    assert health["failures"] == ["second seed: means differ by 5.2 combined MCSE on abs_beta[Hwt] (need < 4; 1 "
                                  "quantities fail)"], health
    assert health["advice"] == ["abs_beta[Hwt] and beta_sorted[0] disagree between seeds: run longer"]
    assert summary["methods"]["exact_q"]["verdict"] == NOT_JUDGED
    assert not POSITIONAL.search((tmp_path / "report.html").read_text())
