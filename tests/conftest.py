"""Test set-up: the JAX compilation cache in the repository, headless matplotlib, per-test keys."""

import os
import pathlib
import zlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("BAYES_ZOO_JAX_CACHE", str(ROOT / ".jax_cache"))
os.environ.setdefault("MPLBACKEND", "Agg")

from zoo import _runtime  # noqa: E402,F401  (JAX set-up: float64, 2 host devices, numpyro before arviz)

# isort: split
import pytest  # noqa: E402


@pytest.fixture
def seed(request) -> int:
    """A seed derived from the test's id: fixed run to run, different between tests."""
    return zlib.crc32(request.node.nodeid.encode()) % (2**31)
