"""Process-wide JAX set-up, done once, here and nowhere else.

* the platform: CPU unless asked otherwise (``JAX_PLATFORMS`` set by the user is kept; else the device named by
  ``BAYES_ZOO_DEVICE``, ``cpu`` or ``gpu``; else ``cpu``). JAX starts one backend per process, at its first
  computation, so the device is chosen once per process: ``set_device`` (called by ``inference.fit(device=)``
  and ``zoo --device``) selects it while JAX has not started and afterwards only checks it;
* two host CPU devices, so NUTS runs 2 chains in parallel (must happen before JAX starts a backend);
* float64 everywhere (``jax_enable_x64``);
* the persistent compilation cache when ``BAYES_ZOO_JAX_CACHE`` names a directory (``make`` and the
  test suite set it to ``.jax_cache/`` in the repository; the CLI uses ``~/.cache/bayes-zoo/jax``).

``import numpyro`` happens before anything imports ArviZ: ``arviz.from_numpyro`` otherwise crashes
(``arviz_base`` loads numpyro lazily; with ArviZ first, ``numpyro.infer.initialization`` is
missing and ``from_numpyro`` raises an AttributeError).
"""

from __future__ import annotations

import os

_HOST_DEVICES = 2
DEVICE_ENV = "BAYES_ZOO_DEVICE"
# JAX platform list per device: "gpu" is CUDA first, the host CPU beside it (JAX's "gpu" alias would also
# demand the ROCm and oneAPI plugins and fail without them).
PLATFORMS = {"cpu": "cpu", "gpu": "cuda,cpu"}

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_HOST_DEVICES}"
    ).strip()
USER_PLATFORMS = os.environ.get("JAX_PLATFORMS") or None  # the user's own choice, never overridden
os.environ.setdefault("JAX_PLATFORMS", PLATFORMS.get(os.environ.get(DEVICE_ENV, "").strip().lower(), "cpu"))

import jax  # noqa: E402
import numpyro  # noqa: E402, F401  (before arviz, see module docstring)
from jax._src import xla_bridge  # noqa: E402  (backends_are_initialized: has JAX picked its platform yet?)

jax.config.update("jax_enable_x64", True)


CACHE_MIN_SECONDS_ENV = "BAYES_ZOO_JAX_CACHE_MIN_SECONDS"


def enable_compilation_cache(path: str | os.PathLike | None = None) -> None:
    """Turn on JAX's persistent compilation cache in ``path`` (default: ``$BAYES_ZOO_JAX_CACHE``), for programs
    whose compilation took at least ``$BAYES_ZOO_JAX_CACHE_MIN_SECONDS`` (default 0.5; the test suite sets 0,
    since its processes meet the same small programs again after releasing them)."""
    path = path or os.environ.get("BAYES_ZOO_JAX_CACHE")
    if not path:
        return
    text = os.environ.get(CACHE_MIN_SECONDS_ENV, "0.5")
    try:
        min_seconds = float(text)
    except ValueError:
        min_seconds = float("nan")
    if not 0 <= min_seconds < float("inf"):
        raise ValueError(f"{CACHE_MIN_SECONDS_ENV}: expected a number of seconds >= 0, got {text!r}")
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_seconds)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


enable_compilation_cache()


def device_of(platform: str) -> str:
    """Our device name of a JAX platform (``jax.default_backend()``): "cpu", "gpu" (CUDA, ROCm) or "tpu"."""
    return "gpu" if platform in ("gpu", "cuda", "rocm") else platform


def current_device() -> str:
    """The device this process computes on (starts JAX's backend if it has not started)."""
    return device_of(jax.default_backend())


def requested_device(name: str = DEVICE_ENV) -> str | None:
    """The device asked for in the environment variable ``name`` (None when unset or empty), checked."""
    value = os.environ.get(name, "").strip()
    return check_device(value.lower(), name) if value else None


def check_device(device, name: str = "device") -> str:
    """``device`` if it is "cpu" or "gpu", else a ``ValueError`` naming ``name``."""
    if device not in PLATFORMS:
        raise ValueError(f"{name}: expected one of {list(PLATFORMS)}, got {device!r}")
    return device


def install_hint() -> str:
    return (f'for an NVIDIA GPU install CUDA JAX into this environment, e.g. pip install -U "jax[cuda13]=='
            f'{jax.__version__}" (CUDA 12 drivers: jax[cuda12]; https://docs.jax.dev/en/latest/installation.html), '
            f"then check that python -c 'import jax; print(jax.devices())' lists a CudaDevice")


def found_platforms() -> list[str]:
    """The platforms of the devices JAX has started (``jax.devices()`` of every backend)."""
    return sorted({d.platform for backend in xla_bridge.backends().values() for d in backend.devices()})


def _select_platforms(platforms: str) -> None:
    """JAX's platform list for this process, and in the environment for the processes it starts (Ray workers)."""
    jax.config.update("jax_platforms", platforms)
    os.environ["JAX_PLATFORMS"] = platforms


def set_device(device: str, name: str = "device") -> str:
    """Make this process compute on ``device`` ("cpu" or "gpu"), or check that it does; returns it.

    JAX picks its platform once per process, when it starts its first backend. Before that, ``set_device``
    selects the platform (``jax_platforms``, and ``JAX_PLATFORMS`` for child processes: ``cpu``, or ``cuda,cpu``
    for "gpu"; a ``JAX_PLATFORMS`` the user set is kept) and starts it; after that it only checks. Every failure
    is a ``ValueError`` naming ``name`` (the argument or option the device came from), raised before anything
    compiles: an unknown device; "gpu" where JAX finds no GPU (it says which platforms it found and how to install
    CUDA JAX); a device other than the one this process already runs on.
    """
    device = check_device(device, name)
    if not xla_bridge.backends_are_initialized():
        if USER_PLATFORMS is None:
            _select_platforms(PLATFORMS[device])
        try:
            xla_bridge.backends()
        except RuntimeError as exc:  # e.g. a GPU without the CUDA plugin: fall back to the CPU, then explain
            _select_platforms("cpu")
            raise ValueError(f"{name}: 'gpu' asked for, but JAX could not start a GPU backend ({exc}); JAX "
                             f"found platforms {found_platforms()}; {install_hint()}") from None
    running = current_device()
    if running == device:
        return device
    if device == "gpu" and "gpu" not in {device_of(p) for p in found_platforms()}:
        raise ValueError(f"{name}: 'gpu' asked for, but JAX found no GPU: its devices are on platforms "
                         f"{found_platforms()} ({jax.devices()}); {install_hint()}")
    raise ValueError(f"{name}: {device!r} asked for, but this process already computes on {running!r}: JAX "
                     f"picks its platform once per process, at its first computation; choose the device before "
                     f"that (zoo --device, {DEVICE_ENV}={device}, or zoo.set_device({device!r}) first thing)"
                     + (f"; JAX_PLATFORMS={USER_PLATFORMS} is set in the environment" if USER_PLATFORMS else ""))
