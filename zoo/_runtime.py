"""Process-wide JAX set-up, done once, here and nowhere else.

* two host CPU devices, so NUTS runs 2 chains in parallel (must happen before JAX starts a backend);
* float64 everywhere (``jax_enable_x64``);
* the persistent compilation cache when ``BAYES_ZOO_JAX_CACHE`` names a directory (``make`` and the
  test suite set it to ``.jax_cache/`` in the repository; the CLI uses ``~/.cache/bayes-zoo/jax``).

``import numpyro`` happens before anything imports ArviZ: ``arviz.from_numpyro`` otherwise crashes
(notes/ecosystem.md, section 1.9).
"""

from __future__ import annotations

import os

_HOST_DEVICES = 2

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_HOST_DEVICES}"
    ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpyro  # noqa: E402, F401  (before arviz, see module docstring)

jax.config.update("jax_enable_x64", True)


def enable_compilation_cache(path: str | os.PathLike | None = None) -> None:
    """Turn on JAX's persistent compilation cache in ``path`` (default: ``$BAYES_ZOO_JAX_CACHE``)."""
    path = path or os.environ.get("BAYES_ZOO_JAX_CACHE")
    if not path:
        return
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


enable_compilation_cache()
