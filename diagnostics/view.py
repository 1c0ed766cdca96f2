"""The compared view of a fitted tree: everything the diagnostics read from it, computed once.

A report compares one reference with several candidates through four consumers: the scorecard, the
method scores, the plots and the prior-sensitivity check. Each needs the same things of every tree:

* the **compared quantities** (``compared_posterior``): the label-invariant summaries a mixture's
  ``ModelSpec.summaries`` computes (for hlcr and gp_alps a jitted JAX map over every draw), else the
  posterior itself;
* their draws, one (chain, draw) array per scalar component, labelled ``name[i,j]`` in C order (the labels
  ``diagnostics.health`` uses), with the user's labels in place of positions where the tree has them
  (``with_user_labels``: ``mu_sorted[0,Hwt]``; sorted components, grids and pairs stay positional);
* per scalar: mean, sd, bulk / tail / mean ESS, rank-normalised split R-hat (Vehtari et al. 2021), and the
  Monte Carlo standard errors of the mean and of the sd (ArviZ's ``mcse``: sd / sqrt(ESS_mean), and the
  fourth-moment delta-method error of the sd, which stays honest when a few rare draws carry the spread);
* the absolute floor of every bounded quantity (``ModelSpec.bounded``: ``FLOOR_FRACTION`` = 1 % of its
  range, e.g. 0.01 for a probability; see ``diagnostics.scoring``);
* on demand, the MCMC health record (``diagnostics.health.mcmc_health`` on the same compared dataset).

``compared_view(tree)`` builds it; ``scorecard``, ``method_scores``, ``plots`` and ``sensitivity`` accept a
view wherever they accept a tree, and ``diagnostics.report`` builds one view per tree and hands it to all of
them (before: the summaries of each tree were recomputed 4-6 times per report, 19 times for 4 hlcr trees).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np
import pandas as pd
import xarray as xr

import zoo
from diagnostics.health import TAIL_PROBS, mcmc_health
from diagnostics.quantities import (  # noqa: F401  (COMPARED_ATTR, with_user_labels: re-exported)
    COMPARED_ATTR,
    SAMPLE_DIMS,
    compared_draws,
    compared_posterior,
    is_positions,
    labels_of,
    spec_of,
    with_user_labels,
)

FLOOR_FRACTION = 0.01  # absolute floor of a bounded quantity, as a fraction of its range (module scorecard)
NUMERIC_FLOOR = 1e-9  # differences below 1e-9 x max(1, |reference mean|) are float noise, never a failure
STAT_COLUMNS = ("mean", "sd", "ess_bulk", "ess_tail", "ess_mean", "rhat", "mcse_mean", "mcse_sd")


def carry_user_labels(tree: xr.DataTree, donors) -> xr.DataTree:
    """``tree`` with the labels that a donor (another fit of the same model, e.g. from a labelled table) has on a
    posterior dim where ``tree`` has only positions (a reference made on the bare arrays), so that the same
    quantity has one name in every tree of a comparison. ``donors``: DataTrees or ``ComparedView`` objects; ``tree``
    itself is not changed (a copy is returned when anything is carried)."""
    if not isinstance(tree, xr.DataTree) or "posterior" not in tree.children:
        return tree
    post = tree["posterior"].to_dataset()
    assign = {}
    for donor in donors:
        other = donor.tree if isinstance(donor, ComparedView) else donor
        if not isinstance(other, xr.DataTree) or "posterior" not in other.children or \
                other.attrs.get("model") != tree.attrs.get("model"):
            continue
        theirs_post = other["posterior"]
        for d in post.dims:
            if d in SAMPLE_DIMS or d in assign or d not in theirs_post.coords or theirs_post.sizes[d] != post.sizes[d]:
                continue
            mine = np.asarray(post[d].values) if d in post.coords else np.arange(post.sizes[d])
            theirs = np.asarray(theirs_post[d].values)
            if is_positions(mine) and not is_positions(theirs) and theirs.dtype.kind != "f":
                assign[d] = theirs
    if not assign:
        return tree
    out = tree.copy()
    out["posterior"] = xr.DataTree(post.assign_coords(assign))
    return out


def method_kind(tree: xr.DataTree) -> str:
    """"sampler", "variational" or "point" as registered for the tree's (model, method); trees of an
    unregistered method: "point" with one draw, "variational" when they store log q, else "sampler"."""
    from inference._methods import get_method

    try:
        return get_method(zoo.get(tree.attrs["model"]), tree.attrs["method"]).kind
    except (KeyError, ValueError):
        post = tree["posterior"]
        if post.sizes.get("chain", 1) * post.sizes.get("draw", 1) == 1:
            return "point"
        has_log_q = "sample_stats" in tree.children and "log_q" in tree["sample_stats"]
        return "variational" if has_log_q else "sampler"


def per_scalar_draws(ds: xr.Dataset, var_names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """label -> (chain, draw) array for every scalar component of the float variables of ``ds``."""
    names = list(var_names) if var_names is not None else [
        k for k in ds.data_vars if np.issubdtype(ds[k].dtype, np.floating)]
    out = {}
    for name in names:
        if name not in ds:
            raise ValueError(f"var_names: {name!r} is not in the compared posterior (has {list(ds.data_vars)})")
        values = np.asarray(ds[name].transpose(*SAMPLE_DIMS, ...).values, dtype=float)
        flat = values.reshape(values.shape[0], values.shape[1], -1)
        for j, label in enumerate(labels_of(ds[name], name)):
            out[label] = flat[:, :, j]
    return out


def scalar_stats(draws: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """Per label (rows, in order): ``STAT_COLUMNS``. One call per statistic on the stacked (label, chain,
    draw) array. A label whose draws are all equal has sd 0, Monte Carlo errors 0 and no ESS or R-hat (NaN);
    a single draw (a point estimate) has sd, ESS, R-hat NaN and Monte Carlo error 0."""
    from arviz_stats.base import array_stats

    labels = list(draws)
    if not labels:
        return pd.DataFrame(columns=list(STAT_COLUMNS), dtype=float)
    arr = np.stack([draws[k] for k in labels])  # (label, chain, draw)
    n = arr.shape[1] * arr.shape[2]
    out = pd.DataFrame(index=pd.Index(labels, name="parameter"))
    out["mean"] = arr.mean(axis=(1, 2))
    if n < 2:
        for col in STAT_COLUMNS[1:]:
            out[col] = np.nan
        out["mcse_mean"] = 0.0
        return out
    out["sd"] = arr.reshape(len(labels), -1).std(axis=1, ddof=1)
    live = np.ptp(arr.reshape(len(labels), -1), axis=1) > 0
    for col in STAT_COLUMNS[2:]:
        out[col] = np.nan
    out["mcse_mean"] = 0.0
    out["mcse_sd"] = 0.0
    if live.any() and arr.shape[2] >= 4:
        sub = arr[live]
        with np.errstate(all="ignore"):
            out.loc[live, "ess_bulk"] = array_stats.ess(sub, method="bulk")
            out.loc[live, "ess_tail"] = array_stats.ess(sub, method="tail", prob=TAIL_PROBS)
            out.loc[live, "ess_mean"] = array_stats.ess(sub, method="mean")
            out.loc[live, "rhat"] = array_stats.rhat(sub)
            out.loc[live, "mcse_mean"] = array_stats.mcse(sub, method="mean")
            out.loc[live, "mcse_sd"] = array_stats.mcse(sub, method="sd")
    return out


def floors_of(spec: zoo.ModelSpec | None, labels: Sequence[str]) -> dict[str, float]:
    """label -> absolute floor (``FLOOR_FRACTION`` of the declared range) for the labels of every quantity
    the spec declares bounded; other labels are absent."""
    if spec is None or not spec.bounded:
        return {}
    out = {}
    for label in labels:
        bounds = spec.bounded.get(label.split("[", 1)[0])
        if bounds is not None:
            lo, hi = bounds
            out[label] = FLOOR_FRACTION * (float(hi) - float(lo))
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class ComparedView:
    """What the diagnostics read from one tree (module docstring). Build it with ``compared_view``."""

    name: str
    tree: xr.DataTree
    spec: zoo.ModelSpec | None
    kind: str
    ds: xr.Dataset
    draws: dict[str, np.ndarray]
    stats: pd.DataFrame
    floors: dict[str, float]

    @property
    def labels(self) -> list[str]:
        return list(self.draws)

    @property
    def n_chains(self) -> int:
        return int(self.ds.sizes["chain"])

    @property
    def n_draws(self) -> int:
        return int(self.ds.sizes["chain"] * self.ds.sizes["draw"])

    def flat(self, label: str) -> np.ndarray:
        """The pooled draws of one scalar (chains concatenated)."""
        return self.draws[label].reshape(-1)

    def flats(self, labels: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        return {k: self.flat(k) for k in (self.labels if labels is None else labels)}

    def floor(self, label: str) -> float:
        """The absolute tolerance below which a difference of this quantity is never a failure: the bounded
        floor if declared, else float noise (``NUMERIC_FLOOR x max(1, |mean|)``)."""
        numeric = NUMERIC_FLOOR * max(1.0, abs(float(self.stats.at[label, "mean"])))
        return max(self.floors.get(label, 0.0), numeric)

    @cached_property
    def health(self) -> dict:
        """``diagnostics.health.mcmc_health`` of the tree on this view's compared quantities (once). A reference
        whose validation record (``attrs["validation"]``, ``diagnostics.references.generate``) failed a check
        of the stored-reference standard beyond this rule (the second seed, the exact cross-check) is
        unhealthy too: those failures and the record's ``advice`` are added."""
        health = mcmc_health(self.tree, self.ds)
        try:
            record = json.loads(self.tree.attrs.get("validation", "{}"))
        except (TypeError, ValueError):
            record = {}
        if record.get("failures") or record.get("advice"):
            named = self._record_names()
            record = {**record, "failures": [named(f) for f in record.get("failures", [])],
                      "advice": [named(a) for a in record.get("advice", [])]}
        extra = [f for f in record.get("failures", []) if f not in health["failures"]]
        if extra:
            health = {**health, "failures": health["failures"] + extra, "reliable": False}
        if record.get("advice") and not health["reliable"]:
            health = {**health, "advice": list(record["advice"])}
        return health

    def _record_names(self):
        """A function rewriting the labels of the tree's validation record, written when the tree had positions
        where it now has the user's labels (a reference made on the bare arrays, ``carry_user_labels``), into
        this view's labels (``mu_sorted[0,1]`` -> ``mu_sorted[0,Hwt]``). The positional labels come from the
        compared quantities of one draw with those labels taken off."""
        post = self.tree["posterior"].to_dataset()
        carried = [d for d in post.dims if d not in SAMPLE_DIMS and d in post.coords and post[d].dtype.kind in "USO"]
        if not carried:
            return lambda text: text
        one = post.isel(chain=[0], draw=[0]).assign_coords({d: np.arange(post.sizes[d]) for d in carried})
        bare = compared_draws(one, self.tree, self.spec)
        mapping = {}
        for name in self.ds.data_vars:
            if name in bare.data_vars and bare[name].shape[2:] == self.ds[name].shape[2:]:
                pairs = zip(labels_of(bare[name], name), labels_of(self.ds[name], name), strict=True)
                mapping.update({old: new for old, new in pairs if old != new})
        if not mapping:
            return lambda text: text
        pattern = re.compile(r"(?<![\w])(" + "|".join(re.escape(k) for k in sorted(mapping, key=len, reverse=True))
                             + ")")
        return lambda text: pattern.sub(lambda m: mapping[m.group(1)], text)

    @cached_property
    def options(self) -> dict:
        """The options the method ran with (``tree.attrs["options"]``), {} when not recorded."""
        try:
            return json.loads(self.tree.attrs.get("options", "{}"))
        except (TypeError, ValueError):
            return {}

    @cached_property
    def analysis_tree(self) -> xr.DataTree:
        """The tree with its posterior replaced by the compared quantities (what prior sensitivity reads)."""
        if (self.spec is None or self.spec.summaries is None) and \
                self.ds.identical(self.tree["posterior"].to_dataset()):
            return self.tree
        out = self.tree.copy()
        out["posterior"] = xr.DataTree(self.ds)
        return out


def compared_view(tree: xr.DataTree | ComparedView, *, name: str | None = None,
                  spec: zoo.ModelSpec | None = None) -> ComparedView:
    """The ``ComparedView`` of ``tree`` (a view is returned unchanged). ``name``: the method label (default:
    the tree's ``method`` attribute)."""
    if isinstance(tree, ComparedView):
        return tree
    if not isinstance(tree, xr.DataTree) or "posterior" not in tree.children:
        raise ValueError(f"tree: expected an ArviZ DataTree with a 'posterior' group, got {type(tree).__name__}")
    spec = spec or spec_of(tree)
    ds = compared_posterior(tree, spec)
    draws = per_scalar_draws(ds)
    return ComparedView(name=name or str(tree.attrs.get("method", "candidate")), tree=tree, spec=spec,
                        kind=method_kind(tree), ds=ds, draws=draws, stats=scalar_stats(draws),
                        floors=floors_of(spec, list(draws)))


def compared_views(trees: Mapping[str, xr.DataTree | ComparedView]) -> dict[str, ComparedView]:
    """``compared_view`` of every tree, keyed as given."""
    return {k: compared_view(t, name=k) for k, t in trees.items()}
