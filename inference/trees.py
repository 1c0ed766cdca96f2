"""The one place where a method's draws become an ArviZ ``xarray.DataTree``.

Every method, sampler or variational, hand-written or NumPyro's, ends here, so every tree has the
same groups: ``posterior``, ``sample_stats``, ``log_likelihood`` (pointwise), ``log_prior`` (one
variable per prior site), ``observed_data``, ``constant_data``. The log densities are computed by
evaluating the NumPyro model at the draws (``handlers.substitute`` + ``trace``, the same terms
``numpyro.infer.util.log_density`` sums), so ArviZ ``loo``/``psense``/``compare`` work on any method,
and ``sum(log_prior) + sum(log_likelihood) == log_density`` at every draw.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import re
import types
from collections.abc import Mapping
from importlib import metadata
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from numpyro import handlers

from inference import programs
from zoo import ModelSpec

SAMPLE_DIMS = ("chain", "draw")
_PACKAGES = ("bayes-zoo", "numpyro", "jax", "jaxlib", "arviz", "arviz-base", "arviz-stats", "arviz-plots",
             "xarray", "numpy")


class NonFiniteError(FloatingPointError):
    """A fit produced NaN or inf draws (raised instead of returning a tree full of NaNs)."""


ADVICE = ("try more warm-up/iterations, a smaller step size, or check the data (scale, outliers) and the "
          "hyperparameters (a very vague prior)")
_NUMPYRO_INVALID = re.compile(r"(\w+) distribution got invalid (\w+) parameter")
NUMPYRO_NO_INIT = "Cannot find valid initial parameters"


@contextlib.contextmanager
def non_finite_as_error(method: str):
    """Every non-finite blow-up inside ``method`` as one ``NonFiniteError``: a floating-point error of a
    kernel, NumPyro's argument validation rejecting a parameter that became NaN/inf (``"... distribution
    got invalid loc parameter"``), NumPyro finding no initial point with a finite log density. Other
    exceptions pass through unchanged."""
    try:
        yield
    except NonFiniteError:
        raise
    except FloatingPointError as exc:
        raise NonFiniteError(f"method {method!r} hit a non-finite value ({exc}); {ADVICE}") from exc
    except ValueError as exc:
        found = _NUMPYRO_INVALID.search(str(exc))
        if found is None:
            raise
        raise NonFiniteError(f"method {method!r}: NumPyro's {found[1]} distribution got an invalid {found[2]!r} "
                             f"parameter (NaN/inf or out of its support) during the fit; {ADVICE}") from exc
    except RuntimeError as exc:
        if NUMPYRO_NO_INIT not in str(exc):
            raise
        raise NonFiniteError(f"method {method!r}: NumPyro found no initial point with a finite log density "
                             f"(every latent variable tried gave NaN/inf); {ADVICE}") from exc


def package_versions() -> dict[str, str]:
    """The installed version of each of ``_PACKAGES`` (read once per process: every tree records them)."""
    return dict(_package_versions())


@functools.cache
def _package_versions() -> dict[str, str]:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def trace_model(spec: ModelSpec, model_kwargs: Mapping[str, Any], params: Mapping[str, Any] | None = None,
                seed: int = 0):
    """One trace of the model, with ``params`` substituted (latent sites not given are sampled)."""
    model = handlers.substitute(spec.model, data=dict(params or {}))
    return handlers.trace(handlers.seed(model, rng_seed=seed)).get_trace(**model_kwargs)


def trace_structure(spec: ModelSpec, model_kwargs: Mapping[str, Any], params: Mapping[str, Any] | None = None,
                    seed: int = 0) -> dict[str, dict]:
    """What ``latent_sites`` and ``site_dims`` read of ``trace_model(spec, model_kwargs, params, seed)``: per site
    its ``type``, ``is_observed``, ``fn`` (only its ``event_shape``) and ``cond_indep_stack``, found by tracing the
    model abstractly (``jax.eval_shape``), so nothing is computed or compiled: run eagerly, the model's
    operations compiled one small XLA program each, in every fit's tree. Kept per model, non-array arguments and
    shapes (``inference.programs``), so a second fit traces nothing. A model that cannot be traced with abstract
    values is run eagerly."""
    arrays, static = split_arguments(model_kwargs)
    try:
        prior = _structure(spec.model, static, _abstract(arrays), (), seed)
        if params is None or _abstract(params) == _latent_signature(prior):
            return prior   # the same sites and shapes: substituting them traces the same structure
        return _structure(spec.model, static, _abstract(arrays), _abstract(params), seed)
    except Exception:   # a model with Python control flow on data values: its eager trace
        return dict(trace_model(spec, model_kwargs, params, seed))


def _abstract(values: Mapping[str, Any]) -> tuple:
    """(name, shape, dtype) of each array, sorted by name: what a program traced on them depends on."""
    return tuple(sorted((k, tuple(np.shape(v)), np.result_type(v).str) for k, v in values.items()))


def _latent_signature(structure: Mapping[str, dict]) -> tuple:
    """``_abstract`` of one draw of every latent site of a ``trace_structure``."""
    return tuple(sorted((k, s["shape"], s["dtype"]) for k, s in structure.items()
                        if s["type"] == "sample" and not s["is_observed"]))


@programs.cached(maxsize=256)
def _structure(model, static: tuple, arrays: tuple, params: tuple, seed: int) -> dict[str, dict]:
    """``trace_structure`` of ``model`` for arrays and draws of these (name, shape, dtype)."""
    found: dict[str, dict] = {}

    def record(arrays, params):
        tr = handlers.trace(handlers.seed(handlers.substitute(model, data=params), rng_seed=seed)).get_trace(
            **dict(static), **arrays)
        for name, site in tr.items():
            value = site.get("value")
            found[name] = {"type": site["type"], "is_observed": site.get("is_observed", False),
                           "fn": types.SimpleNamespace(event_shape=tuple(getattr(site.get("fn"), "event_shape", ()))),
                           "cond_indep_stack": tuple(site.get("cond_indep_stack", ())),
                           "shape": tuple(np.shape(value)) if hasattr(value, "dtype") else None,
                           "dtype": np.dtype(value.dtype).str if hasattr(value, "dtype") else None}
        return 0

    spec_of = lambda d: {k: jax.ShapeDtypeStruct(shape, np.dtype(dtype)) for k, shape, dtype in d}  # noqa: E731
    jax.eval_shape(record, spec_of(arrays), spec_of(params))
    return found


def latent_sites(trace) -> list[str]:
    return [n for n, s in trace.items() if s["type"] == "sample" and not s["is_observed"]]


def site_dims(spec: ModelSpec, trace, name: str, shape: tuple[int, ...]) -> list[str]:
    """Names of a site's axes: the spec's, else the enclosing plates' names, else ``<site>_dim_<i>``."""
    if name in spec.dims:
        return list(spec.dims[name])
    dims = [f"{name}_dim_{i}" for i in range(len(shape))]
    site = trace.get(name)
    if site is not None and site["type"] == "sample":
        event_nd = len(getattr(site["fn"], "event_shape", ()))
        batch_nd = len(shape) - event_nd
        for frame in site.get("cond_indep_stack", ()):
            pos = batch_nd + frame.dim  # frame.dim counts from the right of the batch shape
            if 0 <= pos < batch_nd and shape[pos] == frame.size:
                dims[pos] = frame.name
    return dims


def _site_log_probs(model, likelihood_sites: tuple, model_kwargs: Mapping[str, Any], params: Mapping[str, Any]):
    """(per-prior-site log density, pointwise log likelihood per likelihood site) at one draw."""
    tr = handlers.trace(handlers.substitute(handlers.seed(model, 0), data=params)).get_trace(**model_kwargs)
    prior, lik = {}, {}
    for name, site in tr.items():
        if site["type"] != "sample":
            continue
        lp = site["fn"].log_prob(site["value"])
        if site.get("scale") is not None:
            lp = site["scale"] * lp
        if name in likelihood_sites:
            lik[name] = lp
        else:
            prior[name] = jnp.sum(lp)
    return prior, lik


def log_densities(spec: ModelSpec, model_kwargs: Mapping[str, Any], posterior: Mapping[str, np.ndarray],
                  batch_size: int = 64, ahead: programs.Ahead | None = None
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(log_prior, log_likelihood)`` at every draw of ``posterior`` (arrays with (chain, draw) axes).

    ``log_prior[site]`` has shape (chain, draw); ``log_likelihood[site]`` (chain, draw, then the site's batch axes).
    Draws are evaluated ``batch_size`` at a time (``vmap``), one call of one compiled program per batch, the last
    batch padded with copies of the last draw (cut on the host): memory stays bounded on big data, and the
    program does not depend on the number of draws (fits that differ in ``num_samples`` share it).
    ``ahead``: this program compiled ahead (``densities_ahead``), waited for when it was compiled for these draws
    (its error raised here); for other draws it is not this program, and only its end is waited for.
    """
    first = next(iter(posterior.values()))
    n_chain, n_draw = first.shape[:2]
    n = n_chain * n_draw
    flat = {k: np.reshape(np.asarray(v), (n, *np.shape(v)[2:])) for k, v in posterior.items()}
    arrays, static = split_arguments(model_kwargs)
    program = _log_density_program(spec.model, tuple(spec.likelihood_sites), static, batch_size)
    if ahead is not None:
        batch = {k: jax.ShapeDtypeStruct((batch_size, *v.shape[1:]), v.dtype) for k, v in flat.items()}
        if ahead.compiled_for(arrays, batch):
            ahead.result()
        else:
            ahead.discard()
    arrays = jax.device_put(arrays)   # moved once, not once per batch
    outs = []
    for lo in range(0, n, batch_size):
        rows = np.minimum(np.arange(lo, lo + batch_size), n - 1)
        outs.append(program(arrays, {k: v[rows] for k, v in flat.items()}))
    prior, lik = jax.tree.map(lambda *a: np.concatenate([np.asarray(b) for b in a])[:n], *jax.device_get(outs))
    unflat = lambda d: {k: np.asarray(v).reshape((n_chain, n_draw, *v.shape[1:])) for k, v in d.items()}
    return unflat(prior), unflat(lik)


def densities_ahead(spec: ModelSpec, model_kwargs: Mapping[str, Any], batch_size: int = 64) -> programs.Ahead:
    """The program of ``log_densities`` compiled ahead (``programs.compile_ahead``) for the draws a fit of
    ``spec`` on ``model_kwargs`` will return: one draw of every latent site, with the shapes and dtypes of the
    model's abstract trace (``trace_structure``). Started by ``inference.fit`` before the method runs, so XLA
    compiles it while the method's own programs are traced and compiled; ``build_tree`` waits for it where the
    draws have exactly those sites, shapes and dtypes (every registered method's do). Nothing is started (an
    ``Ahead`` of nothing) for a model that cannot be traced abstractly."""
    arrays, static = split_arguments(model_kwargs)
    try:
        structure = _structure(spec.model, static, _abstract(arrays), (), 0)
    except Exception:   # traced eagerly by build_tree (``trace_structure``): no shapes known before the draws
        return programs.Ahead(None, "densities")
    draws = {k: jax.ShapeDtypeStruct((batch_size, *shape), np.dtype(dtype)) for k, shape, dtype in
             _latent_signature(structure)}
    program = _log_density_program(spec.model, tuple(spec.likelihood_sites), static, batch_size)
    return programs.compile_ahead(program, {k: jax.ShapeDtypeStruct(np.shape(v), v.dtype) for k, v in arrays.items()},
                                  draws)


def split_arguments(model_kwargs: Mapping[str, Any]) -> tuple[dict, tuple]:
    """(data arrays, the other arguments as a sorted tuple of items): arrays become arguments of compiled
    programs, the rest (sizes, flags, scalar hyperparameters) is bound when they are built."""
    arrays = {k: v for k, v in model_kwargs.items() if isinstance(v, np.ndarray | jax.Array)}
    return arrays, tuple(sorted((k, v) for k, v in model_kwargs.items() if k not in arrays))


@programs.cached(maxsize=256)   # was an unbounded dict: many models and shapes in one process
def _log_density_program(model, likelihood_sites: tuple, static: tuple, batch: int):
    """The jitted ``(arrays, batch of draws) -> (log_prior, log_likelihood)`` of ``log_densities``, kept per (model,
    likelihood sites, non-array arguments, batch size): data arrays are arguments, not constants, so every fit of
    a model on data of the same shapes reuses one compiled program."""

    def densities(arrays, flat):
        kwargs = {**dict(static), **arrays}
        return jax.vmap(lambda q: _site_log_probs(model, likelihood_sites, kwargs, q))(flat)

    return jax.jit(densities)


def dataset(arrays: Mapping[str, Any], dims: Mapping[str, list[str]], coords: Mapping[str, Any],
            lead: tuple[str, ...]) -> xr.Dataset:
    """An ``xarray.Dataset`` of ``arrays`` whose leading axes are named ``lead`` (e.g. ``("chain", "draw")``)
    and the rest ``dims[name]`` (default ``<name>_dim_<i>``); ``coords`` label the axes they fit (an
    ``xarray.Variable`` is a non-dimension coordinate, kept where its dims fit); bools are stored as int8
    (netCDF has no bool)."""
    variables = {}
    for name, arr in arrays.items():
        arr = np.asarray(arr)
        if arr.dtype == bool:
            arr = arr.astype(np.int8)  # netCDF has no bool
        rest = list(dims.get(name, [f"{name}_dim_{i}" for i in range(arr.ndim - len(lead))]))
        if len(rest) != arr.ndim - len(lead):
            raise ValueError(f"dims for {name!r}: {rest} do not match its shape {arr.shape} after {lead}")
        variables[name] = (list(lead) + rest, arr)
    ds = xr.Dataset(variables)
    usable = {}
    for name, c in coords.items():
        if isinstance(c, xr.Variable):   # a non-dimension coordinate, e.g. pair_agent on dim pair
            if all(d in ds.dims and ds.sizes[d] == n for d, n in c.sizes.items()):
                usable[name] = c
        elif name in ds.dims and len(c) == ds.sizes[name]:
            usable[name] = np.asarray(c)
    return ds.assign_coords(usable)


def _json(obj: Any) -> str:
    def default(o):
        if isinstance(o, np.ndarray | jax.Array):
            return np.asarray(o).tolist()
        if isinstance(o, np.generic):
            return o.item()
        return repr(o)
    return json.dumps(obj, default=default, sort_keys=True)


def check_finite(name: str, arrays: Mapping[str, Any], method: str) -> None:
    for k, v in arrays.items():
        v = np.asarray(v)
        if np.issubdtype(v.dtype, np.floating) and not np.all(np.isfinite(v)):
            bad = int((~np.isfinite(v)).sum())
            raise NonFiniteError(f"method {method!r} produced {bad} non-finite value(s) in {name} variable "
                                 f"{k!r} (of {v.size}); {ADVICE}")


def build_tree(spec: ModelSpec, data: Mapping[str, np.ndarray], hyper: Mapping[str, Any], draws,
               *, method: str, seed: int, options: Mapping[str, Any], compile_seconds: float,
               run_seconds: float, axis_labels: Mapping[str, Any] | None = None,
               data_source: Mapping[str, Any] | None = None,
               model_kwargs: Mapping[str, Any] | None = None, ahead: programs.Ahead | None = None) -> xr.DataTree:
    """Assemble the DataTree for ``draws`` (an ``inference.Draws``) of ``spec`` fitted to ``data``.

    ``model_kwargs``: ``spec.inputs(data, hyper)`` where the caller already has them (a fit's context does:
    gp_alps's inputs are eigendecompositions, not to be computed twice per fit); else computed here.

    ``axis_labels``: data-axis symbol -> labels read from a table (``zoo._frames.FrameData.axis_labels``):
    the coordinates of the data groups' axis of that symbol and of the tree dimension ``spec.axis_dims``
    maps it to (``feature`` labelled ``price``, ``promo``). ``data_source``: attributes saying how the data
    were read (``FrameData.provenance``), stored as JSON. ``ahead``: the log densities' program compiled ahead
    (``densities_ahead``)."""
    posterior = {k: np.asarray(v) for k, v in draws.posterior.items()}
    check_finite("posterior", posterior, method)
    model_kwargs = dict(model_kwargs) if model_kwargs is not None else spec.inputs(dict(data), dict(hyper))
    one_draw = {k: v[0, 0] for k, v in posterior.items()}
    trace = trace_structure(spec, model_kwargs, one_draw)
    missing = [s for s in latent_sites(trace) if s not in posterior]
    if missing:
        raise ValueError(f"method {method!r} did not return draws of latent site(s) {missing} of model "
                         f"{spec.name!r}; log densities cannot be evaluated without them")
    model_sites = {k: v for k, v in posterior.items() if k in trace}
    log_prior, log_lik = log_densities(spec, model_kwargs, model_sites, ahead=ahead)
    check_finite("log_likelihood", log_lik, method)
    check_finite("log_prior", log_prior, method)

    coords = dict(spec.coords(dict(data), dict(hyper)) if spec.coords else {})
    coords.update(draws.coords)
    for symbol, labels in (axis_labels or {}).items():
        coords[symbol] = np.asarray(labels)
        if symbol in spec.axis_dims:
            coords[spec.axis_dims[symbol]] = np.asarray(labels)
    n_chain, n_draw = next(iter(posterior.values())).shape[:2]
    sample_coords = {"chain": np.arange(n_chain), "draw": np.arange(n_draw)}
    fields = {f.name: f for f in spec.data_fields}
    field_dims = {k: [str(s) for s in fields[k].shape] for k in data}

    dims = {k: site_dims(spec, trace, k, v.shape[2:]) for k, v in posterior.items()}
    dims.update(draws.dims)
    lik_dims = {}
    for k, v in log_lik.items():
        shape = v.shape[2:]
        if k in field_dims and np.shape(data[k]) == shape:
            lik_dims[k] = field_dims[k]
        else:
            lik_dims[k] = site_dims(spec, trace, k, shape)

    all_coords = {**sample_coords, **coords}
    groups = {
        "posterior": dataset(posterior, dims, all_coords, SAMPLE_DIMS),
        "log_likelihood": dataset(log_lik, lik_dims, all_coords, SAMPLE_DIMS),
        "log_prior": dataset(log_prior, {}, all_coords, SAMPLE_DIMS),
    }
    stats = dataset(draws.sample_stats, draws.dims, all_coords, SAMPLE_DIMS)
    trace_dims = {k: draws.dims.get(k, ["iteration"] + [f"{k}_dim_{i}" for i in range(np.ndim(v) - 1)])
                  for k, v in draws.traces.items()}
    groups["sample_stats"] = xr.merge([stats, dataset(draws.traces, trace_dims, all_coords, ())])

    observed = spec.observed_fields if spec.observed_fields is not None else tuple(
        k for k in spec.likelihood_sites if k in data)
    groups["observed_data"] = dataset({k: data[k] for k in observed if k in data}, field_dims, coords, ())
    groups["constant_data"] = dataset({k: v for k, v in data.items() if k not in observed}, field_dims,
                                       coords, ())
    for name, ds in draws.groups.items():
        groups[name] = ds

    attrs = {
        "model": spec.name,
        "method": method,
        "seed": int(seed),
        "options": _json(options),
        "hyperparameters": _json(hyper),
        "package_versions": _json(package_versions()),
        "compile_seconds": float(compile_seconds),
        "run_seconds": float(run_seconds),
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "inference_library": "bayes-zoo",
        **{k: (v if isinstance(v, str | int | float) else _json(v)) for k, v in (data_source or {}).items()},
    }
    attrs.update({k: (v if isinstance(v, str | int | float) else _json(v)) for k, v in draws.attrs.items()})
    for name, value, cast in (("objective", draws.objective, float), ("converged", draws.converged, int),
                              ("n_iter", draws.n_iter, int)):
        if value is not None:
            attrs[name] = cast(value)
    tree = xr.DataTree.from_dict({f"/{k}": v for k, v in groups.items()})
    tree.attrs.update(attrs)
    for name in ("posterior", "sample_stats"):
        tree[name].attrs.update(attrs)
    return tree


def data_of(tree: xr.DataTree) -> dict[str, np.ndarray]:
    """The data a tree was fitted to (``observed_data`` and ``constant_data`` merged), exactly as stored."""
    out = {}
    for group in ("observed_data", "constant_data"):
        if group in tree.children:
            out.update({k: v.values for k, v in tree[group].to_dataset().items()})
    return out


def problem_of(tree: xr.DataTree) -> tuple[ModelSpec, dict[str, np.ndarray], dict[str, Any]]:
    """The inverse of ``build_tree``: (spec, validated data, hyperparameters) a tree was fitted with.

    The model comes from the ``model`` attribute, the data from the stored groups (``data_of``), the
    hyperparameters from the ``hyperparameters`` attribute over the model's defaults. Every place that goes
    from a tree back to a model's inputs uses this function."""
    import zoo
    from zoo._validation import validate_data

    if "model" not in tree.attrs:
        raise ValueError("tree: has no 'model' attribute; it was not made by inference.fit / build_tree")
    spec = zoo.get(tree.attrs["model"])
    hyper = {**spec.default_hyper, **json.loads(tree.attrs.get("hyperparameters", "{}"))}
    return spec, validate_data(spec, data_of(tree)), hyper
