"""Plots of posterior quality, saved as PNG (matplotlib backend, no display needed).

* ``plot_marginals``: every method's marginal density over the reference's (``arviz_plots.plot_dist``
  with a dict of trees);
* ``plot_forest``: central intervals of every method side by side (``arviz_plots.plot_forest``);
* ``plot_traces``: ELBO / bound per iteration of the methods that record one;
* ``plot_sbc``: the SBC / VSBC ECDF-difference plot (``arviz_plots.plot_ecdf_pit``);
* ``plot_sensitivity``: power-scaled posteriors (``arviz_plots.plot_psense_dist``);
* ``plot_cost_accuracy``: each method's worst mean error against its run seconds over a ladder of budgets.

Shape trap: ArviZ concatenates a dict of trees along a ``model`` dim, and
trees of different (chain, draw) sizes are NaN-padded (``plot_forest`` then renders empty). So every
tree is first reduced to the same shape: the compared quantities (label-invariant summaries for
mixtures), pooled over chains and subsampled without replacement to the smallest draw count, as one
chain. Large models are shown on their first ``max_panels`` scalar quantities.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from diagnostics.ladders import time_to_rule
from diagnostics.metrics import trace_of
from diagnostics.power_scaling import _analysis_tree, _positional
from diagnostics.scoring import MEAN_TOL
from diagnostics.view import ComparedView, compared_view

MAX_PANELS = 12
# the reference (first tree) in near-black, the methods in the usual colour cycle
COLORS = ["#222222", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
          "#bcbd22", "#7f7f7f"]


def _mpl():
    """``matplotlib.pyplot``, with Agg chosen only when nothing chose a backend and there is no display.

    A backend already chosen (Jupyter's inline or ipympl backend, ``MPLBACKEND``, ``matplotlib.use``) is never
    replaced: forcing Agg under Jupyter's inline backend, where ``DISPLAY`` is normally unset, would leave every
    plotting cell without its figure."""
    import matplotlib

    if matplotlib.get_backend(auto_select=False) is None and not os.environ.get("DISPLAY"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(pc_or_fig, path) -> Path | None:
    if path is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    plt = _mpl()
    fig = getattr(pc_or_fig, "viz", None)
    if fig is not None:  # a PlotCollection
        fig = pc_or_fig.viz["figure"].item() if "figure" in pc_or_fig.viz else None
        if fig is not None and fig.get_layout_engine() is None:
            fig.set_layout_engine("constrained")  # titles and tick labels must not overlap
        pc_or_fig.savefig(path, dpi=110, bbox_inches="tight")
    else:
        pc_or_fig.savefig(path, dpi=110, bbox_inches="tight")
        fig = pc_or_fig
    if fig is not None:
        plt.close(fig)
    return path


def common_trees(trees: Mapping[str, xr.DataTree | ComparedView], *, var_names: Sequence[str] | None = None,
                 labels: Sequence[str] | None = None, max_panels: int = MAX_PANELS, seed: int = 0,
                 standardise: bool = False) -> dict[str, xr.DataTree]:
    """Every tree (or its ``ComparedView``, whose draws are reused) reduced to the same scalar quantities and
    the same (chain=1, draw=n) shape; ``standardise``: every quantity centred and scaled by the first tree's
    mean and sd (the reference), so quantities of different scales share one axis. ``labels``: the scalar
    quantities to keep (as the scorecard names them, e.g. ``"w[0,1]"``); default: the first ``max_panels``."""
    flats = {}
    for name, tree in trees.items():
        view = compared_view(tree, name=name)
        flats[name] = view.flats([lab for lab in view.labels if var_names is None or lab.split("[", 1)[0] in var_names])
    common = [lab for lab in next(iter(flats.values())) if all(lab in f for f in flats.values())]
    labels = [lab for lab in common if labels is None or lab in set(labels)][:max_panels]
    if not labels:
        raise ValueError("trees: no scalar quantity is common to every tree")
    # Point estimates (one draw: em, vbgmm, dppca) must not shrink every other method to one draw;
    # they are repeated to the common size and drawn as lines by ``plot_marginals``.
    sizes = [len(f[labels[0]]) for f in flats.values()]
    n = min([s for s in sizes if s > 1] or [1])
    rng = np.random.default_rng(seed)
    first = next(iter(flats.values()))
    loc = {lab: float(np.mean(first[lab])) if standardise else 0.0 for lab in labels}
    scale = {lab: (float(np.std(first[lab])) or 1.0) if standardise else 1.0 for lab in labels}
    out = {}
    for name, flat in flats.items():
        total = len(flat[labels[0]])
        if total == 1:
            rows = np.zeros(n, dtype=int)
        else:
            rows = np.sort(rng.choice(total, size=n, replace=False)) if n < total else np.arange(total)
        ds = xr.Dataset({lab: (("chain", "draw"), (flat[lab][rows][None] - loc[lab]) / scale[lab]) for lab in labels},
                        coords={"chain": [0], "draw": np.arange(n)})
        out[name] = xr.DataTree.from_dict({"posterior": ds})
    return out


def _colors(n: int) -> list[str]:
    return [COLORS[i % len(COLORS)] for i in range(n)]


def _cols(n: int) -> int:
    return min(4, n)


def plot_marginals(trees: Mapping[str, xr.DataTree | ComparedView], path: str | os.PathLike | None = None, *,
                   var_names: Sequence[str] | None = None, labels: Sequence[str] | None = None,
                   max_panels: int = MAX_PANELS):
    """Overlaid marginal densities of every method (``trees``: name -> DataTree; put the reference
    first). Returns the ArviZ PlotCollection (saved as PNG when ``path``)."""
    import arviz_plots as azp

    _mpl()
    common = common_trees(trees, var_names=var_names, labels=labels, max_panels=max_panels)
    common, points = _split_point_masses(common)
    n_panels = len(next(iter(common.values()))["posterior"].data_vars)
    colors = _colors(len(common))
    pc = azp.plot_dist(common, kind="kde", col_wrap=_cols(n_panels), color=colors,
                       visuals={"credible_interval": False, "point_estimate": False,
                                "point_estimate_text": False},
                       figure_kwargs={"figsize": (3.2 * _cols(n_panels), 2.7 * -(-n_panels // _cols(n_panels)) + 0.6)})
    for (name, label), value in points.items():
        ax = pc.viz["plot"][label].item()
        ax.axvline(value, color=colors[list(common).index(name)], lw=1.6, ls="--")
    pc.add_legend("model", loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=min(len(common), 6),
                  frameon=False, title="method")
    if points:
        fig = pc.viz["figure"].item()
        fig.text(0.5, 0.0, "dashed vertical line: a method whose draws of that quantity are all equal (a point "
                 "estimate, e.g. EM or a type-II ML hyperparameter)", ha="center", va="top", fontsize=8)
    _save(pc, path)
    return pc


def _split_point_masses(common: dict[str, xr.DataTree]) -> tuple[dict[str, xr.DataTree], dict]:
    """Quantities a method holds fixed (all draws equal) have no density: a kernel density estimate of
    them fails. They are set to NaN for ``plot_dist`` (which then draws nothing) and returned as
    ``{(method, label): value}`` to be drawn as vertical lines. Quantities that are constant in the
    reference (the first tree; sd below 1e-8 of the scale, e.g. a co-clustering probability the data settle) are
    dropped."""
    ref = next(iter(common.values()))["posterior"].to_dataset()
    keep = [k for k in ref.data_vars if np.std(ref[k].values) > 1e-8 * max(1.0, abs(float(ref[k].mean())))]
    keep = keep or list(ref.data_vars)
    out, points = {}, {}
    for name, tree in common.items():
        ds = tree["posterior"].to_dataset()[keep]
        for k in keep:
            v = ds[k].values
            if np.ptp(v) == 0:
                points[(name, k)] = float(v.flat[0])
                ds[k] = ds[k].copy(data=np.full_like(v, np.nan))
        out[name] = xr.DataTree.from_dict({"posterior": ds})
    return out, points


def plot_forest(trees: Mapping[str, xr.DataTree | ComparedView], path: str | os.PathLike | None = None, *,
                var_names: Sequence[str] | None = None, labels: Sequence[str] | None = None,
                max_panels: int = 2 * MAX_PANELS, standardise: bool = True):
    """Central 50 % / 89 % intervals and medians of every method, quantity by quantity; by default in
    units of the first tree's (the reference's) sd, centred on its mean, so that every row reads the
    same way: 0 is the reference mean, +-1 one reference sd."""
    import arviz_plots as azp

    plt = _mpl()
    common = common_trees(trees, var_names=var_names, labels=labels, max_panels=max_panels,
                          standardise=standardise)
    n_vars = len(next(iter(common.values()))["posterior"].data_vars)
    height = 1.4 + 0.18 * n_vars * len(common) + 0.15 * n_vars
    pc = azp.plot_forest(common, combined=True, figure_kwargs={"figsize": (8, height)}, color=_colors(len(common)))
    pc.add_legend("model", loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=min(len(common), 6),
                  frameon=False, title="method")
    if standardise:
        fig = pc.viz["figure"].item()
        fig.supxlabel(f"(value - {next(iter(trees))} mean) / {next(iter(trees))} sd", fontsize=10)
        for ax in fig.axes:
            if ax.get_xlim()[0] < 0 < ax.get_xlim()[1] and ax.get_xlabel() != "variable":
                ax.axvline(0, color="0.6", lw=0.8, ls=":", zorder=0)
        plt.figure(fig.number)
    _save(pc, path)
    return pc


def plot_traces(trees: Mapping[str, xr.DataTree | ComparedView], path: str | os.PathLike | None = None):
    """ELBO / bound against iteration for every method that stores a trace; None when none does."""
    traces = {name: trace_of(tree.tree if isinstance(tree, ComparedView) else tree) for name, tree in trees.items()}
    traces = {k: v for k, v in traces.items() if v[0] is not None and np.isfinite(v[1]).any()}
    if not traces:
        return None
    plt = _mpl()
    fig, axes = plt.subplots(1, len(traces), figsize=(4.2 * len(traces), 3.0), squeeze=False)
    for ax, (name, (kind, values)) in zip(axes[0], traces.items(), strict=True):
        it = np.arange(1, len(values) + 1)
        ax.plot(it, values, lw=0.8, color="C0", alpha=0.6 if len(values) > 200 else 1.0)
        if len(values) > 200:  # a noisy stochastic objective: add its running mean
            w = max(5, len(values) // 50)
            smooth = np.convolve(values, np.ones(w) / w, mode="valid")
            ax.plot(it[w - 1:], smooth, lw=1.5, color="C1", label=f"running mean ({w})")
            ax.legend(fontsize=8, loc="lower right")
        finite = values[np.isfinite(values)]
        if finite.size > 20:  # zoom on the converged part: the first iterations dwarf the rest
            tail = finite[len(finite) // 10:]
            lo, hi = np.percentile(tail, [1, 100])
            pad = 0.05 * (hi - lo) if hi > lo else 1.0
            ax.set_ylim(lo - pad, hi + pad)
        ax.set_title(f"{name}: {kind}", fontsize=10)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path)
    return fig


def plot_sbc(result, path: str | os.PathLike | None = None, *, max_panels: int = MAX_PANELS):
    """ECDF-difference plot of an ``SBCResult`` (``arviz_plots.plot_ecdf_pit`` on its ``prior_sbc``
    group; the band is the simultaneous 95 % envelope of a uniform sample of the same size)."""
    import arviz_plots as azp

    _mpl()
    ds = result.tree["prior_sbc"].to_dataset()
    sub = {}
    for var in ds.data_vars:
        da = ds[var]
        extra = [d for d in da.dims if d not in ("chain", "draw")]
        sub[var] = da.isel({d: slice(0, max_panels) for d in extra})
    tree = xr.DataTree.from_dict({"prior_sbc": xr.Dataset(sub)})
    n_panels = sum(int(np.prod([v.sizes[d] for d in v.dims if d not in ("chain", "draw")])) for v in sub.values())
    pc = azp.plot_ecdf_pit(tree, figure_kwargs={"figsize": (3.4 * _cols(n_panels), 2.8 * -(-n_panels // 4))})
    fig = pc.viz["figure"].item()
    for ax in fig.axes:  # ArviZ's y-limits can cut the curve off: fit them to what is drawn
        ys = [np.abs(np.asarray(line.get_ydata(), dtype=float)) for line in ax.get_lines()]
        ys += [np.abs(np.asarray(c.get_offsets())[:, 1]) for c in ax.collections if len(c.get_offsets())]
        top = max((float(np.nanmax(y)) for y in ys if y.size), default=0.0)
        lo, hi = ax.get_ylim()
        if top * 1.15 > hi:
            ax.set_ylim(-top * 1.25, top * 1.25)
        for text in ax.texts:  # the p-value label: keep it readable over the curve
            text.set_bbox({"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 1.5})
    _save(pc, path)
    return pc


def _n_scalars(da: xr.DataArray) -> int:
    """Number of scalar quantities in ``da`` per draw (the product of its non-sample dims)."""
    return int(np.prod([n for d, n in da.sizes.items() if d not in ("chain", "draw")]))


def plot_sensitivity(tree: xr.DataTree | ComparedView, path: str | os.PathLike | None = None, *,
                     var_names: Sequence[str] | None = None, prior_sites: Sequence[str] | None = None,
                     max_panels: int = MAX_PANELS):
    """Posterior marginals when the prior / likelihood is power-scaled by alpha = 0.8 and 1.25
    (``arviz_plots.plot_psense_dist``): curves that move mean sensitivity."""
    import arviz_plots as azp

    _mpl()
    data = _analysis_tree(tree)
    post = _positional(data["posterior"].to_dataset(), keep_labels=True)
    names = [k for k in (var_names or post.data_vars) if np.issubdtype(post[k].dtype, np.floating)]
    post, constant = _varying_entries(post[names])
    names = [k for k in names if k in post.data_vars]
    if not names:
        return None
    # smallest variables first: the scalar hyperparameters are where prior sensitivity matters most
    names = sorted(names, key=lambda k: _n_scalars(post[k]))
    chosen, count = [], 0
    for k in names:
        size = _n_scalars(post[k])
        if count and count + size > max_panels:
            break
        chosen.append(k)
        count += size
    # The first variable is always shown; when it alone has more than max_panels entries, its trailing
    # dims keep their first entries and the leading ones are cut to fit (e.g. W[k, d, q] -> W[0, :6, :2]).
    coords, budget = {}, max_panels
    if count > max_panels:  # only the first variable can be over the budget (see the loop above)
        for d in reversed([d for d in post[chosen[0]].dims if d not in ("chain", "draw")]):
            keep = max(1, min(post.sizes[d], budget))
            if keep < post.sizes[d]:
                coords[d] = slice(0, keep)
            budget = max(1, budget // keep)
    # Subset by position here: plot_psense_dist's ``coords`` selects by label and is ignored for dims
    # without coordinate values (ssgp's 50-point curve gave 100 subplots).
    post = post.isel(coords)
    count = sum(_n_scalars(post[k]) for k in chosen)
    if len(post.data_vars) == 1:
        # arviz-plots 1.3 bug: with a single posterior variable ``extract`` returns a DataArray and
        # plot_psense_dist fails (TypeError in get_group); a second, unplotted copy avoids it.
        post = post.assign({"__copy__": post[chosen[0]]})
    data = data.copy()
    data["posterior"] = xr.DataTree(post)
    rows = min(count, max_panels)
    pc = azp.plot_psense_dist(data, var_names=chosen, prior_var_names=list(prior_sites) if prior_sites else None,
                              labeller=_scorecard_labeller(), figure_kwargs={"figsize": (10, 0.8 + 2.5 * rows)})
    if constant:
        pc.viz["figure"].item().text(0.5, 0.0, "not drawn, every draw equal (no density to scale): "
                                     + ", ".join(constant[:12]) + (" ..." if len(constant) > 12 else ""),
                                     ha="center", va="top", fontsize=8)
    _save(pc, path)
    return pc


def _scorecard_labeller():
    """An ArviZ labeller that titles a panel as the scorecard names the quantity: ``mu_sorted[0,Hwt]`` (one line;
    ArviZ's default wrote ``mu_sorted`` over ``0, Hwt``)."""
    from arviz_base.labels import BaseLabeller

    class ScorecardLabeller(BaseLabeller):
        def make_label_flat(self, var_name, sel, isel):
            sel = dict(sel)
            scaled = sel.pop("component_group", None)   # psense's own dim: the power-scaled component
            label = f"{var_name}[{','.join(str(v) for v in sel.values())}]" if sel else str(var_name)
            return label if scaled is None else f"{label}, {scaled} scaled"

        def make_label_vert(self, var_name, sel, isel):
            return self.make_label_flat(var_name, sel, isel)

    return ScorecardLabeller()


def _varying_entries(post: xr.Dataset) -> tuple[xr.Dataset, list[str]]:
    """``post`` without the quantities whose draws are all equal (their range within 1e-8 of their size, the
    reference floor of ``_split_point_masses``; e.g. a GP-ALPS switch the data pin at p_on = 1 - 1e-10): they have
    no density, and their power-scaled panels drew nothing but
    density warnings. A variable with one non-sample dim keeps its varying entries; one with more dims, or a
    scalar, goes when any entry is constant. Returns (the rest, labels of what went)."""
    keep, gone = {}, []
    for k, da in post.data_vars.items():
        dims = [d for d in da.dims if d not in ("chain", "draw")]
        v = da.transpose("chain", "draw", *dims).values.reshape(da.sizes["chain"] * da.sizes["draw"], -1)
        constant = np.ptp(v, axis=0) <= 1e-8 * np.maximum(1.0, np.abs(v).max(axis=0))
        if not constant.any():
            keep[k] = da
        elif len(dims) == 1 and not constant.all():
            # a dim of its own: on a dim shared with another variable, Dataset alignment would put the
            # dropped entries back as NaN (empty panels)
            keep[k] = da.isel({dims[0]: np.flatnonzero(~constant)}).rename({dims[0]: f"{k}_{dims[0]}"})
            entries = da[dims[0]].values if dims[0] in da.coords else np.arange(da.sizes[dims[0]])
            gone += [f"{k}[{entries[i]}]" for i in np.flatnonzero(constant)]
        else:
            gone.append(k if not dims else f"{k}[{','.join(':' for _ in dims)}]")
    return xr.Dataset(keep, attrs=post.attrs), gone


def plot_cost_accuracy(frame, path: str | os.PathLike | None = None, *, title: str | None = None):
    """Accuracy against compute (``diagnostics.cost_accuracy``): each method's worst standardised mean error
    against its run seconds, log-log, one line per method through the seed-averaged rungs of its ladder (each seed
    a dot; a star where every seed first meets the method's rule), the practical threshold (0.2 reference sd)
    as a horizontal line, each sampler's Monte Carlo error at each rung dashed in its colour (an exact sampler
    sits at a few times it), and the reference's own Monte Carlo error dotted (no method can be seen closer to
    the posterior than that). Returns the figure (saved as PNG when ``path``)."""
    import pandas as pd

    frame = pd.DataFrame(frame)
    if not len(frame):
        raise ValueError("frame: no rows (run diagnostics.cost_accuracy first)")
    plt = _mpl()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    floor = 1e-4
    rule = time_to_rule(frame).set_index("method")
    for i, (method, g) in enumerate(frame.groupby("method", sort=False)):
        color = COLORS[1 + i % (len(COLORS) - 1)]
        secs = g["run_seconds"].clip(lower=1e-4)
        err = g["max_std_mean_error"].clip(lower=floor)
        ax.scatter(secs, err, s=12, color=color, alpha=0.5, lw=0)
        mean = g.assign(run_seconds=secs, max_std_mean_error=err).groupby("budget")[
            ["run_seconds", "max_std_mean_error", "mc_error"]].mean().sort_index()
        unit = g["budget_unit"].iloc[0]
        ax.plot(mean["run_seconds"], mean["max_std_mean_error"], "-o", ms=3.5, color=color, lw=1.6,
                label=f"{method} ({g['kind'].iloc[0]}; {int(mean.index[0])}..{int(mean.index[-1])} {unit})")
        if g["kind"].iloc[0] == "sampler":
            ax.plot(mean["run_seconds"], mean["mc_error"].clip(lower=floor), "--", color=color, lw=1.0, alpha=0.8,
                    label=f"{method}: its Monte Carlo error")
        if method in rule.index and bool(rule.at[method, "reached"]):
            b = rule.at[method, "budget"]
            ax.plot(mean.at[b, "run_seconds"], mean.at[b, "max_std_mean_error"], "*", ms=14, color=color,
                    mec="black", mew=0.6, zorder=5)
    ax.axhline(MEAN_TOL, color="#d62728", lw=1.0, ls="-.", label=f"practical threshold ({MEAN_TOL} reference sd)")
    ref_mc = float(frame["reference_mc_error"].max())
    if np.isfinite(ref_mc) and ref_mc > 0:
        ax.axhline(ref_mc, color="#7f7f7f", lw=1.0, ls=":", label="the reference's own Monte Carlo error")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("run seconds (compile time apart)")
    ax.set_ylabel("worst mean error (reference sd)")
    ax.grid(alpha=0.3, which="both")
    ax.set_title(title or f"{frame['model'].iloc[0] if 'model' in frame else ''}: accuracy against compute "
                 "(star: first budget meeting the method's rule)", fontsize=10)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    _save(fig, path)
    return fig
