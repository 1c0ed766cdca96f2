"""Spine: NUTS chains on the two host devices in parallel vs one after the other (same draws)."""

from __future__ import annotations

import numpy as np
import numpyro
import numpyro.distributions as dist
from jax import random
from numpyro.infer import MCMC, NUTS


def _model(x, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([x.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1))
    with numpyro.plate("n", x.shape[0]):
        numpyro.sample("y", dist.Normal(x @ w, sigma), obs=y)


def main(h) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 20))
    y = x @ rng.normal(size=20) + rng.normal(size=2000)

    def run(chain_method):
        mcmc = MCMC(NUTS(_model), num_warmup=300, num_samples=300, num_chains=2, chain_method=chain_method,
                    progress_bar=False)
        return lambda: (mcmc.run(random.key(0), x, y), mcmc.get_samples()["w"])[1]

    h.compare("NUTS, 2 chains, linear regression n=2000, p=20: parallel (2 devices) vs sequential",
              {"parallel": run("parallel"), "sequential": run("sequential")}, baseline="sequential",
              work=2 * 600, work_unit="iterations",
              note="numpyro re-traces on every run, so each repeat includes tracing (same for both).")
