"""Variational Bayes for mixtures of probabilistic PCA and VB merging of fitted mixtures (Bruneau, Gelgon &
Picarougne, Information Fusion 2013; paper page ``docs/papers/mppca.md``), one algorithm per module:

* ``common``: configuration, variational state, M step (eq. 55), parameter part of the bound, post-processing
  (pruning, eq.-5 rotation, Algorithm 1, plug-in mixture density);
* ``vbem``: VBMPPCA, VB-EM on data (method ``vbem``);
* ``em``: ML EM for (M)PPCA, the paper's baseline (method ``em``);
* ``merge``: VBMPPCA-A, merging fitted models from their parameters (``merge_mppca``);
* ``baselines``: scikit-learn's VBGMM as method ``vbgmm``.

Every kernel is an ``init``/``step`` pair on NamedTuples run by ``inference.loop``.
"""

# The modules that register methods, in the paper's order (``inference.methods_for`` lists them so); any module
# not named here is still found and imported by the registry's walk of the package.
from inference.mppca import vbem, em, baselines, merge  # noqa: E402, F401, I001
