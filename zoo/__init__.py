"""bayes-zoo models: the five papers' generative models as NumPyro models, with simulators.

>>> import zoo
>>> zoo.list_models()
>>> spec = zoo.get("hlcr"); data, truth = spec.simulate(0)

Importing this package configures JAX once for the whole project (float64, two host CPU devices,
``import numpyro`` before ArviZ): see ``zoo/_runtime.py``.
"""

from zoo import _runtime  # noqa: F401  (must run before anything else touches JAX)
from zoo._registry import DataField, Hyper, ModelSpec, get, list_models, register, unregister
from zoo._validation import validate_data, validate_hyper

__all__ = ["DataField", "Hyper", "ModelSpec", "get", "list_models", "register", "unregister",
           "validate_data", "validate_hyper"]
