"""The method registry: what ``inference.fit(..., method=...)`` can run, and its options.

A method is a function ``run(ctx: FitContext) -> Draws``. Generic methods (``nuts``, ``svi``) work
on any model; a kernel registers for the models it implements
(``@register_method("gibbs", models=("hlcr",), options={...})``). The registry is the one source of truth
for which methods serve which model (``methods_for``): a model lists no methods of its own.

Kernels are found without a list: a fit of a zoo model defined in ``zoo/<paper>.py`` imports every module of
the paper package ``inference/<paper>/`` (``paper_of``); any other use (a listing of every method, a user's model)
imports every paper package (``GENERIC_PACKAGES`` such as ``distributed`` excepted). So adding a kernel module
touches no registry. A package's ``__init__`` may import its algorithm modules to fix the order in which the model's
methods are listed; the others follow in alphabetical order.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np

from zoo import ModelSpec
from zoo._validation import check_value

MethodKind = Literal["sampler", "variational", "point"]

# The constraint of every option name, one meaning per name across methods (DEVELOPERS: one name per
# concept): the one table every method's options are checked by. ``register_method`` gives each option of a
# method (a bare default or an ``Option``) the constraint listed here, and refuses an ``Option`` whose own
# constraint says otherwise; ``resolve_options`` checks every value by it before the method's own ``check``
# (ranges, choices). Only a name not listed here (an option a method registered later invents) keeps its
# ``Option``'s constraint ("any" when none is given). Constraint words as for ``zoo.Hyper``
# (``zoo._registry.Constraint``); ``|None`` where None is a meaningful value, never otherwise.
OPTION_CONSTRAINTS: dict[str, str] = {
    # loops and draws
    "num_warmup": "nonnegative_int",
    "num_samples": "positive_int",
    "num_chains": "positive_int",
    "max_iter": "positive_int",
    "tol": "positive",
    "num_steps": "positive_int",
    "learning_rate": "positive",
    "num_particles": "positive_int",
    "thinning": "positive_int",
    "num_restarts": "positive_int",
    "warm_start": "nonnegative_int",
    "chunk": "positive_int",
    "chunk_size": "positive_int|None",
    "kl_inner": "positive_int",
    "progress": "bool|None",
    # samplers
    "dense_mass": "bool",
    "reformulate": "bool",
    "target_accept_prob": "open_unit_interval",
    "max_tree_depth": "positive_int",
    "collapsed": "bool",
    "swap": "bool",
    "rescale": "bool",
    "z_init": "any",
    "init": "string",
    "kernel": "string",
    "prior": "string",
    # variational
    "guide": "any",
    "rank": "positive_int|None",
    "schedule": "string",
    "init_logit_rho": "real",
    "mu_lam_init": "real[]",
    "step_max": "positive",
    "backtrack": "bool",
    "factorisation": "string",
    "prune_below": "nonnegative",
    "rank_threshold": "nonnegative",
    "paper_literal": "bool",
    "covariance_prior": "string",
    # distributed
    "graph": "any",
    "eta": "positive",
    "tol_consensus": "positive|None",
    "runner": "string",
    "on_node_failure": "string",
    "num_nodes": "positive_int|None",
    "num_agents": "positive_int|None",
    "penalty": "string",
    "prior_weight": "string",
    "adaptive_eta": "bool",
    "tau_sharing": "string",
    "gamma": "unit_interval",
    "participation": "unit_interval",
    "dropout": "probability",
    "dp_noise_scale": "nonnegative",
    "leave_own_out": "bool",
}

GENERIC_METHOD_MODULES: tuple[str, ...] = ("inference.nuts", "inference.svi")
# Sub-packages of ``inference`` that hold shared machinery, not a paper's kernels.
GENERIC_PACKAGES: frozenset[str] = frozenset({"distributed"})


@dataclasses.dataclass(frozen=True)
class Draws:
    """What a method hands back to ``fit``, which turns it into the DataTree.

    Attributes
    ----------
    posterior:
        site -> array with leading (chain, draw) axes. Must contain every latent sample site of the NumPyro
        model (log densities are evaluated at these values); may hold more (discrete labels, derived quantities).
    sample_stats:
        per-draw statistics, leading (chain, draw) axes (divergences, log_q, log joint).
    traces:
        per-iteration traces (ELBO/bound, residuals): arrays with leading axis ``iteration`` (or
        (chain, iteration)); stored in ``sample_stats`` under dim ``iteration``.
    dims:
        names of the non-sample axes of the variables above.
    coords:
        the labels of those axes.
    attrs:
        extra attributes for the tree (JSON-serialisable).
    groups:
        extra groups, name -> xarray.Dataset (e.g. a method's point estimates).
    objective:
        the kernel's objective (``Info.objective``: bound, ELBO, log likelihood) after its last step, for
        optimisation kernels; stored as the tree's ``objective`` attribute.
    converged:
        whether the stopping rule fired before ``max_iter`` (attribute ``converged``).
    n_iter:
        steps run (attribute ``n_iter``).
    """

    posterior: dict[str, Any]
    sample_stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    traces: dict[str, Any] = dataclasses.field(default_factory=dict)
    dims: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    coords: dict[str, Any] = dataclasses.field(default_factory=dict)
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    groups: dict[str, Any] = dataclasses.field(default_factory=dict)
    objective: float | None = None
    converged: bool | None = None
    n_iter: int | None = None


@dataclasses.dataclass(frozen=True)
class Option:
    """A method option, declared like a hyperparameter (``zoo.Hyper``): its default, the constraint ``fit``
    checks (``zoo._registry.Constraint``), the allowed values when it is a choice, a one-line doc (printed
    by ``zoo show``) and ``tiny``: the value the contract test (``tests/test_contract.py``) runs every
    (model, method) pair with on tiny data (None: the default), e.g. 20 samples instead of 1000."""

    default: Any
    constraint: str | None = None  # None: the name's entry of OPTION_CONSTRAINTS ("any" if it has none)
    doc: str = ""
    choices: tuple[Any, ...] | None = None
    tiny: Any = None

    def check(self, name: str, value: Any) -> Any:
        value = check_value(name, value, self.constraint or option_constraint(name))
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{name}: expected one of {list(self.choices)}, got {value!r}")
        return value


def option_constraint(name: str, declared: str | None = None) -> str:
    """The constraint of option ``name``: its entry of ``OPTION_CONSTRAINTS``; a name the table does not list
    keeps ``declared`` ("any" when None). A ``declared`` constraint that contradicts the table is a
    ``ValueError`` naming the option: one name, one meaning, whichever method declares it."""
    listed = OPTION_CONSTRAINTS.get(name)
    if listed is None:
        return declared or "any"
    if declared is not None and declared != listed:
        raise ValueError(f"{name}: declared with constraint {declared!r}, but OPTION_CONSTRAINTS gives {listed!r} "
                         f"(one constraint per option name; change the table or the name)")
    return listed


def _with_constraint(name: str, option: Option | Any) -> Option:
    """``option`` (an ``Option`` or a bare default) as an ``Option`` carrying its constraint
    (``option_constraint``)."""
    if not isinstance(option, Option):
        return Option(option, option_constraint(name))
    return dataclasses.replace(option, constraint=option_constraint(name, option.constraint))


# Options every method accepts.
COMMON_OPTIONS: dict[str, Option] = {
    "progress": _with_constraint("progress", Option(None, doc="show a progress bar (default: only when stderr is a "
                                                              "terminal)"))}


@dataclasses.dataclass(frozen=True)
class FitContext:
    """Everything a method needs: validated data, hyperparameters, options and an explicit key."""

    spec: ModelSpec
    data: dict[str, np.ndarray]
    hyper: dict[str, Any]
    options: dict[str, Any]
    key: jax.Array
    seed: int

    @property
    def model_kwargs(self) -> dict[str, Any]:
        """``spec.inputs(data, hyper)``, computed once per context (gp_alps's kernel factors are eigen-
        decompositions of n x n matrices: ``prepare`` reads the inputs for its memory estimate, the method again);
        a fresh dict every time, so a method that edits it changes nothing for the next reader."""
        return dict(self._model_kwargs)

    @functools.cached_property
    def _model_kwargs(self) -> dict[str, Any]:
        return self.spec.inputs(self.data, self.hyper)


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    run: Callable[[FitContext], Draws]
    declared: Mapping[str, Option]
    kind: MethodKind
    models: tuple[str, ...] | None  # None: any model
    check: Callable[[dict[str, Any]], None] | None = None
    doc: str = ""

    @property
    def options(self) -> dict[str, Any]:
        """Option name -> default."""
        return {k: o.default for k, o in self.declared.items()}


_METHODS: dict[tuple[str | None, str], Method] = {}
_loaded = False
_loaded_papers: set[str] = set()   # paper packages imported by a fit of one of their models


def register_method(name: str, *, kind: MethodKind, options: Mapping[str, Option | Any],
                    models: tuple[str, ...] | None = None,
                    check: Callable[[dict[str, Any]], None] | None = None):
    """Decorator registering ``run(ctx) -> Draws`` as method ``name``.

    ``options``: name -> ``Option(default, constraint, doc, choices)`` (every accepted option must appear
    here; ``fit`` rejects unknown names); a bare value is an option with that default. Every option's
    constraint is its entry of ``OPTION_CONSTRAINTS`` (``option_constraint``: an ``Option`` may restate it, not
    contradict it). ``check(options)`` may add validation that relates options.
    """
    declared = {**COMMON_OPTIONS, **{k: _with_constraint(k, v) for k, v in options.items()}}

    def deco(run: Callable[[FitContext], Draws]):
        method = Method(name, run, declared, kind, models, check, (run.__doc__ or "").strip())
        for model in models or (None,):
            _METHODS[(model, name)] = method
        return run

    return deco


def kernel_modules(papers: tuple[str, ...] | None = None) -> list[str]:
    """Every module of every paper package ``inference/<paper>/`` (or of those named in ``papers``): each package
    is imported first (its ``__init__`` imports its method modules in the paper's order, which is the order
    ``methods_for`` lists them in), then the walk finds every other module."""
    found = []
    for pkg in pkgutil.iter_modules([str(Path(__file__).parent)]):  # the inference package's folder
        if not pkg.ispkg or pkg.name in GENERIC_PACKAGES or pkg.name.startswith("_"):
            continue
        if papers is not None and pkg.name not in papers:
            continue
        package = importlib.import_module(f"inference.{pkg.name}")
        found.append(package.__name__)
        found += [m.name for m in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.")
                  if not m.name.rsplit(".", 1)[-1].startswith("__")]
    return found


def paper_of(spec: ModelSpec) -> str | None:
    """The paper package whose kernels serve ``spec``: a zoo model defined in ``zoo/<paper>.py`` has its kernels in
    ``inference/<paper>/`` (``ppca`` and ``mppca`` in ``zoo/mppca.py``, the three ssgp models in ``zoo/ssgp.py``);
    ``None`` for a model defined elsewhere (a user's)."""
    module = getattr(spec.model, "__module__", "") or ""
    parts = module.split(".")
    if len(parts) != 2 or parts[0] != "zoo" or parts[1] in GENERIC_PACKAGES:
        return None
    return parts[1] if importlib.util.find_spec(f"inference.{parts[1]}") is not None else None


def _load_kernels(spec: ModelSpec | None = None) -> None:
    """Register the generic methods and the kernels by importing their modules: ``spec``'s paper package only,
    where it has one (``paper_of``), else every paper's. A cold fit then imports one paper's kernels, not all
    five (a few tenths of a second of its first contact); every listing of all methods loads them all."""
    global _loaded
    if _loaded:
        return
    for module in GENERIC_METHOD_MODULES:
        importlib.import_module(module)
    paper = None if spec is None else paper_of(spec)
    if paper is not None:
        if paper not in _loaded_papers:
            for module in kernel_modules((paper,)):
                importlib.import_module(module)
            _loaded_papers.add(paper)
        return
    for module in kernel_modules():
        importlib.import_module(module)
    _loaded = True


def methods_for(model: ModelSpec | str) -> list[str]:
    """The methods ``inference.fit`` accepts for ``model`` (a ``ModelSpec`` or a registered name): the generic
    methods (``nuts``, ``svi``), then the kernels registered for the model, in registration order."""
    import zoo

    spec = zoo.get(model)
    name = spec.name
    _load_kernels(spec)
    generic = [m for (owner, m) in _METHODS if owner is None]
    return generic + [m for (owner, m) in _METHODS if owner == name and m not in generic]


def get_method(spec: ModelSpec, name: str) -> Method:
    """The method ``name`` for ``spec``, or a ``ValueError`` naming the methods it supports."""
    _load_kernels(spec)
    method = _METHODS.get((spec.name, name)) or _METHODS.get((None, name)) if isinstance(name, str) else None
    if method is None:
        raise ValueError(f"method: {spec.name!r} supports methods {methods_for(spec)}, got {name!r}")
    return method


def resolve_options(spec: ModelSpec, method: Method, given: Mapping[str, Any]) -> dict[str, Any]:
    """Method defaults < the model's per-method overrides < ``given``; every value checked against
    ``OPTION_CONSTRAINTS`` (NumPy scalars become Python scalars), then by the method's ``check``."""
    allowed = method.declared
    options = {**method.options, **spec.settings.method_options.get(method.name, {})}
    for k, v in given.items():
        if k not in allowed:
            raise ValueError(f"{k}: not an option of method {method.name!r} for {spec.name!r}; "
                             f"options are {sorted(allowed)} and hyperparameters "
                             f"{sorted(spec.hyperparameters)}")
        options[k] = v
    for k, v in options.items():
        options[k] = allowed[k].check(k, v)
    if method.check is not None:
        method.check(options)
    return options


def available_methods() -> dict[str, Method]:
    """Every registered method name -> one Method (for CLI help)."""
    _load_kernels()
    return {name: m for (_, name), m in sorted(_METHODS.items(), key=lambda kv: kv[0][1])}
