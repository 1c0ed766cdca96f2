"""AutoNormal's draws and log q made in NumPy on the host (inference/svi.py ``host_plan``/``host_draws``,
inference/host_draws.py; issue 28 item 1: a cold SVI fit compiles no draw program).

Oracles are NumPyro and JAX themselves, each evaluated as one jitted program: ``jax.random.split``/``jax.random.normal``
for the replayed keys and noise, ``biject_to(constraint)(z)`` and its ``log_abs_det_jacobian`` for each transform, and
``TransformedDistribution(Normal(loc, scale), biject_to(support)).log_prob(x)`` (what the compiled draw program sums)
for log q at the host's draws. Tolerances: 1e-10 relative where both sides compute the same closed form in float64
(reordering and SciPy's against XLA's ``erfinv`` differ in the last bits; an error in a transform, a shift or a
Jacobian term is O(1e-2) or more); the distributional check is a mean within 4 Monte Carlo standard errors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import biject_to, constraints

import zoo
from inference import host_draws as hd
from inference import host_keys

CONSTRAINTS = {
    "real": (constraints.real, (5,)),
    "positive": (constraints.positive, (5,)),
    "independent positive": (constraints.independent(constraints.positive, 1), (2, 3)),
    "softplus_positive": (constraints.softplus_positive, (4,)),
    "simplex": (constraints.simplex, (2, 3)),   # K = 4: unconstrained 3
    "unit_interval": (constraints.unit_interval, (4,)),
    "interval": (constraints.interval(-2.0, 3.5), (4,)),
    "greater_than": (constraints.greater_than(1.5), (4,)),
}


@pytest.mark.parametrize("name", list(CONSTRAINTS))
def test_host_transform_and_log_det_equal_numpyros_biject_to(name):
    """x = T(z) and log|det dT/dz| summed per draw, for S = 3 draws of z spread over [-4, 4] (both tails of the
    sigmoid and the stick), against NumPyro's transform and its log_abs_det_jacobian summed the same way."""
    from inference.svi import _host_forward

    constraint, shape = CONSTRAINTS[name]
    transform = biject_to(constraint)
    forward = _host_forward(transform)
    assert forward is not None, name
    z = np.random.default_rng(0).uniform(-4, 4, (3, *shape))
    x, log_det = forward(z)

    @jax.jit   # NumPyro's transform and Jacobian as one program (eagerly: one program per operation)
    def reference(z):
        x = transform(z)
        return x, transform.log_abs_det_jacobian(z, x)

    x_ref, ld_ref = (np.asarray(v) for v in reference(jnp.asarray(z)))
    ld_ref = ld_ref.reshape(3, -1).sum(1)
    np.testing.assert_allclose(x, x_ref, rtol=1e-12, atol=0)
    np.testing.assert_allclose(log_det, ld_ref, rtol=1e-10, atol=1e-12)


def test_host_transform_is_none_for_a_transform_the_host_lacks():
    from inference.svi import _host_forward

    assert _host_forward(biject_to(constraints.corr_cholesky)) is None
    assert _host_forward(biject_to(constraints.ordered_vector)) is None


@pytest.mark.parametrize("shape", [(), (7,), (3, 4)])
def test_threefry_split_and_normal_replay_jax_random(shape):
    """Four keys: ``threefry_split`` is ``jax.random.split`` bit for bit; ``threefry_normal`` is
    ``jax.random.normal`` (float64) to 1e-12 relative (erfinv's last bits)."""
    keys = jax.random.split(jax.random.key(11), 4)
    words = host_keys.words(keys)

    @jax.jit   # JAX's own split and normal per key, as one program (eagerly: one program per operation)
    def reference(keys):
        return (jax.vmap(lambda k: jax.random.key_data(jax.random.split(k)))(keys),
                jax.vmap(lambda k: jax.random.normal(k, shape, dtype=jnp.float64))(keys))

    split_ref, expected = (np.asarray(v) for v in reference(keys))
    np.testing.assert_array_equal(hd.threefry_split(words), split_ref)
    eps = hd.threefry_normal(words, shape)
    assert eps.shape == (4, *shape)
    np.testing.assert_allclose(eps, expected, rtol=1e-12, atol=1e-14)


def mixed_model(y):
    """A real, a positive and a simplex latent site (the supports of the zoo's models), in an unsorted order."""
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(3)))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("k", 3):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    numpyro.sample("y", dist.MixtureSameFamily(dist.Categorical(w), dist.Normal(mu, sigma)), obs=y)


PARAMS = {"w_auto_loc": np.array([0.3, -0.8]), "w_auto_scale": np.array([0.4, 0.25]),
          "sigma_auto_loc": np.array(-0.2), "sigma_auto_scale": np.array(0.3),
          "mu_auto_loc": np.array([-1.0, 0.5, 2.0]), "mu_auto_scale": np.array([0.2, 0.7, 1.1])}


def test_host_plan_follows_the_model_order_and_falls_back_where_it_must():
    from inference.svi import host_plan

    options = {"guide": "normal"}
    plan = host_plan(mixed_model, {"y": np.zeros(5)}, options)
    assert [name for name, _ in plan] == ["w", "sigma", "mu"]
    assert host_plan(mixed_model, {"y": np.zeros(5)}, {"guide": "lowrank"}) is None

    def lkj_model(y):
        numpyro.sample("L", dist.LKJCholesky(3, 2.0))
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    def data_bounded(y):   # bounds known only inside the trace: the compiled program draws
        numpyro.sample("a", dist.Uniform(jnp.min(y), jnp.max(y)))

    assert host_plan(lkj_model, {"y": np.zeros(5)}, options) is None
    assert host_plan(data_bounded, {"y": np.arange(5.0)}, options) is None


def test_host_log_q_is_numpyros_transformed_density_at_the_host_draws():
    """At each host draw, log q = sum over sites of NumPyro's TransformedDistribution(Normal(loc, scale)
    .to_event, biject_to(support)).log_prob(x) (Normal alone for the real site), as the compiled draw program
    sums it (it inverts x back to z; the host keeps z)."""
    from inference.svi import host_draws, host_plan

    plan = host_plan(mixed_model, {"y": np.zeros(5)}, {"guide": "normal"})
    draws, log_q = host_draws(plan, PARAMS, jax.random.key(5), 6)
    supports = {"w": constraints.simplex, "sigma": constraints.positive, "mu": constraints.real}

    @jax.jit   # NumPyro's densities, all sites in one program (eagerly: one program per operation)
    def reference(draws):
        total = 0.0
        for name, support in supports.items():
            loc, scale = PARAMS[f"{name}_auto_loc"], PARAMS[f"{name}_auto_scale"]
            base = dist.Normal(loc, scale).to_event(np.ndim(loc))
            q = base if support is constraints.real else dist.TransformedDistribution(base, biject_to(support))
            total = total + jax.vmap(q.log_prob)(draws[name])
        return total

    expected = np.asarray(reference({name: jnp.asarray(draws[name]) for name in supports}))
    assert draws["w"].shape == (6, 3) and draws["sigma"].shape == (6,) and draws["mu"].shape == (6, 3)
    np.testing.assert_allclose(draws["w"].sum(1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(log_q, expected, rtol=1e-9)


def test_host_draws_are_the_guides_draws_seeded_as_numpyro_does():
    """The host's draw i equals NumPyro's AutoNormal run under ``handlers.seed(guide, split(key, S)[i])`` with
    the same parameters (the compiled draw program's recipe), to 1e-10 relative."""
    from numpyro import handlers

    from inference.svi import host_draws, host_plan, make_guide

    y = np.array([-1.0, 0.2, 2.3, 0.4, 1.9])
    guide = make_guide(mixed_model, "normal")
    with handlers.seed(rng_seed=0):   # set up its prototype from the data, abstractly (eagerly: ~250 programs)
        jax.eval_shape(lambda: guide(y=y))
    plan = host_plan(mixed_model, {"y": y}, {"guide": "normal"})
    key = jax.random.key(9)
    draws, _ = host_draws(plan, PARAMS, key, 4)

    @jax.jit   # NumPyro's seeded guide per key, as one program (eagerly: one program per operation)
    def reference(keys):
        def one(k):
            tr = handlers.trace(handlers.seed(handlers.substitute(guide, data=PARAMS), k)).get_trace(y=y)
            return {name: tr[name]["value"] for name in ("w", "sigma", "mu")}
        return jax.vmap(one)(keys)

    ref = reference(jax.random.split(key, 4))
    for i in range(4):
        for name in ("w", "sigma", "mu"):
            np.testing.assert_allclose(draws[name][i], np.asarray(ref[name][i]), rtol=1e-10, err_msg=name)


def test_host_draws_follow_q():
    """S = 4000 draws: the real site's mean and log of the positive site's mean are loc within 4 MCSE
    (scale / sqrt(S)), their sds within 5 % of scale (sd of a sample sd: scale / sqrt(2 S) = 1.1 %)."""
    from inference.svi import host_draws, host_plan

    plan = host_plan(mixed_model, {"y": np.zeros(5)}, {"guide": "normal"})
    S = 4000
    draws, _ = host_draws(plan, PARAMS, jax.random.key(2), S)
    for name, z in (("mu", draws["mu"]), ("sigma", np.log(draws["sigma"]))):
        loc, scale = PARAMS[f"{name}_auto_loc"], PARAMS[f"{name}_auto_scale"]
        assert np.all(np.abs(z.mean(0) - loc) < 4 * scale / np.sqrt(S)), name
        np.testing.assert_allclose(z.std(0), scale, rtol=0.05, err_msg=name)


def test_a_cold_autonormal_fit_compiles_no_draw_program():
    """A fit on ppca's tiny data builds init, steps and densities, never the draw program; a lowrank fit does."""
    import inference
    from inference._timing import Stopwatch
    from tests.conftest import release_compiled_programs

    spec = zoo.get("ppca")
    data, _ = spec.tiny_data()
    release_compiled_programs()
    with Stopwatch() as watch:
        inference.fit("ppca", data, "svi", seed=1, num_steps=20, num_samples=10, **spec.settings.tiny_hyperparameters)
    names = sorted(watch.xla_compiles)
    assert not any("draw" in n for n in names), names
    assert len(names) == 3, names
