"""SVI baseline (NumPyro) with the three standard autoguides, available for every model.

``guide``: ``"normal"`` (AutoNormal, mean field), ``"lowrank"`` (AutoLowRankMultivariateNormal,
``rank`` option) or ``"mvn"`` (AutoMultivariateNormal), or a callable: a hand-written NumPyro guide with the
model's signature (e.g. ``inference.bpca.guide.guide``, the closed-form MFVI family of BPCA; ``init`` and ``rank``
are then unused). Adam (optax) with ``learning_rate``, NumPyro's ``SVI.stable_update`` (a step whose ELBO
estimate or gradient is not finite is skipped: its ``elbo`` entry is NaN, the tree's ``rejected_steps`` attr
counts them); ``num_steps`` steps; the ELBO trace is kept in ``sample_stats.elbo``. ``num_samples`` draws are
taken from the fitted guide, and ``log_q`` (the guide's log density at each draw, in the model's
constrained space) is stored with them so PSIS k-hat can be computed (Yao et al. 2018). The fitted guide's
parameters are stored in group ``variational``. There is no closed-form bound: the ``elbo`` trace holds the
``num_particles``-sample estimate at each step, and the tree's ``objective`` attribute the mean of its last 5 %
(of the finite ones).

Compiled once per (model, non-array model arguments, guide settings, data shapes), like ``nuts._sampling_program``: the
data arrays are arguments of three cached programs (``_programs``: initialise, a chunk of ``CHUNK_STEPS`` Adam
steps returning the fitted parameters too, ``DRAW_BLOCK`` draws), so a second fit on data of the same shapes (another
seed, another data set, another ``num_steps`` or ``num_samples``) compiles nothing. The initialisation and the draws
run once per fit: they are compiled with ``programs.ONE_SHOT`` (XLA's backend optimisation off), the steps with XLA's
default. AutoNormal (``guide="normal"``, every demo fit) needs no draw program where each latent site's transform is
one the host implements (``host_plan``: identity, exp, softplus, sigmoid, affine, stick-breaking, and compositions):
``host_draws`` replays its seeded draws and log q in NumPy from the fitted locations and scales. NumPyro's
autoguides set themselves up on their first call from that call's data (the prototype trace, the initial locations,
the constraint transforms), so each program builds its own guide and ``SVI`` inside its trace: a guide object kept
between fits would carry the first fit's data into the next. Only the initialisation needs NumPyro's whole set-up
(three traces of the model: its prototype, then ``find_valid_initial_params``'s candidate and its potential energy
with its gradient); the steps and the draws, whose parameters come from a state, set their guide up from the
prototype trace alone (``_SitesInModelOrder.prototype_only``), and ``SVI.init`` does not replay the model where
the prototype shows it has no ``param`` or ``mutable`` site of its own (``_svi_init``). ``init="median"`` is
NumPyro's ``init_to_median`` with its prior draws made on the host (``inference._init_strategies.
init_to_median_on_host``: the same initial point, without JAX's samplers compiled into the initialisation).

A fit that cannot be evaluated is a ``NonFiniteError`` with advice (lower ``learning_rate``, another ``guide`` or
``init``), never NumPyro's argument validation: the ELBO estimate non-finite at every step of the last 5 % (the
fit is stuck where it cannot be evaluated), or non-finite fitted parameters, draws or log q.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from numpyro import handlers
from numpyro.infer import SVI, Trace_ELBO, init_to_uniform
from numpyro.infer import util as numpyro_util
from numpyro.infer.autoguide import AutoGuide, AutoLowRankMultivariateNormal, AutoMultivariateNormal, AutoNormal
from tqdm.auto import tqdm

from inference import host_draws as hd
from inference import host_keys, programs
from inference._init_strategies import HOST_INIT_STRATEGIES, INIT_STRATEGIES
from inference._methods import Draws, FitContext, Option, register_method
from inference.progress import progress_enabled
from inference.trees import NonFiniteError, split_arguments

_GUIDES = ("normal", "lowrank", "mvn")
SVI_SETTINGS = ("guide", "init", "rank", "learning_rate", "num_particles")
# Adam steps per compiled chunk (a progress-bar update and a host round trip between chunks). Fixed, so one
# program serves every num_steps: the steps of the last chunk past num_steps are skipped (lax.cond).
CHUNK_STEPS = 250
DRAW_BLOCK = 64   # draws from the fitted guide per call of its draw program (fixed: no num_samples shapes it)


def _check(options: dict) -> None:
    """``guide`` is one of ``_GUIDES`` or a callable (not a plain choice, so it is checked here)."""
    if not callable(options["guide"]) and options["guide"] not in _GUIDES:
        raise ValueError(f"guide: expected one of {list(_GUIDES)} or a NumPyro guide function, "
                         f"got {options['guide']!r}")


def _with_globals(fn, **names):
    """``fn`` itself (its code, defaults and closure) with some of the module-level names it calls replaced: NumPyro's
    own code run with one callee swapped, without touching its module (other threads keep NumPyro's)."""
    copy = types.FunctionType(fn.__code__, {**fn.__globals__, **names}, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


def _prototype_as_initial(rng_key, model, *, prototype_params=None, **kwargs):
    """What ``find_valid_initial_params`` returns, ``((params, potential energy, gradient), is_valid)``, with the
    prototype's own unconstrained values as the initial params: nothing traced (no further candidate drawn, no
    potential energy and no gradient evaluated); ``is_valid`` traced, so ``initialize_model`` does not look at it.

    The NumPyro internals this leans on (numpyro 0.22): ``AutoGuide._setup_prototype`` calls ``initialize_model``
    (from ``numpyro.infer.util``), which calls ``find_valid_initial_params(rng_key, model, ...,
    prototype_params=...)`` with the unconstrained values of its prototype trace and reads only the returned
    ``(init_params, pe, grad), is_valid``; the guide keeps ``init_params`` as its initial locations (shapes and
    dtypes, which are the prototype's). ``_setup_from_prototype`` runs both functions' own code with this one
    callee swapped (``_with_globals``). Guarded by ``tests/test_svi_programs.py`` (fits equal to NumPyro's
    ``SVI.run`` with every guide; the set-up's structure equal to NumPyro's)."""
    return (prototype_params, jnp.zeros(()), prototype_params), jnp.asarray(True)


# NumPyro's AutoGuide._setup_prototype (numpyro.infer.autoguide), whose initialize_model (numpyro.infer.util) calls
# _prototype_as_initial instead of find_valid_initial_params: the autoguide's set-up from one trace of the model
# (initialize_model's prototype trace, `_get_model_transforms`), for a guide whose initial locations are not used
_setup_from_prototype = _with_globals(
    AutoGuide._setup_prototype,
    initialize_model=_with_globals(numpyro_util.initialize_model, find_valid_initial_params=_prototype_as_initial))


class _SitesInModelOrder(AutoGuide):
    """An autoguide's initial locations in the model's site order, traced or not. NumPyro's set-up finds them with
    ``find_valid_initial_params``: eagerly one step, in the model's order; traced (inside our programs) through a
    ``lax.while_loop``, whose dict comes back with sorted keys. AutoContinuous guides pack their latent vector in
    that order, so without this the layout of ``auto_loc``/``auto_scale_tril``/``auto_cov_factor`` in the tree
    would depend on where the guide was set up (sits between AutoContinuous and AutoGuide in the MRO).

    ``prototype_only`` (``make_guide``): a guide for a program that gets its parameters from a state rather than
    from the guide's initial locations (the Adam steps, the draws; each guide site's ``param`` is substituted):
    NumPyro's set-up of the same sites, shapes, plates and constraint transforms, from one trace of the model
    (``_setup_from_prototype``) instead of three (the prototype trace; ``find_valid_initial_params``'s candidate
    and its potential energy with its gradient, all compiled away there). Its initial locations are the
    prototype's values (``init_to_uniform``'s), not NumPyro's."""

    prototype_only = False

    def _setup_prototype(self, *args, **kwargs):
        if self.prototype_only:
            _setup_from_prototype(self, *args, **kwargs)
        else:
            super()._setup_prototype(*args, **kwargs)
        self._init_locs = {name: self._init_locs[name] for name in self.prototype_trace if name in self._init_locs}


class _Normal(AutoNormal, _SitesInModelOrder):
    pass


class _LowRank(AutoLowRankMultivariateNormal, _SitesInModelOrder):
    pass


class _MultivariateNormal(AutoMultivariateNormal, _SitesInModelOrder):
    pass


def make_guide(model, kind, init: str = "median", rank: int | None = None, strategies: dict = INIT_STRATEGIES,
               prototype_only: bool = False):
    """The autoguide ``kind`` of ``model`` (its latent sites in the model's order) initialised by
    ``strategies[init]`` (NumPyro's strategies; ``_programs`` passes ``HOST_INIT_STRATEGIES``, the same initial
    values), or ``kind`` itself when it is a guide function. ``prototype_only``: set up from one trace of the
    model, its initial locations not NumPyro's (``_SitesInModelOrder``), for programs that substitute its
    parameters."""
    if callable(kind):
        return kind
    init_loc_fn = init_to_uniform if prototype_only else strategies[init]
    if kind == "normal":
        guide = _Normal(model, init_loc_fn=init_loc_fn)
    elif kind == "lowrank":
        guide = _LowRank(model, init_loc_fn=init_loc_fn, rank=rank)
    else:
        guide = _MultivariateNormal(model, init_loc_fn=init_loc_fn)
    guide.prototype_only = prototype_only
    return guide


def _model_after_guide(model, guide):
    """``model`` as ``SVI.init`` traces it, after the guide (replayed on the guide's draws): there its trace serves
    only to collect the model's own ``param`` and ``mutable`` sites (and to warn of discrete latent sites). An
    autoguide's prototype trace, recorded by that guide call from a trace of the same model on the same
    arguments, already shows whether there are any; where there are none, the model's trace would add nothing to
    ``SVI.init``'s state or its constraint transforms, so it is not run. A guide function (no prototype) or a
    model with such sites: the model itself."""

    def model_(*args, **kwargs):
        prototype = getattr(guide, "prototype_trace", None)
        if prototype is None or any(
                site["type"] in ("param", "mutable") or (site["type"] == "sample" and not site["is_observed"]
                                                         and site["fn"].support.is_discrete)
                for site in prototype.values()):
            return model(*args, **kwargs)
        return None

    return model_


def _svi_init(model, guide, optim, loss, key, kwargs) -> tuple[SVI, Any]:
    """(``SVI(model, guide, optim, loss)``, its ``SVI.init(key, **kwargs)`` state): the state and the parameters'
    constraint transforms (``SVI.constrain_fn``) NumPyro's ``init`` gives, with the model traced only where that
    trace adds to them (``_model_after_guide``). ``SVI.init`` reads ``SVI.model`` only for that trace; the
    updates read it afterwards, so it is the model itself once ``init`` has run."""
    svi = SVI(_model_after_guide(model, guide), guide, optim, loss)
    state = svi.init(key, **kwargs)
    svi.model = model
    return svi, state


def draw_with_log_q(guide, params, key, model_kwargs) -> tuple[dict, jax.Array]:
    """One draw from the fitted guide seeded with ``key`` (as ``handlers.seed(guide, key)`` and NumPyro's
    ``psis_diagnostic`` do) and log q at it, in the model's constrained space: an autoguide's sites are
    ``TransformedDistribution``s of its unconstrained Gaussian, so their log prob includes the log |Jacobian| of
    the transform to each site's support."""
    tr = handlers.trace(handlers.seed(handlers.substitute(guide, data=params), key)).get_trace(**model_kwargs)
    log_q = 0.0
    values = {}
    for name, site in tr.items():
        if site["type"] != "sample":
            continue
        lp = site["fn"].log_prob(site["value"])
        log_q = log_q + jnp.sum(site["scale"] * lp if site.get("scale") is not None else lp)
        if not site.get("infer", {}).get("is_auxiliary", False):
            values[name] = site["value"]
    return values, log_q


def guide_draws(guide, params, key, num_samples: int, model_kwargs) -> tuple[dict, jax.Array]:
    """``num_samples`` draws from a fitted guide and log q at each (sum of the guide trace's log probs)."""
    return guide_draws_at(guide, params, jax.random.split(key, num_samples), model_kwargs)


def guide_draws_at(guide, params, keys, model_kwargs) -> tuple[dict, jax.Array]:
    """One draw from a given, already set-up guide object per key in ``keys`` and log q at each
    (``draw_with_log_q``), compiled for this call (the guide object carries the data it was set up with;
    ``run_svi`` uses its cached programs instead)."""
    return jax.jit(jax.vmap(lambda k: draw_with_log_q(guide, params, k, model_kwargs)))(keys)


def params_dataset(params) -> xr.Dataset:
    """Group ``variational``: the fitted guide's parameters (constrained values, as ``SVI.get_params`` returns
    them, e.g. ``<site>_auto_loc``/``<site>_auto_scale`` for AutoNormal, ``auto_loc``/``auto_scale_tril`` for
    AutoMultivariateNormal), so that q can be rebuilt from the tree."""
    arrays = {k: np.asarray(v) for k, v in params.items()}
    return xr.Dataset({k: ([f"{k}_dim_{i}" for i in range(v.ndim)], v) for k, v in arrays.items()})


class SVIPrograms(NamedTuple):
    """The compiled programs of one SVI configuration; ``arrays`` are the model's data arrays."""

    init: Callable[..., Any]   # (key, arrays) -> SVIState (NumPyro's SVI.init)
    steps: Callable[..., Any]  # (state, arrays, first, num_steps) -> (state, losses[CHUNK_STEPS], params): Adam
    #                            steps first, ..., first + CHUNK_STEPS - 1; those >= num_steps are skipped (loss
    #                            NaN); params = SVI.get_params(state) after them (constrained, as NumPyro's)
    draw: Callable[..., Any]   # (state, keys[DRAW_BLOCK], arrays) -> (params, draws, log_q): one draw per key


@programs.cached(maxsize=16)
def _programs(model, static: tuple, settings: tuple) -> SVIPrograms:
    """The jitted programs of SVI on ``model`` with its non-array arguments ``static`` bound and the guide and
    optimiser ``settings`` (``SVI_SETTINGS``), kept for the process (``inference.trees.split_arguments``: the
    data arrays are arguments, so fits on data of the same shapes share them)."""
    import optax  # here, not at the top: every fit loads this module (SVI serves every model), few run it

    o = dict(settings)

    def fresh(arrays, key, prototype_only=True):
        """A new guide and ``SVI`` and ``SVI.init(key)`` (``_svi_init``): the Python-side set-up (autoguide
        prototype, initial locations drawn with ``key``, the parameters' constraint transforms) is traced from this
        program's data. Only ``init`` uses the initial state (``prototype_only=False``: NumPyro's initial
        locations); the steps and the draws take their parameters from a state, so their guide is set up from one
        trace of the model (``make_guide``'s ``prototype_only``) and their initial state is compiled away."""
        kwargs = {**dict(static), **arrays}
        guide = make_guide(model, o["guide"], o["init"], o["rank"], HOST_INIT_STRATEGIES, prototype_only)
        svi, state = _svi_init(model, guide, optax.adam(o["learning_rate"]),
                               Trace_ELBO(num_particles=o["num_particles"]), key, kwargs)
        return svi, guide, kwargs, state

    def init(key, arrays):
        return fresh(arrays, key, prototype_only=False)[3]

    def steps(state, arrays, first, num_steps):
        svi, _, kwargs, _ = fresh(arrays, jax.random.key(0))
        skip = lambda s: (s, jnp.full((), jnp.nan))
        one = lambda s, t: jax.lax.cond(t < num_steps, lambda s: svi.stable_update(s, **kwargs), skip, s)
        state, losses = jax.lax.scan(one, state, first + jnp.arange(CHUNK_STEPS))
        return state, losses, svi.get_params(state)

    def draw(state, keys, arrays):
        svi, guide, kwargs, _ = fresh(arrays, jax.random.key(0))
        params = svi.get_params(state)
        draws, log_q = jax.vmap(lambda k: draw_with_log_q(guide, params, k, kwargs))(keys)
        return params, draws, log_q

    # init and draw run once per fit (draw once per block of draws): compiled for compile speed (programs.ONE_SHOT)
    return SVIPrograms(jax.jit(init, compiler_options=programs.ONE_SHOT), jax.jit(steps),
                       jax.jit(draw, compiler_options=programs.ONE_SHOT))


def draw_from(programs: SVIPrograms, state, key, arrays, num_samples: int) -> tuple[dict, dict, np.ndarray]:
    """(params, draws, log q) of ``num_samples`` draws, draw ``i`` seeded with ``split(key, num_samples)[i]``
    (``inference.host_keys``), ``DRAW_BLOCK`` keys per call of ``programs.draw`` (the last block padded with
    further keys, its extra draws cut), so the program does not depend on ``num_samples``."""
    keys = host_keys.split(key, -(-num_samples // DRAW_BLOCK) * DRAW_BLOCK)
    keys = host_keys.words(keys).reshape(-1, DRAW_BLOCK, 2)
    params, blocks = None, []
    for block in keys:
        params, draws, log_q = jax.device_get(programs.draw(state, host_keys.wrap(block), arrays))
        blocks.append((draws, log_q))
    draws, log_q = jax.tree.map(lambda *a: np.concatenate(a)[:num_samples], *blocks)
    return params, draws, log_q


def _host_forward(transform):
    """The NumPy ``z -> (x, log|det J| summed per draw)`` of a NumPyro constraint transform, or None where the host
    does not implement it (or its parameters are only known inside a trace, e.g. data-dependent bounds)."""
    from numpyro.distributions import transforms as T

    if isinstance(transform, T.IndependentTransform):
        return _host_forward(transform.base_transform)
    if type(transform) is T.ComposeTransform:
        parts = [_host_forward(t) for t in transform.parts]
        return None if any(p is None for p in parts) else hd.compose(*parts)
    if type(transform) is T.AffineTransform:
        if any(isinstance(v, jax.core.Tracer) for v in (transform.loc, transform.scale)):
            return None
        return hd.compose(hd.affine_transform(np.asarray(transform.loc, float), np.asarray(transform.scale, float)))
    simple = {T.IdentityTransform: hd.identity_transform, T.ExpTransform: hd.exp_transform,
              T.SoftplusTransform: hd.softplus_transform, T.SigmoidTransform: hd.sigmoid_transform,
              T.StickBreakingTransform: hd.stick_breaking_transform}
    forward = simple.get(type(transform))
    return None if forward is None else hd.compose(forward)


@programs.cached(maxsize=16)
def _host_plan(model, static: tuple, shapes: tuple) -> tuple | None:
    """AutoNormal's q site by site, for drawing on the host: ``((site, forward), ...)`` in the model's order (the
    order the guide samples them, so the order its seed handler hands out keys), ``forward`` the NumPy form of
    ``biject_to(support)``; None when a latent site's transform is not one the host implements or the model
    subsamples a plate (AutoNormal's draws then depend on more than its parameters). The model is traced
    abstractly (``jax.eval_shape``: nothing compiles), once per (model, non-array arguments, data shapes)."""
    from numpyro.distributions import biject_to

    plan: list = []

    def trace(arrays):
        tr = handlers.trace(handlers.seed(model, jax.random.key(0))).get_trace(**dict(static), **arrays)
        for name, site in tr.items():
            if site["type"] == "plate" and site["args"][1] not in (None, site["args"][0]):
                plan.append((name, None))
            if site["type"] == "sample" and not site["is_observed"]:
                plan.append((name, _host_forward(biject_to(site["fn"].support))))
        return 0

    jax.eval_shape(trace, {k: jax.ShapeDtypeStruct(shape, dtype) for k, shape, dtype in shapes})
    return None if any(forward is None for _, forward in plan) else tuple(plan)


def host_plan(model, model_kwargs, options) -> tuple | None:
    """``_host_plan`` for a fit with ``options``, or None where the compiled draw program is used instead: another
    guide than ``"normal"`` (AutoNormal), a guide function, or keys that are not JAX's default threefry."""
    if options["guide"] != "normal" or not hd.threefry_native():
        return None
    arrays, static = split_arguments(model_kwargs)
    shapes = tuple((k, tuple(np.shape(v)), str(np.asarray(v).dtype)) for k, v in sorted(arrays.items()))
    return _host_plan(model, static, shapes)


def host_draws(plan: tuple, params: dict, key, num_samples: int) -> tuple[dict, np.ndarray] | None:
    """(draws, log q) of ``num_samples`` draws from the fitted AutoNormal, in NumPy, the same draws as the
    compiled ``draw_with_log_q`` (draw ``i`` seeded with ``split(key, num_samples)[i]``; in the guide, site ``j``
    takes the second half of the ``j``-th split of that key, as NumPyro's ``seed`` handler does; its Normal
    noise is ``jax.random.normal``'s, ``inference.host_draws.threefry_normal``): z = loc + scale eps in the
    unconstrained space (``<site>_auto_loc``, ``<site>_auto_scale``), x = T(z), log q(x) = sum log N(z | loc,
    scale) - log|det dT/dz| (the density of NumPyro's ``TransformedDistribution``, at z itself rather than
    T^-1(x)). None when ``params`` are not exactly the plan's sites' loc and scale (then the caller draws
    compiled)."""
    locs = {k[:-len("_auto_loc")] for k in params if k.endswith("_auto_loc")}
    if locs != {name for name, _ in plan} or len(params) != 2 * len(plan):
        return None
    keys = host_keys.words(host_keys.split(key, num_samples)).reshape(num_samples, 2)
    draws, log_q = {}, np.zeros(num_samples)
    with np.errstate(all="ignore"):   # a diverged fit overflows here: check_fit names it, with advice
        for name, forward in plan:
            halves = hd.threefry_split(keys)
            keys, sub = halves[:, 0], halves[:, 1]
            loc, scale = np.asarray(params[f"{name}_auto_loc"]), np.asarray(params[f"{name}_auto_scale"])
            z = loc + hd.threefry_normal(sub, loc.shape) * scale
            draws[name], log_det = forward(z)
            log_q = log_q + hd.normal_log_pdf(z, loc, scale).reshape(num_samples, -1).sum(1) - log_det
    return draws, log_q


def programs_for(model, model_kwargs, options) -> tuple[SVIPrograms, dict]:
    """(the cached programs for this model, arguments and options; the data arrays to pass them)."""
    arrays, static = split_arguments(model_kwargs)
    settings = tuple((k, options[k]) for k in SVI_SETTINGS)
    return _programs(model, static, settings), arrays


OPTIONS = {
    "guide": Option("normal", "any", f"autoguide, one of {list(_GUIDES)}, or a NumPyro guide function"),
    "num_steps": Option(5000, "positive_int", "Adam steps", tiny=200),
    "learning_rate": Option(1e-2, "positive", "Adam step size"),
    "num_particles": Option(1, "positive_int", "Monte Carlo samples per ELBO gradient estimate"),
    "num_samples": Option(1000, "positive_int", "draws taken from the fitted guide", tiny=50),
    "rank": Option(None, "positive_int|None", "rank of the lowrank guide (None: NumPyro's default)"),
    "init": Option("median", "string", "initial point of the guide's location", choices=tuple(INIT_STRATEGIES)),
}


def advice(options: dict) -> str:
    guide = options["guide"] if isinstance(options["guide"], str) else getattr(options["guide"], "__name__", "?")
    return (f"lower learning_rate (now {options['learning_rate']:g}), or try another guide (now {guide!r}; "
            f"'normal' has the fewest parameters) or init (now {options['init']!r}; 'uniform' when the prior "
            f"median is degenerate), or check the data's scale")


def check_fit(elbo: np.ndarray, params: dict, draws: dict, log_q: np.ndarray, options: dict) -> None:
    """A ``NonFiniteError`` (with ``advice``) when the fit cannot be used: its ELBO estimate was not finite at
    any step (from the initial point on), or at any step of the last 5 % (every update there was rejected: the
    guide is stuck where the ELBO cannot be evaluated), or its parameters, draws or log q are not finite."""
    if not np.isfinite(elbo).any():
        raise NonFiniteError(f"method 'svi': the ELBO estimate was not finite at any of the {elbo.size} Adam steps, "
                             f"from the guide's initial point on (no update could be applied); {advice(options)}")
    tail = elbo[-max(1, elbo.size // 20):]
    if not np.isfinite(tail).any():
        raise NonFiniteError(f"method 'svi': the ELBO estimate was not finite at any of the last {tail.size} of "
                             f"{elbo.size} Adam steps (each was rejected, the guide is stuck where the ELBO cannot "
                             f"be evaluated); {advice(options)}")
    for what, values in (("fitted guide parameter", params), ("draw of", draws), ("log q", {"": log_q})):
        for name, value in values.items():
            value = np.asarray(value)
            if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
                raise NonFiniteError(f"method 'svi': {int((~np.isfinite(value)).sum())} non-finite value(s) in "
                                     f"{what} {name!r}".replace(" ''", "") + f"; {advice(options)}")


@register_method("svi", kind="variational", check=_check, options=OPTIONS)
def run_svi(ctx: FitContext) -> Draws:
    """Stochastic variational inference (Hoffman et al. 2013) with a NumPyro autoguide and Adam."""
    o = ctx.options
    compiled, arrays = programs_for(ctx.spec.model, ctx.model_kwargs, o)
    k_fit, k_draw = host_keys.parts(ctx.key)
    n = o["num_steps"]
    # the steps compile (XLA, in the background) while the initialisation compiles: the state's shapes come from
    # tracing the initialisation, a trace its own call then reuses
    state_shapes = compiled.init.eval_shape(k_fit, arrays)
    with programs.compile_ahead(compiled.steps, state_shapes, arrays, np.int64(0), np.int64(n)) as steps_ahead:
        state, losses = compiled.init(k_fit, arrays), []
        steps_ahead.result()
    with tqdm(total=n, desc="svi", disable=not progress_enabled(o["progress"]), leave=False) as bar:
        for first in range(0, n, CHUNK_STEPS):
            state, chunk, params = compiled.steps(state, arrays, np.int64(first), np.int64(n))
            losses.append(jax.device_get(chunk))  # waits for the chunk: the bar shows steps done, not queued
            bar.update(min(CHUNK_STEPS, n - first))
    elbo = -np.concatenate(losses)[:n]
    plan = host_plan(ctx.spec.model, ctx.model_kwargs, o)
    params = jax.tree.map(np.asarray, jax.device_get(params))
    drawn = None if plan is None else host_draws(plan, params, k_draw, o["num_samples"])
    if drawn is None:   # not AutoNormal, or a site the host does not implement: the compiled draw program
        params, draws, log_q = draw_from(compiled, state, k_draw, arrays, o["num_samples"])
    else:
        draws, log_q = drawn
    check_fit(elbo, params, draws, log_q, o)
    tail = elbo[-max(1, n // 20):]
    return Draws(posterior={k: np.asarray(v)[None] for k, v in draws.items()},
                 sample_stats={"log_q": np.asarray(log_q)[None]}, traces={"elbo": elbo},
                 groups={"variational": params_dataset(params)}, objective=float(np.mean(tail[np.isfinite(tail)])),
                 n_iter=n, attrs={"rejected_steps": int((~np.isfinite(elbo)).sum())})
