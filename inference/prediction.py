"""``inference.predict(tree, new_data)``: one prediction API for every model that predicts, from any method's tree.

A model's predictor is registered by the paper package that implements it
(``@register_predictor("ssgp_lmm", "ssgp_logit", ...)``) as ``predictor(tree, new_data, **options) -> dict``.
It works from the tree's **posterior draws** (plus the training data and hyperparameters that
``inference.trees.problem_of`` recovers), so a Gibbs, VB, NUTS or SVI tree of the same model predicts the
same way. ``new_data`` follows the model's data contract for the new points (the observed field left out):

* a dict of arrays, index fields given by the **labels** the tree was fitted with (the subject names of a
  DataFrame, the integer ids of a dict);
* or a pandas DataFrame of new rows, read through the columns the tree was fitted from (its
  ``attrs["data_columns"]``; ``columns=`` overrides), so the same column names work for fitting and
  predicting, and an error names the column.

``label_codes`` is the one place where labels of new rows become the training data's positions.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

Predictor = Callable[..., dict]
_PREDICTORS: dict[str, Predictor] = {}


def register_predictor(*models: str):
    """Decorator registering ``predictor(tree, new_data, **options) -> dict`` for ``models``."""

    def deco(fn: Predictor) -> Predictor:
        for model in models:
            _PREDICTORS[model] = fn
        return fn

    return deco


def predict(tree: xr.DataTree, new_data: Any, *, columns: Mapping[str, Any] | None = None, **options: Any) -> dict:
    """Posterior predictive summaries of ``tree``'s model at ``new_data`` (see the model's predictor).

    ``new_data``: a dict of arrays, or a pandas DataFrame of new rows read with the tree's column mapping
    (``columns`` overrides it, as in ``fit``); index fields carry the training labels."""
    from inference._methods import _load_kernels
    from zoo._frames import with_columns

    _load_kernels()
    model = tree.attrs.get("model") if isinstance(tree, xr.DataTree) else None
    if model is None:
        raise ValueError("tree: expected a DataTree made by inference.fit (with a 'model' attribute)")
    if model not in _PREDICTORS:
        raise ValueError(f"tree: model {model!r} has no predictor; models that predict: {sorted(_PREDICTORS)}")
    if isinstance(new_data, pd.DataFrame):
        rows, used = rows_of_frame(tree, new_data, columns)
        with_columns(lambda: check_new_values(tree, rows), used)
        return with_columns(lambda: _PREDICTORS[model](tree, rows, **options), used)
    if columns is not None:
        raise ValueError(f"columns: only for new_data given as a pandas DataFrame, got {type(new_data).__name__}")
    if not isinstance(new_data, Mapping):
        raise ValueError(f"new_data: expected a dict of arrays or a pandas DataFrame, got {type(new_data).__name__}")
    check_new_values(tree, new_data)
    return _PREDICTORS[model](tree, dict(new_data), **options)


def check_new_values(tree: xr.DataTree, new_data: Mapping[str, Any]) -> None:
    """The number fields of ``new_data`` that the model's data contract declares and the tree was fitted with
    (not its observed fields, and not index fields: their labels are the predictor's to read): real numbers,
    finite where the field has no missing entries (a NaN input gives a NaN prediction), and every axis after the
    first as long as in the training data (one row may drop its first axis). A ``ValueError`` naming
    ``new_data['<field>']``, the offending entry or the axis, before the predictor runs."""
    import zoo
    from inference.trees import data_of

    spec = zoo.get(tree.attrs["model"])
    observed = set(spec.observed_fields if spec.observed_fields is not None else spec.likelihood_sites)
    training = data_of(tree)
    for f in spec.data_fields:
        value = new_data.get(f.name)
        if f.kind == "index" or f.name in observed or value is None or f.name not in training:
            continue
        name = f"new_data[{f.name!r}]"
        try:
            arr = np.asarray(value)
        except ValueError as exc:   # ragged lists
            raise ValueError(f"{name}: could not convert to an array ({exc})") from None
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"{name}: expected real numbers, got dtype {arr.dtype}")
        bad = ~np.isfinite(arr) & (~np.isnan(arr) if f.allow_nan else True)
        if bad.any():
            at = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(bad.ravel())[0]), arr.shape))
            raise ValueError(f"{name}: {int(bad.sum())} NaN/inf value(s), the first {arr[at].item()} at entry "
                             f"{at[0] if len(at) == 1 else at}; expected finite numbers (the prediction there would "
                             f"be NaN)")
        trained = np.shape(training[f.name])
        got = arr.shape[1:] if arr.ndim == len(trained) else arr.shape if arr.ndim == len(trained) - 1 else None
        if got is None:
            raise ValueError(f"{name}: expected {len(trained)} axes like the training data's {f.name!r} (shape "
                             f"{trained}), got shape {arr.shape}")
        for axis, (want, have) in enumerate(zip(trained[1:], got, strict=True), 1):
            if want != have:
                raise ValueError(f"{name}: axis {axis} ({f.shape[axis]}) has size {have}, but the tree was fitted "
                                 f"with {want} (the training data's {f.name!r} has shape {trained})")


def rows_of_frame(tree: xr.DataTree, frame: pd.DataFrame, columns: Mapping[str, Any] | None = None
                  ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(new_data, field -> column(s))``: the new rows of ``frame`` read against the data contract of ``tree``'s
    model without its observed fields (``y``), through the columns the tree was fitted from
    (``attrs["data_columns"]``, then ``columns``; a field neither names takes the column of its own name, the
    model's matrix field every column left, as in ``fit``). An optional field (ssgp's ``group``) whose recorded
    column is absent is left out (population-level prediction); every other missing column is a ``ValueError``
    naming it."""
    import zoo
    from zoo._frames import from_frame

    spec = zoo.get(tree.attrs["model"])
    observed = set(spec.observed_fields if spec.observed_fields is not None else spec.likelihood_sites)
    fields = {f.name: f for f in spec.data_fields if f.name not in observed}
    recorded = json.loads(tree.attrs.get("data_columns", "{}"))
    mapping = {k: v for k, v in recorded.items() if k in fields}
    mapping = {k: v for k, v in mapping.items()            # an optional field's recorded column may be left out
               if not fields[k].optional or all(c in frame.columns for c in ([v] if isinstance(v, str) else v))}
    if columns is not None and not isinstance(columns, Mapping):
        raise ValueError(f"columns: expected a dict field -> column name(s), got {type(columns).__name__}")
    mapping.update(columns or {})
    new_rows = dataclasses.replace(spec, data_fields=tuple(fields.values()), check=None)
    table = from_frame(new_rows, frame, mapping)
    return table.data, table.columns


def label_codes(field: str, labels: Any, known: np.ndarray, *, allow_new: bool = True) -> np.ndarray:
    """Positions of ``labels`` (new rows' values of index field ``field``) among ``known`` (the training data's
    distinct labels, sorted: ``zoo._validation.factorize``), int64. With ``allow_new``, ``-1`` and ``None``
    mean "no known label" and give -1. Any other label not among ``known`` is a ``ValueError`` naming
    ``new_data['<field>']``, the label, and some known ones (text and integer labels never match each other:
    no silent conversion)."""
    known = np.asarray(known)
    values = np.atleast_1d(np.asarray(labels, dtype=object))
    if values.ndim != 1:
        raise ValueError(f"new_data[{field!r}]: expected one label per new row, got an array of shape "
                         f"{values.shape}")
    lookup = {label_key(v): i for i, v in enumerate(known.tolist())}
    codes = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        if allow_new and (v is None or (is_integer_label(v) and int(v) == -1)):
            codes[i] = -1
            continue
        code = lookup.get(label_key(v))
        if code is None:
            shown = ", ".join(repr(k) for k in known.tolist()[:8]) + (", ..." if len(known) > 8 else "")
            kind = "text" if known.dtype.kind in "US" else "integers"
            raise ValueError(f"new_data[{field!r}]: unknown label {v!r} (row {i}); the tree was fitted with "
                             f"{len(known)} labels ({kind}): {shown}"
                             + ("; -1 or None for a row without a known label" if allow_new else ""))
        codes[i] = code
    return codes


def is_integer_label(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_)


def label_key(v: Any) -> tuple[str, Any]:
    """A lookup key that keeps text and integers apart (``"3"`` is not ``3``)."""
    if is_integer_label(v):
        return ("int", int(v))
    if isinstance(v, str | np.str_):
        return ("str", str(v))
    return (type(v).__name__, v)
