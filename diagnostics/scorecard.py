"""The VI-vs-MCMC scorecard: per parameter, how and how much a posterior differs from a reference.

For each candidate method and each scalar component of each compared variable:

* ``std_mean_error`` = |E_q - E_ref| / sd_ref;
* ``sd_ratio`` = sd_q / sd_ref (variational posteriors are usually < 1);
* ``w1_sd`` = 1-D Wasserstein distance between the two sets of draws, in reference-sd units;
* ``cover50``/``cover90`` = fraction of the reference draws inside the candidate's central 50 %/90 %
  interval (0.5/0.9 when the marginals agree).

Mixture models are compared on the label-switching-invariant summaries their ``ModelSpec`` declares
(``spec.summaries``), never on raw per-component parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats

import zoo

HEALTH_RHAT_MAX = 1.01
HEALTH_ESS_MIN = 400


def compared_posterior(tree: xr.DataTree, spec: zoo.ModelSpec | None = None) -> xr.Dataset:
    """The dataset a scorecard compares: the label-invariant summaries for mixtures, else the posterior."""
    spec = spec or _spec_of(tree)
    post = tree["posterior"].to_dataset()
    if spec is not None and spec.summaries is not None:
        data = {k: v.values for k, v in tree["observed_data"].to_dataset().items()}
        if "constant_data" in tree.children:
            data.update({k: v.values for k, v in tree["constant_data"].to_dataset().items()})
        hyper = _hyper_of(tree, spec)
        return spec.summaries(post, data, hyper)
    return post


def _spec_of(tree: xr.DataTree) -> zoo.ModelSpec | None:
    name = tree.attrs.get("model")
    try:
        return zoo.get(name) if name else None
    except ValueError:
        return None


def _hyper_of(tree: xr.DataTree, spec: zoo.ModelSpec) -> dict:
    import json
    hyper = spec.default_hyper
    hyper.update(json.loads(tree.attrs.get("hyperparameters", "{}")))
    return hyper


def _flat_draws(ds: xr.Dataset, var_names: Sequence[str] | None) -> dict[str, np.ndarray]:
    """label -> 1-D array of draws (chain and draw pooled) for every scalar component."""
    out = {}
    names = list(var_names) if var_names is not None else [
        k for k in ds.data_vars if np.issubdtype(ds[k].dtype, np.floating)]
    for name in names:
        if name not in ds:
            raise ValueError(f"var_names: {name!r} is not in the compared posterior (has {list(ds.data_vars)})")
        da = ds[name].stack(__sample__=("chain", "draw")).transpose("__sample__", ...)
        values = np.asarray(da.values, dtype=float)
        rest = values.shape[1:]
        flat = values.reshape(values.shape[0], -1)
        for j in range(flat.shape[1]):
            idx = np.unravel_index(j, rest) if rest else ()
            label = name + (f"[{','.join(map(str, idx))}]" if rest else "")
            out[label] = flat[:, j]
    return out


def reference_health(reference: xr.DataTree, ds: xr.Dataset | None = None) -> dict:
    """MCMC health of the reference: max R-hat, min bulk ESS, divergences, and whether all pass."""
    import arviz_stats as azs

    ds = ds if ds is not None else compared_posterior(reference)
    floats = [k for k in ds.data_vars if np.issubdtype(ds[k].dtype, np.floating)]
    sub = xr.DataTree(ds[floats])
    rhat = float(np.nanmax([np.nanmax(v.values) for v in azs.rhat(sub).data_vars.values()]))
    ess = float(np.nanmin([np.nanmin(v.values) for v in azs.ess(sub, method="bulk").data_vars.values()]))
    div = 0
    if "sample_stats" in reference.children and "diverging" in reference["sample_stats"]:
        div = int(reference["sample_stats"]["diverging"].sum())
    ok = rhat < HEALTH_RHAT_MAX and ess > HEALTH_ESS_MIN and div == 0
    return {"max_rhat": rhat, "min_ess_bulk": ess, "divergences": div, "reliable": ok}


def scorecard(reference: xr.DataTree, candidates: Mapping[str, xr.DataTree] | xr.DataTree, *,
              var_names: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per (method, scalar parameter or label-invariant summary) comparing each candidate with
    ``reference``. ``df.attrs["reference_health"]`` holds the reference's MCMC health; when it fails
    (R-hat >= 1.01, bulk ESS <= 400 or any divergence) every row is marked ``reliable=False``."""
    if isinstance(candidates, xr.DataTree):
        candidates = {candidates.attrs.get("method", "candidate"): candidates}
    ref_ds = compared_posterior(reference)
    health = reference_health(reference, ref_ds)
    ref = _flat_draws(ref_ds, var_names)
    rows = []
    for method, tree in candidates.items():
        cand = _flat_draws(compared_posterior(tree), list(ref_ds.data_vars) if var_names is None else var_names)
        for label, r in ref.items():
            if label not in cand:
                continue
            q = cand[label]
            sd_ref = float(np.std(r, ddof=1))
            scale = sd_ref if sd_ref > 0 else 1.0
            lo50, hi50 = np.quantile(q, [0.25, 0.75])
            lo90, hi90 = np.quantile(q, [0.05, 0.95])
            rows.append({
                "method": method, "parameter": label,
                "mean_ref": float(np.mean(r)), "mean": float(np.mean(q)),
                "sd_ref": sd_ref, "sd": float(np.std(q, ddof=1)),
                "std_mean_error": abs(float(np.mean(q) - np.mean(r))) / scale,
                "sd_ratio": float(np.std(q, ddof=1)) / scale,
                "w1_sd": float(stats.wasserstein_distance(q, r)) / scale,
                "cover50": float(np.mean((r >= lo50) & (r <= hi50))),
                "cover90": float(np.mean((r >= lo90) & (r <= hi90))),
                "reliable": health["reliable"],
            })
    df = pd.DataFrame(rows)
    df.attrs["reference_health"] = health
    return df
