"""The NumPyro guide of the BPCA mean-field family (``inference.bpca.common``): for ``svi`` with
``guide=inference.bpca.guide.guide`` (it then optimises the same objective as ``vbem``, test 14), and for checking
the closed-form ELBO against ``TraceMeanField_ELBO`` (test 2, with ``guide_params`` of a fitted q)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

from inference.bpca.common import Q

GUIDE_INIT_SCALE = 0.1   # initial scales of ``guide`` (as NumPyro's autoguides)


def guide(X, mask, M, tau=None, alpha=1.0, theta=0.01, a_tau=1e-3, b_tau=1e-3, a_alpha=1e-3, b_alpha=1e-3):
    """NumPyro guide of the MFVI family (per-entry Normal W and mu, full-covariance MVN per z_n, Gamma tau/alpha)
    for ``zoo.bpca.model`` (same signature)."""
    N, D = X.shape
    # initial values as NumPyro's autoguides (median of prior draws for W's locations: W = 0 is a saddle point of
    # the ELBO; scales init_scale = 0.1); fitted values are substituted for them in test 2
    W_loc = numpyro.param("W_loc", lambda key: jnp.median(jax.random.normal(key, (15, D, M)), axis=0)
                          * jnp.broadcast_to(jnp.asarray(alpha if alpha is not None else 1.0, float), (M,)) ** -0.5)
    W_scale = numpyro.param("W_scale", jnp.full((D, M), GUIDE_INIT_SCALE), constraint=dist.constraints.positive)
    mu_loc = numpyro.param("mu_loc", jnp.zeros(D))
    mu_scale = numpyro.param("mu_scale", jnp.full(D, GUIDE_INIT_SCALE), constraint=dist.constraints.positive)
    numpyro.sample("mu", dist.Normal(mu_loc, mu_scale).to_event(1))
    if alpha is None:
        sa = numpyro.param("alpha_shape", jnp.ones(M), constraint=dist.constraints.positive)
        ra = numpyro.param("alpha_rate", jnp.ones(M), constraint=dist.constraints.positive)
        numpyro.sample("alpha", dist.Gamma(sa, ra).to_event(1))
    numpyro.sample("W", dist.Normal(W_loc, W_scale).to_event(2))
    if tau is None:
        st = numpyro.param("tau_shape", jnp.asarray(1.0), constraint=dist.constraints.positive)
        rt = numpyro.param("tau_rate", jnp.asarray(1.0), constraint=dist.constraints.positive)
        numpyro.sample("tau", dist.Gamma(st, rt))
    z_loc = numpyro.param("z_loc", jnp.zeros((N, M)))
    z_tril = numpyro.param("z_scale_tril", jnp.tile(GUIDE_INIT_SCALE * jnp.eye(M), (N, 1, 1)),
                           constraint=dist.constraints.lower_cholesky)
    with numpyro.plate("row", N):
        numpyro.sample("z", dist.MultivariateNormal(z_loc, scale_tril=z_tril))


def guide_params(q: Q) -> dict:
    """The guide's parameters (constrained) at a q."""
    p = {"W_loc": q.g.mw, "W_scale": jnp.sqrt(q.g.vw), "mu_loc": q.g.mmu, "mu_scale": jnp.sqrt(q.g.vmu),
         "z_loc": q.mz, "z_scale_tril": jnp.linalg.cholesky(q.Sz)}
    if q.tau is not None:
        p["tau_shape"], p["tau_rate"] = q.tau[0], q.tau[1]
    if q.alpha is not None:
        p["alpha_shape"], p["alpha_rate"] = q.alpha[0], q.alpha[1]
    return p
