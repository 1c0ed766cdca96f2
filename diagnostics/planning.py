"""A comparison before anything runs: the data a model's methods are compared on (``comparison_data``: the
arrays stored with its reference), the options each method is fitted with (``method_options``: the spec's
``demo_options`` without their hyperparameters, then the hyperparameters every method and the reference share),
and ``plan_comparison``: every check of ``diagnostics.compare`` (arguments, methods, options, columns, the
reference's sampler and options), nothing run, as a ``ComparisonPlan``. The comparison pipeline
(``diagnostics.comparison``), the ladders (``diagnostics.ladders``) and the demo's workers build on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import inference
import zoo
from diagnostics import references
from diagnostics.own_references import check_reference_method, reference_samplers
from inference.api import read_data, resolve
from zoo._validation import validate_hyper


def comparison_data(spec: zoo.ModelSpec) -> tuple[dict, str | None]:
    """(data, reference tag): the exact arrays stored with the model's reference (``default``, else its first
    stored tag, e.g. mppca's ``t11``); a model without a stored reference fits its simulator's default data."""
    if references.stored_tags(spec.name):
        return references.reference_data(spec.name)
    return spec.default_data()[0], None


def method_options(spec: zoo.ModelSpec, method: str, hyper: Mapping[str, Any],
                   options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The options ``method`` is fitted with in a comparison: the spec's ``demo_options`` of the method without
    their hyperparameters, then ``hyper`` (the one set every method and the reference share), then
    ``options``."""
    demo = {k: v for k, v in spec.settings.demo_options.get(method, {}).items() if k not in spec.hyperparameters}
    return {**demo, **dict(hyper), **dict(options or {})}


def hyper_advice(spec: zoo.ModelSpec, given: Mapping[str, Any], call: Callable[[], Any]) -> Any:
    """``call()``; a ``ValueError`` that names a hyperparameter (``"q: expected ..."``, e.g. the model's check of
    it against the data) is raised again saying what to do: set another value with ``hyper={'q': VALUE}``
    (``--set q=VALUE`` on the command line), or, when it was set, leave it out for the model's default."""
    try:
        return call()
    except ValueError as exc:
        text = str(exc)
        name = text.split(":", 1)[0].strip()
        if name not in spec.hyperparameters or "hyper={" in text:
            raise
        h = spec.hyperparameters[name]
        what = (f"you set {name}={given[name]!r}; set another value" if name in given else
                f"the model's default is {h.default!r}; set a value that fits your data")
        tail = f", or leave {name} out for the model's default {h.default!r}" if name in given else ""
        raise ValueError(f"{text}. {name} is a hyperparameter ({h.doc}): {what} with hyper={{{name!r}: VALUE}} "
                         f"(command line: --set {name}=VALUE){tail}") from None


@dataclasses.dataclass(frozen=True)
class ComparisonPlan:
    """A checked comparison, nothing run yet (``plan_comparison``): the model, the validated data arrays, the
    reference's NUTS settings and the hyperparameters given (``settings``; the others are the model's defaults),
    whether the caller chose reference settings or a reference sampler of its own (then no stored reference
    serves), each method's options and its prepared fit, the seed, and the exact samplers the reference is made
    with, in the order tried (``reference_samplers``)."""

    spec: zoo.ModelSpec
    data: dict
    settings: dict
    own_settings: bool
    options: dict[str, dict]
    prepared: dict[str, inference.Prepared]
    seed: int
    samplers: tuple[tuple[str, dict], ...] = ()


def plan_comparison(model: zoo.ModelSpec | str, data: Any, methods: Sequence[str] | None = None, *,
                    columns: Mapping[str, Any] | None = None, dropna: bool = False, seed: int = 0,
                    hyper: Mapping[str, Any] | None = None, options: Mapping[str, Mapping[str, Any]] | None = None,
                    reference: Mapping[str, Any] | None = None, reference_method: str | None = None,
                    progress: bool | None = None) -> ComparisonPlan:
    """Every check of ``compare`` (its arguments, see there), nothing run: ``ValueError`` naming the first bad
    argument, method, option or column.

    One set of hyperparameters serves the reference and every method: the model's ``Hyper`` defaults (presets
    applied, ``zoo._validation.validate_hyper``) under ``hyper``, exactly what ``inference.fit`` uses on these
    data; a default the model derives from the data (ppca's ``q=None``: d - 1) is derived by the model in every
    fit alike. The reference's NUTS options are ``references.reference_settings`` under ``reference``; each
    method's options (``method_options``) its ``demo_options`` without their hyperparameters, the hyperparameters,
    then ``options[method]``. A stored reference serves only when its data and hyperparameters are these
    (``stored_reference``)."""
    spec = zoo.get(model)
    chosen = list(methods) if methods else inference.methods_for(spec)
    hyper, options, reference = dict(hyper or {}), dict(options or {}), dict(reference or {})
    for key in hyper:
        if key not in spec.hyperparameters:
            raise ValueError(f"hyper: {key!r} is not a hyperparameter of {spec.name!r} "
                             f"(hyperparameters: {sorted(spec.hyperparameters)})")
    for key in reference:
        if key in spec.hyperparameters:
            raise ValueError(f"reference: {key!r} is a hyperparameter; give it in hyper=, which the reference and "
                             f"every method share")
    for key, opts in options.items():
        if key not in chosen:
            raise ValueError(f"options: {key!r} is not one of the compared methods {chosen}")
        shared = sorted(k for k in opts if k in spec.hyperparameters)
        if shared:
            raise ValueError(f"options: {shared} of {key!r} are hyperparameters; give them in hyper=, which the "
                             f"reference and every method share")
    if reference_method is not None:
        check_reference_method(spec, reference_method)
    model_hyper = validate_hyper(spec, hyper)             # the defaults of inference.fit, under the given ones
    table = read_data(spec, data, columns, dropna)
    nuts_options = reference if reference_method in (None, "nuts") else {}
    settings = references.reference_settings(spec.name, **nuts_options, **hyper)   # the rest: the defaults
    resolve(spec, "nuts", settings)                       # the reference's options, checked before any run
    samplers = reference_samplers(spec, settings, reference_method,
                                  reference if reference_method not in (None, "nuts") else None)
    per_method = {m: method_options(spec, m, model_hyper, options.get(m)) for m in chosen}
    prepared = {m: hyper_advice(spec, hyper, lambda m=m: inference.prepare(
        spec, data, m, seed=seed, columns=columns, dropna=dropna, progress=progress, **per_method[m]))
        for m in chosen}
    own = bool(reference) or reference_method not in (None, "nuts")
    return ComparisonPlan(spec, table.data, settings, own, per_method, prepared, seed, tuple(samplers))
