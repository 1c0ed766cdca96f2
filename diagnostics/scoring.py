"""The VI-vs-MCMC scorecard and the verdict: how, and how much, a posterior differs from an MCMC reference.

Per candidate method and per scalar component of each compared quantity (the label-invariant summaries of
``ModelSpec.summaries`` for mixtures, else the posterior variables; ``diagnostics.view``):

* ``std_mean_error`` = |E_q - E_ref| / sd_ref; ``sd_ratio`` = sd_q / sd_ref; ``w1_sd`` = 1-D Wasserstein
  distance in reference sd; ``cover50``/``cover90`` = share of the reference draws inside the candidate's
  central 50 %/90 % interval;
* ``mcse_mean_sd``: the Monte Carlo error of the mean difference in reference sd,
  sqrt(mcse_q^2 + mcse_ref^2) / sd_ref = sqrt(sd_ratio^2 / ESS_q + 1 / ESS_ref) (ESS of the mean, ArviZ's
  ``mcse``; the candidate's own sd enters, so a wide sampler is not credited with a narrow one's error);
* ``z_mean``, ``z_sd``: the differences of the means and of the sds in combined Monte Carlo standard errors;
* ``floor``, ``mean_tol``, ``sd_tol``, ``mean_ok``, ``sd_ok``, ``ok``: the rule below, row by row; ``mean_tol`` and
  ``sd_tol`` are the largest |difference| of the mean and of the sd that the method's rule allows on the row
  (samplers: z_crit combined Monte Carlo errors; approximations: 0.2 reference sd, and the sd ratio range
  0.8-1.25 on the side the method is on; never below the floor).

The verdict (``method_scores``), one of four:

* **NOT JUDGED**: the reference fails the MCMC health rule (``diagnostics.health.mcmc_health``: >= 4 chains,
  >= 4000 draws, R-hat < 1.01 and bulk/tail ESS >= 400 on every compared quantity, no divergence,
  E-BFMI > 0.3), and the method is not a sampler that has failed to mix. The numbers are shown, nothing is
  judged; the reasons name the failed checks.
* **NOT CONVERGED**: a sampler whose own chains have not mixed: rank-normalised R-hat >= 1.01, or bulk or
  tail ESS < 400, on some compared quantity the reference does not hold (nearly) constant, whatever the
  reference's health (its own mixing needs no reference; with an unhealthy reference the quantities are all
  those the reference varies, as its sd tells even when it is not trusted for a verdict). The reasons say
  how much longer to run: about 1.25 x max(400 / ESS, (R-hat^2 - 1) / (1.01^2 - 1)) times the draws (ESS
  grows with the draws, and R-hat^2 - 1, the between-chain over the within-chain variance of a stationary
  run, shrinks as 1 / draws; the margin 1.25 covers the noise of the ESS estimate itself). The rule is
  stricter than "ESS >= 400" suggests: with 2 chains, R-hat < 1.01 on *every one* of 30-50 quantities holds
  reliably only from ESS ~1300 per quantity (simulated on exact AR(1) chains: ``benchmarks/results.md``,
  verdict_rules), so the demo's exact samplers run to ESS ~1000 or more where affordable (``demo_options``).
* **FAIL**: the posterior disagrees with the reference, or some compared quantity of the reference is
  missing from it. Each reason names the quantity, the number and the rule.
* **PASS**: every compared quantity of the reference was compared and meets its rule.

Two kinds of rule, by the method's kind:

1. **Samplers** (``kind == "sampler"``: NUTS, the Gibbs kernels) are exact in the limit; the only honest
   question is whether the difference is larger than Monte Carlo noise, so they are judged by MCSE, as
   inference_gym validates its ground truths (two-sided z-test of the mean difference in combined Monte Carlo
   standard errors). Per quantity, two tests: the mean, z_mean = (m_q - m_ref) / sqrt(mcse_q^2 + mcse_ref^2),
   and the spread, z_sd = (s_q - s_ref) / sqrt(mcse_sd_q^2 + mcse_sd_ref^2), with ArviZ's fourth-moment MCSE
   of the sd (so an sd off by a known factor is caught, and a spread carried by a few rare draws gets the
   large error it deserves). A quantity fails when |z| > z_crit, Bonferroni-corrected over the n tests of the
   method: z_crit = Phi^-1(1 - FWER / (2 n)), FWER = 0.01 (n = 2 per quantity: z_crit 3.65 for 19
   quantities, 3.84 for 40, 4.01 for 83).

2. **Approximations** (``"variational"``: VB, SVI; ``"point"``: EM and other one-draw estimates) are not
   exact at any run length, so they are judged on practical thresholds of size, not significance: mean
   within ``MEAN_TOL`` = 0.2 reference sd; sd ratio within ``SD_RATIO_RANGE`` = 0.8-1.25; PSIS k-hat
   <= 0.7 (Yao et al. 2018) when the tree stores log q and log p(theta, y). Point estimates are judged on the
   mean only. The thresholds are applied to the estimates themselves (the draws of q are independent, so
   their Monte Carlo error is about 1/sqrt(N) sd; ``mcse_mean_sd`` is shown beside them).

**The floor.** Every tolerance is at least the quantity's floor: 1 % of the range of a quantity the model
declares bounded (``ModelSpec.bounded``; 0.01 for a probability), else float noise (1e-9 x max(1, |mean|)).
A probability pinned near 0 or 1 (a co-clustering of 0.999, a switch inclusion probability with reference
sd 4e-9) is governed by rare draws: k excursions of depth c in N draws move its mean by k c / N (at most
0.0025 for 5 draws of depth 1 in 2000) but its sd by c sqrt(k / N) (0.05), so its sd ratio is a tail
statistic (an example in ``benchmarks/results.md``, verdict_rules) and the ESS of its rare events is not
estimable. A difference of 1 percentage point in a probability is below any practical relevance, above that
rare-draw effect on the mean, and still catches a real shift (0.999 -> 0.95) or a real spread. The same
quantities (reference sd below the floor) are left out of the NOT CONVERGED check: R-hat and ESS of
numerical noise around a constant mean nothing; their values are still compared with the floor.

**Why the error rates can meet 19/20 on both sides** (measured: ``benchmarks/results.md``, verdicts).

* False alarms. Under the null (an exact sampler, converged) each z is approximately standard normal, so
  Bonferroni bounds the probability of any failure by FWER = 0.01 per run, and less when the tests are
  correlated (the 50 points of an ssgp curve, the mean and sd of one quantity): then 20 independent runs
  fail twice or more with probability <= 1 - 0.99^20 - 20 x 0.01 x 0.99^19 = 1.7 %. With FWER 0.05 that
  would be 26 %. The reference is the same in all 20 runs, so its own Monte Carlo error is a fixed offset;
  it is inside the combined MCSE, and even the worst of 100 quantities (offset ~2.6 mcse_ref) with
  ESS_ref = ESS_q fails one run in ~1000 at z_crit 4. Samplers that have not mixed are NOT CONVERGED, never
  FAIL, so a short run cannot be a false alarm.
* Power. A mean shifted by d reference sd has z = d / sqrt(1 / ESS_q + 1 / ESS_ref); it fails with
  probability 0.99 when z >= z_crit + 2.33, i.e. 1/ESS_q + 1/ESS_ref <= (d / (z_crit + 2.33))^2 =
  0.0024 for d = 0.3 and 40 quantities (0.0022 for 100): e.g. ESS_ref >= 2000 and ESS_q >= 550, or
  ESS_ref = ESS_q >= 850. ``detectable_shift`` reports, per method, the smallest mean shift detected with
  95 % power on its worst quantity, (z_crit + 1.645) x max mcse_mean_sd, so a run too short to see 0.3 sd
  says so. An sd scaled by 0.7 has z = 0.3 / sqrt(0.49 / (2 ESS_q) + 1 / (2 ESS_ref)) for Gaussian
  marginals: 9 at ESS 400/1000, far beyond z_crit. A mean-field Gaussian fitted to a correlated posterior has
  sd ratio sqrt(1 - rho^2) per coordinate: below 0.8 (fails the practical rule) when |rho| > 0.6, and its
  k-hat is about |rho|; as a sampler-kind candidate its sd test has z ~ (1 - sqrt(1 - rho^2)) / 0.04 at
  ESS 400/1000.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats

from diagnostics import metrics
from diagnostics.health import mcmc_health
from diagnostics.view import (
    NUMERIC_FLOOR,
    ComparedView,
    carry_user_labels,
    compared_posterior,
    compared_view,
    compared_views,
    method_kind,
)

PASS, FAIL, NOT_CONVERGED, NOT_JUDGED = "PASS", "FAIL", "NOT CONVERGED", "NOT JUDGED"
VERDICTS = (PASS, FAIL, NOT_CONVERGED, NOT_JUDGED)
FWER = 0.01  # family-wise false-alarm probability of one sampler's tests (module docstring)
MEAN_TOL = 0.2  # reference sd (approximations)
SD_RATIO_RANGE = (0.8, 1.25)  # approximations
KHAT_MAX = 0.7
CONVERGED_RHAT = 1.01  # a candidate sampler's own chains (the demo rule)
CONVERGED_ESS = 400
RUN_MARGIN = 1.25  # "run longer" aims at 1.25 x the needed ESS: the ESS estimate itself is ~10-20 % noisy
POWER_Z = 1.645  # one-sided 95 %: detectable_shift = (z_crit + POWER_Z) x worst mcse_mean_sd
FIXED_SD = NUMERIC_FLOOR  # reference sd below this (x max(1, |mean|)): held fixed by the model
SHOWN = 3  # quantities named per failed rule in a reason (the rest are counted)

COLUMNS = ["method", "parameter", "mean_ref", "mean", "sd_ref", "sd", "std_mean_error", "sd_ratio", "w1_sd",
           "cover50", "cover90", "reliable", "ess_bulk", "ess_tail", "rhat", "ess_bulk_ref", "mcse_mean_sd",
           "z_mean", "z_sd", "rule", "floor", "mean_tol", "sd_tol", "mean_ok", "sd_ok", "ok"]

__all__ = ["COLUMNS", "FAIL", "NOT_CONVERGED", "NOT_JUDGED", "PASS", "VERDICTS", "ComparedView",
           "compared_posterior", "compared_view", "method_kind", "method_scores", "reference_health",
           "scorecard", "first_clause", "verdict_lines", "MethodScores", "z_critical"]


def z_critical(n_tests: int, fwer: float = FWER) -> float:
    """Two-sided Bonferroni critical |z| for ``n_tests`` tests at family-wise error ``fwer``."""
    return float(stats.norm.isf(fwer / (2 * max(int(n_tests), 1))))


def reference_health(reference: xr.DataTree | ComparedView, ds: xr.Dataset | None = None) -> dict:
    """The reference's MCMC health: exactly ``diagnostics.health.mcmc_health`` (the one rule), on the
    compared quantities (``ds``, or the view's)."""
    if isinstance(reference, ComparedView):
        return reference.health
    return mcmc_health(reference, ds if ds is not None else compared_posterior(reference))


def _check_trees(reference, candidates) -> None:
    """``ValueError`` naming the argument when ``reference`` is not a DataTree or view, or ``candidates`` is not
    one, nor a mapping of method labels to them (checked before any summary is computed)."""
    kinds = (xr.DataTree, ComparedView)
    if not isinstance(reference, kinds):
        raise ValueError(f"reference: expected an ArviZ DataTree (e.g. a stored reference) or a ComparedView, got "
                         f"{type(reference).__name__}")
    if isinstance(candidates, kinds):
        return
    if not isinstance(candidates, Mapping):
        raise ValueError(f"candidates: expected a DataTree, a ComparedView or a mapping {{method label: tree}}, got "
                         f"{type(candidates).__name__}")
    for label, tree in candidates.items():
        if not isinstance(tree, kinds):
            raise ValueError(f"candidates[{label!r}]: expected an ArviZ DataTree or a ComparedView, got "
                             f"{type(tree).__name__}")


def _reference_view(reference, candidates) -> ComparedView:
    """The reference's view, its tree first given the candidates' labels where it has positions only
    (``carry_user_labels``: a reference made on the bare arrays of a labelled table); the arguments are checked
    first (``_check_trees``)."""
    _check_trees(reference, candidates)
    if isinstance(reference, xr.DataTree):
        donors = [candidates] if isinstance(candidates, xr.DataTree | ComparedView) else list(candidates.values())
        reference = carry_user_labels(reference, donors)
    return compared_view(reference, name="reference")


def _candidate_views(candidates) -> dict[str, ComparedView]:
    if isinstance(candidates, xr.DataTree | ComparedView):
        view = compared_view(candidates)
        return {view.name: view}
    return compared_views(candidates)


def _compared_labels(ref: ComparedView, var_names: Sequence[str] | None) -> list[str]:
    if var_names is None:
        return ref.labels
    bad = [v for v in var_names if v not in ref.ds]
    if bad:
        raise ValueError(f"var_names: {bad} are not compared quantities of the reference "
                         f"(it has {list(ref.ds.data_vars)})")
    return [lab for lab in ref.labels if lab.split("[", 1)[0] in set(var_names)]


def _rule_of(kind: str) -> str:
    return {"sampler": "MCSE", "point": "point"}.get(kind, "practical")


def _rows(method: str, view: ComparedView, ref: ComparedView, labels: Sequence[str], reliable: bool) -> list[dict]:
    rows = []
    rs, qs = ref.stats, view.stats
    for label in labels:
        r, q = ref.flat(label), view.flat(label)
        sd_ref = float(rs.at[label, "sd"])
        scale = sd_ref if sd_ref > 0 else 1.0
        sd_q = float(qs.at[label, "sd"])
        mean_ref, mean_q = float(rs.at[label, "mean"]), float(qs.at[label, "mean"])
        lo50, hi50 = np.quantile(q, [0.25, 0.75])
        lo90, hi90 = np.quantile(q, [0.05, 0.95])
        se_mean = math.hypot(float(qs.at[label, "mcse_mean"]), float(rs.at[label, "mcse_mean"]))
        se_sd = math.hypot(float(qs.at[label, "mcse_sd"]), float(rs.at[label, "mcse_sd"]))
        rows.append({
            "method": method, "parameter": label, "mean_ref": mean_ref, "mean": mean_q, "sd_ref": sd_ref,
            "sd": sd_q, "std_mean_error": abs(mean_q - mean_ref) / scale, "sd_ratio": sd_q / scale,
            "w1_sd": float(stats.wasserstein_distance(q, r)) / scale,
            "cover50": float(np.mean((r >= lo50) & (r <= hi50))), "cover90": float(np.mean((r >= lo90) & (r <= hi90))),
            "reliable": reliable, "ess_bulk": float(qs.at[label, "ess_bulk"]),
            "ess_tail": float(qs.at[label, "ess_tail"]), "rhat": float(qs.at[label, "rhat"]),
            "ess_bulk_ref": float(rs.at[label, "ess_bulk"]), "mcse_mean_sd": se_mean / scale,
            "_se_mean": se_mean, "_se_sd": se_sd,
            "floor": max(view.floors.get(label, 0.0), ref.floor(label)),
        })
    return rows


def _judge(df: pd.DataFrame, kind: str) -> float:
    """Add the rule's columns to one method's rows (module docstring); returns z_crit (NaN unless MCSE)."""
    rule = _rule_of(kind)
    df["rule"] = rule
    diff_mean = (df["mean"] - df["mean_ref"]).abs()
    diff_sd = (df["sd"] - df["sd_ref"]).abs()
    with np.errstate(divide="ignore", invalid="ignore"):
        df["z_mean"] = np.where(df["_se_mean"] > 0, (df["mean"] - df["mean_ref"]) / df["_se_mean"], np.nan)
        df["z_sd"] = np.where(df["_se_sd"] > 0, (df["sd"] - df["sd_ref"]) / df["_se_sd"], np.nan)
    spread = df["sd"].notna() & ((df["sd"] > 0) | (df["sd_ref"] > 0))
    z_crit = float("nan")
    if rule == "MCSE":
        z_crit = z_critical(len(df) + int(spread.sum()))
        df["mean_tol"] = np.maximum(z_crit * df["_se_mean"], df["floor"])
        df["sd_tol"] = np.where(spread, np.maximum(z_crit * df["_se_sd"], df["floor"]), np.nan)
        df["mean_ok"] = diff_mean <= df["mean_tol"]
        df["sd_ok"] = ~spread | (diff_sd <= df["sd_tol"])
    else:
        df["mean_tol"] = np.maximum(MEAN_TOL * df["sd_ref"], df["floor"])
        df["mean_ok"] = diff_mean <= df["mean_tol"]
        if rule == "point":
            df["sd_tol"] = np.nan
            df["sd_ok"] = True
        else:
            lo, hi = SD_RATIO_RANGE
            # the allowed |sd - sd_ref| on the side the method is on: the ratio range 0.8-1.25, or the floor
            side = np.where(df["sd"] < df["sd_ref"], 1.0 - lo, hi - 1.0)
            df["sd_tol"] = np.maximum(side * df["sd_ref"], df["floor"])
            in_range = (df["sd"] >= lo * df["sd_ref"]) & (df["sd"] <= hi * df["sd_ref"])
            df["sd_ok"] = in_range | (diff_sd <= df["floor"])
    df["ok"] = df["mean_ok"] & df["sd_ok"]
    return z_crit


def scorecard(reference: xr.DataTree | ComparedView, candidates: Mapping | xr.DataTree | ComparedView, *,
              var_names: Sequence[str] | None = None, warn: bool = True) -> pd.DataFrame:
    """One row per (method, compared scalar of the reference) with the columns of ``COLUMNS`` (module
    docstring). ``reference`` and ``candidates`` are DataTrees or ``ComparedView`` objects (a report passes views,
    computed once). ``df.attrs``: ``reference_health`` (``mcmc_health``), ``missing`` ({method: reference
    labels absent from it}), ``z_critical`` ({method: z_crit}, samplers), ``n_compared`` ({method: number of
    reference labels}), ``fixed_in_reference`` (labels the reference holds constant; compared by value).

    A reference that fails the health rule judges nothing: ``warn`` (default) says so in a ``UserWarning``
    naming the failed checks (the table is still made; ``method_scores`` then gives NOT JUDGED, and says why)."""
    ref = _reference_view(reference, candidates)
    cands = _candidate_views(candidates)
    labels = _compared_labels(ref, var_names)
    health = reference_health(ref)
    if warn and not health["reliable"]:
        warnings.warn("scorecard: the reference fails the MCMC health rule (" + "; ".join(health["failures"])
                      + "), so nothing can be judged against it: the numbers are for information only "
                      "(method_scores gives NOT JUDGED)", UserWarning, stacklevel=2)
    frames, missing, z_crits = [], {}, {}
    for method, view in cands.items():
        common = [lab for lab in labels if lab in view.draws]
        missing[method] = [lab for lab in labels if lab not in view.draws]
        df = pd.DataFrame(_rows(method, view, ref, common, health["reliable"]))
        if len(df):
            z_crits[method] = _judge(df, view.kind)
            frames.append(df)
    card = pd.concat(frames, ignore_index=True)[COLUMNS] if frames else pd.DataFrame(columns=COLUMNS)
    sd_ref, mean_ref = ref.stats["sd"], ref.stats["mean"].abs().clip(lower=1.0)
    card.attrs.update({
        "reference_health": health, "missing": missing, "z_critical": z_crits,
        "n_compared": {m: len(labels) for m in cands},
        "fixed_in_reference": [lab for lab in labels if sd_ref[lab] <= FIXED_SD * mean_ref[lab]],
    })
    return card


# ----------------------------------------------------------------------------------------------------- verdicts


def _convergence(view: ComparedView, ref: ComparedView, labels: Sequence[str]) -> dict:
    """A candidate sampler's own mixing on the labels the reference does not hold (nearly) constant:
    ``converged``, ``failures`` (sentences), ``factor`` (how many times longer to run), ``max_rhat`` /
    ``worst_rhat``, ``min_ess`` / ``worst_ess``."""
    live = [lab for lab in labels if lab in view.draws and float(ref.stats.at[lab, "sd"]) > ref.floor(lab)]
    st = view.stats.loc[live] if live else view.stats.iloc[:0]
    rhat = st["rhat"]
    ess = st[["ess_bulk", "ess_tail"]].min(axis=1, skipna=False)
    out = {"max_rhat": float("nan"), "worst_rhat": None, "min_ess": float("nan"), "worst_ess": None,
           "n_live": len(live), "failures": [], "factor": 1.0, "stuck": []}
    if not live:
        out["converged"] = True
        return out
    stuck = [lab for lab in live if not np.isfinite(ess[lab]) or not np.isfinite(rhat[lab])]
    finite = [lab for lab in live if lab not in stuck]
    if finite:
        out["worst_rhat"] = max(finite, key=lambda k: rhat[k])
        out["max_rhat"] = float(rhat[out["worst_rhat"]])
        out["worst_ess"] = min(finite, key=lambda k: ess[k])
        out["min_ess"] = float(ess[out["worst_ess"]])
    bad_r = [lab for lab in finite if not rhat[lab] < CONVERGED_RHAT]
    bad_e = [lab for lab in finite if not ess[lab] >= CONVERGED_ESS]
    if bad_r:
        out["failures"].append(f"R-hat {out['max_rhat']:.3f} on {out['worst_rhat']} (needs < {CONVERGED_RHAT}; "
                               f"{len(bad_r)} of {len(live)} quantities fail)")
    if bad_e:
        which = "bulk" if st.at[out["worst_ess"], "ess_bulk"] <= st.at[out["worst_ess"], "ess_tail"] else "tail"
        out["failures"].append(f"{which} ESS {out['min_ess']:.0f} on {out['worst_ess']} (needs >= {CONVERGED_ESS}; "
                               f"{len(bad_e)} of {len(live)} quantities fail)")
    if stuck:
        out["failures"].append(f"{_names(stuck)} never change(s) within a chain: the sampler is stuck there")
    factors = [1.0]
    if bad_e:
        factors.append(RUN_MARGIN * CONVERGED_ESS / max(out["min_ess"], 1e-9))
    if bad_r:
        factors.append(RUN_MARGIN * (out["max_rhat"] ** 2 - 1) / (CONVERGED_RHAT**2 - 1))
    out["factor"] = float(max(factors))
    out["stuck"] = stuck
    out["converged"] = not out["failures"]
    return out


def _names(labels: Sequence[str], shown: int = SHOWN) -> str:
    labels = list(labels)
    head = ", ".join(labels[:shown])
    return head + (f" and {len(labels) - shown} more" if len(labels) > shown else "")


def _round_factor(f: float) -> float:
    return math.ceil(f * 2) / 2 if f < 10 else float(math.ceil(f))


def _run_longer(conv: dict, view: ComparedView) -> str:
    """What to change, in words: how many times longer, in the method's own options."""
    if conv["stuck"] and len(conv["failures"]) == 1:
        return "running longer will not help a stuck chain: check the initialisation and the kernel"
    f = _round_factor(conv["factor"])
    opts = view.options
    parts = [f"run about {f:g}x longer"]
    if "num_samples" in opts:
        n = int(opts["num_samples"])
        parts.append(f"num_samples {n} -> {math.ceil(n * f)}" + (" per chain" if opts.get("num_chains") else ""))
    text = parts[0] + (f" ({parts[1]})" if len(parts) > 1 else "")
    if np.isfinite(conv["max_rhat"]) and conv["max_rhat"] >= 1.1:
        warm = f" (num_warmup {int(opts['num_warmup'])} -> {math.ceil(int(opts['num_warmup']) * f)})" \
            if "num_warmup" in opts else ""
        text += (f", and lengthen the warm-up likewise{warm}: R-hat {conv['max_rhat']:.2f} means the chains sit in "
                 "different regions, which more draws after a short warm-up may not fix")
    return text


def _worst_first(rows: pd.DataFrame, key: pd.Series) -> pd.DataFrame:
    return rows.loc[key.loc[rows.index].abs().sort_values(ascending=False).index]


def _failure_reasons(sub: pd.DataFrame, kind: str, z_crit: float, n_tests: int) -> list[str]:
    """One sentence per failed rule: the worst quantity, its number, the rule; the others counted."""
    out = []
    bad_mean, bad_sd = sub[~sub["mean_ok"]], sub[~sub["sd_ok"]]
    if kind == "sampler":
        rule = f"|z| <= {z_crit:.2f}, the MCSE z-test at family-wise error {FWER:g} over {n_tests} tests"
        severity = []  # the rule whose worst quantity is further off is named first
        if len(bad_mean):
            rows = _worst_first(bad_mean, bad_mean["z_mean"].fillna(np.inf))
            w = rows.iloc[0]
            if np.isfinite(w.z_mean) and w.sd_ref <= w.floor:
                text = _constant_text(w, "mean")
            elif np.isfinite(w.z_mean):
                text = (f"mean of {w.parameter} is {w["mean"]:.4g} against the reference's {w["mean_ref"]:.4g}: "
                        f"{w.std_mean_error:.2f} reference sd, z = {w.z_mean:.1f} combined Monte Carlo errors "
                        f"(rule: {rule}" + (f"; floor {w.floor:.3g}" if w.floor > 1e-6 else "") + ")")
            else:  # neither run varies: a value the model holds fixed, compared by value
                text = (f"{w.parameter} is held at {w["mean"]:.6g}, the reference holds it at {w["mean_ref"]:.6g} "
                        f"(rule: equal within {w.floor:.3g}; a different model or hyperparameter?)")
            out.append(text + _others(rows, "the mean rule"))
            severity.append(abs(w.z_mean) if np.isfinite(w.z_mean) else np.inf)
        if len(bad_sd):
            rows = _worst_first(bad_sd, bad_sd["z_sd"].fillna(np.inf))
            w = rows.iloc[0]
            out.append((_constant_text(w, "sd") if w.sd_ref <= w.floor else
                        f"sd of {w.parameter} is {w.sd_ratio:.2f}x the reference's ({w.sd:.3g} against "
                        f"{w.sd_ref:.3g}), z = {w.z_sd:.1f} combined Monte Carlo errors of the sd (rule: {rule}"
                        + (f"; floor {w.floor:.3g}" if w.floor > 1e-6 else "") + ")") + _others(rows, "the sd rule"))
            severity.append(abs(w.z_sd) if np.isfinite(w.z_sd) else np.inf)
        return [text for _, text in sorted(zip(severity, out, strict=True), key=lambda p: -p[0])]
    if len(bad_mean):
        rows = bad_mean.sort_values("std_mean_error", ascending=False)
        w = rows.iloc[0]
        out.append((_constant_text(w, "mean") if w.sd_ref <= w.floor else
                    f"mean of {w.parameter} is {w.std_mean_error:.2f} reference sd away from the reference's "
                    f"({w["mean"]:.4g} against {w["mean_ref"]:.4g}; rule: within {MEAN_TOL} reference sd"
                    + (f" or {w.floor:.3g}" if w.floor > 1e-6 else "") + ")") + _others(rows, "the mean rule"))
    narrow = bad_sd[bad_sd["sd"] < bad_sd["sd_ref"]].sort_values("sd_ratio")
    wide = bad_sd[bad_sd["sd"] > bad_sd["sd_ref"]].sort_values("sd_ratio", ascending=False)
    lo, hi = SD_RATIO_RANGE
    if len(narrow):
        w = narrow.iloc[0]
        out.append(f"too narrow: sd of {w.parameter} is {w.sd_ratio:.2f}x the reference's, overconfident (rule: sd "
                   f"ratio {lo}-{hi})" + _others(narrow, "too narrow"))
    if len(wide):
        w = wide.iloc[0]
        out.append(f"too wide: sd of {w.parameter} is {w.sd_ratio:.2f}x the reference's (rule: sd ratio {lo}-{hi})"
                   + _others(wide, "too wide"))
    return out


def _constant_text(w: pd.Series, what: str) -> str:
    """A failed quantity the reference holds (nearly) constant: its difference in its own units, not in
    reference sd (which would be float noise)."""
    ours, theirs = (w["mean"], w["mean_ref"]) if what == "mean" else (w["sd"], w["sd_ref"])
    return (f"{what} of {w.parameter} is {ours:.4g} against the reference's {theirs:.4g}, which holds it nearly "
            f"constant (sd {w['sd_ref']:.2g}): the difference {abs(ours - theirs):.3g} exceeds its floor "
            f"{w['floor']:.3g} (rule: never fail below the floor, else the method's rule)")


def _others(rows: pd.DataFrame, what: str) -> str:
    if len(rows) <= 1:
        return ""
    n = len(rows) - 1
    return (f"; {n} more {'quantity fails' if n == 1 else 'quantities fail'} {what} "
            f"({_names(list(rows['parameter'].iloc[1:]))})")


def _khat(tree: xr.DataTree, kind: str) -> tuple[float, str | None]:
    """(k-hat or NaN, why it was not computed)."""
    if kind != "variational":
        return float("nan"), None
    if "sample_stats" not in tree.children or "log_q" not in tree["sample_stats"]:
        return float("nan"), "k-hat not computed: the tree stores no log q"
    missing = [g for g in ("log_prior", "log_likelihood") if g not in tree.children]
    if missing:
        return float("nan"), (f"k-hat skipped: the tree has log q but no {' or '.join(missing)} group (as "
                              "arviz_base.from_numpyro makes), and k-hat needs log p(theta, y) = log prior + log "
                              "likelihood at q's draws; fit with inference.fit to get them")
    k = metrics.psis_khat(tree)
    return (float("nan"), "k-hat not computed") if k is None else (float(k), None)


def first_clause(reason: str, limit: int = 150) -> str:
    """The first clause of a verdict's reasons (what failed, with its number), cut to ``limit`` characters."""
    depth, end = 0, len(reason)
    for i, ch in enumerate(reason):  # the first "; " outside parentheses ends the first clause
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and reason.startswith("; ", i):
            end = i
            break
    first = reason[:end].split(". What to change")[0]
    return first if len(first) <= limit else first[: limit - 1].rstrip() + "…"


def verdict_lines(methods: Mapping[str, Mapping[str, str]], health: Mapping | None = None, *,
                  where: str = "") -> list[str]:
    """One line per method, ``"<where>/<method>: VERDICT: what failed"`` (the first clause of its reasons; none
    for a PASS), as ``zoo compare`` prints them, then one line on an unhealthy reference (whose failure NOT JUDGED
    verdicts do not repeat; a sampler's own mixing they do). ``methods``: method -> {"verdict", "reasons"}
    (a report's ``summary.json``); ``health``: the reference's health record."""
    prefix = f"{where}/" if where else ""
    lines = []
    for method, v in methods.items():
        reason = str(v.get("reasons") or "")
        if v["verdict"] == NOT_JUDGED:
            reason = reason[reason.index("its own chains"):] if "its own chains" in reason else ""
        why = f": {first_clause(reason, 200)}" if v["verdict"] != PASS and reason else ""
        lines.append(f"{prefix}{method}: {v['verdict']}{why}")
    if health and not health.get("reliable", True):
        lines.append(f"{where + ': ' if where else ''}reference NOT healthy, nothing judged: "
                     f"{'; '.join(health['failures'])}")
    return lines



class MethodScores(pd.DataFrame):
    """What ``method_scores`` returns: its DataFrame (every column and pandas operation as before; derived frames
    are plain DataFrames) whose ``repr`` is the verdict list, one line per method as ``zoo compare`` prints it
    (``verdict_lines``), with the reference's failure on a last line when it is unhealthy; ``to_string()`` and
    ``table`` give the columns."""

    @property
    def _constructor(self):
        return pd.DataFrame

    @property
    def table(self) -> pd.DataFrame:
        """The scores as a plain DataFrame."""
        return pd.DataFrame(self)

    def lines(self) -> list[str]:
        """The verdict lines (``verdict_lines``)."""
        methods = {str(r["method"]): {"verdict": r["verdict"], "reasons": r.get("reasons", "")}
                   for r in self.to_dict("records")}
        return verdict_lines(methods, self.attrs.get("reference_health"))

    def __repr__(self) -> str:
        if not {"method", "verdict"} <= set(self.columns):
            return super().__repr__()
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        import html

        if not {"method", "verdict"} <= set(self.columns):
            return super()._repr_html_()
        return ("<pre>" + html.escape("\n".join(self.lines())) + "</pre><details><summary>scores (" +
                f"{len(self.columns)} columns)</summary>{self.table._repr_html_()}</details>")


def method_scores(reference: xr.DataTree | ComparedView, candidates: Mapping | xr.DataTree | ComparedView, *,
                  card: pd.DataFrame | None = None, var_names: Sequence[str] | None = None,
                  joint: bool = True, seed: int = 0) -> MethodScores:
    """One row per method: how its whole posterior compares with ``reference``, and the verdict (a
    ``MethodScores``: a DataFrame whose ``repr`` is the verdict list).

    Columns: ``method``, ``kind``, ``rule`` ("MCSE", "practical", "point"), ``n_draws``, ``n_compared``,
    ``n_missing``, ``missing``, ``max_std_mean_error`` / ``worst_mean_parameter``, ``min_sd_ratio``,
    ``max_sd_ratio``, ``mean_w1_sd``, ``frac_ok``, ``max_abs_z`` (samplers), ``z_critical``,
    ``detectable_shift`` (samplers: mean shift in reference sd found with 95 % power on the worst quantity),
    ``w1_joint``/``kl_joint``/``mmd``/``joint_dim``, ``khat``/``khat_reading``/``khat_note``,
    ``bound_name``/``bound``, ``max_rhat``/``worst_rhat_parameter``, ``min_ess_bulk``, ``min_ess``
    (bulk or tail, on the quantities the convergence check reads), ``converged``, ``run_longer`` (factor),
    ``compile_seconds``, ``run_seconds``, ``ess_per_second``, ``verdict`` (``VERDICTS``) and ``reasons``.

    ``card``: a ``scorecard`` of the same arguments, if already computed. ``joint=False`` skips the joint
    metrics (W1, KL, MMD), the only part that costs more than a fraction of a second.
    """
    ref = _reference_view(reference, candidates)
    cands = _candidate_views(candidates)
    card = card if card is not None else scorecard(ref, cands, var_names=var_names, warn=False)
    health = card.attrs.get("reference_health") or reference_health(ref)
    labels = _compared_labels(ref, var_names)
    rows = []
    for method, view in cands.items():
        sub = card[card["method"] == method]
        missing = card.attrs.get("missing", {}).get(method, [lab for lab in labels if lab not in view.draws])
        z_crit = card.attrs.get("z_critical", {}).get(method, float("nan"))
        row = {"method": method, "kind": view.kind, "rule": _rule_of(view.kind), "n_draws": view.n_draws,
               "n_compared": len(labels), "n_missing": len(missing), "missing": ", ".join(missing),
               "z_critical": z_crit}
        if len(sub):
            # Summaries in reference-sd units over the quantities with spread: for one the reference holds
            # (nearly) constant, an sd ratio or a z of float noise means nothing (its floor judges it).
            live = sub[sub["sd_ref"] > sub["floor"]]
            live = live if len(live) else sub
            i = live["std_mean_error"].idxmax()
            row["max_std_mean_error"] = float(live.at[i, "std_mean_error"])
            row["worst_mean_parameter"] = live.at[i, "parameter"]
            row["min_sd_ratio"], row["max_sd_ratio"] = float(live["sd_ratio"].min()), float(live["sd_ratio"].max())
            row["mean_w1_sd"] = float(live["w1_sd"].mean())
            row["frac_ok"] = float(sub["ok"].mean())
            row["min_ess_bulk"] = float(live["ess_bulk"].min())
            if view.kind == "sampler":
                row["max_abs_z"] = float(np.nanmax(np.abs(live[["z_mean", "z_sd"]].to_numpy(dtype=float)),
                                                   initial=0.0))
                row["detectable_shift"] = float((z_crit + POWER_Z) * live["mcse_mean_sd"].max())
        if joint and len(sub):
            common = list(sub["parameter"])
            row.update(metrics.joint_metrics(ref.flats(common), view.flats(common), seed=seed))
        row["khat"], row["khat_note"] = _khat(view.tree, view.kind)
        row["khat_reading"] = metrics.khat_reading(row["khat"])
        row["bound_name"], row["bound"] = metrics.final_bound(view.tree)
        conv = _convergence(view, ref, labels) if view.kind == "sampler" else None
        if conv is not None:
            row.update({"max_rhat": conv["max_rhat"], "worst_rhat_parameter": conv["worst_rhat"],
                        "min_ess": conv["min_ess"], "converged": conv["converged"], "run_longer": conv["factor"]})
        row["compile_seconds"] = float(view.tree.attrs.get("compile_seconds", np.nan))
        row["run_seconds"] = float(view.tree.attrs.get("run_seconds", np.nan))
        row["ess_per_second"] = (row.get("min_ess_bulk", np.nan) / row["run_seconds"]
                                 if view.kind == "sampler" and row["run_seconds"] > 0 else float("nan"))
        row["verdict"], row["reasons"] = _verdict(row, sub, health, missing, conv, view, len(labels))
        rows.append(row)
    out = MethodScores(rows)
    out.attrs["reference_health"] = health
    return out


def _verdict(row: dict, sub: pd.DataFrame, health: dict, missing: list[str], conv: dict | None,
             view: ComparedView, n_labels: int) -> tuple[str, str]:
    """The verdict of the module docstring and its reasons, in words a student can read."""
    if not health["reliable"]:
        unhealthy = ("the MCMC reference failed its health check (" + "; ".join(health["failures"]) +
                     "), so nothing is judged against it")
        if conv is not None and not conv["converged"]:  # a sampler's own mixing needs no reference
            return NOT_CONVERGED, ("its own chains have not mixed: " + "; ".join(conv["failures"]) +
                                   ". What to change: " + _run_longer(conv, view) + " (rule: R-hat < 1.01 and bulk "
                                   "and tail ESS >= 400 on every compared quantity); " + unhealthy)
        own = "; its own chains have mixed (R-hat < 1.01, ESS >= 400)" if conv is not None else ""
        return NOT_JUDGED, unhealthy + "; the numbers are shown for information" + own
    notes = []
    if row.get("khat_note"):
        notes.append(row["khat_note"])
    k = row.get("khat", float("nan"))
    if np.isfinite(k) and metrics.KHAT_GOOD < k <= KHAT_MAX:
        notes.append(f"PSIS k-hat {k:.2f} is between 0.5 and 0.7 (usable, not good)")
    div = _divergences(view.tree)
    if div:
        notes.append(f"{div} divergent transitions in its own run")
    fails = []
    if missing:
        fails.append(f"{len(missing)} of {n_labels} compared quantities of the reference are missing from it: "
                     f"{_names(missing, 8)} (rule: every compared quantity of the reference must be compared)")
    if conv is not None and not conv["converged"] and not missing:
        return NOT_CONVERGED, ("its own chains have not mixed: " + "; ".join(conv["failures"]) + ". What to change: "
                               + _run_longer(conv, view) + " (rule: R-hat < 1.01 and bulk and tail ESS >= 400 on "
                               "every compared quantity)")
    if conv is not None and not conv["converged"]:
        notes.append("its own chains have not mixed either: " + "; ".join(conv["failures"]))
    n_tests = int(len(sub) + (sub["sd_tol"].notna().sum() if len(sub) else 0))
    if len(sub):
        fails += _failure_reasons(sub, view.kind, row.get("z_critical", float("nan")), n_tests)
    if view.kind == "variational" and np.isfinite(k) and k > KHAT_MAX:
        fails.append(f"PSIS k-hat {k:.2f} > {KHAT_MAX} (rule: k-hat <= {KHAT_MAX}): the approximation misses mass "
                     "the posterior has")
    if fails:
        return FAIL, "; ".join(fails + notes)
    return PASS, _pass_reason(row, sub, view.kind, n_tests) + ("" if not notes else "; " + "; ".join(notes))


def _divergences(tree: xr.DataTree) -> int:
    if "sample_stats" in tree.children and "diverging" in tree["sample_stats"]:
        return int(np.asarray(tree["sample_stats"]["diverging"].values).sum())
    return 0


def _pass_reason(row: dict, sub: pd.DataFrame, kind: str, n_tests: int) -> str:
    n = len(sub)
    if kind == "sampler":
        return (f"all {n} compared quantities agree within Monte Carlo error: largest |z| {row['max_abs_z']:.1f} "
                f"against {row['z_critical']:.2f} (MCSE z-test, family-wise error {FWER:g} over {n_tests} tests); "
                f"this run detects mean shifts of {row['detectable_shift']:.2f} reference sd or more")
    if kind == "point":
        return (f"a point estimate: all {n} values are within {MEAN_TOL} reference sd of the reference means "
                f"(worst {row['max_std_mean_error']:.2f} on {row['worst_mean_parameter']}; it has no spread to judge)")
    text = (f"all {n} compared quantities within the practical thresholds: worst mean error "
            f"{row['max_std_mean_error']:.2f} reference sd ({row['worst_mean_parameter']}; rule <= {MEAN_TOL}), "
            f"sd ratios {row['min_sd_ratio']:.2f}-{row['max_sd_ratio']:.2f} (rule {SD_RATIO_RANGE[0]}-"
            f"{SD_RATIO_RANGE[1]}, or within the floor)")
    if np.isfinite(row.get("khat", np.nan)):
        text += f", PSIS k-hat {row['khat']:.2f} (rule <= {KHAT_MAX})"
    return text
