"""The contract every registered (model, method) pair keeps, checked on tiny data.

For each pair: ``inference.fit`` on the model's tiny dataset (``ModelSpec.tiny_data``, hyperparameters
``tiny_hyperparameters``) with every option at its declared ``Option.tiny`` value returns a DataTree with
the groups every tree has, finite draws of every latent site with leading (chain, draw) axes, log densities
whose sum equals NumPyro's own ``log_density`` of the model at the draws (the oracle: NumPyro's
``numpyro.infer.util.log_density``, not our per-site evaluation), and identical draws for the same seed.
A new kernel or model is covered without touching this file (the pairs come from the registry).
"""

from __future__ import annotations

import numpy as np
import pytest
from numpyro.infer.util import log_density

import inference
import zoo
from inference._methods import get_method
from inference.trees import latent_sites, trace_model

GROUPS = ("posterior", "sample_stats", "log_likelihood", "log_prior", "observed_data")
N_CHECKED_DRAWS = 3


def tiny_options(model: str, method: str) -> dict:
    spec = zoo.get(model)
    declared = get_method(spec, method).declared
    return {**{k: o.tiny for k, o in declared.items() if o.tiny is not None}, **spec.tiny_hyperparameters}


def check_contract(model: str, method: str, seed: int = 3) -> None:
    spec = zoo.get(model)
    data, _ = spec.tiny_data()
    options = tiny_options(model, method)
    tree = inference.fit(model, data, method, seed=seed, **options)

    for group in GROUPS:
        assert group in tree.children, f"{model}/{method}: tree lacks group {group!r}"
    post = tree["posterior"].to_dataset()
    hyper = {**spec.default_hyper, **{k: v for k, v in options.items() if k in spec.hyperparameters}}
    kwargs = spec.inputs(inference.trees.problem_of(tree)[1], hyper)
    sites = latent_sites(trace_model(spec, kwargs))
    for site in sites:
        assert site in post, f"{model}/{method}: posterior lacks latent site {site!r}"
        values = post[site]
        assert values.dims[:2] == ("chain", "draw"), f"{model}/{method}: {site} dims {values.dims}"
        assert np.all(np.isfinite(values.values)), f"{model}/{method}: non-finite draws of {site}"

    lp = tree["log_prior"].to_dataset()
    ll = tree["log_likelihood"].to_dataset()
    for d in range(min(N_CHECKED_DRAWS, post.sizes["draw"])):
        params = {s: np.asarray(post[s].isel(chain=0, draw=d).values) for s in sites}
        oracle, _ = log_density(spec.model, (), kwargs, params)
        ours = sum(float(v.isel(chain=0, draw=d).sum()) for v in lp.data_vars.values()) + \
            sum(float(v.isel(chain=0, draw=d).sum()) for v in ll.data_vars.values())
        assert ours == pytest.approx(float(oracle), rel=1e-9, abs=1e-9), \
            f"{model}/{method}: log_prior + log_likelihood {ours} != NumPyro log_density {float(oracle)} at draw {d}"

    again = inference.fit(model, data, method, seed=seed, **options)
    for site in sites:
        np.testing.assert_array_equal(again["posterior"][site].values, post[site].values,
                                      err_msg=f"{model}/{method}: same seed, different draws of {site}")


PAIRS = [(m, meth) for m in zoo.list_models() for meth in inference.methods_for(m)]


@pytest.mark.parametrize(("model", "method"), PAIRS, ids=[f"{m}-{meth}" for m, meth in PAIRS])
def test_every_registered_pair_keeps_the_contract_on_tiny_data(model, method):
    check_contract(model, method)
