"""``inference.nuts`` runs NUTS as one compiled program (``_sampling_program``) called from the host until every draw
is kept, with or without a progress bar; it must give NumPyro's draws (``MCMC.run``), and a failed initial point
must stay an error."""

import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS

import inference
import zoo
from inference import host_keys, loop, nuts
from inference._init_strategies import INIT_STRATEGIES
from inference.api import key_of

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


def numpyros_run(y, seed: int, num_chains: int, num_warmup: int, num_samples: int, thinning: int):
    """The oracle: NumPyro's own ``MCMC.run`` (its op-by-op initialisation, its own pmap of the chains, its
    ``fori_collect``) with ``num_samples * thinning`` samples thinned by ``thinning``, from the key of ``seed``."""
    mcmc = MCMC(NUTS(_normal_model, init_strategy=INIT_STRATEGIES["prior"]), num_warmup=num_warmup,
                num_samples=num_samples * thinning, thinning=thinning, num_chains=num_chains, progress_bar=False)
    mcmc.run(key_of(seed), y=y, extra_fields=("energy",))
    return mcmc.get_samples(group_by_chain=True), mcmc.get_extra_fields(group_by_chain=True)


@pytest.mark.parametrize(("num_chains", "thinning"), [(1, 1), (2, 1), (2, 3)])
def test_the_one_program_gives_the_draws_of_numpyros_own_run(num_chains, thinning):
    """The oracle is NumPyro's ``MCMC.run`` on a two-site model with data, with and without a progress bar (with
    one, the program is called a twentieth of the run at a time, each call going on from the last one's carry).
    A short run, so that the last bits in which the compiled programs may differ cannot grow through the
    trajectories into different draws."""
    zoo.register(NORMAL, replace=True)
    try:
        data = NORMAL.simulate(0)[0]
        fits = {progress: inference.fit("toy_normal_sd", data, "nuts", seed=11, num_chains=num_chains,
                                        progress=progress, num_warmup=20, num_samples=10, thinning=thinning)
                for progress in (True, False)}
    finally:
        zoo.unregister("toy_normal_sd")
    samples, extra = numpyros_run(data["y"], 11, num_chains, 20, 10, thinning)
    for fit in fits.values():
        for site in fit["posterior"].data_vars:
            np.testing.assert_allclose(fit["posterior"][site].values, np.asarray(samples[site]), rtol=1e-9,
                                       atol=1e-12, err_msg=site)
        np.testing.assert_allclose(fit["sample_stats"]["energy"].values, np.asarray(extra["energy"]), rtol=1e-9)


def test_a_run_longer_than_the_buffer_of_kept_draws_goes_on_from_its_carry(monkeypatch):
    """With a buffer of 4 kept draws, 10 draws thinned by 2 take three calls of the program (each ends when its
    buffer is full): the draws are still NumPyro's."""
    monkeypatch.setattr(loop, "ROWS", 4)
    y = NORMAL.simulate(0)[0]["y"]
    settings = (("num_warmup", 20), ("num_chains", 1), ("dense_mass", False), ("target_accept_prob", 0.8),
                ("max_tree_depth", 10), ("init", "prior"))
    program = nuts._sampling_program.__wrapped__(_normal_model, (), settings)
    calls = []
    run = program.run
    program = program._replace(run=lambda *a: calls.append(a[3]) or run(*a))
    sites, extra = nuts.run_chains(program, host_keys.words(key_of(11))[None], {"y": y}, num_warmup=20,
                                   num_samples=10, thinning=2, progress=False)
    assert len(calls) == 3
    samples, oracle_extra = numpyros_run(y, 11, 1, 20, 10, 2)
    for site in ("mu", "sigma"):
        np.testing.assert_allclose(sites[site], np.asarray(samples[site]), rtol=1e-9, atol=1e-12, err_msg=site)
    np.testing.assert_allclose(extra["energy"], np.asarray(oracle_extra["energy"]), rtol=1e-9)


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
