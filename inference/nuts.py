"""NUTS baseline (NumPyro), available for every model in the zoo.

Discrete latent variables are marginalised inside the models, so NUTS runs on all of them.
Defaults: 2 chains (in parallel on the two host devices; vectorized on one GPU, ``chain_method``), diagonal
mass matrix (``dense_mass=True`` for a dense one), initialisation from a prior draw (``init="prior"``) or the
prior median.

A model whose spec declares an exact ``nuts_reformulation`` (``zoo.Reformulation``: sites integrated
out, a symmetry folded away) is sampled in those coordinates and its draws mapped back to the model's
latent sites (``to_sites``), so every NUTS run of that model (the demo's, a user's, the stored reference)
meets the better geometry and returns draws of the same sites with the same posterior. ``reformulate=False``
samples the model itself (to check the two agree). Divergences and energies are those of the sampled
coordinates; the tree's ``nuts_reformulation`` attr names the reformulation used ("" when none).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC, NUTS

from inference._init_strategies import INIT_STRATEGIES
from inference._methods import Draws, FitContext, Option, register_method
from inference.progress import progress_enabled
from inference.trees import split_arguments


def chain_method(num_chains: int, platform: str | None = None, device_count: int | None = None) -> str:
    """NumPyro's chain method for ``num_chains`` chains on ``device_count`` devices of ``platform`` (default: this
    process's, ``jax.default_backend()`` and ``jax.local_device_count()``; ``zoo._runtime`` asks XLA for 2 host
    CPU devices):

    * "parallel" (one chain per device, ``pmap``) when there are at least ``num_chains`` devices;
    * else "vectorized" (``vmap``: all chains in one program) on an accelerator (gpu, tpu): a GPU runs a
      chain's small steps at launch latency, so chains one after the other cost num_chains times that (issue 18,
      one H100: bpca NUTS 180 s sequential; hlcr 2 chains 16 s vectorized against 27 s sequential);
    * else "sequential" on the CPU, where vmapping NUTS's tree building makes every chain wait for the deepest
      tree of the batch."""
    platform = jax.default_backend() if platform is None else platform
    device_count = jax.local_device_count() if device_count is None else device_count
    if device_count >= num_chains:
        return "parallel"
    return "sequential" if platform == "cpu" else "vectorized"


OPTIONS = {
    "num_warmup": Option(1000, "nonnegative_int", "warm-up (adaptation) iterations per chain, discarded", tiny=50),
    "num_samples": Option(1000, "positive_int", "draws kept per chain (after thinning)", tiny=50),
    "num_chains": Option(2, "positive_int", "independent chains (in parallel when there are enough devices)",
                         tiny=1),
    "thinning": Option(1, "positive_int", "keep every thinning-th draw"),
    "dense_mass": Option(False, "bool", "adapt a dense mass matrix instead of a diagonal one"),
    "target_accept_prob": Option(0.8, "open_unit_interval", "step-size adaptation target acceptance rate"),
    "max_tree_depth": Option(10, "positive_int", "at most 2**max_tree_depth leapfrog steps per iteration"),
    "init": Option("prior", "string", "initial point: a prior draw, the prior median, or uniform in (-2, 2) "
                   "unconstrained", choices=tuple(INIT_STRATEGIES)),
    "reformulate": Option(True, "bool", "sample the spec's exact nuts_reformulation where it applies"),
}


SAMPLER_SETTINGS = ("num_warmup", "num_samples", "num_chains", "thinning", "dense_mass", "target_accept_prob",
                    "max_tree_depth", "init")
EXTRA_FIELDS = ("diverging", "energy", "num_steps", "accept_prob", "adapt_state.step_size")


@functools.lru_cache(maxsize=16)
def _sampler(model, static: tuple, settings: tuple) -> MCMC:
    """NumPyro's ``MCMC`` for ``model`` with its non-array arguments ``static`` bound and these settings, kept
    for the process: the data arrays are arguments of the compiled program (``jit_model_args``), so fits of
    one model on data of the same shapes (other seeds, other data sets) compile once."""
    o = dict(settings)
    kernel = NUTS(functools.partial(model, **dict(static)), dense_mass=o["dense_mass"],
                  target_accept_prob=o["target_accept_prob"], max_tree_depth=o["max_tree_depth"],
                  init_strategy=INIT_STRATEGIES[o["init"]])
    return MCMC(kernel, num_warmup=o["num_warmup"], num_samples=o["num_samples"], num_chains=o["num_chains"],
                thinning=o["thinning"], chain_method=chain_method(o["num_chains"]), progress_bar=o["progress"],
                jit_model_args=True)


@register_method("nuts", kind="sampler", options=OPTIONS)
def run_nuts(ctx: FitContext) -> Draws:
    """No-U-Turn sampler on the model's log density (Hoffman & Gelman 2014; NumPyro's implementation)."""
    o = ctx.options
    kwargs = ctx.model_kwargs
    reform = ctx.spec.nuts_reformulation
    if reform is not None and not (o["reformulate"] and reform.applies(kwargs)):
        reform = None
    arrays, static = split_arguments(kwargs)
    settings = tuple((k, o[k]) for k in SAMPLER_SETTINGS) + (("progress", progress_enabled(o["progress"])),)
    model = reform.model if reform else ctx.spec.model
    try:
        mcmc = _sampler(model, static, settings)
    except TypeError:  # an unhashable model argument: a sampler for this call only
        mcmc = _sampler.__wrapped__(model, static, settings)
    mcmc.run(ctx.key, **arrays, extra_fields=EXTRA_FIELDS)
    samples = mcmc.get_samples(group_by_chain=True)
    if reform is not None:
        samples = map_draws(reform, jax.random.fold_in(ctx.key, 1), samples, kwargs)
    samples = {k: np.asarray(v) for k, v in samples.items()}
    extra = mcmc.get_extra_fields(group_by_chain=True)
    stats = {
        "diverging": np.asarray(extra["diverging"]),
        "energy": np.asarray(extra["energy"]),
        "n_steps": np.asarray(extra["num_steps"]),
        "tree_depth": np.floor(np.log2(np.asarray(extra["num_steps"]))).astype(np.int64),
        "acceptance_rate": np.asarray(extra["accept_prob"]),
        "step_size": np.asarray(extra["adapt_state.step_size"]),
    }
    return Draws(posterior=samples, sample_stats=stats,
                 attrs={"nuts_reformulation": reform.name if reform else ""})


def map_draws(reform, key, samples: dict, model_kwargs: dict, batch_size: int = 256) -> dict:
    """``reform.to_sites`` applied to every draw of ``samples`` (leading (chain, draw) axes), one key per draw."""
    n_chain, n_draw = next(iter(samples.values())).shape[:2]
    flat = {k: jnp.reshape(v, (n_chain * n_draw, *v.shape[2:])) for k, v in samples.items()}
    keys = jax.random.split(key, n_chain * n_draw)
    arrays, static = split_arguments(model_kwargs)
    batch = min(batch_size, n_chain * n_draw)
    try:
        mapper = _site_mapper(reform, static, batch)
    except TypeError:  # an unhashable model argument: a program for this call only
        mapper = _site_mapper.__wrapped__(reform, static, batch)
    out = mapper(keys, flat, arrays)
    return {k: jnp.reshape(v, (n_chain, n_draw, *v.shape[1:])) for k, v in out.items()}


@functools.lru_cache(maxsize=16)
def _site_mapper(reform, static: tuple, batch: int):
    """The compiled ``(keys, draws, data arrays) -> model sites`` of ``map_draws``, one per reformulation and
    non-array arguments (data arrays are arguments, so same-shaped data share it)."""

    def to_sites(keys, flat, arrays):
        kwargs = {**dict(static), **arrays}
        return jax.lax.map(lambda a: reform.to_sites(a[0], a[1], kwargs), (keys, flat), batch_size=batch)

    return jax.jit(to_sites)

