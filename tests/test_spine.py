"""The spine: fit() on a conjugate toy model registered only here, DataTree contents, log densities,
determinism, save/load, bad input, and the kernel registration route."""

from __future__ import annotations

import functools
import os

import arviz_stats as azs
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import xarray as xr
from numpyro.infer.util import log_density
from scipy.stats import norm

import inference
import zoo
from inference import Draws, register_method
from inference._methods import _METHODS
from inference._timing import Stopwatch

MU0, TAU0, SIGMA = 0.5, 2.0, 1.0
CALLS = {"model": 0}


def normal_model(y, mu0=MU0, tau0=TAU0, sigma=SIGMA):
    """mu ~ N(mu0, tau0^2); y_i ~ N(mu, sigma^2)."""
    CALLS["model"] += 1
    mu = numpyro.sample("mu", dist.Normal(mu0, tau0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def simulate(seed, n=25):
    rng = np.random.default_rng(seed)
    mu = rng.normal(MU0, TAU0)
    return {"y": rng.normal(mu, SIGMA, n)}, {"mu": mu}


def exact_posterior(y, mu0=MU0, tau0=TAU0, sigma=SIGMA):
    """Conjugate normal-normal: precision 1/tau0^2 + n/sigma^2, mean (mu0/tau0^2 + sum y/sigma^2)/precision."""
    prec = 1 / tau0**2 + len(y) / sigma**2
    return (mu0 / tau0**2 + np.sum(y) / sigma**2) / prec, prec**-0.5


SPEC = zoo.ModelSpec(
    name="toy_normal", model=normal_model, simulate=simulate, paper="(test toy)",
    data_fields=(zoo.DataField("y", ("n",)),),
    hyperparameters={"mu0": zoo.Hyper(MU0, "any"), "tau0": zoo.Hyper(TAU0), "sigma": zoo.Hyper(SIGMA)},
)


@register_method("exact", kind="sampler", models=("toy_normal",), options={"num_samples": 1000})
def _exact(ctx):
    """Draws from the closed-form posterior (a kernel registered through the public route)."""
    m, s = exact_posterior(ctx.data["y"], **ctx.hyper)
    mu = _exact_draws(ctx.key, m, s, ctx.options["num_samples"])
    return Draws(posterior={"mu": mu}, traces={"bound": np.arange(5.0)})


@functools.partial(jax.jit, static_argnums=3)
def _exact_draws(key, m, s, n):
    """``n`` draws of N(m, s^2) from ``key`` (one program, not one per operation)."""
    return m + s * jax.random.normal(key, (1, n))


@register_method("broken", kind="sampler", models=("toy_normal",), options={})
def _broken(ctx):
    return Draws(posterior={"mu": np.full((1, 10), np.nan)})


@pytest.fixture(scope="module", autouse=True)
def toy():
    zoo.register(SPEC, replace=True)
    yield SPEC
    zoo.unregister("toy_normal")


@pytest.fixture(scope="module")
def data():
    return simulate(3)[0]


@pytest.fixture(scope="module")
def nuts_tree(data):
    return inference.fit("toy_normal", data, "nuts", seed=11, num_warmup=500, num_samples=2000)


@pytest.fixture(scope="module")
def svi_tree(data):
    return inference.fit("toy_normal", data, "svi", seed=12, num_steps=4000, learning_rate=5e-3,
                         num_particles=8, num_samples=1000)


def _mcse_mean_sd(tree):
    mu = tree["posterior"]["mu"]
    ess_mean = float(azs.ess(tree, var_names=["mu"], method="mean")["mu"])
    ess_sd = float(azs.ess(tree, var_names=["mu"], method="sd")["mu"])
    sd = float(mu.std())
    return sd / np.sqrt(ess_mean), sd / np.sqrt(2 * ess_sd)


@pytest.mark.parametrize("which", ["nuts", "svi"])
def test_posterior_mean_and_sd_match_the_conjugate_closed_form_within_4_mcse(which, data, nuts_tree, svi_tree):
    tree = {"nuts": nuts_tree, "svi": svi_tree}[which]
    m, s = exact_posterior(data["y"])
    mu = tree["posterior"]["mu"].values.ravel()
    mcse_mean, mcse_sd = _mcse_mean_sd(tree)
    # tolerance: 4 Monte Carlo standard errors of the estimated mean / sd (ESS-based)
    assert abs(mu.mean() - m) < 4 * mcse_mean, (mu.mean(), m, mcse_mean)
    assert abs(mu.std() - s) < 4 * mcse_sd, (mu.std(), s, mcse_sd)


@pytest.mark.parametrize("which", ["nuts", "svi"])
def test_log_prior_plus_log_likelihood_equals_numpyro_log_density(which, data, nuts_tree, svi_tree):
    tree = {"nuts": nuts_tree, "svi": svi_tree}[which]
    mu = tree["posterior"]["mu"].values
    ours = tree["log_prior"]["mu"].values + tree["log_likelihood"]["y"].values.sum(-1)
    oracle = jax.jit(jax.vmap(lambda v: log_density(normal_model, (), {"y": data["y"]}, {"mu": v})[0]))
    theirs = np.asarray(oracle(mu[:, :50].ravel())).reshape(mu.shape[0], 50)
    np.testing.assert_allclose(ours[:, :50], theirs, rtol=0, atol=1e-8)


def test_tree_has_every_group_and_attr(nuts_tree, svi_tree):
    for tree in (nuts_tree, svi_tree):
        assert {"posterior", "sample_stats", "log_likelihood", "log_prior", "observed_data"} <= set(tree.children)
        assert tree["posterior"]["mu"].dims == ("chain", "draw")
        assert tree["log_likelihood"]["y"].dims == ("chain", "draw", "n")  # named by the data contract
        for key in ("model", "method", "seed", "options", "package_versions", "compile_seconds", "run_seconds"):
            assert key in tree.attrs
        assert tree.attrs["compile_seconds"] > 0 and tree.attrs["run_seconds"] > 0
    assert nuts_tree["posterior"].sizes["chain"] == 2
    assert int(nuts_tree["sample_stats"]["diverging"].sum()) == 0
    assert svi_tree["sample_stats"]["elbo"].dims == ("iteration",)
    assert svi_tree["sample_stats"]["log_q"].dims == ("chain", "draw")
    np.testing.assert_array_equal(nuts_tree["observed_data"]["y"].values, simulate(3)[0]["y"])


def test_svi_log_q_is_the_guide_density_at_its_draws_including_the_jacobian():
    """AutoNormal on (mu, sigma>0): q is Normal on (mu, log sigma), so in the constrained space
    log q = N(mu; m1, s1) + N(log sigma; m2, s2) - log sigma."""
    from inference.svi import guide_draws, make_guide

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1))
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)

    guide = make_guide(model, "normal")
    y = jnp.array([0.3, -0.2, 1.1])
    with numpyro.handlers.seed(rng_seed=0):
        guide(y=y)  # materialise the parameters
    params = {"mu_auto_loc": jnp.array(0.2), "mu_auto_scale": jnp.array(0.3),
              "sigma_auto_loc": jnp.array(-0.5), "sigma_auto_scale": jnp.array(0.4)}
    draws, log_q = guide_draws(guide, params, jax.random.key(0), 200, {"y": y})
    log_sigma = np.log(np.asarray(draws["sigma"]))
    expected = norm.logpdf(np.asarray(draws["mu"]), 0.2, 0.3) + norm.logpdf(log_sigma, -0.5, 0.4) - log_sigma
    np.testing.assert_allclose(log_q, expected, atol=1e-10)


def test_arviz_loo_and_psense_summary_run_on_fit_trees(nuts_tree, svi_tree):
    import arviz as az

    for tree in (nuts_tree, svi_tree):
        loo = az.loo(tree)
        assert np.isfinite(loo.elpd)
        table = az.psense_summary(tree)
        assert list(table.index) == ["mu"] and np.isfinite(table.loc["mu", "prior"])


@pytest.mark.parametrize("method,opts", [("nuts", {"num_warmup": 100, "num_samples": 100}),
                                         ("svi", {"num_steps": 200, "num_samples": 100}),
                                         ("exact", {})])
def test_same_seed_same_options_give_identical_draws(method, opts, data):
    a = inference.fit("toy_normal", data, method, seed=5, **opts)
    b = inference.fit("toy_normal", data, method, seed=5, **opts)
    c = inference.fit("toy_normal", data, method, seed=6, **opts)
    np.testing.assert_array_equal(a["posterior"]["mu"].values, b["posterior"]["mu"].values)
    assert not np.array_equal(a["posterior"]["mu"].values, c["posterior"]["mu"].values)


def test_a_registered_kernel_goes_through_fit_with_traces_and_log_densities(data):
    tree = inference.fit("toy_normal", data, "exact", seed=1, num_samples=4000)
    m, s = exact_posterior(data["y"])
    mu = tree["posterior"]["mu"].values.ravel()
    assert abs(mu.mean() - m) < 4 * s / np.sqrt(mu.size)  # 4 MCSE of iid draws
    assert tree["sample_stats"]["bound"].dims == ("iteration",)
    assert tree["log_prior"]["mu"].shape == (1, 4000)


def test_hyperparameters_reach_the_model(data):
    tree = inference.fit("toy_normal", data, "exact", seed=1, tau0=0.01, mu0=-3.0)
    assert abs(float(tree["posterior"]["mu"].mean()) + 3.0) < 0.05  # a tight prior at -3 dominates


def test_non_finite_draws_raise_instead_of_returning_nans(data):
    with pytest.raises(inference.NonFiniteError, match="non-finite"):
        inference.fit("toy_normal", data, "broken", seed=0)


def test_save_load_round_trip_is_identical(tmp_path, nuts_tree):
    path = inference.save(nuts_tree, tmp_path / "sub" / "tree.nc")
    back = inference.load(path)
    for group in ("posterior", "sample_stats", "log_likelihood", "log_prior", "observed_data"):
        xr.testing.assert_identical(back[group].to_dataset(), nuts_tree[group].to_dataset())
    assert back.attrs["model"] == "toy_normal"


def test_interrupted_save_leaves_no_partial_file(tmp_path, nuts_tree, monkeypatch):
    target = tmp_path / "tree.nc"
    inference.save(nuts_tree, target)
    before = target.read_bytes()

    def explode(self, path, **kw):
        with open(path, "wb") as f:
            f.write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(xr.DataTree, "to_netcdf", explode)
    with pytest.raises(KeyboardInterrupt):
        inference.save(nuts_tree, target)
    assert target.read_bytes() == before  # the old complete file is untouched
    assert os.listdir(tmp_path) == ["tree.nc"]  # no temporary left behind


BAD_INPUTS = [
    ("unknown model", dict(model="nope"), "model: unknown model 'nope'"),
    ("unknown method", dict(method="gibbs"), "method: 'toy_normal' supports"),
    ("data not a dict", dict(data=[1.0, 2.0]), "data: expected a dict"),
    ("missing key", dict(data={}), "data: missing required key 'y'"),
    ("unknown key", dict(data={"y": np.ones(3), "x": np.ones(3)}), r"unexpected key\(s\) \['x'\]"),
    ("wrong ndim", dict(data={"y": np.ones((3, 2))}), r"data\['y'\]: expected 1 axes"),
    ("NaN in data", dict(data={"y": np.array([1.0, np.nan])}), r"data\['y'\]: contains 1 NaN/inf"),
    ("inf in data", dict(data={"y": np.array([1.0, np.inf])}), r"data\['y'\]: contains 1 NaN/inf"),
    ("non-positive hyper", dict(options={"tau0": 0.0}), "tau0: expected a positive number, got 0.0"),
    ("num_samples < 1", dict(options={"num_samples": 0}), "num_samples: expected a positive integer"),
    ("unknown option", dict(options={"num_sample": 10}), "num_sample: not an option of method 'nuts'"),
    ("bad seed", dict(seed=-1), r"seed: expected an integer in \[0, 2\*\*63 - 1\]"),
    ("bad guide", dict(method="svi", options={"guide": "flow"}), "guide: expected one of"),
]


@pytest.mark.parametrize("case,kwargs,message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises_value_error_naming_the_argument_before_any_work(case, kwargs, message, data):
    CALLS["model"] = 0
    args = {"model": "toy_normal", "data": data, "method": "nuts", "seed": 0, "options": {}} | kwargs
    with Stopwatch() as sw, pytest.raises(ValueError, match=message):
        inference.fit(args["model"], args["data"], args["method"], seed=args["seed"], **args["options"])
    assert CALLS["model"] == 0 and sw.compile_seconds == 0.0  # nothing traced or compiled


def test_stopwatch_separates_compile_from_run():
    f = jax.jit(lambda x: jnp.sin(x) @ jnp.cos(x).T + 1.2345)
    x = np.ones((64, 64))
    with Stopwatch() as first:
        f(x).block_until_ready()
    with Stopwatch() as second:
        f(x).block_until_ready()
    assert first.compile_seconds > 0
    assert second.compile_seconds == 0.0
    assert first.run_seconds >= 0 and first.wall_seconds >= first.compile_seconds


def test_registry_lists_and_rejects_duplicates():
    assert "toy_normal" in zoo.list_models()
    with pytest.raises(ValueError, match="already registered"):
        zoo.register(SPEC.__class__(**{**SPEC.__dict__}))


def test_methods_registered_for_one_model_are_not_offered_to_others():
    assert ("toy_normal", "exact") in _METHODS and (None, "exact") not in _METHODS


def test_the_registry_says_which_methods_serve_a_model():
    """``methods_for``: the generic methods, then the model's kernels in registration order (the spec lists none)."""
    assert inference.methods_for(SPEC)[:2] == ["nuts", "svi"]
    assert {"exact", "broken"} <= set(inference.methods_for("toy_normal"))
    assert inference.methods_for("bpca") == ["nuts", "svi", "vbem", "badmm", "dppca"]
    assert "exact" not in inference.methods_for("bpca")
    with pytest.raises(ValueError, match=r"supports methods \['nuts', 'svi', 'vbem', 'badmm', 'dppca'\], got 'exact'"):
        inference.fit("bpca", {}, "exact", seed=0)


def test_prepare_run_build_is_fit(data):
    """``fit`` is ``build(run(prepare(...)))``: same draws, same groups; ``prepare`` fails before any work."""
    prepared = inference.prepare("toy_normal", data, "exact", seed=4, num_samples=30, tau0=0.5)
    assert prepared.method.name == "exact" and prepared.context.hyper["tau0"] == 0.5
    draws = inference.run(prepared)
    tree = inference.build(prepared, draws)
    same = inference.fit("toy_normal", data, "exact", seed=4, num_samples=30, tau0=0.5)
    np.testing.assert_array_equal(tree["posterior"]["mu"].values, same["posterior"]["mu"].values)
    assert set(tree.children) == set(same.children)
    with pytest.raises(ValueError, match="num_samples: expected a positive integer"):
        inference.prepare("toy_normal", data, "exact", seed=4, num_samples=0)


def test_model_modules_are_attributes_of_a_fresh_zoo_import():
    """README and notebooks write ``zoo.hlcr.simulate`` right after ``import zoo`` (a fresh interpreter:
    the lazy namespace must import the model module on first use)."""
    import subprocess
    import sys

    code = "import zoo; print(zoo.hlcr.simulate.__name__, zoo.ssgp.simulate_lmm.__name__, zoo.gp_alps.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["simulate", "simulate_lmm", "zoo.gp_alps"]
