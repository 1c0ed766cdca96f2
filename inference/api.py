"""``inference.fit``: the one entry point for every (model, method) pair."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import xarray as xr

import zoo
from inference._methods import FitContext, get_method, resolve_options
from inference._timing import Stopwatch
from inference.trees import build_tree, non_finite_as_error
from zoo._validation import validate_data, validate_hyper


def fit(model: str | zoo.ModelSpec, data: dict, method: str, *, seed: int, **options: Any) -> xr.DataTree:
    """Fit ``model`` to ``data`` with ``method`` and return an ArviZ ``xarray.DataTree``.

    Parameters
    ----------
    model:   a registered name (``zoo.list_models()``) or a ``zoo.ModelSpec``.
    data:    dict of arrays following the model's data contract (``zoo.get(model).data_fields``).
    method:  ``"nuts"``, ``"svi"`` or one of the model's hand-written kernels (``spec.methods``).
    seed:    integer seed; the same seed and options give identical draws.
    options: the model's hyperparameters (``spec.hyperparameters``) and the method's options.
             Shared names: ``num_warmup``, ``num_samples``, ``num_chains`` (samplers; Gibbs counts
             sweeps), ``max_iter``/``tol`` (VB/EM/ADMM loops), ``num_steps`` (SVI), ``num_samples``
             (draws taken from a variational posterior), ``progress`` (progress bar; default: when
             stderr is a terminal).

    Returns
    -------
    DataTree with groups ``posterior``, ``sample_stats``, ``log_likelihood``, ``log_prior``,
    ``observed_data``, ``constant_data`` and attrs ``model``, ``method``, ``seed``, ``options``,
    ``hyperparameters``, ``package_versions``, ``compile_seconds``, ``run_seconds``.

    Raises
    ------
    ValueError: bad model/method/option/hyperparameter/data, before any compilation.
    inference.NonFiniteError: the fit hit NaN/inf (draws, log densities, a kernel's floating-point
        error or NumPyro rejecting a non-finite parameter), with the method, the variable and advice.
    """
    spec = zoo.get(model)
    meth = get_method(spec, method)
    seed = check_seed(seed)
    hyper = validate_hyper(spec, {k: v for k, v in options.items() if k in spec.hyperparameters})
    opts = resolve_options(spec, meth, {k: v for k, v in options.items() if k not in spec.hyperparameters})
    clean = validate_data(spec, data)
    if spec.check is not None:
        spec.check(clean, hyper)
    ctx = FitContext(spec=spec, data=clean, hyper=hyper, options=opts, key=jax.random.key(seed), seed=seed)
    with non_finite_as_error(method):
        with Stopwatch() as watch:
            draws = meth.run(ctx)
            jax.block_until_ready(draws.posterior)
        return build_tree(spec, clean, hyper, draws, method=method, seed=seed, options=opts,
                          compile_seconds=watch.compile_seconds, run_seconds=watch.run_seconds)


MAX_SEED = 2**63 - 1


def check_seed(seed: Any) -> int:
    """``seed`` as a Python int in [0, 2**63 - 1] (NumPy integers accepted), else a ``ValueError``."""
    if isinstance(seed, np.integer):
        seed = int(seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed: expected an integer in [0, 2**63 - 1], got {seed!r}")
    return seed
