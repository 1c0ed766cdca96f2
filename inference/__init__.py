"""bayes-zoo inference: ``fit`` for every (model, method) pair, NUTS/SVI baselines and the
hand-written kernels, each returning an ArviZ ``xarray.DataTree``.

>>> import zoo, inference
>>> data, truth = zoo.get("hlcr").simulate(0)
>>> tree = inference.fit("hlcr", data, "gibbs", seed=1)
>>> inference.save(tree, "hlcr_gibbs.nc")
"""

from zoo import _runtime  # noqa: F401  (JAX set-up and `import numpyro` before arviz)

# isort: split
from inference._methods import Draws, FitContext, available_methods, register_method
from inference.api import fit
from inference.io import load, save
from inference.mppca.merge import merge_mppca
from inference.predict import predict, register_predictor
from inference.trees import NonFiniteError, build_tree, log_densities

__all__ = ["Draws", "FitContext", "NonFiniteError", "available_methods", "build_tree", "fit", "load",
           "log_densities", "merge_mppca", "predict", "register_method", "register_predictor", "save"]
