"""The reference of a comparison on given data (``diagnostics.compare`` on your own table, the demo's real-data
sections, the ladders), in this order: a stored reference (``zoo/references``) of the same data and
hyperparameters (``stored_reference``); one an earlier call made and cached by the data (``default_cache_dir``,
``reference_cache_key``); else one made now to the stored references' standard by the model's exact samplers in
order, the first healthy one cross-checked against the others (``own_reference``; ``reference_samplers`` says
which, with which options). ``NoReference`` when none may be made. Nothing here fits a compared method or writes a
page: the comparison pipeline (``diagnostics.comparison``) and the ladders (``diagnostics.ladders``) stand on it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import xarray as xr

import inference
import zoo
from diagnostics import references
from inference.api import resolve

Log = Callable[[str], None]


OWN_REFERENCE_LABEL = "reference ({method} on your data)"
DEFAULT_REFERENCE_BUDGET = 600.0   # seconds a reference sampler's runs may take before its extension stops


def default_cache_dir() -> Path:
    """Where references made on users' data are cached: ``$BAYES_ZOO_CACHE/references``, default
    ``~/.cache/bayes-zoo/references``."""
    return Path(os.environ.get("BAYES_ZOO_CACHE", Path.home() / ".cache" / "bayes-zoo")) / "references"


class NoReference(LookupError):
    """``own_reference(..., make=False)`` found no stored or cached reference for the data (nothing was run)."""


@dataclasses.dataclass(frozen=True)
class OwnReference:
    """The reference of a comparison on given data: the tree, whether it passed the stored-reference standard,
    whether it was reused (no run now), its folder (the cache folder, or ``zoo/references`` for a stored one),
    the seconds spent making it now (0 when reused), when a stored reference served its tag, and the exact
    sampler that made it (``method``; its validation record, ``tree.attrs["validation"]``, holds the cross-checks
    and the samplers tried before it)."""

    tree: xr.DataTree
    healthy: bool
    reused: bool
    folder: Path
    seconds: float
    stored: str | None = None
    method: str = "nuts"

    @property
    def label(self) -> str:
        """The reference's label on the report page, naming the sampler that made it."""
        if self.stored:
            return f"reference (stored {self.method.upper() if self.method == 'nuts' else self.method}, {self.stored})"
        return OWN_REFERENCE_LABEL.format(method=self.method.upper() if self.method == "nuts" else self.method)


def reference_cache_key(spec: zoo.ModelSpec, data: Mapping[str, Any], settings: Mapping[str, Any], seed: int,
                        crosscheck: Any) -> str:
    """The cache key of a reference made on ``data``: sha256 of the model, the validated data arrays
    (``references.data_checksum``: the bytes a file was read into, never re-simulated), the NUTS settings and
    hyperparameters, the seed and the cross-check."""
    doc = {"model": spec.name, "data": references.data_checksum(spec, data), "settings": dict(settings),
           "seed": seed, "crosscheck": crosscheck}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=repr).encode()).hexdigest()[:20]


def _exact_samplers(spec: zoo.ModelSpec) -> list[str]:
    """The model's exact samplers (methods of kind ``"sampler"``), NUTS first."""
    from inference._methods import get_method

    return [m for m in inference.methods_for(spec) if get_method(spec, m).kind == "sampler"]


def check_reference_method(spec: zoo.ModelSpec, method: Any) -> None:
    """``ValueError`` naming ``reference_method`` unless ``method`` is one of the model's exact samplers."""
    exact = _exact_samplers(spec)
    if not isinstance(method, str) or method not in inference.methods_for(spec):
        raise ValueError(f"reference_method: {spec.name!r} has no method {method!r}; its exact samplers are {exact}")
    if method not in exact:
        raise ValueError(f"reference_method: {method!r} is not an exact sampler (it is an approximation, so it cannot "
                         f"be a reference); the exact samplers of {spec.name!r} are {exact}")


def reference_samplers(spec: zoo.ModelSpec, settings: Mapping[str, Any], method: str | None = None,
                       options: Mapping[str, Any] | None = None) -> list[tuple[str, dict]]:
    """The exact samplers a reference on the user's data is made with, in the order they are tried, each with its
    full options (``references.sampler_settings``, the hyperparameters of ``settings`` included): the model's
    ``reference_samplers`` (default NUTS alone), NUTS with ``settings``. ``method``: that sampler alone, with
    ``options`` over its declared ones (the others then only cross-check it). Every option is checked
    (``ValueError`` naming it), nothing runs."""
    hyper = {k: v for k, v in settings.items() if k in spec.hyperparameters}
    declared = [(m, dict(o)) for m, o in (spec.settings.reference_samplers or (("nuts", {}),))]
    if method is not None:
        check_reference_method(spec, method)
        mine = next((o for m, o in declared if m == method), {})
        declared = [(method, {**mine, **dict(options or {})})] + [(m, o) for m, o in declared if m != method]
    plan = []
    for m, o in declared:
        opts = dict(settings) if m == "nuts" else references.sampler_settings(spec.name, m, **{**o, **hyper})
        resolve(spec, m, opts)
        plan.append((m, opts))
    return plan


def _more_advice(spec: zoo.ModelSpec, settings: Mapping[str, Any], tried: Sequence[Mapping[str, Any]] = (),
                 budget: float | None = None) -> list[str]:
    """What to try when no exact sampler made a healthy reference on the user's data, beyond
    ``references.advice``."""
    out = []
    at_budget = [t["method"] for t in tried if str(t.get("extension", "")).startswith("stopped at the budget")]
    if at_budget and budget is not None:
        out.append(f"a larger time budget for {', '.join(at_budget)}: reference_budget={4 * budget:.0f} (zoo compare "
                   f"--reference-budget {4 * budget:.0f}); the runs so far stay in the cache and are resumed")
    if any(t["method"] == "nuts" for t in tried):
        out.append(f"a longer run of NUTS: reference={{'num_warmup': {2 * settings['num_warmup']}, 'num_samples': "
                   f"{2 * settings['num_samples']}}} (zoo compare --reference num_samples="
                   f"{2 * settings['num_samples']})")
        if not settings.get("dense_mass"):
            out.append("a dense mass matrix for correlated posteriors: reference={'dense_mass': True} "
                       "(zoo compare --reference dense_mass=True)")
    untried = [m for m in _exact_samplers(spec) if m not in {t["method"] for t in tried}]
    if untried:
        out.append(f"another exact sampler of the model as the reference: reference_method={untried[0]!r} "
                   f"(zoo compare --reference-method {untried[0]}; exact samplers not tried: {', '.join(untried)})")
    return out


def _canonical(value: Any) -> Any:
    """``value`` as a validation record stores it (JSON, ``repr`` for the rest), so the two compare equal."""
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


def stored_reference(spec: zoo.ModelSpec | str, data: Mapping[str, Any], settings: Mapping[str, Any], *,
                     tags: Sequence[str] | None = None) -> tuple[xr.DataTree, str] | None:
    """``(tree, tag)`` of a stored reference (``zoo/references``; ``tags``, default every stored one) that is the
    reference of ``data`` under the hyperparameters of ``settings``: its record passed the standard, its
    hyperparameters (every one, defaults filled in) equal these, and its stored arrays are ``data``
    (``references.data_mismatch``: equal to 1e-12 relative). None when none is."""
    from inference.trees import data_of

    spec = zoo.get(spec)
    defaults = _canonical(spec.default_hyper)
    wanted = {**defaults, **_canonical({k: v for k, v in settings.items() if k in spec.hyperparameters})}
    for tag in references.stored_tags(spec.name) if tags is None else tags:
        path = references.reference_path(spec.name, tag)
        if not path.is_file():
            continue
        tree = inference.load(path)
        record = json.loads(tree.attrs.get("validation", "{}"))
        made = {k: v for k, v in record.get("settings", {}).items() if k in spec.hyperparameters}
        if record.get("reliable") and {**defaults, **made} == wanted and \
                references.data_mismatch(spec, data_of(tree), data) is None:
            return tree, tag
    return None


def own_reference(spec: zoo.ModelSpec | str, data: Mapping[str, Any], *, settings: Mapping[str, Any],
                  seed: int = 0, crosscheck: Any = True, cache_dir: str | os.PathLike | None = None,
                  fresh: bool = False, stored: bool = True, stored_tags: Sequence[str] | None = None,
                  make: bool = True, samplers: Sequence[tuple[str, Mapping[str, Any]]] | None = None,
                  budget: float | None = DEFAULT_REFERENCE_BUDGET, progress: bool | None = None,
                  log: Log = print) -> OwnReference:
    """The reference of ``spec`` on ``data`` (validated arrays), in this order:

    1. ``stored`` (unless ``fresh``): a stored reference of these data and hyperparameters (``stored_reference``,
       among ``stored_tags``) serves as it is: it was made to the standard below by ``make references``;
    2. the cache ``cache_dir/<model>/<reference_cache_key>/``: ``reference.nc`` when healthy,
       ``reference-unhealthy.nc`` (its validation record, failures and advice in ``attrs["validation"]``) when
       not, made by an earlier call with the same data and settings (``reused``; an unhealthy one whose
       extension stopped at a smaller ``budget`` than this one is resumed instead);
    3. ``make`` (else ``NoReference``, nothing run): made now to the stored references' standard
       (``references.generate``: health rule, second seed) by the exact samplers of ``samplers`` (default
       ``reference_samplers(spec, settings)``: the model's ``reference_samplers``, best first) in order: the first
       that meets the standard is the reference, cross-checked (``crosscheck`` True) against the others where
       their own runs are healthy; a sampler short only for want of draws is run longer within ``budget``
       seconds. Its record (``attrs["validation"]``) names the sampler (``method``), its cross-checks and the
       samplers tried before it (``tried``: method, failures, extension). When none is healthy, the first one's
       run is the (unhealthy) reference and its record lists every sampler tried and why each failed. Cached;
       an interrupted call resumes from the runs checkpointed in ``work/<method>/`` (each written atomically
       when it finishes). ``fresh``: remake it."""
    from inference.trees import data_of

    spec = zoo.get(spec)
    if stored and not fresh:
        found = stored_reference(spec, data, settings, tags=stored_tags)
        if found is not None:
            tree, tag = found
            record = json.loads(tree.attrs["validation"])
            log(f"reference: the stored NUTS reference {references.reference_path(spec.name, tag)} has these data "
                f"and hyperparameters; it serves (made by make references: {record['n_chains']} chains, "
                f"{record['n_draws']} draws, max R-hat {record['max_rhat']:.3f})")
            return OwnReference(tree, True, True, references.REFERENCE_DIR, 0.0, stored=tag,
                                method=record.get("method", "nuts"))
    plan = [(m, dict(o)) for m, o in samplers] if samplers is not None else reference_samplers(spec, settings)
    if crosscheck is True:
        cross_of = lambda method: [(m, o) for m, o in plan if m != method]  # noqa: E731
    else:
        fixed = references._crosschecks(spec, crosscheck)
        cross_of = lambda method: [(m, o) for m, o in fixed if m != method]  # noqa: E731
    key = reference_cache_key(spec, data, settings, seed, {"samplers": plan, "crosscheck": crosscheck})
    folder = Path(cache_dir or default_cache_dir()) / spec.name / key
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    for name, healthy in (("reference.nc", True), ("reference-unhealthy.nc", False)):
        path = folder / name
        if not path.is_file():
            continue
        try:
            tree = inference.load(path)
        except ValueError as err:
            log(f"reference: {path} is unreadable ({err}); making it again")
            path.unlink()
            continue
        record = json.loads(tree.attrs.get("validation", "{}"))
        if not healthy and _budget_was_short(record, budget):
            log(f"reference: the cached unhealthy reference stopped at a smaller time budget than {budget:.0f} s; "
                f"resuming its runs")
            path.unlink()
            continue
        if references.data_mismatch(spec, data_of(tree), data) is None:
            method = record.get("method", "nuts")
            made = float(tree.attrs.get("reference_seconds", tree.attrs.get("wall_seconds", float("nan"))))
            log(f"reference: reusing the cached {'healthy' if healthy else 'UNHEALTHY'} {method} reference {path} "
                f"(made in {made:.0f} s)")
            return OwnReference(tree, healthy, True, folder, 0.0, method=method)
    if not make:
        raise NoReference(f"no stored or cached NUTS reference of {spec.name!r} has these data and hyperparameters "
                          f"(make references MODELS={spec.name}, or diagnostics.compare on these data)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "key.json").write_text(json.dumps({"model": spec.name, "settings": dict(settings), "seed": seed,
                                                 "samplers": plan, "crosscheck": crosscheck}, indent=1, default=repr))
    t0 = time.time()
    tried: list[dict] = []
    first = None
    for i, (method, opts) in enumerate(plan, 1):
        unhealthy = {t["method"] for t in tried}
        others = [(m, o) for m, o in cross_of(method) if m not in unhealthy]
        log(f"reference: [{i}/{len(plan)}] {method} on your data"
            + (f", cross-checked against {', '.join(m for m, _ in others)} where healthy" if others else ""))
        try:
            tree = references.generate(spec.name, data, tag=f"yours-{key[:8]}", seed=seed,
                                       path=folder / "reference.nc", work=folder / "work" / method, progress=progress,
                                       log=log, crosscheck=others or None, method=method, budget=budget, **opts)
        except references.UnhealthyReference as exc:
            ext = (exc.record.get("extension") or {}).get("outcome", "")
            tried.append({"method": method, "failures": list(exc.record["failures"]), "extension": ext})
            log(f"reference: {method} NOT healthy ({'; '.join(exc.record['failures'])}); extension: {ext}")
            first = first or (exc.tree, exc.record)
            if all(f.startswith("cross-check ") for f in exc.record["failures"]):
                # its own runs were healthy and a healthy exact sampler disagrees: one of the two misses part of
                # the posterior, and neither can say which, so no other sampler is taken in its place
                log(f"reference: {method} and its cross-check disagree; no sampler is trusted over the other")
                break
            continue
        record = {**json.loads(tree.attrs["validation"]), "tried": tried}
        tree.attrs.update({"validation": json.dumps(record, default=repr), "reference_seconds": time.time() - t0})
        inference.save(tree, folder / "reference.nc")
        shutil.rmtree(folder / "work", ignore_errors=True)
        log("reference: healthy; " + "; ".join(references.provenance(record)))
        return OwnReference(tree, True, False, folder, time.time() - t0, method=method)
    tree, record = first
    shown = tried[0]["method"]
    record = {**record, "tried": tried, "failures": [
        f"no exact sampler met the health rule (tried {', '.join(t['method'] for t in tried)}; the reference shown is "
        f"{shown}'s run)", *tried[0]["failures"], *[f"{t['method']}: {f}" for t in tried[1:] for f in t["failures"]]]}
    record["advice"] = list(record.get("advice", [])) + _more_advice(spec, settings, tried, budget)
    tree.attrs.update({"validation": json.dumps(record, default=repr), "reliable": 0,
                       "reference_seconds": time.time() - t0})
    inference.save(tree, folder / "reference-unhealthy.nc")
    if not any(t["extension"].startswith("stopped at the budget") for t in tried):
        shutil.rmtree(folder / "work", ignore_errors=True)   # kept when a larger budget could resume it
    log(f"reference: NOT healthy with any exact sampler ({'; '.join(record['failures'])}); nothing is judged "
        f"against it (a sampler that has not mixed is still NOT CONVERGED)")
    return OwnReference(tree, False, False, folder, time.time() - t0, method=plan[0][0])


def _budget_was_short(record: Mapping[str, Any], budget: float | None) -> bool:
    """Whether an unhealthy reference's record has a sampler whose extension stopped at a budget smaller than
    ``budget`` (then a call with this budget resumes it instead of reusing the refusal)."""
    recorded = (record.get("extension") or {}).get("budget")
    stopped = any(str(t.get("extension", "")).startswith("stopped at the budget") for t in record.get("tried", []))
    return bool(stopped and budget is not None and (recorded is None or budget > recorded))
