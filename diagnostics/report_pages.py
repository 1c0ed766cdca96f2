"""Static HTML reports: one page per model comparing every method with the MCMC reference, and an
index page across models. Plain HTML + CSS and PNG files next to it: no server, no JavaScript, no
network (open the file in any browser).

>>> page = diagnostics.report("hlcr", {"reference (stored NUTS)": ref, "gibbs": t1, "svi": t2}, "out/hlcr")
>>> diagnostics.report_index({"hlcr": page}, "out")
"""

from __future__ import annotations

import datetime
import html
import json
import os
import traceback
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

import zoo
from diagnostics import plots
from diagnostics.ladders import CSV, time_to_rule
from diagnostics.power_scaling import sensitivity
from diagnostics.references import provenance
from diagnostics.scoring import (  # noqa: F401 (the verdicts re-exported)
    FAIL,
    NOT_CONVERGED,
    NOT_JUDGED,
    PASS,
    VERDICTS,
    first_clause,
    method_scores,
    scorecard,
    verdict_lines,
)
from diagnostics.view import carry_user_labels, compared_view, compared_views

PAGE = "report.html"
SUMMARY = "summary.json"
MAX_SCORECARD_ROWS = 60

CSS = """
body { font-family: -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', Arial, sans-serif; margin: 0;
       color: #1d2330; background: #f6f7f9; line-height: 1.45; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 32px 60px; background: #fff; }
h1 { font-size: 1.7em; margin: 0.2em 0 0.1em; } h2 { font-size: 1.25em; margin-top: 1.8em;
     border-bottom: 2px solid #e3e6eb; padding-bottom: 4px; } h3 { font-size: 1.05em; }
p.lead { color: #4a5263; margin-top: 0; } .muted { color: #6b7385; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.86em; margin: 8px 0 4px; }
th, td { padding: 4px 9px; border-bottom: 1px solid #e3e6eb; text-align: right; white-space: nowrap; }
th { background: #eef1f5; position: sticky; top: 0; } td:first-child, th:first-child { text-align: left; }
td.text, th.text { text-align: left; white-space: normal; min-width: 16em; }
tr:nth-child(even) td { background: #fafbfc; }
.scroll { max-height: 560px; overflow: auto; border: 1px solid #e3e6eb; display: inline-block; max-width: 100%; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 10px; font-weight: 600; font-size: 0.85em;
         color: #fff; } .pass { background: #2e7d32; } .warn { background: #b26a00; }
.fail { background: #c62828; } .notjudged { background: #607d8b; } .notconverged { background: #b26a00; }
.legend { border: 1px solid #e3e6eb; background: #fafbfc; padding: 8px 14px; margin: 10px 0 16px; }
.legend dt { margin-top: 6px; } .legend dd { margin: 2px 0 4px 1.5em; color: #333a48; }
.counts span.badge { margin-right: 4px; } .counts { font-size: 1.05em; margin: 8px 0 14px; }
ul.verdicts li { margin: 6px 0; } figure { margin: 12px 0 22px; } figure img { max-width: 100%;
         border: 1px solid #e3e6eb; } figcaption { color: #4a5263; font-size: 0.9em; max-width: 60em; }
.error { color: #c62828; font-family: monospace; white-space: pre-wrap; font-size: 0.85em; }
dl.glossary dt { font-weight: 600; margin-top: 6px; } dl.glossary dd { margin-left: 1.5em; color: #333a48; }
nav a { margin-right: 14px; } table.index { width: 100%; } table.index td { vertical-align: top; }
table.index td.text { min-width: 12em; }
"""

GLOSSARY = [
    ("std_mean_error", "|mean of the method - mean of the reference| / reference sd. 0.1 means the method's "
                       "mean is one tenth of a posterior standard deviation away."),
    ("sd_ratio", "the method's sd / the reference's sd. Below 1: too narrow (overconfident), the usual "
                 "failure of mean-field variational inference. Above 1: too wide."),
    ("w1_sd", "1-D Wasserstein distance between the two sets of draws, in reference sd: how far mass must "
              "move to turn one marginal into the other."),
    ("cover50 / cover90", "share of the reference's draws inside the method's central 50 % / 90 % interval; "
                          "0.50 / 0.90 when the marginals agree, less when the method is too narrow or shifted."),
    ("w1_joint, kl_joint, mmd", "distances between the whole joint posteriors (every quantity at once, each "
                                "scaled by the reference sd): Wasserstein-1, KL(reference || method) by nearest "
                                "neighbours (ArviZ), and maximum mean discrepancy. 0 means identical."),
    ("k-hat (PSIS)", "for methods that know their own density q: the Pareto shape of the importance ratios "
                     "p(theta, y) / q(theta) at the method's draws (Yao et al. 2018). Below 0.5 good, 0.5-0.7 "
                     "usable, above 0.7 the approximation misses mass the true posterior has."),
    ("bound", "the method's objective at convergence (ELBO or its lower bound on log p(y))."),
    ("ESS/s", "for samplers: the smallest bulk effective sample size over the compared quantities, per "
              "second of run time (compile time excluded): how fast the sampler produces information."),
    ("R-hat, ESS, divergences", "MCMC health of the reference: at least 4 chains and 4000 draws, chains agree "
                                "(R-hat < 1.01), enough effective draws (bulk and tail ESS >= 400 on every "
                                "compared quantity), no divergent transitions and E-BFMI > 0.3. A reference "
                                "failing them is not used to judge anything (NOT JUDGED). A candidate sampler "
                                "needs R-hat < 1.01 and ESS >= 400 of its own (else NOT CONVERGED)."),
    ("z (z_mean, z_sd)", "for samplers: the difference of the means (or of the sds) divided by the combined Monte "
                         "Carlo standard error of both runs. An exact sampler gives |z| of a few at most; the "
                         "critical value is Bonferroni-corrected over every test of the method (family-wise "
                         "false-alarm probability 1 %)."),
    ("mcse_mean_sd", "Monte Carlo standard error of the mean difference, in reference sd: "
                     "sqrt(sd_ratio^2 / ESS_method + 1 / ESS_reference)."),
    ("floor", "the smallest difference that can fail: 1 % of the range of a bounded quantity (0.01 for a "
              "probability), so that rare draws of a probability pinned near 0 or 1 cannot fail an exact "
              "sampler; float noise for the rest."),
    ("prior / likelihood sensitivity", "how much each posterior quantity moves when the prior (or the "
                                       "likelihood) is raised to a power near 1 (Kallioinen et al. 2024); "
                                       "above 0.05 it matters. k-hat of the power-scaling weights above 0.7 "
                                       "makes the check unreliable."),
]


_MIXTURE_PCA = {
    "mu_sorted": ("mu_sorted[rank,feature]", "the mean of a component, components ranked by the first coordinate of "
                  "their mean (ranks are the same whatever labels a method gives its components), in the feature's "
                  "units; a feature is named by its column."),
    "C_sorted": ("C_sorted[rank,feature,feature]", "the covariance Lambda Lambda^T + I / tau of a ranked component "
                 "between two features (its upper triangle: each pair once, the variances where both are equal)."),
    "omega_sorted": ("omega_sorted[rank]", "the mixing weight of a ranked component (a probability)."),
    "tau": ("tau", "the noise precision, 1 / noise variance."),
}
_SSGP = {
    "g": ("g[i]", "the population curve beta0 + f(x) at the i-th point of a grid over the first input (positions, "
          "not values: the grid's x is in the plots)."),
    "abs_lam": ("abs_lam[input]", "|lambda| of an input: its relevance (the length-scale's inverse), without the sign "
                "that the likelihood cannot see."),
    "sigma": ("sigma", "the noise (LMM) or latent scale parameter sigma."),
    "gamma": ("gamma", "the LMM's gamma parameter."),
    "tau": ("tau[term]", "the sd of the random effects of one term (intercept or a slope)."),
    "b": ("b[group,term]", "the random effect of one group on one term, tau_t b_raw[group, t]."),
    "beta": ("beta[column]", "the coefficient of a fixed-effect column of A."),
}
QUANTITIES = {
    "mppca": _MIXTURE_PCA,
    "ppca": _MIXTURE_PCA,
    "bpca": {
        "mu": ("mu[feature]", "the mean of a feature."),
        "w_rownorm2": ("w_rownorm2[feature]", "the squared length of a feature's row of the loading matrix W (its "
                       "variance explained by the latent factors; unchanged by rotations of W)."),
        "w_sv": ("w_sv[i]", "the i-th singular value of W, largest first (unchanged by rotations of W)."),
        "tau": ("tau", "the noise precision, 1 / noise variance."),
        "alpha": ("alpha[i]", "the ARD precision of the i-th column of W (large: the column is switched off)."),
    },
    "hlcr": {
        "log_lik": ("log_lik", "log p(y | w, theta) with every event's cluster summed out, at each draw."),
        "psi_sorted": ("psi_sorted[rank]", "the global cluster weights psi, sorted largest first (a probability)."),
        "coclust": ("coclust[i~j]", "the probability that summarised agent-entity pairs i and j sit in the same "
                    "cluster (pairs named by their positions; the same under any relabelling of the clusters)."),
        "pred_mean": ("pred_mean[i]", "the predictive mean of y at the mean features of summarised pair i."),
    },
    "gp_alps": {
        "p_on": ("p_on[latent]", "the probability that latent process j is switched on (its posterior inclusion "
                 "probability)."),
        "n_on": ("n_on", "the expected number of switched-on latent processes."),
        "f": ("f[output,i]", "the posterior mean of an output's function at the i-th of 12 evenly spaced data points."),
        "abs_H": ("abs_H[output,latent]", "|H|: how strongly a latent process drives an output (the sign is not "
                  "identified)."),
        "sigma2": ("sigma2[output]", "the noise variance of an output."),
    },
    "ssgp_lmm": _SSGP, "ssgp_logit": _SSGP, "ssgp_probit": _SSGP,
}


def quantity_glossary(model: str, names: Sequence[str]) -> list[tuple[str, str]]:
    """(term, meaning) for every compared quantity ``names`` of ``model`` (``QUANTITIES``; a variable the model does
    not summarise is its own posterior variable). Positions in brackets are ranks, pairs or grid points; the
    other positions carry the user's labels (``diagnostics.view.with_user_labels``)."""
    known = QUANTITIES.get(model, {})
    return [known.get(n, (n, f"the model's variable {n}, compared as drawn (one entry per position or label in "
                             "brackets).")) for n in names]


def _esc(x) -> str:
    return html.escape(str(x))


def _fmt(v) -> str:
    if isinstance(v, bool | np.bool_):
        return "yes" if v else "no"
    if isinstance(v, int | np.integer):
        return str(int(v))
    if isinstance(v, float | np.floating):
        v = float(v)
        if np.isnan(v):
            return "–"
        if np.isinf(v):
            return "-inf" if v < 0 else "inf"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.2e}"
        if 0.9 <= abs(v) < 1.1:
            return f"{v:.3f}"  # R-hat 1.004 and sd ratio 0.997 must not print as "1"
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def _table(df: pd.DataFrame, *, text_cols: Sequence[str] = (), index: bool = False, scroll: bool = False) -> str:
    if index:
        df = df.reset_index()
    head = "".join(f'<th class="{"text" if c in text_cols else ""}">{_esc(c)}</th>' for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = []
        for c, v in zip(df.columns, row, strict=True):
            if c == "verdict":
                cells.append(f"<td>{_badge(v)}</td>")
            else:
                cells.append(f'<td class="{"text" if c in text_cols else ""}">{_esc(_fmt(v))}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    out = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    return f'<div class="scroll">{out}</div>' if scroll else out


def _badge(verdict: str) -> str:
    cls = str(verdict).lower().replace(" ", "")
    return f'<span class="badge {_esc(cls)}">{_esc(str(verdict).upper())}</span>'


def _pick_reference(trees: Mapping[str, xr.DataTree], reference: str | None) -> str | None:
    if reference is not None:
        if reference not in trees:
            raise ValueError(f"reference: {reference!r} is not one of the trees {list(trees)}")
        return reference
    for key in trees:
        if key.lower().startswith("reference"):
            return key
    for key, tree in trees.items():
        if key == "nuts" or tree.attrs.get("method") == "nuts":
            return key
    return None


def _reference_provenance(tree: xr.DataTree) -> list[str]:
    """The reference's validation record in sentences (``diagnostics.references.provenance``): the sampler that
    made it, its extension, its cross-checks, the samplers tried before it; [] without a record."""
    try:
        record = json.loads(tree.attrs.get("validation", "{}"))
    except (TypeError, ValueError):
        return []
    return provenance(record) if record else []


def _badness(card: pd.DataFrame) -> pd.Series:
    """How much each scorecard row disagrees with the reference, for choosing what to show: rows failing their
    rule first, then mean error plus |log sd ratio|. Rows the reference holds (nearly) constant count only when
    they fail (in reference sd their float noise would look enormous)."""
    live = card["sd_ref"] > card["floor"]
    size = card["std_mean_error"] + np.abs(np.log(card["sd_ratio"].clip(lower=1e-12))).fillna(0.0)
    return size.where(live, 0.0).clip(upper=1e3) + 1e4 * (~card["ok"].astype(bool))


def _figure(out_dir: Path, name: str, caption: str, make) -> str:
    """Run ``make(path)``; an <img> with caption, or the error in red (a broken plot must not hide the
    rest of the report)."""
    path = out_dir / name
    try:
        made = make(path)
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"report: plot {name} failed: {exc!r}", stacklevel=2)
        return (f"<figure><div class='error'>plot {html.escape(name)} failed: "
                f"{html.escape(''.join(traceback.format_exception_only(exc)).strip())}</div></figure>")
    if made is None or not path.is_file():
        return ""
    return (f"<figure><a href='{_esc(name)}'><img src='{_esc(name)}' alt='{_esc(caption)}'></a>"
            f"<figcaption>{caption}</figcaption></figure>")


def _sentence(scores: pd.DataFrame, ref_name: str | None) -> str:
    if ref_name is None or not len(scores):
        return "No MCMC reference was available, so no method is judged; the tables describe each fit on its own."
    words = {PASS: "pass", FAIL: "fail", NOT_CONVERGED: "have not converged (run them longer)",
             NOT_JUDGED: "cannot be judged (the reference is unhealthy)"}
    parts = []
    for v in VERDICTS:
        methods = list(scores.loc[scores["verdict"] == v, "method"])
        if methods:
            parts.append(f"{len(methods)} {words[v]} ({_esc(', '.join(methods))})")
    return (f"Of {len(scores)} method(s) compared with the reference <b>{_esc(ref_name)}</b>, "
            + "; ".join(parts) + ".")


VERDICT_LEGEND = [
    (PASS, "every compared quantity of the reference was compared and agrees with it under the method's rule."),
    (FAIL, "the posterior disagrees with the reference (or lacks some of its quantities); the reason names the "
           "quantity, the number and the rule."),
    (NOT_CONVERGED, "a sampler whose own chains have not mixed (R-hat >= 1.01 or ESS < 400 on some quantity): its "
                    "numbers are not yet worth comparing; the reason says how much longer to run."),
    (NOT_JUDGED, "the MCMC reference itself failed its health check (>= 4 chains, >= 4000 draws, R-hat < 1.01, "
                 "bulk and tail ESS >= 400 on every compared quantity, no divergences, E-BFMI > 0.3), so nothing is "
                 "judged against it."),
]

RULES_TEXT = (
    "<p>Two kinds of rule. <b>Samplers</b> (NUTS, Gibbs) are exact in the limit, so they are judged by Monte "
    "Carlo error: for every quantity, the difference of the means and of the sds is divided by the combined Monte "
    "Carlo standard error of both runs (z), and fails when |z| exceeds a Bonferroni-corrected critical value "
    "(family-wise false-alarm probability 1 % over all of the method's tests, about 3.6-4.1). <b>Approximations"
    "</b> (variational methods, point estimates) are judged on practical thresholds: mean within 0.2 reference "
    "sd, sd between 0.8 and 1.25 times the reference's, and PSIS k-hat at most 0.7 when the method knows its "
    "own density (point estimates: the mean only). Every tolerance is at least a floor: 0.01 for probabilities "
    "and other bounded quantities (1 % of their range), so rare draws of a probability pinned near 0 or 1 cannot "
    "fail an exact sampler.</p>")


def _legend() -> str:
    items = "".join(f"<dt>{_badge(v)}</dt><dd>{_esc(text)}</dd>" for v, text in VERDICT_LEGEND)
    return f"<dl class='legend'>{items}</dl>"


def _recorded_hyper(tree) -> dict | None:
    """The hyperparameters a tree was fitted with (``inference.trees.problem_of``: its record over the model's
    defaults), as JSON values; None when the tree records no model (a hand-made tree)."""
    from inference.trees import problem_of

    try:
        _, _, hyper = problem_of(getattr(tree, "tree", tree))    # a compared view holds its tree
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return json.loads(json.dumps(hyper, default=repr))


def _hyper_text(value) -> str:
    return "None" if value is None else repr(value)


def hyperparameter_table(spec: zoo.ModelSpec, trees: Mapping[str, xr.DataTree]) -> tuple[str, dict]:
    """(HTML, summary) of the hyperparameters (the prior) each fit used, read from the trees: one row per
    hyperparameter with its value, whether it is the model's default (``zoo show MODEL``) and its meaning (which
    states how a default of None is derived from the data). When the fits disagree, a column per fit and a
    warning naming the hyperparameters that differ: such fits approximate different posteriors. The summary:
    ``{"values": {name: value}, "differ": [names], "fits": {label: {name: value}}}`` (values of the first fit
    that records them)."""
    recorded = {label: _recorded_hyper(tree) for label, tree in trees.items()}
    known = {label: h for label, h in recorded.items() if h is not None}
    if not known:
        return "<p class='muted'>None of the fits records its hyperparameters.</p>", {}
    names = list(spec.hyperparameters) + sorted({k for h in known.values() for k in h} - set(spec.hyperparameters))
    default = json.loads(json.dumps(spec.default_hyper, default=repr))
    differ = [k for k in names if len({json.dumps(h.get(k), sort_keys=True) for h in known.values()}) > 1]
    first = next(iter(known.values()))
    rows = []
    for k in names:
        doc = spec.hyperparameters[k].doc if k in spec.hyperparameters else ""
        row = {"hyperparameter": k}
        if differ:
            row.update({label: _hyper_text(h.get(k)) for label, h in known.items()})
            row["model default"] = _hyper_text(default.get(k))
        else:
            row["value"] = _hyper_text(first.get(k))
            row["default"] = ("yes" if first.get(k) == default.get(k) else
                              f"no (default {_hyper_text(default.get(k))})")
        row["meaning"] = doc
        rows.append(row)
    unrecorded = [label for label, h in recorded.items() if h is None]
    words = ("<p>The hyperparameters, and so the prior, every fit on this page used (from each tree's record; "
             "<code>zoo show " + _esc(spec.name) + "</code> lists the defaults, a default of None is derived "
             "from the data as its meaning says).</p>")
    if differ:
        words += ("<p class='error'>The fits do NOT share their hyperparameters: " + _esc(", ".join(differ))
                  + " differ, so they approximate different posteriors and their comparison measures that "
                  "difference too.</p>")
    if unrecorded:
        words += f"<p class='muted'>Not recorded by: {_esc(', '.join(unrecorded))}.</p>"
    table = _table(pd.DataFrame(rows), text_cols=("meaning",))
    return words + table, {"values": first, "differ": differ, "fits": known}


def report(model: str | zoo.ModelSpec, trees: Mapping[str, xr.DataTree], out_dir: str | os.PathLike, *,
           reference: str | None = None, sbc_results: Sequence = (), var_names: Sequence[str] | None = None,
           sensitivity_of: str | None = None, data_note: str | None = None, index_link: str | None = None,
           ladder: pd.DataFrame | None = None) -> Path:
    """Write ``out_dir/report.html`` (+ PNGs, ``scorecard.csv``, ``methods.csv``, ``summary.json``)
    comparing every tree with the reference, and return the page's path.

    Parameters
    ----------
    model:
        the model's name (or ModelSpec).
    trees:
        method label -> DataTree from ``inference.fit`` (or a stored reference).
    out_dir:
        directory for the page and its files (created).
    reference:
        which key of ``trees`` is the MCMC reference. Default: the first key starting with
        "reference" (``zoo compare`` names the stored one "reference (stored NUTS)"), else the
        NUTS tree; with neither, nothing is judged.
    sbc_results:
        ``diagnostics.sbc``/``vsbc`` results to include (ECDF plots and tables).
    var_names:
        restrict the comparison to these posterior variables.
    sensitivity_of:
        the key whose fit gets the power-scaling check (default: the reference).
    data_note:
        a line on the data the trees were fitted on, shown under the title (e.g. a real dataset).
    index_link:
        the index page, relative to ``out_dir`` (``zoo compare`` and ``zoo demo``: ``../index.html``).
        None (default): the page links no index. Given, the page links it and (re)writes it
        (``report_index``) over every model page in its folder, so the link always resolves: after
        ``zoo compare`` of one model too, whose pages the index then lists.
    ladder:
        a ``diagnostics.cost_accuracy`` frame of the same model and data: adds the section "Accuracy
        against compute" (``cost_accuracy_section``) and writes it to ``cost_accuracy.csv``.
    """
    spec = zoo.get(model)
    if not trees:
        raise ValueError("trees: expected at least one fitted tree")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ref_name = _pick_reference(trees, reference)
    sens_key = sensitivity_of or ref_name or next(iter(trees))
    if sens_key not in trees:
        raise ValueError(f"sensitivity_of: {sens_key!r} is not one of the trees {list(trees)}")
    if ref_name is not None:   # a reference made on the bare arrays takes the names of the candidates' table
        trees = {**trees, ref_name: carry_user_labels(trees[ref_name], [t for k, t in trees.items() if k != ref_name])}
    # Every tree's compared view (summaries, draws, ESS, R-hat, MCSE, health) once, for every section below.
    ordered = compared_views(({ref_name: trees[ref_name]} if ref_name else {})
                             | {k: v for k, v in trees.items() if k != ref_name})
    candidates = {k: v for k, v in ordered.items() if k != ref_name}

    sections, summary = [], {"model": spec.name, "reference": ref_name, "methods": {}, "data_note": data_note}
    card = scores = None
    if ref_name is not None and candidates:
        card = scorecard(ordered[ref_name], candidates, var_names=var_names, warn=False)  # said on the page
        scores = method_scores(ordered[ref_name], candidates, card=card, var_names=var_names)
        card.to_csv(out_dir / "scorecard.csv", index=False)
        scores.to_csv(out_dir / "methods.csv", index=False)
        summary["methods"] = {r.method: {"verdict": r.verdict, "kind": r.kind, "reasons": r.reasons}
                              for r in scores.itertuples()}

    # --- verdict in words
    items = []
    if scores is not None:
        for r in scores.itertuples():
            reason = r.reasons
            if r.verdict == NOT_JUDGED:  # the same for every method: said once, under "The MCMC reference"
                own = reason[reason.index("its own chains"):] if "its own chains" in reason else ""
                reason = "the reference is not healthy (see below)" + (f"; {own}" if own else "")
            items.append(f"<li>{_badge(r.verdict)} <b>{_esc(r.method)}</b> ({_esc(r.kind)}, "
                         f"{'MCSE rule' if r.rule == 'MCSE' else 'practical rule'}): {_esc(reason)}.</li>")
    sentence = _sentence(scores if scores is not None else pd.DataFrame(), ref_name)
    sections.append(("verdict", "Verdicts", f"<p>{sentence}</p>"
                     + (f"<ul class='verdicts'>{''.join(items)}</ul>" if items else "")
                     + _legend() + RULES_TEXT))

    # --- the reference
    if ref_name is not None:
        health = ordered[ref_name].health
        summary["reference_health"] = health
        hdf = pd.DataFrame([{"reference": ref_name, "draws": health["n_draws"], "chains": health["n_chains"],
                             "max R-hat": health["max_rhat"], "min bulk ESS": health["min_ess_bulk"],
                             "min tail ESS": health["min_ess_tail"], "divergences": health["divergences"],
                             "min E-BFMI": health["min_ebfmi"], "healthy": health["reliable"]}])
        if health["reliable"]:
            words = ("<p>The reference is healthy: at least 4 chains and 4000 draws, its chains agree, every compared "
                     "quantity has enough effective draws, no divergences, so it stands in for the true "
                     "posterior.</p>")
        else:
            words = ("<p>The reference is <b>NOT healthy</b>, so nothing is judged against it (NOT JUDGED; a sampler "
                     "whose own chains have not mixed is still NOT CONVERGED): the scores below are "
                     "shown for information only. What failed:</p><ul>"
                     + "".join(f"<li>{_esc(f)}</li>" for f in health["failures"]) + "</ul>")
            if health.get("advice"):
                words += ("<p>What to try:</p><ul class='advice'>"
                          + "".join(f"<li>{_esc(a)}</li>" for a in health["advice"]) + "</ul>")
        made = _reference_provenance(ordered[ref_name].tree)
        if made:
            summary["reference_provenance"] = made
            words += "<p>How it was made:</p><ul>" + "".join(f"<li>{_esc(m)}</li>" for m in made) + "</ul>"
        sections.append(("reference", "The MCMC reference", words + _table(hdf)))

    # --- the hyperparameters (the prior) of every fit
    hyper_html, summary["hyperparameters"] = hyperparameter_table(spec, trees)
    sections.append(("hyperparameters", "Hyperparameters and prior", hyper_html))

    # --- per-method table
    if scores is not None:
        accuracy = ["method", "kind", "verdict", "n_missing", "max_std_mean_error", "min_sd_ratio", "max_sd_ratio",
                    "max_abs_z", "z_critical", "detectable_shift", "mean_w1_sd", "w1_joint", "kl_joint", "mmd", "khat",
                    "khat_reading"]
        cost = ["method", "bound_name", "bound", "max_rhat", "min_ess", "run_longer", "ess_per_second",
                "compile_seconds", "run_seconds", "n_draws"]
        names = {
            "max_std_mean_error": "max std mean err", "min_sd_ratio": "min sd ratio", "max_sd_ratio": "max sd ratio",
            "mean_w1_sd": "mean W1 (sd)", "w1_joint": "W1 joint", "kl_joint": "KL joint", "khat": "k-hat",
            "khat_reading": "k-hat reads", "bound_name": "objective", "bound": "at convergence",
            "n_missing": "missing", "max_abs_z": "max |z|", "z_critical": "z crit",
            "detectable_shift": "detects shifts (sd)", "run_longer": "run longer (x)",
            "max_rhat": "own R-hat", "min_ess": "own min ESS", "ess_per_second": "ESS/s",
            "compile_seconds": "compile s", "run_seconds": "run s", "n_draws": "draws"}

        def pick(cols):
            return scores[[c for c in cols if c in scores.columns]].rename(columns=names)

        sections.append(("methods", "Per-method scores",
                         "<p>Accuracy: each method's worst quantities, distances between the whole posteriors "
                         "(in reference sd) and the PSIS k-hat of an approximation.</p>" + _table(pick(accuracy))
                         + "<p>Convergence and cost: the objective at convergence, the sampler's own R-hat and "
                           "effective draws, and seconds (compilation apart).</p>" + _table(pick(cost))))
        rows = card
        note = ""
        if len(card) > MAX_SCORECARD_ROWS:
            rows = card.loc[_badness(card).sort_values(ascending=False).index].head(MAX_SCORECARD_ROWS)
            note = (f"<p class='muted'>Showing {MAX_SCORECARD_ROWS} of {len(card)} rows: those that fail their rule, "
                    "then the largest disagreements with the reference; all rows are in "
                    "<a href='scorecard.csv'>scorecard.csv</a>.</p>")
        keep = ["method", "parameter", "mean_ref", "mean", "sd_ref", "sd", "std_mean_error", "sd_ratio", "w1_sd",
                "cover50", "cover90", "ess_bulk", "rhat", "z_mean", "z_sd", "rule", "ok"]
        sections.append(("scorecard", "Per-quantity scorecard",
                         "<p>One row per (method, scalar quantity). Mixtures are compared on label-invariant "
                         "summaries. <i>z_mean</i>, <i>z_sd</i>: differences in combined Monte Carlo errors (the MCSE "
                         "rule of samplers); <i>ok</i> says whether the row meets its method's rule.</p>" + note
                         + _table(rows[keep], scroll=True)))

    # --- plots (large models: the quantities where the methods disagree most with the reference)
    labels, which = None, ""
    if card is not None and card["parameter"].nunique() > plots.MAX_PANELS:
        badness = _badness(card).groupby(card["parameter"]).max()
        labels = list(badness.sort_values(ascending=False).index[:plots.MAX_PANELS])
        which = (f" Shown: the {plots.MAX_PANELS} of {card['parameter'].nunique()} quantities where some method "
                 "disagrees most with the reference.")
    figs = []
    figs.append(_figure(out_dir, "marginals.png",
                        "Marginal posterior densities, every method over the reference (black). Curves that are "
                        "narrower than the reference mean an overconfident method; shifted curves, a biased one."
                        + which, lambda p: plots.plot_marginals(ordered, p, var_names=var_names, labels=labels)))
    if len(ordered) > 1:
        figs.append(_figure(out_dir, "forest.png",
                            "Central 50 % (thick) and 89 % (thin) intervals with medians, in units of the reference "
                            "sd around the reference mean: rows at 0 with the reference's width agree with it."
                            + which, lambda p: plots.plot_forest(ordered, p, var_names=var_names, labels=labels)))
    figs.append(_figure(out_dir, "traces.png",
                        "Objective (ELBO or bound) per iteration for the methods that record one: it should rise "
                        "and flatten; a curve still climbing at the end means the method stopped too early.",
                        lambda p: plots.plot_traces(ordered, p)))
    sections.append(("plots", "Plots", "".join(figs)))

    # --- accuracy against compute
    if ladder is not None and len(ladder):
        body, summary["cost_accuracy"] = cost_accuracy_section(ladder, out_dir)
        sections.append(("cost", "Accuracy against compute", body))

    # --- sensitivity
    body, sens_summary, _ = sensitivity_section(ordered[sens_key], sens_key, out_dir, var_names=var_names)
    if sens_summary is not None:
        summary["sensitivity"] = sens_summary
    sections.append(("sensitivity", "Prior sensitivity", body))

    # --- SBC
    if sbc_results:
        parts = []
        for i, res in enumerate(sbc_results):
            what = "SBC" if res.kind == "sbc" else "VSBC"
            parts.append(f"<h3>{what}: {_esc(res.method)}</h3><p>{_esc(res.summary())}.</p>")
            parts.append(_table(res.table[["parameter", "n_sims", "p_value", "pit_mean", "pit_sd", "flagged",
                                           "reading"]], text_cols=("reading",)))
            parts.append(_figure(out_dir, f"sbc_{i}_{res.kind}_{res.method}.png",
                                 f"{what} ECDF difference for {_esc(res.method)}: inside the expected wiggle means "
                                 "calibrated; a hump means the truth sits on one side of the posterior; an S shape "
                                 "means the posterior is too wide or too narrow.", res.plot))
            summary.setdefault("sbc", []).append({"kind": res.kind, "method": res.method, "passed": res.passed})
        sections.append(("sbc", "Simulation-based calibration", "".join(parts)))

    compared = list(dict.fromkeys(k for v in ordered.values() for k in v.ds.data_vars))
    terms = quantity_glossary(spec.name, compared)
    glossary = ("<p>The compared quantities (each label names one entry: <i>mu_sorted[0,Hwt]</i> is rank 0, "
                "column Hwt):</p><dl class='glossary quantities'>"
                + "".join(f"<dt>{_esc(t)}</dt><dd>{_esc(d)}</dd>" for t, d in terms) + "</dl><p>The scores:</p>"
                + "<dl class='glossary'>" + "".join(f"<dt>{_esc(t)}</dt><dd>{_esc(d)}</dd>" for t, d in GLOSSARY)
                + "</dl>")
    summary["glossary"] = dict(terms)
    sections.append(("glossary", "What the numbers mean", glossary))

    versions = {}
    for tree in trees.values():
        try:
            versions = json.loads(tree.attrs.get("package_versions", "{}"))
            break
        except (TypeError, ValueError):
            pass
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    nav = " ".join(f"<a href='#{sid}'>{_esc(title)}</a>" for sid, title, _ in sections)
    head = (f"<h1>{_esc(spec.name)}</h1><p class='lead'>{_esc(spec.description or spec.paper)}</p>"
            + (f"<p><b>Data:</b> {_esc(data_note)}</p>" if data_note else "")
            + (f"<p class='muted'>Paper: {_esc(spec.paper)}</p>" if spec.paper and spec.description else "")
            + f"<p class='muted'>Methods: {_esc(', '.join(ordered))}. Generated {stamp}. "
            + _esc(", ".join(f"{k} {v}" for k, v in versions.items() if k in ("numpyro", "jax", "arviz")))
            + "</p>"
            + (f"<p class='muted'><a href='{_esc(index_link)}'>&larr; all models</a></p>" if index_link else "")
            + f"<nav>{nav}</nav>")
    body = "".join(f"<section id='{sid}'><h2>{_esc(title)}</h2>{content}</section>" for sid, title, content in sections)
    page = out_dir / PAGE
    _write(page, _html(f"bayes-zoo: {spec.name}", head + body))
    _write(out_dir / SUMMARY, json.dumps(summary, indent=1, default=_json_default))
    if index_link:
        index = Path(os.path.normpath(out_dir / index_link))
        if index.name == "index.html":
            report_index(pages_under(index.parent), index.parent)
    return page


def cost_accuracy_section(frame: pd.DataFrame, out_dir: Path) -> tuple[str, list[dict]]:
    """(HTML, summary) of a ``diagnostics.cost_accuracy`` frame: what the ladders were, the plot
    (``plots.plot_cost_accuracy``) and the table "time to reach the rule" (``time_to_rule``: per method, the first
    budget and the seconds at which it meets its rule, or "not within the ladder" with the error it plateaus at);
    the frame is written to ``out_dir/cost_accuracy.csv``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out_dir / CSV, index=False)
    rule = time_to_rule(frame)
    ladders = []
    for method, g in frame.groupby("method", sort=False):
        budgets = ", ".join(str(int(b)) for b in sorted(g["budget"].unique()))
        ladders.append(f"<b>{_esc(method)}</b>: {_esc(budgets)} {_esc(g['budget_unit'].iloc[0])} "
                       f"({g['seed'].nunique()} seed{'s' if g['seed'].nunique() > 1 else ''} each)")
    table = pd.DataFrame({
        "method": rule["method"], "kind": rule["kind"],
        "meets its rule at": [f"{int(r.budget)} {r.budget_unit}" if r.reached else "not within the ladder"
                              for r in rule.itertuples()],
        "run s": rule["run_seconds"], "compile s": rule["compile_seconds"],
        "error at the largest budget (ref sd)": rule["plateau_error"],
        "at the largest budget": [f"{v}: {w}" if w else v for v, w in zip(rule["verdicts_at_largest"],
                                                                           rule["why_at_largest"], strict=True)]})
    body = ("<p>Every method run again on a ladder of budgets, in its own unit, from too short to beyond its "
            "setting above; methods with a stopping rule run with it off, so the budget is the budget. Each fit "
            "is scored against the reference as above. " + "; ".join(ladders) + ".</p>"
            + _figure(out_dir, "cost_accuracy.png",
                      "Worst mean error against run seconds (log-log), one line per method (dots: seeds). Below the "
                      "red line (0.2 reference sd) the means are practically right; an exact sampler keeps falling, "
                      "as 1/sqrt(draws), along its dashed Monte Carlo error; an approximation flattens where its "
                      "bias is, however long it runs. The star marks the first budget meeting the method's rule; "
                      "a method below the red line can still fail it on its spread (the table says why).",
                      lambda p: plots.plot_cost_accuracy(frame, p))
            + "<h3>Time to reach the rule</h3><p>The first budget at which every seed meets the method's rule "
              "(PASS), with its run seconds (compile time apart); a method that never does, within its ladder, "
              "shows the error it stays at: a variational method's bias is the answer, not a failure.</p>"
            + _table(table, text_cols=("at the largest budget",), scroll=True)
            + f"<p class='muted'>Every fit: <a href='{CSV}'>{CSV}</a>.</p>")
    return body, rule.to_dict("records")


def pages_under(root: str | os.PathLike) -> dict[str, Path]:
    """Every model page below ``root`` with its summary (``<model>/report.html`` and a section's
    ``<model>/<section>/report.html``), named as ``zoo demo``'s index names them ("hlcr", "hlcr / real data:
    dietox"), models in name order, each followed by its sections."""
    root = Path(root)
    pages = {}
    for page in sorted(root.glob(f"*/{PAGE}")) + sorted(root.glob(f"*/*/{PAGE}")):
        if not (page.parent / SUMMARY).is_file():
            continue
        model, section = (page.parent.name, None) if page.parent.parent == root else \
            (page.parent.parent.name, page.parent.name)
        name = model if section is None else \
            f"{model} / real data: {section.removeprefix('real_')}" if section.startswith("real_") else \
            f"{model} / {section}"
        pages[name] = page
    return dict(sorted(pages.items(), key=lambda item: item[0].split(" / ")[0]))


def sensitivity_section(tree, label: str, out_dir: Path, *, var_names: Sequence[str] | None = None,
                        prior_sites: Sequence[str] | None = None) -> tuple[str, dict | None, pd.DataFrame | None]:
    """(HTML, summary, table) of the power-scaling check of one fit (``diagnostics.sensitivity``): a sentence, the table
    (prior and likelihood sensitivity, Pareto k-hat of the power-scaling weights, the flag in words) and
    ``sensitivity.png``; ``prior_sites`` scales only those priors. Summary and table are None when the check
    failed (the HTML then says why)."""
    try:
        sens = sensitivity(tree, var_names=var_names, prior_sites=prior_sites)
    except Exception as exc:  # noqa: BLE001
        return f"<div class='error'>sensitivity check failed: {html.escape(repr(exc))}</div>", None, None
    flagged = sens[sens["diagnosis"] != "✓"]
    summary = {"of": label, "flagged": [str(i) for i in flagged.index], "khat_prior": sens.attrs["khat_prior"],
               "khat_likelihood": sens.attrs["khat_likelihood"], "prior_sites": sens.attrs["prior_sites"],
               "reliable": bool(sens["reliable"].all())}
    shown = sens if len(sens) <= MAX_SCORECARD_ROWS else pd.concat([flagged, sens[sens["diagnosis"] == "✓"]]).head(
        MAX_SCORECARD_ROWS)
    words = ("No quantity is sensitive to the prior: the data, not the prior, decide the posterior."
             if not len(flagged) else
             f"{len(flagged)} of {len(sens)} quantities are sensitive to the prior (see the flag column).")
    if not sens["reliable"].all():
        words += (f" The check itself is unreliable here: the power-scaling weights have Pareto k-hat "
                  f"{max(sens.attrs['khat_prior'], sens.attrs['khat_likelihood']):.2f} > 0.7.")
    scaled = ("every prior site" if prior_sites is None else
              "only the prior site(s) " + ", ".join(f"<b>{_esc(p)}</b>" for p in sens.attrs["prior_sites"]))
    table = shown[["prior", "likelihood", "khat_prior", "khat_likelihood", "flag"]].rename_axis("quantity")
    body = (f"<p>Power-scaling of the fit <b>{_esc(label)}</b> (Kallioinen et al. 2024), scaling {scaled}. "
            f"{words}</p>" + _table(table, index=True, text_cols=("flag",), scroll=True)
            + _figure(out_dir, "sensitivity.png",
                      "Posterior marginals with the prior (left) or likelihood (right) raised to the power 0.8 "
                      "and 1.25: curves that move with the prior mean prior-sensitive quantities.",
                      lambda p: plots.plot_sensitivity(tree, p, var_names=var_names, prior_sites=prior_sites)))
    return body, summary, sens


SENSITIVITY_PAGE = "sensitivity.html"


def sensitivity_page(tree, out_dir: str | os.PathLike, *, label: str | None = None,
                     var_names: Sequence[str] | None = None, prior_sites: Sequence[str] | None = None) -> Path:
    """Write ``out_dir/sensitivity.html`` (+ ``sensitivity.png``, ``sensitivity.csv``, ``sensitivity.json``): the
    power-scaling check of one fit on its own, as ``zoo sensitivity`` shows it; returns the page's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    view = compared_view(tree)
    spec = view.spec
    label = label or view.name
    body, summary, table = sensitivity_section(view, label, out_dir, var_names=var_names, prior_sites=prior_sites)
    hyper_html, hyper = hyperparameter_table(spec, {label: view.tree}) if spec is not None else ("", {})
    if table is not None:
        table.to_csv(out_dir / "sensitivity.csv", index_label="quantity")
    name = spec.name if spec is not None else str(view.tree.attrs.get("model", "model"))
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = (f"<h1>{_esc(name)}: prior sensitivity</h1>"
            + (f"<p class='lead'>{_esc(spec.description or spec.paper)}</p>" if spec is not None else "")
            + f"<p class='muted'>Fit: {_esc(label)}. Generated {stamp}. The prior it measures: "
            "<a href='#hyperparameters'>hyperparameters</a>.</p>")
    reading = ("<p>Each prior (or the likelihood) is raised to a power near 1 and the draws are re-weighted by "
               "importance sampling, nothing refitted; <i>prior</i> and <i>likelihood</i> are how fast each "
               "quantity's distribution moves (cumulative Jensen-Shannon distance per log2 of the power). Both "
               f">= {0.05}: prior-data conflict; prior only: a strong prior or weak likelihood. The Pareto k-hat "
               "of the importance weights says whether the re-weighting can be trusted (<= 0.7).</p>")
    page = out_dir / SENSITIVITY_PAGE
    _write(page, _html(f"bayes-zoo: {name} prior sensitivity",
                       head + f"<section id='sensitivity'><h2>Prior sensitivity</h2>{reading}{body}</section>"
                       + f"<section id='hyperparameters'><h2>Hyperparameters and prior</h2>{hyper_html}</section>"
                       + "<section id='glossary'><h2>The quantities</h2><dl class='glossary quantities'>"
                       + "".join(f"<dt>{_esc(t)}</dt><dd>{_esc(d)}</dd>"
                                 for t, d in quantity_glossary(name, list(view.ds.data_vars))) + "</dl></section>"))
    _write(out_dir / "sensitivity.json", json.dumps({**(summary or {"failed": True}), "hyperparameters": hyper},
                                                    indent=1, default=_json_default))
    return page


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    return str(o)


def _html(title: str, body: str) -> str:
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{_esc(title)}</title><style>{CSS}</style></head><body><main>{body}</main></body></html>\n")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")   # per process: the demo's workers write one index
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def report_index(pages: Mapping[str, str | os.PathLike], out_dir: str | os.PathLike, *, note: str | None = None
                 ) -> Path:
    """Write ``out_dir/index.html``: the count of each verdict over every (model, method) pair, what the four
    verdicts mean, and one row per model (``pages``: model -> its report page) with the verdict of every method
    and, for each that is not PASS, what is wrong in a few words; linking to the pages; ``note``: a paragraph under
    the counts (the demo: which models' pages show accuracy against compute). Returns the index path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, counts = [], dict.fromkeys(VERDICTS, 0)
    for name, page in pages.items():
        page = Path(page)
        summary = {}
        if (page.parent / SUMMARY).is_file():
            summary = json.loads((page.parent / SUMMARY).read_text())
        try:
            link = page.resolve().relative_to(out_dir.resolve()).as_posix()
        except ValueError:
            link = page.resolve().as_uri()
        try:
            spec = zoo.get(name.split(" ")[0])   # "hlcr / real data: dietox" rows name their model first
            desc = spec.paper or spec.description if name == spec.name else summary.get("data_note", "")
        except ValueError:
            desc = ""
        verdicts = summary.get("methods", {})
        health = summary.get("reference_health") or {}
        cells = []
        for m, v in verdicts.items():
            verdict = str(v["verdict"]).upper()
            counts[verdict] = counts.get(verdict, 0) + 1
            reason = v.get("reasons", "")
            if verdict == NOT_JUDGED:  # the reference's failure is said once per model; a sampler's own mixing here
                reason = reason[reason.index("its own chains"):] if "its own chains" in reason else ""
            why = "" if verdict == PASS or not reason else f"<div class='muted'>{_esc(first_clause(reason))}</div>"
            cells.append(f"<div>{_badge(verdict)}&nbsp;<b>{_esc(m)}</b>{why}</div>")
        badges = "".join(cells) or "<span class='muted'>no reference: nothing judged</span>"
        if health and not health.get("reliable", True):
            ref_text = "NOT healthy: " + "; ".join(health.get("failures", []))
        elif health:
            ref_text = (f"healthy ({health.get('n_chains')} chains, {health.get('n_draws')} draws, max R-hat "
                        f"{_fmt(health.get('max_rhat'))}, min ESS {_fmt(health.get('min_ess_bulk'))})")
        else:
            ref_text = "none"
        sens = summary.get("sensitivity", {})
        sens_text = ("prior-sensitive: " + ", ".join(sens["flagged"][:6]) + ("…" if len(sens["flagged"]) > 6 else "")
                     if sens.get("flagged") else ("none flagged" if sens else "–"))
        rows.append(f"<tr><td class='text'><a href='{_esc(link)}'><b>{_esc(name)}</b></a>"
                    f"<div class='muted'>{_esc(desc)}</div></td><td class='text'>{badges}</td>"
                    f"<td class='text'>{_esc(ref_text)}</td><td class='text'>{_esc(sens_text)}</td></tr>")
    table = ("<table class='index'><thead><tr><th class='text'>model</th>"
             "<th class='text'>methods against the MCMC reference</th><th class='text'>the reference</th>"
             "<th class='text'>prior sensitivity</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    total = sum(counts.values())
    tally = ("<p class='counts'>" + f"{total} (model, method) pairs: "
             + " ".join(f"{_badge(v)}&nbsp;{counts.get(v, 0)}&nbsp;&nbsp;" for v in VERDICTS) + "</p>")
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = ("<h1>bayes-zoo: every model, every method, against MCMC</h1>"
            "<p class='lead'>Each model's page compares its hand-written kernels and variational methods with a "
            "healthy NUTS reference, quantity by quantity, and says in words what is wrong.</p>"
            f"<p class='muted'>Generated {stamp}. {len(pages)} model(s).</p>" + tally
            + (f"<p>{_esc(note)}</p>" if note else "") + _legend()
            + RULES_TEXT + table)
    path = out_dir / "index.html"
    _write(path, _html("bayes-zoo report", body))
    return path
