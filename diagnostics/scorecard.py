"""The VI-vs-MCMC scorecard: per parameter, how and how much a posterior differs from a reference.

For each candidate method and each scalar component of each compared variable:

* ``std_mean_error`` = |E_q - E_ref| / sd_ref;
* ``sd_ratio`` = sd_q / sd_ref (variational posteriors are usually < 1);
* ``w1_sd`` = 1-D Wasserstein distance between the two sets of draws, in reference-sd units;
* ``cover50``/``cover90`` = fraction of the reference draws inside the candidate's central 50 %/90 %
  interval (0.5/0.9 when the marginals agree).

Mixture models are compared on the label-switching-invariant summaries their ``ModelSpec`` declares
(``spec.summaries``), never on raw per-component parameters.

Added per row: ``ess_bulk``/``ess_bulk_ref`` (bulk ESS of the candidate's and the reference's draws),
``mcse_mean_sd`` (Monte Carlo standard error of the mean difference, in reference-sd units:
sqrt(1/ess_bulk + 1/ess_bulk_ref)) and ``ok`` (the row meets the agreement rule below).

``method_scores`` adds one row per method: the worst rows of the scorecard, joint Wasserstein / KL /
MMD (``diagnostics.metrics``), the PSIS k-hat of an approximation (Yao et al. 2018), the ELBO or bound
at convergence, compile and run seconds, ESS per second for samplers, and a verdict in words.

The agreement rule (what "pass" means on the report), per compared scalar, widened by 3 Monte Carlo
standard errors so that a sampler is not failed for the noise of a short run:

* mean: std_mean_error <= MEAN_TOL (0.2 reference sd) + 3 mcse_mean_sd;
* spread: SD_RATIO_RANGE[0] (0.8) <= sd_ratio <= SD_RATIO_RANGE[1] (1.25), each end moved out by
  3 sd_ratio sqrt(1/(2 ess_bulk) + 1/(2 ess_bulk_ref));
* for methods that store log q: k-hat <= 0.7 (above it the approximation misses posterior mass);
* point estimates (one draw) are judged on the mean rule only; quantities the reference holds fixed
  (sd below ``FIXED_SD``, e.g. a noise precision given as a constant) are left out and listed in
  ``df.attrs["fixed_in_reference"]``;
* the reference itself passes MCMC health (R-hat < 1.01, bulk ESS > 400, no divergences), else the
  method is "not judged".
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
MEAN_TOL = 0.2  # reference sd
SD_RATIO_RANGE = (0.8, 1.25)
MC_WIDEN = 3.0  # Monte Carlo standard errors added to each tolerance
FIXED_SD = 1e-9  # reference sd below this (relative to max(1, |mean|)): the quantity is fixed, not compared
ESS_WARN = 100  # fewer effective draws than this: the comparison is noisy (a warning)


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


def _as_tree(ds: xr.Dataset) -> xr.DataTree:
    """A tree whose ``posterior`` group is ``ds`` (what ArviZ's functions look for)."""
    return xr.DataTree.from_dict({"posterior": ds})


def _flat_ess(ds: xr.Dataset, labels: Sequence[str]) -> dict[str, float]:
    """label -> bulk ESS, for the labels ``_flat_draws`` makes (same component order)."""
    import arviz_stats as azs

    names = sorted({label.split("[", 1)[0] for label in labels})
    out = {}
    for name in names:
        if name not in ds:
            continue
        ess = np.asarray(azs.ess(_as_tree(ds[[name]]), method="bulk")[name].values, dtype=float)
        rest = ds[name].shape[2:]
        flat = ess.reshape(-1)
        for j in range(flat.size):
            idx = np.unravel_index(j, rest) if rest else ()
            out[name + (f"[{','.join(map(str, idx))}]" if rest else "")] = float(flat[j])
    return out


def reference_health(reference: xr.DataTree, ds: xr.Dataset | None = None) -> dict:
    """MCMC health of the reference: max R-hat, min bulk and tail ESS, divergences, and whether it is
    reliable (R-hat < 1.01, bulk ESS > 400, no divergences)."""
    import arviz_stats as azs

    ds = ds if ds is not None else compared_posterior(reference)
    # constant quantities (held fixed by the model) have no R-hat or ESS: leave them out
    floats = [k for k in ds.data_vars if np.issubdtype(ds[k].dtype, np.floating)]
    floats = [k for k in floats if float(np.ptp(ds[k].values)) > 0] or floats
    sub = _as_tree(ds[floats])
    rhat = float(np.nanmax([np.nanmax(v.values) for v in azs.rhat(sub).data_vars.values()]))
    ess = float(np.nanmin([np.nanmin(v.values) for v in azs.ess(sub, method="bulk").data_vars.values()]))
    ess_tail = float(np.nanmin([np.nanmin(v.values) for v in azs.ess(sub, method="tail").data_vars.values()]))
    div = 0
    if "sample_stats" in reference.children and "diverging" in reference["sample_stats"]:
        div = int(reference["sample_stats"]["diverging"].sum())
    ok = rhat < HEALTH_RHAT_MAX and ess > HEALTH_ESS_MIN and div == 0
    return {"max_rhat": rhat, "min_ess_bulk": ess, "min_ess_tail": ess_tail, "divergences": div, "reliable": ok}


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
    ref_ess = _flat_ess(ref_ds, list(ref))
    # A quantity the reference holds fixed (e.g. tau with tau_fixed) has no spread to compare against.
    fixed = [lab for lab, r in ref.items() if np.std(r) <= FIXED_SD * max(1.0, abs(float(np.mean(r))))]
    ref = {lab: r for lab, r in ref.items() if lab not in fixed}
    rows = []
    for method, tree in candidates.items():
        cand_ds = compared_posterior(tree)
        wanted = var_names if var_names is not None else list(dict.fromkeys(lab.split("[", 1)[0] for lab in ref))
        cand = _flat_draws(cand_ds, [k for k in wanted if k in cand_ds])
        cand_ess = _flat_ess(cand_ds, list(cand))
        for label, r in ref.items():
            if label not in cand:
                continue
            q = cand[label]
            sd_ref = float(np.std(r, ddof=1))
            sd_q = float(np.std(q, ddof=1)) if len(q) > 1 else float("nan")  # a point estimate has no sd
            scale = sd_ref if sd_ref > 0 else 1.0
            lo50, hi50 = np.quantile(q, [0.25, 0.75])
            lo90, hi90 = np.quantile(q, [0.05, 0.95])
            ess_q, ess_r = cand_ess.get(label, np.nan), ref_ess.get(label, np.nan)
            rows.append({
                "method": method, "parameter": label,
                "mean_ref": float(np.mean(r)), "mean": float(np.mean(q)),
                "sd_ref": sd_ref, "sd": sd_q,
                "std_mean_error": abs(float(np.mean(q) - np.mean(r))) / scale,
                "sd_ratio": sd_q / scale,
                "w1_sd": float(stats.wasserstein_distance(q, r)) / scale,
                "cover50": float(np.mean((r >= lo50) & (r <= hi50))),
                "cover90": float(np.mean((r >= lo90) & (r <= hi90))),
                "reliable": health["reliable"],
                "ess_bulk": ess_q, "ess_bulk_ref": ess_r,
            })
    df = pd.DataFrame(rows, columns=COLUMNS)
    if len(df):
        # A point estimate (one draw: no ESS) has no Monte Carlo error of its own and no spread to judge.
        inv = (1 / df["ess_bulk"].clip(lower=1)).fillna(0) + (1 / df["ess_bulk_ref"].clip(lower=1)).fillna(0)
        df["mcse_mean_sd"] = np.sqrt(inv)
        sd_noise = MC_WIDEN * df["sd_ratio"] * np.sqrt(inv / 2)
        mean_ok = df["std_mean_error"] <= MEAN_TOL + MC_WIDEN * df["mcse_mean_sd"]
        sd_ok = df["sd_ratio"].isna() | ((df["sd_ratio"] >= SD_RATIO_RANGE[0] - sd_noise)
                                         & (df["sd_ratio"] <= SD_RATIO_RANGE[1] + sd_noise))
        df["ok"] = mean_ok & sd_ok
    df.attrs["reference_health"] = health
    df.attrs["fixed_in_reference"] = fixed
    return df


COLUMNS = ["method", "parameter", "mean_ref", "mean", "sd_ref", "sd", "std_mean_error", "sd_ratio", "w1_sd",
           "cover50", "cover90", "reliable", "ess_bulk", "ess_bulk_ref", "mcse_mean_sd", "ok"]


def method_kind(tree: xr.DataTree) -> str:
    """"sampler", "variational" or "point" as registered for the tree's (model, method); trees of an
    unregistered method: "variational" when they store log q, else "sampler"."""
    from inference._methods import get_method

    try:
        return get_method(zoo.get(tree.attrs["model"]), tree.attrs["method"]).kind
    except (KeyError, ValueError):
        has_log_q = "sample_stats" in tree.children and "log_q" in tree["sample_stats"]
        return "variational" if has_log_q else "sampler"


def _sampler_rhat(tree: xr.DataTree, spec: zoo.ModelSpec | None = None) -> float:
    import arviz_stats as azs

    ds = compared_posterior(tree, spec)
    floats = [k for k in ds.data_vars if np.issubdtype(ds[k].dtype, np.floating)]
    if not floats or ds.sizes.get("draw", 0) < 4:
        return float("nan")
    return float(np.nanmax([np.nanmax(v.values) for v in azs.rhat(_as_tree(ds[floats])).data_vars.values()]))


def _worst(rows: pd.DataFrame, column: str, *, key=None) -> tuple[float, str]:
    values = rows[column] if key is None else key(rows[column])
    i = values.idxmax()
    return float(rows.loc[i, column]), str(rows.loc[i, "parameter"])


def method_scores(reference: xr.DataTree, candidates: Mapping[str, xr.DataTree] | xr.DataTree, *,
                  card: pd.DataFrame | None = None, var_names: Sequence[str] | None = None,
                  joint: bool = True, seed: int = 0) -> pd.DataFrame:
    """One row per method: how its whole posterior compares with ``reference``, and a verdict.

    Columns: ``method``, ``kind`` (sampler/variational/point), ``n_draws``, ``max_std_mean_error``
    (and ``worst_mean_parameter``), ``min_sd_ratio``, ``max_sd_ratio``, ``mean_w1_sd``, ``frac_ok``
    (share of scalars meeting the rule), ``w1_joint`` (reference-sd units), ``kl_joint`` (KL(ref || q),
    nats), ``mmd``, ``joint_dim``, ``khat`` (PSIS k-hat of q; NaN without log q), ``khat_reading``,
    ``bound_name``/``bound`` (ELBO or bound at convergence), ``max_rhat`` (samplers' own chains),
    ``min_ess_bulk``, ``compile_seconds``, ``run_seconds``, ``ess_per_second`` (samplers: min bulk ESS
    / run seconds), ``verdict`` ("pass", "warn", "fail" or "not judged") and ``reasons`` (plain words).

    ``card``: a ``scorecard`` of the same arguments, if already computed. ``joint=False`` skips the
    joint metrics (W1, KL, MMD), the only part that costs more than a fraction of a second.
    """
    from diagnostics import metrics

    if isinstance(candidates, xr.DataTree):
        candidates = {candidates.attrs.get("method", "candidate"): candidates}
    card = card if card is not None else scorecard(reference, candidates, var_names=var_names)
    health = card.attrs.get("reference_health") or reference_health(reference)
    ref_flat = _flat_draws(compared_posterior(reference), var_names)
    rows = []
    for method, tree in candidates.items():
        kind = method_kind(tree)
        sub = card[card["method"] == method]
        post = tree["posterior"]
        row = {"method": method, "kind": kind, "n_draws": int(post.sizes["chain"] * post.sizes["draw"])}
        if len(sub):
            row["max_std_mean_error"], row["worst_mean_parameter"] = _worst(sub, "std_mean_error")
            row["min_sd_ratio"] = float(sub["sd_ratio"].min())
            row["max_sd_ratio"] = float(sub["sd_ratio"].max())
            row["mean_w1_sd"] = float(sub["w1_sd"].mean())
            row["frac_ok"] = float(sub["ok"].mean())
            row["min_ess_bulk"] = float(sub["ess_bulk"].min())
        if joint and len(sub):
            cand_flat = _flat_draws(compared_posterior(tree), list(dict.fromkeys(
                p.split("[", 1)[0] for p in sub["parameter"])))
            row.update(metrics.joint_metrics(ref_flat, cand_flat, seed=seed))
        k = metrics.psis_khat(tree)
        row["khat"] = float("nan") if k is None else k
        row["khat_reading"] = metrics.khat_reading(k)
        row["bound_name"], row["bound"] = metrics.final_bound(tree)
        row["max_rhat"] = _sampler_rhat(tree) if kind == "sampler" else float("nan")
        row["compile_seconds"] = float(tree.attrs.get("compile_seconds", np.nan))
        row["run_seconds"] = float(tree.attrs.get("run_seconds", np.nan))
        row["ess_per_second"] = (row.get("min_ess_bulk", np.nan) / row["run_seconds"]
                                 if kind == "sampler" and row["run_seconds"] > 0 else float("nan"))
        row["verdict"], row["reasons"] = _verdict(row, sub, health)
        rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs["reference_health"] = health
    return out


def _verdict(row: dict, sub: pd.DataFrame, health: dict) -> tuple[str, str]:
    """The agreement rule of the module docstring, in words a student can read."""
    if not health["reliable"]:
        why = []
        if not health["max_rhat"] < HEALTH_RHAT_MAX:
            why.append(f"R-hat {health['max_rhat']:.3f} >= {HEALTH_RHAT_MAX}")
        if not health["min_ess_bulk"] > HEALTH_ESS_MIN:
            why.append(f"bulk ESS {health['min_ess_bulk']:.0f} <= {HEALTH_ESS_MIN}")
        if health["divergences"]:
            why.append(f"{health['divergences']} divergent transitions")
        return "not judged", ("the MCMC reference itself failed its health check (" + ", ".join(why) +
                              "), so nothing is scored against it")
    if not len(sub):
        return "not judged", "no parameter in common with the reference"
    fails, warns = [], []
    bad_mean = sub[sub["std_mean_error"] > MEAN_TOL + MC_WIDEN * sub["mcse_mean_sd"]]
    if len(bad_mean):
        v, p = _worst(bad_mean, "std_mean_error")
        fails.append(f"posterior means are off on {len(bad_mean)} of {len(sub)} quantities (worst: {p}, "
                     f"{v:.2f} reference sd away; allowed {MEAN_TOL})")
    sd_noise = MC_WIDEN * sub["sd_ratio"] * np.sqrt(sub["mcse_mean_sd"] ** 2 / 2)
    narrow = sub[sub["sd_ratio"] < SD_RATIO_RANGE[0] - sd_noise]
    wide = sub[sub["sd_ratio"] > SD_RATIO_RANGE[1] + sd_noise]
    if len(narrow):
        v = float(narrow["sd_ratio"].min())
        p = str(narrow.loc[narrow["sd_ratio"].idxmin(), "parameter"])
        fails.append(f"too narrow on {len(narrow)} quantities (worst: {p}, sd {v:.2f} x the reference's): "
                     f"it is overconfident")
    if len(wide):
        v, p = _worst(wide, "sd_ratio")
        fails.append(f"too wide on {len(wide)} quantities (worst: {p}, sd {v:.2f} x the reference's)")
    k = row.get("khat", float("nan"))
    if np.isfinite(k) and k > 0.7:
        fails.append(f"PSIS k-hat {k:.2f} > 0.7: the approximation misses mass the posterior has")
    elif np.isfinite(k) and k > 0.5:
        warns.append(f"PSIS k-hat {k:.2f} is between 0.5 and 0.7 (usable, not good)")
    if np.isfinite(row.get("max_rhat", np.nan)) and row["max_rhat"] >= HEALTH_RHAT_MAX:
        warns.append(f"its own chains disagree (R-hat {row['max_rhat']:.3f} >= {HEALTH_RHAT_MAX})")
    if row.get("min_ess_bulk", np.inf) < ESS_WARN:
        warns.append(f"only {row['min_ess_bulk']:.0f} effective draws on some quantity: the comparison is noisy")
    if fails:
        return "fail", "; ".join(fails + warns)
    if warns:
        return "warn", "; ".join(warns)
    if row.get("kind") == "point":
        return "pass", (f"a point estimate: every value is within {MEAN_TOL} reference sd of the reference mean "
                        f"(it has no spread to judge)")
    return "pass", (f"every quantity agrees with the reference (means within {MEAN_TOL} sd, sd ratios within "
                    f"{SD_RATIO_RANGE[0]}-{SD_RATIO_RANGE[1]})")
