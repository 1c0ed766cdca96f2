"""SVI's initial point with ``init_to_median``'s prior draws made on the host (inference/_init_strategies.py
``init_to_median_on_host``, used by inference/svi.py's programs; issue 28: the init program without JAX's
samplers compiled in it).

Oracles are JAX and NumPyro themselves: each prior's ``sample(key, (15,))`` and NumPyro's ``init_to_median``
compiled as they are, and NumPyro's ``SVI.init`` with ``init_to_median``. Tolerance 1e-12 relative (absolute 1e-14
near zero): both sides run the same recipe on the same threefry bits in float64, and differ only where NumPy's
and SciPy's ``log``, ``tan``, ``pow`` and ``erfinv`` round their last bits differently from XLA's; a wrong key,
counter, shape, boost or transform changes the draws by O(1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer import init_to_median

import zoo
from inference._init_strategies import host_prior_draws, host_sampler, init_to_median_on_host

RTOL, ATOL = 1e-12, 1e-14

# Every family the host replays, with the shapes that move its keys and counters: batch and event axes, an
# expanded and an interstitial axis, Gamma shapes below 1 (the boost) and above, Dirichlet in log space.
PRIORS = {
    "normal": dist.Normal(jnp.arange(3.0), 2.0),
    "half_normal expanded": dist.HalfNormal(1.5).expand([2, 3]).to_event(1),
    "cauchy": dist.Cauchy(1.0, jnp.array([0.5, 2.0])),
    "half_cauchy": dist.HalfCauchy(jnp.array([0.5, 3.0])),
    "gamma to_event": dist.Gamma(jnp.array([0.3, 2.0, 7.0]), 2.0).to_event(1),
    "gamma tiny shape": dist.Gamma(0.05, 1.0),
    "dirichlet expanded": dist.Dirichlet(jnp.array([0.2, 1.0, 5.0])).expand([4]),
    "normal interstitial": dist.Normal(jnp.zeros((1, 3)), 1.0).expand([5, 3]),
    "inverse_gamma expanded": dist.InverseGamma(jnp.array([0.5, 3.0]), 2.0).expand([3, 2]).to_event(2),
    "log_normal": dist.LogNormal(1.0, 0.5),
}


def test_host_draws_of_every_replayed_prior_equal_jaxs_draws():
    """15 draws of each prior on 4 keys: the host's (a callback inside the program) against the prior's own
    ``sample`` compiled by JAX, element by element."""
    assert all(host_sampler(d) is not None for d in PRIORS.values())

    @jax.jit
    def both(key):
        keys = jax.random.split(key, len(PRIORS))
        return ({name: d.sample(k, (15,)) for k, (name, d) in zip(keys, PRIORS.items(), strict=True)},
                {name: host_prior_draws(d, k, (15,)) for k, (name, d) in zip(keys, PRIORS.items(), strict=True)})

    for seed in range(4):
        jax_draws, host = jax.device_get(both(jax.random.key(seed)))
        for name in PRIORS:
            assert host[name].shape == jax_draws[name].shape, name
            np.testing.assert_allclose(host[name], jax_draws[name], rtol=RTOL, atol=ATOL, err_msg=name)


def test_a_prior_the_host_does_not_replay_is_drawn_by_jax():
    assert host_sampler(dist.Beta(2.0, 3.0)) is None
    assert host_sampler(dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2))) is None
    assert host_prior_draws(dist.Normal(0.0, 1.0), None, (15,)) is None


def hierarchical():
    """A prior whose parameter is another site's value (drawn from that site's median), a plate, a site the
    host does not replay (Beta: NumPyro's own draws), and a sample_shape."""
    scale = numpyro.sample("scale", dist.HalfCauchy(2.0))
    rate = numpyro.sample("rate", dist.Gamma(0.5, 1.0))
    with numpyro.plate("groups", 4):
        numpyro.sample("weights", dist.Dirichlet(jnp.array([0.3, 1.0, 2.0])))
        numpyro.sample("level", dist.Normal(0.0, scale))
        numpyro.sample("precision", dist.Gamma(rate + 0.5, 1.0))
    numpyro.sample("p", dist.Beta(2.0, 3.0))
    numpyro.sample("offsets", dist.Normal(1.0, 0.5), sample_shape=(2,))


def test_init_to_median_on_host_gives_numpyros_init_to_median_and_compiles_no_sampler():
    """Each site's initial value, under NumPyro's seed handler, equals ``init_to_median``'s on 4 keys; the
    program keeps NumPyro's draws for the Beta site only (one ``random_gamma``: its Dirichlet), where NumPyro's
    own has one per Gamma, Dirichlet and Beta site (four)."""
    def initial(strategy, key):
        tr = handlers.trace(handlers.substitute(handlers.seed(hierarchical, key), substitute_fn=strategy)).get_trace()
        return {name: site["value"] for name, site in tr.items() if site["type"] == "sample"}

    ours = jax.jit(lambda k: initial(init_to_median_on_host, k))
    numpyros = jax.jit(lambda k: initial(init_to_median, k))
    for seed in range(4):
        got, expected = jax.device_get(ours(jax.random.key(seed))), jax.device_get(numpyros(jax.random.key(seed)))
        assert sorted(got) == sorted(expected)
        for name in expected:
            np.testing.assert_allclose(got[name], expected[name], rtol=RTOL, atol=ATOL, err_msg=name)
    key = jax.random.key(0)
    assert str(jax.make_jaxpr(lambda k: initial(init_to_median_on_host, k))(key)).count("random_gamma") == 1
    assert str(jax.make_jaxpr(lambda k: initial(init_to_median, k))(key)).count("random_gamma") == 4


def test_svis_init_program_starts_where_numpyros_svi_init_does():
    """mppca on tiny data (Dirichlet, Gamma and Normal priors): the init program of a fit (``_programs``) returns
    the state NumPyro's ``SVI.init`` gives with an AutoNormal initialised by ``init_to_median`` on the same key:
    every Adam moment and every guide parameter (the initial locations in the unconstrained space)."""
    import optax
    from numpyro.infer import SVI, Trace_ELBO

    import inference
    from inference import host_keys
    from inference.svi import make_guide, programs_for

    spec = zoo.get("mppca")
    data = spec.simulate(0, **spec.settings.tiny_sizes)[0]
    ctx = inference.prepare("mppca", data, "svi", seed=3, **spec.settings.tiny_hyperparameters).context
    compiled, arrays = programs_for(spec.model, ctx.model_kwargs, ctx.options)
    key = host_keys.parts(ctx.key)[0]
    got = jax.device_get(compiled.init(key, arrays))
    svi = SVI(spec.model, make_guide(spec.model, "normal", "median"), optax.adam(ctx.options["learning_rate"]),
              Trace_ELBO())
    expected = jax.device_get(jax.jit(lambda k: svi.init(k, **ctx.model_kwargs))(key))
    got_params, expected_params = got.optim_state[1][0], expected.optim_state[1][0]
    assert sorted(got_params) == sorted(expected_params) and any(k.startswith("omega") for k in got_params)
    for name in expected_params:
        np.testing.assert_allclose(got_params[name], expected_params[name], rtol=RTOL, atol=ATOL, err_msg=name)
    assert "random_gamma" not in str(compiled.init.trace(key, arrays).jaxpr)
