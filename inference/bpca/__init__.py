"""Bayesian PCA by mean-field VI, centralised and distributed (paper 5: D-MFVI with Bregman ADMM, arXiv
1507.00824; paper page ``docs/papers/dmfvi.md``). One algorithm per module:

* ``common``: the data shards, the family q, its moments, the closed-form ELBO and ``draw`` (shared by all);
* ``sweep``: one coordinate-ascent sweep at a node, with a consensus penalty (the step of both VB methods);
* ``vbem``: centralised VB-EM (method ``vbem``);
* ``nodes``: the network side shared by the distributed methods (shards per node, residuals, runner call);
* ``badmm``: distributed D-MFVI by consensus (Bregman) ADMM (method ``badmm``);
* ``dppca``: the D-PPCA baseline, distributed ML-PPCA by consensus ADMM (method ``dppca``);
* ``guide``: the NumPyro guide of the same family (for ``svi`` and the ELBO check).
"""

# The modules that register methods, in the paper's order (``inference.methods_for`` lists them so); any module
# not named here is still found and imported by the registry's walk of the package.
from inference.bpca import vbem, badmm, dppca  # noqa: E402, F401, I001
