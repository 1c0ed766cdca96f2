"""MCMC health: is a run long and well-mixed enough to stand in for the true posterior?

One rule, used for the stored references (``make references`` refuses to store a run that fails it),
for a reference a user makes on their own data, and by the scorecard (a reference that fails it judges
nothing). It is posteriordb's reference standard (``doc/REFERENCE_POSTERIOR_DEFINITION.md``), made
stricter where posteriordb's is loose:

* at least ``MIN_CHAINS`` (4) chains and ``MIN_DRAWS`` (4000) stored draws;
* rank-normalised split R-hat (Vehtari et al. 2021) below ``RHAT_MAX`` (1.01), and bulk and tail ESS at
  least ``ESS_MIN`` (400), on **every scalar component of every compared quantity** (the label-invariant
  summaries for mixtures, ``diagnostics.quantities.compared_posterior``); the tail ESS is Vehtari et al.'s, the
  smaller ESS of the indicators I(x <= q05) and I(x <= q95) (``TAIL_PROBS``), fixed here so that ArviZ's
  ``rcParams["stats.ci_prob"]`` (whose default 0.89 would give the 11 %/89 % quantiles) changes no verdict;
* no divergent transition, and E-BFMI above ``EBFMI_MIN`` (0.3) in every chain (Betancourt 2016), for
  runs that record them (NUTS does; Gibbs kernels have neither). A thinned run (a stored reference) carries
  the counts of its whole run, thinned-out iterations included, as ``sample_stats.divergences_run`` and
  ``sample_stats.ebfmi_run`` (one value per chain; ``run_totals``), and those are what is judged, so
  thinning cannot hide a divergence.

Quantities that do not vary at all across the run (a parameter the model holds fixed) have no R-hat or
ESS; they are listed under ``constant`` instead of failing. The record names every quantity that fails
and why, so ``make references`` and the report can say what to change.

``agreement(a, b)`` compares the compared means of two independent exact runs (a second NUTS seed, or a
collapsed Gibbs kernel) in Monte Carlo standard errors: z = (mean_a - mean_b) / sqrt(MCSE_a^2 + MCSE_b^2) per
scalar, MCSE of the mean from the bulk ESS (ArviZ ``mcse(method="mean")``); two runs of the same posterior
give |z| < ``Z_MAX`` (4) on every quantity (for ~100 independent quantities the chance of one |z| > 4 is
about 0.6 %), two runs that sit in different modes or a run that misses part of the posterior do not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import xarray as xr

from diagnostics.quantities import SAMPLE_DIMS, compared_posterior, labels_of

TAIL_PROBS = (0.05, 0.95)  # the quantiles of the tail ESS (Vehtari et al. 2021, sec. 4.3), whatever ArviZ's rcParams


@dataclass(frozen=True)
class HealthRule:
    """Thresholds of the health rule (defaults: the stored-reference standard of the module docstring)."""

    min_chains: int = 4
    min_draws: int = 4000
    rhat_max: float = 1.01
    ess_min: float = 400.0
    ebfmi_min: float = 0.3


REFERENCE_RULE = HealthRule()
Z_MAX = 4.0


def per_component(stat: xr.Dataset, names) -> dict[str, float]:
    """label -> value for every scalar component of ``stat`` (a dataset of per-variable statistics without
    sample dims, as ArviZ's ``rhat``/``ess`` return; its coordinates name the entries, ``dim_entries``)."""
    out = {}
    for name in names:
        values = np.asarray(stat[name].values, dtype=float)
        out.update(zip(labels_of(stat[name], name), values.ravel().tolist(), strict=True))
    return out


def _varying(ds: xr.Dataset) -> tuple[list[str], list[str]]:
    """(float variables with some spread, labels of components that are exactly constant)."""
    names, constant = [], []
    for name, da in ds.data_vars.items():
        if not np.issubdtype(da.dtype, np.floating):
            continue
        values = np.asarray(da.transpose(*SAMPLE_DIMS, ...).values, dtype=float)
        flat = values.reshape(values.shape[0] * values.shape[1], -1)
        still = np.ptp(flat, axis=0) == 0
        labels = labels_of(da, name)
        constant += [lab for lab, s in zip(labels, still, strict=True) if s]
        if not still.all():
            names.append(name)
    return names, constant


def ebfmi(tree: xr.DataTree) -> np.ndarray | None:
    """E-BFMI per chain: ``sample_stats.ebfmi_run`` when the tree carries its whole run's (``run_totals``), else
    from ``sample_stats.energy`` (None when the run records no energy)."""
    if "sample_stats" not in tree.children:
        return None
    stats = tree["sample_stats"]
    if "ebfmi_run" in stats:
        return np.asarray(stats["ebfmi_run"].values, dtype=float).ravel()
    if "energy" not in stats:
        return None
    import arviz_stats as azs

    return np.asarray(azs.bfmi(tree)["energy"].values, dtype=float).ravel()


def divergences(tree: xr.DataTree) -> int:
    """Divergent transitions of the run: ``sample_stats.divergences_run`` summed when the tree carries its
    whole run's counts, else the ``diverging`` flags of its draws (0 for runs that record none)."""
    if "sample_stats" not in tree.children:
        return 0
    stats = tree["sample_stats"]
    key = "divergences_run" if "divergences_run" in stats else "diverging" if "diverging" in stats else None
    return int(np.asarray(stats[key].values).sum()) if key else 0


def run_totals(tree: xr.DataTree) -> xr.Dataset:
    """``divergences_run`` and ``ebfmi_run`` per chain of a whole (unthinned) run, to store beside its thinned
    draws (empty for runs that record neither)."""
    stats = tree["sample_stats"].to_dataset() if "sample_stats" in tree.children else xr.Dataset()
    out = {}
    if "diverging" in stats:
        out["divergences_run"] = stats["diverging"].astype(np.int64).sum("draw")
    bfmi = ebfmi(tree) if "energy" in stats else None
    if bfmi is not None:
        out["ebfmi_run"] = (("chain",), bfmi)
    return xr.Dataset(out, coords={"chain": stats["chain"].values} if "chain" in stats.coords else None)


def mcmc_health(tree: xr.DataTree, ds: xr.Dataset | None = None, *,
                rule: HealthRule = REFERENCE_RULE) -> dict:
    """The health record of an MCMC run (module docstring), as a JSON-serialisable dict.

    ``ds``: the compared quantities (default: ``compared_posterior(tree)``). Keys: ``n_chains``,
    ``n_draws``, ``max_rhat`` / ``worst_rhat``, ``min_ess_bulk`` / ``worst_ess_bulk``, ``min_ess_tail`` /
    ``worst_ess_tail`` (value and quantity), ``divergences``, ``min_ebfmi`` (NaN when not recorded),
    ``n_quantities``, ``constant`` (components left out), ``failures`` (one sentence per failed check,
    naming the quantity) and ``reliable`` (no failure).
    """
    import arviz_stats as azs

    if ds is None:
        ds = compared_posterior(tree)
    n_chains, n_draws = int(ds.sizes["chain"]), int(ds.sizes["chain"] * ds.sizes["draw"])
    names, constant = _varying(ds)
    sub = xr.DataTree.from_dict({"posterior": ds[names]})
    rhat = per_component(azs.rhat(sub), names) if names and ds.sizes["draw"] >= 4 else {}
    bulk = per_component(azs.ess(sub, method="bulk"), names) if names else {}
    tail = per_component(azs.ess(sub, method="tail", prob=TAIL_PROBS), names) if names else {}
    for lab in constant:
        for table in (rhat, bulk, tail):
            table.pop(lab, None)

    def worst(table: Mapping[str, float], largest: bool) -> tuple[float, str | None]:
        finite = {k: v for k, v in table.items() if np.isfinite(v)}
        if len(finite) < len(table):  # NaN R-hat/ESS (e.g. a chain stuck at one value) counts as the worst
            bad = next(k for k, v in table.items() if not np.isfinite(v))
            return (float("inf") if largest else 0.0), bad
        if not finite:
            return float("nan"), None
        k = max(finite, key=finite.get) if largest else min(finite, key=finite.get)
        return float(finite[k]), k

    max_rhat, worst_rhat = worst(rhat, True)
    min_bulk, worst_bulk = worst(bulk, False)
    min_tail, worst_tail = worst(tail, False)
    n_divergent = divergences(tree)
    bfmi = ebfmi(tree)
    min_bfmi = float(np.min(bfmi)) if bfmi is not None and bfmi.size else float("nan")

    failures = []
    if n_chains < rule.min_chains:
        failures.append(f"{n_chains} chains (need at least {rule.min_chains})")
    if n_draws < rule.min_draws:
        failures.append(f"{n_draws} stored draws (need at least {rule.min_draws})")
    if not max_rhat < rule.rhat_max:
        n_bad = sum(1 for v in rhat.values() if not v < rule.rhat_max)
        failures.append(f"R-hat {max_rhat:.3f} on {worst_rhat} (need < {rule.rhat_max}; {n_bad} quantities fail)")
    for kind, value, label, table in (("bulk", min_bulk, worst_bulk, bulk), ("tail", min_tail, worst_tail, tail)):
        if not value >= rule.ess_min:
            n_bad = sum(1 for v in table.values() if not v >= rule.ess_min)
            failures.append(f"{kind} ESS {value:.0f} on {label} (need >= {rule.ess_min:.0f}; {n_bad} quantities "
                            f"fail)")
    if n_divergent:
        failures.append(f"{n_divergent} divergent transitions (need 0)")
    if np.isfinite(min_bfmi) and not min_bfmi > rule.ebfmi_min:
        failures.append(f"E-BFMI {min_bfmi:.2f} in some chain (need > {rule.ebfmi_min})")
    return {
        "n_chains": n_chains, "n_draws": n_draws,
        "max_rhat": max_rhat, "worst_rhat": worst_rhat,
        "min_ess_bulk": min_bulk, "worst_ess_bulk": worst_bulk,
        "min_ess_tail": min_tail, "worst_ess_tail": worst_tail,
        "divergences": n_divergent, "min_ebfmi": min_bfmi,
        "n_quantities": len(rhat) or len(bulk), "constant": constant,
        "rule": {"min_chains": rule.min_chains, "min_draws": rule.min_draws, "rhat_max": rule.rhat_max,
                 "ess_min": rule.ess_min, "ebfmi_min": rule.ebfmi_min},
        "failures": failures, "reliable": not failures,
    }


def mean_and_mcse(ds: xr.Dataset) -> tuple[dict[str, float], dict[str, float]]:
    """(label -> posterior mean, label -> Monte Carlo standard error of that mean) for every scalar component
    of the float variables of ``ds`` (chain, draw, ...); the MCSE of a component constant over the run is 0."""
    import arviz_stats as azs

    names = [k for k, v in ds.data_vars.items() if np.issubdtype(v.dtype, np.floating)]
    means = per_component(ds[names].mean(SAMPLE_DIMS), names)
    varying, constant = _varying(ds[names])
    mcse = per_component(azs.mcse(xr.DataTree.from_dict({"posterior": ds[varying]}), method="mean"), varying) \
        if varying else {}
    mcse.update({lab: 0.0 for lab in constant})
    return means, {lab: float(mcse[lab]) for lab in means}


def agreement(a: xr.Dataset, b: xr.Dataset, *, z_max: float = Z_MAX) -> dict:
    """Do two independent runs agree on the compared means (module docstring)? A JSON-serialisable record:
    ``means_b`` / ``mcse_b`` (run b's, per label), ``z`` (per label), ``max_abs_z`` and its quantity ``worst``,
    ``n_quantities``, ``missing`` (labels of a absent from b), ``failures`` and ``agree``. A component both runs
    hold exactly constant at the same value has z = 0; constant at different values, z = inf."""
    mean_a, mcse_a = mean_and_mcse(a)
    mean_b, mcse_b = mean_and_mcse(b)
    z = {}
    for lab, m in mean_a.items():
        if lab not in mean_b:
            continue
        se = float(np.hypot(mcse_a[lab], mcse_b[lab]))
        diff = float(mean_b[lab] - m)
        z[lab] = diff / se if se > 0 else (0.0 if diff == 0 else float(np.copysign(np.inf, diff)))
    missing = sorted(set(mean_a) - set(mean_b))
    worst = max(z, key=lambda k: abs(z[k])) if z else None
    max_abs_z = abs(z[worst]) if worst else float("nan")
    failures = []
    if missing:
        failures.append(f"{len(missing)} compared quantities missing from the second run ({', '.join(missing[:5])})")
    if worst is not None and not max_abs_z < z_max:
        n_bad = sum(1 for v in z.values() if not abs(v) < z_max)
        failures.append(f"means differ by {max_abs_z:.1f} combined MCSE on {worst} ({mean_a[worst]:.4g} vs "
                        f"{mean_b[worst]:.4g}; need < {z_max:g}; {n_bad} quantities fail)")
    return {"means_b": mean_b, "mcse_b": mcse_b, "z": z, "max_abs_z": max_abs_z, "worst": worst,
            "n_quantities": len(z), "missing": missing, "z_max": z_max, "failures": failures,
            "agree": not failures}
