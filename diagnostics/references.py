"""Stored reference posteriors (what posteriordb does for Stan, done for this zoo).

A stored reference is one netCDF DataTree in ``zoo/references/<model>__<tag>.nc`` holding a long NUTS run
**and the exact data arrays it was computed on** (its ``observed_data`` and ``constant_data`` groups),
plus its validation record (``attrs["validation"]``, ``diagnostics.health.mcmc_health``), stored compact
(``compact``: the draws of what is compared, the health rule's statistics, the data, the record). Nothing is
re-simulated to find it: ``zoo compare``, ``zoo demo``, tests and notebooks fit on the stored arrays
(``reference_data``), so a reference made on one CPU is found on any other, whatever last bits that
machine's BLAS/LAPACK would give a re-simulation.

* ``reference_data(name, tag)``: the stored arrays (what to fit on) and the tag;
* ``load(name, data=None, tag=None)``: the stored tree, and with ``data`` only if the stored arrays match
  it (same keys and shapes, equal indices, floats equal to ``MATCH_RTOL`` = 1e-12 relative, NaN at the same
  places): user data that went through other rounding still finds its reference, other data does not;
* ``generate(name, data, tag)``: runs the reference fit (NUTS, or with ``method`` another exact sampler: the
  comparison on a user's data tries the model's ``reference_samplers`` in order), thins it evenly to its
  ``stored_draws`` (``MAX_DRAWS`` = 4000 unless its options raise it), validates it and stores it with its
  record, or refuses (``UnhealthyReference``, naming each failed quantity, why, and what to try); with a
  ``budget`` a run short of the standard only for want of draws is run again longer (``want_of_draws``);
* ``verify(tree)``: recomputes a stored reference's health from its stored draws and checks its record;
* ``check_log_density(tree)``: every site and log p(theta, y) stored at three draws per chain (``check_points``)
  double as a model-identity check (a model changed without regenerating its reference fails it).

The standard (posteriordb's, made stricter; ``diagnostics.health``): at least 4 chains and 4,000 stored draws;
rank-normalised R-hat < 1.01 and bulk and tail ESS >= 400 on every compared quantity; no divergence (counted
over the whole run, thinned-out iterations included) and E-BFMI > 0.3; a second independent NUTS run (seed +
1) whose compared means agree with the reference's within 4 combined Monte Carlo standard errors; and, for
models whose spec names a second exact sampler (``reference_crosscheck``: the collapsed Gibbs kernels of
hlcr and gp_alps, where NUTS faces label switching or near-discrete switches), agreement with a long run
of it (seed + 2) by the same rule. The record (``attrs["validation"]``, JSON) holds the health numbers, the
run settings, the seeds, the package versions, the NUTS reformulation used, the second run's and the
cross-check's compared means, MCSEs and largest ``|z|``, and the wall time of each run; also the
sampler that made it (``method``), every cross-check (``crosschecks``: whether its own run was healthy enough to
be used, and whether it agrees) and the extension (``extension``: budget, runs, outcome); ``provenance(record)``
says it in sentences.

``generate`` is resumable: each finished run is checkpointed under ``zoo/references/.work/<model>__<tag>/``
(with the settings it was made with) and reused when the same reference is asked for again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

import zoo
from diagnostics.health import TAIL_PROBS
from inference import fit, log_densities, save
from inference import load as load_tree
from inference.trees import data_of, problem_of
from zoo._registry import REAL_TAG
from zoo._validation import validate_data

REFERENCE_DIR = Path(zoo.__file__).resolve().parent / "references"
MAX_DRAWS = 4000                # the draws a reference keeps unless its options say ``stored_draws``
STORED_DRAWS = "stored_draws"   # the reference option of how many evenly spaced draws it keeps (default MAX_DRAWS)
DEFAULT_NUTS = {"num_warmup": 1000, "num_samples": 1000, "num_chains": 4}
MATCH_RTOL = 1e-12
CHECK_GROUP = "model_check"     # every site at a few draws per chain and log p(theta, y) there (check_log_density)
HEALTH_STATS = ("diverging", "divergences_run", "ebfmi_run")   # the sample stats the health rule reads
STORED_ENCODING = {"zlib": True, "complevel": 9, "shuffle": True}
STORED_MANTISSA_BITS = 28       # posterior draws rounded to 29 significant bits: relative error <= 2**-29 (1.9e-9)
SECOND_SEED_OFFSET = 1
CROSSCHECK_SEED_OFFSET = 2


class UnhealthyReference(RuntimeError):
    """``generate`` refused to store a reference: ``record`` is its validation record (``failures`` name each
    failed quantity and why, ``advice`` what to try)."""

    def __init__(self, message: str, record: dict):
        super().__init__(message)
        self.record = record


def data_checksum(spec: zoo.ModelSpec, data: Mapping[str, Any]) -> str:
    """sha256 of the validated data arrays (keys, dtypes, shapes and bytes), order-independent.

    A cache key for results computed on the *same stored arrays* (e.g. a rerun of ``zoo demo`` reusing its
    fits); never a key for data that is re-simulated, whose last bits depend on the CPU."""
    clean = validate_data(spec, data)
    h = hashlib.sha256()
    for k in sorted(clean):
        a = np.ascontiguousarray(clean[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def data_mismatch(spec: zoo.ModelSpec, stored: Mapping[str, Any], given: Mapping[str, Any],
                  rtol: float = MATCH_RTOL) -> str | None:
    """Why ``given`` is not the data ``stored`` (a sentence), or None when they match: same fields and shapes,
    integer fields equal, float fields equal to ``rtol`` relative to the field's largest magnitude, NaN at the
    same places. Tolerant to last-bit differences of a re-simulation on another CPU, nothing more."""
    a, b = validate_data(spec, stored), validate_data(spec, given)
    if set(a) != set(b):
        return f"fields differ: stored {sorted(a)}, given {sorted(b)}"
    for k in sorted(a):
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.shape != y.shape:
            return f"{k}: shape {y.shape}, stored {x.shape}"
        if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(y.dtype, np.floating):
            if not np.array_equal(x, y):
                return f"{k}: {int(np.sum(x != y))} values differ"
            continue
        x, y = x.astype(float), y.astype(float)
        if not np.array_equal(np.isnan(x), np.isnan(y)):
            return f"{k}: missing values at other places"
        ok = ~np.isnan(x)
        scale = float(np.max(np.abs(x[ok]))) if ok.any() else 0.0
        diff = float(np.max(np.abs(x[ok] - y[ok]))) if ok.any() else 0.0
        if diff > rtol * scale:
            return f"{k}: values differ by up to {diff:.3g} (allowed {rtol:g} x {scale:.3g})"
    return None


def reference_path(name: str, tag: str = "default") -> Path:
    return REFERENCE_DIR / f"{name}__{tag}.nc"


def stored_tags(name: str) -> list[str]:
    """Tags of the stored references of model ``name``: ``default`` first, those of real datasets
    (``real_<dataset>``, ``ModelSpec.reference_sets``) last."""
    tags = sorted(p.name[len(name) + 2:-3] for p in REFERENCE_DIR.glob(f"{name}__*.nc"))
    return sorted(tags, key=lambda t: (t != "default", t.startswith(REAL_TAG)))


def _thin(tree: xr.DataTree, max_draws: int) -> xr.DataTree:
    """Keep ``max_draws // n_chain`` evenly spaced draws per chain (the last of each stride), in every per-draw
    group; ``sample_stats`` gains the whole run's ``divergences_run`` and ``ebfmi_run`` first
    (``diagnostics.health.run_totals``), so no divergence is thinned away."""
    from diagnostics.health import run_totals

    n_chain, n_draw = tree["posterior"].sizes["chain"], tree["posterior"].sizes["draw"]
    keep = max(1, max_draws // n_chain)
    totals = run_totals(tree)
    out = tree.copy()
    if n_draw > keep:
        step = n_draw // keep
        index = slice(n_draw - keep * step + step - 1, None, step)
        for group in ("posterior", "log_likelihood", "log_prior", "sample_stats"):
            if group not in tree.children:
                continue
            ds = tree[group].to_dataset()
            per_draw = [k for k in ds.data_vars if "draw" in ds[k].dims]
            if not per_draw:
                continue
            thinned = ds[per_draw].isel(draw=index).assign_coords(draw=np.arange(keep))
            out[group] = xr.DataTree(xr.merge([thinned, ds.drop_vars(per_draw).drop_dims("draw", errors="ignore")]))
    stats = out["sample_stats"].to_dataset()
    out["sample_stats"] = xr.DataTree(xr.merge([stats.drop_vars(list(totals.data_vars), errors="ignore"), totals]))
    out["sample_stats"].attrs.update(tree["sample_stats"].attrs)
    out["posterior"].attrs.update(tree["posterior"].attrs)
    return out


def compared_sites(tree: xr.DataTree) -> list[str]:
    """The posterior variables the compared quantities are computed from (``compared_posterior``): every variable
    of a model without summaries; for one with summaries, each variable without which the summaries come out
    different or not at all (bpca's per-row latents ``z``, for instance, enter none of them)."""
    from diagnostics.quantities import compared_posterior

    post = tree["posterior"].to_dataset()
    names = list(map(str, post.data_vars))
    spec = zoo.get(tree.attrs["model"])
    if spec.summaries is None:
        return names
    full = compared_posterior(tree)
    needed = []
    for name in names:
        trial = tree.copy()
        trial["posterior"] = xr.DataTree(post.drop_vars(name))
        try:
            got = compared_posterior(trial)
            same = set(got.data_vars) == set(full.data_vars) and all(
                got[k].shape == full[k].shape and np.array_equal(got[k].values, full[k].values, equal_nan=True)
                for k in full.data_vars)
        except Exception:       # noqa: BLE001  (the summaries need it: whatever they raise without it)
            same = False
        if not same:
            needed.append(name)
    return needed


def round_mantissa(values: np.ndarray, bits: int = STORED_MANTISSA_BITS) -> np.ndarray:
    """float64 ``values`` rounded to ``bits`` explicit mantissa bits (to nearest, ties away from zero; the bit
    rounding of netCDF-C's ``quantize``, Kloewer et al. 2021): the dropped low bits become zeros, which zlib with
    byte shuffle stores almost for free. Relative error at most 2**-(bits + 1) for normal numbers; NaN, +-inf and
    a value that would round beyond the largest float unchanged; rounding twice is rounding once."""
    a = np.ascontiguousarray(values, dtype=np.float64)
    if not 0 < bits < 52:
        raise ValueError(f"bits: expected 1..51 mantissa bits to keep, got {bits!r}")
    drop = np.uint64(52 - bits)
    raw = a.view(np.uint64)
    rounded = ((raw + (np.uint64(1) << (drop - np.uint64(1)))) >> drop << drop).view(np.float64)
    return np.where(np.isfinite(rounded), rounded, a)


def check_draws(n_draw: int) -> list[int]:
    """The draws of each chain kept for the model-identity check: the first, the middle and the last."""
    return sorted({0, n_draw // 2, n_draw - 1})


def check_points(tree: xr.DataTree) -> tuple[xr.Dataset, xr.DataArray]:
    """(every sampled site at the model-check draws, dims (chain, draw, ...) with the draws' positions in the run
    as the ``draw`` coordinate; log p(theta, y) there, (chain, draw)): from the ``CHECK_GROUP`` group of a compact
    reference, else from the ``posterior``, ``log_prior`` and ``log_likelihood`` groups of a full tree."""
    if CHECK_GROUP in tree.children:
        ds = tree[CHECK_GROUP].to_dataset()
        return ds.drop_vars("log_joint"), ds["log_joint"]
    post = tree["posterior"].to_dataset()
    pick = {"draw": check_draws(post.sizes["draw"])}
    total = 0.0
    for group in ("log_prior", "log_likelihood"):
        if group not in tree.children:
            raise ValueError(f"tree: has neither a {CHECK_GROUP!r} group nor a {group!r} group to check the model "
                             f"against")
        for da in tree[group].to_dataset().data_vars.values():
            total = total + da.isel(pick).sum([d for d in da.dims if d not in ("chain", "draw")])
    draws = post.isel(pick)
    log_joint = xr.DataArray(np.asarray(total.transpose("chain", "draw").values, dtype=np.float64),
                             dims=("chain", "draw"), coords={"chain": draws["chain"].values,
                                                              "draw": draws["draw"].values})
    return draws, log_joint


def compact(tree: xr.DataTree) -> xr.DataTree:
    """The stored form of a reference: what the comparison and the health record read, losslessly compressed.

    Kept: the ``compared_sites`` of the posterior with all their draws (float64, rounded to
    ``STORED_MANTISSA_BITS`` by ``round_mantissa``: a relative change of at most 1.9e-9, seven orders of magnitude
    below a reference's Monte Carlo error (~1e-2 sd), that changes no health figure or verdict; the three zeroed
    low bytes of each draw cost zlib nearly nothing, so the draws take about 5 of their 8 bytes); of
    ``sample_stats`` the per-draw ``diverging`` flags and the whole run's ``divergences_run``/``ebfmi_run``
    (``HEALTH_STATS``; ``energy`` too when there is no ``ebfmi_run``); the data groups; every attribute (the
    validation record). Dropped: the pointwise ``log_likelihood`` and ``log_prior`` at every draw, sites the
    compared quantities do not read (per-row latents) and the sampler's other statistics; what a caller needs of
    them is recomputed from the model (``inference.log_densities``). In their place the ``CHECK_GROUP`` group
    holds every site at ``check_draws`` of each chain and log p(theta, y) there (``check_points``), for the
    model-identity check ``check_log_density``. Every array is written with zlib level 9 and byte shuffle
    (``STORED_ENCODING``). A tree that is compact already keeps its content, its draws rounded to
    ``STORED_MANTISSA_BITS`` (a no-op when they were stored at these bits or fewer: rounding twice is rounding
    once), so that compacting a reference stored at more bits stores it at today's."""
    tree = tree.copy(deep=True)     # the encodings set below stay off the caller's arrays
    if CHECK_GROUP in tree.children:
        out = tree
        post = out["posterior"].to_dataset()
        bits = min(int(post.attrs.get("stored_mantissa_bits", STORED_MANTISSA_BITS)), STORED_MANTISSA_BITS)
        post = post.copy(data={k: round_mantissa(v.values, bits) if v.dtype == np.float64 else v.values
                               for k, v in post.data_vars.items()})
        out["posterior"] = xr.DataTree(post)
        out["posterior"].attrs.update({**tree["posterior"].attrs, "stored_mantissa_bits": bits})
    else:
        draws, log_joint = check_points(tree)
        check = draws.assign(log_joint=log_joint)
        check.attrs = {}
        keep = compared_sites(tree)
        out = tree.copy()
        for group in ("log_prior", "log_likelihood"):
            if group in out.children:
                del out[group]
        post = tree["posterior"].to_dataset()[keep]
        post = post.copy(data={k: round_mantissa(v.values) if v.dtype == np.float64 else v.values
                               for k, v in post.data_vars.items()})
        out["posterior"] = xr.DataTree(post)
        out["posterior"].attrs.update({**tree["posterior"].attrs, "stored_mantissa_bits": STORED_MANTISSA_BITS})
        if "sample_stats" in tree.children:
            stats = tree["sample_stats"].to_dataset()
            names = [k for k in HEALTH_STATS if k in stats]
            if "energy" in stats and "ebfmi_run" not in stats:
                names.append("energy")
            out["sample_stats"] = xr.DataTree(stats[names])
            out["sample_stats"].attrs.update(tree["sample_stats"].attrs)
        out[CHECK_GROUP] = xr.DataTree(check)
    for node in out.subtree:
        for var in node.to_dataset(inherit=False).data_vars.values():
            var.encoding = {}
        for name in node.data_vars:
            node[name].encoding = dict(STORED_ENCODING)
    return out


def _thinning_option(opts: dict[str, Any]) -> dict[str, Any]:
    """``opts`` without ``thinning`` (a reference runs unthinned and is thinned after the run, so that its
    divergences are counted on every iteration; ``ValueError`` for one other than 1) and with ``stored_draws``
    checked (``ValueError`` unless a positive integer)."""
    if opts.get("thinning", 1) != 1:
        raise ValueError(f"thinning: a reference runs unthinned and keeps {stored_draws(opts)} evenly spaced draws; "
                         f"got thinning={opts['thinning']!r} (drop it, raise num_samples instead)")
    opts.pop("thinning", None)
    n = opts.get(STORED_DRAWS, MAX_DRAWS)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{STORED_DRAWS}: the number of draws a reference keeps must be a positive integer, got "
                         f"{n!r}")
    return opts


def stored_draws(options: Mapping[str, Any]) -> int:
    """How many evenly spaced draws (all chains) a reference run with ``options`` keeps: ``options["stored_draws"]``,
    default ``MAX_DRAWS``. A longer reference (a Monte Carlo error of the reference well below what it judges: the
    cost-accuracy ladders' top rungs) raises both ``num_samples`` and ``stored_draws``."""
    return int(options.get(STORED_DRAWS, MAX_DRAWS))


def fit_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a reference run that ``inference.fit`` takes: ``options`` without ``stored_draws``."""
    return {k: v for k, v in options.items() if k != STORED_DRAWS}


def reference_settings(name: str, **options: Any) -> dict[str, Any]:
    """The NUTS options and hyperparameters of a reference of ``name``: ``DEFAULT_NUTS`` < the NUTS options of
    ``spec.settings.reference_options`` < ``options``. Hyperparameters come from ``options`` only (unset ones are
    the model's ``Hyper`` defaults, as for ``inference.fit``): those in ``spec.settings.reference_options`` belong
    to the stored reference of the model's own data, which ``make references`` passes explicitly
    (``ModelSpec.reference_sets``), and never reach a reference made on other data. ``stored_draws`` (kept in
    the settings) says how many draws it keeps (``stored_draws``). Raises ``ValueError`` for NUTS thinning (a
    reference is thinned after the run, so that its divergences are counted on every iteration) and for a
    ``stored_draws`` that is not a positive integer."""
    spec = zoo.get(name)
    nuts = {k: v for k, v in spec.settings.reference_options.items() if k not in spec.hyperparameters}
    return _thinning_option({**DEFAULT_NUTS, **nuts, **options})


def _split(spec: zoo.ModelSpec, options: Mapping[str, Any]) -> tuple[dict, dict]:
    """(hyperparameters, method options) of ``options``."""
    hyper = {k: v for k, v in options.items() if k in spec.hyperparameters}
    return hyper, {k: v for k, v in options.items() if k not in spec.hyperparameters}


def _stamp(name: str, tag: str, seed: int, options: Mapping[str, Any], crosscheck) -> str:
    return json.dumps({"model": name, "tag": tag, "seed": seed, "options": options, "crosscheck": crosscheck},
                      sort_keys=True, default=repr)


def work_dir(name: str, tag: str) -> Path:
    """Where ``generate`` checkpoints the runs of reference ``name``/``tag`` (removed once it is stored)."""
    return REFERENCE_DIR / ".work" / f"{name}__{tag}"


def _checkpointed(path: Path, stamp: str, data, spec, run, log, what: str) -> tuple[xr.DataTree, bool]:
    """The tree checkpointed at ``path`` when it was made with ``stamp`` on ``data``, else ``run()`` (saved
    there). Returns (tree, reused)."""
    if path.is_file():
        tree = load_tree(path)
        if tree.attrs.get("reference_stamp") == stamp and data_mismatch(spec, data_of(tree), data) is None:
            log(f"{what}: reusing the finished run in {path}")
            return tree, True
    t0 = time.time()
    tree = run()
    tree.attrs["reference_stamp"] = stamp
    tree.attrs["wall_seconds"] = time.time() - t0
    save(tree, path)
    return tree, False


def _summary(record: dict) -> dict:
    keys = ("n_chains", "n_draws", "max_rhat", "worst_rhat", "min_ess_bulk", "worst_ess_bulk", "min_ess_tail",
            "worst_ess_tail", "divergences", "min_ebfmi", "failures", "reliable")
    return {**{k: record[k] for k in keys}, "tail_ess_probs": list(TAIL_PROBS)}


def advice(record: dict) -> list[str]:
    """What to try for each kind of failure in a validation record (one line each)."""
    out = []
    settings = record.get("settings", {})
    fails = " ".join(record.get("failures", []))
    if "chains" in fails or "stored draws" in fails:
        out.append("at least 4 chains of at least 1000 draws each: raise num_chains / num_samples")
    ess = min(record.get("min_ess_bulk", np.inf), record.get("min_ess_tail", np.inf))
    if "ESS" in fails or "R-hat" in fails:
        factor = max(2.0, 1.5 * 400 / ess) if np.isfinite(ess) and ess > 0 else 4.0
        out.append(f"run longer: num_samples x {factor:.1f} (now {settings.get('num_samples')}), more warm-up "
                   f"(num_warmup, now {settings.get('num_warmup')}); if R-hat stays high the chains sit in "
                   f"different modes: reparameterise (ModelSpec.nuts_reformulation) or use an exact sampler")
    if "divergent" in fails:
        out.append(f"divergences mean NUTS cannot follow the geometry: an exact reformulation (non-centred "
                   f"scales, integrate sites out, fold a symmetry) first; then target_accept_prob (now "
                   f"{settings.get('target_accept_prob', 'the default')}) towards 0.99, dense_mass=True")
    if "E-BFMI" in fails:
        out.append("low E-BFMI: heavy tails or a funnel in the energy; reparameterise the scale parameters")
    if "second seed" in fails:
        out.append("the second seed disagrees: the chains do not explore the same posterior (multimodality or "
                   "too short a run); run longer, or validate against an exact sampler")
    if "cross-check" in fails:
        out.append("the reference sampler and an exact cross-check sampler disagree: one of them misses part of the "
                   "posterior; run both longer and look at the named quantity's trace")
    return out


EXTEND_RHAT_MAX = 1.1   # above: the chains sit in different regions (stuck), more draws of the same run won't help
EXTEND_MIN_FACTOR = 1.5  # an extension at least multiplies the draws by this


def sampler_settings(name: str, method: str = "nuts", **options: Any) -> dict[str, Any]:
    """The options of a reference run of ``name`` by ``method``: NUTS as ``reference_settings``; another exact
    sampler: ``options`` (its own options over its defaults, and hyperparameters: unset ones are the model's
    ``Hyper`` defaults, as for ``reference_settings``), ``stored_draws`` included. ``ValueError`` for thinning (a
    reference runs unthinned and is thinned after the run) and a ``stored_draws`` that is not a positive
    integer."""
    if method == "nuts":
        return reference_settings(name, **options)
    return _thinning_option(dict(options))


def want_of_draws(health: dict) -> bool:
    """Whether a run fails the health rule only for want of draws: every failure is R-hat, ESS or the number of
    stored draws, with enough chains, no divergence, E-BFMI fine, every R-hat and ESS finite and the largest
    R-hat below ``EXTEND_RHAT_MAX`` (above it the chains sit in different regions: stuck, not short)."""
    fails = health["failures"]
    if not fails:
        return False
    short = all(f.startswith(("R-hat", "bulk ESS", "tail ESS")) or "stored draws" in f for f in fails)
    finite = all(np.isfinite(health[k]) for k in ("max_rhat", "min_ess_bulk", "min_ess_tail"))
    return (short and finite and health["max_rhat"] < EXTEND_RHAT_MAX and health["divergences"] == 0
            and health["n_chains"] >= health["rule"]["min_chains"])


def extension_factor(health: dict) -> float:
    """How many times more draws a run short for want of draws needs (``diagnostics.scoring``'s rule: ESS
    grows with the draws, R-hat^2 - 1 shrinks as 1 / draws, a margin of 1.25 for the noise of the ESS estimate),
    at least ``EXTEND_MIN_FACTOR``."""
    from diagnostics.scoring import RUN_MARGIN

    rule = health["rule"]
    ess = min(health["min_ess_bulk"], health["min_ess_tail"])
    factors = [EXTEND_MIN_FACTOR, rule["min_draws"] / max(health["n_draws"], 1)]
    if ess < rule["ess_min"]:
        factors.append(RUN_MARGIN * rule["ess_min"] / max(ess, 1e-9))
    if not health["max_rhat"] < rule["rhat_max"]:
        factors.append(RUN_MARGIN * (health["max_rhat"] ** 2 - 1) / (rule["rhat_max"] ** 2 - 1))
    return float(max(factors))


def _crosschecks(spec: zoo.ModelSpec, crosscheck: Any) -> list[tuple[str, dict]]:
    """``crosscheck`` as a list of ``(method, options)``: True the spec's ``reference_crosscheck``; None/False
    none; one pair; or a sequence of pairs."""
    if crosscheck is True:
        crosscheck = spec.settings.reference_crosscheck
    if not crosscheck:
        return []
    if isinstance(crosscheck[0], str):
        crosscheck = [crosscheck]
    return [(m, dict(o)) for m, o in crosscheck]


def generate(name: str, data: Mapping[str, Any] | None = None, *, tag: str = "default", seed: int = 0,
             path: str | Path | None = None, work: str | Path | None = None, progress: bool | None = None, log=None,
             crosscheck: Any = True, method: str = "nuts", budget: float | None = None,
             **options: Any) -> xr.DataTree:
    """Run, validate and store the reference posterior of ``name`` on ``data`` (module docstring); returns the
    stored tree. Raises ``UnhealthyReference`` (nothing stored; its ``tree`` is the last main run) when any check
    fails.

    ``method``: the exact sampler that makes it (default NUTS; ``ZooSettings.reference_samplers``) and its second
    seed. Options: its options and hyperparameters (``sampler_settings``). ``crosscheck``: True = the spec's
    ``reference_crosscheck``, None/False = none, ``(method, options)`` or a list of them: each is run once
    (seed + 2) and must agree with the reference where its own run is healthy (an unhealthy cross-check run is
    recorded and not used: it cannot judge). ``budget``: seconds; a main run and second seed that fail the
    health rule only for want of draws (``want_of_draws``) are run again with ``extension_factor`` times the draws
    while their runs so far took less than ``budget`` and the next is predicted to fit in it (None: judged once,
    as ``make references`` does); the record's ``extension`` says what happened. ``log``: a callable receiving
    progress lines (default: silent); ``progress``: NumPyro/kernel progress bars. ``path``: where to store it
    (default ``reference_path(name, tag)``); ``work``: where each finished run is checkpointed (default
    ``work_dir(name, tag)``), kept when the reference is refused.
    """
    from diagnostics.health import Z_MAX, agreement, mcmc_health
    from diagnostics.quantities import compared_posterior
    from inference.trees import package_versions

    spec = zoo.get(name)
    if data is None:
        data, _ = spec.default_data()
    log = log or (lambda line: None)
    opts = sampler_settings(name, method, **options)
    hyper, _ = _split(spec, opts)
    crosses = [(m, {**o, **hyper}) for m, o in _crosschecks(spec, crosscheck)]
    stamp = _stamp(name, tag, seed, {"method": method, **opts} if method != "nuts" else opts,
                   (crosses[0] if len(crosses) == 1 and crosscheck is True else crosses) or None)
    work = Path(work) if work is not None else work_dir(name, tag)
    n_runs = 2 + len(crosses)
    label = f"{name}/{tag}"

    def run_line(o):
        if method == "nuts":
            return (f"{o['num_chains']} chains x ({o['num_warmup']} warm-up + {o['num_samples']} draws), "
                    f"{stored_draws(o)} kept")
        return ", ".join(f"{k}={v}" for k, v in o.items() if k not in spec.hyperparameters)

    def fitted(m, s, o):
        return lambda: _thin(fit(spec, data, m, seed=s, progress=progress, **fit_options(o)), stored_draws(o))

    # ---- the main run and its second seed, run again longer while short only for want of draws (budget)
    attempts, run_opts, spent = [], dict(opts), 0.0
    while True:
        i = len(attempts)
        suffix = "" if i == 0 else f"_{i}"
        what = "" if i == 0 else f" (extension {i}: num_samples {run_opts['num_samples']})"
        log(f"{label} [1/{n_runs}] reference {method} run, seed {seed}, {run_line(run_opts)}{what}")
        st = stamp if i == 0 else _stamp(name, tag, seed, {"method": method, **run_opts}, "extension")
        main, _ = _checkpointed(work / f"main{suffix}.nc", st, data, spec, fitted(method, seed, run_opts), log,
                                f"{label} [1/{n_runs}]")
        ref_ds = compared_posterior(main)
        health = mcmc_health(main, ref_ds)
        log(f"{label} [1/{n_runs}] {_health_line(health)} ({main.attrs['wall_seconds']:.0f} s)")
        seed2 = seed + SECOND_SEED_OFFSET
        log(f"{label} [2/{n_runs}] second seed: {method}, seed {seed2}, {run_line(run_opts)}")
        second, _ = _checkpointed(work / f"second_seed{suffix}.nc", st, data, spec, fitted(method, seed2, run_opts),
                                  log, f"{label} [2/{n_runs}]")
        second_ds = compared_posterior(second)
        second_health = mcmc_health(second, second_ds)
        agree = agreement(ref_ds, second_ds)
        log(f"{label} [2/{n_runs}] {_health_line(second_health)}; max |z| {agree['max_abs_z']:.2f} on "
            f"{agree['worst']} ({second.attrs['wall_seconds']:.0f} s)")
        took = float(main.attrs["wall_seconds"]) + float(second.attrs["wall_seconds"])
        spent += took
        attempts.append({"num_samples": run_opts.get("num_samples"), "wall_seconds": took,
                         "max_rhat": max(health["max_rhat"], second_health["max_rhat"]),
                         "min_ess": min(health["min_ess_bulk"], health["min_ess_tail"],
                                        second_health["min_ess_bulk"], second_health["min_ess_tail"])})
        short = [h for h in (health, second_health) if h["failures"]]
        if not short:
            outcome = "not needed" if i == 0 else f"met the health rule after {i} extension(s), in {spent:.0f} s"
            break
        if budget is None:
            outcome = "not extended (no budget given)"
            break
        if not all(want_of_draws(h) for h in short) or "num_samples" not in run_opts:
            outcome = ("not extended: it fails for more than want of draws (stuck chains, divergences, too few "
                       "chains)")
            break
        factor = max(extension_factor(h) for h in short)
        n_next = int(np.ceil(round(run_opts["num_samples"] * factor, 6)))
        predicted = took * n_next / run_opts["num_samples"]
        if spent + predicted > budget:
            outcome = (f"stopped at the budget: {spent:.0f} s spent of {budget:.0f} s, and the next run "
                       f"(num_samples {n_next}, x{factor:.1f}) would take about {predicted:.0f} s")
            break
        log(f"{label} short of the health rule only for want of draws: running again with num_samples "
            f"{run_opts['num_samples']} -> {n_next} (x{factor:.1f}, about {predicted:.0f} s; budget {budget:.0f} s, "
            f"{spent:.0f} s spent)")
        run_opts = {**run_opts, "num_samples": n_next}
    log(f"{label} extension: {outcome}")

    record = {**health, "standard": {**health["rule"], "z_max": Z_MAX}, "tail_ess_probs": list(TAIL_PROBS)}
    failures = list(health["failures"])
    failures += [f"second seed: {f}" for f in second_health["failures"] + agree["failures"]]
    record["second_seed"] = {"method": method, "options": run_opts, "seed": seed2,
                             "health": _summary(second_health), "means": agree["means_b"], "mcse": agree["mcse_b"],
                             "z": agree["z"], "max_abs_z": agree["max_abs_z"], "worst": agree["worst"],
                             "n_quantities": agree["n_quantities"], "wall_seconds": second.attrs["wall_seconds"]}

    # ---- the cross-checks: other exact samplers, each used where its own run is healthy
    record["crosscheck"], record["crosschecks"] = None, {}
    if failures and crosscheck is not True:
        crosses = []        # refused already: no cross-check run (make references records its cross-check anyway)
    for i, (cmethod, copts) in enumerate(crosses, 3):
        step = f"{label} [{i}/{n_runs}]"
        cseed = seed + CROSSCHECK_SEED_OFFSET
        key = "crosscheck.nc" if len(crosses) == 1 and crosscheck is True else f"crosscheck_{cmethod}.nc"
        log(f"{step} cross-check {cmethod}, seed {cseed}, {copts}")
        tree, _ = _checkpointed(work / key, stamp, data, spec, fitted(cmethod, cseed, copts), log, step)
        ds = compared_posterior(tree)
        run_health = mcmc_health(tree, ds)
        agree_c = agreement(ref_ds, ds)
        used = crosscheck is True or run_health["reliable"]
        log(f"{step} {_health_line(run_health)}; max |z| {agree_c['max_abs_z']:.2f} on {agree_c['worst']} "
            f"({tree.attrs['wall_seconds']:.0f} s)" + ("" if used else " -- not healthy itself: recorded, not used"))
        entry = {"method": cmethod, "options": copts, "seed": cseed, "health": _summary(run_health),
                 "means": agree_c["means_b"], "mcse": agree_c["mcse_b"], "z": agree_c["z"],
                 "max_abs_z": agree_c["max_abs_z"], "worst": agree_c["worst"], "n_quantities": agree_c["n_quantities"],
                 "wall_seconds": tree.attrs["wall_seconds"], "used": used, "agrees": agree_c["agree"]}
        if used:
            failures += [f"cross-check {cmethod}: {f}" for f in
                         (run_health["failures"] if crosscheck is True else []) + agree_c["failures"]]
            if record["crosscheck"] is None:
                record["crosscheck"] = entry
        record["crosschecks"][cmethod] = entry

    record.update({
        "method": method, "settings": run_opts, "seeds": {"reference": seed, "second_seed": seed2,
                                                          **({"crosscheck": seed + CROSSCHECK_SEED_OFFSET}
                                                             if crosses else {})},
        "nuts_reformulation": main.attrs.get("nuts_reformulation", "") if method == "nuts" else "",
        "extension": {"budget": budget, "attempts": attempts, "outcome": outcome},
        "package_versions": package_versions(), "wall_seconds": main.attrs["wall_seconds"],
        "failures": failures, "reliable": not failures,
    })
    record["advice"] = advice(record)
    if failures:
        exc = UnhealthyReference(f"reference {label} not stored (the runs stay in {work}):\n  - " +
                                 "\n  - ".join(failures) + ("\n  try: " + "\n  try: ".join(record["advice"])
                                                             if record["advice"] else ""), record)
        exc.tree = main
        raise exc
    main.attrs.update({"reference_tag": tag, "validation": json.dumps(record, default=repr),
                       "reliable": 1})
    main = compact(main)
    save(main, path or reference_path(name, tag))
    for f in work.glob("*.nc") if work.is_dir() else ():
        f.unlink(missing_ok=True)
    for folder in (work, work.parent):
        if folder.is_dir() and not any(folder.iterdir()) and folder != REFERENCE_DIR:
            folder.rmdir()
    return main


def provenance(record: Mapping[str, Any]) -> list[str]:
    """The validation record of a reference in sentences: which sampler made it, how long, its extension, its
    cross-checks and, for a comparison on a user's data, the samplers tried before it and why each failed."""
    out = []
    method = record.get("method", "nuts")
    settings = record.get("settings", {})
    seeds = record.get("seeds", {})
    length = f"{record.get('n_chains', '?')} chains, {record.get('n_draws', '?')} stored draws"
    if "num_samples" in settings:
        length += f" (num_samples {settings['num_samples']}" + (
            f", num_warmup {settings['num_warmup']})" if "num_warmup" in settings else ")")
    out.append(f"made by {method}: {length}; seeds {seeds.get('reference')} and {seeds.get('second_seed')} (second "
               f"seed: max |z| {(record.get('second_seed') or {}).get('max_abs_z', float('nan')):.2f})")
    ext = record.get("extension") or {}
    if ext.get("outcome") and ext["outcome"] != "not needed":
        budget = ext.get("budget")
        out.append(f"extension (budget {budget:.0f} s): {ext['outcome']}" if budget is not None
                   else f"extension: {ext['outcome']}")
    crosschecks = record.get("crosschecks")
    if crosschecks is None and record.get("crosscheck"):        # a stored reference: one cross-check, always used
        crosschecks = {record["crosscheck"]["method"]: {**record["crosscheck"], "used": True}}
    for m, c in (crosschecks or {}).items():
        if c.get("used"):
            out.append(f"cross-checked against {m}: compared means agree to max |z| {c['max_abs_z']:.2f} "
                       f"({c['n_quantities']} quantities; rule |z| < {record.get('standard', {}).get('z_max', 4)})"
                       + ("" if c.get("agrees", True) else " -- they DISAGREE"))
        else:
            out.append(f"cross-check {m} not used: its own run is not healthy ("
                       + "; ".join(c.get("health", {}).get("failures", [])) + ")")
    if record.get("crosschecks") == {} and record.get("reliable"):
        out.append("no other exact sampler to cross-check it against")
    for t in record.get("tried", []):
        out.append(f"tried {t['method']}{' first' if record.get('reliable') else ''}, not healthy: "
                   + "; ".join(t["failures"]) + (f" (extension: {t['extension']})" if t.get("extension") else ""))
    return out


def _health_line(h: dict) -> str:
    return (f"{h['n_chains']} x {h['n_draws'] // max(h['n_chains'], 1)} draws, max R-hat {h['max_rhat']:.4f} "
            f"({h['worst_rhat']}), min ESS bulk {h['min_ess_bulk']:.0f} ({h['worst_ess_bulk']}) tail "
            f"{h['min_ess_tail']:.0f} ({h['worst_ess_tail']}), {h['divergences']} divergences, E-BFMI "
            f"{h['min_ebfmi']:.2f}" + ("" if h["reliable"] else " -- FAILS: " + "; ".join(h["failures"])))


def is_current(name: str, tag: str, data: Mapping[str, Any], options: Mapping[str, Any]) -> str | None:
    """Why the stored reference ``name``/``tag`` must be regenerated for ``data`` and ``options`` (a sentence),
    or None when it is stored, healthy, and was made with these settings on these data."""
    path = reference_path(name, tag)
    if not path.is_file():
        return "not stored yet"
    tree = load_tree(path)
    record = json.loads(tree.attrs.get("validation", "{}"))
    if not record.get("reliable") or "second_seed" not in record:
        return "the stored one has no passing validation record"
    if json.loads(json.dumps(reference_settings(name, **options), default=repr)) != record.get("settings"):
        return "its settings changed"
    spec = zoo.get(name)
    why = data_mismatch(spec, data_of(tree), data)
    return f"its data changed ({why})" if why else None


def verify(tree: xr.DataTree, rtol: float = 1e-2) -> list[str]:
    """Problems with a stored reference (empty when none): its health recomputed from the stored draws must
    equal its record (to ``rtol``) and pass the standard, and the record must hold a passing second-seed
    agreement (and cross-check, where the model names one).

    ``rtol`` is 1 %, not float precision: the compared quantities are recomputed from the stored draws, and their
    last bits depend on the CPU and XLA's optimisation level; rank-normalised R-hat and ESS jump when two
    near-tied draws swap ranks (measured on the gp_alps diabetes4 reference, whose switch probabilities sit at
    1 - O(1e-10): min bulk ESS 1387.94 against the recorded 1388.42, R-hat 1.00290 against 1.00317, 3e-4
    relative). A record made from other draws is off by far more; the standard itself is checked on the
    recomputed values, whatever the record says."""
    from diagnostics.health import REFERENCE_RULE, Z_MAX, mcmc_health

    problems = []
    record = json.loads(tree.attrs.get("validation", "{}"))
    if not record:
        return ["no validation record"]
    health = mcmc_health(tree)
    for key in ("n_chains", "n_draws", "divergences"):   # the worst-quantity labels can tie (symmetric pairs)
        if health[key] != record.get(key):
            problems.append(f"{key}: recomputed {health[key]!r}, recorded {record.get(key)!r}")
    for key in ("max_rhat", "min_ess_bulk", "min_ess_tail", "min_ebfmi"):
        if not np.isclose(health[key], record.get(key, np.nan), rtol=rtol, atol=0):
            problems.append(f"{key}: recomputed {health[key]!r}, recorded {record.get(key)!r}")
    problems += [f"health: {f}" for f in health["failures"]]
    if health["n_chains"] < REFERENCE_RULE.min_chains or health["n_draws"] < REFERENCE_RULE.min_draws:
        problems.append("fewer than 4 chains or 4000 stored draws")
    second = record.get("second_seed") or {}
    if not second.get("max_abs_z", np.inf) < Z_MAX or second.get("health", {}).get("reliable") is not True:
        problems.append(f"second seed: max |z| {second.get('max_abs_z')!r}, healthy "
                        f"{second.get('health', {}).get('reliable')!r}")
    spec = zoo.get(tree.attrs["model"])
    if spec.settings.reference_crosscheck is not None:
        cross = record.get("crosscheck") or {}
        if not cross.get("max_abs_z", np.inf) < Z_MAX or cross.get("health", {}).get("reliable") is not True:
            problems.append(f"cross-check {spec.settings.reference_crosscheck[0]}: max |z| {cross.get('max_abs_z')!r}, "
                            f"healthy {cross.get('health', {}).get('reliable')!r}")
    if not record.get("reliable") or record.get("failures"):
        problems.append(f"record says unreliable: {record.get('failures')}")
    return problems


def load(name: str, data: Mapping[str, Any] | None = None, *, tag: str | None = None) -> xr.DataTree | None:
    """The stored reference of model ``name``.

    Without ``data``: the one stored under ``tag`` (default: ``"default"``, else the model's only stored tag
    besides those of real datasets),
    or None when there is none. With ``data``: the stored reference (under ``tag``, or any tag) whose stored
    arrays match ``data`` (``data_mismatch``), or None."""
    spec = zoo.get(name)
    tags = [tag] if tag is not None else stored_tags(name)
    if data is None:
        simulated = [t for t in tags if not t.startswith(REAL_TAG)]
        tags = tags[:1] if tag is not None or "default" in tags or len(simulated) == 1 else []
    for t in tags:
        path = reference_path(name, t)
        if not path.is_file():
            continue
        tree = load_tree(path)
        if data is None or data_mismatch(spec, data_of(tree), data) is None:
            return tree
    return None


def reference_data(name: str, tag: str | None = None) -> tuple[dict[str, np.ndarray], str]:
    """(the exact arrays the stored reference was computed on, its tag): the data ``zoo compare``, ``zoo demo``,
    tests and notebooks fit on. ``tag`` None: ``"default"`` if stored, else the model's first stored tag.
    Raises ``ValueError`` when the model has no stored reference."""
    tags = [tag] if tag is not None else stored_tags(name)
    for t in tags:
        path = reference_path(name, t)
        if path.is_file():
            return data_of(load_tree(path)), t
    raise ValueError(f"model: {name!r} has no stored reference{f' with tag {tag!r}' if tag else ''} in "
                     f"{REFERENCE_DIR} (make references)")


def rerun_second_seed(tree: xr.DataTree, progress: bool | None = None) -> dict:
    """Rerun a stored reference's second NUTS run (its recorded settings, reference seed + 1, on its stored data)
    and compare it with the stored draws (``diagnostics.health.agreement``); adds ``health`` (the rerun's
    ``mcmc_health``). On another machine or package version the rerun's draws differ in their last bits and
    then entirely, so it checks the statistics, not the numbers, of the record."""
    from diagnostics.health import agreement, mcmc_health
    from diagnostics.quantities import compared_posterior

    record = json.loads(tree.attrs["validation"])
    spec = zoo.get(tree.attrs["model"])
    rerun = _thin(fit(spec, data_of(tree), record.get("method", "nuts"), seed=record["seeds"]["second_seed"],
                      progress=progress, **fit_options(record["settings"])), stored_draws(record["settings"]))
    ds = compared_posterior(rerun)
    return {**agreement(compared_posterior(tree), ds), "health": mcmc_health(rerun, ds)}


def get_or_generate(name: str, data: Mapping[str, Any] | None = None, *, tag: str = "default",
                    **options: Any) -> xr.DataTree:
    """The stored reference when it matches ``data``, else a fresh one (generated and stored)."""
    return load(name, data, tag=tag) or generate(name, data, tag=tag, **options)


def check_log_density(tree: xr.DataTree, n_points: int | None = None, rtol: float = 1e-8) -> float:
    """Largest relative difference between the stored log p(theta, y) at the model-check draws (``check_points``:
    the first, middle and last draw of each chain; ``n_points``: only the first ``n_points`` of them per chain)
    and the current model's there. Raises ``AssertionError`` above ``rtol`` (the model changed without
    regenerating the reference)."""
    spec, data, hyper = problem_of(tree)
    draws, stored = check_points(tree)
    if n_points is not None:
        draws, stored = draws.isel(draw=slice(0, n_points)), stored.isel(draw=slice(0, n_points))
    lp, ll = log_densities(spec, spec.inputs(data, hyper), {k: draws[k].values for k in draws.data_vars})
    new = sum(v.sum(axis=tuple(range(2, v.ndim))) for v in ll.values()) + sum(lp.values())
    old = stored.transpose("chain", "draw").values
    rel = float(np.max(np.abs(new - old) / np.maximum(1.0, np.abs(old))))
    if rel > rtol:
        raise AssertionError(f"reference {tree.attrs['model']}/{tree.attrs.get('reference_tag')}: stored log "
                             f"density differs from the current model's by {rel:.3g} (relative); regenerate "
                             f"it with `make references`")
    return rel
