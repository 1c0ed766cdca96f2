"""Upper bounds on what one fit may ask for, checked by ``inference.prepare`` before anything compiles.

An option value alone must never exhaust the machine's memory or run for hours (issue 33, item 8): each
request is measured in two units and refused with a ``ValueError`` that names the option, the estimate and the
limit.

**Sequential steps** (``check_steps``, no data needed). The loop of the hand-written kernels counts steps in
32-bit integers (``inference.loop``: its step and chunk counters are int32), so ``2**31 - 1`` steps is a hard
ceiling (``STEP_CEILING``); a Python int past int64 cannot even become an argument of a compiled program. Far
below that, ``MAX_STEPS = 10**7`` steps of one chain or one run is hours for any model whose step takes a
millisecond, and no setting the package documents or stores (demos, stored references, tests) comes within a
factor of 50 of it. Steps counted, per chain or run:

* samplers: ``num_warmup + num_samples * thinning``;
* optimisation loops: ``max_iter`` (times ``kl_inner``, the inner alternations of one round, where given);
  SVI: ``num_steps``; the loop sizes ``chunk`` and ``warm_start`` are bounded alike;
* NUTS: one draw's trajectory may take ``2**max_tree_depth - 1`` leapfrog steps, so ``max_tree_depth`` is at
  most ``log2(MAX_STEPS)`` (23).

``BAYES_ZOO_MAX_STEPS`` raises the limit up to the ceiling.

**Memory** (``check_memory``, after the data are read). With, for the model on these data and
hyperparameters, ``L`` the number of latent values of one draw (every non-observed sample site of the model,
found by tracing it abstractly with ``jax.eval_shape``: no value is computed, no program compiled), ``N`` the
number of observed values (the spec's ``observed_fields``), ``D`` the number of data values and ``n`` the
number of rows (the longest leading axis), and for the method's options
``C`` chains, ``S`` kept draws (``num_samples``; 1 for a point estimate), ``R`` restarts, ``P`` particles,
``A`` agents or nodes (``num_agents``/``num_nodes``, else the distinct labels of the data's ``agent``/``node``
field; 1 for a method without either), ``K`` components (the hyperparameter ``K``, else 0) and ``T`` the
sampler steps above::

    bytes = 8 x ( C S (2 L + N + n)                the draws: posterior and log_prior (<= L values each),
                                                   log_likelihood (<= N) and per-draw labels or stats (<= n)
                + C R P ((A + 2 depth) L + D + K n)  every parallel copy: its own state (one per agent; NUTS
                                                   keeps 2 max_tree_depth momentum checkpoints), the
                                                   intermediates of one pass over the data, K x n
                                                   responsibilities
                + T )                              a sampler's step keys (8 bytes each)

All values are float64 or int64 (8 bytes). The estimate counts what a fit must hold at once, not the copies
made on the way (a tree is built from the draws), so it is a floor, honest within a small factor; the limit
it is held to is ``MEMORY_FRACTION`` (half) of the machine's physical memory, or ``BAYES_ZOO_MEMORY_LIMIT``
(bytes, with an optional ``K``/``M``/``G``/``T`` suffix, powers of 1024; ``off`` disables the check). A
request beyond the limit names the option that, set back to its default, lowers the estimate most (a
hyperparameter such as ``K`` included: it sizes the latent sites), else the largest data field. The limit is the
host's memory also where JAX computes on a GPU (the draws and the tree end up on the host).

**Shards** (``check_shards``): ``num_agents``/``num_nodes`` above the number of rows is refused in one line
(each agent or node must hold a row).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

MAX_STEPS = 10**7
STEP_CEILING = 2**31 - 1
STEPS_ENV = "BAYES_ZOO_MAX_STEPS"
MEMORY_ENV = "BAYES_ZOO_MEMORY_LIMIT"
MEMORY_FRACTION = 0.5
BYTES_PER_VALUE = 8
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

# Options that size a fit's memory (parallel copies, kept draws, sampler steps); every other positive integer
# option or hyperparameter above its default is also tried when naming the culprit.
_SIZE_OPTIONS = ("num_chains", "num_samples", "num_restarts", "num_particles", "num_agents", "num_nodes",
                 "num_warmup", "thinning", "max_tree_depth")


# --------------------------------------------------------------------------------------------------
# Sequential steps
# --------------------------------------------------------------------------------------------------

def max_steps() -> tuple[int, str]:
    """(the step limit, where it comes from): ``$BAYES_ZOO_MAX_STEPS`` (an integer up to ``STEP_CEILING``),
    else ``MAX_STEPS``; a ``ValueError`` naming the variable for anything else."""
    text = os.environ.get(STEPS_ENV, "").strip().replace("_", "")
    if not text:
        return MAX_STEPS, f"the default; {STEPS_ENV} unset"
    if not text.isdigit() or not 1 <= int(text) <= STEP_CEILING:
        raise ValueError(f"{STEPS_ENV}: expected an integer in [1, {STEP_CEILING:,}] (the loops count steps in "
                         f"32-bit integers), got {os.environ[STEPS_ENV]!r}")
    return int(text), f"{STEPS_ENV}={int(text):,}"


def step_counts(options: Mapping[str, Any]) -> dict[str, tuple[int, str]]:
    """Each sequential count of ``options`` (one chain's or one run's steps): label -> (steps, what they are)."""
    o = options
    counts: dict[str, tuple[int, str]] = {}
    if "num_warmup" in o and "num_samples" in o:
        counts["sampler"] = (o["num_warmup"] + o["num_samples"] * o.get("thinning", 1),
                             "sequential steps per chain (num_warmup + num_samples x thinning)")
    if isinstance(o.get("max_iter"), int):
        inner = o.get("kl_inner", 1) if o.get("penalty", "kl") == "kl" else 1
        counts["max_iter"] = (o["max_iter"] * inner,
                              "sequential steps (max_iter" + (" x kl_inner)" if "kl_inner" in o else ")"))
    for name in ("num_steps", "chunk", "warm_start"):
        if isinstance(o.get(name), int):
            counts[name] = (o[name], f"sequential steps ({name})")
    if isinstance(o.get("max_tree_depth"), int):
        steps = 2 ** min(o["max_tree_depth"], 64) - 1   # 2**64 already passes every limit; 2**(10**9) takes long
        counts["max_tree_depth"] = (steps, "leapfrog steps for one draw (2**max_tree_depth - 1)")
    return counts


def check_steps(options: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """A ``ValueError`` when a sequential count of ``options`` (``step_counts``) passes the step limit, naming
    the option that, set back to its default (``defaults``), lowers it most, the count and the limit."""
    limit, source = max_steps()
    for label, (steps, what) in step_counts(options).items():
        if steps <= limit:
            continue
        name = _culprit(options, defaults, lambda o, label=label: step_counts(o).get(label, (0, ""))[0],
                        fallback="num_samples" if label == "sampler" else label)
        raise ValueError(f"{name}: {name}={options[name]!r} asks for {_count(steps)} {what}, above the limit of "
                         f"{limit:,} ({source}): a run that long takes hours even at a millisecond a step. Lower "
                         f"{name}, or raise {STEPS_ENV} (at most {STEP_CEILING:,}: the loops count steps in 32-bit "
                         f"integers)")


# --------------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Estimate:
    """The memory estimate of one fit (module docstring): its factors and the total in bytes."""

    latent: int      # L
    observed: int    # N
    data: int        # D
    rows: int        # n
    chains: int      # C
    draws: int       # S
    copies: int      # C R P
    agents: int      # A
    depth: int       # NUTS max_tree_depth (0 otherwise)
    components: int  # K
    steps: int       # T

    @property
    def values(self) -> int:
        L, D = self.latent, self.data
        return (self.chains * self.draws * (2 * L + self.observed + self.rows)
                + self.copies * ((self.agents + 2 * self.depth) * L + D + self.components * self.rows)
                + self.steps)

    @property
    def nbytes(self) -> int:
        return BYTES_PER_VALUE * self.values

    def formula(self) -> str:
        """The estimate written out, e.g. ``8 bytes x (2 chains x 1,000 draws x 2 x (30 latent + 150 data values)
        + 2 parallel copies x (30 state + 150 data) + 2,000 step keys)``; terms that are 0 left out."""
        state = self.agents + 2 * self.depth
        copy = [f"{state:,} x {self.latent:,} state" if state > 1 else f"{self.latent:,} state", f"{self.data:,} data"]
        if self.components:
            copy.append(f"{self.components:,} x {self.rows:,} responsibilities")
        keys = f" + {self.steps:,} step keys" if self.steps else ""
        return (f"8 bytes x ({self.chains:,} chains x {self.draws:,} draws x (2 x {self.latent:,} latent + "
                f"{self.observed:,} observed + {self.rows:,} rows) + {self.copies:,} parallel copies x "
                f"({' + '.join(copy)}){keys})")


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (``os.sysconf``, else psutil where installed), None if unknown."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        try:
            import psutil
        except ImportError:
            return None
        return int(psutil.virtual_memory().total)


def memory_limit() -> tuple[int | None, str]:
    """(the memory limit in bytes, where it comes from): ``$BAYES_ZOO_MEMORY_LIMIT`` (``8G``, ``512M``, a number
    of bytes; ``off``: None, no limit), else ``MEMORY_FRACTION`` of the physical memory (None where unknown)."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if text:
        if text.lower() in ("off", "none", "0"):
            return None, f"{MEMORY_ENV}={text}"
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", text, flags=re.IGNORECASE)
        if match is None:
            raise ValueError(f"{MEMORY_ENV}: expected a number of bytes with an optional K, M, G or T suffix "
                             f"(e.g. 8G), or 'off', got {text!r}")
        return int(float(match[1]) * _UNITS[match[2].upper()]), f"{MEMORY_ENV}={text}"
    total = physical_memory()
    if total is None:
        return None, "physical memory unknown"
    return int(total * MEMORY_FRACTION), f"{MEMORY_FRACTION:.0%} of this machine's {_bytes(total)} of physical memory"


def estimate_memory(spec, data: Mapping[str, np.ndarray], hyper: Mapping[str, Any], options: Mapping[str, Any],
                    model_kwargs: Mapping[str, Any] | None = None) -> Estimate:
    """The memory ``Estimate`` of fitting ``spec`` to validated ``data`` with ``hyper`` and a method's
    ``options`` (module docstring); traces nothing it has traced before for these shapes. ``model_kwargs``:
    ``spec.inputs(data, hyper)`` where the caller has them (they can be costly)."""
    o = options
    sizes = [np.shape(v) for v in data.values()]
    chains = int(o.get("num_chains", 1))
    agents = o.get("num_agents", o.get("num_nodes"))
    if agents is None and ("num_agents" in o or "num_nodes" in o):
        field = "agent" if "num_agents" in o else "node"
        agents = len(np.unique(np.asarray(data[field]).ravel())) if field in data else 1
    sampler = "num_warmup" in o and "num_samples" in o
    k = hyper.get("K", 0)
    observed = spec.observed_fields if spec.observed_fields is not None else spec.likelihood_sites
    rows = max((s[0] for s in sizes if s), default=1)
    return Estimate(latent=latent_size(spec, data, hyper, model_kwargs), data=sum(math.prod(s) for s in sizes),
                    observed=sum(int(np.size(data[f])) for f in observed if f in data) or rows,
                    rows=rows, chains=chains, draws=int(o.get("num_samples", 1)),
                    copies=chains * int(o.get("num_restarts", 1)) * int(o.get("num_particles", 1)),
                    agents=int(agents or 1), depth=int(o.get("max_tree_depth", 0)),
                    components=int(k) if isinstance(k, int) else 0,
                    steps=o["num_warmup"] + o["num_samples"] * o.get("thinning", 1) if sampler else 0)


def check_memory(spec, data: Mapping[str, np.ndarray], hyper: Mapping[str, Any], options: Mapping[str, Any],
                 defaults: Mapping[str, Any], model_kwargs: Mapping[str, Any] | None = None) -> Estimate | None:
    """The ``Estimate`` of this fit (None when the limit is off), or a ``ValueError`` when it passes
    ``memory_limit()``: it names the option or hyperparameter that, set back to its default (``defaults``: the
    method's option defaults and the model's hyperparameter defaults), lowers the estimate most (else the largest
    data field), the estimate with its formula, and the limit with where it comes from. ``model_kwargs`` as for
    ``estimate_memory``."""
    limit, source = memory_limit()
    if limit is None:   # off: nothing to hold the estimate to, so nothing traced
        return None
    estimate = estimate_memory(spec, data, hyper, options, model_kwargs)
    if estimate.nbytes <= limit:
        return estimate
    given = {**hyper, **options}

    def total(values):
        changed = any(values[k] != hyper[k] for k in hyper)
        return estimate_memory(spec, data, {k: values[k] for k in hyper}, {k: values[k] for k in options},
                               None if changed else model_kwargs).nbytes

    largest = max(data, key=lambda f: np.size(data[f]))
    name = _culprit(given, defaults, total, fallback=None)
    what = f"{name}={given[name]!r}" if name else f"data[{largest!r}] of shape {np.shape(data[largest])}"
    raise ValueError(f"{name or f'data[{largest!r}]'}: {what} needs about {_bytes(estimate.nbytes)} of memory "
                     f"({estimate.formula()}), above the limit of {_bytes(limit)} ({source}). Lower "
                     f"{name or 'the data'}, or set {MEMORY_ENV} (e.g. 64G, or off)")


def check_shards(data: Mapping[str, np.ndarray], options: Mapping[str, Any]) -> None:
    """A ``ValueError`` when ``num_agents`` or ``num_nodes`` asks for more agents or nodes than the data have rows:
    each must hold at least one row, so such a count can only be a mistake (checked after ``check_memory``, so
    a count beyond memory is named as such; below it, the error is this one line, not a list of empty shards)."""
    rows = max((np.shape(v)[0] for v in data.values() if np.ndim(v)), default=0)
    for name in ("num_agents", "num_nodes"):
        value = options.get(name)
        if isinstance(value, int) and value > rows:
            raise ValueError(f"{name}: {name}={value} asks for more shards than the data have rows ({rows:,}); "
                             f"each must hold at least one row")


@functools.lru_cache(maxsize=256)
def _latent_of(model, static: tuple, arrays: tuple) -> int:
    """``L`` from the model's abstract trace as ``inference.trees`` records it (``trees._structure``, seed 0, the
    same key as ``trees.densities_ahead``'s), so a fit traces the model once for both."""
    from inference.trees import _structure

    structure = _structure(model, static, arrays, (), 0)
    return sum(math.prod(s["shape"]) for s in structure.values() if s["type"] == "sample" and not s["is_observed"])


def latent_size(spec, data: Mapping[str, np.ndarray], hyper: Mapping[str, Any],
                model_kwargs: Mapping[str, Any] | None = None) -> int:
    """``L``: the number of latent values of one draw of ``spec``'s model on ``data`` and ``hyper`` (every
    non-observed sample site), by an abstract trace (``jax.eval_shape``: nothing computed or compiled), kept per
    model, non-array arguments and array shapes (``model_kwargs``: ``spec.inputs(data, hyper)``, else computed
    here). A model that cannot be traced abstractly (Python control flow
    on data values) counts ``D``, its number of data values."""
    from inference.trees import split_arguments

    inputs = spec.inputs(dict(data), dict(hyper)) if model_kwargs is None else model_kwargs
    arrays, static = split_arguments(dict(inputs))
    shapes = tuple(sorted((k, tuple(np.shape(v)), np.result_type(v).str) for k, v in arrays.items()))
    try:
        hash((spec.model, static))
        count = _latent_of
    except TypeError:   # an unhashable argument: traced without the cache
        count = _latent_of.__wrapped__
    try:
        return count(spec.model, static, shapes)
    except Exception:   # noqa: BLE001  (not traceable abstractly: the data size stands in)
        return sum(int(np.size(v)) for v in data.values())


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------

def _culprit(given: Mapping[str, Any], defaults: Mapping[str, Any], measure, fallback):
    """The name among ``given`` whose value, set back to its default, lowers ``measure(values)`` most (only
    integers above an integer default, or with the default None, e.g. ``num_agents``: from the data, are
    tried), else ``fallback``."""
    base = measure(given)
    best, drop = fallback, 0
    for name, value in given.items():
        default = defaults.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or isinstance(default, bool) or not (
                default is None and name in defaults or isinstance(default, int) and value > default):
            continue
        lowered = base - measure({**given, name: default})
        if lowered > drop:
            best, drop = name, lowered
    return best


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} EiB"


def _count(steps: int) -> str:
    return f"{steps:,}" if steps < 10**15 else f"about {steps:.3g}"
