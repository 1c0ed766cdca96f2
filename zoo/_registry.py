"""The model registry: what a zoo entry is (``ModelSpec``) and how entries are found.

A model module (``zoo/<model>.py``) builds one or more ``ModelSpec`` and calls ``register`` at import
time; ``zoo.get(name)`` imports the model modules on first use, so ``import zoo`` stays cheap.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from zoo import _runtime  # noqa: F401  (JAX set-up before any model module touches JAX)

REAL_TAG = "real_"   # stored references of real datasets are tagged "real_<dataset>" (zoo/references/)
DataKind = Literal["float", "int", "binary", "index"]
# A constraint names a check of ``zoo._validation``: "positive", "nonnegative", "real", "positive_int",
# "nonnegative_int", "unit_interval" (0, 1], "open_unit_interval" (0, 1), "probability" [0, 1], "bool",
# "string", "None", "any"; "a|b" accepts either ("positive_int|None"); a "[]" suffix also accepts an array
# whose every entry passes ("real[]"). Scalars are never given as lists, bools are not numbers.
Constraint = str


@dataclasses.dataclass(frozen=True)
class DataField:
    """One array of a model's data dict.

    ``shape`` names each axis symbolically (``("n", "F")``) or fixes it (an int); the same symbol in
    two fields must have the same size (``X: ("n", "F")`` and ``y: ("n",)`` share ``n``).
    ``kind``: ``float`` (finite reals, NaN allowed only if ``allow_nan``), ``int`` (any integers),
    ``index`` (labels: integers >= 0 or strings, any size; models number them with
    ``zoo._validation.factorize``), ``binary`` (0/1).
    """

    name: str
    shape: tuple[str | int, ...]
    kind: DataKind = "float"
    allow_nan: bool = False
    optional: bool = False
    doc: str = ""


@dataclasses.dataclass(frozen=True)
class Hyper:
    """A hyperparameter of a model: its default, the constraint checked by ``fit`` (see ``Constraint``) and
    a one-line doc."""

    default: Any
    constraint: Constraint = "positive"
    doc: str = ""


@dataclasses.dataclass(frozen=True)
class Reformulation:
    """An exact reformulation of a model that the ``nuts`` method samples instead of ``ModelSpec.model``.

    NUTS runs on ``model`` (called with the same keyword arguments as ``ModelSpec.model``, with latent sites
    of its own: e.g. some sites integrated out, a symmetry folded away); ``to_sites(key, draw, model_kwargs)``
    maps one of its draws (a dict of its latent sites, no sample axes) to one draw of **every latent site of
    the model**, such that mapped draws follow the model's posterior exactly: integrated-out sites are drawn
    from their exact conditional, a folded symmetry is restored by applying a random group element. The
    model's sites, log density and posterior do not change; only the coordinates NUTS moves in do.

    ``applies(model_kwargs)``: False when an assumption the reformulation rests on does not hold for these
    hyperparameters (e.g. a sign symmetry that needs a prior centred at 0); NUTS then samples the model
    itself. ``name`` and ``doc`` (one line) are recorded in the tree's attrs (``nuts_reformulation``).
    """

    name: str
    model: Callable[..., Any]
    to_sites: Callable[[Any, dict, dict], dict]
    applies: Callable[[dict], bool] = lambda model_kwargs: True
    doc: str = ""


@dataclasses.dataclass(frozen=True)
class RealDataset:
    """A real dataset that ships inside an installed package (scikit-learn's bundled sets, pydataset's archive of
    R datasets): read from the package's own files, never downloaded, nothing written to $HOME.

    ``loader() -> (data, info)``: ``data`` is a dict in the model's data contract, ``info`` what else the loader
    knows (held-out rows, labels, scales, feature names). ``hyper``: hyperparameters suited to these data (fit
    options, e.g. the known noise level of hlcr or gp_alps's kernels), what ``load`` returns beside the data.
    ``source``: the package and the dataset's name in it (``"pydataset: lme4/sleepstudy"``); ``licence``: the
    licence of that package and, where known, of the dataset itself; ``description``: one line on what the data
    are and how they were put in the contract (scaling, columns). ``sizes``: the size of each axis symbol of the
    data contract (``{"n": 180, "d": 1}``) and the number of distinct labels of each index field
    (``{"group": 18}``), what ``zoo list`` prints without loading anything (``tests/test_real_data.py``
    checks it against the loaded data). ``in_demo``: whether the demo's real-data section fits it (False for data
    too large for a NUTS reference); ``demo_options``: per-method options that section adds to the
    ``ZooSettings.demo_options`` of the spec (e.g. a number of nodes for the distributed methods);
    ``reference_options``: NUTS options of its stored reference that differ from the spec's
    ``ZooSettings.reference_options`` (e.g. ``init``).
    """

    loader: Callable[[], tuple[dict, dict]]
    source: str
    licence: str
    description: str
    sizes: Mapping[str, int]
    hyper: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    in_demo: bool = True
    demo_options: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    reference_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def load(self) -> tuple[dict, dict]:
        """``(data, hyper)``: the data in the model's contract and the hyperparameters suited to them."""
        data, _ = self.loader()
        return data, dict(self.hyper)

    def size_text(self) -> str:
        """``"n=180, d=1, group=18"``."""
        return ", ".join(f"{k}={v}" for k, v in self.sizes.items())


@dataclasses.dataclass(frozen=True)
class ZooSettings:
    """How the zoo itself runs one model: its tuned option defaults, the tiny data of the contract test, the
    demo's data and run lengths, and the stored references. None of it is part of the model (``ModelSpec``):
    a model of your own needs none of it (every field has an empty default), and a model file declares its
    settings apart from the model, passed as ``ModelSpec(..., settings=...)``.

    Attributes
    ----------
    method_options:
        per-method overrides of the generic option defaults (e.g. a higher NUTS target acceptance for this
        model): the zoo's tuning, applied by every ``inference.fit`` of the model (options given explicitly win).
    tiny_sizes:
        simulator sizes of a tiny dataset (a fit of a few seconds) on which the contract test
        (``tests/test_contract.py``) runs every registered method of the model, with each method's
        ``Option.tiny`` values.
    tiny_hyperparameters:
        the hyperparameters of that tiny dataset.
    demo_sizes:
        simulator sizes of the data ``zoo compare`` / ``zoo demo`` fit (small enough for the demo's 10-minute
        budget on 2 cores).
    demo_options:
        per-method options used by ``zoo compare`` / ``zoo demo``: long enough runs that every exact sampler
        reaches its own R-hat < 1.01 and bulk and tail ESS >= 400 on every compared quantity. Hyperparameters
        here are not used by the comparisons (each fits every method with its reference's hyperparameters: the
        stored reference's on its data, the model's defaults or the user's on other data).
    ladder_top:
        per optimiser (method -> budget in its own unit), the last rung of its default cost-accuracy ladder
        (``diagnostics.ladders.default_budgets``) where twice the comparison's setting ends before the
        method's error settles on the demo data: a slow mode that the stopping rule of the comparison's fit does
        not wait for (bpca: the rotation of the latent space under the per-entry mean-field q(W)). The budget by
        which the method reaches its fixed point there; the ladder keeps its first rung and adds rungs.
    reference_options:
        NUTS options (and hyperparameters) for the stored reference posterior (``make references``); a reference
        made on other data takes only its NUTS options (``diagnostics.references.reference_settings``).
    reference_datasets:
        ``() -> {tag: (data, options)}``: every stored reference ``make references`` regenerates
        (default: tag ``"default"`` on ``ModelSpec.default_data()`` with ``reference_options``); its options may
        make one longer than ``reference_options`` (``num_samples`` and ``stored_draws``, the draws it keeps:
        ``diagnostics.references.stored_draws``).
    reference_crosscheck:
        ``(method, options)`` of a second exact sampler (a collapsed Gibbs kernel) that ``make references``
        runs on the reference data to validate the NUTS reference where NUTS may not mix (label switching,
        near-discrete switches); its agreement goes in the validation record. None: no cross-check.
    reference_samplers:
        the exact samplers that may make the reference on a user's data, best first, as ``(method, options)``
        (options over the method's defaults; ``("nuts", {})`` takes ``reference_options``): the comparison
        (``diagnostics.own_references``) uses the first that meets the health rule and cross-checks it against the
        others where they are healthy. Empty: NUTS alone (on ``nuts_reformulation``). A collapsed Gibbs kernel
        comes first where NUTS cannot move between discrete clusterings or switches (hlcr, gp_alps).
    """

    method_options: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    tiny_sizes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tiny_hyperparameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    demo_sizes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    demo_options: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    ladder_top: Mapping[str, int] = dataclasses.field(default_factory=dict)
    reference_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    reference_datasets: Callable[[], Mapping[str, tuple[dict, dict]]] | None = None
    reference_crosscheck: tuple[str, Mapping[str, Any]] | None = None
    reference_samplers: tuple[tuple[str, Mapping[str, Any]], ...] = ()


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model: its generative story, data contract, hyperparameters and what diagnostics compare. How the
    zoo runs it (tuned option defaults, tiny, demo and reference settings) is ``settings``, a ``ZooSettings``.

    Attributes
    ----------
    name:
        the registry key.
    paper:
        the paper the model comes from (a citation line).
    description:
        a one-paragraph summary.
    model:
        the NumPyro model. It is called as ``model(**spec.model_inputs(data, hyper))``; observed
        sites take their values from the data (``obs=y``); the sites named in ``likelihood_sites``
        make up the pointwise ``log_likelihood`` group, every other sample site the ``log_prior``.
    likelihood_sites:
        the observed sites whose pointwise log density makes up the ``log_likelihood`` group; default ``("y",)``.
    observed_fields:
        data fields stored in the ``observed_data`` group (the rest go to ``constant_data``);
        default: the data fields named like a likelihood site.
    simulate:
        ``simulate(seed, **sizes) -> (data, truth)``: data is a dict the model takes, truth the
        generating parameters (including the hyperparameters used).
    data_fields:
        the data contract, checked by ``fit`` before any compilation.
    hyperparameters:
        name -> ``Hyper`` (defaults are the papers'/notes' recommendations); options of ``fit``.
        (The methods that serve the model are not listed here: the method registry knows them,
        ``inference.methods_for(spec)``.)
    model_inputs:
        ``(data, hyper) -> kwargs`` for the model; default: data and hyperparameters merged.
    check:
        extra validation ``(data, hyper) -> None`` raising ``ValueError`` (e.g. index ranges).
    dims:
        names of non-sample axes per site (``{"w": ["cluster", "feature"]}``); axes not named here get
        ``<site>_dim_<i>``, or the name of the plate they belong to.
    coords:
        ``coords(data, hyper) -> {dim: labels}``, the labels of the ``dims``. A coordinate given as an
        ``xarray.Variable`` is a non-dimension coordinate on the dims it names (hlcr's ``pair_agent`` and
        ``pair_entity`` on ``pair``).
    axis_dims:
        data-axis symbol -> the tree dimension that runs along it (``{"F": "feature"}``): the labels a table
        gives that axis (the column names of a two-axis field, the row index; ``zoo._frames``) become the
        coordinates of that dimension, and of the data groups' axis of the same symbol.
    summaries:
        for mixtures: ``(posterior: xarray.Dataset, data, hyper) -> xarray.Dataset`` of
        label-switching-invariant quantities (same chain/draw dims) that diagnostics compare instead
        of raw per-component parameters. ``None`` for models without label symmetry.
    bounded:
        compared quantities (summaries, or posterior variables of models without summaries) that live in
        a bounded interval, name -> (low, high), e.g. ``{"coclust": (0.0, 1.0)}`` for probabilities. The
        scorecard never fails a difference smaller than 1 % of that range (an absolute floor), so the
        rare-draw noise of a quantity pinned near a bound (a co-clustering probability of 0.999) cannot
        fail an exact sampler (``diagnostics.scorecard``).
    hyper_presets:
        named sets of hyperparameter values chosen by a string hyperparameter:
        ``{"prior": {"weak": {...}, "paper": {...}}}``; ``fit(..., prior="paper")`` applies that set,
        values given explicitly still win. The default preset's values must equal the ``Hyper`` defaults.
    nuts_reformulation:
        an exact ``Reformulation`` every ``nuts`` run of this model samples (its geometry fixed: sites
        integrated out, symmetries folded), mapped back to the model's sites; None: NUTS samples ``model``.
    real_datasets:
        name -> ``RealDataset``: real data shipped inside an installed package, in the model's data contract
        (``zoo list``/``zoo show`` print them, ``real_data(name)`` loads one, the demo has a real-data section).
    settings:
        the zoo's settings of this model (``ZooSettings``); default: none (an empty ``ZooSettings``).
    """

    name: str
    model: Callable[..., Any]
    simulate: Callable[..., tuple[dict, dict]]
    data_fields: tuple[DataField, ...]
    paper: str = ""
    description: str = ""
    hyperparameters: Mapping[str, Hyper] = dataclasses.field(default_factory=dict)
    likelihood_sites: tuple[str, ...] = ("y",)
    observed_fields: tuple[str, ...] | None = None
    model_inputs: Callable[[dict, dict], dict] | None = None
    check: Callable[[dict, dict], None] | None = None
    dims: Mapping[str, list[str]] = dataclasses.field(default_factory=dict)
    coords: Callable[[dict, dict], dict] | None = None
    axis_dims: Mapping[str, str] = dataclasses.field(default_factory=dict)
    summaries: Callable[..., Any] | None = None
    bounded: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    hyper_presets: Mapping[str, Mapping[str, Mapping[str, Any]]] = dataclasses.field(default_factory=dict)
    nuts_reformulation: Reformulation | None = None
    real_datasets: Mapping[str, RealDataset] = dataclasses.field(default_factory=dict)
    settings: ZooSettings = dataclasses.field(default_factory=ZooSettings)

    def __post_init__(self):
        if not isinstance(self.settings, ZooSettings):
            raise ValueError(f"settings: model {self.name!r} expects a zoo.ZooSettings, got "
                             f"{type(self.settings).__name__}")

    @property
    def default_hyper(self) -> dict[str, Any]:
        return {k: h.default for k, h in self.hyperparameters.items()}

    def inputs(self, data: Mapping[str, np.ndarray], hyper: Mapping[str, Any]) -> dict[str, Any]:
        """Keyword arguments of ``model`` for this data and these hyperparameters."""
        if self.model_inputs is not None:
            return self.model_inputs(dict(data), dict(hyper))
        return {**data, **hyper}

    def tiny_data(self, seed: int = 0) -> tuple[dict, dict]:
        """A tiny dataset (``settings.tiny_sizes``) for contract tests."""
        return self.simulate(seed, **self.settings.tiny_sizes)

    def default_data(self, seed: int = 0) -> tuple[dict, dict]:
        """The simulator's default dataset (``settings.demo_sizes``: what ``zoo compare``/``zoo demo`` and
        references use)."""
        return self.simulate(seed, **self.settings.demo_sizes)

    def reference_sets(self) -> dict[str, tuple[dict, dict]]:
        """Every stored reference ``make references`` makes, ``{tag: (data, options)}``: the settings'
        ``reference_datasets()`` (default: tag ``default`` on ``default_data()`` with ``reference_options``), then
        one ``real_<name>`` per real dataset in the demo: its data, the NUTS options of ``reference_options`` (then
        the dataset's own), and the hyperparameters' defaults overridden by the dataset's ``hyper``."""
        settings = self.settings
        sets = dict(settings.reference_datasets()) if settings.reference_datasets else {
            "default": (self.default_data()[0], dict(settings.reference_options))}
        nuts = {k: v for k, v in settings.reference_options.items() if k not in self.hyperparameters}
        for name, real in self.real_datasets.items():
            if real.in_demo:
                data, hyper = real.load()
                sets[REAL_TAG + name] = (data, {**nuts, **real.reference_options, **self.default_hyper, **hyper})
        return sets

    def real_data(self, name: str | None = None) -> tuple[dict, dict]:
        """``(data, hyper)`` of the real dataset ``name`` (None: the first declared one); ``ValueError`` naming
        the known ones otherwise."""
        if not self.real_datasets:
            raise ValueError(f"name: model {self.name!r} declares no real dataset")
        name = next(iter(self.real_datasets)) if name is None else name
        if name not in self.real_datasets:
            raise ValueError(f"name: model {self.name!r} has no real dataset {name!r}; it has "
                             f"{', '.join(self.real_datasets)}")
        return self.real_datasets[name].load()




def model_modules() -> list[str]:
    """Every public module of the ``zoo`` package (each registers its specs when imported): adding a model is
    adding ``zoo/<model>.py``, no list to edit."""
    import pkgutil

    return sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])  # the zoo package's folder
                  if not m.name.startswith("_") and not m.ispkg and m.name != "cli")


_REGISTRY: dict[str, ModelSpec] = {}
_loaded = False


def register(spec: ModelSpec, *, replace: bool = False) -> ModelSpec:
    """Add ``spec`` to the registry (``replace=True`` to overwrite an entry of the same name)."""
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"register expects a ModelSpec, got {type(spec).__name__}")
    if spec.name in _REGISTRY and not replace and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"a model named {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def _load_builtin_models() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in model_modules():
        importlib.import_module(f"zoo.{module}")


def list_models() -> list[str]:
    """Names of every registered model, sorted."""
    _load_builtin_models()
    return sorted(_REGISTRY)


def get(name: str | ModelSpec) -> ModelSpec:
    """The ``ModelSpec`` registered under ``name`` (a ``ModelSpec`` is returned unchanged)."""
    if isinstance(name, ModelSpec):
        return name
    _load_builtin_models()
    if not isinstance(name, str) or name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise ValueError(f"model: unknown model {name!r}; registered models are: {known}")
    return _REGISTRY[name]
