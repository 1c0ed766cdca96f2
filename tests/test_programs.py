"""The registry of compiled programs (``inference.programs``): one decorator, keys by what a function computes,
counts of what it built, one ``clear()``; and the loop's rule that a second fit with a kernel of the same
configuration compiles nothing, whether or not the kernel's factory is cached."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference import programs
from inference._timing import Stopwatch
from inference.loop import StopRule, run_until_converged


def _builds(name: str) -> int:
    return programs.builds().get(name, 0)


@programs.cached(maxsize=2)
def _square_program(power: int):
    return jax.jit(lambda x: x ** power)


NAME = f"{__name__}._square_program"


def test_a_registered_builder_builds_once_per_argument_value_and_counts_its_builds():
    _square_program.cache_clear()
    before = _builds(NAME)
    first = _square_program(2)
    assert _square_program(2) is first
    assert _square_program(3) is not first
    assert _builds(NAME) - before == 2
    assert NAME in programs.registered()


def test_least_recently_used_goes_first_past_maxsize_and_clear_drops_everything():
    _square_program.cache_clear()
    two, three = _square_program(2), _square_program(3)
    _square_program(2)                     # 3 is now the least recently used
    _square_program(4)
    assert _square_program(2) is two
    assert _square_program(3) is not three
    programs.clear()
    assert len(_square_program) == 0
    assert _square_program(2) is not two


def _adder(offset):
    return lambda x: x + offset


def _scale(factor, x):
    return factor * x


def test_closures_and_partials_are_keyed_by_code_and_captured_values():
    key = programs.program_key
    assert key(_adder(1.5)) == key(_adder(1.5))
    assert key(_adder(1.5)) != key(_adder(2.5))
    assert key(_adder(1)) != key(_adder(1.0))     # equal numbers of other types trace other programs
    assert key(functools.partial(_scale, 2.0)) == key(functools.partial(_scale, 2.0))
    assert key(functools.partial(_scale, 2.0)) != key(functools.partial(_scale, 3.0))
    array = np.ones(3)   # unhashable contents: the closure object itself is the key
    captured = _adder(array)
    assert key(captured) == key(captured)
    assert key(captured) != key(_adder(array))


@programs.cached
def _summing_program(values):
    return jax.jit(lambda x: x + sum(values))


def test_an_unhashable_argument_builds_for_this_call_only():
    name = f"{__name__}._summing_program"
    before = _builds(name)
    a, b = _summing_program([1, 2]), _summing_program([1, 2])
    assert a is not b
    assert _builds(name) - before == 2
    assert len(_summing_program) == 0


class _Info(NamedTuple):
    objective: jax.Array


def _uncached_factory(rate: float):
    """A kernel factory that is NOT registered: new closures on every call."""

    def init(key, problem):
        return jnp.zeros(())

    def step(key, state, problem):
        new = state + rate * (problem["target"] - state)
        return new, _Info(-jnp.abs(problem["target"] - new))

    return init, step


def test_a_second_fit_with_new_closures_of_the_same_configuration_compiles_nothing():
    problem = {"target": jnp.asarray(3.0)}
    rule = StopRule(40, 1e-12)
    first = run_until_converged(*_uncached_factory(0.5), problem, jax.random.key(0), rule, progress=False)
    with Stopwatch() as watch:
        again = run_until_converged(*_uncached_factory(0.5), {"target": jnp.asarray(5.0)}, jax.random.key(1), rule,
                                    progress=False)
    assert watch.compile_events == 0
    assert abs(float(first.state) - 3.0) < 1e-9
    assert abs(float(again.state) - 5.0) < 1e-9
    with Stopwatch() as watch:      # another configuration is another program
        other = run_until_converged(*_uncached_factory(0.25), problem, jax.random.key(0), rule, progress=False)
    assert watch.compile_events > 0
    assert abs(float(other.state) - 3.0) < 1e-3


def test_a_fits_key_is_jax_random_key_of_its_seed_built_without_compiling():
    from inference.api import key_of

    seeds = (0, 7, 2**31 - 1, 2**32 + 3, 2**40 + 5, 2**63 - 1)
    expected = [np.asarray(jax.random.key_data(jax.random.key(s))) for s in seeds]
    with Stopwatch() as watch:
        built = [key_of(s) for s in seeds]
    assert watch.xla_compiles == []
    for s, key, want in zip(seeds, built, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(jax.random.key_data(key)), want, err_msg=f"seed {s}")
        assert key.dtype == jax.random.key(0).dtype


@pytest.mark.parametrize("seed", [0, 3, 2**32 + 5, 2**63 - 1])
def test_host_keys_are_jax_random_fold_in_and_split_bit_for_bit_and_compile_nothing(seed):
    """``inference.host_keys`` against ``jax.random`` itself (the oracle): fold_in, split and its rows, from a key
    built on the host; the host side builds no XLA program."""
    from inference import host_keys
    from inference.api import key_of

    key = key_of(seed)
    with Stopwatch() as watch:
        folded = host_keys.words(host_keys.fold_in(key, 7))
        split = host_keys.words(host_keys.split(key, 5))
        parts = [host_keys.words(k) for k in host_keys.parts(key, 3)]
        many = host_keys.words(host_keys.fold_in_many(key, np.array([[0, 1], [2**31, 2**32 - 1]])))
    assert watch.xla_compiles == []
    data = jax.random.key_data
    np.testing.assert_array_equal(folded, np.asarray(data(jax.random.fold_in(key, 7))))
    np.testing.assert_array_equal(split, np.asarray(data(jax.random.split(key, 5))))
    np.testing.assert_array_equal(np.stack(parts), np.asarray(data(jax.random.split(key, 3))))
    np.testing.assert_array_equal(many[1, 1], np.asarray(data(jax.random.fold_in(key, 2**32 - 1))))
