"""HLCR / FedHLCR (Yang, Carette, Jimbo, Maruyama: "Federated Latent Class Regression for Hierarchical Data";
notes ``000_fedhlcr.md``): one algorithm per module.

* ``common``: per-pair sufficient statistics, cluster sums and log normalisers, the label prior, psi updates,
  label matching, static hyperparameters: the pieces every kernel shares;
* ``gibbs``: collapsed Gibbs (method ``gibbs``; kernels ``block`` and the paper's rank-one ``paper``);
* ``gibbs_blocked``: blocked (uncollapsed) Gibbs, every pair's label in parallel (method ``gibbs_blocked``);
* ``vb``: mean-field VB-EM (method ``vbem``);
* ``federated``: agents' shards, participation, shared federated options, a protocol as a loop kernel;
* ``fedgibbs``: FedHLCR, federated collapsed Gibbs (paper Algorithm 3; method ``fedgibbs``);
* ``fedvb``: federated VB-EM (method ``fedvb``);
* ``predict``: the posterior predictive of new events from any method's tree (``inference.predict``).
"""

# The modules that register methods, in the paper's order (``inference.methods_for`` lists them so); any module
# not named here is still found and imported by the registry's walk of the package.
from inference.hlcr import gibbs, gibbs_blocked, vb, fedgibbs, fedvb, predict  # noqa: E402, F401, I001
