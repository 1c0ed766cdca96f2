"""Diagnostics: the joint 1-Wasserstein distance by assignment (ours) vs ArviZ's linear program, and
the cost of a full per-method score.

For two equally sized, equally weighted sample sets the optimal plan is a permutation, so
``diagnostics.metrics.w1_assignment`` (``scipy.optimize.linear_sum_assignment``) returns the same number
as ``arviz_stats.wasserstein`` (``scipy.stats.wasserstein_distance_nd``, a linear program), much faster.
"""

from __future__ import annotations

import os
import time

import numpy as np
import xarray as xr


def _tree(x):
    return xr.DataTree.from_dict({"posterior": xr.Dataset(
        {f"x{i}": (("chain", "draw"), x[None, :, i]) for i in range(x.shape[1])})})


def main(h) -> None:
    import arviz_stats as azs

    from diagnostics import metrics

    n = int(os.environ.get("BENCH_W1_DRAWS", "200"))
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(n, 10)), rng.normal(size=(n, 10)) + 0.3
    ta, tb = _tree(a), _tree(b)
    ours = metrics.w1_assignment(a, b)
    theirs = azs.wasserstein(ta, tb, num_samples=n, round_to="none", random_seed=None)
    h.compare(f"joint W1, {n} draws x 10 dims: assignment (ours) vs ArviZ linear program",
              {"assignment": lambda: metrics.w1_assignment(a, b),
               "arviz_stats.wasserstein": lambda: azs.wasserstein(ta, tb, num_samples=n, round_to="none",
                                                                  random_seed=None)},
              baseline="arviz_stats.wasserstein", repeats=5,
              note=f"same value: {ours:.10f} (ours) vs {theirs:.10f} (ArviZ)")
    rows = []
    for m in (500, 1000):
        x, y = rng.normal(size=(m, 10)), rng.normal(size=(m, 10))

        t0 = time.perf_counter()
        metrics.joint_metrics({f"c{i}": x[:, i] for i in range(10)}, {f"c{i}": y[:, i] for i in range(10)},
                              max_draws=m)
        rows.append({"draws per side": m, "dims": 10, "W1 + KL + MMD seconds": time.perf_counter() - t0})
    h.table("joint metrics (W1 by assignment, ArviZ KL, MMD) per method", rows,
            note="method_scores uses 500 draws per side (JOINT_MAX_DRAWS)")
