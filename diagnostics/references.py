"""Stored reference posteriors (what posteriordb does for Stan, done for this zoo).

A stored reference is one netCDF DataTree in ``zoo/references/<model>__<tag>.nc`` holding a long NUTS run
**and the exact data arrays it was computed on** (its ``observed_data`` and ``constant_data`` groups),
plus its validation record (``attrs["validation"]``, ``diagnostics.health.mcmc_health``). Nothing is
re-simulated to find it: ``zoo compare``, ``zoo demo``, tests and notebooks fit on the stored arrays
(``reference_data``), so a reference made on one CPU is found on any other, whatever last bits that
machine's BLAS/LAPACK would give a re-simulation.

* ``reference_data(name, tag)``: the stored arrays (what to fit on) and the tag;
* ``load(name, data=None, tag=None)``: the stored tree, and with ``data`` only if the stored arrays match
  it (same keys and shapes, equal indices, floats equal to ``MATCH_RTOL`` = 1e-12 relative, NaN at the same
  places): user data that went through other rounding still finds its reference, other data does not;
* ``generate(name, data, tag)``: runs the reference NUTS fit and stores it with its record;
* ``check_log_density(tree)``: the stored ``log_prior``/``log_likelihood`` double as a model-identity
  check (a model changed without regenerating its reference fails it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

import zoo
from inference import fit, log_densities, save
from inference import load as load_tree
from zoo._validation import validate_data

REFERENCE_DIR = Path(zoo.__file__).resolve().parent / "references"
MAX_DRAWS = 4000
DEFAULT_NUTS = {"num_warmup": 2000, "num_samples": 2000, "num_chains": 2}
MATCH_RTOL = 1e-12


def data_checksum(spec: zoo.ModelSpec, data: Mapping[str, Any]) -> str:
    """sha256 of the validated data arrays (keys, dtypes, shapes and bytes), order-independent.

    A cache key for results computed on the *same stored arrays* (e.g. a rerun of ``zoo demo`` reusing its
    fits); never a key for data that is re-simulated, whose last bits depend on the CPU."""
    clean = validate_data(spec, data)
    h = hashlib.sha256()
    for k in sorted(clean):
        a = np.ascontiguousarray(clean[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def data_of(tree: xr.DataTree) -> dict[str, np.ndarray]:
    """The data a tree was fitted to (observed_data and constant_data merged), exactly as stored."""
    out = {}
    for group in ("observed_data", "constant_data"):
        if group in tree.children:
            out.update({k: v.values for k, v in tree[group].to_dataset().items()})
    return out


def data_mismatch(spec: zoo.ModelSpec, stored: Mapping[str, Any], given: Mapping[str, Any],
                  rtol: float = MATCH_RTOL) -> str | None:
    """Why ``given`` is not the data ``stored`` (a sentence), or None when they match: same fields and shapes,
    integer fields equal, float fields equal to ``rtol`` relative to the field's largest magnitude, NaN at the
    same places. Tolerant to last-bit differences of a re-simulation on another CPU, nothing more."""
    a, b = validate_data(spec, stored), validate_data(spec, given)
    if set(a) != set(b):
        return f"fields differ: stored {sorted(a)}, given {sorted(b)}"
    for k in sorted(a):
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.shape != y.shape:
            return f"{k}: shape {y.shape}, stored {x.shape}"
        if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(y.dtype, np.floating):
            if not np.array_equal(x, y):
                return f"{k}: {int(np.sum(x != y))} values differ"
            continue
        x, y = x.astype(float), y.astype(float)
        if not np.array_equal(np.isnan(x), np.isnan(y)):
            return f"{k}: missing values at other places"
        ok = ~np.isnan(x)
        scale = float(np.max(np.abs(x[ok]))) if ok.any() else 0.0
        diff = float(np.max(np.abs(x[ok] - y[ok]))) if ok.any() else 0.0
        if diff > rtol * scale:
            return f"{k}: values differ by up to {diff:.3g} (allowed {rtol:g} x {scale:.3g})"
    return None


def reference_path(name: str, tag: str = "default") -> Path:
    return REFERENCE_DIR / f"{name}__{tag}.nc"


def stored_tags(name: str) -> list[str]:
    """Tags of the stored references of model ``name`` (``default`` first)."""
    tags = sorted(p.name[len(name) + 2:-3] for p in REFERENCE_DIR.glob(f"{name}__*.nc"))
    return sorted(tags, key=lambda t: t != "default")


def _thin(tree: xr.DataTree, max_draws: int) -> xr.DataTree:
    n_chain, n_draw = tree["posterior"].sizes["chain"], tree["posterior"].sizes["draw"]
    step = int(np.ceil(n_chain * n_draw / max_draws))
    if step <= 1:
        return tree
    out = tree.copy()
    for group in ("posterior", "log_likelihood", "log_prior", "sample_stats"):
        ds = tree[group].to_dataset()
        per_draw = [k for k in ds.data_vars if "draw" in ds[k].dims]
        out[group] = xr.DataTree(xr.merge([ds[per_draw].isel(draw=slice(None, None, step)),
                                           ds.drop_vars(per_draw).drop_dims("draw", errors="ignore")]))
    return out


def generate(name: str, data: Mapping[str, Any] | None = None, *, tag: str = "default", seed: int = 0,
             path: str | Path | None = None, **options: Any) -> xr.DataTree:
    """Run the reference NUTS fit for ``name`` on ``data`` and store it with its data and validation record
    (``diagnostics.health.mcmc_health``); returns the stored tree.

    Options: NUTS options and hyperparameters; defaults are ``DEFAULT_NUTS`` updated with
    ``spec.reference_options``.
    """
    from diagnostics.health import mcmc_health

    spec = zoo.get(name)
    if data is None:
        data, _ = spec.default_data()
    opts = {**DEFAULT_NUTS, **spec.reference_options, **options}
    tree = _thin(fit(spec, data, "nuts", seed=seed, **opts), MAX_DRAWS)
    health = mcmc_health(tree)
    tree.attrs.update({
        "reference_tag": tag,
        "validation": json.dumps(health),
        "reliable": int(health["reliable"]),
    })
    save(tree, path or reference_path(name, tag))
    return tree


def load(name: str, data: Mapping[str, Any] | None = None, *, tag: str | None = None) -> xr.DataTree | None:
    """The stored reference of model ``name``.

    Without ``data``: the one stored under ``tag`` (default: ``"default"``, else the model's only stored tag),
    or None when there is none. With ``data``: the stored reference (under ``tag``, or any tag) whose stored
    arrays match ``data`` (``data_mismatch``), or None."""
    spec = zoo.get(name)
    tags = [tag] if tag is not None else stored_tags(name)
    if data is None:
        tags = tags[:1] if tag is not None or "default" in tags or len(tags) == 1 else []
    for t in tags:
        path = reference_path(name, t)
        if not path.is_file():
            continue
        tree = load_tree(path)
        if data is None or data_mismatch(spec, data_of(tree), data) is None:
            return tree
    return None


def reference_data(name: str, tag: str | None = None) -> tuple[dict[str, np.ndarray], str]:
    """(the exact arrays the stored reference was computed on, its tag): the data ``zoo compare``, ``zoo demo``,
    tests and notebooks fit on. ``tag`` None: ``"default"`` if stored, else the model's first stored tag.
    Raises ``ValueError`` when the model has no stored reference."""
    tags = [tag] if tag is not None else stored_tags(name)
    for t in tags:
        path = reference_path(name, t)
        if path.is_file():
            return data_of(load_tree(path)), t
    raise ValueError(f"model: {name!r} has no stored reference{f' with tag {tag!r}' if tag else ''} in "
                     f"{REFERENCE_DIR} (make references)")


def get_or_generate(name: str, data: Mapping[str, Any] | None = None, *, tag: str = "default",
                    **options: Any) -> xr.DataTree:
    """The stored reference when it matches ``data``, else a fresh one (generated and stored)."""
    return load(name, data, tag=tag) or generate(name, data, tag=tag, **options)


def check_log_density(tree: xr.DataTree, n_points: int = 3, rtol: float = 1e-8) -> float:
    """Largest relative difference between the stored log prior + log likelihood at the first
    ``n_points`` draws and the current model's. Raises ``AssertionError`` above ``rtol`` (the model
    changed without regenerating the reference)."""
    import json as _json

    spec = zoo.get(tree.attrs["model"])
    hyper = spec.default_hyper
    hyper.update(_json.loads(tree.attrs.get("hyperparameters", "{}")))
    data = validate_data(spec, data_of(tree))
    post = tree["posterior"].to_dataset().isel(chain=slice(0, 1), draw=slice(0, n_points))
    draws = {k: post[k].values for k in post.data_vars}
    lp, ll = log_densities(spec, spec.inputs(data, hyper), draws)
    new = sum(v.sum(axis=tuple(range(2, v.ndim))) for v in ll.values()) + sum(lp.values())
    old_ll = tree["log_likelihood"].to_dataset().isel(chain=slice(0, 1), draw=slice(0, n_points))
    old_lp = tree["log_prior"].to_dataset().isel(chain=slice(0, 1), draw=slice(0, n_points))
    old = sum(v.values.sum(axis=tuple(range(2, v.ndim))) for v in old_ll.values()) + \
        sum(v.values for v in old_lp.values())
    rel = float(np.max(np.abs(new - old) / np.maximum(1.0, np.abs(old))))
    if rel > rtol:
        raise AssertionError(f"reference {tree.attrs['model']}/{tree.attrs.get('reference_tag')}: stored log "
                             f"density differs from the current model's by {rel:.3g} (relative); regenerate "
                             f"it with `make references`")
    return rel
