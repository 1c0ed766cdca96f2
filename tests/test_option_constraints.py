"""One table of option constraints (``inference._methods.OPTION_CONSTRAINTS``), used by every method.

Every option of every registered (model, method) carries its name's entry of the table, whether the method
declared it as a bare default or as an ``Option``; a method cannot give a name another meaning. A value that
violates an option's constraint (or is not among its choices) is a ``ValueError`` naming the option, raised by
``inference.fit`` before anything is traced or compiled.
"""

from __future__ import annotations

import functools

import pytest

import inference
import zoo
from inference._methods import _METHODS, OPTION_CONSTRAINTS, Option, _load_kernels, option_constraint, register_method
from inference._timing import Stopwatch

# A value outside each constraint word (and outside None): every alternative of a constraint rejects it.
VIOLATIONS = {
    "positive": -1.0, "nonnegative": -0.5, "real": float("nan"), "positive_int": 0, "nonnegative_int": -1,
    "unit_interval": 1.5, "open_unit_interval": 1.0, "probability": 1.5, "bool": "yes", "string": 3,
}


def registered_pairs() -> list[tuple[str, str]]:
    _load_kernels()
    return sorted((model, name) for model in zoo.list_models() for name in inference.methods_for(model))


def constrained_options() -> list[tuple[str, str, str, object]]:
    """(model, method, option, a value violating its constraint or choices) for every constrained option."""
    out = []
    for model, name in registered_pairs():
        declared = inference._methods.get_method(zoo.get(model), name).declared
        for option, decl in declared.items():
            base = [c.removesuffix("[]") for c in decl.constraint.split("|") if c != "None"]
            if decl.choices is not None:
                out.append((model, name, option, 3 if "string" not in base else "not-a-choice"))
            elif base and base[0] != "any":
                out.append((model, name, option, VIOLATIONS[base[0]]))
    return out


@functools.cache
def tiny_data(model: str) -> dict:
    return zoo.get(model).tiny_data(0)[0]


def test_every_option_of_every_method_has_its_table_constraint():
    pairs = registered_pairs()
    assert len(pairs) >= 10, pairs
    unlisted = set()
    for model, name in pairs:
        for option, decl in inference._methods.get_method(zoo.get(model), name).declared.items():
            assert decl.constraint == OPTION_CONSTRAINTS.get(option, decl.constraint), (model, name, option)
            if option not in OPTION_CONSTRAINTS:
                unlisted.add((model, name, option))
    assert not unlisted, f"built-in options missing from OPTION_CONSTRAINTS: {sorted(unlisted)}"


def test_a_bare_default_and_an_option_without_constraint_take_the_table_entry():
    """Before, only a bare default was looked up in the table: ``Option(5)`` for ``num_samples`` took "any"."""
    register_method("constraint_probe", kind="point", models=("ppca",),
                    options={"num_samples": Option(5, doc="draws"), "tol": 1e-3, "my_knob": Option(1, "positive")})(
        lambda ctx: None)
    try:
        declared = inference._methods.get_method(zoo.get("ppca"), "constraint_probe").declared
        assert declared["num_samples"].constraint == "positive_int"
        assert declared["tol"].constraint == "positive"
        assert declared["my_knob"].constraint == "positive"  # a name the table does not list keeps its own
        with pytest.raises(ValueError, match=r"^num_samples: expected a positive integer, got 0"):
            inference.fit("ppca", tiny_data("ppca"), "constraint_probe", seed=0, num_samples=0)
    finally:
        _METHODS.pop(("ppca", "constraint_probe"))


def test_an_option_cannot_contradict_the_table():
    with pytest.raises(ValueError, match=r"^num_samples: declared with constraint 'any', but OPTION_CONSTRAINTS "
                                         r"gives 'positive_int'"):
        register_method("constraint_probe", kind="point", models=("ppca",),
                        options={"num_samples": Option(5, "any")})(lambda ctx: None)
    assert ("ppca", "constraint_probe") not in _METHODS
    assert option_constraint("no_such_option") == "any"


@pytest.mark.parametrize(("model", "method", "option", "bad"), constrained_options(),
                         ids=lambda v: v if isinstance(v, str) else repr(v))
def test_a_violating_option_is_a_value_error_naming_it_before_anything_compiles(model, method, option, bad):
    data = tiny_data(model)
    with Stopwatch() as watch, pytest.raises(ValueError, match=rf"^{option}: "):
        inference.fit(model, data, method, seed=0, **{option: bad})
    assert watch.xla_compiles == [] and watch.compile_seconds == 0.0, (watch.xla_compiles, watch.compile_seconds)
