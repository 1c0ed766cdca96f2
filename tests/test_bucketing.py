"""Bucketed data dimensions (issue 28, item 2): a kernel whose run is a sum over rows takes its rows padded to
``programs.bucket(n)`` with a 0/1 mask, so data sets of similar size share its compiled run.

Two claims per bucketed kernel:

* a second fit on another number of rows in the same bucket (90 and 100 rows: bucket 128) builds no XLA program
  of the kernel (JAX's own compile events, ``inference._timing.Stopwatch``);
* the padded run equals the unpadded one (``programs.bucketing(False)``: the same kernel on exactly the ``n`` real
  rows, no padding, the mask all ones) to floating-point reassociation: 1e-9 relative on the objective and on every
  fitted parameter, where a padded row that leaked into any sum (one row of ~100) would move them by percents.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import zoo
from inference import programs
from inference._timing import Stopwatch

REL = 1e-9


def test_bucket_is_the_next_power_of_two_from_eight_and_the_identity_when_off():
    assert [programs.bucket(n) for n in (1, 8, 9, 30, 64, 65, 90, 100, 128, 129)] == \
        [8, 8, 16, 32, 64, 128, 128, 128, 128, 256]
    with programs.bucketing(False):
        assert programs.bucket(90) == 90
    assert programs.bucket(90) == 128


def test_pad_rows_copies_the_last_row_and_masks_the_padding():
    Y, z = np.arange(10.0).reshape(5, 2), np.array([3, 1, 4, 1, 5])
    Yp, zp, w = programs.pad_rows(Y, z)
    assert Yp.shape == (8, 2) and zp.shape == (8,) and w.shape == (8,)
    np.testing.assert_array_equal(Yp[:5], Y)
    np.testing.assert_array_equal(Yp[5:], np.repeat(Y[-1:], 3, axis=0))
    np.testing.assert_array_equal(zp[5:], [5, 5, 5])
    np.testing.assert_array_equal(w, [1, 1, 1, 1, 1, 0, 0, 0])
    with pytest.raises(ValueError, match="pad_rows"):
        programs.pad_rows(Y, z[:4])


def _close(ref, pad, what, rel=REL):
    """Every leaf of two NamedTuples equal to ``rel`` relative to the leaf's largest magnitude."""
    for name in ref._fields:
        a, b = np.asarray(getattr(ref, name), float), np.asarray(getattr(pad, name), float)
        assert a.shape == b.shape, f"{what}.{name}: shapes {a.shape} != {b.shape}"
        scale = max(np.max(np.abs(a), initial=0.0), 1e-300)
        assert np.max(np.abs(a - b), initial=0.0) <= rel * scale, f"{what}.{name}"


# --------------------------------------------------------------------------------------------------
# mppca / ppca: VB-EM and ML EM (rows of Y)
# --------------------------------------------------------------------------------------------------


def _mppca_rows(model, seed, n):
    return zoo.get(model).simulate(seed, N=n)[0]["Y"]


def _mppca_hyper(model):
    return {**zoo.get(model).default_hyper, **({"K": 2, "q": 1} if model == "mppca" else {"q": 1})}


@pytest.mark.parametrize("model", ["mppca", "ppca"])
def test_mppca_vbem_padded_run_equals_the_unpadded_run_and_a_second_size_in_the_bucket_compiles_nothing(model):
    from inference.mppca import vbem

    Y, hyper, mixture = _mppca_rows(model, 0, 90), _mppca_hyper(model), model == "mppca"
    with programs.bucketing(False):
        _, ref = vbem.fit_vbem(Y, hyper, jax.random.key(0), mixture=mixture, max_iter=60, tol=1e-9)
    _, pad = vbem.fit_vbem(Y, hyper, jax.random.key(0), mixture=mixture, max_iter=60, tol=1e-9)
    assert pad.n_iter == ref.n_iter
    assert pad.objective == pytest.approx(ref.objective, rel=REL)
    np.testing.assert_allclose(pad.info.objective, ref.info.objective, rtol=REL)
    _close(ref.state, pad.state, "VBState")     # r and m cut back to the 90 real rows
    assert pad.state.r.shape[0] == 90
    with Stopwatch() as watch:
        vbem.fit_vbem(_mppca_rows(model, 1, 100), hyper, jax.random.key(1), mixture=mixture, max_iter=60, tol=1e-9)
    assert watch.xla_compiles == []


@pytest.mark.parametrize("model", ["mppca", "ppca"])
def test_mppca_em_padded_run_equals_the_unpadded_run_and_a_second_size_in_the_bucket_compiles_nothing(model):
    from inference.mppca import em

    Y, hyper, mixture = _mppca_rows(model, 0, 90), {**_mppca_hyper(model), "tau_fixed": None}, model == "mppca"
    with programs.bucketing(False):
        _, ref = em.fit_em(Y, hyper, jax.random.key(0), mixture=mixture, max_iter=60, tol=1e-12)
    _, pad = em.fit_em(Y, hyper, jax.random.key(0), mixture=mixture, max_iter=60, tol=1e-12)
    assert pad.n_iter == ref.n_iter >= 2      # ppca: the PCA start is the ML point, EM stops at once
    np.testing.assert_allclose(pad.info.objective, ref.info.objective, rtol=REL)
    _close(ref.state, pad.state, "State")
    with Stopwatch() as watch:
        em.fit_em(_mppca_rows(model, 1, 100), hyper, jax.random.key(1), mixture=mixture, max_iter=60, tol=1e-12)
    assert watch.xla_compiles == []


# --------------------------------------------------------------------------------------------------
# bpca: VB-EM (rows of Y) and the distributed D-MFVI / D-PPCA (rows of each node's shard)
# --------------------------------------------------------------------------------------------------

BPCA_HYPER = dict(M=2, tau=None, alpha=None, theta=0.01, a_tau=1e-3, b_tau=1e-3, a_alpha=1e-3, b_alpha=1e-3)


def _bpca_data(seed, n):
    from zoo.bpca import simulate

    return simulate(seed, N=n, D=5, M=2, scales=(2.0, 1.0), num_nodes=3, missing=0.1)[0]


def test_bpca_vbem_padded_run_equals_the_unpadded_run_and_a_second_size_in_the_bucket_compiles_nothing():
    from inference.bpca import common as C
    from inference.bpca import vbem

    Y = _bpca_data(0, 90)["Y"]
    cfg = C.cfg_from(BPCA_HYPER, 5)
    with programs.bucketing(False):
        ref = vbem.run(cfg, C.shard_of(Y), C.init_key(jax.random.key(0)), max_iter=60, tol=1e-10)
    pad = vbem.run(cfg, C.shard_of(Y), C.init_key(jax.random.key(0)), max_iter=60, tol=1e-10)
    assert pad.n_iter == ref.n_iter
    np.testing.assert_allclose(pad.info.objective, ref.info.objective, rtol=REL)
    _close(ref.state.g, pad.state.g, "Globals")
    _close(ref.state._replace(g=ref.state.g.mw), pad.state._replace(g=pad.state.g.mw), "VBState")   # q(z) cut to 90
    assert pad.state.mz.shape == (90, 2)
    q = C.q_of(cfg, pad.state.g, pad.state.tau, pad.state.alpha, pad.state.mz, pad.state.Sz)
    # the host's ELBO of the padded run's q (cut to 90 rows) is the unpadded run's last reported ELBO
    assert C.elbo_of(cfg, q, C.shard_of(Y)) == pytest.approx(ref.info.objective[-1], rel=REL)
    with Stopwatch() as watch:
        second = vbem.run(cfg, C.shard_of(_bpca_data(1, 100)["Y"]), C.init_key(jax.random.key(1)), max_iter=60,
                          tol=1e-10)
        C.elbo_of(cfg, C.q_of(cfg, second.state.g, second.state.tau, second.state.alpha, second.state.mz,
                              second.state.Sz), C.shard_of(_bpca_data(1, 100)["Y"]))
    assert watch.xla_compiles == []


@pytest.mark.parametrize("method", ["badmm", "dppca"])
def test_bpca_distributed_padded_shards_equal_unpadded_shards_and_a_second_size_in_the_bucket_compiles_nothing(
        method):
    from inference.bpca import badmm, dppca, nodes

    def fit(data, seed):
        if method == "badmm":
            o = {**badmm.BADMM_DEFAULTS, "progress": False, "max_iter": 25, "tol": 1e-12}
            return badmm.fit_badmm(data["Y"], data["node"], 3, BPCA_HYPER, jax.random.key(seed), o)[1]
        o = {k: v.default for k, v in nodes.NETWORK_OPTIONS.items()} | {"progress": False, "max_iter": 25,
                                                                          "tol": 1e-12}
        return dppca.fit_dppca(data["Y"], data["node"], 3, BPCA_HYPER, jax.random.key(seed), o)[0]

    data = _bpca_data(0, 90)                 # 3 shards of 30 rows: bucket 32
    with programs.bucketing(False):
        ref = fit(data, 0)
    pad = fit(data, 0)
    assert pad.rounds == ref.rounds
    for name in ref.messages:
        a, b = np.asarray(ref.messages[name]), np.asarray(pad.messages[name])
        np.testing.assert_allclose(b, a, rtol=REL, atol=REL * np.max(np.abs(a)), err_msg=name)
    objective = "elbo" if method == "badmm" else "loglik"
    np.testing.assert_allclose(pad.history[objective], ref.history[objective], rtol=REL)
    with Stopwatch() as watch:
        fit(_bpca_data(1, 81), 1)            # 3 shards of 27 rows: bucket 32
    assert watch.xla_compiles == []


# --------------------------------------------------------------------------------------------------
# ssgp: VB (observations; the LMM's n is a value of the data)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ssgp_lmm", "ssgp_logit"])
def test_ssgp_vb_padded_run_equals_the_unpadded_run_and_a_second_size_in_the_bucket_compiles_nothing(name):
    from inference.ssgp import vb
    from zoo._validation import validate_data

    spec = zoo.get(name)
    hyper = {**spec.default_hyper, "m": 4}
    options = {**{k: o.default for k, o in vb.OPTIONS.items()}, "max_iter": 40, "tol": 1e-12}

    def fit(per_group, seed):
        data = validate_data(spec, spec.simulate(seed, n_groups=4, per_group=per_group)[0])
        return vb.fit_state(spec, data, hyper, options)

    with programs.bucketing(False):
        cfg, arrays, ref = fit(23, 0)                 # 92 observations, no padding
    assert arrays.mask.shape == (92,)
    cfg, arrays, pad = fit(23, 0)                     # padded to 128
    assert arrays.mask.shape == (128,) and arrays.mask.sum() == 92
    assert pad.n_iter == ref.n_iter
    np.testing.assert_allclose(pad.info.objective, ref.info.objective, rtol=REL)
    # The sweep's step control makes discrete choices (the higher of two nearly equal bounds: the extrapolation b of
    # the last sweep, backtracking), which round-off may flip, so the two runs can take different valid steps to one
    # optimum: the bound trace agrees to 1e-9, the parameters at the end to 1e-6 relative (measured 2e-8), where one
    # padded row in 92 leaking into a sum would move them by about 1e-2.
    cut = lambda st: st._replace(xi=st.xi[:92], EZ=st.EZ[:92], qz=st.qz[:92], w=st.w[:92], yt=st.yt[:92],  # noqa: E731
                                 b=0.0, dC=0.0)
    _close(cut(ref.state), cut(pad.state), "State", rel=1e-6)
    assert vb.state_dataset(cfg, pad.state).sizes.get("obs", 92) == 92
    with Stopwatch() as watch:
        fit(25, 1)                                    # 100 observations, the same bucket
    assert watch.xla_compiles == []


# --------------------------------------------------------------------------------------------------
# hlcr: VB-EM (pairs)
# --------------------------------------------------------------------------------------------------


def _hlcr_inputs(seed):
    """A small simulated hlcr problem (6 agents; 82 pairs at seed 0, 98 at seed 1): its data, model inputs and
    kernel hyperparameters."""
    from inference.hlcr.common import make_config
    from zoo.hlcr import model_inputs

    spec = zoo.get("hlcr")
    data, _ = spec.simulate(seed, n_agents=6, mean_entities=15.0, mean_events=4.0)
    inputs = model_inputs(data, spec.default_hyper)
    return data, inputs, make_config(spec.default_hyper, inputs["n_agents"])


def test_hlcr_vbem_padded_run_equals_the_unpadded_run_and_a_second_size_in_the_bucket_compiles_nothing():
    from inference.hlcr import vb
    from inference.hlcr.common import pair_data

    def problem(seed):
        data, inputs, hyper = _hlcr_inputs(seed)
        return pair_data(inputs), hyper

    pdat, hyper = problem(0)
    assert pdat.gs.shape[0] == 82
    with programs.bucketing(False):
        ref = vb.run(jax.random.key(0), pdat, hyper, max_iter=30, tol=1e-12, num_restarts=2)
    pad = vb.run(jax.random.key(0), pdat, hyper, max_iter=30, tol=1e-12, num_restarts=2)
    assert pad.n_iter == ref.n_iter and pad.best == ref.best
    np.testing.assert_allclose(pad.info.objective, ref.info.objective, rtol=REL)
    # the psi step accepts a step when the objective does not drop: near its optimum it compares values equal to
    # round-off, so reassociated sums move psi, a and r by ~1e-9 (tests/test_fedhlcr.py, fedvb == vbem); 1e-7
    # relative bounds that, and one padded pair in 82 leaking into the statistics moves them by ~1e-2
    _close(ref.state, pad.state, "State", rel=1e-7)
    assert pad.state.r.shape == (82, hyper.K)
    pdat2, hyper2 = problem(1)
    assert pdat2.gs.shape[0] == 98 and hyper2 == hyper
    with Stopwatch() as watch:
        vb.run(jax.random.key(1), pdat2, hyper2, max_iter=30, tol=1e-12, num_restarts=2)
    assert watch.xla_compiles == []


@pytest.mark.parametrize("kernel_name", ["block", "paper"])
def test_hlcr_gibbs_padded_chains_follow_the_unpadded_chains_and_a_second_size_in_the_bucket_compiles_nothing(
        kernel_name):
    """Pair e's random numbers do not depend on the padding, so the padded chain makes the same label moves: the
    labels agree exactly (a discrete outcome; a tie of two Gumbel-perturbed logits flipped by 1e-16 differences
    has probability ~1e-14 per pair) and w, theta, psi and the log joint to 1e-9 relative."""
    from inference.hlcr import gibbs
    from inference.hlcr.common import pair_data
    from zoo.hlcr import pair_structure

    def problem(seed):
        data, inputs, hyper = _hlcr_inputs(seed)
        events = None
        if kernel_name == "paper":
            ps = pair_structure(data["agent"], data["entity"])
            events = gibbs.events_by_pair(data["X"], data["y"], ps["pair"], ps["n_pairs"])
        return gibbs.Problem(pair_data(inputs), events), hyper

    def run(prob, hyper, seed):
        return gibbs.run(jax.random.key(seed), prob, hyper, num_warmup=5, num_samples=10, num_chains=2,
                         kernel_name=kernel_name)

    prob, hyper = problem(0)
    with programs.bucketing(False):
        ref, ref_stats, _ = run(prob, hyper, 0)
    pad, pad_stats, _ = run(prob, hyper, 0)
    assert pad["z"].shape == ref["z"].shape == (2, 10, 82)
    np.testing.assert_array_equal(pad["z"], ref["z"])
    assert np.mean(ref_stats["n_changed"]) > 0           # the chains move
    for name in ("w", "theta", "psi"):
        np.testing.assert_allclose(pad[name], ref[name], rtol=REL, atol=REL, err_msg=name)
    np.testing.assert_allclose(pad_stats["log_joint_collapsed"], ref_stats["log_joint_collapsed"], rtol=REL)
    prob2, hyper2 = problem(1)
    assert prob2.pdat.gs.shape[0] == 98 and hyper2 == hyper
    with Stopwatch() as watch:
        run(prob2, hyper2, 1)
    assert watch.xla_compiles == []


def test_hlcr_blocked_gibbs_padded_chains_follow_the_unpadded_chains_and_a_second_size_compiles_nothing():
    """As for the collapsed kernel: pair e's uniform and initial label do not depend on the padding."""
    from inference.hlcr import gibbs_blocked as gb

    def problem(seed):
        data, inputs, hyper = _hlcr_inputs(seed)
        return gb.problem_from_inputs(inputs), hyper

    def run(prob, hyper, seed):
        return gb.run(jax.random.key(seed), prob, hyper, num_warmup=5, num_samples=10, num_chains=2)

    prob, hyper = problem(0)
    with programs.bucketing(False):
        ref, ref_stats, _ = run(prob, hyper, 0)
    pad, pad_stats, _ = run(prob, hyper, 0)
    assert pad["z"].shape == ref["z"].shape == (2, 10, 82)
    np.testing.assert_array_equal(pad["z"], ref["z"])
    assert np.mean(ref_stats["n_changed"]) > 0
    for name in ("w", "theta", "psi"):
        np.testing.assert_allclose(pad[name], ref[name], rtol=REL, atol=REL, err_msg=name)
    np.testing.assert_allclose(pad_stats["log_joint_collapsed"], ref_stats["log_joint_collapsed"], rtol=REL)
    np.testing.assert_array_equal(pad_stats["n_changed"], ref_stats["n_changed"])
    prob2, hyper2 = problem(1)
    with Stopwatch() as watch:
        run(prob2, hyper2, 1)
    assert watch.xla_compiles == []


# --------------------------------------------------------------------------------------------------
# hlcr federated: FedHLCR Gibbs and federated VB-EM (each agent's pair slots)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["fedgibbs", "fedvb"])
def test_hlcr_federated_padded_slots_equal_unpadded_slots_and_a_second_size_in_the_bucket_compiles_nothing(method):
    """Agents' pair slots padded to ``programs.bucket`` of the largest agent (the slots of smaller agents were
    already masked): the same labels (fedgibbs; pair e's random numbers do not depend on the padding) or the same
    responsibilities to 1e-7 (fedvb: the psi step's accept test, see above), the same objective trace to 1e-9."""
    from inference.hlcr import federated as fed
    from inference.hlcr import fedgibbs, fedvb
    from zoo.hlcr import simulate

    hyper = {"K": 3, "alpha": None, "beta": 1.0, "delta": 1.0, "sigma": 0.5}

    def run(seed, mean_entities):
        data, _ = simulate(seed, n_agents=5, mean_entities=mean_entities, mean_events=5.0, K=3, F=2, sigma=0.5)
        agents = fed.split_by_agent(data)
        if method == "fedgibbs":
            return fedgibbs.run_federated(agents, hyper, jax.random.key(seed), max_iter=6, chunk=6)
        return fedvb.run_federated_vb(agents, hyper, jax.random.key(seed), max_iter=6, chunk=6)

    with programs.bucketing(False):
        ref, ref_index, _ = run(0, 9.0)                # the largest agent has 15 pairs: bucket 16
    pad, index, _ = run(0, 9.0)
    assert index.shape[1] == programs.bucket(ref_index.shape[1]) > ref_index.shape[1]
    valid, valid_ref = index >= 0, ref_index >= 0
    np.testing.assert_array_equal(index[valid], ref_index[valid_ref])
    if method == "fedgibbs":
        np.testing.assert_array_equal(np.asarray(pad.states.z)[valid], np.asarray(ref.states.z)[valid_ref])
        objective = "log_joint"
    else:
        np.testing.assert_allclose(np.asarray(pad.states.r)[valid], np.asarray(ref.states.r)[valid_ref], atol=1e-7)
        objective = "elbo"
    np.testing.assert_allclose(pad.history[objective], ref.history[objective], rtol=REL)
    with Stopwatch() as watch:
        _, other, _ = run(1, 9.0)                       # 12 pairs: bucket 16
    assert other.shape == index.shape
    assert watch.xla_compiles == []
