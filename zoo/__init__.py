"""bayes-zoo models: the five papers' generative models as NumPyro models, with simulators.

>>> import zoo
>>> zoo.list_models()
>>> spec = zoo.get("hlcr"); data, truth = spec.simulate(0)

The first use of anything here configures JAX once for the whole project (float64, two host CPU
devices, ``import numpyro`` before ArviZ; the CPU unless ``BAYES_ZOO_DEVICE=gpu`` or ``zoo.set_device("gpu")``
asks for the GPU; see ``zoo/_runtime.py``). The names are loaded lazily
(PEP 562) so that ``zoo --help`` does not pay for importing JAX.
"""

import importlib


def _version() -> str:
    """The installed distribution's version (one source: ``pyproject.toml``'s ``version``); from a source tree
    that was never installed, the ``version`` line of the ``pyproject.toml`` beside it."""
    from importlib import metadata

    try:
        return metadata.version("bayes-zoo")
    except metadata.PackageNotFoundError:
        import pathlib
        import tomllib

        try:
            with open(pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
                return str(tomllib.load(f)["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


__version__ = _version()

_EXPORTS = {
    "DataField": "zoo._registry", "Hyper": "zoo._registry", "ModelSpec": "zoo._registry",
    "Reformulation": "zoo._registry", "RealDataset": "zoo._registry", "ZooSettings": "zoo._registry",
    "get": "zoo._registry", "list_models": "zoo._registry", "register": "zoo._registry",
    "unregister": "zoo._registry", "validate_data": "zoo._validation", "validate_hyper": "zoo._validation",
    "set_device": "zoo._runtime", "current_device": "zoo._runtime",
}
__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("_"):  # a model module as an attribute (``zoo.hlcr.simulate``), loaded on first use
        from zoo._registry import model_modules

        if name in model_modules():
            return importlib.import_module(f"zoo.{name}")
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
