"""The one loop (``inference.loop``) against plain Python loops written independently here."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference import loop
from inference.loop import StopRule, run_until_converged, sample_chains


class State(NamedTuple):
    x: jax.Array


class Info(NamedTuple):
    objective: jax.Array


def contraction_init(key, problem):
    return State(jax.random.uniform(key, (), minval=-10.0, maxval=10.0) * problem["spread"])


def contraction_step(key, state, problem):
    """x <- (x + target) / 2, objective -(x - target)^2: converges to target from anywhere."""
    x = 0.5 * (state.x + problem["target"])
    return State(x), Info(-((x - problem["target"]) ** 2))


def python_oracle(x0, target, rule):
    """A plain while loop with the documented absolute rule: stop at the first t >= 2 with |f_t - f_{t-1}| <= tol."""
    x, f_prev, trace = x0, None, []
    for _ in range(rule.max_iter):
        x = 0.5 * (x + target)
        f = -((x - target) ** 2)
        trace.append(f)
        if f_prev is not None and abs(f - f_prev) <= rule.tol:
            return x, trace, True
        f_prev = f
    return x, trace, False


PROBLEM = {"target": jnp.asarray(3.0), "spread": jnp.asarray(1.0)}


@pytest.mark.parametrize("chunk", [1, 7, 500])
def test_run_until_converged_matches_a_python_while_loop_for_any_chunk(chunk):
    rule = StopRule(max_iter=200, tol=1e-6, kind="absolute")
    run = run_until_converged(contraction_init, contraction_step, PROBLEM, jax.random.key(0), rule, chunk=chunk)
    x0 = float(contraction_init(jax.random.split(jax.random.key(0), 1)[0], PROBLEM).x)
    x, trace, conv = python_oracle(x0, 3.0, rule)
    assert run.converged == conv is True
    assert run.n_iter == len(trace)
    np.testing.assert_allclose(run.info.objective, trace, rtol=1e-12)
    assert float(run.state.x) == pytest.approx(x, rel=1e-12)
    assert run.objective == pytest.approx(trace[-1], rel=1e-12)


class GatedInfo(NamedTuple):
    objective: jax.Array
    may_stop: jax.Array


def test_info_may_stop_vetoes_the_rule_until_it_allows_stopping():
    """A kernel whose Info says ``may_stop = (t >= 12)``: the rule (which would fire at once on a constant
    objective) only fires at step 12; a plain Python loop with the same gate agrees."""

    def init(key, problem):
        return State(jnp.asarray(0.0))

    def step(key, state, problem):
        return State(state.x + 1.0), GatedInfo(jnp.asarray(-1.0), state.x + 1.0 >= 12)

    run = run_until_converged(init, step, PROBLEM, jax.random.key(0), StopRule(100, 1e-8), chunk=5)
    assert run.converged and run.n_iter == 12 and float(run.state.x) == 12.0
    assert run.info.objective.shape == (12,)


def test_max_iter_stops_without_converging():
    rule = StopRule(max_iter=5, tol=0.0)
    run = run_until_converged(contraction_init, contraction_step, PROBLEM, jax.random.key(1), rule, chunk=3)
    assert run.n_iter == 5 and not run.converged
    assert run.info.objective.shape == (5,)


def two_basins_step(key, state, problem):
    """Gradient ascent on f(x) = -(x^2 - 1)^2 + 0.5 x: two local maxima, the one near x = +1 is higher."""
    x = state.x + 0.05 * (-4 * state.x * (state.x**2 - 1) + 0.5)
    return State(x), Info(-((x**2 - 1) ** 2) + 0.5 * x)


def test_restarts_run_at_once_and_the_best_final_objective_wins():
    rule = StopRule(max_iter=400, tol=1e-12)
    starts = State(jnp.asarray([-1.5, -0.5, 0.3, 1.7]))
    run = run_until_converged(None, two_basins_step, PROBLEM, jax.random.key(2), rule, num_restarts=4,
                              init_state=starts)
    assert run.objective_per_restart.shape == (4,)
    assert run.best in (2, 3)
    assert float(run.state.x) > 0.9
    # the two restarts in the lower basin end near x = -1, with a lower objective
    assert np.all(run.objective_per_restart[:2] < run.objective_per_restart[2:])


def test_non_finite_objective_raises():
    def blow_up(key, state, problem):
        x = state.x * 1e300
        return State(x), Info(x * x)

    with pytest.raises(FloatingPointError, match="non-finite"):
        run_until_converged(contraction_init, blow_up, PROBLEM, jax.random.key(0), StopRule(max_iter=10))


class Counter(NamedTuple):
    t: jax.Array
    x: jax.Array


def ar1_init(key, problem):
    return Counter(jnp.asarray(0), jax.random.normal(key) * 10.0)


def ar1_step(key, state, problem):
    """x' = rho x + sqrt(1 - rho^2) eps: stationary N(0, 1), lag-1 autocorrelation rho."""
    rho = problem["rho"]
    x = rho * state.x + jnp.sqrt(1 - rho**2) * jax.random.normal(key)
    return Counter(state.t + 1, x), Info(-0.5 * x**2)


def test_sample_chains_drops_warmup_and_thins_at_the_documented_steps():
    kept, last = sample_chains(ar1_init, ar1_step, {"rho": jnp.asarray(0.5)}, jax.random.key(3), num_chains=3,
                               num_warmup=10, num_samples=6, thinning=4, chunk=7)
    t = np.asarray(kept[0].t)
    assert t.shape == (3, 6)
    # after step s (1-based) the counter is s; kept steps are num_warmup + thinning * j, j = 1..num_samples
    np.testing.assert_array_equal(t[0], 10 + 4 * np.arange(1, 7))
    assert np.all(np.asarray(last.t) == 34)
    assert not np.allclose(kept[0].x[0], kept[0].x[1])   # chains get their own keys


def test_sample_chains_targets_the_stationary_law_within_mcse():
    rho = 0.5
    kept, _ = sample_chains(ar1_init, ar1_step, {"rho": jnp.asarray(rho)}, jax.random.key(4), num_chains=4,
                            num_warmup=100, num_samples=5000)
    x = np.asarray(kept[0].x)
    ess = x.size * (1 - rho) / (1 + rho)               # closed form for AR(1)
    assert abs(x.mean()) < 4 / np.sqrt(ess)             # 4 MCSE of the mean (sd 1)
    assert abs(x.var() - 1) < 4 * np.sqrt(2 / ess)      # 4 MCSE of the variance


@pytest.mark.parametrize("progress", [False, True])
def test_default_chunks_with_and_without_a_progress_bar_match_the_python_loop(progress):
    """Without a bar the whole ``max_iter`` is one while-loop chunk that stops at convergence; with one, chunks
    of max(50, max_iter / 20). Both give the oracle's Run (n_iter, converged, trace, state)."""
    rule = StopRule(max_iter=300, tol=1e-9, kind="absolute")
    run = run_until_converged(contraction_init, contraction_step, PROBLEM, jax.random.key(5), rule, progress=progress)
    x0 = float(contraction_init(jax.random.split(jax.random.key(5), 1)[0], PROBLEM).x)
    x, trace, conv = python_oracle(x0, 3.0, rule)
    assert run.converged is conv is True and run.n_iter == len(trace)
    np.testing.assert_allclose(run.info.objective, trace, rtol=1e-12)
    assert float(run.state.x) == pytest.approx(x, rel=1e-12)


def test_info_buffer_cap_splits_the_run_into_chunks_with_the_same_result(monkeypatch):
    """A per-chunk Info buffer capped at 3 rows (``INFO_BUFFER_BYTES``): the run takes many chunks and gives
    the same Run as one chunk."""
    rule = StopRule(max_iter=40, tol=0.0)
    whole = run_until_converged(contraction_init, contraction_step, PROBLEM, jax.random.key(6), rule, progress=False)
    loop._optimiser_program.cache_clear()
    monkeypatch.setattr(loop, "INFO_BUFFER_BYTES", 3 * 8)
    capped = run_until_converged(contraction_init, contraction_step, PROBLEM, jax.random.key(6), rule, progress=False)
    loop._optimiser_program.cache_clear()
    assert whole.n_iter == capped.n_iter == 40 and not capped.converged
    np.testing.assert_array_equal(capped.info.objective, whole.info.objective)
    assert float(capped.state.x) == float(whole.state.x)


def test_each_restart_runs_as_it_would_alone():
    """Restarts are frozen when they stop: every restart of a vmapped run ends where a one-restart run (stepped
    without vmap) from the same start ends, with the same step count of the best one."""
    rule = StopRule(max_iter=400, tol=1e-10)
    starts = jnp.asarray([-1.5, 0.3, 1.7])
    run = run_until_converged(None, two_basins_step, PROBLEM, jax.random.key(2), rule, num_restarts=3,
                              init_state=State(starts), chunk=25)
    alone = [run_until_converged(None, two_basins_step, PROBLEM, jax.random.key(2), rule, chunk=25,
                                 init_state=State(starts[i:i + 1])) for i in range(3)]
    np.testing.assert_allclose(run.objective_per_restart, [a.objective for a in alone], rtol=1e-12)
    best = alone[run.best]
    assert run.n_iter == best.n_iter and run.converged == best.converged
    np.testing.assert_allclose(run.info.objective, best.info.objective, rtol=1e-12)


@pytest.mark.parametrize(("chunk", "progress"), [(None, False), (None, True), (5, False), (60, False)])
def test_sample_chains_keeps_exactly_the_documented_steps_for_any_chunking(chunk, progress):
    """A counter kernel (the state counts its steps): kept draws are the steps num_warmup + thinning * j,
    j = 1..num_samples, whatever the chunking (chunks that hold only warm-up, some kept steps, or all), and
    the draws come back as host arrays; the chains' values agree across chunkings (same keys)."""
    kw = dict(num_chains=2, num_warmup=7, num_samples=9, thinning=3)
    kept, last = sample_chains(ar1_init, ar1_step, {"rho": jnp.asarray(0.5)}, jax.random.key(8), chunk=chunk,
                               progress=progress, **kw)
    assert isinstance(kept[0].t, np.ndarray) and kept[0].t.shape == (2, 9)
    np.testing.assert_array_equal(kept[0].t, np.broadcast_to(7 + 3 * np.arange(1, 10), (2, 9)))
    assert np.all(np.asarray(last.t) == 7 + 27)
    reference, _ = sample_chains(ar1_init, ar1_step, {"rho": jnp.asarray(0.5)}, jax.random.key(8), chunk=1, **kw)
    np.testing.assert_allclose(kept[0].x, reference[0].x, rtol=1e-12)


def test_budgets_and_keys_are_arguments_a_run_with_other_ones_compiles_nothing_and_matches_the_oracle():
    """max_iter, tol and the key are arguments of the optimiser's one program; num_warmup, num_samples, thinning
    and the key of the sampler's: a second run that changes only these builds no XLA program (JAX's own compile
    events), and still gives the Python loop's result (optimiser) and the documented kept steps (sampler)."""
    from inference._timing import Stopwatch

    run_until_converged(contraction_init, contraction_step, PROBLEM, jax.random.key(0),
                        StopRule(max_iter=200, tol=1e-6, kind="absolute"), progress=False)
    sample_chains(ar1_init, ar1_step, {"rho": jnp.asarray(0.5)}, jax.random.key(8), num_chains=2, num_warmup=7,
                  num_samples=9, thinning=3)
    rule = StopRule(max_iter=37, tol=1e-9, kind="absolute")
    with Stopwatch() as watch:
        run = run_until_converged(contraction_init, contraction_step, PROBLEM, jax.random.key(11), rule,
                                  progress=False)
        kept, last = sample_chains(ar1_init, ar1_step, {"rho": jnp.asarray(0.5)}, jax.random.key(12), num_chains=2,
                                   num_warmup=4, num_samples=13, thinning=2)
    assert watch.xla_compiles == []
    x0 = float(contraction_init(jax.random.split(jax.random.key(11), 1)[0], PROBLEM).x)
    x, trace, conv = python_oracle(x0, 3.0, rule)
    assert run.converged == conv and run.n_iter == len(trace)
    np.testing.assert_allclose(run.info.objective, trace, rtol=1e-12)
    assert float(run.state.x) == pytest.approx(x, rel=1e-12)
    np.testing.assert_array_equal(kept[0].t, np.broadcast_to(4 + 2 * np.arange(1, 14), (2, 13)))
    assert np.all(np.asarray(last.t) == 4 + 26)


def test_a_full_buffer_of_kept_draws_continues_in_the_next_call_with_the_same_draws(monkeypatch):
    """A sampler buffer of 4 kept draws (``ROWS``): 13 kept draws take four calls of the program, each going on
    from the last one's state, and give the draws of one call (same keys, same steps)."""
    kw = dict(num_chains=2, num_warmup=5, num_samples=13, thinning=2)
    whole, _ = sample_chains(ar1_init, ar1_step, {"rho": jnp.asarray(0.5)}, jax.random.key(9), **kw)
    loop._sampler_program.cache_clear()
    monkeypatch.setattr(loop, "ROWS", 4)
    capped, last = sample_chains(ar1_init, ar1_step, {"rho": jnp.asarray(0.5)}, jax.random.key(9), **kw)
    loop._sampler_program.cache_clear()
    np.testing.assert_array_equal(capped[0].t, np.broadcast_to(5 + 2 * np.arange(1, 14), (2, 13)))
    np.testing.assert_allclose(capped[0].x, whole[0].x, rtol=1e-12)
    assert np.all(np.asarray(last.t) == 5 + 26)


@pytest.mark.parametrize("chains", ["vmap", "map"])
def test_chains_batched_or_one_after_another_follow_the_documented_keys_of_a_python_loop(chains):
    """``chains="map"`` steps the chains one after another (``lax.map``), ``"vmap"`` batched: both give the chains
    of a plain Python loop over chains and steps with the documented keys (chain c starts from ``init(split(
    split(key)[0], C)[c])``; step t uses ``k_step, k_collect = split(fold_in(split(key)[1], t))``, then row c of
    ``split(k_step, C)`` and of ``split(k_collect, C)``), fresh or from ``init_state``, with a collect that draws."""
    C, warmup, samples, thin, key = 3, 4, 5, 2, jax.random.key(21)
    problem = {"rho": jnp.asarray(0.5)}

    def collect(k, state, info):
        return state.x + jax.random.normal(k)

    kept, last = sample_chains(ar1_init, ar1_step, problem, key, num_chains=C, num_warmup=warmup,
                               num_samples=samples, thinning=thin, collect=collect, chunk=3, chains=chains)
    k_init, k_steps = jax.random.split(key)
    states = [ar1_init(k, problem) for k in jax.random.split(k_init, C)]
    want = [[] for _ in range(C)]
    for t in range(warmup + samples * thin):
        k_step, k_collect = jax.random.split(jax.random.fold_in(k_steps, t))
        for c, (ks, kc) in enumerate(zip(jax.random.split(k_step, C), jax.random.split(k_collect, C), strict=True)):
            states[c], info = ar1_step(ks, states[c], problem)
            if t >= warmup and (t - warmup + 1) % thin == 0:
                want[c].append(float(collect(kc, states[c], info)))
    assert kept.shape == (C, samples)
    np.testing.assert_allclose(kept, np.array(want), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(last.x), [float(s.x) for s in states], rtol=1e-12)
    start = np.array([-50.0, 0.0, 50.0])
    again, _ = sample_chains(None, ar1_step, problem, key, num_chains=C, num_warmup=0, num_samples=2,
                             init_state=Counter(jnp.zeros(C, jnp.int32), jnp.asarray(start)), chains=chains)
    x = np.asarray(again[0].x)                                  # x_1 = x_0 / 2 + N(0, 3/4): each from its own start
    assert x.shape == (C, 2) and np.all(np.abs(x[:, 0] - start / 2) < 6 * np.sqrt(0.75))


def test_sample_chains_rejects_an_unknown_chains_mode_before_compiling():
    from inference._timing import Stopwatch

    with Stopwatch() as watch, pytest.raises(ValueError, match="chains"):
        sample_chains(ar1_init, ar1_step, {"rho": jnp.asarray(0.5)}, jax.random.key(0), num_chains=2, num_warmup=1,
                      num_samples=1, chains="serial")
    assert watch.xla_compiles == []


def _traced(fn, counts: dict, name: str):
    """``fn`` counting, in ``counts[name]``, how many times JAX traces it (Python runs it only while tracing)."""

    def wrapped(*args):
        counts[name] += 1
        return fn(*args)

    return wrapped


def test_a_cold_run_traces_init_and_step_once_each():
    """The buffer's shapes, the start's shapes and the loop's body share one trace of the step and of init
    (``loop._optimiser_program``, ``loop._sampler_program``): tracing a large step twice cost 0.1-0.3 s of a
    cold fit. Counts, not times: deterministic."""
    counts = {"init": 0, "step": 0}
    init, step = _traced(contraction_init, counts, "init"), _traced(contraction_step, counts, "step")
    rule = StopRule(max_iter=200, tol=1e-6, kind="absolute")
    run = run_until_converged(init, step, PROBLEM, jax.random.key(11), rule, chunk=7)
    assert run.n_iter > 7 and counts == {"init": 1, "step": 1}   # several calls of the one program
    for chains in ("vmap", "map"):
        counts = {"init": 0, "step": 0}
        init, step = _traced(ar1_init, counts, "init"), _traced(ar1_step, counts, "step")
        kept, _ = sample_chains(init, step, {"rho": jnp.asarray(0.5)}, jax.random.key(5), num_chains=2,
                                num_warmup=3, num_samples=20, chunk=5, chains=chains)
        assert np.asarray(kept[0].t).shape == (2, 20) and counts == {"init": 1, "step": 1}, chains
