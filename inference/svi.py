"""SVI baseline (NumPyro) with the three standard autoguides, available for every model.

``guide``: ``"normal"`` (AutoNormal, mean field), ``"lowrank"`` (AutoLowRankMultivariateNormal,
``rank`` option) or ``"mvn"`` (AutoMultivariateNormal), or a callable: a hand-written NumPyro guide with the
model's signature (e.g. ``inference.bpca.guide.guide``, the closed-form MFVI family of BPCA; ``init`` and ``rank``
are then unused). Adam (optax) with ``learning_rate``;
``num_steps`` steps; the ELBO trace is kept in ``sample_stats.elbo``. ``num_samples`` draws are taken
from the fitted guide, and ``log_q`` (the guide's log density at each draw, in the model's
constrained space) is stored with them so PSIS k-hat can be computed (Yao et al. 2018). The fitted guide's
parameters are stored in group ``variational``. There is no closed-form bound: the ``elbo`` trace holds the
``num_particles``-sample estimate at each step, and the tree's ``objective`` attribute the mean of its last 5 %.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import xarray as xr
from numpyro import handlers
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoMultivariateNormal, AutoNormal

from inference._init_strategies import INIT_STRATEGIES
from inference._methods import Draws, FitContext, Option, register_method
from inference.progress import progress_enabled

_GUIDES = ("normal", "lowrank", "mvn")


def _check(options: dict) -> None:
    """``guide`` is one of ``_GUIDES`` or a callable (not a plain choice, so it is checked here)."""
    if not callable(options["guide"]) and options["guide"] not in _GUIDES:
        raise ValueError(f"guide: expected one of {list(_GUIDES)} or a NumPyro guide function, "
                         f"got {options['guide']!r}")


def make_guide(model, kind, init: str = "median", rank: int | None = None):
    if callable(kind):
        return kind
    init_loc_fn = INIT_STRATEGIES[init]
    if kind == "normal":
        return AutoNormal(model, init_loc_fn=init_loc_fn)
    if kind == "lowrank":
        return AutoLowRankMultivariateNormal(model, init_loc_fn=init_loc_fn, rank=rank)
    return AutoMultivariateNormal(model, init_loc_fn=init_loc_fn)


def guide_draws(guide, params, key, num_samples: int, model_kwargs) -> tuple[dict, jax.Array]:
    """``num_samples`` draws from a fitted guide and log q at each (sum of the guide trace's log probs)."""
    return guide_draws_at(guide, params, jax.random.split(key, num_samples), model_kwargs)


def guide_draws_at(guide, params, keys, model_kwargs) -> tuple[dict, jax.Array]:
    """One draw from the fitted guide per key in ``keys`` (the guide seeded with that key, as
    ``handlers.seed(guide, key)`` and NumPyro's ``psis_diagnostic`` do) and log q at each, in the model's
    constrained space: an autoguide's sites are ``TransformedDistribution``s of its unconstrained Gaussian,
    so their log prob includes the log |Jacobian| of the transform to each site's support."""

    def one(k):
        tr = handlers.trace(handlers.seed(handlers.substitute(guide, data=params), k)).get_trace(**model_kwargs)
        log_q = 0.0
        values = {}
        for name, site in tr.items():
            if site["type"] != "sample":
                continue
            lp = site["fn"].log_prob(site["value"])
            log_q = log_q + jnp.sum(site["scale"] * lp if site.get("scale") is not None else lp)
            if not site.get("infer", {}).get("is_auxiliary", False):
                values[name] = site["value"]
        return values, log_q

    return jax.jit(jax.vmap(one))(keys)


def params_dataset(params) -> xr.Dataset:
    """Group ``variational``: the fitted guide's parameters (constrained values, as ``SVI.get_params`` returns
    them, e.g. ``<site>_auto_loc``/``<site>_auto_scale`` for AutoNormal, ``auto_loc``/``auto_scale_tril`` for
    AutoMultivariateNormal), so that q can be rebuilt from the tree."""
    arrays = {k: np.asarray(v) for k, v in params.items()}
    return xr.Dataset({k: ([f"{k}_dim_{i}" for i in range(v.ndim)], v) for k, v in arrays.items()})


OPTIONS = {
    "guide": Option("normal", "any", f"autoguide, one of {list(_GUIDES)}, or a NumPyro guide function"),
    "num_steps": Option(5000, "positive_int", "Adam steps", tiny=200),
    "learning_rate": Option(1e-2, "positive", "Adam step size"),
    "num_particles": Option(1, "positive_int", "Monte Carlo samples per ELBO gradient estimate"),
    "num_samples": Option(1000, "positive_int", "draws taken from the fitted guide", tiny=50),
    "rank": Option(None, "positive_int|None", "rank of the lowrank guide (None: NumPyro's default)"),
    "init": Option("median", "string", "initial point of the guide's location", choices=tuple(INIT_STRATEGIES)),
}


@register_method("svi", kind="variational", check=_check, options=OPTIONS)
def run_svi(ctx: FitContext) -> Draws:
    """Stochastic variational inference (Hoffman et al. 2013) with a NumPyro autoguide and Adam."""
    o = ctx.options
    guide = make_guide(ctx.spec.model, o["guide"], o["init"], o["rank"])
    svi = SVI(ctx.spec.model, guide, optax.adam(o["learning_rate"]), Trace_ELBO(num_particles=o["num_particles"]))
    k_fit, k_draw = jax.random.split(ctx.key)
    result = svi.run(k_fit, o["num_steps"], progress_bar=progress_enabled(o["progress"]), stable_update=True,
                     **ctx.model_kwargs)
    draws, log_q = guide_draws(guide, result.params, k_draw, o["num_samples"], ctx.model_kwargs)
    posterior = {k: np.asarray(v)[None] for k, v in draws.items()}
    elbo = -np.asarray(result.losses)
    return Draws(posterior=posterior, sample_stats={"log_q": np.asarray(log_q)[None]},
                 traces={"elbo": elbo}, groups={"variational": params_dataset(result.params)},
                 objective=float(np.mean(elbo[-max(1, o["num_steps"] // 20):])), n_iter=o["num_steps"])
