"""How often the verdict errs: independent runs of every exact method judged against the stored reference
(false alarms), and copies of them perturbed by a known amount (power). ``benchmarks/bench_verdicts.py`` runs
the whole campaign and writes its tables; tests/test_verdict_error_rates.py checks the machinery on closed-form
cases and, in the slow suite, the 19-of-20 goals.

**False alarms.** For every registered model and every method of kind ``"sampler"`` (``nuts`` everywhere, the
collapsed Gibbs kernels of hlcr -- each ``kernel`` of ``inference.hlcr.gibbs.KERNELS`` -- and of gp_alps),
``N_RUNS`` = 20 independent runs at the demo's settings (``ZooSettings.demo_options``; seeds ``SEED_BASE + i``,
never the reference's 0-2) on the stored reference's data (``references.reference_data``), each judged
against the stored reference by ``diagnostics.method_scores``: the count of PASS (goal >= 19 of 20).

**Power.** Every run above is also the base of candidates perturbed by a known amount, judged by the same
code (they keep the sampler kind, so the MCSE rule judges them):

* (a) ``shift``: one compared quantity's draws shifted by ``SHIFT`` = 0.3 reference sd;
* (b) ``scale``: one compared quantity's draws scaled by ``SCALE`` = 0.7 about their mean (its sd x 0.7);

each on two quantities chosen by documented rules, per run:

* ``worst``: the quantity on which the perturbation is *least* detectable in this run: for the shift, the
  largest combined Monte Carlo error of the mean in reference sd (``mcse_mean_sd``; the quantity the
  verdict's ``detectable_shift`` = (z_crit + 1.645) x max ``mcse_mean_sd`` is computed on); for the scale, the
  largest combined Monte Carlo error of the sd in reference sd. If every quantity's 0.3 sd is detectable,
  this one is too: it is the honest worst case, reported beside ``detectable_shift``;
* ``random``: one quantity drawn uniformly (seeded by the run) -- a typical quantity.

Only quantities whose perturbation exceeds their floor are eligible (0.3 reference sd > the floor of
``diagnostics.view``: a probability pinned near 0 or 1 with sd 0.005 moves by 0.0015 < 0.01, which the rule
declares irrelevant by design); how many quantities were eligible is reported.

* (c) ``meanfield``: a mean-field Gaussian fitted to the reference, on the models whose posterior is correlated
  and whose coordinates carry no continuous or label symmetry that a Gaussian would have to straddle: the ssgp
  models (their only symmetry, lam -> -lam with the sine weights' sign, is a finite group and is folded
  away, then restored in q as an equal mixture, so log q is exact). In the unconstrained coordinates u of the
  model's sites (``numpyro`` ``biject_to`` of each site's support), the folded reference draws give mean m and
  covariance Sigma; the candidate is q(u) = N(m, diag(1 / diag(Sigma^-1))), the mean-field Gaussian that
  minimises KL(q || N(m, Sigma)) (what mean-field VI converges to on a Gaussian posterior: its marginal sd
  ratios are sqrt(1 - R_i^2), R_i the multiple correlation of coordinate i). ``MEANFIELD_DRAWS`` = 1000
  draws (SVI's default), log q(theta) = log q(u) - log |d theta / d u| (mixture over the fold), log prior and
  log likelihood from the model (``inference.build_tree``): an approximation, judged by the practical rules
  (mean, sd ratio, PSIS k-hat). For information the moment-matched mean-field Gaussian, q(u) = N(m,
  diag(Sigma)) (marginals right, correlations dropped) is judged too: nothing in the rules looks at the
  correlation of two quantities, so only k-hat can see it, and for an over-dispersed q it does not.

``campaign`` checkpoints every run (one JSON per run in ``checkpoints``, with the settings it was made with),
so an interrupted campaign resumes; ``workers`` processes run in parallel (each with single-threaded XLA);
``deadline`` (seconds) stops starting new runs after that long. Runs are started round by round (seed i of
every case before seed i + 1), so a cut-off campaign has about as many runs of every case.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

N_RUNS = 20
GOAL = 19
SEED_BASE = 1000
SHIFT = 0.3  # reference sd
SCALE = 0.7
MEANFIELD_DRAWS = 1000
VERSION = 1  # bump when a change makes old checkpoints incomparable
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


@dataclasses.dataclass(frozen=True)
class Case:
    """One exact method of one model at its demo settings (``label`` names the Gibbs kernel variant)."""

    model: str
    method: str
    label: str
    options: Mapping[str, Any]

    @property
    def key(self) -> str:
        return f"{self.model}/{self.label}"


def exact_cases(only: Sequence[str] | None = None) -> list[Case]:
    """Every (model, sampler-kind method) of the registry, one case per Gibbs ``kernel`` the method offers."""
    import zoo
    from inference import methods_for
    from inference._methods import get_method

    cases = []
    for name in zoo.list_models():
        spec = zoo.get(name)
        for method in methods_for(spec):
            meth = get_method(spec, method)
            if meth.kind != "sampler":
                continue
            options = dict(spec.settings.demo_options.get(method, {}))
            kernels = getattr(sys.modules[meth.run.__module__], "KERNELS", None) if "kernel" in meth.options else None
            if kernels:
                for k in kernels:
                    cases.append(Case(name, method, f"{method}[kernel={k}]", {**options, "kernel": k}))
            else:
                cases.append(Case(name, method, method, options))
    if only:
        known = {c.key for c in cases} | {c.model for c in cases} | {f"{m}/meanfield" for m in FOLDS}
        bad = [o for o in only if o not in known]
        if bad:
            raise ValueError(f"only: {bad} are not cases; cases are {sorted(known)}")
        cases = [c for c in cases if c.key in only or c.model in only]
    return cases


# ------------------------------------------------------------------------------------------------- perturbations


def perturbed_view(view, label: str, *, shift: float = 0.0, scale: float = 1.0):
    """A copy of the compared view ``view`` whose draws of scalar ``label`` are x -> mean + scale (x - mean) +
    shift (pooled mean), every statistic recomputed from the new draws by ``diagnostics.view``'s own
    functions; the tree, kind and floors are the base run's."""
    from diagnostics.quantities import component_labels
    from diagnostics.view import per_scalar_draws, scalar_stats

    name = label.split("[", 1)[0]
    da = view.ds[name].transpose("chain", "draw", ...)
    values = np.array(da.values, dtype=float)
    flat = values.reshape(values.shape[0], values.shape[1], -1)
    j = component_labels(name, values.shape[2:]).index(label)
    x = flat[:, :, j]
    flat[:, :, j] = x.mean() + scale * (x - x.mean()) + shift
    ds = view.ds.copy()
    ds[name] = (da.dims, flat.reshape(values.shape))
    draws = per_scalar_draws(ds)
    return dataclasses.replace(view, ds=ds, draws=draws, stats=scalar_stats(draws))


def eligible(ref, base, card) -> list[str]:
    """Labels on which a perturbation of 0.3 reference sd exceeds the floor (and the base run varies)."""
    rows = card.set_index("parameter")
    return [lab for lab in rows.index
            if rows.at[lab, "sd_ref"] > 0 and (1 - SCALE) * rows.at[lab, "sd_ref"] > rows.at[lab, "floor"]
            and SHIFT * rows.at[lab, "sd_ref"] > rows.at[lab, "floor"] and rows.at[lab, "sd"] > 0]


def choose(ref, base, card, labels: Sequence[str], what: str, rule: str, rng: np.random.Generator) -> str:
    """The quantity to perturb (module docstring): ``worst`` (least detectable) or ``random``."""
    if rule == "random":
        return str(labels[int(rng.integers(len(labels)))])
    rows = card.set_index("parameter").loc[list(labels)]
    if what == "shift":
        return str(rows["mcse_mean_sd"].idxmax())
    se_sd = np.hypot(base.stats.loc[list(labels), "mcse_sd"], ref.stats.loc[list(labels), "mcse_sd"])
    return str((se_sd / rows["sd_ref"]).idxmax())


def judge(ref, cand) -> tuple[dict, Any]:
    """The real verdict of ``cand`` against ``ref``: (method_scores row as a dict, scorecard)."""
    from diagnostics.scoring import method_scores, scorecard

    card = scorecard(ref, cand)
    row = method_scores(ref, cand, card=card, joint=False).iloc[0].to_dict()
    return row, card


def _verdict_record(row: Mapping[str, Any]) -> dict:
    keep = ("verdict", "reasons", "detectable_shift", "max_abs_z", "z_critical", "min_ess", "max_rhat", "khat",
            "min_sd_ratio", "max_std_mean_error")
    out = {}
    for k in keep:
        v = row.get(k)
        out[k] = float(v) if isinstance(v, float | np.floating | int) and not isinstance(v, bool) else v
    return out


# ------------------------------------------------------------------------------------------------- one run


_CACHE: dict[str, Any] = {}


def reference_of(model: str):
    """(data, the stored reference's compared view) for ``model``, once per process."""
    if model not in _CACHE:
        from diagnostics import references
        from diagnostics.view import compared_view

        data, tag = references.reference_data(model)
        tree = references.load(model, tag=tag)
        _CACHE[model] = (data, compared_view(tree, name="reference"), tag)
    return _CACHE[model]


def run_exact(case: Case, seed: int) -> dict:
    """One independent run of ``case`` and the verdicts of it and of its perturbed copies."""
    import inference
    import zoo
    from diagnostics.view import compared_view

    data, ref, tag = reference_of(case.model)
    t0 = time.perf_counter()
    tree = inference.fit(zoo.get(case.model), data, case.method, seed=seed, progress=False, **case.options)
    seconds = time.perf_counter() - t0
    base = compared_view(tree, name=case.label)
    row, card = judge(ref, base)
    out = {"model": case.model, "case": case.label, "seed": seed, "reference_tag": tag, "seconds": seconds,
           "compile_seconds": float(tree.attrs.get("compile_seconds", np.nan)),
           "run_seconds": float(tree.attrs.get("run_seconds", np.nan)), "base": _verdict_record(row),
           "n_compared": len(card)}
    labels = eligible(ref, base, card)
    out["n_eligible"] = len(labels)
    rng = np.random.default_rng(seed)
    for what in ("shift", "scale"):
        for rule in ("worst", "random"):
            if not labels:
                out[f"{what}_{rule}"] = None
                continue
            label = choose(ref, base, card, labels, what, rule, rng)
            sd_ref = float(ref.stats.at[label, "sd"])
            cand = (perturbed_view(base, label, shift=SHIFT * sd_ref) if what == "shift"
                    else perturbed_view(base, label, scale=SCALE))
            prow, pcard = judge(ref, cand)
            at = pcard.set_index("parameter").loc[label]
            out[f"{what}_{rule}"] = {"label": label, **_verdict_record(prow),
                                     "z": float(at["z_mean"] if what == "shift" else at["z_sd"]),
                                     "caught": bool(not at["mean_ok" if what == "shift" else "sd_ok"])}
    return out


# ------------------------------------------------------------------------------------------------- mean field


def _sign_fold(spec, hyper: Mapping[str, Any]):
    """ssgp: the involution S(lam, alpha_raw) = (-lam, alpha_raw with the sine half negated) on the model's
    sites (``zoo.ssgp.features``: cos block first), which leaves the density unchanged when mu_lam0 = 0;
    None when the prior is not centred (then there is no symmetry)."""
    if float(hyper.get("mu_lam0", 0.0)) != 0.0:
        return None
    m = int(hyper["m"])

    def flip(sites: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(sites)
        out["lam"] = -sites["lam"]
        a = np.array(sites["alpha_raw"], dtype=float)
        a[..., m:2 * m] = -a[..., m:2 * m]
        out["alpha_raw"] = a
        return out

    def folded(sites: dict[str, np.ndarray]) -> np.ndarray:
        return sites["lam"][..., 0] < 0

    return flip, folded


FOLDS = {"ssgp_lmm": _sign_fold, "ssgp_logit": _sign_fold, "ssgp_probit": _sign_fold}


class MeanField:
    """The mean-field Gaussian candidates of the module docstring, for one model's stored reference."""

    def __init__(self, spec, data: Mapping[str, np.ndarray], hyper: Mapping[str, Any], tree: xr.DataTree,
                 fold=None):
        """Fit to the posterior draws of ``tree`` (every latent site of ``spec``'s model); ``fold``: (flip,
        folded) of a finite symmetry to fold away and restore (``FOLDS``), or None."""
        import jax.numpy as jnp
        from numpyro.distributions import biject_to

        from inference.trees import latent_sites, trace_model

        self._jnp = jnp
        self.spec, self.data, self.hyper = spec, dict(data), dict(hyper)
        kwargs = spec.inputs(self.data, self.hyper)
        post = tree["posterior"].to_dataset().transpose("chain", "draw", ...)
        tr = trace_model(spec, kwargs, {k: post[k].values[0, 0] for k in post.data_vars})
        self.sites = latent_sites(tr)
        self.shapes = {s: tuple(np.shape(tr[s]["value"])) for s in self.sites}
        self.transforms = {s: biject_to(tr[s]["fn"].support) for s in self.sites}
        draws = {s: np.asarray(post[s].values, dtype=float).reshape(-1, *self.shapes[s]) for s in self.sites}
        self.fold = fold
        if fold is not None:
            flip, folded = fold
            mask = folded(draws)
            flipped = flip(draws)
            draws = {s: np.where(mask.reshape(-1, *[1] * len(self.shapes[s])), flipped[s], draws[s])
                     for s in self.sites}
        u = self._unconstrain(draws)
        self.mean = u.mean(axis=0)
        self.cov = np.cov(u, rowvar=False)
        sd = np.sqrt(np.diag(self.cov))
        corr = self.cov / np.outer(sd, sd)
        np.fill_diagonal(corr, 0.0)
        self.max_abs_corr = float(np.max(np.abs(corr)))
        precision_diag = np.diag(np.linalg.inv(self.cov))
        self.sd = {"kl": 1.0 / np.sqrt(precision_diag), "moments": sd}
        self.min_sd_ratio_kl = float(np.min(self.sd["kl"] / sd))

    @classmethod
    def of_reference(cls, model: str) -> MeanField:
        """The candidates for ``model``'s stored reference (its data and hyperparameters, ``FOLDS[model]``)."""
        from diagnostics import references
        from inference.trees import problem_of

        _, tag = references.reference_data(model)
        tree = references.load(model, tag=tag)
        spec, data, hyper = problem_of(tree)
        return cls(spec, data, hyper, tree, FOLDS[model](spec, hyper))

    def _unconstrain(self, draws: Mapping[str, np.ndarray]) -> np.ndarray:
        cols = [np.asarray(self.transforms[s].inv(self._jnp.asarray(draws[s]))).reshape(len(draws[s]), -1)
                for s in self.sites]
        return np.concatenate(cols, axis=1)

    def _constrain(self, u: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """(sites, log |d theta / d u|) of unconstrained rows ``u`` (n, D)."""
        out, logdet, i = {}, np.zeros(len(u)), 0
        for s in self.sites:
            size = int(np.prod(self.shapes[s], dtype=int))
            us = self._jnp.asarray(u[:, i:i + size].reshape(len(u), *self.shapes[s]))
            i += size
            t = self.transforms[s]
            theta = t(us)
            ld = np.asarray(t.log_abs_det_jacobian(us, theta))
            logdet += ld.reshape(len(u), -1).sum(axis=1)
            out[s] = np.asarray(theta)
        return out, logdet

    def _log_normal(self, u: np.ndarray, sd: np.ndarray) -> np.ndarray:
        z = (u - self.mean) / sd
        return -0.5 * np.sum(z * z, axis=1) - np.sum(np.log(sd)) - 0.5 * u.shape[1] * np.log(2 * np.pi)

    def tree(self, variant: str, seed: int) -> xr.DataTree:
        """``MEANFIELD_DRAWS`` draws of the ``variant`` ("kl" or "moments") candidate as a fitted tree."""
        from inference import Draws, build_tree

        sd = self.sd[variant]
        rng = np.random.default_rng(seed)
        u = self.mean + sd * rng.standard_normal((MEANFIELD_DRAWS, len(self.mean)))
        log_q_u = self._log_normal(u, sd)
        if self.fold is not None:
            flip, _ = self.fold
            sites, _ = self._constrain(u)
            u_flipped = self._unconstrain(flip(sites))
            log_q_u = np.logaddexp(log_q_u, self._log_normal(u_flipped, sd)) - np.log(2.0)
            restore = rng.random(MEANFIELD_DRAWS) < 0.5
            u = np.where(restore[:, None], u_flipped, u)
        sites, logdet = self._constrain(u)
        draws = Draws(posterior={s: v[None] for s, v in sites.items()},
                      sample_stats={"log_q": (log_q_u - logdet)[None]})
        return build_tree(self.spec, self.data, self.hyper, draws, method=f"meanfield_{variant}", seed=seed,
                          options={"variant": variant, "num_samples": MEANFIELD_DRAWS}, compile_seconds=0.0,
                          run_seconds=0.0)


def run_meanfield(model: str, seed: int) -> dict:
    from diagnostics.view import compared_view

    if ("mf", model) not in _CACHE:
        _CACHE[("mf", model)] = MeanField.of_reference(model)
    mf = _CACHE[("mf", model)]
    _, ref, tag = reference_of(model)
    t0 = time.perf_counter()
    out = {"model": model, "case": "meanfield", "seed": seed, "reference_tag": tag,
           "max_abs_corr_unconstrained": mf.max_abs_corr, "min_sd_ratio_kl": mf.min_sd_ratio_kl,
           "dimension": len(mf.mean)}
    for variant in ("kl", "moments"):
        row, _ = judge(ref, compared_view(mf.tree(variant, seed), name=f"meanfield_{variant}"))
        out[variant] = _verdict_record(row)
    out["seconds"] = time.perf_counter() - t0
    return out


def compared_correlation(model: str) -> float:
    """Largest |correlation| between two compared quantities of the stored reference that vary."""
    _, ref, _ = reference_of(model)
    live = [lab for lab in ref.labels if float(ref.stats.at[lab, "sd"]) > ref.floor(lab)]
    x = np.stack([ref.flat(lab) for lab in live], axis=1)
    corr = np.corrcoef(x, rowvar=False)
    np.fill_diagonal(corr, 0.0)
    return float(np.nanmax(np.abs(corr)))


# ------------------------------------------------------------------------------------------------- campaign


def _stamp(case_key: str, options: Mapping[str, Any], seed: int) -> dict:
    return {"version": VERSION, "case": case_key, "options": json.loads(json.dumps(options, default=str)),
            "seed": seed, "shift": SHIFT, "scale": SCALE, "meanfield_draws": MEANFIELD_DRAWS}


def _path(directory: Path, case_key: str, seed: int) -> Path:
    return Path(directory) / f"{case_key.replace('/', '__').replace('[', '_').replace(']', '').replace('=', '-')}" \
        f"__{seed}.json"


def _load(directory: Path, case_key: str, options: Mapping[str, Any], seed: int) -> dict | None:
    path = _path(directory, case_key, seed)
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except ValueError:
        return None
    return rec if rec.get("stamp") == _stamp(case_key, options, seed) else None


def _save(directory: Path, case_key: str, options: Mapping[str, Any], seed: int, rec: dict) -> None:
    path = _path(directory, case_key, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {**rec, "stamp": _stamp(case_key, options, seed)}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ckpt.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(rec, f, default=lambda o: o.item() if isinstance(o, np.generic) else str(o))
    os.replace(tmp, path)


def _job(directory: Path, kind: str, case: Case | str, seed: int) -> tuple[str, str, int, dict | None, str | None]:
    """Worker entry: one run, checkpointed; returns (kind, case key, seed, record, error)."""
    key = case.key if isinstance(case, Case) else f"{case}/meanfield"
    options = case.options if isinstance(case, Case) else {}
    try:
        rec = run_exact(case, seed) if kind == "exact" else run_meanfield(case, seed)
    except Exception as exc:  # recorded and reported: a run that raised is counted as such, never dropped
        return kind, key, seed, None, f"{type(exc).__name__}: {exc}"
    _save(directory, key, options, seed, rec)
    return kind, key, seed, rec, None


def _jobs(cases: Sequence[Case], mf_models: Sequence[str], n_runs: int) -> list[tuple[str, Case | str, int]]:
    jobs = []
    for i in range(n_runs):
        jobs += [("exact", c, SEED_BASE + i) for c in cases]
        jobs += [("meanfield", m, SEED_BASE + i) for m in mf_models]
    return jobs


def campaign(cases: Sequence[Case], mf_models: Sequence[str], *, checkpoints: str | Path, n_runs: int = N_RUNS,
             workers: int = 1, deadline: float | None = None, log=print) -> tuple[dict, dict]:
    """Run (or resume from the JSON files in ``checkpoints``) every job; returns ({case key: [records]},
    {case key: [errors]})."""
    records: dict[str, list[dict]] = collections.defaultdict(list)
    errors: dict[str, list[str]] = collections.defaultdict(list)
    todo = []
    for kind, case, seed in _jobs(cases, mf_models, n_runs):
        key = case.key if isinstance(case, Case) else f"{case}/meanfield"
        rec = _load(checkpoints, key, case.options if isinstance(case, Case) else {}, seed)
        if rec is not None:
            records[key].append(rec)
        else:
            todo.append((kind, case, seed))
    log(f"verdicts: {sum(map(len, records.values()))} runs reused from {checkpoints}, {len(todo)} to run "
        f"on {workers} worker(s)" + (f", no new run after {deadline:.0f} s" if deadline else ""))
    t0 = time.perf_counter()

    def done(result):
        kind, key, seed, rec, err = result
        if err:
            errors[key].append(f"seed {seed}: {err}")
            log(f"  {key} seed {seed}: ERROR {err}")
            return
        records[key].append(rec)
        extra = "" if kind != "exact" else " | " + " ".join(
            f"{k}:{(rec[k] or {}).get('verdict', '-')}" for k in ("shift_worst", "shift_random", "scale_worst",
                                                                 "scale_random"))
        verdict = rec["base"]["verdict"] if kind == "exact" else f"kl {rec['kl']['verdict']}, moments " \
            f"{rec['moments']['verdict']}"
        log(f"  [{time.perf_counter() - t0:6.0f} s] {key} seed {seed}: {verdict}{extra} ({rec['seconds']:.1f} s)")

    expired = lambda: deadline is not None and time.perf_counter() - t0 > deadline
    if workers <= 1:
        for job in todo:
            if expired():
                break
            done(_job(checkpoints, *job))
    else:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} {SINGLE_THREAD_XLA}".strip()
        ctx = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            pending, queue = set(), list(todo)
            while queue or pending:
                while queue and len(pending) < workers and not expired():
                    pending.add(pool.submit(_job, checkpoints, *queue.pop(0)))
                if not pending:
                    break
                finished, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for f in finished:
                    done(f.result())
        os.environ["XLA_FLAGS"] = flags
    return records, errors
