"""Sparse-spectrum GP with random effects (``ssgp_lmm``, ``ssgp_logit``, ``ssgp_probit``), fit by closed-form
variational Bayes: one coordinate-ascent engine for the three likelihoods.

Source: D. Lim (2016) on Tan, Ong, Nott & Jasra (Stat. Comput. 2016); every equation, definition and erratum is
from ``docs/papers/ssgp.md`` ("notes §x", "E<k>").

* ``hfunction``: the H function of the half-Cauchy scale factors (notes §3.5): normalisers, moments, draws.
* ``problem``: the static ``Config`` and the arrays ``Data`` (the kernel's problem) from the model's inputs.
* ``features``: moments of the features under q(lam) and the NCVMP pieces (notes §2.1, §3.2, §3.7).
* ``bound``: the pseudo-likelihood of the three models and the complete lower bound (notes §3.1, §3.4).
* ``sweep``: one coordinate-ascent sweep (notes §3.3).
* ``vb``: the kernel (``init``/``step``/``draw`` for ``inference.loop``) and the registered method ``vb``.
* ``predict``: the predictor of ``inference.predict`` for every ssgp model, from any method's tree (notes §3.6).
* ``exact_gp``: the exact dense-kernel GP baseline (type-II ML, small n) the approximation is measured against.
"""

# The modules that register methods, in the paper's order (``inference.methods_for`` lists them so); any module
# not named here is still found and imported by the registry's walk of the package.
from inference.ssgp import vb, predict  # noqa: E402, F401, I001
