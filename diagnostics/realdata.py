"""What the demo's real-data sections compare: on each model's real dataset (``ModelSpec.real_datasets``, those
``in_demo``), the model's own kernels against the stored NUTS reference of those data (tag ``real_<dataset>``,
made by ``make references`` with the health rule of every stored reference, ``diagnostics.references``).

This module only says *what* a section is; ``diagnostics.comparison.compare_real_data`` runs each section through
the own-data pipeline of ``diagnostics.comparison`` (validation first, fits cached and resumable, the same report),
with the stored reference serving as the cached reference. A real dataset whose reference is not stored gets no
section, and the log says how to make it: a cold ``zoo demo`` never runs a NUTS reference.

* ``real_methods(spec)``: the methods a section fits: every method of the model except the generic NUTS and SVI
  baselines (NUTS is the reference itself);
* ``real_sections(spec)``: one ``RealSection`` per demo dataset with a stored reference: the stored arrays, the
  hyperparameters of that reference (every one explicit), the dataset's per-method ``demo_options`` and the
  line that names the data on the report page.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import inference
import zoo
from diagnostics import references
from zoo._registry import REAL_TAG

Log = Callable[[str], None]
BASELINES = ("nuts", "svi")


def real_methods(spec: zoo.ModelSpec) -> list[str]:
    return [m for m in inference.methods_for(spec) if m not in BASELINES]


@dataclasses.dataclass(frozen=True)
class RealSection:
    """One real-data section of the demo: ``dataset`` (its name), ``tag`` (``real_<dataset>``, the stored
    reference's tag and the section's folder), ``data`` (the arrays stored with the reference: what every method
    fits), ``hyper`` (the hyperparameters of the reference: the model's defaults overridden by the dataset's
    ``hyper``), ``options`` (the dataset's ``demo_options`` per method) and ``note`` (the data's line on the
    page: source, size, description, licence)."""

    dataset: str
    tag: str
    data: dict
    hyper: dict
    options: Mapping[str, Mapping[str, Any]]
    note: str


def data_note(spec: zoo.ModelSpec, dataset: str) -> str:
    real = spec.real_datasets[dataset]
    return (f"real data {dataset} ({real.source}; {real.size_text()}): {real.description}. Licence: "
            f"{real.licence}")


def real_sections(spec: zoo.ModelSpec | str, *, log: Log = print) -> list[RealSection]:
    """The demo's real-data sections of ``spec``: one per dataset ``in_demo`` whose reference is stored (the others
    are logged as skipped, with the command that makes their reference)."""
    spec = zoo.get(spec)
    sections = []
    for dataset, real in spec.real_datasets.items():
        if not real.in_demo:
            continue
        tag = REAL_TAG + dataset
        if not references.reference_path(spec.name, tag).is_file():
            log(f"  {spec.name}/real data {dataset}: no stored reference, section skipped (make references "
                f"MODELS={spec.name})")
            continue
        data, _ = references.reference_data(spec.name, tag)
        sections.append(RealSection(dataset, tag, data, {**spec.default_hyper, **real.hyper},
                                    dict(real.demo_options), data_note(spec, dataset)))
    return sections
