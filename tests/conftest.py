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


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """After each test module, drop every compiled program held in this process (JAX's jit caches and the
    loop's cached chunk functions). A full ``make test`` otherwise keeps thousands of XLA executables alive,
    and XLA's CPU compiler segfaulted in ``backend_compile_and_load`` two hundred tests in (measured on the
    2-core CI box; each module alone passes). Programs come back from the persistent compilation cache."""
    yield
    import gc

    import jax

    from inference import loop, nuts, trees

    for cached in (loop._vmapped_init, loop._optimiser_chunk, loop._sampler_chunk, nuts._sampler, nuts._site_mapper):
        cached.cache_clear()
    trees.clear_log_density_programs()
    jax.clear_caches()
    gc.collect()
