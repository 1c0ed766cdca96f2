"""Saving and loading fitted trees (netCDF via h5netcdf): written atomically, checked when read.

``save`` writes to a temporary file beside the target (``.<name>.<pid>.<random>.tmp``) and renames it, so
the target appears only when complete; the temporary file is removed on any exception, and the
temporaries a killed process left behind (its pid no longer running) are swept by the next ``save`` or
``load`` of the same target. ``save`` stores a SHA-256 checksum of every stored array and attribute in
the root attribute ``bayes_zoo_checksum``; ``load`` recomputes it and raises ``ValueError`` on a
mismatch, and on a truncated, empty or foreign file, instead of returning corrupted numbers. A foreign file is
any file without that attribute: a plain ``xarray`` or DataTree netCDF file, a bare HDF5 file, or one of our
trees re-saved by other code (its values possibly changed). ``load(path, verify=False)`` reads such a file
anyway, when the caller vouches for it; a file that carries a checksum is checked even then.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import xarray as xr

CHECKSUM_ATTR = "bayes_zoo_checksum"


def replace_atomically(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Rename the finished temporary file ``tmp`` to ``path`` with the permissions a plain ``open``
    would give (``mkstemp`` creates files readable by the owner only)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def sweep_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of ``path`` left by processes that no longer run (killed mid-write);
    returns the removed paths. Temporaries of a live process (a concurrent save) are left alone."""
    path = Path(path)
    removed = []
    prefix = _temp_prefix(path)
    for tmp in path.parent.glob(f"{prefix}*.tmp"):
        owner = tmp.name[len(prefix):].split(".", 1)[0]
        if owner.isdigit() and _running(int(owner)):
            continue
        try:
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:
            pass
    return removed


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def _canonical(values) -> bytes:
    """Bytes of an array that survive the netCDF round trip: numbers widened to 64 bits little-endian,
    strings (fixed-width or object) joined as UTF-8."""
    arr = np.asarray(values)
    if arr.dtype.kind in "biu":
        return b"i" + np.ascontiguousarray(arr, dtype="<i8").tobytes()
    if arr.dtype.kind == "f":
        return b"f" + np.ascontiguousarray(arr, dtype="<f8").tobytes()
    if arr.dtype.kind == "c":
        return b"c" + np.ascontiguousarray(arr, dtype="<c16").tobytes()
    if arr.dtype.kind == "M":
        return b"M" + np.ascontiguousarray(arr.astype("datetime64[ns]").view("<i8")).tobytes()
    return b"s" + "\x00".join(v.decode() if isinstance(v, bytes) else str(v) for v in arr.ravel()).encode()


def _attr_text(value) -> str:
    if isinstance(value, str | bytes):
        return value.decode() if isinstance(value, bytes) else value
    return json.dumps(np.asarray(value).tolist())


def tree_checksum(tree: xr.DataTree) -> str:
    """SHA-256 over every node's variables (name, dims, shape, values) and attributes, in sorted order."""
    h = hashlib.sha256()
    for node in sorted(tree.subtree, key=lambda n: n.path):
        h.update(f"node|{node.path}|".encode())
        attrs = {k: v for k, v in node.attrs.items() if k != CHECKSUM_ATTR}
        for k in sorted(attrs):
            h.update(f"attr|{k}|{_attr_text(attrs[k])}|".encode())
        ds = node.to_dataset(inherit=False)
        for name in sorted(map(str, ds.variables)):
            var = ds.variables[name]
            h.update(f"var|{name}|{var.dims}|{var.shape}|".encode())
            h.update(_canonical(var.values))
    return "sha256:" + h.hexdigest()


def save(tree: xr.DataTree, path: str | os.PathLike) -> Path:
    """Write ``tree`` to ``path`` (netCDF4/HDF5) with its checksum. The file appears only when
    complete: it is written to a temporary file in the same directory and renamed, so an interrupted
    run never leaves a half-written result, and no temporary file is left behind."""
    if not isinstance(tree, xr.DataTree):
        raise ValueError(f"tree: expected an xarray.DataTree, got {type(tree).__name__}")
    path = _as_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temporaries(path)
    out = tree.copy(deep=False)
    out.attrs = {**tree.attrs, CHECKSUM_ATTR: tree_checksum(tree)}
    fd, tmp = tempfile.mkstemp(prefix=f"{_temp_prefix(path)}{os.getpid()}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        out.to_netcdf(tmp, engine="h5netcdf")
        replace_atomically(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def _as_path(path) -> Path:
    """``path`` (a ``str`` or ``os.PathLike``) as a ``Path``; anything else is a ``ValueError`` naming ``path``."""
    if isinstance(path, bytes) or not isinstance(path, str | os.PathLike) or str(path) == "":
        raise ValueError(f"path: expected a file path (str or os.PathLike), got {path!r}")
    return Path(path)


def load(path: str | os.PathLike, *, verify: bool = True) -> xr.DataTree:
    """Read a tree written by ``save`` fully into memory (the file is closed afterwards) and verify its
    checksum. Raises ``ValueError`` naming ``path`` for a missing, truncated, corrupted or foreign file.

    ``verify=True`` (default): the file must carry the ``bayes_zoo_checksum`` attribute ``save`` writes and match
    it; a file without one (a plain ``xarray``/DataTree netCDF file, a bare HDF5 file, one of our trees re-saved
    by other code) is rejected, since nothing shows its numbers are the ones a fit wrote. ``verify=False``: such a
    file is read unchecked, for a caller who vouches for it (a tree written before checksums existed); a file
    that carries a checksum is still checked, so a damaged file is never returned."""
    path = _as_path(path)
    if not isinstance(verify, bool):
        raise ValueError(f"verify: expected True or False, got {verify!r}")
    sweep_stale_temporaries(path)
    if not path.is_file():
        raise ValueError(f"path: no such file {str(path)!r}")
    try:
        with xr.open_datatree(path, engine="h5netcdf") as tree:
            tree = tree.load().copy()
    except Exception as exc:  # h5py/h5netcdf raise OSError, KeyError, ValueError... on damaged files
        raise ValueError(f"path: {str(path)!r} is not a readable tree file (truncated, corrupted, or not written "
                         f"by inference.save): {type(exc).__name__}: {exc}") from None
    stored = tree.attrs.pop(CHECKSUM_ATTR, None)
    if stored is None and verify:
        raise ValueError(f"path: {str(path)!r} was not written by inference.save: it has no {CHECKSUM_ATTR!r} "
                         f"attribute, so its numbers cannot be checked (a foreign netCDF/HDF5 file, or a tree "
                         f"re-saved by other code). If you trust it, read it with inference.load(path, verify=False)")
    if stored is not None and tree_checksum(tree) != stored:
        raise ValueError(f"path: {str(path)!r} is corrupted: its arrays no longer match the checksum written "
                         f"when it was saved; refit or restore the file")
    return tree
