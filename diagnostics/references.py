"""Stored reference posteriors (what posteriordb does for Stan, done for this zoo).

``generate(name)`` runs a long NUTS fit on a dataset (the model's default simulator data unless
given), thins it to at most 4000 draws, records its MCMC health and a checksum of the data, and
writes ``zoo/references/<name>__<tag>.nc``. ``load(name, data, tag)`` returns the stored tree only
when the checksum matches the data, so scorecards, tests and ``make demo`` compare against a healthy
reference without waiting for NUTS. The stored ``log_prior``/``log_likelihood`` groups double as a
model-identity check: ``check_log_density`` re-evaluates the current model at a few stored draws.
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


def data_checksum(spec: zoo.ModelSpec, data: Mapping[str, Any]) -> str:
    """sha256 of the validated data arrays (keys, dtypes, shapes and bytes), order-independent."""
    clean = validate_data(spec, data)
    h = hashlib.sha256()
    for k in sorted(clean):
        a = np.ascontiguousarray(clean[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def data_of(tree: xr.DataTree) -> dict[str, np.ndarray]:
    """The data a tree was fitted to (observed_data and constant_data merged)."""
    out = {}
    for group in ("observed_data", "constant_data"):
        if group in tree.children:
            out.update({k: v.values for k, v in tree[group].to_dataset().items()})
    return out


def reference_path(name: str, tag: str = "default") -> Path:
    return REFERENCE_DIR / f"{name}__{tag}.nc"


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
    """Run the reference NUTS fit for ``name`` on ``data`` and store it; returns the stored tree.

    Options: NUTS options and hyperparameters; defaults are ``DEFAULT_NUTS`` updated with
    ``spec.reference_options``.
    """
    from diagnostics.scorecard import reference_health

    spec = zoo.get(name)
    if data is None:
        data, _ = spec.default_data()
    opts = {**DEFAULT_NUTS, **spec.reference_options, **options}
    tree = _thin(fit(spec, data, "nuts", seed=seed, **opts), MAX_DRAWS)
    health = reference_health(tree)
    tree.attrs.update({
        "reference_tag": tag,
        "data_checksum": data_checksum(spec, data),
        "validation": json.dumps(health),
        "reliable": int(health["reliable"]),
    })
    save(tree, path or reference_path(name, tag))
    return tree


def load(name: str, data: Mapping[str, Any] | None = None, *, tag: str = "default") -> xr.DataTree | None:
    """The stored reference for (``name``, ``tag``) if it exists and was computed on ``data``
    (default: the model's default data); otherwise ``None``."""
    spec = zoo.get(name)
    path = reference_path(name, tag)
    if not path.is_file():
        return None
    if data is None:
        data, _ = spec.default_data()
    tree = load_tree(path)
    if tree.attrs.get("data_checksum") != data_checksum(spec, data):
        return None
    return tree


def get_or_generate(name: str, data: Mapping[str, Any] | None = None, *, tag: str = "default",
                    **options: Any) -> xr.DataTree:
    """The stored reference when it matches, else a fresh one (generated and stored)."""
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
