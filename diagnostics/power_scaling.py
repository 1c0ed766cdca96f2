"""Prior and likelihood sensitivity by power-scaling (Kallioinen, Paananen, Buerkner & Vehtari 2024,
"Detecting and diagnosing prior and likelihood sensitivity with power-scaling", Stat Comput 34:57).

The prior (or likelihood) is raised to a power alpha near 1; the existing draws are re-weighted by
importance sampling, w_s proportional to p(theta_s)^(alpha - 1), Pareto-smoothed, so nothing is refitted; the
change of each marginal is measured by the cumulative Jensen-Shannon distance and reported as its
derivative in log2(alpha). ArviZ's ``psense_summary`` does this and reads the pair:

* prior >= 0.05 and likelihood >= 0.05: "potential prior-data conflict";
* prior > 0.05 > likelihood: "potential strong prior / weak likelihood";
* otherwise "✓".

What ArviZ drops and this module adds:

* the Pareto k-hat of the power-scaling importance weights. ArviZ smooths the weights but discards
  k-hat (``_power_scale_lw`` throws away the second output of ``_ps_tail``). Above 0.7 the weights are
  too heavy-tailed for the estimate to be trusted (priorsense's ``k_threshold``; n-kall/priorsense#139:
  the sensitivity is then "probably higher than it appears"), so such rows are marked unreliable.
  We compute k-hat on exactly the log weights ArviZ uses, (alpha - 1) * log p_component, for both
  alphas, with ArviZ's tail length (r_eff = relative tail ESS of the component's log density) and
  report the larger;
* selective power-scaling: ``prior_sites`` scales only those priors (variables of the ``log_prior``
  group, one per prior site in trees built by ``inference.fit``);
* mixtures are analysed on their label-invariant summaries (``spec.summaries``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import xarray as xr

KHAT_MAX = 0.7
ARVIZ_RESERVED_DIMS = ("component",)  # dim names arviz_stats.psense_summary uses itself
THRESHOLD = 0.05


def _component_draws(tree: xr.DataTree, group: str, names: Sequence[str] | None) -> np.ndarray:
    """Summed log density of a component at every draw, shape (chain, draw)."""
    ds = tree[group].to_dataset()
    names = list(ds.data_vars) if names is None else list(names)
    total = 0.0
    for n in names:
        da = ds[n]
        extra = [d for d in da.dims if d not in ("chain", "draw")]
        total = total + da.sum(extra).transpose("chain", "draw").values
    return np.asarray(total, dtype=float)


def power_scaling_khat(log_component: np.ndarray, alphas: tuple[float, float] = (0.99, 1.01)) -> float:
    """Pareto k-hat of the power-scaling importance weights exp((alpha - 1) * log_component), the larger
    over the two alphas; ``log_component`` has shape (chain, draw)."""
    from arviz_stats.base import array_stats

    lc = np.asarray(log_component, dtype=float)
    if np.ptp(lc) == 0:
        return float("-inf")  # constant density: all weights equal
    r_eff = float(array_stats.ess(lc.reshape(1, -1), chain_axis=0, draw_axis=1, method="tail",
                                  relative=True, prob=0.05))
    out = -np.inf
    for alpha in alphas:
        lw = (alpha - 1.0) * lc.reshape(-1)
        w = np.exp(lw - lw.max())
        k = float(array_stats.pareto_khat(w, chain_axis=None, draw_axis=-1, r_eff=r_eff, tail="right"))
        out = max(out, k)
    return out


def _analysis_tree(tree) -> xr.DataTree:
    """The tree with its posterior replaced by the compared quantities (summaries for mixtures); a
    ``ComparedView`` hands over the one it computed already."""
    from diagnostics.view import compared_view

    return compared_view(tree).analysis_tree


def _positional(post: xr.Dataset, keep_labels: bool = False) -> xr.Dataset:
    """Every non-sample dimension indexed 0, 1, ...: ArviZ labels rows by coordinate values, and float ones
    (ssgp's curve grid) gave unreadable labels such as ``g[0.1245105123]``; positions give ``g[3]``, the
    label the scorecard and the health record use for the same quantity. ``keep_labels``: dims named by strings
    (``diagnostics.health.dim_entries``: the user's labels) keep them, as the scorecard's labels do."""
    dims = [d for d in post.dims if d not in ("chain", "draw")]
    if keep_labels:
        dims = [d for d in dims if not (d in post.coords and post[d].dtype.kind in "USO"
                                        and len(set(post[d].values.tolist())) == post.sizes[d])]
    out = post.drop_vars([d for d in dims if d in post.coords]).assign_coords(
        {d: np.arange(post.sizes[d]) for d in dims})
    dims = [d for d in post.dims if d not in ("chain", "draw")]
    # psense_summary stacks the prior and likelihood values along a dim it names "component": a posterior dim
    # of that name (bpca's summaries) made it fail with "conflicting sizes for dimension 'component'"
    return out.rename({d: f"{d}_" for d in dims if d in ARVIZ_RESERVED_DIMS})


def _named_labels(post: xr.Dataset) -> dict[str, str]:
    """positional label (``g[3]``, ArviZ's rows) -> the label of the scorecard (``mu_sorted[0,Hwt]``)."""
    from diagnostics.quantities import SAMPLE_DIMS, component_labels, labels_of

    out = {}
    for name, da in post.data_vars.items():
        shape = tuple(n for d, n in da.sizes.items() if d not in SAMPLE_DIMS)
        out.update(zip(component_labels(str(name), shape), labels_of(da, str(name)), strict=True))
    return out


def sensitivity(tree, *, var_names: Sequence[str] | None = None,
                prior_sites: Sequence[str] | None = None, likelihood_sites: Sequence[str] | None = None,
                alphas: tuple[float, float] = (0.99, 1.01), threshold: float = THRESHOLD) -> pd.DataFrame:
    """Power-scaling sensitivity of every posterior quantity of ``tree`` (any method's fit).

    Parameters
    ----------
    tree:
        a DataTree from ``inference.fit`` (needs ``log_prior`` and ``log_likelihood``), or its
        ``ComparedView`` (the summaries of a mixture are then not recomputed).
    var_names:
        posterior variables to analyse (default: all float variables).
    prior_sites:
        power-scale only these prior sites (selective power-scaling); default: all.
    likelihood_sites:
        likewise for the likelihood.
    alphas, threshold:
        as ``arviz_stats.psense_summary``.

    Returns
    -------
    pandas.DataFrame
        indexed by quantity (labelled as in the scorecard: ``g[3]``, ``b[0,1]``, the user's labels where the
        tree has them, ``mu_sorted[0,Hwt]``) with ArviZ's ``prior``, ``likelihood``, ``diagnosis`` plus
        ``khat_prior``, ``khat_likelihood`` (Pareto k-hat of the power-scaling weights, the same for every
        row), ``reliable`` (both k-hats <= 0.7) and ``flag`` (the reading in words). ``df.attrs`` holds
        ``khat_prior``, ``khat_likelihood``, ``prior_sites``, ``likelihood_sites``.
    """
    import logging

    import arviz_stats as azs

    from diagnostics.view import ComparedView

    data = _analysis_tree(tree)
    tree = tree.tree if isinstance(tree, ComparedView) else tree
    for group in ("log_prior", "log_likelihood"):
        if group not in tree.children:
            raise ValueError(f"tree: needs a {group!r} group (trees from inference.fit have one)")
    known_prior = list(tree["log_prior"].to_dataset().data_vars)
    known_lik = list(tree["log_likelihood"].to_dataset().data_vars)
    for arg, names, known in (("prior_sites", prior_sites, known_prior),
                              ("likelihood_sites", likelihood_sites, known_lik)):
        bad = [n for n in (names or []) if n not in known]
        if bad:
            raise ValueError(f"{arg}: {bad} not in the tree's sites {known}")
    named = _named_labels(data["posterior"].to_dataset())
    post = _positional(data["posterior"].to_dataset())
    data = data.copy()
    data["posterior"] = xr.DataTree(post)
    if var_names is None:
        var_names = [k for k in post.data_vars if np.issubdtype(post[k].dtype, np.floating)]
    logger = logging.getLogger("arviz_stats.psense")
    level = logger.level
    logger.setLevel(logging.ERROR)  # we say it ourselves, in the flag column
    try:
        table = azs.psense_summary(data, var_names=list(var_names), threshold=threshold, alphas=alphas,
                                   prior_var_names=None if prior_sites is None else list(prior_sites),
                                   likelihood_var_names=None if likelihood_sites is None else list(likelihood_sites),
                                   round_to=12)
    finally:
        logger.setLevel(level)
    table.index = [named.get(k, k) for k in (str(i).replace(", ", ",") for i in table.index)]
    k_prior = power_scaling_khat(_component_draws(tree, "log_prior", prior_sites), alphas)
    k_lik = power_scaling_khat(_component_draws(tree, "log_likelihood", likelihood_sites), alphas)
    table["khat_prior"] = k_prior
    table["khat_likelihood"] = k_lik
    reliable = k_prior <= KHAT_MAX and k_lik <= KHAT_MAX
    table["reliable"] = reliable
    table["flag"] = [_flag(d, reliable, k_prior, k_lik) for d in table["diagnosis"]]
    table.attrs.update({"khat_prior": k_prior, "khat_likelihood": k_lik, "threshold": threshold,
                        "prior_sites": list(prior_sites) if prior_sites else known_prior,
                        "likelihood_sites": list(likelihood_sites) if likelihood_sites else known_lik})
    return table


def _flag(diagnosis: str, reliable: bool, k_prior: float, k_lik: float) -> str:
    if diagnosis.startswith("potential prior-data conflict"):
        text = "prior-data conflict: the prior and the data pull this quantity in different directions"
    elif diagnosis.startswith("potential strong prior"):
        text = "strong prior / weak likelihood: the prior, not the data, decides this quantity"
    else:
        text = "ok: the data dominate, the prior does not decide the result"
    if not reliable:
        text += (f" (UNRELIABLE: power-scaling weights have Pareto k-hat {max(k_prior, k_lik):.2f} > {KHAT_MAX}; "
                 "the sensitivity is probably higher than it appears)")
    return text


def sensitive(table: pd.DataFrame) -> bool:
    """True when any quantity is flagged (prior-data conflict or strong prior), or the check is unreliable."""
    return bool((table["diagnosis"] != "✓").any() or not table["reliable"].all())
