"""``inference.fit``: the one entry point for every (model, method) pair, and its three stages.

``fit = build . run . prepare``:

* ``prepare(model, data, method, seed=, **options) -> Prepared``: every check (model, method, seed,
  hyperparameters, options, data, the model's own check), before anything compiles; holds the method and
  its ``FitContext``;
* ``run(prepared) -> Draws``: runs the method (the compiled part);
* ``build(prepared, draws) -> DataTree``: the ArviZ tree (log densities at every draw, data, attrs).

Callers that need only the draws (simulation-based calibration) or that validate every fit before a long
job (the comparison pipeline, then ``fit_prepared``) use the stages; everyone else calls ``fit``.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import pandas as pd
import xarray as xr

import zoo
from inference import programs
from inference._methods import Draws, FitContext, Method, get_method, resolve_options
from inference._timing import Stopwatch
from inference.limits import check_memory, check_shards, check_steps
from inference.trees import build_tree, densities_ahead, non_finite_as_error
from zoo._frames import FrameData, from_frame, with_columns
from zoo._runtime import DEVICE_ENV, current_device, requested_device, set_device
from zoo._validation import validate_data, validate_hyper


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A validated fit, ready to run: the method and the context it runs on; for data read from a table, the
    labels of its axes (``zoo._frames.FrameData.axis_labels``) and how it was read (``provenance``), which
    the tree carries."""

    method: Method
    context: FitContext
    axis_labels: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.method.name


def resolve(model: str | zoo.ModelSpec, method: str, options: Mapping[str, Any]
            ) -> tuple[zoo.ModelSpec, Method, dict[str, Any], dict[str, Any]]:
    """(spec, method, hyperparameters, method options) for ``options`` (hyperparameters and method options
    mixed, as ``fit`` takes them), every value checked; a ``ValueError`` naming the first bad one. The checks of
    ``prepare`` that need no data."""
    spec = zoo.get(model)
    meth = get_method(spec, method)
    check_option_names(spec, meth, options)
    hyper = validate_hyper(spec, {k: v for k, v in options.items() if k in spec.hyperparameters})
    opts = resolve_options(spec, meth, {k: v for k, v in options.items() if k not in spec.hyperparameters})
    check_steps(opts, defaults(spec, meth))
    return spec, meth, hyper, opts


def defaults(spec: zoo.ModelSpec, method: Method) -> dict[str, Any]:
    """The default of every hyperparameter of ``spec`` and every option of ``method`` (the model's per-method
    overrides included): what ``inference.limits`` sets a value back to when it names the one to lower."""
    return {**spec.default_hyper, **method.options, **spec.settings.method_options.get(method.name, {})}


def read_data(spec: zoo.ModelSpec, data: Any, columns: Mapping[str, Any] | None = None, dropna: bool = False
              ) -> FrameData:
    """``data`` (a dict of arrays or a pandas DataFrame) as a validated ``FrameData``: a DataFrame is read by
    the model's data contract with ``columns`` and ``dropna`` (``zoo._frames.from_frame``); a dict is taken as
    it is (``columns``/``dropna`` are then an error, they only mean something for a table)."""
    if isinstance(data, pd.DataFrame):
        return from_frame(spec, data, columns, dropna=dropna)
    for name, value, unset in (("columns", columns, None), ("dropna", dropna, False)):
        if value is not unset:
            raise ValueError(f"{name}: only for data given as a pandas DataFrame, got {type(data).__name__} data")
    clean = validate_data(spec, data)
    return FrameData(data=clean, columns={}, axis_labels={})


def prepare(model: str | zoo.ModelSpec, data: Any, method: str, *, seed: int,
            columns: Mapping[str, Any] | None = None, dropna: bool = False, device: str | None = None,
            **options: Any) -> Prepared:
    """Validate a fit (arguments as for ``fit``) before anything compiles; ``ValueError`` on the first bad
    argument, named (for a DataFrame, with the column a bad field was read from). Last, the fit's size: its
    sequential steps and its memory estimate against their limits (``inference.limits``), the model traced
    abstractly to count its latent values (nothing computed or compiled)."""
    select_device(device)  # first: JAX picks its platform at its first computation
    get_method(zoo.get(model), method)  # the checks in fit's order: model, method, seed, hyper, options, data
    seed = check_seed(seed)
    spec, meth, hyper, opts = resolve(model, method, options)
    table = read_data(spec, data, columns, dropna)
    if spec.check is not None:
        with_columns(lambda: spec.check(table.data, hyper), table.columns)
    if opts.get("z_init") is not None and {"agent", "entity"} <= table.data.keys() and "K" in hyper:
        check_z_init(opts["z_init"], table.data, hyper)
    ctx = FitContext(spec=spec, data=table.data, hyper=hyper, options=opts, key=key_of(seed), seed=seed)
    check_memory(spec, table.data, hyper, opts, defaults(spec, meth), ctx.model_kwargs)
    check_shards(table.data, opts)
    return Prepared(meth, ctx, table.axis_labels, table.provenance if table.columns else {})


def select_device(device: str | None) -> str | None:
    """``device`` (else ``$BAYES_ZOO_DEVICE``, else nothing to do) selected for this process, or checked if JAX
    has started (``zoo._runtime.set_device``); a ``ValueError`` naming ``device`` or the variable."""
    if device is not None:
        return set_device(device, "device")
    requested = requested_device()
    return set_device(requested, DEVICE_ENV) if requested is not None else None


def run(prepared: Prepared) -> Draws:
    """Run the prepared method to completion (blocks until its draws are computed); every non-finite blow-up
    is one ``NonFiniteError``."""
    with non_finite_as_error(prepared.name):
        draws = prepared.method.run(prepared.context)
        jax.block_until_ready(draws.posterior)
    return draws


def build(prepared: Prepared, draws: Draws, *, compile_seconds: float = 0.0, run_seconds: float = 0.0,
          ahead: programs.Ahead | None = None) -> xr.DataTree:
    """The DataTree of ``draws`` (``inference.trees.build_tree``) with the prepared fit's data and attrs;
    ``ahead``: its log densities' program compiled ahead (``inference.trees.densities_ahead``)."""
    ctx = prepared.context
    with non_finite_as_error(prepared.name):
        tree = build_tree(ctx.spec, ctx.data, ctx.hyper, draws, method=prepared.name, seed=ctx.seed,
                          options=ctx.options, compile_seconds=compile_seconds, run_seconds=run_seconds,
                          axis_labels=prepared.axis_labels, data_source=prepared.provenance,
                          model_kwargs=ctx.model_kwargs, ahead=ahead)
    tree.attrs["device"] = current_device()
    return tree


def fit(model: str | zoo.ModelSpec, data: Any, method: str, *, seed: int, columns: Mapping[str, Any] | None = None,
        dropna: bool = False, device: str | None = None, **options: Any) -> xr.DataTree:
    """Fit ``model`` to ``data`` with ``method`` and return an ArviZ ``xarray.DataTree``.

    Parameters
    ----------
    model:
        a registered name (``zoo.list_models()``) or a ``zoo.ModelSpec``.
    data:
        a pandas DataFrame, or a dict of arrays following the model's data contract
        (``zoo.get(model).data_fields``; ``zoo show MODEL`` prints both).
    method:
        ``"nuts"``, ``"svi"`` or one of the model's hand-written kernels (``inference.methods_for(model)``).
    seed:
        integer seed; the same seed and options give identical draws.
    columns:
        for a DataFrame, field -> column name(s), e.g. ``{"X": ["price", "promo"], "y": "sales",
        "agent": "store", "entity": "product"}``; fields not named take the column of their own name, and
        the model's one remaining matrix field (``X`` or ``Y``) every other column (``zoo._frames``).
        Index fields (agent, entity, group, node) take any labels; the labels, the row index and the
        matrix field's column names become the tree's coordinates (hlcr's ``agent`` dim indexed by
        store, ``pair`` by ``"store:product"`` with ``pair_agent``/``pair_entity`` coordinates beside it;
        ``tree.posterior.set_xindex(["pair_agent", "pair_entity"])`` selects by either).
    dropna:
        for a DataFrame: drop the rows with a missing value where the model allows none (default: such
        rows are a ``ValueError`` naming the column and the number of rows). NaN where the model allows it
        (bpca's ``Y``: a missing entry) is always kept.
    device:
        ``"cpu"`` or ``"gpu"``: the platform JAX computes on. JAX picks it once per process, at its first
        computation, so it is a setting of the process: the first fit (or ``zoo.set_device``, or the
        environment variable ``BAYES_ZOO_DEVICE``, or ``zoo --device``) selects it, later fits may only
        name the same one. Default: ``$BAYES_ZOO_DEVICE``, else the process's platform (the CPU unless
        ``JAX_PLATFORMS`` says otherwise). ``"gpu"`` where JAX finds no GPU is a ``ValueError`` naming
        ``device``, with the platforms found and how to install CUDA JAX. The tree's ``device`` attr
        names the device the fit ran on.
    options:
        the model's hyperparameters (``spec.hyperparameters``) and the method's options.
        Shared names: ``num_warmup``, ``num_samples``, ``num_chains`` (samplers; Gibbs counts
        sweeps), ``max_iter``/``tol`` (VB/EM/ADMM loops), ``num_steps`` (SVI), ``num_samples``
        (draws taken from a variational posterior), ``progress`` (progress bar; default: when
        stderr is a terminal).

    Returns
    -------
    xarray.DataTree
        groups ``posterior``, ``sample_stats``, ``log_likelihood``, ``log_prior``, ``observed_data``,
        ``constant_data`` and attrs ``model``, ``method``, ``seed``, ``options``, ``hyperparameters``,
        ``package_versions``, ``compile_seconds``, ``run_seconds``, ``device``.

    Raises
    ------
    ValueError
        bad model/method/option/hyperparameter/data, before any compilation (``prepare``).
    inference.NonFiniteError
        the fit hit NaN/inf (draws, log densities, a kernel's floating-point error or NumPyro rejecting a
        non-finite parameter), with the method, the variable and advice.
    """
    return fit_prepared(prepare(model, data, method, seed=seed, columns=columns, dropna=dropna, device=device,
                                **options))


def fit_prepared(prepared: Prepared) -> xr.DataTree:
    """``run`` then ``build`` a prepared fit, its compile and run seconds measured (``inference._timing``). The
    tree's log densities program is compiled while the method runs (``inference.trees.densities_ahead``): its
    shapes are known from the model before the draws are."""
    ctx = prepared.context
    with densities_ahead(ctx.spec, ctx.model_kwargs) as ahead:
        with Stopwatch() as watch:
            draws = run(prepared)
        return build(prepared, draws, compile_seconds=watch.compile_seconds, run_seconds=watch.run_seconds,
                     ahead=ahead)


def check_option_names(spec: zoo.ModelSpec, method: Method, options: Mapping[str, Any]) -> None:
    """A ``ValueError`` for an option name that is neither an option of ``method`` nor a hyperparameter of
    ``spec`` but close to one (``num_sample``, ``k``): it says which one was meant. Other unknown names are left
    to ``resolve_options``, which lists every option."""
    known = [*method.declared, *spec.hyperparameters]
    for name in options:
        if name in known:
            continue
        close = [k for k in known if k.lower() == str(name).lower()] or \
            difflib.get_close_matches(str(name), known, n=1, cutoff=0.8)
        if close:
            raise ValueError(f"{name}: not an option of method {method.name!r} for {spec.name!r} nor a "
                             f"hyperparameter; did you mean {close[0]}?")


def check_z_init(z_init: Any, data: Mapping[str, Any], hyper: Mapping[str, Any]) -> np.ndarray:
    """``z_init`` (hlcr's Gibbs kernels: the starting cluster of every (agent, entity) pair) as an int64 array,
    when it is one integer label in 0..K-1 per pair of ``data`` (``zoo.hlcr.pair_structure``), else a
    ``ValueError`` naming ``z_init`` and the offending entry. Checked by ``prepare``, so ``zoo compare`` refuses
    it before any fit."""
    from zoo.hlcr import pair_structure

    K = int(hyper["K"])
    n_pairs = pair_structure(data["agent"], data["entity"])["n_pairs"]
    expected = f"z_init: expected {n_pairs} integer labels in 0..{K - 1} (one per (agent, entity) pair)"
    try:
        z = np.asarray(z_init)
    except ValueError:
        raise ValueError(f"{expected}, got a ragged list") from None
    if z.shape != (n_pairs,):
        raise ValueError(f"{expected}, got an array of shape {z.shape}")
    if z.dtype.kind not in "iu":
        bad = next((i for i, v in enumerate(z.tolist()) if isinstance(v, bool) or not isinstance(v, int)), 0)
        raise ValueError(f"{expected}, got {z[bad].item() if z.dtype != object else z[bad]!r} (entry {bad}, "
                         f"{'a non-integer' if z.dtype.kind == 'f' else z.dtype})")
    out_of_range = (z < 0) | (z >= K)
    if out_of_range.any():
        bad = int(np.flatnonzero(out_of_range)[0])
        raise ValueError(f"{expected}, got {z[bad].item()} (entry {bad})")
    return z.astype(np.int64)


MAX_SEED = 2**63 - 1


def key_of(seed: int) -> jax.Array:
    """``jax.random.key(seed)``, built from its words on the host: run as a JAX operation it compiled two programs
    in every fresh process. The default threefry key of a 64-bit seed is the words (seed >> 32, seed mod 2**32);
    another PRNG implementation gets ``jax.random.key`` itself."""
    if jax.config.jax_default_prng_impl != "threefry2x32":
        return jax.random.key(seed)
    return jax.random.wrap_key_data(np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32))


def check_seed(seed: Any) -> int:
    """``seed`` as a Python int in [0, 2**63 - 1] (NumPy integers accepted), else a ``ValueError``."""
    if isinstance(seed, np.integer):
        seed = int(seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed: expected an integer in [0, 2**63 - 1], got {seed!r}")
    return seed
