"""bayes-zoo inference: ``fit`` for every (model, method) pair, NUTS/SVI baselines and the
hand-written kernels, each returning an ArviZ ``xarray.DataTree``.

>>> import zoo, inference
>>> data, truth = zoo.get("hlcr").simulate(0)
>>> tree = inference.fit("hlcr", data, "gibbs", seed=1)
>>> inference.save(tree, "hlcr_gibbs.nc")

Only the generic names live here; a paper's own tools are imported from their modules
(``from inference.mppca.merge import merge_mppca``).
"""

from zoo import _runtime  # noqa: F401  (JAX set-up and `import numpyro` before arviz)

# isort: split
from inference._methods import Draws, FitContext, Option, available_methods, methods_for, register_method
from inference.api import Prepared, build, fit, fit_prepared, prepare, run
from inference.io import load, save
from inference.prediction import predict, register_predictor
from inference.trees import NonFiniteError, build_tree, log_densities

__all__ = ["Draws", "FitContext", "NonFiniteError", "Option", "Prepared", "available_methods", "build", "build_tree",
           "fit", "fit_prepared", "load", "log_densities", "methods_for", "predict", "prepare", "register_method",
           "register_predictor", "run", "save"]
