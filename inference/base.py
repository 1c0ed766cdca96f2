"""The kernel contract: what every hand-written kernel gives the one loop (``inference.loop``), typed.

The shape is blackjax's: a kernel never loops itself. Its module defines

* ``Config``: the kernel's **static configuration**, a hashable ``NamedTuple`` of Python numbers, strings and
  tuples (array sizes, the hyperparameters the program closes over, step options), never arrays. Every
  kernel's static settings go by this one name (``bpca.common.Config``, ``mppca.common.Config``,
  ``hlcr.common.Config``, ``hlcr.fedgibbs.Config``, ``gp_alps.gibbs.Config``, ``ssgp.problem.Config``);
* ``State`` and ``Info``: ``NamedTuple``s of arrays. ``Info.objective`` is the quantity the kernel reports at
  the state a step returns (the bound or ELBO of a variational step, the log likelihood of an EM step, the log
  joint of a Gibbs sweep): one name everywhere. ``Info.may_stop`` (optional, boolean) vetoes the loop's stopping
  rule at a step; ``Info.residual`` feeds a joint rule (``inference.loop.StopRule.tol_residual``);
* ``kernel(config, ...) -> Kernel``: the factory, decorated with ``@programs.cached``, so a second fit of the
  same configuration gets the same functions (and the loop's programs, keyed by what the functions compute,
  compile nothing either way: ``inference.programs``).

A ``Kernel`` holds pure functions, **the key (or seed) always first**:

* ``init(key, problem) -> State`` (``Init``);
* ``step(key, state, problem) -> (State, Info)`` (``Step``);
* variational kernels: ``draw(seed, state, num_samples, *static) -> (draws, log_q)`` (``Draw``), in NumPy on the
  host from ``np.random.default_rng(seed)`` (``inference.host_draws``: a one-shot job is not worth a program);
* samplers: ``collect(key, state, info) -> kept`` (``Collect``), what a kept step keeps (default: the state and
  its info), and ``chains``, how ``inference.loop.sample_chains`` runs the chains (``"vmap"``: batched; ``"map"``:
  one after another in each step).

``problem`` is a pytree of arrays (the data and the hyperparameters the kernel needs as values), passed as an
argument and never closed over: data sets of the same shapes share one compiled program and the persistent
compilation cache. Budgets (``max_iter``, ``tol``, ``num_warmup``, ``num_samples``, ``thinning``), the key and
the number of restarts are the loop's runtime arguments, not part of any of these.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax
import numpy as np

Problem = Any   # a pytree of arrays
State = Any     # the kernel's State NamedTuple
Info = Any      # the kernel's Info NamedTuple


class Init(Protocol):
    """``init(key, problem) -> State``: the start of one run (restart or chain)."""

    def __call__(self, key: jax.Array, problem: Problem, /) -> State: ...


class Step(Protocol):
    """``step(key, state, problem) -> (State, Info)``: one sweep, EM/VB update or ADMM round."""

    def __call__(self, key: jax.Array, state: State, problem: Problem, /) -> tuple[State, Info]: ...


class Collect(Protocol):
    """``collect(key, state, info) -> kept``: what a sampler keeps of a kept step (a pytree of arrays)."""

    def __call__(self, key: jax.Array, state: State, info: Info, /) -> Any: ...


class Draw(Protocol):
    """``draw(seed, state, num_samples, *static) -> (draws, log_q)``: ``num_samples`` draws of the model's latent
    sites from a fitted q (dict of NumPy arrays with a leading draw axis) and log q at each, on the host."""

    def __call__(self, seed: Any, state: State, num_samples: int, /, *static: Any
                 ) -> tuple[dict[str, np.ndarray], np.ndarray]: ...


class Kernel(NamedTuple):
    """The one kernel record every factory returns (module docstring): ``init`` and ``step`` always; ``draw`` for
    variational kernels whose q is drawn from the final state; ``collect`` and ``chains`` for samplers."""

    init: Init
    step: Step
    draw: Draw | None = None
    collect: Collect | None = None
    chains: str = "vmap"


__all__ = ["Collect", "Draw", "Info", "Init", "Kernel", "Problem", "State", "Step"]
