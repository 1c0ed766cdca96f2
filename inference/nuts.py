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

A run is one compiled program (``_sampling_program``, kept per model, settings and data shapes) of NumPyro's own
kernel, called from the host until ``num_samples`` draws are kept (``run_chains``): ``num_samples``, ``thinning``
and the key are its arguments, so fits that differ only in them compile nothing; a progress bar is advanced
between calls. ``num_samples`` counts the draws kept: a run takes ``num_warmup + num_samples * thinning``
transitions, as every sampler of the zoo. The draws are those of NumPyro's ``MCMC.run`` with ``num_samples *
thinning`` samples and this ``thinning``.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import NUTS
from tqdm.auto import tqdm

from inference import host_keys, loop, programs
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
# the settings compiled into the sampling program; num_samples, thinning and the key are its arguments
PROGRAM_SETTINGS = ("num_warmup", "num_chains", "dense_mass", "target_accept_prob", "max_tree_depth", "init")
EXTRA_FIELDS = ("diverging", "energy", "num_steps", "accept_prob", "adapt_state.step_size")


class SamplingProgram(NamedTuple):
    """``run(carry, keys, data arrays, budget, start) -> (carry, buffer, next t, kept)``, compiled once, every
    leaf with a leading chain axis; ``start_shapes(keys, data arrays)``: the carry's shapes (abstract, nothing
    compiles); ``chain_method`` says how its chains are mapped."""

    chain_method: str
    run: Callable
    start_shapes: Callable


def _is_key(a) -> bool:
    return jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key)


def _words_of(tree):
    """``tree`` with every key leaf as its data words: the carry leaves and enters the program as plain arrays (a
    key array on the device, sharded over the chains by ``pmap``, compiled a slicing program of its own)."""
    return jax.tree.map(lambda a: jax.random.key_data(a) if _is_key(a) else a, tree)


def _keys_of(tree, like):
    """``_words_of`` undone: the leaves that are keys in ``like`` (shapes) wrapped again."""
    return jax.tree.map(lambda a, s: jax.random.wrap_key_data(a, impl=s.dtype._impl) if _is_key(s) else a, tree, like)


def _init_ok(state) -> jax.Array:
    """Whether the initial point has a finite potential energy and gradient. NumPyro checks this only when its
    search runs outside a trace (``find_valid_initial_params``); inside the program it cannot, so the program
    returns the flag and ``run_nuts`` raises NumPyro's error."""
    finite = [jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(state.z_grad)]
    return jnp.isfinite(state.potential_energy) & jnp.all(jnp.stack(finite))


@programs.cached(maxsize=16)
def _sampling_program(model, static: tuple, settings: tuple) -> SamplingProgram:
    """The NUTS run of ``model`` (its non-array arguments ``static`` bound) as **one** compiled program, kept for
    the process, called from the host until every draw is kept (``run_nuts``). Only ``PROGRAM_SETTINGS`` of
    ``settings`` shape it: ``num_samples``, ``thinning`` and the key are arguments, so fits that differ only in
    them compile nothing. ``num_warmup`` stays a constant: NumPyro builds the warm-up's adaptation windows in
    Python from it when the kernel starts (``build_adaptation_schedule``, closed over by the kernel's step).

    Chain ``c`` is NumPyro's own kernel (``NUTS.init``, ``NUTS.sample`` and ``postprocess_fn``, as
    ``MCMC.run`` calls them with ``jit_model_args``) from ``keys[c]`` (``split(key, num_chains)[c]``, ``key``
    itself for one chain, as ``MCMC.run`` splits it). A call: where ``start`` (a run's first call), the carry is
    replaced by every chain's ``NUTS.init`` and whether it found a finite initial point (``lax.cond``); then a
    ``while_loop`` of NUTS transitions ``t = t0, ...`` that ends at ``total = num_warmup + num_samples *
    thinning``, after ``limit`` transitions, or when its buffer of kept draws is full (``ROWS`` draws, fewer where
    a draw is large); transition ``t`` is kept where ``t >= num_warmup`` and ``(t - num_warmup + 1) % thinning ==
    0`` (the last of every ``thinning``), its constrained sites and ``EXTRA_FIELDS`` written to the buffer. So the
    draws are those of ``MCMC.run`` with ``num_samples * thinning`` samples thinned by ``thinning``.
    ``budget = (thinning, total, t0, limit)``.

    The chains are mapped by ``chain_method``: ``pmap``, ``vmap`` (vectorized) or ``lax.map`` (sequential); one
    chain is not mapped. Why not ``MCMC.run`` itself: it initialises one chain, and vectorized chains, operation
    by operation (hundreds of eager XLA programs in a first fit), traces a new ``pmap`` for every run of parallel
    chains, and compiles ``num_samples`` and ``thinning`` into its loop (benchmarks/results.md, "lab notes from
    inference/")."""
    o = dict(settings)
    num_warmup, num_chains = int(o["num_warmup"]), int(o["num_chains"])
    method = chain_method(num_chains)

    def kernel() -> NUTS:
        return NUTS(functools.partial(model, **dict(static)), dense_mass=o["dense_mass"],
                    target_accept_prob=o["target_accept_prob"], max_tree_depth=o["max_tree_depth"],
                    init_strategy=INIT_STRATEGIES[o["init"]])

    def start(nuts, key, arrays):
        state = nuts.init(key, num_warmup, None, (), arrays)
        return loop.strongly_typed((state, _init_ok(state)))

    def collect(nuts, state, arrays):
        return nuts.postprocess_fn((), arrays)(state.z), {f: operator.attrgetter(f)(state) for f in EXTRA_FIELDS}

    # one kernel, and one chain's start and draw as jitted functions kept with the program: their shapes
    # (``start_shapes``, the buffer's) and their use inside the program share one trace (JAX keeps a jitted
    # function's jaxpr per argument types; ``NUTS.init`` sets the kernel up once, as ``MCMC`` relies on), where
    # calling the Python functions again traced NumPyro's initialisation three times per program
    nuts = kernel()
    start_one = jax.jit(lambda key, arrays: start(nuts, key, arrays))
    collect_one = jax.jit(lambda state, arrays: collect(nuts, state, arrays))

    def one_chain(carry, key, arrays, budget, fresh):
        thinning, total, t0, limit = budget
        carry = jax.lax.cond(fresh, lambda: start_one(key, arrays), lambda: carry)
        shapes = jax.eval_shape(collect_one, carry[0], arrays)
        rows = loop._buffer_rows(shapes, num_chains)
        buffer = loop.empty_buffer(shapes, rows)
        end = jnp.minimum(total, t0 + limit)

        def go_on(state):
            t, j, _, _ = state
            return (t < end) & (j < rows)

        def body(state):
            t, j, (hmc, ok), buffer = state
            hmc = nuts.sample(hmc, (), arrays)
            kept = loop.is_kept(t, num_warmup, thinning)
            # row j is written at every transition (in place: a buffer chosen by a cond would be copied) and
            # kept where j moves on; the draw is constrained only where kept
            draw = jax.lax.cond(kept, lambda: collect_one(hmc, arrays),
                                lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))
            buffer = jax.tree.map(lambda b, x: jax.lax.dynamic_update_index_in_dim(b, x, j, 0), buffer, draw)
            return t + 1, j + kept.astype(jnp.int32), (hmc, ok), buffer

        t, j, carry, buffer = jax.lax.while_loop(go_on, body, (t0, jnp.asarray(0, jnp.int32), carry, buffer))
        return loop.strongly_typed(carry), buffer, t, j

    def every_start(keys, arrays):
        # every chain's start mapped as ``run`` maps the chains, so that its trace is the one ``one_chain`` meets
        # (under pmap every value's type names the device mesh, and a jitted function is retraced for new types)
        if num_chains == 1:
            return jax.tree.map(lambda a: a[None], start_one(keys[0], arrays))
        if method == "parallel":
            return jax.pmap(start_one, in_axes=(0, None))(keys, arrays)
        if method == "vectorized":
            return jax.vmap(start_one, in_axes=(0, None))(keys, arrays)
        return jax.lax.map(lambda k: start_one(k, arrays), keys)

    def run(carry, key_words, arrays, budget, fresh):
        keys = jax.random.wrap_key_data(key_words)
        carry = _keys_of(carry, jax.eval_shape(every_start, keys, arrays))
        if num_chains == 1:
            out = one_chain(jax.tree.map(lambda a: a[0], carry), keys[0], arrays, budget, fresh)
            out = jax.tree.map(lambda a: a[None], out)
        else:
            mapped = (0, 0, None, None, None)
            if method == "parallel":
                out = jax.pmap(one_chain, in_axes=mapped)(carry, keys, arrays, budget, fresh)
            elif method == "vectorized":
                out = jax.vmap(one_chain, in_axes=mapped)(carry, keys, arrays, budget, fresh)
            else:
                out = jax.lax.map(lambda c: one_chain(c[0], c[1], arrays, budget, fresh), (carry, keys))
        return (_words_of(out[0]), *out[1:])

    shapes: dict = {}

    def start_shapes(key_words, arrays):
        key = loop._shape_key((key_words, arrays))
        if key not in shapes:
            shapes[key] = jax.eval_shape(lambda w, a: _words_of(every_start(jax.random.wrap_key_data(w), a)),
                                         key_words, arrays)
        return shapes[key]

    return SamplingProgram(method, jax.jit(run), start_shapes)


def run_chains(program: SamplingProgram, key_words: np.ndarray, arrays: dict, *, num_warmup: int, num_samples: int,
               thinning: int, progress: bool, desc: str = "nuts") -> tuple[dict, dict]:
    """Every chain of ``program`` (chain ``c`` from the key of words ``key_words[c]``) for ``num_warmup +
    num_samples * thinning`` transitions, ``num_samples`` draws kept: calls of the one compiled program, each going
    on from the last one's carry, until every draw is kept (without a bar, as few calls as its buffer of kept draws
    allows; with one, a twentieth of the run per call, NumPyro's ``progress_rate``, the bar advanced between
    calls). Returns (constrained sites, ``EXTRA_FIELDS``) as NumPy arrays with leading (chain, draw) axes. Raises
    NumPyro's "Cannot find valid initial parameters" (``RuntimeError``) after the first call where a chain found
    no finite initial point."""
    total = num_warmup + num_samples * thinning
    chunk = max(1, -(-total // 20)) if progress else total
    carry = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), program.start_shapes(key_words, arrays))
    outs, t, fresh = [], 0, True
    bar = tqdm(total=total, desc=desc, disable=not progress, leave=False)
    while t < total:
        budget = (np.int32(thinning), np.int32(total), np.int32(t), np.int32(chunk))
        carry, out, t_next, kept = jax.device_get(program.run(carry, key_words, arrays, budget, np.bool_(fresh)))
        t_next, kept = int(t_next[0]), int(kept[0])
        if fresh:
            ok = np.asarray(carry[1])
            if not np.all(ok):
                bar.close()
                raise RuntimeError(f"{NUMPYRO_NO_INIT} (chains {np.flatnonzero(~ok).tolist()})")
            fresh = False
        if kept:
            outs.append(jax.tree.map(lambda a, k=kept: np.asarray(a)[:, :k], out))
        bar.update(t_next - t)
        bar.set_postfix_str("warmup" if t_next <= num_warmup else "sample", refresh=False)
        t = t_next
    bar.close()
    return jax.tree.map(lambda *a: np.concatenate(a, axis=1), *outs)


@register_method("nuts", kind="sampler", options=OPTIONS)
def run_nuts(ctx: FitContext) -> Draws:
    """No-U-Turn sampler on the model's log density (Hoffman & Gelman 2014; NumPyro's implementation)."""
    o = ctx.options
    kwargs = ctx.model_kwargs
    reform = ctx.spec.nuts_reformulation
    if reform is not None and not (o["reformulate"] and reform.applies(kwargs)):
        reform = None
    arrays, static = split_arguments(kwargs)
    settings = tuple((k, o[k]) for k in PROGRAM_SETTINGS)
    model = reform.model if reform else ctx.spec.model
    num_chains = o["num_chains"]
    keys = host_keys.split(ctx.key, num_chains) if num_chains > 1 else ctx.key
    key_words = host_keys.words(keys).reshape(num_chains, -1)
    samples, extra = run_chains(_sampling_program(model, static, settings), key_words, arrays,
                                num_warmup=o["num_warmup"], num_samples=o["num_samples"], thinning=o["thinning"],
                                progress=progress_enabled(o["progress"]))
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


MAP_BLOCK = 256   # draws per call of the site mapper (fixed: no num_samples shapes its program)


def map_draws(reform, key, samples: dict, model_kwargs: dict, block: int = MAP_BLOCK) -> dict:
    """``reform.to_sites`` applied to every draw of ``samples`` (leading (chain, draw) axes), draw ``i`` (chains
    one after the other) with the key ``split(key, n)[i]`` (made on the host), through one compiled program of
    ``block`` draws (``_site_mapper``), called per block, the last one padded with copies of the first draw and its
    extra rows cut, so no program depends on the number of draws. Reshaped and cut in NumPy: as JAX operations,
    one at a time, each reshape compiled a program of its own."""
    samples = jax.device_get(samples)
    n_chain, n_draw = next(iter(samples.values())).shape[:2]
    n = n_chain * n_draw
    n_blocks = -(-n // block)
    flat = {k: np.reshape(np.asarray(v), (n, *np.shape(v)[2:])) for k, v in samples.items()}
    flat = {k: np.concatenate([v, np.repeat(v[:1], n_blocks * block - n, axis=0)]) for k, v in flat.items()}
    words = host_keys.words(host_keys.split(key, n_blocks * block))
    arrays, static = split_arguments(model_kwargs)
    mapper = _site_mapper(reform, static)
    outs = [jax.device_get(mapper(host_keys.wrap(words[b * block:(b + 1) * block]),
                                  {k: v[b * block:(b + 1) * block] for k, v in flat.items()}, arrays))
            for b in range(n_blocks)]
    out = {k: np.concatenate([np.asarray(o[k]) for o in outs])[:n] for k in outs[0]}
    return {k: np.reshape(v, (n_chain, n_draw, *v.shape[1:])) for k, v in out.items()}


@programs.cached(maxsize=16)
def _site_mapper(reform, static: tuple):
    """The compiled ``(keys, draws, data arrays) -> model sites`` of ``map_draws``, vectorised over a block of draws,
    one per reformulation and non-array arguments (data arrays are arguments, so same-shaped data share it).
    A fit runs it once per block of draws, after sampling: compiled for compile speed (``programs.ONE_SHOT``)."""

    def to_sites(keys, flat, arrays):
        kwargs = {**dict(static), **arrays}
        return jax.vmap(lambda k, a: reform.to_sites(k, a, kwargs))(keys, flat)

    return jax.jit(to_sites, compiler_options=programs.ONE_SHOT)
