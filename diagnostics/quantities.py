"""The compared quantities of a fitted tree, and the labels of their scalar components.

The lowest module of the diagnostics' reading of a tree: ``diagnostics.health`` (the MCMC health rule),
``diagnostics.view`` (the compared view) and ``diagnostics.scoring`` all build on it, and it imports none of
them.

* ``compared_posterior(tree)``: the dataset every diagnostic compares, the label-invariant summaries a mixture's
  ``ModelSpec.summaries`` computes, else the posterior itself, with the user's labels carried onto its dims
  (``with_user_labels``);
* ``component_labels`` / ``labels_of``: the ``name[i,j]`` label of every scalar component, in C order, with the
  user's labels in place of positions where the dataset has them (``mu_sorted[0,Hwt]``);
* ``SAMPLE_DIMS``: the sample dims of every group, as ``inference.trees`` writes them.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

import zoo
from inference.trees import SAMPLE_DIMS, problem_of

__all__ = ["COMPARED_ATTR", "SAMPLE_DIMS", "compared_posterior", "component_labels", "dim_entries", "labels_of",
           "with_user_labels"]

COMPARED_ATTR = "compared_posterior"  # a tree whose posterior holds the compared quantities (an imported reference)


def component_labels(name: str, shape: tuple[int, ...], entries: list[list[str]] | None = None) -> list[str]:
    """``name[i,j]`` labels of every scalar component of a variable with non-sample ``shape``, in C order
    (the labels the scorecard uses); ``entries`` (``dim_entries``): per dim, the names of its entries (default:
    their positions), so a dim the user labelled reads ``mu_sorted[0,Hwt]``."""
    if not shape:
        return [name]
    if entries is None:
        return [f"{name}[{','.join(map(str, idx))}]" for idx in np.ndindex(*shape)]
    return [f"{name}[{','.join(entries[k][i] for k, i in enumerate(idx))}]" for idx in np.ndindex(*shape)]


def dim_entries(da: xr.DataArray) -> list[list[str]]:
    """Per non-sample dim of ``da``, in order, the names of its entries in labels: the values of a coordinate of
    strings (the user's column or group names, which ``with_user_labels`` carries onto the
    summaries, or entries a summary names itself), each distinct, else the positions 0, 1, ... (numeric
    coordinates: positions, grids, draws' own indices)."""
    out = []
    for d in da.dims:
        if d in SAMPLE_DIMS:
            continue
        coord = da.coords.get(d)
        values = None if coord is None else coord.values.tolist()
        if values is not None and coord.dtype.kind in "USO" and all(isinstance(v, str) for v in values) \
                and len(set(values)) == len(values):
            out.append(values)
        else:
            out.append([str(i) for i in range(da.sizes[d])])
    return out


def labels_of(da: xr.DataArray, name: str | None = None) -> list[str]:
    """The labels of every scalar component of ``da`` (``component_labels`` with ``dim_entries``), C order."""
    shape = tuple(n for d, n in da.sizes.items() if d not in SAMPLE_DIMS)
    return component_labels(str(da.name if name is None else name), shape, dim_entries(da))


def spec_of(tree: xr.DataTree) -> zoo.ModelSpec | None:
    """The registered ``ModelSpec`` the tree was fitted with (attribute ``model``), None when it names none."""
    name = tree.attrs.get("model")
    try:
        return zoo.get(name) if name else None
    except ValueError:
        return None


def compared_posterior(tree: xr.DataTree, spec: zoo.ModelSpec | None = None) -> xr.Dataset:
    """The dataset a scorecard compares: the label-invariant summaries for mixtures (of the data and
    hyperparameters the tree was fitted with, ``inference.trees.problem_of``), else the posterior."""
    return compared_draws(tree["posterior"].to_dataset(), tree, spec or spec_of(tree))


def compared_draws(post: xr.Dataset, tree: xr.DataTree, spec: zoo.ModelSpec | None) -> xr.Dataset:
    """``compared_posterior`` of the posterior draws ``post`` of ``tree`` (a tree marked ``COMPARED_ATTR``, a
    reference read from posteriordb, holds them already)."""
    if tree.attrs.get(COMPARED_ATTR):
        return with_user_labels(post, post)
    if spec is not None and spec.summaries is not None:
        _, data, hyper = problem_of(tree)
        return with_user_labels(spec.summaries(post, data, hyper), post)
    return with_user_labels(post, post)


def with_user_labels(ds: xr.Dataset, post: xr.Dataset) -> xr.Dataset:
    """``ds`` with the posterior's labels on every dim the two share at the same size (a summary indexes a
    ``feature`` dim by position; the tree carries the table's column names there): string coordinates, so the
    labels of ``labels_of`` (every verdict, table and plot) read ``mu_sorted[0,Hwt]``. Labels
    that are positions 0, 1, ... or floats (a grid) are not carried; integer labels become strings."""
    assign = {}
    for d in ds.dims:
        if d in SAMPLE_DIMS or d not in post.coords or post.sizes.get(d) != ds.sizes[d]:
            continue
        values = np.asarray(post[d].values)
        if values.dtype.kind == "f" or is_positions(values):
            continue
        assign[d] = [str(v) for v in values.tolist()]
    return ds.assign_coords(assign) if assign else ds


def is_positions(values: np.ndarray) -> bool:
    """Whether coordinate ``values`` are the bare positions 0, 1, ..., n - 1 (no label a user gave)."""
    return values.dtype.kind in "iu" and np.array_equal(values, np.arange(len(values)))
