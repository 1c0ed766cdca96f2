"""A ``ModelSpec`` is the model alone; how the zoo runs it (tuned option defaults, tiny, demo and reference settings)
is its ``settings``, a ``ZooSettings`` declared apart in the model file.

The claims: no settings field is a field of ``ModelSpec``; every registered spec carries a ``ZooSettings`` that its
model module binds to a name of its own (declared apart from the spec); a spec built from the model's fields alone
(no settings) keeps the whole fit contract of ``tests/test_contract.py`` on tiny data; a settings argument of
another type is refused by name.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest
from diag_toys import normal_model, normal_simulate
from test_contract import check_contract

import zoo

# What ``ModelSpec`` used to carry beside the model (issue 30): the zoo's settings, now ``ZooSettings``'s fields.
SETTINGS_FIELDS = {"method_options", "tiny_sizes", "tiny_hyperparameters", "demo_sizes", "demo_options", "ladder_top",
                   "reference_options", "reference_datasets", "reference_crosscheck", "reference_samplers"}


def field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_model_spec_has_no_settings_field_and_zoo_settings_holds_every_one():
    assert field_names(zoo.ModelSpec) & SETTINGS_FIELDS == set()
    assert field_names(zoo.ZooSettings) == SETTINGS_FIELDS
    assert "settings" in field_names(zoo.ModelSpec)


def test_every_registered_spec_carries_zoo_settings_declared_apart_in_its_model_file():
    for name in zoo.list_models():
        spec = zoo.get(name)
        assert type(spec.settings) is zoo.ZooSettings, f"{name}: settings is {type(spec.settings).__name__}"
        assert spec.settings.tiny_sizes and spec.settings.demo_sizes, f"{name}: no tiny or demo sizes"
        module = importlib.import_module(spec.model.__module__)
        assert any(value is spec.settings for value in vars(module).values()), \
            f"{name}: {module.__name__} binds no module-level name to the spec's settings"


def test_a_spec_of_the_model_fields_alone_keeps_the_fit_contract_on_tiny_data():
    spec = zoo.ModelSpec(
        name="model_fields_only", model=normal_model, simulate=normal_simulate,
        data_fields=(zoo.DataField("y", ("n",)),),
        hyperparameters={"mu0": zoo.Hyper(0.0, "real"), "tau0": zoo.Hyper(1.0), "sigma": zoo.Hyper(2.0)})
    assert spec.settings == zoo.ZooSettings()
    zoo.register(spec)
    try:
        check_contract("model_fields_only", "nuts")
    finally:
        zoo.unregister("model_fields_only")


def test_settings_of_another_type_are_refused_by_name():
    with pytest.raises(ValueError, match="settings"):
        zoo.ModelSpec(name="bad_settings", model=normal_model, simulate=normal_simulate,
                      data_fields=(zoo.DataField("y", ("n",)),), settings={"tiny_sizes": {"n": 4}})


def test_every_kernel_serves_only_the_models_of_its_own_paper_package():
    """The lazy kernel load (``inference._methods.paper_of``) imports ``inference/<paper>/`` for a model defined in
    ``zoo/<paper>.py``: so every kernel a paper package registers must serve models of that file only, or a fit
    would not find it. Walks every package's modules and checks each registered method's models."""
    import inference._methods as methods

    methods._load_kernels()   # everything
    for (owner, name), method in methods._METHODS.items():
        if owner is None:
            continue
        package = method.run.__module__.split(".")
        if package[0] != "inference" or len(package) < 3:
            continue   # a test's or a user's kernel, registered from elsewhere
        assert methods.paper_of(zoo.get(owner)) == package[1], (owner, name, method.run.__module__)


def test_a_fit_of_one_model_imports_only_its_own_paper_package():
    """``get_method`` for ppca (zoo/mppca.py) in a fresh process: inference.mppca is imported, and no other paper
    package (hlcr, ssgp, gp_alps, bpca); a listing of every method then imports them all."""
    import subprocess
    import sys

    code = ("import sys, zoo, inference\n"
            "from inference._methods import get_method, available_methods\n"
            "get_method(zoo.get('ppca'), 'em')\n"
            "papers = ('mppca', 'hlcr', 'ssgp', 'gp_alps', 'bpca')\n"
            "print(sorted(p for p in papers if f'inference.{p}' in sys.modules))\n"
            "available_methods()\n"
            "print(sorted(p for p in papers if f'inference.{p}' in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "['mppca']"
    assert out[1] == "['bpca', 'gp_alps', 'hlcr', 'mppca', 'ssgp']"
