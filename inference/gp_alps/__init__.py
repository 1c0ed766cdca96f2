"""GP-ALPS (paper 4, paper page ``docs/papers/gp_alps.md``): multi-output GP linear mixing with switches.

One algorithm per module:

* ``common``:  the problem arrays every kernel needs, the corrected switch conditional (E3), the exact
  switch posterior on orthogonal designs (the test oracle);
* ``vbem``:    closed-form mean-field VB-EM (CAVI) with a true Bernoulli q(b) (method ``vbem``);
* ``gibbs``:   collapsed / uncollapsed Gibbs with the swap move (method ``gibbs``);
* ``svi``:     the paper's binary-Concrete SVI with the App. B.7 temperature schedule (``svi_concrete``);
* ``predict``: the ``inference.predict`` predictor of ``gp_alps``, from any method's posterior draws;
* ``subsets``: the paper's experiment 4.3, the selected subset ranked among all subset KRR models.
"""

# The modules that register methods, in the paper's order (``inference.methods_for`` lists them so); any module
# not named here is still found and imported by the registry's walk of the package.
from inference.gp_alps import vbem, gibbs, svi, predict  # noqa: E402, F401, I001
