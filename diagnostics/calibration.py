"""Simulation-based calibration (SBC) and its variational cousin (VSBC) for any (model, method).

SBC (Talts, Betancourt, Simpson, Vehtari & Gelman 2018, arXiv:1804.06788): repeat for j = 1..M:
draw theta~ from the prior and y ~ p(y | theta~), fit the method to y, and take the rank of theta~
among L (nearly independent) posterior draws. If the method samples the exact posterior, each rank is
uniform on {0..L}, whatever the model. We store the randomised normalised rank
u = (rank + V) / (L + 1), V ~ U(0, 1) (ties among draws broken at random too), which is exactly
U(0, 1) under calibration even when L differs between simulations; these PIT values go to a
``prior_sbc`` group so that ``arviz_plots.plot_ecdf_pit(result.tree)`` draws the ECDF-difference
plot with its simultaneous band, and ArviZ's ``uniformity_test`` (``pot_c``) gives one p-value per
scalar quantity. The method is flagged when any p-value is below ``alpha / m`` (Bonferroni over the m
quantities).

VSBC (Yao, Vehtari, Simpson & Gelman 2018, "Yes, but did it work?", sec. 3): for variational
methods, p_j = Pr_q(theta < theta~_j) over all of q's draws. If the approximation's point estimate is
unbiased, the p_j are distributed symmetrically about 1/2; the test is a two-sample
Kolmogorov-Smirnov test of {p_j} against {1 - p_j} (their Fig. 2), flagged below ``alpha / m``. A
too-narrow but centred approximation passes VSBC (it tests bias only); SBC fails it.

Where theta~ and y come from (``simulator``):

* ``"model"``: the NumPyro model itself, with its likelihood sites un-observed, run forward on the
  covariates and sizes of ``spec.simulate(seed_j, **sizes)``: theta~ is then exactly a prior draw
  with the hyperparameters used for the fit (the SBC requirement);
* ``"spec"``: ``spec.simulate(seed_j, **sizes)`` and its ``truth`` (valid only if the simulator draws
  the parameters from the model's prior with the same hyperparameters);
* ``"auto"`` (default): "model" when every likelihood site is a sample site named like a data field,
  else "spec".

Mixtures are ranked on their label-invariant summaries (``spec.summaries``) when the spec has them.

Resumable: every simulation's result is written (atomically) to ``<directory>/sim_<j>.npz`` as soon as
it finishes; a rerun with the same arguments skips those, and a rerun with a larger ``n_sims`` only
runs the new ones. ``sbc`` and ``vsbc`` share the files (they only read them differently). The
directory defaults to ``$BAYES_ZOO_SBC_DIR`` or ``~/.cache/bayes-zoo/sbc``, in a sub-directory named
by the model, method and a hash of the arguments.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr
from numpyro import handlers
from numpyro.primitives import Messenger

import zoo
from inference.io import replace_atomically

PIT_SD = 1 / np.sqrt(12)  # sd of U(0, 1)


def default_directory() -> Path:
    return Path(os.environ.get("BAYES_ZOO_SBC_DIR", Path.home() / ".cache" / "bayes-zoo" / "sbc"))


@dataclasses.dataclass
class SBCResult:
    """What ``sbc``/``vsbc`` return.

    Attributes
    ----------
    kind:
        ``"sbc"`` or ``"vsbc"``.
    model:
        the registered model whose fits were checked.
    method:
        the method whose calibration was checked.
    tree:
        DataTree with ``prior_sbc`` (SBC: randomised normalised ranks in (0, 1); VSBC: ``p_j =
        Pr_q(theta < theta~)``), dims (chain=1, draw=simulation, ...), and ``sbc_ranks`` (raw counts).
    table:
        one row per scalar quantity: ``parameter``, ``n_sims``, ``p_value``, ``flagged`` and
        ``pit_mean``/``pit_sd`` (calibrated: 0.5 / 0.289), ``reading`` in words.
    passed:
        no quantity flagged.
    alpha:
        family-wise level (Bonferroni over the table's rows).
    n_failed:
        simulations whose fit failed (non-finite draws); excluded, and reported.
    directory:
        where the per-simulation files are.
    """

    kind: str
    model: str
    method: str
    tree: xr.DataTree
    table: pd.DataFrame
    passed: bool
    alpha: float
    n_failed: int
    directory: Path

    def summary(self) -> str:
        worst = self.table.sort_values("p_value").iloc[0] if len(self.table) else None
        what = "SBC" if self.kind == "sbc" else "VSBC"
        head = (f"{what} {self.model}/{self.method}: {'passed' if self.passed else 'FLAGGED'} over "
                f"{int(self.table['n_sims'].max()) if len(self.table) else 0} simulations")
        if worst is not None:
            head += f" (smallest p-value {worst['p_value']:.3g} on {worst['parameter']}, " \
                    f"threshold {self.alpha / len(self.table):.3g})"
        return head + (f"; {self.n_failed} failed fits excluded" if self.n_failed else "")

    def plot(self, path: str | os.PathLike | None = None):
        """``arviz_plots.plot_ecdf_pit`` of the ``prior_sbc`` group (saved as PNG when ``path``)."""
        from diagnostics.plots import plot_sbc

        return plot_sbc(self, path)


class _unobserve(Messenger):
    """Turn the observed sample sites ``names`` into sampled ones (prior predictive simulation)."""

    def __init__(self, fn, names):
        self.names = set(names)
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] in self.names and msg.get("is_observed"):
            msg["value"] = None
            msg["is_observed"] = False


def _sim_seed(seed: int, j: int) -> int:
    return int(np.random.SeedSequence([seed, j]).generate_state(1)[0] % (2**31))


def _model_simulation(spec: zoo.ModelSpec, base: dict, hyper: dict, seed: int):
    """(data, truth) from the NumPyro model run forward; None when the model cannot simulate its data."""
    fields = {f.name for f in spec.data_fields}
    kwargs = spec.inputs(base, hyper)
    try:
        model = handlers.seed(_unobserve(spec.model, spec.likelihood_sites), rng_seed=seed)
        tr = handlers.trace(model).get_trace(**kwargs)
    except Exception:  # noqa: BLE001 (a model that cannot run with un-observed sites: use the spec)
        return None
    data = dict(base)
    for site in spec.likelihood_sites:
        s = tr.get(site)
        if s is None or s["type"] != "sample" or site not in fields or site not in base:
            return None
        value = np.asarray(s["value"])
        if value.shape != np.shape(base[site]):
            return None
        data[site] = value.astype(np.asarray(base[site]).dtype)
    truth = {n: np.asarray(s["value"]) for n, s in tr.items()
             if s["type"] == "sample" and not s["is_observed"] and n not in spec.likelihood_sites}
    return data, truth


def _latent_names(spec: zoo.ModelSpec, data: dict, hyper: dict) -> list[str]:
    from inference.trees import latent_sites, trace_structure

    return [n for n in latent_sites(trace_structure(spec, spec.inputs(data, hyper))) if n not in spec.likelihood_sites]


def _compared(spec: zoo.ModelSpec, arrays: Mapping[str, np.ndarray], data: dict, hyper: dict,
              lead: tuple[int, int] | None) -> dict[str, np.ndarray]:
    """name -> array with leading (chain, draw) axes: the label-invariant summaries when the spec has
    them, else the arrays themselves. ``lead=None``: ``arrays`` is one point (the truth)."""
    arrays = {k: (np.asarray(v)[None, None] if lead is None else np.asarray(v)) for k, v in arrays.items()}
    if spec.summaries is None:
        return arrays
    from inference.trees import SAMPLE_DIMS, dataset, site_dims, trace_structure

    trace = trace_structure(spec, spec.inputs(data, hyper))   # abstract: nothing compiled
    dims = {k: site_dims(spec, trace, k, v.shape[2:]) for k, v in arrays.items()}
    ds = dataset(arrays, dims, {}, SAMPLE_DIMS)
    out = spec.summaries(ds, data, hyper)
    return {k: np.asarray(out[k].transpose("chain", "draw", ...).values) for k in out.data_vars}


def _fit_draws(spec, method, data, hyper, options, seed):
    """The method's posterior draws (no DataTree: SBC needs only the draws), validated as ``fit`` does
    (``inference.prepare``, then ``inference.run``)."""
    import inference
    from inference.trees import check_finite

    prepared = inference.prepare(spec, data, method, seed=seed, **hyper, **{**options, "progress": False})
    draws = inference.run(prepared)
    posterior = {k: np.asarray(v) for k, v in draws.posterior.items()}
    check_finite("posterior", posterior, method)
    return posterior, prepared.method.kind


def _auto_thin(draws: Mapping[str, np.ndarray]) -> int:
    """Thinning so that the kept draws are about as many as the smallest bulk ESS (Talts et al. 2018)."""
    from arviz_stats.base import array_stats

    total = None
    ess_min = np.inf
    for v in draws.values():
        v = np.asarray(v, dtype=float)
        c, d = v.shape[:2]
        total = c * d
        if d < 8:
            return 1
        flat = v.reshape(c, d, -1)
        for j in range(flat.shape[-1]):
            col = flat[:, :, j]
            if np.ptp(col) == 0:
                continue
            ess = float(array_stats.ess(col, chain_axis=0, draw_axis=1, method="bulk"))
            ess_min = min(ess_min, ess) if np.isfinite(ess) else ess_min
    if total is None or not np.isfinite(ess_min) or ess_min <= 0:
        return 1
    return int(max(1, np.floor(total / ess_min)))


def _atomic_savez(path: Path, **arrays) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        replace_atomically(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _one_simulation(spec, method, j, *, seed, sizes, hyper, options, simulator, thin, var_names):
    """Simulate, fit, and count: the arrays stored in sim_<j>.npz."""
    from inference import NonFiniteError

    s = _sim_seed(seed, j)
    base, spec_truth = spec.simulate(s, **sizes)
    sim = None
    if simulator in ("model", "auto"):
        sim = _model_simulation(spec, base, hyper, s + 1)
        if sim is None and simulator == "model":
            raise ValueError(f"simulator: model {spec.name!r} cannot simulate its data from the NumPyro model "
                             f"(likelihood sites {list(spec.likelihood_sites)} must be sample sites named like "
                             f"data fields); use simulator='spec'")
    if sim is None:
        data, truth = base, {k: np.asarray(v) for k, v in spec_truth.items()}
        used = "spec"
    else:
        (data, truth), used = sim, "model"
    latent = _latent_names(spec, data, hyper)
    try:
        draws, kind = _fit_draws(spec, method, data, hyper, options, _sim_seed(seed + 7919, j))
    except NonFiniteError as exc:
        return {"__failed__": np.array(str(exc)), "__simulator__": np.array(used)}
    names = [n for n in latent if n in draws and n in truth and np.shape(truth[n]) == draws[n].shape[2:]]
    true_c = _compared(spec, {n: truth[n] for n in names}, data, hyper, None)
    draw_c = _compared(spec, {n: draws[n] for n in names}, data, hyper, draws[names[0]].shape[:2] if names else None)
    keep = [k for k in true_c if k in draw_c and (var_names is None or k in var_names)]
    if not keep:
        raise ValueError(f"sbc: no latent quantity of {spec.name!r} is both simulated and returned by method "
                         f"{method!r} (simulated {sorted(truth)}, drawn {sorted(draws)})")
    t = thin if thin is not None else (_auto_thin({k: draw_c[k] for k in keep}) if kind == "sampler" else 1)
    out = {"__simulator__": np.array(used), "__thin__": np.array(t)}
    for k in keep:
        x = np.asarray(draw_c[k], dtype=float)
        x_thin = x[:, ::t]
        truth_k = np.asarray(true_c[k], dtype=float)[0, 0]
        flat_all = x.reshape((-1,) + x.shape[2:])
        flat_thin = x_thin.reshape((-1,) + x.shape[2:])
        out[f"{k}::less"] = (flat_thin < truth_k).sum(0)
        out[f"{k}::equal"] = (flat_thin == truth_k).sum(0)
        out[f"{k}::L"] = np.array(flat_thin.shape[0])
        out[f"{k}::less_all"] = (flat_all < truth_k).sum(0)
        out[f"{k}::equal_all"] = (flat_all == truth_k).sum(0)
        out[f"{k}::N"] = np.array(flat_all.shape[0])
        out[f"{k}::truth"] = truth_k
    return out


def run_simulations(name: str | zoo.ModelSpec, method: str, *, n_sims: int, seed: int,
                    sizes: Mapping[str, Any] | None = None, thin: int | None = None, simulator: str = "auto",
                    var_names: Sequence[str] | None = None, directory: str | os.PathLike | None = None,
                    progress: bool | None = None, **options: Any) -> tuple[Path, list[dict]]:
    """Run (or resume) ``n_sims`` simulations and return (directory, per-simulation records)."""
    from tqdm.auto import tqdm

    from inference.api import resolve
    from inference.progress import progress_enabled

    spec = zoo.get(name)
    if isinstance(n_sims, bool) or not isinstance(n_sims, int) or n_sims < 2:
        raise ValueError(f"n_sims: expected an integer >= 2, got {n_sims!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    if simulator not in ("auto", "model", "spec"):
        raise ValueError(f"simulator: expected 'auto', 'model' or 'spec', got {simulator!r}")
    if thin is not None and (not isinstance(thin, int) or thin < 1):
        raise ValueError(f"thin: expected a positive integer or None (automatic), got {thin!r}")
    sizes = dict(spec.settings.demo_sizes if sizes is None else sizes)
    _, _, hyper, _ = resolve(spec, method, {**options, "progress": False})  # a bad method or option fails now
    method_opts = {k: v for k, v in options.items() if k not in spec.hyperparameters}
    args = {"model": spec.name, "method": method, "seed": seed, "sizes": sizes, "hyper": hyper,
            "options": method_opts, "thin": thin, "simulator": simulator,
            "var_names": None if var_names is None else list(var_names)}
    key = hashlib.sha256(json.dumps(args, sort_keys=True, default=repr).encode()).hexdigest()[:12]
    directory = Path(directory) if directory is not None else default_directory() / f"{spec.name}__{method}__{key}"
    directory.mkdir(parents=True, exist_ok=True)
    args_file = directory / "args.json"
    if args_file.is_file():
        stored = json.loads(args_file.read_text())
        if stored != json.loads(json.dumps(args, sort_keys=True, default=repr)):
            raise ValueError(f"directory: {str(directory)!r} holds simulations run with other arguments "
                             f"({stored}); use another directory")
    else:
        args_file.write_text(json.dumps(args, sort_keys=True, default=repr, indent=1))
    todo = [j for j in range(n_sims) if not (directory / f"sim_{j:05d}.npz").is_file()]
    bar = tqdm(total=n_sims, initial=n_sims - len(todo), desc=f"SBC {spec.name}/{method}",
               disable=not progress_enabled(progress), leave=False)
    for j in todo:
        record = _one_simulation(spec, method, j, seed=seed, sizes=sizes, hyper=hyper, options=method_opts,
                                 simulator=simulator, thin=thin, var_names=var_names)
        _atomic_savez(directory / f"sim_{j:05d}.npz", **record)
        bar.update(1)
    bar.close()
    records = []
    for j in range(n_sims):
        with np.load(directory / f"sim_{j:05d}.npz") as f:
            records.append({k: f[k] for k in f.files})
    return directory, records


def _collect(records: list[dict], kind: str, seed: int) -> tuple[xr.DataTree, int]:
    ok = [r for r in records if "__failed__" not in r]
    failed = len(records) - len(ok)
    if not ok:
        raise RuntimeError("sbc: every simulation's fit failed")
    names = list(dict.fromkeys(k.split("::")[0] for k in ok[0] if "::" in k))
    rng = np.random.default_rng([seed, 1])
    pit, raw = {}, {}
    for n in names:
        less = np.stack([r[f"{n}::less" if kind == "sbc" else f"{n}::less_all"] for r in ok])
        equal = np.stack([r[f"{n}::equal" if kind == "sbc" else f"{n}::equal_all"] for r in ok])
        total = np.stack([np.broadcast_to(r[f"{n}::L" if kind == "sbc" else f"{n}::N"], less.shape[1:]) for r in ok])
        if kind == "sbc":  # randomised rank among L draws -> U(0, 1) under calibration
            values = (less + rng.uniform(size=less.shape) * (equal + 1)) / (total + 1)
        else:  # VSBC: p_j = Pr_q(theta < theta~), ties split evenly
            values = (less + 0.5 * equal) / total
        dims = ["chain", "draw"] + [f"{n}_dim_{i}" for i in range(values.ndim - 1)]
        pit[n] = (dims, values[None])
        raw[f"{n}_less"] = (dims, less[None])
        raw[f"{n}_total"] = (dims, total[None])
        raw[f"{n}_truth"] = (dims, np.stack([r[f"{n}::truth"] for r in ok])[None])
    def with_coords(ds):
        return ds.assign_coords({d: np.arange(n) for d, n in ds.sizes.items()})

    tree = xr.DataTree.from_dict({"prior_sbc": with_coords(xr.Dataset(pit)), "sbc_ranks": with_coords(xr.Dataset(raw))})
    return tree, failed


def _labels(da: xr.DataArray) -> list[tuple[str, np.ndarray]]:
    values = np.asarray(da.values[0])  # (sims, *rest)
    rest = values.shape[1:]
    flat = values.reshape(values.shape[0], -1)
    out = []
    for j in range(flat.shape[1]):
        idx = np.unravel_index(j, rest) if rest else ()
        out.append((da.name + (f"[{','.join(map(str, idx))}]" if rest else ""), flat[:, j]))
    return out


def _sbc_reading(u: np.ndarray, flagged: bool) -> str:
    if not flagged:
        return "ranks look uniform"
    m, s = float(np.mean(u)), float(np.std(u))
    parts = []
    if abs(m - 0.5) > 2 * PIT_SD / np.sqrt(len(u)):
        parts.append("the truth sits mostly " + ("above" if m > 0.5 else "below") + " the posterior draws: "
                     "the posterior is biased " + ("low" if m > 0.5 else "high"))
    if s < PIT_SD * 0.9:
        parts.append("ranks pile up in the middle: the posterior is too wide (underconfident)")
    elif s > PIT_SD * 1.1:
        parts.append("ranks pile up at the ends: the posterior is too narrow (overconfident)")
    return "; ".join(parts) or "ranks are not uniform"


def sbc(name: str | zoo.ModelSpec, method: str, *, n_sims: int, seed: int, alpha: float = 0.01,
        sizes: Mapping[str, Any] | None = None, thin: int | None = None, simulator: str = "auto",
        var_names: Sequence[str] | None = None, directory: str | os.PathLike | None = None,
        progress: bool | None = None, **options: Any) -> SBCResult:
    """Simulation-based calibration of ``method`` on model ``name`` (see the module docstring).

    Parameters
    ----------
    n_sims:
        number of simulated datasets (100-1000 typical; the ECDF band narrows as 1/sqrt(n_sims)).
    seed:
        seeds every simulation and fit (simulation j uses seeds derived from (seed, j)).
    alpha:
        family-wise level of the uniformity tests (Bonferroni over scalar quantities).
    sizes:
        simulator sizes (default: ``spec.settings.demo_sizes``).
    thin:
        keep every ``thin``-th draw before ranking; default: automatic for samplers (total draws /
        smallest bulk ESS), none for variational methods (independent draws).
    simulator:
        "auto", "model" or "spec" (module docstring).
    var_names:
        restrict to these latent quantities.
    directory:
        where per-simulation files go (default: a cache directory named by the arguments).
    progress:
        progress bar (default: when stderr is a terminal).
    options:
        the method's options and the model's hyperparameters (as for ``inference.fit``).
    """
    directory, records = run_simulations(name, method, n_sims=n_sims, seed=seed, sizes=sizes, thin=thin,
                                         simulator=simulator, var_names=var_names, directory=directory,
                                         progress=progress, **options)
    import arviz_stats  # noqa: F401  (registers the .azstats accessor)

    tree, failed = _collect(records, "sbc", seed)
    ds = tree["prior_sbc"].to_dataset()
    pvals = ds.azstats.uniformity_test(dim=["chain", "draw"], method="pot_c")[0]
    rows = []
    for var in ds.data_vars:
        p_flat = np.asarray(pvals[var].values).reshape(-1)
        for (label, u), p in zip(_labels(ds[var]), p_flat, strict=True):
            rows.append({"parameter": label, "n_sims": len(u), "p_value": float(p),
                         "pit_mean": float(np.mean(u)), "pit_sd": float(np.std(u))})
    return _finish("sbc", name, method, tree, rows, alpha, failed, directory)


def vsbc(name: str | zoo.ModelSpec, method: str, *, n_sims: int, seed: int, alpha: float = 0.01,
         sizes: Mapping[str, Any] | None = None, simulator: str = "auto",
         var_names: Sequence[str] | None = None, directory: str | os.PathLike | None = None,
         progress: bool | None = None, **options: Any) -> SBCResult:
    """Yao et al. (2018) VSBC of a variational ``method``: is the approximation's point estimate
    unbiased? p_j = Pr_q(theta < theta~_j) per simulation, KS test of {p_j} against {1 - p_j}.
    Arguments as for ``sbc`` (no thinning: every draw of q is used)."""
    from scipy import stats

    directory, records = run_simulations(name, method, n_sims=n_sims, seed=seed, sizes=sizes, thin=None,
                                         simulator=simulator, var_names=var_names, directory=directory,
                                         progress=progress, **options)
    tree, failed = _collect(records, "vsbc", seed)
    ds = tree["prior_sbc"].to_dataset()
    rows = []
    for var in ds.data_vars:
        for label, p in _labels(ds[var]):
            test = stats.ks_2samp(p, 1 - p)
            rows.append({"parameter": label, "n_sims": len(p), "p_value": float(test.pvalue),
                         "ks_statistic": float(test.statistic), "pit_mean": float(np.mean(p)),
                         "pit_sd": float(np.std(p))})
    return _finish("vsbc", name, method, tree, rows, alpha, failed, directory)


def _finish(kind, name, method, tree, rows, alpha, failed, directory) -> SBCResult:
    table = pd.DataFrame(rows)
    m = max(len(table), 1)
    table["flagged"] = table["p_value"] < alpha / m
    if kind == "sbc":
        ds = tree["prior_sbc"].to_dataset()
        values = dict(lab_u for var in ds.data_vars for lab_u in _labels(ds[var]))
        table["reading"] = [_sbc_reading(values[p], f) for p, f in zip(table["parameter"], table["flagged"],
                                                                         strict=True)]
    else:
        table["reading"] = [
            ("symmetric: no sign of bias" if not f else
             f"asymmetric: the truth is mostly {'above' if mean > 0.5 else 'below'} the approximation "
             f"(it is biased {'low' if mean > 0.5 else 'high'})")
            for f, mean in zip(table["flagged"], table["pit_mean"], strict=True)]
    spec = zoo.get(name)
    tree.attrs.update({"model": spec.name, "method": method, "kind": kind, "alpha": alpha, "n_failed": failed,
                       "directory": str(directory)})
    return SBCResult(kind=kind, model=spec.name, method=method, tree=tree, table=table,
                     passed=not bool(table["flagged"].any()), alpha=alpha, n_failed=failed, directory=directory)
