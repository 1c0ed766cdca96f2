"""Input checks run by ``inference.fit`` before anything is compiled.

Every error is a ``ValueError`` whose message names the argument (``data['X']``, ``K``, ...) and what
was expected, so a user never meets a shape error from deep inside XLA or a tree full of NaNs.
Nothing is converted silently: complex numbers, masked entries, strings or durations (timedelta64) for
numbers, labels of mixed kinds (the integer 1 and the text "1"), integer ids beyond 64 bits, a list for a
scalar, a bool for an integer, ``None`` where no default means it, are all rejected by name. pandas' nullable
number dtypes (``Float64``, ``Int64``) are read as numbers, ``<NA>`` as a missing value (NaN).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from zoo._registry import ModelSpec

# Whole numbers a float64 holds exactly: an index given as a float beyond this is not an integer we can trust.
_MAX_EXACT_FLOAT_INT = 2.0**53
_INT64_MAX = np.iinfo(np.int64).max


def validate_data(spec: ModelSpec, data: Any) -> dict[str, np.ndarray]:
    """Check ``data`` against ``spec.data_fields``; return a dict of NumPy arrays (floats as float64).

    Checks, in order: that ``data`` is a mapping; no unknown keys; every required field present;
    dtype kind (no complex numbers; a masked array only where NaN marks a missing entry, its masked
    entries becoming NaN); number of axes; consistent sizes of shared symbolic axes (and fixed sizes);
    finite values (NaN allowed only where the field says so); labels for index fields; 0/1 for
    binary fields.

    Index fields keep the caller's labels (integers >= 0 or strings, any size): models turn them into
    codes 0..J-1 with ``factorize``, never with arithmetic on the labels.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"data: expected a dict of arrays with keys "
                         f"{[f.name for f in spec.data_fields]}, got {type(data).__name__}")
    fields = {f.name: f for f in spec.data_fields}
    unknown = sorted(set(data) - set(fields), key=str)
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


def _unmask(name: str, value: Any, field) -> Any:
    """A masked array's data, with masked entries as NaN where the field allows NaN (a missing entry);
    elsewhere masked entries are an error (the hidden values would otherwise be used as data)."""
    mask = np.ma.getmaskarray(value)
    if not mask.any():
        return np.asarray(np.ma.getdata(value))
    if field.kind == "float" and field.allow_nan:
        if np.iscomplexobj(value):
            raise ValueError(f"data[{name!r}]: complex values; expected real numbers")
        filled = np.array(np.ma.getdata(value), dtype=np.float64)
        filled[mask] = np.nan
        return filled
    raise ValueError(f"data[{name!r}]: a masked array with {int(mask.sum())} masked entr"
                     f"{'y' if mask.sum() == 1 else 'ies'}; this field has no missing values, so the hidden "
                     f"values would be used as data. Drop those rows, or pass a plain array")


def _from_pandas(value: Any) -> Any:
    """A pandas object with nullable (extension) number dtypes (``Float64``, ``Int64``, ``boolean``) as a NumPy
    array: the numbers' own NumPy dtype, or float64 with NaN for ``<NA>`` when an entry is missing (so the field's
    NaN rule decides). Anything else is returned as it is (``np.asarray`` reads plain pandas objects)."""
    if not type(value).__module__.startswith("pandas"):
        return value
    import pandas as pd

    if isinstance(value, pd.DataFrame):
        dtypes = list(value.dtypes)
    elif isinstance(value, pd.Series | pd.Index | pd.api.extensions.ExtensionArray):
        dtypes = [value.dtype]
    else:
        return value
    if not any(isinstance(d, pd.api.extensions.ExtensionDtype) for d in dtypes) or not all(
            (pd.api.types.is_numeric_dtype(d) or pd.api.types.is_bool_dtype(d))
            and not isinstance(d, pd.CategoricalDtype) for d in dtypes):
        return value
    if np.asarray(pd.isna(value)).any():
        return value.to_numpy(dtype=np.float64, na_value=np.nan)
    return value.to_numpy(dtype=np.result_type(*[getattr(d, "numpy_dtype", d) for d in dtypes]))


def _position(arr: np.ndarray, bad: np.ndarray) -> int | tuple[int, ...]:
    """The index of the first entry of ``arr`` where ``bad`` holds (an int for a one-axis array)."""
    at = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(bad.ravel())[0]), arr.shape))
    return at[0] if len(at) == 1 else at


def _first(arr: np.ndarray, bad: np.ndarray) -> str:
    """The first entry of ``arr`` where ``bad`` holds, with its position, for an error message."""
    at = _position(arr, bad)
    value = arr[at]
    shown = repr(value.item()) if isinstance(value, np.number | np.bool_) else str(value)
    return f"{shown} (entry {at})"


def _as_array(name: str, value: Any, field) -> np.ndarray:
    value = _from_pandas(value)
    if isinstance(value, np.ma.MaskedArray):
        value = _unmask(name, value, field)
    if field.kind == "index" and isinstance(value, list | tuple):
        value = _object_array(value)   # keeps the kind of every label ([1, "1"] is not two strings)
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"data[{name!r}]: could not convert to an array ({exc})") from None
    if np.iscomplexobj(arr):
        raise ValueError(f"data[{name!r}]: complex values (dtype {arr.dtype}); expected real numbers")
    if arr.dtype.kind == "m" and arr.size:   # a NumPy integer subtype: would pass as numbers in its own unit
        expected = "integer ids or string labels" if field.kind == "index" else "numbers"
        raise ValueError(f"data[{name!r}]: expected {expected}, got durations (dtype {arr.dtype}) such as "
                         f"{_first(arr, np.ones(arr.shape, bool))}; convert them to numbers in the unit you mean "
                         f"first (e.g. divide by np.timedelta64(1, 's') for seconds)")
    if field.kind == "index":
        return _as_labels(name, arr)
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
    arr = _as_int64(name, arr, field.kind)
    if field.kind == "binary" and arr.size and not np.all((arr == 0) | (arr == 1)):
        vals = np.unique(arr)[:5]
        raise ValueError(f"data[{name!r}]: expected binary 0/1 values, got values such as {vals.tolist()}")
    return arr


def _as_int64(name: str, arr: np.ndarray, kind: str) -> np.ndarray:
    """Integers (integer dtype, bools, or floats holding whole numbers exactly) as int64, never wrapped."""
    if np.issubdtype(arr.dtype, np.floating):
        if np.isnan(arr).any():
            raise ValueError(f"data[{name!r}]: expected integers ({kind}), got {int(np.isnan(arr).sum())} missing "
                             f"value(s) (NaN or <NA>), the first at entry "
                             f"{_position(arr, np.isnan(arr))}; this field has no missing values")
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            bad = ~np.isfinite(arr) | (arr != np.round(arr))
            raise ValueError(f"data[{name!r}]: expected integers ({kind}), got non-integer values such as "
                             f"{_first(arr, bad)}")
        if arr.size and np.max(np.abs(arr)) > _MAX_EXACT_FLOAT_INT:
            raise ValueError(f"data[{name!r}]: integer values up to {np.max(np.abs(arr)):.3g} given as floats "
                             f"are not exact (float64 holds integers up to 2**53); pass an integer array")
    elif np.issubdtype(arr.dtype, np.unsignedinteger) and arr.size and arr.max() > _INT64_MAX:
        raise ValueError(f"data[{name!r}]: values up to {int(arr.max())} do not fit a signed 64-bit integer")
    return arr.astype(np.int64)


def _object_array(value: Any) -> np.ndarray:
    """``value`` (a list or tuple of labels) as an object array, each label keeping its own type."""
    try:
        arr = np.empty(np.shape(value), dtype=object)
        arr[...] = value
    except Exception:  # ragged: left to np.asarray's own message
        return value
    return arr


def _label_kind(v: Any) -> str:
    if isinstance(v, str | np.str_):
        return "text"
    if isinstance(v, bool | np.bool_):
        return "bool"
    if isinstance(v, int | np.integer):
        return "integer"
    if isinstance(v, float | np.floating):
        return "number"
    return type(v).__name__


def _as_labels(name: str, arr: np.ndarray) -> np.ndarray:
    """An index field's labels: integers >= 0 (int64) or strings, kept as given (see ``factorize``). Labels of
    one kind only: the integer 1 and the text "1" are different labels, so a mix is an error, not a merge."""
    if arr.dtype == object:  # a list of labels, or pandas objects: accept uniform ints/strings
        flat = arr.ravel().tolist()
        kinds = [_label_kind(v) for v in flat]
        if "text" in kinds and any(k != "text" for k in kinds):
            i = kinds.index("text")
            j = next(j for j, k in enumerate(kinds) if k != "text")
            raise ValueError(f"data[{name!r}]: labels mix kinds: {flat[j]!r} ({kinds[j]}, entry {j}) and "
                             f"{flat[i]!r} (text, entry {i}); give every label as text or every label as an integer")
        huge = next((j for j, k in enumerate(kinds) if k == "integer" and not -_INT64_MAX - 1 <= flat[j] <= _INT64_MAX),
                    None)
        if huge is not None:
            raise ValueError(f"data[{name!r}]: integer id {flat[huge]!r} (entry {huge}) does not fit a signed 64-bit "
                             f"integer; give the labels as text (str) instead")
        try:
            arr = np.array(flat, dtype=str if kinds and set(kinds) == {"text"} else None).reshape(arr.shape)
        except Exception as exc:
            raise ValueError(f"data[{name!r}]: could not read the labels ({exc})") from None
        if arr.dtype == object or np.iscomplexobj(arr):
            raise ValueError(f"data[{name!r}]: expected integer ids or string labels of one kind, "
                             f"got objects such as {arr.ravel()[:3].tolist()}")
    if arr.dtype.kind in "US":
        return arr
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"data[{name!r}]: expected integer ids or string labels, got dtype {arr.dtype}")
    arr = _as_int64(name, arr, "index")
    if arr.size and arr.min() < 0:
        raise ValueError(f"data[{name!r}]: expected non-negative integer ids (or string labels), got minimum "
                         f"{arr.min()}")
    return arr


def factorize(labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, uniques)`` of an index field: ``uniques`` the distinct labels in sorted order,
    ``codes`` (int64, 0..len(uniques)-1) with ``uniques[codes] == labels``.

    The one place where labels (any integers, any size, or strings) become positions: no arithmetic
    on the labels, so nothing can overflow, and ids that are already 0..J-1 map to themselves."""
    arr = np.asarray(labels)
    uniques, codes = np.unique(arr.ravel(), return_inverse=True)
    return codes.reshape(arr.shape).astype(np.int64), uniques


def factorize_rows(*columns: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, first)`` of the distinct rows of several label columns (e.g. (agent, entity) pairs):
    rows numbered in sorted order of their columns' codes; ``first`` the index of one event of each row."""
    cols = np.stack([factorize(c)[0] for c in columns], axis=1)
    _, first, codes = np.unique(cols, axis=0, return_index=True, return_inverse=True)
    return codes.reshape(-1).astype(np.int64), first.astype(np.int64)


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


# --------------------------------------------------------------------------------------------------
# Scalar constraints (hyperparameters and method options)
# --------------------------------------------------------------------------------------------------

_CHECKS = {
    "positive": (lambda v: _is_real(v) and v > 0, "a positive number"),
    "nonnegative": (lambda v: _is_real(v) and v >= 0, "a non-negative number"),
    "real": (lambda v: _is_real(v), "a finite number"),
    "positive_int": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "nonnegative_int": (lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
    "unit_interval": (lambda v: _is_real(v) and 0 < v <= 1, "a number in (0, 1]"),
    "open_unit_interval": (lambda v: _is_real(v) and 0 < v < 1, "a number in (0, 1)"),
    "probability": (lambda v: _is_real(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "bool": (lambda v: isinstance(v, bool), "True or False"),
    "string": (lambda v: isinstance(v, str), "a string"),
    "None": (lambda v: v is None, "None"),
    "any": (lambda v: True, "anything"),
}


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _scalar(value: Any) -> Any:
    """NumPy scalars as Python scalars (``np.int64(5)`` -> 5, ``np.bool_`` -> bool, ``np.str_`` -> str)."""
    return value.item() if isinstance(value, np.generic) else value


def describe(constraint: str) -> str:
    """The words for ``constraint`` used in error messages and ``zoo show``."""
    words = []
    for alt in constraint.split("|"):
        vector = alt.endswith("[]")
        base = _CHECKS[alt.removesuffix("[]")][1]
        words.append(f"{base} or an array of them" if vector else base)
    return " or ".join(words)


def check_value(name: str, value: Any, constraint: str) -> Any:
    """``value`` checked against ``constraint``, NumPy scalars returned as Python scalars.

    ``constraint`` names a check of ``_CHECKS``; ``"a|b"`` accepts either (``"positive_int|None"``);
    a ``[]`` suffix also accepts a non-empty array whose every entry passes (``"real[]"``). Anything else
    raises ``ValueError`` naming ``name``: a list where a scalar is expected, a bool for a number, a string
    for a number, NaN or inf, ``None`` unless allowed."""
    value = _scalar(value)
    try:
        ndim = np.ndim(value)
    except ValueError:  # a ragged list
        ndim = -1
    for alt in constraint.split("|"):
        base = alt.removesuffix("[]")
        ok = _CHECKS[base][0]
        if ndim == 0 or base == "any":
            if not isinstance(value, list | tuple | np.ndarray) and ok(value):
                return value
            if base == "any":
                return value
        elif alt.endswith("[]") and not isinstance(value, str | bytes | Mapping):
            try:
                arr = np.asarray(value)
            except Exception:
                continue
            if arr.size and arr.dtype != object and all(ok(_scalar(v)) for v in arr.ravel()):
                return value
    raise ValueError(f"{name}: expected {describe(constraint)}, got {_short_repr(value)}")


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def validate_hyper(spec: ModelSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults of ``spec.hyperparameters``, then the preset chosen for each of ``spec.hyper_presets``
    (e.g. ``prior="paper"``), then ``given``; every value checked against its ``Hyper.constraint``."""
    hyper = spec.default_hyper
    for k in given:
        if k not in spec.hyperparameters:
            raise ValueError(f"{k}: not a hyperparameter of {spec.name!r} "
                             f"(hyperparameters: {sorted(spec.hyperparameters)})")
    for selector, table in spec.hyper_presets.items():
        choice = _scalar(given.get(selector, hyper[selector]))
        if not isinstance(choice, str) or choice not in table:
            raise ValueError(f"{selector}: expected one of {list(table)}, got {_short_repr(choice)}")
        hyper.update(table[choice])
    hyper.update(given)
    for k, v in hyper.items():
        hyper[k] = check_value(k, v, spec.hyperparameters[k].constraint)
    return hyper
