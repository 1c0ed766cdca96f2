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


def numpyro_svi_draws(y, seed, guide_kind, num_steps=STEPS, num_samples=DRAWS, learning_rate=1e-2):
    """The oracle: NumPyro's ``SVI.run`` (one ``lax.scan``, a fresh guide) on the same keys as ``run_svi``
    (``k_fit, k_draw = split(key(seed))``; draw i from the guide seeded with ``split(k_draw, S)[i]``)."""
    from inference.svi import make_guide

    kwargs = {"y": y, "spread": 3.0}
    guide = make_guide(centred_model, guide_kind, "median")
    svi = SVI(centred_model, guide, optax.adam(learning_rate), Trace_ELBO())
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
