"""``inference.nuts`` runs NUTS without a progress bar as one compiled program (``_sampling_program``) and with one
through NumPyro's ``MCMC.run``; both must give NumPyro's draws, and a failed initial point must stay an error."""

import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import inference
import zoo
from inference import nuts

NAN_DENSITY = zoo.ModelSpec(name="toy_nan_density", model=lambda y: (numpyro.sample("mu", dist.Normal(0, 1)),
                                                                   numpyro.factor("y", np.nan * y.sum())),
                            simulate=lambda seed: ({"y": np.ones(3)}, {}), data_fields=(zoo.DataField("y", ("n",)),))

SHORT = {"num_warmup": 5, "num_samples": 5}


def _normal_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


NORMAL = zoo.ModelSpec(name="toy_normal_sd", model=_normal_model,
                       simulate=lambda seed: ({"y": np.random.default_rng(seed).normal(1.0, 0.5, 20)}, {}),
                       data_fields=(zoo.DataField("y", ("n",)),))


@pytest.mark.parametrize("num_chains", [1, 2])
def test_the_one_program_gives_the_draws_of_numpyros_own_run(num_chains):
    """The oracle is NumPyro's ``MCMC.run`` (the progress-bar path: op-by-op initialisation, its own pmap of the
    chains) on a two-site model with data. A short run, so that the last bits in which the two compiled programs
    may differ cannot grow through the trajectories into different draws."""
    zoo.register(NORMAL, replace=True)
    try:
        data = NORMAL.simulate(0)[0]
        fits = {progress: inference.fit("toy_normal_sd", data, "nuts", seed=11, num_chains=num_chains,
                                        progress=progress, num_warmup=20, num_samples=10)
                for progress in (True, False)}
    finally:
        zoo.unregister("toy_normal_sd")
    for site in fits[False]["posterior"].data_vars:
        np.testing.assert_allclose(fits[False]["posterior"][site].values, fits[True]["posterior"][site].values,
                                   rtol=1e-9, atol=1e-12, err_msg=site)
    np.testing.assert_allclose(fits[False]["sample_stats"]["energy"].values,
                               fits[True]["sample_stats"]["energy"].values, rtol=1e-9)


def test_the_program_names_the_chain_method_of_the_device_rule():
    model = zoo.get("ppca").model
    for num_chains, expected in ((1, "parallel"), (2, "parallel"), (3, "sequential")):
        settings = tuple((k, nuts.OPTIONS[k].default) for k in nuts.SAMPLER_SETTINGS if k != "num_chains") + \
            (("num_chains", num_chains), ("progress", False))
        assert nuts._sampling_program.__wrapped__(model, (), settings).chain_method == expected


@pytest.mark.parametrize("num_chains", [1, 2, 3])
def test_no_finite_initial_point_is_a_non_finite_error_for_any_chain_method(num_chains):
    """NumPyro raises "Cannot find valid initial parameters" only outside a trace; inside the program the checked
    kernel's flag carries it out (1 chain, 2 chains in parallel, 3 chains one after the other)."""
    zoo.register(NAN_DENSITY, replace=True)
    try:
        with pytest.raises(inference.NonFiniteError, match="no initial point with a finite log density"):
            inference.fit("toy_nan_density", {"y": np.ones(3)}, "nuts", seed=0, progress=False, num_chains=num_chains,
                          **SHORT)
    finally:
        zoo.unregister("toy_nan_density")
