"""Compiling ahead (``inference.programs.compile_ahead``): a program's XLA compile runs in a background thread while
the caller goes on, the caller's later call finds it compiled, its error reaches the caller as the same exception,
and a fit that compiles ahead (the tree's log densities; SVI's steps) returns the same numbers and builds the same
programs as one that does not (``programs.compiling_ahead(False)``), with nothing left compiling after it."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import inference
import zoo
from inference import programs, trees
from inference._methods import get_method
from inference._timing import Stopwatch


def _polynomial(x, c):
    return jnp.sum(jnp.polyval(c, x) * jnp.cos(x)), jnp.cumsum(x) * c[0]


def test_a_program_compiled_ahead_is_the_plain_jits_and_its_call_compiles_nothing():
    x, c = np.linspace(-1.0, 2.0, 7), np.array([0.5, -1.25, 3.0])
    program = jax.jit(_polynomial)
    with Stopwatch() as watch:
        ahead = programs.compile_ahead(program, jax.ShapeDtypeStruct(x.shape, x.dtype), c)
        compiled = ahead.result()
    assert watch.xla_compiles == ["jit(_polynomial)"]
    assert ahead.compiled_for(x, c) and not ahead.compiled_for(x[:3], c)
    with Stopwatch() as watch:
        got = program(x, c)
        again = programs.compile_ahead(program, x, c).result()    # a second fit: already compiled, nothing built
    assert watch.xla_compiles == [] and watch.compile_events == 0
    assert again is not None
    plain = jax.jit(_polynomial)(x, c)    # the oracle: the same function jitted and called, compiled as usual
    for a, b, d in zip(got, plain, compiled(x, c), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(d), np.asarray(b))


class _Lowered:
    """Stands in for ``jax.stages.Lowered``: its ``compile`` runs in the background thread (it records the thread)
    and returns once the caller has let it (``release``), or raises ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.release, self.error, self.thread = threading.Event(), error, None

    def compile(self):
        self.thread = threading.current_thread()
        if not self.release.wait(timeout=30):
            raise TimeoutError("the caller never went on while this compiled")
        if self.error is not None:
            raise self.error
        return "compiled"


class _Program:
    __name__ = "stand_in"

    def __init__(self, lowered: _Lowered | None = None, error: Exception | None = None) -> None:
        self.lowered, self.error = lowered, error

    def lower(self, *args, **kwargs):
        if self.error is not None:
            raise self.error
        return self.lowered


def test_the_compile_runs_in_another_thread_while_the_caller_goes_on():
    lowered = _Lowered()
    ahead = programs.compile_ahead(_Program(lowered), 1.0)
    # the caller is not blocked: had compile run in this thread, it would wait for the release below (30 s) first
    lowered.release.set()
    assert ahead.result() == "compiled"
    assert lowered.thread is not threading.current_thread()


def test_an_error_of_the_background_compile_is_raised_in_the_caller_as_the_same_exception():
    error = RuntimeError("XLA could not compile this")
    lowered = _Lowered(error)
    lowered.release.set()
    ahead = programs.compile_ahead(_Program(lowered), 1.0)
    with pytest.raises(RuntimeError) as raised:
        ahead.result()
    assert raised.value is error
    # not consumed: the end of the block raises it
    second = _Lowered(ValueError("bad shapes"))
    second.release.set()
    with pytest.raises(ValueError, match="bad shapes"):
        with programs.compile_ahead(_Program(second), 1.0):
            pass
    # set aside (the caller's arguments turned out to need another program): waited for, not raised
    third = _Lowered(ValueError("a program nobody runs"))
    third.release.set()
    with programs.compile_ahead(_Program(third), 1.0) as ahead:
        ahead.discard()
    assert third.thread is not None


def test_an_error_of_the_lowering_is_raised_where_the_program_is_used_as_a_plain_call_raises_it():
    def mismatched(x):
        return jnp.dot(x, jnp.ones(3))

    x = np.ones(4)
    with pytest.raises(TypeError) as plain:
        jax.jit(mismatched)(x)
    ahead = programs.compile_ahead(jax.jit(mismatched), x)   # nothing raised here
    with pytest.raises(TypeError) as raised:
        ahead.result()
    assert str(raised.value) == str(plain.value)
    with pytest.raises(KeyError):    # the body's own error wins; the compile was waited for
        with programs.compile_ahead(_Program(error=OSError("lowering")), 1.0):
            raise KeyError("the run failed")


def test_compiling_ahead_off_compiles_nothing_ahead():
    program = jax.jit(lambda x: x * 3.0 + 1.0)
    with programs.compiling_ahead(False), Stopwatch() as watch:
        ahead = programs.compile_ahead(program, np.ones(5))
        assert ahead.result() is None
    assert watch.xla_compiles == []


def _tiny(model: str, method: str) -> tuple[dict, dict]:
    spec = zoo.get(model)
    declared = get_method(spec, method).declared
    options = {**{k: o.tiny for k, o in declared.items() if o.tiny is not None}, **spec.settings.tiny_hyperparameters}
    return spec.tiny_data()[0], options


@pytest.mark.parametrize(("model", "method"), [("ppca", "em"), ("ppca", "svi")])
def test_a_fit_compiling_ahead_builds_the_same_programs_and_numbers_as_one_that_does_not(model, method, monkeypatch):
    data, options = _tiny(model, method)
    started: list[programs.Ahead] = []
    compile_ahead = programs.compile_ahead

    def recorded(program, *args, **kwargs):
        started.append(compile_ahead(program, *args, **kwargs))
        return started[-1]

    monkeypatch.setattr(programs, "compile_ahead", recorded)
    programs.clear()
    with programs.compiling_ahead(False), Stopwatch() as plain_watch:
        plain = inference.fit(model, data, method, seed=4, **options)
    assert all(a.result() is None for a in started)
    programs.clear()
    started.clear()
    with Stopwatch() as watch:
        ahead = inference.fit(model, data, method, seed=4, **options)
    expected = ["densities", "steps"] if method == "svi" else ["densities"]
    assert sorted(a.name for a in started) == expected
    for a in started:    # none is still compiling after the fit, none failed
        assert a.done() and a.result() is not None
    assert sorted(watch.xla_compiles) == sorted(plain_watch.xla_compiles)   # each compiled once: the fit used it
    for group in ("posterior", "log_likelihood", "log_prior", "sample_stats"):
        for name, values in plain[group].to_dataset().items():
            np.testing.assert_array_equal(ahead[group][name].values, values.values, err_msg=f"{group}/{name}")
    with Stopwatch() as second:
        inference.fit(model, data, method, seed=5, **options)
    assert second.xla_compiles == []


def test_the_densities_compiled_ahead_are_set_aside_for_draws_of_other_shapes():
    spec = zoo.get("ppca")
    data, options = _tiny("ppca", "em")
    prepared = inference.api.prepare("ppca", data, "em", seed=0, **options)
    kwargs = prepared.context.model_kwargs
    with trees.densities_ahead(spec, kwargs, batch_size=8) as ahead:
        structure = trees.trace_structure(spec, kwargs)
        draws = {k: np.full((1, 3, *s["shape"]), 0.5) for k, s in structure.items()
                 if k in trees.latent_sites(structure)}
        assert ahead.compiled_for(trees.split_arguments(kwargs)[0],
                                  {k: np.zeros((8, *v.shape[2:])) for k, v in draws.items()})
        other = {**draws, "not_a_site": np.zeros((1, 3))}    # not the program compiled ahead
        prior, lik = trees.log_densities(spec, kwargs, other, batch_size=8, ahead=ahead)
        assert ahead.done()
    expected, expected_lik = trees.log_densities(spec, kwargs, draws, batch_size=8)
    for got, want in ((prior, expected), (lik, expected_lik)):
        assert got.keys() == want.keys()
        for name, values in want.items():
            np.testing.assert_array_equal(got[name], values)
