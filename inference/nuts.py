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

Without a progress bar a run is one compiled program (``_sampling_program``, kept per model, settings and data
shapes); with one, NumPyro's ``MCMC.run`` draws the bar from the host (``_sampler``). Both give NumPyro's draws.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC, NUTS

from inference import host_keys, programs
from inference._init_strategies import INIT_STRATEGIES
from inference._methods import Draws, FitContext, Option, register_method
from inference.progress import progress_enabled
from inference.trees import NUMPYRO_NO_INIT, split_arguments


def chain_method(num_chains: int, platform: str | None = None, device_count: int | None = None) -> str:
    """NumPyro's chain method for ``num_chains`` chains on ``device_count`` devices of ``platform`` (default: this
    process's, ``jax.default_backend()`` and ``jax.local_device_count()``; ``zoo._runtime`` asks XLA for 2 host
    CPU devices):

    * "parallel" (one chain per device, ``pmap``) when there are at least ``num_chains`` devices;
    * else "vectorized" (``vmap``: all chains in one program) on an accelerator (gpu, tpu): a GPU runs a
      chain's small steps at launch latency, so chains one after the other cost num_chains times that
      (benchmarks/results.md, "lab notes from inference/": the H100 timings);
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


class _CheckedNUTS(NUTS):
    """NUTS that keeps whether its initial point has a finite potential energy and gradient (``init_ok``).
    NumPyro checks this only when the search runs outside a trace (``find_valid_initial_params``); inside
    ``_sampling_program`` it cannot, so the program returns the flag and ``run_nuts`` raises NumPyro's error."""

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs={}):  # noqa: B006 (NumPyro's)
        state = super().init(rng_key, num_warmup, init_params, model_args, model_kwargs)
        finite = [jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(state.z_grad)]
        self.init_ok = jnp.isfinite(state.potential_energy) & jnp.all(jnp.stack(finite))
        return state


def _mcmc(model, static: tuple, settings: tuple, num_chains: int, method: str) -> MCMC:
    o = dict(settings)
    kernel = _CheckedNUTS(functools.partial(model, **dict(static)), dense_mass=o["dense_mass"],
                          target_accept_prob=o["target_accept_prob"], max_tree_depth=o["max_tree_depth"],
                          init_strategy=INIT_STRATEGIES[o["init"]])
    return MCMC(kernel, num_warmup=o["num_warmup"], num_samples=o["num_samples"], num_chains=num_chains,
                thinning=o["thinning"], chain_method=method, progress_bar=o["progress"], jit_model_args=True)


@programs.cached(maxsize=16)
def _sampler(model, static: tuple, settings: tuple) -> MCMC:
    """NumPyro's ``MCMC`` for ``model`` with its non-array arguments ``static`` bound and these settings, kept
    for the process: the data arrays are arguments of the compiled program (``jit_model_args``), so fits of
    one model on data of the same shapes (other seeds, other data sets) compile once. Used with a progress bar
    (NumPyro draws it from the host); without one, ``_sampling_program``."""
    o = dict(settings)
    return _mcmc(model, static, settings, o["num_chains"], chain_method(o["num_chains"]))


class SamplingProgram(NamedTuple):
    """``run(key, data arrays) -> (draws, extra fields, init_ok)``, every leaf with a leading chain axis,
    compiled as one program; ``chain_method`` says how its chains are mapped."""

    chain_method: str
    run: Callable


@programs.cached(maxsize=16)
def _sampling_program(model, static: tuple, settings: tuple) -> SamplingProgram:
    """The whole NUTS run without a progress bar (the model's trace, the search for an initial point, the
    adaptation's start, warm-up and sampling, every chain) as **one** compiled program of (key, data arrays),
    kept for the process.

    Why not ``MCMC.run`` itself: NumPyro initialises one chain, and vectorized chains, operation by operation
    (hundreds of eager XLA programs in a first fit), and it traces a new ``pmap`` for every run of parallel
    chains, so a second fit on same-shaped data compiled again (benchmarks/results.md, "lab notes from
    inference/"). Chain ``c`` runs NumPyro's one-chain ``MCMC.run`` with
    ``split(key, num_chains)[c]`` (``key`` itself for one chain), as ``MCMC.run`` does, so the draws are those
    of NumPyro's own parallel and sequential chain methods; the chains are mapped by ``chain_method``: ``pmap``,
    ``vmap`` (vectorized) or ``lax.map`` (sequential)."""
    o = dict(settings)
    num_chains, method = o["num_chains"], chain_method(o["num_chains"])

    def one_chain(key, arrays):
        mcmc = _mcmc(model, static, settings, 1, "sequential")
        mcmc.run(key, **arrays, extra_fields=EXTRA_FIELDS)
        return mcmc.get_samples(), mcmc.get_extra_fields(), mcmc.sampler.init_ok

    def run(key, arrays):
        if num_chains == 1:
            return jax.tree.map(lambda a: a[None], one_chain(key, arrays))
        keys = jax.random.split(key, num_chains)
        if method == "parallel":
            return jax.pmap(one_chain, in_axes=(0, None))(keys, arrays)
        if method == "vectorized":
            return jax.vmap(one_chain, in_axes=(0, None))(keys, arrays)
        return jax.lax.map(lambda k: one_chain(k, arrays), keys)

    return SamplingProgram(method, jax.jit(run))


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
    if dict(settings)["progress"]:
        mcmc = _sampler(model, static, settings)
        mcmc.run(ctx.key, **arrays, extra_fields=EXTRA_FIELDS)
        samples, extra = mcmc.get_samples(group_by_chain=True), mcmc.get_extra_fields(group_by_chain=True)
    else:
        samples, extra, init_ok = _sampling_program(model, static, settings).run(ctx.key, arrays)
        if not np.all(np.asarray(init_ok)):
            raise RuntimeError(f"{NUMPYRO_NO_INIT} (chains {np.flatnonzero(~np.asarray(init_ok)).tolist()})")
    if reform is not None:
        samples = map_draws(reform, host_keys.fold_in(ctx.key, 1), samples, kwargs)
    samples = {k: np.asarray(v) for k, v in samples.items()}
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
    """``reform.to_sites`` applied to every draw of ``samples`` (leading (chain, draw) axes), one key per draw
    (``split(key, n)``, made on the host). Reshaped and cut in NumPy: as JAX operations, one at a time, each
    reshape compiled a program of its own."""
    samples = jax.device_get(samples)
    n_chain, n_draw = next(iter(samples.values())).shape[:2]
    flat = {k: np.reshape(np.asarray(v), (n_chain * n_draw, *np.shape(v)[2:])) for k, v in samples.items()}
    keys = host_keys.split(key, n_chain * n_draw)
    arrays, static = split_arguments(model_kwargs)
    batch = min(batch_size, n_chain * n_draw)
    out = jax.device_get(_site_mapper(reform, static, batch)(keys, flat, arrays))
    return {k: np.reshape(np.asarray(v), (n_chain, n_draw, *np.shape(v)[1:])) for k, v in out.items()}


@programs.cached(maxsize=16)
def _site_mapper(reform, static: tuple, batch: int):
    """The compiled ``(keys, draws, data arrays) -> model sites`` of ``map_draws``, one per reformulation and
    non-array arguments (data arrays are arguments, so same-shaped data share it)."""

    def to_sites(keys, flat, arrays):
        kwargs = {**dict(static), **arrays}
        return jax.lax.map(lambda a: reform.to_sites(a[0], a[1], kwargs), (keys, flat), batch_size=batch)

    return jax.jit(to_sites)

