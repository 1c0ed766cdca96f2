"""Saving and loading fitted trees (netCDF via h5netcdf), written atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import xarray as xr


def replace_atomically(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Rename the finished temporary file ``tmp`` to ``path`` with the permissions a plain ``open``
    would give (``mkstemp`` creates files readable by the owner only)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def save(tree: xr.DataTree, path: str | os.PathLike) -> Path:
    """Write ``tree`` to ``path`` (netCDF4/HDF5). The file appears only when complete: it is written
    to a temporary file in the same directory and renamed, so an interrupted run never leaves a
    half-written result."""
    if not isinstance(tree, xr.DataTree):
        raise ValueError(f"tree: expected an xarray.DataTree, got {type(tree).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        tree.to_netcdf(tmp, engine="h5netcdf")
        replace_atomically(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def load(path: str | os.PathLike) -> xr.DataTree:
    """Read a tree written by ``save`` fully into memory (the file is closed afterwards)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path: no such file {str(path)!r}")
    with xr.open_datatree(path, engine="h5netcdf") as tree:
        return tree.load().copy()
