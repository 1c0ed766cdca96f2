"""Input checks run by ``inference.fit`` before anything is compiled.

Every error is a ``ValueError`` whose message names the argument (``data['X']``, ``K``, ...) and what
was expected, so a user never meets a shape error from deep inside XLA or a tree full of NaNs.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from zoo._registry import ModelSpec


def validate_data(spec: ModelSpec, data: Any) -> dict[str, np.ndarray]:
    """Check ``data`` against ``spec.data_fields``; return a dict of NumPy arrays (floats as float64).

    Checks, in order: that ``data`` is a mapping; no unknown keys; every required field present;
    number of axes; consistent sizes of shared symbolic axes (and fixed sizes); dtype kind; finite
    values (NaN allowed only where the field says so); non-negative indices; 0/1 for binary fields.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"data: expected a dict of arrays with keys "
                         f"{[f.name for f in spec.data_fields]}, got {type(data).__name__}")
    fields = {f.name: f for f in spec.data_fields}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"data: unexpected key(s) {unknown} for model {spec.name!r}; "
                         f"expected keys {sorted(fields)}")
    out: dict[str, np.ndarray] = {}
    sizes: dict[str, tuple[int, str]] = {}
    for name, field in fields.items():
        if name not in data or data[name] is None:
            if field.optional:
                continue
            raise ValueError(f"data: missing required key {name!r} for model {spec.name!r} "
                             f"(shape {_fmt_shape(field.shape)}, {field.kind})")
        arr = _as_array(name, data[name], field)
        if arr.ndim != len(field.shape):
            raise ValueError(f"data[{name!r}]: expected {len(field.shape)} axes with shape "
                             f"{_fmt_shape(field.shape)}, got an array of shape {arr.shape}")
        for axis, (sym, n) in enumerate(zip(field.shape, arr.shape, strict=True)):
            if isinstance(sym, int):
                if n != sym:
                    raise ValueError(f"data[{name!r}]: axis {axis} must have size {sym}, got {n}")
                continue
            if n < 1:
                raise ValueError(f"data[{name!r}]: axis {axis} ({sym}) is empty; need at least one entry")
            if sym in sizes and sizes[sym][0] != n:
                other_n, other = sizes[sym]
                raise ValueError(f"data[{name!r}]: axis {axis} ({sym}) has size {n} but "
                                 f"data[{other!r}] says {sym} = {other_n}")
            sizes.setdefault(sym, (n, name))
        out[name] = arr
    return out


def _as_array(name: str, value: Any, field) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"data[{name!r}]: could not convert to an array ({exc})") from None
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"data[{name!r}]: expected a numeric array, got dtype {arr.dtype}")
    if field.kind == "float":
        arr = arr.astype(np.float64)
        bad = ~np.isfinite(arr)
        if field.allow_nan:
            bad &= ~np.isnan(arr)
        if bad.any():
            what = "inf" if field.allow_nan else "NaN/inf"
            raise ValueError(f"data[{name!r}]: contains {int(bad.sum())} {what} value(s); "
                             f"expected finite numbers" + (" (NaN marks a missing entry)" if field.allow_nan else ""))
        return arr
    # integer kinds: accept integer dtypes, bools, or floats holding whole numbers
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise ValueError(f"data[{name!r}]: expected integers ({field.kind}), got non-integer values")
    arr = arr.astype(np.int64)
    if field.kind == "index" and arr.size and arr.min() < 0:
        raise ValueError(f"data[{name!r}]: expected non-negative integer indices, got minimum {arr.min()}")
    if field.kind == "binary" and arr.size and not np.all((arr == 0) | (arr == 1)):
        vals = np.unique(arr)[:5]
        raise ValueError(f"data[{name!r}]: expected binary 0/1 values, got values such as {vals.tolist()}")
    return arr


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


_CHECKS = {
    "positive": (lambda v: _is_real(v) and v > 0, "a positive number"),
    "nonnegative": (lambda v: _is_real(v) and v >= 0, "a non-negative number"),
    "positive_int": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "nonnegative_int": (lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
    "unit_interval": (lambda v: _is_real(v) and 0 < v <= 1, "a number in (0, 1]"),
    "probability": (lambda v: _is_real(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "any": (lambda v: True, "anything"),
}


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_value(name: str, value: Any, constraint: str) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` satisfies ``constraint``."""
    ok, expected = _CHECKS[constraint]
    if np.ndim(value) > 0 and constraint != "any":
        arr = np.asarray(value)
        if not all(ok(v.item()) for v in arr.ravel()):
            raise ValueError(f"{name}: expected every entry to be {expected}, got {arr.tolist()}")
        return
    if isinstance(value, np.generic):
        value = value.item()
    if not ok(value):
        raise ValueError(f"{name}: expected {expected}, got {value!r}")


def validate_hyper(spec: ModelSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults of ``spec.hyperparameters`` overridden by ``given``; each value checked."""
    hyper = spec.default_hyper
    for k, v in given.items():
        if k not in spec.hyperparameters:
            raise ValueError(f"{k}: not a hyperparameter of {spec.name!r} "
                             f"(hyperparameters: {sorted(spec.hyperparameters)})")
        hyper[k] = v
    for k, v in hyper.items():
        check_value(k, v, spec.hyperparameters[k].constraint)
    return hyper
