"""bayes-zoo diagnostics: compare any posterior with an MCMC reference.

>>> import diagnostics
>>> ref = diagnostics.references.get_or_generate("hlcr")
>>> diagnostics.scorecard(ref, {"gibbs": tree_gibbs, "svi": tree_svi})
"""

from zoo import _runtime  # noqa: F401  (JAX set-up and `import numpyro` before arviz)

# isort: split
from diagnostics import references
from diagnostics.scorecard import compared_posterior, reference_health, scorecard

__all__ = ["compared_posterior", "reference_health", "references", "scorecard"]
