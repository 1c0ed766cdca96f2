"""bayes-zoo diagnostics: compare any posterior with an MCMC reference."""

import zoo  # noqa: F401  (JAX set-up and `import numpyro` before arviz)
