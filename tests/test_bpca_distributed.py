"""BPCA distributed: the Ray runner against the in-process runner (and node failures), and the paper's cube
structure-from-motion experiments (notes section 6, tests 9-11). All slow: Ray is the optional
``[distributed]`` extra, and the cube runs are many full ADMM runs.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from inference.bpca import badmm, dppca, vbem
from inference.bpca import common as C
from inference.distributed import NodeFailureError
from zoo.bpca import simulate, simulate_cube, subspace_angle, svd_structure

LR20_HYPER = dict(M=3, tau=4.0, alpha=1.0, theta=0.01, a_tau=1e-3, b_tau=1e-3, a_alpha=1e-3, b_alpha=1e-3)
CUBE_HYPER = dict(LR20_HYPER, tau=None)
KEY = jax.random.key(1)
DPPCA_OPTIONS = {"graph": "ring", "eta": 10.0, "max_iter": 2000, "tol": 1e-6, "tol_consensus": 1e-3,
                 "runner": "inprocess", "on_node_failure": "raise", "num_nodes": None, "chunk": 50, "progress": False}


def badmm_options(**kw):
    return {**badmm.BADMM_DEFAULTS, "progress": False, **kw}


def node_max_angle(reference, Ws):
    return max(subspace_angle(reference, np.asarray(W)) for W in Ws)


# ------------------------------------------------------------------------------------------------
# Ray
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    yield ray
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.ray
def test_ray_runner_gives_the_inprocess_iterates_on_lr20_ring(ray_session):
    # issue 8: runner="ray" gives exactly the in-process result: same iterates to 1e-10 (float64 rounding; the node
    # step is jitted per actor instead of vmapped) after 30 rounds, J = 5 ring
    data, _ = simulate(0)
    _, a, _, _ = badmm.fit_badmm(data["Y"], data["node"], 5, LR20_HYPER, KEY, badmm_options(max_iter=30, tol=0.0))
    _, b, _, _ = badmm.fit_badmm(data["Y"], data["node"], 5, LR20_HYPER, KEY,
                             badmm_options(max_iter=30, tol=0.0, runner="ray"))
    assert a.rounds == b.rounds == 30
    for k in a.messages:
        np.testing.assert_allclose(np.asarray(b.messages[k]), np.asarray(a.messages[k]), rtol=0, atol=1e-10)
    np.testing.assert_allclose(b.history["residual"], a.history["residual"], rtol=1e-8, atol=1e-12)
    assert np.array_equal(b.history["bytes_sent"], a.history["bytes_sent"])


def _killer(node, at_round):
    def callback(t, run):
        if t == at_round:
            import ray
            ray.kill(run.actors[node])
    return callback


@pytest.mark.slow
@pytest.mark.ray
def test_ray_node_failure_raises_naming_the_node_and_keeps_the_last_round(ray_session):
    data, _ = simulate(0)
    with pytest.raises(NodeFailureError, match="node 2") as err:
        badmm.fit_badmm(data["Y"], data["node"], 5, LR20_HYPER, KEY, badmm_options(max_iter=20, tol=0.0, runner="ray"),
                    callback=_killer(2, 5))
    assert err.value.node == 2 and err.value.round == 6
    res = err.value.result
    assert res.rounds == 5 and len(res.history["residual"]) == 5
    assert np.all(np.isfinite(np.asarray(res.messages["mw"])))


@pytest.mark.slow
@pytest.mark.ray
def test_ray_continue_after_failure_on_a_ring_and_fail_when_the_star_hub_dies(ray_session):
    # a ring minus one node is a chain (connected): the run proceeds without it; a star without its hub is not
    data, _ = simulate(0)
    _, res, _, _ = badmm.fit_badmm(data["Y"], data["node"], 5, LR20_HYPER, KEY,
                               badmm_options(max_iter=40, tol=0.0, runner="ray", on_node_failure="continue"),
                               callback=_killer(2, 5))
    assert res.rounds == 40 and list(res.alive) == [True, True, False, True, True]
    assert res.failures and res.failures[0][1] == 2
    assert np.all(res.history["active"][6:, 2] == 0)
    with pytest.raises(NodeFailureError, match="connected"):
        badmm.fit_badmm(data["Y"], data["node"], 5, LR20_HYPER, KEY,
                    badmm_options(graph="star", max_iter=20, tol=0.0, runner="ray", on_node_failure="continue"),
                    callback=_killer(0, 3))


# ------------------------------------------------------------------------------------------------
# Cube structure from motion (paper sec. 4.2.1)
# ------------------------------------------------------------------------------------------------

CUBE_NOISE_XFAIL = (
    "measured (5 seeds, mean node-max angle to the truth, deg) at noise 0.01/0.05/0.10: D-MFVI (eta = 10) "
    "0.217/0.847/1.290, centralised VB 0.051/0.257/0.516, SVD 0.024/0.121/0.243. Two real causes, no bug: "
    "(1) the model's free offset mu centres the columns: centralised VB equals the column-centred SVD to 1e-4 deg "
    "on all 15 data sets, which loses the variance along the mean camera row (worst seed: VB - SVD = 0.25 deg at "
    "0.05, 0.51 at 0.10), so even the exact centralised solution misses the notes' 0.1 deg at 0.05 and 0.10; "
    "(2) eta = 10 is 1e-4..1e-6 of the data curvature tau N_i (E[tau] = 1.3e5/6e3/1.5e3 at 0.01/0.05/0.10): after "
    "the 2000-round cap the consensus residual is still 0.28/0.10/0.06 (not an early stop: the joint rule never "
    "fires). Each cause alone fails (seed 0): mu pinned (theta = 1e8) at eta = 10: 0.090/0.402/0.635 deg; adaptive "
    "eta with mu free: the centralised VB angle to <= 0.008 deg (0.05, 0.10). Both fixed (theta = 1e8, adaptive "
    "eta) meet the notes' tolerance, see test_cube_noise_gap_is_the_free_offset_and_the_eta_scale")


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=CUBE_NOISE_XFAIL)
@pytest.mark.parametrize("noise", [0.01, 0.05, 0.10])
def test_cube_noise_dmfvi_is_as_accurate_as_svd(noise):
    # notes test 9: 5 seeds, J = 5 ring, eta = 10: the node-max angle of D-MFVI to the true structure is within
    # 0.1 deg of the centralised SVD's angle on the same data (P for SVD: 0.02/0.10/0.21 deg; D-MFVI not prototyped)
    for seed in range(5):
        data, truth = simulate_cube(seed, noise=noise)
        _, res, _, _ = badmm.fit_badmm(data["Y"], data["node"], 5, CUBE_HYPER, KEY, badmm_options())
        a_d = node_max_angle(truth["structure"], res.messages["mw"])
        a_svd = subspace_angle(truth["structure"], svd_structure(data["Y"]))
        assert a_d <= a_svd + 0.1, (seed, a_d, a_svd)


@pytest.mark.slow
@pytest.mark.parametrize("noise", [0.01, 0.05, 0.10])
def test_cube_noise_gap_is_the_free_offset_and_the_eta_scale(noise):
    # Diagnosis of the xfail above (not a notes test), on the same 5 seeds:
    # (1) centralised VB with the free offset (theta = 0.01) IS the column-centred SVD (measured: equal to 1e-4 deg),
    #     i.e. the gap to the Tomasi-Kanade SVD (row-centred only) is the model's mu, not the distribution;
    # (2) with mu pinned at 0 (theta = 1e8: the row-centred measurement matrix has no offset) and eta adapted to the
    #     data's curvature (adaptive_eta, eta -> 1000), D-MFVI meets the notes' tolerance: node-max angle within
    #     0.1 deg of SVD (measured: within 0.022/0.003/0.007 deg at noise 0.01/0.05/0.10)
    for seed in range(5):
        data, truth = simulate_cube(seed, noise=noise)
        Y, S = data["Y"], truth["structure"]
        a_svd = subspace_angle(S, svd_structure(Y))
        a_cc = subspace_angle(S, np.linalg.svd(Y - Y.mean(0), full_matrices=False)[2][:3].T)
        st = vbem.run(C.cfg_from(CUBE_HYPER, 8), C.shard_of(Y), C.init_key(KEY), max_iter=5000, tol=1e-10).state
        assert abs(subspace_angle(S, np.asarray(st.g.mw)) - a_cc) < 0.005, seed
        _, res, _, _ = badmm.fit_badmm(Y, data["node"], 5, dict(CUBE_HYPER, theta=1e8), KEY,
                                   badmm_options(adaptive_eta=True, max_iter=5000))
        a_d = node_max_angle(S, res.messages["mw"])
        assert a_d <= a_svd + 0.1, (seed, a_d, a_svd)


def _reconstruction(mz_rows, Ws, mus, index):
    """Reconstruction of every row by the node that holds it."""
    out = np.zeros((int(index.max()) + 1, np.asarray(Ws[0]).shape[0]))
    for i in range(len(Ws)):
        rows = index[i][index[i] >= 0]
        out[rows] = np.asarray(mz_rows[i])[: len(rows)] @ np.asarray(Ws[i]).T + np.asarray(mus[i])
    return out


@pytest.mark.slow
def test_cube_20pct_missing_at_random():
    # notes test 10 (sigma = 1e-5, 10 masks): mean D-MFVI angle to the truth < 2 deg (paper 1.01), <= mean D-PPCA
    # angle + 0.25 deg; reconstruction RMSE on the missing entries within 10 % of centralised VB's
    a_d, a_p, rmse_d, rmse_c = [], [], [], []
    for seed in range(10):
        data, truth = simulate_cube(seed, noise=1e-5, missing="mar")
        _, res, _, index = badmm.fit_badmm(data["Y"], data["node"], 5, CUBE_HYPER, KEY, badmm_options())
        resp, _, _ = dppca.fit_dppca(data["Y"], data["node"], 5, CUBE_HYPER, KEY, DPPCA_OPTIONS)
        a_d.append(node_max_angle(truth["structure"], res.messages["mw"]))
        a_p.append(node_max_angle(truth["structure"], resp.messages["W"]))
        miss = truth["missing_mask"]
        rec_d = _reconstruction(res.states.vb.mz, res.messages["mw"], res.messages["mmu"], index)
        cfg = C.cfg_from(CUBE_HYPER, 8)
        st = vbem.run(cfg, C.shard_of(data["Y"]), C.init_key(KEY), max_iter=5000, tol=1e-9).state
        rec_c = np.asarray(st.mz @ st.g.mw.T + st.g.mmu)
        rmse_d.append(np.sqrt(np.mean((rec_d - truth["Y_complete"])[miss] ** 2)))
        rmse_c.append(np.sqrt(np.mean((rec_c - truth["Y_complete"])[miss] ** 2)))
    assert np.mean(a_d) < 2.0, a_d
    assert np.mean(a_d) <= np.mean(a_p) + 0.25, (a_d, a_p)
    assert np.mean(rmse_d) <= 1.1 * np.mean(rmse_c), (rmse_d, rmse_c)


@pytest.fixture(scope="module")
def cube_occlusion_runs():
    """10 initialisations (init keys) of D-MFVI and D-PPCA on the occlusion-masked cube (15.3 % missing)."""
    data, truth = simulate_cube(0, noise=1e-5, missing="occlusion")
    runs = []
    for init in range(10):
        key = jax.random.key(100 + init)
        _, res, _, _ = badmm.fit_badmm(data["Y"], data["node"], 5, CUBE_HYPER, key, badmm_options())
        resp, _, _ = dppca.fit_dppca(data["Y"], data["node"], 5, CUBE_HYPER, key, DPPCA_OPTIONS)
        runs.append((node_max_angle(truth["structure"], res.messages["mw"]), float(res.history["residual"][-1]),
                     node_max_angle(truth["structure"], resp.messages["W"])))
    return truth, runs


@pytest.mark.slow
def test_cube_occlusion_dmfvi_beats_dppca_on_most_inits(cube_occlusion_runs):
    # notes test 11 (documented comparison; paper means 14.12 vs 17.66 deg): D-MFVI's angle <= D-PPCA's on >= 7 of
    # 10 initialisations
    truth, runs = cube_occlusion_runs
    assert abs(truth["missing_fraction"] - 0.153) < 0.005
    wins = sum(d <= p for d, _, p in runs)
    assert wins >= 7, runs
