"""Our references in posteriordb's layout (issue 32, items 1-3): ``diagnostics.posteriordb``.

The independent oracle is the ``posteriordb`` Python package (PyPI, 0.2): it reads what we export through its own
paths and keys (``PosteriorDatabase(path).posterior(name).reference_draws()``, ``.data.values()``, the model's code
path). Tolerances: the draws and data travel as JSON, whose float text round-trips float64 exactly, so means are
compared to 1e-12 relative (a wrong chain, component order or index base moves them by far more).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

import diagnostics
import zoo
from diagnostics import posteriordb as pdb
from diagnostics import references
from diagnostics.view import compared_posterior, compared_views
from inference import load
from inference.trees import data_of, problem_of

posteriordb = pytest.importorskip("posteriordb")

FIXTURE = Path(__file__).resolve().parent / "data" / "posteriordb"
SMALL = ("hlcr", "b2")          # the smallest stored reference (0.9 MB; a mixture: label-invariant summaries)


def _one_based_means(ds: xr.Dataset) -> dict[str, float]:
    """label (posteriordb's 1-based names) -> mean, from our compared dataset, computed here independently of the
    exporter's naming code."""
    out = {}
    for name, da in ds.data_vars.items():
        if not np.issubdtype(da.dtype, np.floating):
            continue
        values = da.transpose("chain", "draw", ...).values
        for idx in np.ndindex(*values.shape[2:]):
            label = name if not idx else f"{name}[{','.join(str(i + 1) for i in idx)}]"
            out[label] = float(values[(slice(None), slice(None), *idx)].mean())
    return out


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(stored tree, its compared dataset, the database root it was exported to, posterior name)."""
    root = tmp_path_factory.mktemp("pdb")
    tree = load(references.reference_path(*SMALL))
    name = pdb.export_reference(tree, root, SMALL[1])
    return tree, compared_posterior(tree), root, name


def test_posteriordb_package_reads_our_export_names_draw_counts_means_and_data(small):
    tree, ds, root, name = small
    db = posteriordb.PosteriorDatabase(str(root))
    assert name == "hlcr_b2-hlcr" and name in db.posterior_names()
    post = db.posterior(name)
    assert post.model.name == "hlcr" and post.data.name == "hlcr_b2"
    draws = post.reference_draws()
    ours = _one_based_means(ds)
    assert len(draws) == ds.sizes["chain"] == 4
    assert all(sorted(chain) == sorted(ours) for chain in draws)          # names: every compared scalar, 1-based
    assert {len(v) for chain in draws for v in chain.values()} == {ds.sizes["draw"]}
    for label, mean in ours.items():
        theirs = np.mean([x for chain in draws for x in chain[label]])
        assert theirs == pytest.approx(mean, rel=1e-12, abs=1e-12), label
    # the info's summary statistics say the same
    summary = json.loads((root / "reference_posteriors/summary_statistics/mean_value/mean_value" /
                          f"{name}.json").read_text())
    np.testing.assert_allclose(summary["mean_value"], [ours[k] for k in summary["names"]], rtol=1e-12, atol=1e-12)
    info = post.reference_draws_info()
    assert info["diagnostics"]["nchains"] == 4 and info["diagnostics"]["ndraws"] == 4000
    assert info["diagnostics"]["divergent_transitions"] == [0, 0, 0, 0]
    assert info["checks_made"]["bayes_zoo_health_rule"] is True and info["checks_made"]["ndraws_is_10k"] is False
    assert info["versions"]["numpyro"]
    # data: every field exactly, and the hyperparameters of the reference beside them
    spec, data, hyper = problem_of(tree)
    values = post.data.values()
    assert set(values) == set(data) | set(hyper)
    for k, v in data.items():
        np.testing.assert_array_equal(np.asarray(values[k]), v)
    assert {k: values[k] for k in hyper} == hyper
    model_info = post.model.information
    assert "label-invariant summaries" in model_info["description"]
    assert Path(post.model.code_file_path("numpyro")).is_file()


def _check_model_code(tree: xr.DataTree, root: Path, name: str, draws_at=(0, 500, 999)) -> None:
    """The exported models/numpyro/<model>.py, loaded from the file posteriordb points at, on posteriordb's data
    dict: its log joint density at stored draws (chain 1, draws ``draws_at`` of the reference's model-check points,
    ``references.check_points``: every site, log p(theta, y) as the fit computed it) equals the stored log prior +
    log likelihood (1e-9 relative)."""
    from numpyro.infer.util import log_density

    post = posteriordb.PosteriorDatabase(str(root)).posterior(name)
    spec = importlib.util.spec_from_file_location(f"pdb_{post.model.name}", post.model.code_file_path("numpyro"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = post.data.values()
    draws, log_joint = references.check_points(tree)
    for d in draws_at:
        params = {k: draws[k].sel(draw=d).values[1] for k in draws.data_vars}
        value = float(log_density(module.model, (data,), {}, params)[0])
        stored = float(log_joint.sel(draw=d).values[1])
        assert value == pytest.approx(stored, rel=1e-9), (name, d)


def test_exported_numpyro_code_evaluates_the_references_log_density_on_the_exported_data(small):
    tree, _, root, name = small
    _check_model_code(tree, root, name)


def _candidates(tree: xr.DataTree) -> dict[str, xr.DataTree]:
    """Cheap candidate trees of the stored reference's own model and data: a sampler made of two of its chains
    (agrees), and an approximation with w shifted by 0.5 (disagrees)."""
    two = tree.isel(chain=[0, 1], missing_dims="ignore")
    two.attrs["method"] = "nuts"
    shifted = tree.isel(chain=[2, 3], missing_dims="ignore")
    post = shifted["posterior"].to_dataset()
    shifted["posterior"] = xr.DataTree(post.assign(w=post["w"] + 0.5))
    shifted.attrs["method"] = "svi"
    return {"nuts": two, "svi": shifted}


def _same_scorecards(stored: xr.DataTree, imported: xr.DataTree, candidates) -> list[str]:
    """Compare the scorecards and verdicts of ``candidates`` against the two references; returns the verdicts."""
    views = compared_views(candidates)
    a, b = diagnostics.scorecard(stored, views), diagnostics.scorecard(imported, views)
    assert list(a["parameter"]) == list(b["parameter"]) and len(a) > 0
    numeric = [c for c in a.columns if a[c].dtype.kind == "f"]
    np.testing.assert_allclose(b[numeric].to_numpy(float), a[numeric].to_numpy(float), rtol=1e-9, atol=1e-12)
    sa, sb = diagnostics.method_scores(stored, views), diagnostics.method_scores(imported, views)
    assert list(sa["verdict"]) == list(sb["verdict"]) and list(sa["reasons"]) == list(sb["reasons"])
    numeric = [c for c in sa.columns if sa[c].dtype.kind == "f"]
    np.testing.assert_allclose(sb[numeric].to_numpy(float), sa[numeric].to_numpy(float), rtol=1e-9, atol=1e-12)
    return list(sa["verdict"])


def test_import_round_trips_our_export_with_the_same_health_scorecard_and_verdicts(small):
    tree, ds, root, name = small
    imported = diagnostics.reference_from_posteriordb(root, name)
    got = compared_posterior(imported)
    assert set(got.data_vars) == set(ds.data_vars)
    for k in ds.data_vars:
        assert got[k].dims == ds[k].dims
        np.testing.assert_allclose(got[k].values, ds[k].values, rtol=1e-12, atol=0)
    assert list(got["coclust"].coords[got["coclust"].dims[2]].values) == list(
        ds["coclust"].coords[ds["coclust"].dims[2]].values)                # the pair labels travel
    h_imp, h_ref = diagnostics.reference_health(imported), diagnostics.reference_health(tree)
    for key in ("n_chains", "n_draws", "divergences", "reliable", "failures"):
        assert h_imp[key] == h_ref[key], key
    for key in ("max_rhat", "min_ess_bulk", "min_ess_tail", "min_ebfmi"):
        assert h_imp[key] == pytest.approx(h_ref[key], rel=1e-9), key
    record = json.loads(imported.attrs["validation"])
    assert record["second_seed"]["max_abs_z"] == json.loads(tree.attrs["validation"])["second_seed"]["max_abs_z"]
    assert record["posteriordb"]["name"] == name
    data, hyper = pdb.posteriordb_data(imported)
    assert references.data_mismatch(problem_of(tree)[0], data_of(tree), data) is None
    assert hyper == problem_of(tree)[2]
    verdicts = _same_scorecards(tree, imported, _candidates(tree))
    assert verdicts == ["PASS", "FAIL"]          # the check can tell agreement from disagreement


def test_shipped_fixture_reads_with_known_draws_in_place_and_its_health_judged():
    """tests/data/posteriordb: 4 chains x 5 draws, component k of chain c, draw d holds 1000 c + d + k / 100, names in
    Stan's column-major order; one divergence in chain 2. Read by the posteriordb package and by our import."""
    name = "tiny-normal_means"
    draws = posteriordb.PosteriorDatabase(str(FIXTURE)).posterior(name).reference_draws()
    assert len(draws) == 4 and draws[1]["theta[2]"][3] == 1003.02
    tree = diagnostics.reference_from_posteriordb(FIXTURE, name)
    post = tree["posterior"]
    assert dict(post.sizes) == {"chain": 4, "draw": 5, "theta_dim_0": 2, "L_dim_0": 2, "L_dim_1": 2}
    c, d = np.meshgrid(np.arange(4), np.arange(5), indexing="ij")
    base = 1000.0 * c + d
    np.testing.assert_allclose(post["mu"].values, base)
    np.testing.assert_allclose(post["theta"].values, base[..., None] + np.array([0.01, 0.02]))
    np.testing.assert_allclose(post["L"].values, base[..., None, None] + np.array([[0.11, 0.12], [0.21, 0.22]]))
    assert tree["sample_stats"]["divergences_run"].values.tolist() == [0, 1, 0, 0]
    health = diagnostics.reference_health(tree)
    assert health["divergences"] == 1 and health["min_ebfmi"] == 0.9 and not health["reliable"]
    assert any("20 stored draws" in f for f in health["failures"])
    assert "model" not in tree.attrs                     # not one of ours: no data to fit, nothing summarised
    candidate = tree.isel(chain=[0], draw=[0]).copy()
    candidate.attrs = {"method": "point"}       # one draw: a point estimate, judged only by a healthy reference
    assert list(diagnostics.method_scores(tree, {"point": candidate})["verdict"]) == ["NOT JUDGED"]


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="^root:"):
        diagnostics.reference_from_posteriordb(tmp_path, "x-y")
    with pytest.raises(ValueError, match="^posterior_name: 'nope' is not a posterior.*tiny-normal_means"):
        diagnostics.reference_from_posteriordb(FIXTURE, "nope")
    with pytest.raises(ValueError, match="^posterior_name: 'tiny-no_reference' has no reference posterior"):
        diagnostics.reference_from_posteriordb(FIXTURE, "tiny-no_reference")
    with pytest.raises(ValueError, match="^tree: .*not a bayes-zoo model"):
        pdb.posteriordb_data(diagnostics.reference_from_posteriordb(FIXTURE, "tiny-normal_means"))
    with pytest.raises(ValueError, match="^reference_posteriordb: expected ROOT/NAME"):
        pdb.split_reference_argument("justaname")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="^root:"):
        pdb.export_posteriordb(tmp_path / "file")
    from zoo_cli.commands import app

    result = CliRunner().invoke(app, ["references", "--export-posteriordb", str(tmp_path / "db"), "--check"])
    assert result.exit_code == 2 and "does not go with --check" in result.output
    result = CliRunner().invoke(app, ["compare", "hlcr", "--reference-posteriordb", f"{FIXTURE}/tiny-normal_means"])
    assert result.exit_code == 2 and "is not of a bayes-zoo model" in " ".join(result.output.replace("│", " ").split())


@pytest.mark.slow
def test_every_stored_reference_exported_by_the_command_reads_back_and_round_trips(tmp_path):
    """``zoo references --export-posteriordb DIR`` writes every stored reference; the posteriordb package reads each
    (names, draw counts, means to 1e-12); each model's exported NumPyro code gives the stored log density; our import
    gives the same health, scorecard and verdicts as the stored reference for a candidate made of its own draws."""
    from zoo_cli.commands import app

    result = CliRunner().invoke(app, ["references", "--export-posteriordb", str(tmp_path)])
    assert result.exit_code == 0, result.output
    stored = [(m, t) for m in zoo.list_models() for t in references.stored_tags(m)]
    db = posteriordb.PosteriorDatabase(str(tmp_path))
    assert sorted(db.posterior_names()) == sorted(pdb.posterior_name(m, t) for m, t in stored)
    for model, tag in stored:
        tree = load(references.reference_path(model, tag))
        ds = compared_posterior(tree)
        name = pdb.posterior_name(model, tag)
        draws = db.posterior(name).reference_draws()
        ours = _one_based_means(ds)
        assert all(sorted(chain) == sorted(ours) for chain in draws), name
        assert sum(len(chain[next(iter(ours))]) for chain in draws) == ds.sizes["chain"] * ds.sizes["draw"]
        for label, mean in ours.items():
            assert np.mean([x for chain in draws for x in chain[label]]) == pytest.approx(mean, rel=1e-12,
                                                                                         abs=1e-12), (name, label)
        _check_model_code(tree, tmp_path, name, draws_at=(0, 999))
        imported = diagnostics.reference_from_posteriordb(tmp_path, name)
        assert diagnostics.reference_health(imported)["failures"] == diagnostics.reference_health(tree)["failures"]
        two = tree.isel(chain=[0, 1], missing_dims="ignore")
        two.attrs["method"] = "nuts"
        _same_scorecards(tree, imported, {"nuts": two})


@pytest.mark.slow
def test_zoo_compare_against_an_imported_reference_gives_the_stored_references_verdicts(small, tmp_path):
    """``zoo compare hlcr --methods vbem,gibbs --reference-posteriordb ROOT/hlcr_b2-hlcr`` fits on the posterior's
    data and hyperparameters; the fitted trees get the same verdicts against the stored reference."""
    from zoo_cli.commands import app

    tree, _, root, name = small
    result = CliRunner().invoke(app, ["compare", "hlcr", "--methods", "vbem,gibbs", "--reference-posteriordb",
                                      f"{root}/{name}", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "hlcr" / "posteriordb"
    summary = json.loads((folder / "summary.json").read_text())
    trees = {m: load(folder / f"{m}.nc") for m in ("vbem", "gibbs")}
    for t in trees.values():
        assert references.data_mismatch(problem_of(tree)[0], data_of(t), data_of(tree)) is None
        assert problem_of(t)[2] == problem_of(tree)[2]
    verdicts = _same_scorecards(tree, diagnostics.reference_from_posteriordb(root, name), trees)
    assert verdicts == [summary["methods"][m]["verdict"] for m in trees]


@pytest.mark.slow
@pytest.mark.parametrize("model", zoo.list_models())
def test_every_demo_pair_gets_the_same_verdicts_against_the_imported_reference(model, tmp_path):
    """Each model's demo fits (``run_comparison``: every method, demo options, on the stored reference's data) get the
    same verdicts and reasons against the posteriordb export of that reference, read back, as against the stored
    one."""
    from diagnostics.comparison import run_comparison
    from inference import methods_for

    spec = zoo.get(model)
    trees = run_comparison(spec, methods_for(spec), tmp_path / "fits", log=lambda line: None)
    label, stored = next(iter(trees.items()))
    assert label.startswith("reference")
    name = pdb.export_reference(stored, tmp_path / "db", stored.attrs["reference_tag"])
    imported = diagnostics.reference_from_posteriordb(tmp_path / "db", name)
    views = compared_views({k: v for k, v in trees.items() if k != label})
    a, b = diagnostics.method_scores(stored, views), diagnostics.method_scores(imported, views)
    assert list(a["verdict"]) == list(b["verdict"]) and list(a["reasons"]) == list(b["reasons"])
