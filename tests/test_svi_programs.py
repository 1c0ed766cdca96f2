"""SVI compiled once per (model, guide settings, data shapes) (inference/svi.py, issue 18 part 3), with the same
draws as NumPyro's own ``SVI.run``, and non-finite fits as our ``NonFiniteError`` with advice (issue 18 part 4).

The toy model's prior is centred on the data (``mu ~ N(mean(y), 10)``), so the guide's initial location
(``init="median"``) depends on the data: a guide or program that kept the first fit's data would start the
second fit from the wrong place and miss NumPyro's trajectory on the second data set."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro import handlers
from numpyro.infer import SVI, Trace_ELBO

import inference
import zoo
from inference._timing import Stopwatch

# inference.svi is imported inside the tests: importing it here, at collection, would register "svi" before
# "nuts" and change the order inference.methods_for lists them in (tests/test_spine.py checks it).


def centred_model(y, spread=3.0):
    """sigma ~ HalfNormal(spread); mu ~ N(mean(y), 10^2); y_i ~ N(mu, sigma^2) (sites not in sorted order)."""
    sigma = numpyro.sample("sigma", dist.HalfNormal(spread))
    mu = numpyro.sample("mu", dist.Normal(jnp.mean(y), 10.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def simulate(seed, n=30, mu=None):
    rng = np.random.default_rng(seed)
    mu = rng.normal(0.0, 20.0) if mu is None else mu
    return {"y": rng.normal(mu, 1.5, n)}, {"mu": mu}


SPEC = zoo.ModelSpec(name="svi_centred", model=centred_model, simulate=simulate, paper="(test toy)",
                     data_fields=(zoo.DataField("y", ("n",)),),
                     hyperparameters={"spread": zoo.Hyper(3.0)})
STEPS, DRAWS = 300, 40   # 300 > CHUNK_STEPS (250): two chunks, the second one cut at num_steps


@pytest.fixture(scope="module", autouse=True)
def toy():
    zoo.register(SPEC, replace=True)
    yield
    zoo.unregister(SPEC.name)


def numpyro_svi_draws(y, seed, guide_kind, num_steps=STEPS, num_samples=DRAWS, learning_rate=1e-2,
                      model=centred_model):
    """The oracle: NumPyro's ``SVI.run`` (one ``lax.scan``, a fresh guide) on the same keys as ``run_svi``
    (``k_fit, k_draw = split(key(seed))``; draw i from the guide seeded with ``split(k_draw, S)[i]``)."""
    from inference.svi import make_guide

    kwargs = {"y": y, "spread": 3.0}
    guide = make_guide(model, guide_kind, "median")
    svi = SVI(model, guide, optax.adam(learning_rate), Trace_ELBO())
    k_fit, k_draw = jax.random.split(jax.random.key(seed))
    result = svi.run(k_fit, num_steps, progress_bar=False, stable_update=True, **kwargs)

    def one(k):
        tr = handlers.trace(handlers.seed(handlers.substitute(guide, data=result.params), k)).get_trace(**kwargs)
        return {name: tr[name]["value"] for name in ("mu", "sigma")}

    draws = jax.jit(jax.vmap(one))(jax.random.split(k_draw, num_samples))   # one program (eagerly: one per op)
    return draws, -np.asarray(result.losses), result.params


@pytest.mark.parametrize("guide", ["normal", "lowrank"])
def test_svi_after_a_fit_on_other_data_equals_numpyros_svi_run_on_its_own_data(guide):
    """Fit data set A (mean about -20), then B (mean +25, same shape): B's draws and ELBO trace equal NumPyro's
    SVI.run on B to 1e-8 relative (floating-point reordering only), and so do the stored guide parameters. A kept
    guide set up on A would start B's mu at mean(y_A) (45 away; Adam at 1e-2 moves it 3 in 300 steps): off by
    whole units, 1e8 times the tolerance. ``lowrank`` also covers the autoguide that closes over the data in its
    constraint map and packs the sites in one vector: in the model's order (sigma, mu) as NumPyro's eager set-up
    does, not in the sorted order a traced set-up gives (``auto_loc`` would be permuted)."""
    y_a, _ = simulate(1, mu=-20.0)
    y_b, _ = simulate(2, mu=25.0)
    inference.fit("svi_centred", y_a, "svi", seed=1, guide=guide, num_steps=STEPS, num_samples=DRAWS)
    tree = inference.fit("svi_centred", y_b, "svi", seed=2, guide=guide, num_steps=STEPS, num_samples=DRAWS)
    expected, elbo, params = numpyro_svi_draws(y_b["y"], 2, guide)
    np.testing.assert_allclose(tree["sample_stats"]["elbo"].values, elbo, rtol=1e-8)
    assert sorted(tree["variational"].data_vars) == sorted(params)
    for name, value in params.items():
        np.testing.assert_allclose(tree["variational"][name].values, value, rtol=1e-8)
    for name in ("mu", "sigma"):
        np.testing.assert_allclose(tree.posterior[name].values[0], expected[name], rtol=1e-8)
    assert abs(float(tree.posterior["mu"].mean()) - 25.0) < abs(float(tree.posterior["mu"].mean()) + 20.0)


def scaled_model(y, spread=3.0):
    """``centred_model`` with its noise scale a ``param`` site of the model itself (``s``, positive) rather than a
    latent site: SVI fits it with the guide's parameters."""
    s = numpyro.param("s", spread, constraint=dist.constraints.positive)
    mu = numpyro.sample("mu", dist.Normal(jnp.mean(y), 10.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, s), obs=y)


@pytest.mark.parametrize("guide", ["normal", "mvn"])
def test_a_model_with_its_own_param_site_fits_as_numpyros_svi_run(guide):
    """A model's own ``param`` site enters SVI's state only through ``SVI.init``'s trace of the model, the trace
    ``inference.svi._svi_init`` skips where the guide's prototype has no such site: here it has one, so the model
    is traced and ``s`` is fitted. ELBO trace, every parameter (``s`` included) and the draws equal NumPyro's
    SVI.run to 1e-8 relative (floating-point reordering only); without ``s`` in the state the fit would not
    even have the same parameters, and a fixed ``s`` = 3 would move the ELBO by units (the data's sd is 1.5)."""
    spec = zoo.ModelSpec(name="svi_scaled", model=scaled_model, simulate=simulate, paper="(test toy)",
                         data_fields=(zoo.DataField("y", ("n",)),), hyperparameters={"spread": zoo.Hyper(3.0)})
    zoo.register(spec, replace=True)
    try:
        y, _ = simulate(9, mu=4.0)
        tree = inference.fit("svi_scaled", y, "svi", seed=3, guide=guide, num_steps=STEPS, num_samples=DRAWS)
    finally:
        zoo.unregister("svi_scaled")
    from inference.svi import make_guide

    kwargs = {"y": y["y"], "spread": 3.0}
    svi = SVI(scaled_model, make_guide(scaled_model, guide, "median"), optax.adam(1e-2), Trace_ELBO())
    k_fit, k_draw = jax.random.split(jax.random.key(3))
    result = svi.run(k_fit, STEPS, progress_bar=False, stable_update=True, **kwargs)
    assert "s" in result.params and sorted(tree["variational"].data_vars) == sorted(result.params)
    np.testing.assert_allclose(tree["sample_stats"]["elbo"].values, -np.asarray(result.losses), rtol=1e-8)
    for name, value in result.params.items():
        np.testing.assert_allclose(tree["variational"][name].values, value, rtol=1e-8, err_msg=name)
    assert abs(float(result.params["s"]) - 3.0) > 1e-3   # s was fitted, not left at its initial value

    def one(k):   # svi.guide: set up by svi.run
        tr = handlers.trace(handlers.seed(handlers.substitute(svi.guide, data=result.params), k)).get_trace(**kwargs)
        return tr["mu"]["value"]

    np.testing.assert_allclose(tree.posterior["mu"].values[0], jax.jit(jax.vmap(one))(jax.random.split(k_draw, DRAWS)),
                               rtol=1e-8)


def guide_structure(guide, kwargs) -> tuple:
    """What a set-up guide is to SVI, read off one abstract call (``jax.eval_shape``): its trace's sites in order
    (type; shape and dtype of the value; a param's constraint and event dim; a sample's distribution and event
    dim), the prototype's sites, initial locations' shapes and dtypes, plates and event dims."""
    found = []

    def call(arrays):
        tr = handlers.trace(handlers.seed(guide, 0)).get_trace(**{**kwargs, **arrays})
        for name, site in tr.items():
            value, kind = site["value"], site["type"]
            if kind == "param":
                what = (type(site["kwargs"].get("constraint")).__name__, site["kwargs"].get("event_dim"))
            elif kind == "sample":
                what = (type(site["fn"]).__name__, site["fn"].event_dim)
            else:   # a plate: its size and subsample size
                what = site["args"]
            found.append((name, kind, np.shape(value), str(getattr(value, "dtype", None)), what))
        found.append(tuple(guide.prototype_trace))
        found.append(tuple((k, np.shape(v), str(v.dtype)) for k, v in guide._init_locs.items()))
        found.append((guide._prototype_frames, guide._prototype_frame_full_sizes,
                      getattr(guide, "_event_dims", None), getattr(guide, "latent_dim", None)))
        return 0

    arrays = {k: v for k, v in kwargs.items() if isinstance(v, np.ndarray)}
    jax.eval_shape(call, {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in arrays.items()})
    return tuple(found)


@pytest.mark.parametrize("guide", ["normal", "lowrank", "mvn"])
def test_a_guide_set_up_from_its_prototype_alone_is_numpyros_guide_but_for_its_initial_values(guide):
    """The steps and draw programs set their guide up from the model's prototype trace alone
    (``make_guide(prototype_only=True)``, NumPyro's ``AutoGuide._setup_prototype`` with
    ``find_valid_initial_params`` swapped out). On mppca (Dirichlet, Gamma, Normal sites, plates) it is NumPyro's
    guide in everything those programs read: the same sites in the same order with the same shapes, dtypes,
    constraints, distributions and event dims, the same prototype sites, plates and initial locations' shapes
    (a NumPyro release that set its guides up otherwise would show here first). Exact comparison of structure."""
    from inference.svi import make_guide

    spec = zoo.get("mppca")
    data = spec.simulate(0, **spec.settings.tiny_sizes)[0]
    ctx = inference.prepare("mppca", data, "svi", seed=0, **spec.settings.tiny_hyperparameters).context
    numpyros = guide_structure(make_guide(spec.model, guide, "median"), ctx.model_kwargs)
    ours = guide_structure(make_guide(spec.model, guide, "median", prototype_only=True), ctx.model_kwargs)
    assert ours == numpyros
    assert any(site[1] == "param" for site in ours) and any(site[1] == "sample" for site in ours[:-4])


MODEL_CALLS: list[int] = []


def counted_model(y, spread=3.0):
    """``centred_model``, counting its calls (each is a trace of it: JAX traces, never runs, a NumPyro model)."""
    MODEL_CALLS.append(1)
    centred_model(y, spread)


@pytest.mark.parametrize("guide,expected", [("normal", 8), ("lowrank", 8)])
def test_a_cold_svi_fit_traces_the_model_no_more_than_it_must(guide, expected):
    """A cold fit (no program kept) traces the model: once abstractly for the tree's structure and the memory
    check's latent size (one trace, shared), once for the tree's log densities program, three times in the init
    program (NumPyro's autoguide set-up: its prototype, ``find_valid_initial_params``'s candidate and potential
    energy; the model's replay in ``SVI.init`` is skipped: the prototype shows no ``param`` or ``mutable`` site),
    twice in the steps program (the guide's prototype alone, then the ELBO), and with AutoNormal once abstractly
    for the host draws' plan: 8 (lowrank: no host plan, its draws a compiled program that again sets its guide
    up from one trace of the model: 8). Before (every program set its guide up as NumPyro's ``SVI.init`` does,
    and the memory check traced the model on its own) a cold fit traced it 13 times (lowrank: 16). Counts: exact
    integers, the same on every machine."""
    from inference import limits, programs

    spec = zoo.ModelSpec(name="svi_counted", model=counted_model, simulate=simulate, paper="(test toy)",
                         data_fields=(zoo.DataField("y", ("n",)),), hyperparameters={"spread": zoo.Hyper(3.0)})
    zoo.register(spec, replace=True)
    try:
        programs.clear()
        limits._latent_of.cache_clear()
        MODEL_CALLS.clear()
        y, _ = simulate(10)
        inference.fit("svi_counted", y, "svi", seed=0, guide=guide, num_steps=STEPS, num_samples=DRAWS)
        assert len(MODEL_CALLS) == expected, len(MODEL_CALLS)
        MODEL_CALLS.clear()
        inference.fit("svi_counted", y, "svi", seed=1, guide=guide, num_steps=STEPS, num_samples=DRAWS)
        assert len(MODEL_CALLS) == 0, len(MODEL_CALLS)   # a second fit traces nothing
    finally:
        zoo.unregister("svi_counted")


def test_a_second_fit_with_another_seed_data_and_num_steps_compiles_nothing_and_same_seed_repeats_draws():
    """After one fit, fits on other same-shaped data, with another seed and another num_steps, trigger no JAX
    tracing or compilation at all (``Stopwatch.compile_events == 0``: the programs are cached, the data are
    their arguments); the same seed gives identical draws (same process, same compiled programs)."""
    from inference.svi import CHUNK_STEPS

    y_a, _ = simulate(3)
    y_b, _ = simulate(4)
    first = inference.fit("svi_centred", y_a, "svi", seed=5, num_steps=STEPS, num_samples=DRAWS)
    with Stopwatch() as watch:
        inference.fit("svi_centred", y_b, "svi", seed=6, num_steps=STEPS, num_samples=DRAWS)
        inference.fit("svi_centred", y_b, "svi", seed=7, num_steps=STEPS + 2 * CHUNK_STEPS + 1,
                      num_samples=DRAWS)
        again = inference.fit("svi_centred", y_a, "svi", seed=5, num_steps=STEPS, num_samples=DRAWS)
    assert watch.compile_events == 0, watch.compile_events
    assert again.attrs["compile_seconds"] == 0.0
    for name in ("mu", "sigma"):
        np.testing.assert_array_equal(again.posterior[name].values, first.posterior[name].values)


@pytest.mark.parametrize("model,data,options", [
    ("svi_centred", lambda: simulate(8)[0], {}),
    ("mppca", lambda: zoo.get("mppca").simulate(0, **zoo.get("mppca").settings.tiny_sizes)[0],
     dict(zoo.get("mppca").settings.tiny_hyperparameters)),
])
def test_an_svi_fit_driven_to_non_finite_values_is_a_non_finite_error_with_advice(model, data, options):
    """Adam with learning_rate 1e200 throws the guide's unconstrained parameters to ~1e200 after one step; from
    there every ELBO estimate overflows (NumPyro's stable update rejects each step), which on mppca is where its
    LowRankMultivariateNormal components got non-finite arguments (issue 18, on a GPU). The fit must end in our
    ``NonFiniteError`` naming the learning rate and the other remedies, never NumPyro's argument validation."""
    with pytest.raises(inference.NonFiniteError) as info:
        inference.fit(model, data(), "svi", seed=0, learning_rate=1e200, num_steps=50, num_samples=10, **options)
    message = str(info.value)
    assert "method 'svi'" in message and "lower learning_rate (now 1e+200)" in message
    assert "another guide" in message and "init" in message
    assert "distribution got invalid" not in message


def nan_model(y):
    """A log density that is NaN everywhere: no initial point of any guide can have a finite ELBO."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.factor("broken", jnp.sum(y) * mu * jnp.nan)


def test_an_svi_fit_whose_elbo_is_never_finite_says_so_from_the_initial_point():
    spec = zoo.ModelSpec(name="svi_nan", model=nan_model, simulate=simulate, paper="(test toy)",
                         data_fields=(zoo.DataField("y", ("n",)),), likelihood_sites=())
    zoo.register(spec, replace=True)
    try:
        with pytest.raises(inference.NonFiniteError, match=r"not finite at any of the 20 Adam steps, from the "
                                                           r"guide's initial point on.*lower learning_rate"):
            inference.fit("svi_nan", {"y": np.ones(3)}, "svi", seed=0, num_steps=20, num_samples=5)
    finally:
        zoo.unregister("svi_nan")
