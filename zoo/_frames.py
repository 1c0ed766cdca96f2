"""A pandas DataFrame (or a CSV/parquet/npz file) as a model's data dict, with its labels kept for the tree.

The model's data contract (``ModelSpec.data_fields``) decides which columns feed which field:

* ``columns={"X": ["price", "promo"], "y": "sales", "agent": "store", "entity": "product"}`` maps fields to
  columns explicitly (a one-axis field takes one column, a two-axis field a list of columns);
* every field not named there takes the column of its own name when there is one (``y``, ``agent``, ``t``);
* the one required two-axis field left (``X`` of hlcr and ssgp, ``Y`` of mppca, bpca and gp_alps) takes every
  column not used otherwise, in the table's order.

``example_header(spec)`` is the CSV header this default mapping reads (``zoo show MODEL`` prints it).

Index fields (``kind="index"``: hlcr's agent and entity, ssgp's group, bpca's node) take any labels: integers
>= 0 stay integers (gaps allowed), text stays text, and any other label (negative integers, integers beyond 64
bits, dates, category values) becomes its exact text; ids stored as floats beyond 2**53 (where float64 no longer
holds every integer) are a ``ValueError``. The models number the labels themselves
(``zoo._validation.factorize``), so the labels reach the tree's coordinates (store names on hlcr's ``agent``
axis). The names of a two-axis field's columns and the table's row index become the labels of the matching axes
(``FrameData.axis_labels``, keyed by the data contract's axis symbols; ``ModelSpec.axis_dims`` names the
posterior dimension of each).

Missing values: NaN is data only where the field says so (bpca's ``Y``: a missing entry). Elsewhere a row
with a missing value is a ``ValueError`` naming the column and the number of rows, unless ``dropna=True``
drops those rows (and says how many in ``FrameData.dropped_rows``). Every check runs before anything
compiles, and every error names the column.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import re
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from zoo._registry import DataField, ModelSpec
from zoo._validation import _INT64_MAX, _MAX_EXACT_FLOAT_INT, validate_data

FILE_SUFFIXES = (".csv", ".parquet", ".npz")
_NUMERIC_KINDS = {"floating", "integer", "mixed-integer-float", "boolean", "decimal", "empty"}


@dataclasses.dataclass(frozen=True)
class FrameData:
    """A table read against a model's data contract.

    data:         the model's data dict, checked by ``validate_data`` (index fields keep their labels).
    columns:      field -> the column (one-axis field) or columns (two-axis field) it was read from.
    axis_labels:  data-axis symbol -> labels: the row axis (``"n"``) gets the table's row index, the second
                  axis of a two-axis field its column names (``{"n": [...], "F": ["price", "promo"]}``).
    dropped_rows: rows dropped for missing values (``dropna=True``).
    """

    data: dict[str, np.ndarray]
    columns: dict[str, str | list[str]]
    axis_labels: dict[str, np.ndarray]
    dropped_rows: int = 0

    @property
    def provenance(self) -> dict[str, Any]:
        """What the tree records about the table (``attrs["data_columns"]``, ``attrs["dropped_rows"]``)."""
        return {"data_columns": {k: v for k, v in self.columns.items()}, "dropped_rows": int(self.dropped_rows)}


def row_symbol(spec: ModelSpec) -> str:
    """The data contract's row axis: the first axis every field shares (``"n"``)."""
    firsts = {f.shape[0] for f in spec.data_fields}
    if len(firsts) != 1 or not isinstance(next(iter(firsts)), str):
        raise ValueError(f"data: model {spec.name!r} has fields on different first axes "
                         f"({sorted(map(str, firsts))}); it cannot read a table, pass a dict of arrays")
    return str(next(iter(firsts)))


def _is_matrix(field: DataField) -> bool:
    return len(field.shape) == 2


def _rest_field(spec: ModelSpec, mapped: Mapping[str, Any]) -> str | None:
    """The required two-axis field that takes every column not used otherwise: the last one not yet mapped."""
    left = [f.name for f in spec.data_fields if _is_matrix(f) and not f.optional and f.name not in mapped]
    return left[-1] if left else None


def example_header(spec: ModelSpec, n_rest: int = 3) -> str:
    """The CSV header the default mapping reads: required one-axis fields by name, then ``n_rest`` example
    columns for the two-axis field that takes the rest (``agent,entity,y,x1,x2,x3`` for hlcr)."""
    row_symbol(spec)
    names, mapped = [], {}
    rest = _rest_field(spec, {})
    for f in spec.data_fields:
        if f.optional or f.name == rest:
            continue
        names.append(f.name)
        mapped[f.name] = f.name
    if rest is not None:
        stem = rest.lower()
        names += [f"{stem}{i}" for i in range(1, n_rest + 1)]
    return ",".join(names)


def describe_mapping(spec: ModelSpec) -> list[str]:
    """One line per field: which column(s) the default mapping gives it (for ``zoo show``)."""
    rest = _rest_field(spec, {})
    lines = []
    for f in spec.data_fields:
        if f.name == rest:
            how = "every other column (or --column " + f"{f.name}=a,b,...)"
        elif _is_matrix(f):
            how = f"the column named {f.name!r} (one column), or --column {f.name}=a,b,..."
        else:
            how = f"the column named {f.name!r}, or --column {f.name}=COL"
        opt = "optional; " if f.optional else ""
        missing = "NaN = missing entry" if f.allow_nan else "no missing values"
        lines.append(f"{f.name:8s} <- {how} ({opt}{f.kind}, {missing})")
    return lines


def _column_list(field: DataField, value: Any) -> list:
    """The columns named for ``field`` in ``columns=`` as a list, checked for its number of axes."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        cols = [value]
    else:
        cols = list(value)
    if not cols:
        raise ValueError(f"columns[{field.name!r}]: an empty list; name at least one column")
    if not _is_matrix(field) and len(cols) != 1:
        raise ValueError(f"columns[{field.name!r}]: field {field.name!r} is one column (shape "
                         f"{field.shape}), got {len(cols)} columns {cols}")
    return cols


def _unknown_column(name: Any, available: Sequence, what: str) -> ValueError:
    close = difflib.get_close_matches(str(name), [str(c) for c in available], n=3)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(f"{what}: column {name!r} is not in the data (columns: {[*available]}){hint}")


def resolve_columns(spec: ModelSpec, frame_columns: Sequence, columns: Mapping[str, Any] | None = None
                    ) -> dict[str, list]:
    """Field -> the list of columns it reads (explicit ``columns`` first, then the default mapping of the
    module docstring). ``ValueError`` naming the field or column for an unknown field, an unknown column, a
    column used twice, or a required field without columns."""
    fields = {f.name: f for f in spec.data_fields}
    available = list(frame_columns)
    if columns is not None and not isinstance(columns, Mapping):
        raise ValueError(f"columns: expected a dict field -> column name(s), got {type(columns).__name__}")
    out: dict[str, list] = {}
    used: dict[Any, str] = {}
    for field_name, value in (columns or {}).items():
        if field_name not in fields:
            raise ValueError(f"columns: {field_name!r} is not a data field of model {spec.name!r} "
                             f"(fields: {list(fields)})")
        cols = _column_list(fields[field_name], value)
        for c in cols:
            if c not in available:
                raise _unknown_column(c, available, f"columns[{field_name!r}]")
            if c in used:
                raise ValueError(f"columns[{field_name!r}]: column {c!r} is already used for field {used[c]!r}")
            used[c] = field_name
        out[field_name] = cols
    for f in spec.data_fields:   # a column named like the field
        if f.name not in out and f.name in available and f.name not in used:
            out[f.name] = [f.name]
            used[f.name] = f.name
    rest = _rest_field(spec, out)
    if rest is not None:
        cols = [c for c in available if c not in used]
        if not cols:
            raise ValueError(f"columns: no column left for field {rest!r} of model {spec.name!r} (every column "
                             f"is used by another field); name its columns with columns={{{rest!r}: [...]}}")
        out[rest] = cols
        for c in cols:
            used[c] = rest
    for f in spec.data_fields:
        if f.name not in out and not f.optional:
            raise ValueError(f"columns: no column for the required field {f.name!r} of model {spec.name!r}; "
                             f"name a column {f.name!r} or map one with columns={{{f.name!r}: ...}} "
                             f"(the data has columns {available})")
    return {f.name: out[f.name] for f in spec.data_fields if f.name in out}


def _first_bad(series: pd.Series, bad: np.ndarray) -> str:
    where = np.flatnonzero(bad)
    value = series.iloc[where[0]]
    return f"{value.item() if isinstance(value, np.number) else value!r} (row {series.index[where[0]]!r})"


def _numbers(column: Any, series: pd.Series, field: DataField) -> np.ndarray:
    """A numeric column as float64 (NaN for missing) or int64; text, dates, objects are a ``ValueError``."""
    what = f"column {column!r} (data[{field.name!r}])"
    if isinstance(series.dtype, pd.CategoricalDtype) or pd.api.types.is_datetime64_any_dtype(series) \
            or pd.api.types.is_timedelta64_dtype(series):
        raise ValueError(f"{what}: expected numbers ({field.kind}), got a {series.dtype} column")
    if not (pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series)):
        kind = pd.api.types.infer_dtype(series, skipna=True)
        if kind not in _NUMERIC_KINDS:
            not_number = np.array([not isinstance(v, int | float | np.number | bool | np.bool_) and not pd.isna(v)
                                   for v in series], dtype=bool)
            unreadable = not_number & pd.to_numeric(series.astype(object), errors="coerce").isna().to_numpy()
            if unreadable.any():
                raise ValueError(f"{what}: expected numbers ({field.kind}), got text: {_first_bad(series, unreadable)} "
                                 f"is not a number ({int(unreadable.sum())} of {len(series)} rows are not)")
            raise ValueError(f"{what}: expected numbers ({field.kind}), got numbers stored as text such as "
                             f"{_first_bad(series, not_number)}; convert the column (pandas.to_numeric) first")
    if pd.api.types.is_complex_dtype(series):
        raise ValueError(f"{what}: complex values; expected real numbers")
    if field.kind != "float" and pd.api.types.is_unsigned_integer_dtype(series) and series.max() > _INT64_MAX:
        raise ValueError(f"{what}: values such as {_first_bad(series, (series > _INT64_MAX).to_numpy())} do not fit "
                         f"a signed 64-bit integer")
    values = series.to_numpy(dtype=np.float64, na_value=np.nan)
    if field.kind != "float" and np.all(np.isfinite(values)) and \
            (pd.api.types.is_integer_dtype(series) or pd.api.types.is_bool_dtype(series)):
        return series.to_numpy(dtype=np.int64)
    return values


def _labels(column: Any, series: pd.Series, field: DataField) -> np.ndarray:
    """An index column's labels: integers >= 0 as int64, text as str, other labels as their text."""
    what = f"column {column!r} (data[{field.name!r}])"
    if isinstance(series.dtype, pd.CategoricalDtype):
        series = series.astype(series.cat.categories.dtype)
    if pd.api.types.is_bool_dtype(series):
        return series.to_numpy(dtype=np.int64)
    if pd.api.types.is_unsigned_integer_dtype(series) and series.max() > _INT64_MAX:
        return series.to_numpy().astype(str)      # ids beyond int64 (2**63 and up): their exact text, never wrapped
    if pd.api.types.is_integer_dtype(series):
        values = series.to_numpy(dtype=np.int64)
        return values if values.min() >= 0 else values.astype(str)
    if pd.api.types.is_float_dtype(series):
        values = series.to_numpy(dtype=np.float64)
        frac = values != np.round(values)
        if frac.any():
            raise ValueError(f"{what}: labels must be integers or text, got non-integer numbers such as "
                             f"{_first_bad(series, frac)}")
        inexact = np.abs(values) > _MAX_EXACT_FLOAT_INT
        if inexact.any():
            raise ValueError(f"{what}: ids stored as floats beyond 2**53, such as {_first_bad(series, inexact)}: "
                             f"float64 does not hold every integer there, so distinct ids may have been rounded "
                             f"together; store the ids as integers or text")
        ints = values.astype(np.int64)
        return ints if ints.min() >= 0 else ints.astype(str)
    if pd.api.types.is_datetime64_any_dtype(series):
        return np.asarray(series.astype(str).to_numpy(), dtype=str)
    values = series.to_numpy(dtype=object)
    kinds = {"text" if isinstance(v, str) else "number" if isinstance(v, int | np.integer) else type(v).__name__
             for v in values}
    if len(kinds) > 1:
        raise ValueError(f"{what}: labels mix kinds ({sorted(kinds)}); give every label as text or every label as "
                         f"an integer")
    if kinds == {"number"}:
        if min(values) < 0 or max(values) > _INT64_MAX:   # negative, or beyond int64: the exact text
            return np.asarray([str(int(v)) for v in values], dtype=str)
        return values.astype(np.int64)
    return np.asarray([str(v) for v in values], dtype=str)


def _row_labels(index: pd.Index) -> np.ndarray:
    """The row index as coordinate values: numbers and text as they are, anything else (tuples of a
    MultiIndex, dates, mixed objects) as text."""
    if isinstance(index, pd.MultiIndex):
        return np.asarray([":".join(map(str, t)) for t in index], dtype=str)
    values = index.to_numpy()
    if values.dtype.kind in "iufU":
        return values
    if all(isinstance(v, str) for v in values):
        return values.astype(str)
    return np.asarray([str(v) for v in values], dtype=str)


def _missing_rows(frame: pd.DataFrame, fields: Mapping[str, DataField], mapping: Mapping[str, list]
                  ) -> tuple[np.ndarray, list[tuple[Any, str, int]]]:
    """(rows with a missing value where the model allows none, [(column, field, count)] of those columns)."""
    drop = np.zeros(len(frame), dtype=bool)
    where = []
    for name, cols in mapping.items():
        if fields[name].allow_nan:
            continue
        for c in cols:
            na = frame[c].isna().to_numpy()
            if na.any():
                where.append((c, name, int(na.sum())))
                drop |= na
    return drop, where


def from_frame(spec: ModelSpec, frame: Any, columns: Mapping[str, Any] | None = None, *,
               dropna: bool = False) -> FrameData:
    """Read ``frame`` (a pandas DataFrame) against ``spec``'s data contract (module docstring); the data
    dict is validated (``validate_data``) with every error naming its column."""
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"data: expected a pandas DataFrame, got {type(frame).__name__}")
    if not isinstance(dropna, bool):
        raise ValueError(f"dropna: expected True or False, got {dropna!r}")
    fields = {f.name: f for f in spec.data_fields}
    rows = row_symbol(spec)
    dup = frame.columns[frame.columns.duplicated()].unique().tolist()
    if dup:
        raise ValueError(f"data: column name(s) {dup} appear more than once; rename them")
    if len(frame.columns) == 0:
        raise ValueError("data: the table has no columns")
    if len(frame) == 0:
        raise ValueError(f"data: the table has no rows (only a header: columns {list(frame.columns)})")
    mapping = resolve_columns(spec, list(frame.columns), columns)
    drop, where = _missing_rows(frame, fields, mapping)
    if where and not dropna:
        parts = "; ".join(f"column {c!r} (data[{f!r}]): {k} of {len(frame)} rows" for c, f, k in where)
        raise ValueError(f"{parts} have missing values (NaN/empty), where model {spec.name!r} allows none; "
                         f"{int(drop.sum())} row(s) in all. Drop them (dropna=True, or --dropna) or fill them in")
    if drop.any():
        frame = frame.loc[~drop]
        if len(frame) == 0:
            raise ValueError(f"data: every one of the {len(drop)} rows has a missing value where model "
                             f"{spec.name!r} allows none; nothing is left after dropna")
    data, axis_labels = {}, {rows: _row_labels(frame.index)}
    for name, cols in mapping.items():
        field = fields[name]
        if field.kind == "index":
            data[name] = _labels(cols[0], frame[cols[0]], field)
            continue
        arrays = [_numbers(c, frame[c], field) for c in cols]
        if _is_matrix(field):
            data[name] = np.stack(arrays, axis=1)
            axis_labels[str(field.shape[1])] = _row_labels(pd.Index(cols))
        else:
            data[name] = arrays[0]
    used = {k: (list(v) if _is_matrix(fields[k]) else v[0]) for k, v in mapping.items()}
    for c in unnamed_columns([c for cols in mapping.values() for c in cols]):
        field = next(k for k, cols in mapping.items() if c in cols)
        warnings.warn(f"column {c!r} (data[{field!r}]) has no name in its file: it is probably the row index "
                      f"DataFrame.to_csv writes, and it is used here as data. Read the file with index_col=0, save "
                      f"it with index=False, or name the columns of {field!r} (columns=/--column)", UserWarning,
                      stacklevel=2)
    return FrameData(data=with_columns(lambda: validate_data(spec, data), mapping), columns=used,
                     axis_labels=axis_labels, dropped_rows=int(drop.sum()))


_FIELD_REF = re.compile(r"data\['([^']+)'\]")


def with_columns(check, mapping: Mapping[str, Any]):
    """Run ``check()``; a ``ValueError`` naming ``data['FIELD']`` is raised again with the column(s) the field
    was read from (``data['y'] (column 'sales')``), so errors of later checks also name the columns."""
    try:
        return check()
    except ValueError as exc:
        def name(m: re.Match) -> str:
            cols = mapping.get(m[1])
            if cols is None:
                return m[0]
            cols = [cols] if isinstance(cols, str) else list(cols)
            return f"{m[0]} (column {cols[0]!r})" if len(cols) == 1 else f"{m[0]} (columns {cols})"
        text = str(exc)
        if not _FIELD_REF.search(text):
            raise
        raise ValueError(_FIELD_REF.sub(name, text, count=1)) from None


# --------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------

def read_table(path: str | Path) -> pd.DataFrame | dict[str, np.ndarray]:
    """A data file: ``.csv`` and ``.parquet`` as a DataFrame (read with ``from_frame``), ``.npz`` as a dict of
    arrays. ``ValueError`` (naming ``path``) for a missing, empty, header-only or unreadable file or another
    suffix."""
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.is_file():
        raise ValueError(f"path: no such file {str(path)!r}")
    if suffix not in FILE_SUFFIXES:
        raise ValueError(f"path: {str(path)!r}: expected a {', '.join(FILE_SUFFIXES)} file, got suffix "
                         f"{path.suffix!r}")
    if path.stat().st_size == 0:
        raise ValueError(f"path: {str(path)!r} is empty (0 bytes)"
                         + (": not an .npz archive" if suffix == ".npz" else ""))
    if suffix == ".npz":
        return _read_npz(path)
    if suffix == ".csv":
        _check_csv_header(path)
    try:
        frame = pd.read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
    except pd.errors.EmptyDataError:
        raise ValueError(f"path: {str(path)!r} has no header and no rows") from None
    except ImportError as exc:
        raise ValueError(f"path: reading {suffix} files needs pyarrow ({exc})") from None
    except Exception as exc:  # noqa: BLE001  (pandas/pyarrow raise many kinds on damaged files)
        raise ValueError(f"path: {str(path)!r} could not be read as {suffix[1:]}: {type(exc).__name__}: "
                         f"{exc}") from None
    if len(frame) == 0:
        raise ValueError(f"path: {str(path)!r} has no rows (only a header: columns {list(frame.columns)})")
    return frame


def _check_csv_header(path: Path) -> None:
    """A ``ValueError`` naming ``path`` and the names for a CSV header that repeats a column name (pandas would
    read ``x1,x1`` as ``x1`` and ``x1.1`` and use both without a word)."""
    try:
        with open(path, newline="", encoding="utf-8-sig", errors="replace") as fh:
            header = next(csv.reader(fh), [])
    except csv.Error:
        return   # left to pandas, whose message names the problem
    seen, dup = set(), []
    for name in header:
        if name in seen and name.strip() and name not in dup:
            dup.append(name)
        seen.add(name)
    if dup:
        raise ValueError(f"path: {str(path)!r}: column name(s) {dup} appear more than once in the header; rename "
                         f"them (each column feeds one field)")


UNNAMED = re.compile(r"^Unnamed: \d+$")


def unnamed_columns(columns: Sequence) -> list[str]:
    """The columns pandas named ``Unnamed: N`` because the file's header left them blank, typically the row index
    ``DataFrame.to_csv`` writes first."""
    return [c for c in columns if isinstance(c, str) and UNNAMED.match(c)]


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not zipfile.is_zipfile(path):
        raise ValueError(f"path: {str(path)!r} is not an .npz archive (write one with numpy.savez(path, "
                         f"name=array, ...))")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except ValueError as exc:
        if "pickle" in str(exc):
            raise ValueError(f"path: {str(path)!r} holds object arrays; store numbers or strings "
                             f"(numpy.savez with numeric/str arrays)") from None
        raise ValueError(f"path: {str(path)!r} could not be read as an .npz archive: {exc}") from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise ValueError(f"path: {str(path)!r} could not be read as an .npz archive (truncated or corrupted: "
                         f"{type(exc).__name__}: {exc})") from None


def parse_column_options(pairs: Sequence[str]) -> dict[str, str | list[str]]:
    """``["X=price,promo", "y=sales"]`` (the command line's ``--column``) -> ``{"X": ["price", "promo"],
    "y": "sales"}``; ``ValueError`` naming ``--column`` for a malformed or repeated entry."""
    out: dict[str, str | list[str]] = {}
    for pair in pairs:
        field, sep, cols = pair.partition("=")
        field = field.strip()
        names = [c.strip() for c in cols.split(",")]
        if not sep or not field or not all(names):
            raise ValueError(f"--column: expected FIELD=COL or FIELD=COL1,COL2,..., got {pair!r}")
        if field in out:
            raise ValueError(f"--column: field {field!r} is given twice")
        out[field] = names if len(names) > 1 else names[0]
    return out
