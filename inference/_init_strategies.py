"""Initialisation strategies shared by the NUTS and SVI baselines (option ``init``)."""

from numpyro.infer import init_to_median, init_to_sample, init_to_uniform

# "uniform": unconstrained values uniform in (-2, 2); use it when the prior median is degenerate (a
# Gamma(0.001, 0.001) precision has median ~1e-300: "median" starts SVI with an infinite noise variance).
INIT_STRATEGIES = {"prior": init_to_sample, "median": init_to_median, "uniform": init_to_uniform}

