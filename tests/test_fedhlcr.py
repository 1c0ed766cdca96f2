"""FedHLCR (method ``fedgibbs``): notes 000_fedhlcr.md §3.6 and tests D1-D4, C2; issue 4.

Exact oracles where they exist (D1-D3: sums and label paths are identities, compared to rounding, 1e-10);
C2 is the notes' recovery criterion. Ray tests are ``slow`` + ``ray`` (Ray is an optional extra).
"""

import zoo  # noqa: F401  (JAX set-up first)

# isort: split
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

import inference
from inference._timing import Stopwatch
from inference.distributed.protocol import node_key
from inference.hlcr import federated as fed
from inference.hlcr import fedgibbs as hf
from inference.hlcr import fedvb as fvb
from inference.hlcr import gibbs as hg
from inference.hlcr.common import cluster_state, make_config, pair_data
from zoo.hlcr import model_inputs, pair_structure, simulate, split_events

K, F = 3, 2
HYPER = {"K": K, "alpha": None, "beta": 1.0, "delta": 1.0, "sigma": 0.5}
ROUNDS = 4          # one round count (and chunk) for the small runs, so they share compilations


def small_data(seed=0):
    data, truth = simulate(seed, n_agents=7, mean_entities=3.0, mean_events=6.0, K=K, F=F, sigma=0.5)
    return data, truth


def centralised_stats(data, z):
    pdat = pair_data(model_inputs(data, HYPER))
    D, c, _ = jax.jit(cluster_state, static_argnums=3)(pdat.Gs, pdat.gs, jnp.asarray(z), K, HYPER["delta"])
    return np.asarray(D), np.asarray(c)


@pytest.fixture(scope="module")
def partial_run():
    """gamma = 0.5, 50 % participation, 20 % dropout, G4 on: the run several tests inspect."""
    data, _ = small_data(1)
    agents = fed.split_by_agent(data)
    res, index, audit = hf.run_federated(agents, HYPER, jax.random.key(11), max_iter=ROUNDS, chunk=ROUNDS,
                                         gamma=0.5, participation=0.5, dropout=0.2)
    return data, agents, res, index, audit


# ----------------------------------------------------------------------------------------------
# D1: federated sums = centralised statistics
# ----------------------------------------------------------------------------------------------

def test_d1_agent_uploads_sum_to_centralised_cluster_statistics_for_any_partition():
    data, _ = small_data(0)
    E = pair_structure(data["agent"], data["entity"])["n_pairs"]
    z = np.random.default_rng(0).integers(0, K, E)
    D_c, c_c = centralised_stats(data, z)
    for n_groups in (1, 3, 7):   # any partition of the pairs into agents: regroup agents
        d = dict(data)
        d["agent"] = data["agent"] % n_groups
        d["entity"] = data["agent"] * 1000 + data["entity"]     # keep pairs distinct after regrouping
        agents = fed.split_by_agent(d)
        shards, index = fed.make_shards(agents, HYPER["sigma"])
        # global pair order of the regrouped data differs: map labels through the (agent, entity) ids
        ps_new = pair_structure(d["agent"], d["entity"])
        ps_old = pair_structure(data["agent"], data["entity"])
        old_of_event_pair = np.zeros(ps_new["n_pairs"], np.int64)
        old_of_event_pair[ps_new["pair"]] = ps_old["pair"]
        z_new = z[old_of_event_pair]
        zz = np.zeros(index.shape, np.int32)
        zz[index >= 0] = z_new[index[index >= 0]]
        up = jax.jit(jax.vmap(lambda zi, sh: hf._upload(zi, sh, K, jnp.zeros(K))))(jnp.asarray(zz), shards)
        # identity up to rounding of the sums: 1e-10 absolute
        np.testing.assert_allclose(np.eye(F) + np.asarray(up["D"]).sum(0), D_c, atol=1e-10)
        np.testing.assert_allclose(np.asarray(up["c"]).sum(0), c_c, atol=1e-10)


# ----------------------------------------------------------------------------------------------
# D2: smoothing keeps the prior and stays PSD
# ----------------------------------------------------------------------------------------------

def test_d2_smoothed_statistics_are_the_ema_of_the_active_sums_and_stay_psd():
    gamma = 0.3
    cfg = hf.Config(K, F, float(K), 1.0, 1.0, gamma, True, "exact", 0.0)
    proto = hf.make_protocol(cfg, jax.random.key(0))
    aggregate = proto.aggregate   # eager: three calls, cheaper than a compilation
    rng = np.random.default_rng(2)
    J = 5

    def msgs():
        A = rng.normal(size=(J, K, F, 4))
        return {"D": jnp.asarray(A @ np.swapaxes(A, -1, -2)), "c": jnp.asarray(rng.normal(size=(J, K, F))),
                "n": jnp.asarray(rng.integers(0, 4, (J, K)).astype(float)), "m": jnp.ones((J, K))}

    m0 = msgs()
    active = jnp.asarray([True, False, True, True, False])
    server = proto.init_server(m0, jnp.ones(J, bool))
    server, inbox = aggregate(server, m0, jnp.ones(J, bool))      # initialisation: the plain sum
    np.testing.assert_allclose(np.asarray(inbox["D"][0]) - np.eye(F), np.asarray(m0["D"]).sum(0), atol=1e-12)
    prev = np.asarray(inbox["D"][0])
    m1 = msgs()
    server, inbox = aggregate(server, m1, active)
    S = np.asarray(m1["D"])[np.asarray(active)].sum(0)
    new = np.asarray(inbox["D"][0])
    # D_(t) - I/delta^2 = (1 - gamma)(D_(t-1) - I/delta^2) + gamma S  (notes D2), to rounding 1e-12
    np.testing.assert_allclose(new - np.eye(F), (1 - gamma) * (prev - np.eye(F)) + gamma * S, atol=1e-12)
    assert np.linalg.eigvalsh(new - np.eye(F)).min() > -1e-12
    # a round in which no agent reports changes nothing
    server2, inbox2 = aggregate(server, msgs(), jnp.zeros(J, bool))
    np.testing.assert_array_equal(np.asarray(inbox2["D"]), np.asarray(inbox["D"]))
    assert int(server2.t) == int(server.t)


# ----------------------------------------------------------------------------------------------
# D3: leave-own-out equivalence with the centralised sampler
# ----------------------------------------------------------------------------------------------

def _one_agent(data):
    d = dict(data)
    d["entity"] = pair_structure(data["agent"], data["entity"])["pair"]   # every pair keeps its identity
    d["agent"] = np.zeros_like(data["agent"])
    return d


def _centralised_path(d, z0, key, rounds, prior):
    pdat = pair_data(model_inputs(d, HYPER))
    hyper = make_config(HYPER, 1)
    st = hg.state_from_labels(jnp.asarray(z0, jnp.int32), pdat, hyper)
    k_agents, _ = jax.random.split(key)
    changed = []
    step = jax.jit(lambda k, s: hg.kernel(hyper, prior).step(k, s, hg.Problem(pdat)))
    for t in range(1, rounds + 1):
        st, info = step(node_key(k_agents, t, 0), st)
        changed.append(int(info.n_changed))
    return np.asarray(st.z), changed


def test_d3_one_agent_full_participation_gamma1_leave_own_out_reproduces_centralised_gibbs_labels_exactly():
    # weakly informative pairs (2 events, noise 1.0 against sigma = 0.5 in the model): labels keep moving
    data, _ = simulate(3, n_agents=7, mean_entities=3.0, mean_events=2.0, K=K, F=F, sigma=1.0)
    d = _one_agent(data)
    E = pair_structure(d["agent"], d["entity"])["n_pairs"]
    z0 = np.random.default_rng(4).integers(0, K, E)
    key = jax.random.key(5)
    # prior="paper" (Algorithm 2's eq. 2): the labels do not depend on the server's psi draws, so the label
    # path is a deterministic function of the shared agent keys -> must be IDENTICAL: the final labels and the
    # number of labels changed in every round (a path that diverged would not re-merge on both)
    z_central, changed = _centralised_path(d, z0, key, ROUNDS, "paper")
    res, index, _ = hf.run_federated(fed.split_by_agent(d), HYPER, key, max_iter=ROUNDS, chunk=ROUNDS,
                                     prior="paper", z_init=z0)
    z = fed.global_labels(res, index)
    np.testing.assert_array_equal(z, z_central)
    np.testing.assert_array_equal(res.history["n_changed"], changed)
    assert sum(changed) > 0
    # D1 on the run: after a gamma = 1, full-participation round the server holds the centralised statistics
    # of that round's labels (to rounding of the sums, 1e-10)
    D_c, c_c = centralised_stats(d, z)
    np.testing.assert_allclose(np.eye(F) + np.asarray(res.server_state.D), D_c, atol=1e-10)
    np.testing.assert_allclose(np.asarray(res.server_state.c), c_c, atol=1e-10)
    np.testing.assert_allclose(np.asarray(res.server_state.n), np.bincount(z, minlength=K), atol=1e-12)

    # guard against accidental "fixes": without G4 (the paper's Algorithm 3) the pair's own data stays in the
    # broadcast statistics, the conditionals differ and so does the label path under the same keys
    res, index, _ = hf.run_federated(fed.split_by_agent(d), HYPER, key, max_iter=ROUNDS, chunk=ROUNDS,
                                     prior="paper", z_init=z0, leave_own_out=False)
    assert not (np.array_equal(fed.global_labels(res, index), z_central)
                and np.array_equal(res.history["n_changed"], changed))


@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_the_initialisation_round_draws_no_psi_and_equals_the_general_aggregate(noise):
    """The round-0 aggregate after ``init_server`` (its t = -1 a host constant) takes the sums as they are and keeps
    psi uniform without drawing the psi that round discards; the same aggregate with the server state traced (the
    general path, whose draw is then masked out) gives the same server state and broadcast (to 1e-14; the draw's
    random numbers: one fewer function in the compiled start)."""
    J = 3
    rng = np.random.default_rng(0)
    A = rng.normal(size=(J, K, F, F))
    messages = {"D": A @ np.swapaxes(A, -1, -2), "c": rng.normal(size=(J, K, F)),
                "n": rng.integers(0, 5, (J, K)).astype(float), "m": rng.integers(0, 3, (J, K)).astype(float)}
    active = np.array([True, False, True])
    cfg = hf.Config(K, F, 1.0, 1.0, 1.0, 0.5, True, "exact", noise)
    proto = hf.make_protocol(cfg, jax.random.key(1))
    server0 = proto.init_server(messages, active)
    assert isinstance(server0.t, np.ndarray) and int(server0.t) == -1
    first = jax.jit(lambda m, a: proto.aggregate(proto.init_server(m, a), m, a))(messages, active)
    general = jax.jit(proto.aggregate)(server0, messages, active)
    for got, want in zip(jax.tree.leaves(first), jax.tree.leaves(general), strict=True):
        if jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key):
            got, want = jax.random.key_data(got), jax.random.key_data(want)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-14, atol=1e-14)
    server = first[0]
    assert int(server.t) == 0
    np.testing.assert_array_equal(np.asarray(server.log_psi), np.full(K, -np.log(K)))
    if noise == 0.0:
        np.testing.assert_allclose(np.asarray(server.D), (messages["D"] * active[:, None, None, None]).sum(0),
                                   rtol=1e-14)


def test_leave_own_out_tracks_each_agents_smoothed_contribution_exactly(partial_run):
    """Under partial participation, dropouts and gamma < 1, the sum over agents of their own tracked
    contributions (decayed to the server's update count) equals the server's smoothed statistics: G4 removes
    exactly what the server holds of the agent (to rounding, 1e-10)."""
    _, _, res, _, _ = partial_run
    st, sv = res.states, res.server_state
    decay = (1 - 0.5) ** (int(sv.t) - np.asarray(st.t_own))
    for own, tot in ((st.own_D, sv.D), (st.own_c, sv.c), (st.own_n, sv.n)):
        own = np.asarray(own)
        np.testing.assert_allclose((decay.reshape(-1, *[1] * (own.ndim - 1)) * own).sum(0), np.asarray(tot),
                                   atol=1e-10)


def test_gamma_is_an_argument_of_the_compiled_rounds_so_a_second_gamma_compiles_nothing(partial_run):
    """The learning rate is a runtime value of the compiled rounds (issue 28 item 2): the partial run again with
    gamma = 0.25 instead of 0.5 builds no program, and the server applied the new rate: the agents' tracked
    contributions decayed by (1 - 0.25) per server update sum to its statistics (to rounding, 1e-10)."""
    _, agents, ref, _, _ = partial_run
    key = jax.random.key(11)
    with Stopwatch() as watch:
        res, _, _ = hf.run_federated(agents, HYPER, key, max_iter=ROUNDS, chunk=ROUNDS, gamma=0.25,
                                     participation=0.5, dropout=0.2)
    assert watch.xla_compiles == []
    st, sv = res.states, res.server_state
    assert float(sv.gamma) == 0.25
    assert not np.allclose(np.asarray(sv.D), np.asarray(ref.server_state.D))
    decay = (1 - 0.25) ** (int(sv.t) - np.asarray(st.t_own))
    for own, tot in ((st.own_D, sv.D), (st.own_c, sv.c), (st.own_n, sv.n)):
        own = np.asarray(own)
        np.testing.assert_allclose((decay.reshape(-1, *[1] * (own.ndim - 1)) * own).sum(0), np.asarray(tot),
                                   atol=1e-10)


def test_partial_participation_and_dropout_select_the_stated_fraction(partial_run):
    _, agents, res, _, _ = partial_run
    J = len(agents)
    active = res.history["active"]
    assert active.shape == (ROUNDS, J)
    # the server picks ceil(0.5 J) agents per round; dropouts (p = 0.2) can only remove some of them
    assert np.all(active.sum(1) <= np.ceil(0.5 * J))
    assert np.all(res.history["n_active"] == active.sum(1))
    np.testing.assert_array_equal(res.history["bytes_sent"], active * res.message_nbytes)


def test_dp_noise_perturbs_the_uploads_and_the_server_keeps_psd_statistics():
    data, _ = small_data(0)
    agents = fed.split_by_agent(data)
    res, index, _ = hf.run_federated(agents, HYPER, jax.random.key(0), max_iter=ROUNDS, chunk=ROUNDS,
                                     dp_noise_scale=0.5)
    z = fed.global_labels(res, index)
    D_c, _ = centralised_stats(data, z)
    sent = np.eye(F) + np.asarray(res.messages["D"]).sum(0)
    # the uploads are noisy (J agents x sd 0.5 per entry: far above rounding) ...
    assert np.abs(sent - D_c).max() > 0.1
    # ... the server's smoothed statistics stay PSD (eigenvalue projection), so every Cholesky is defined
    assert np.linalg.eigvalsh(np.asarray(res.server_state.D)).min() > -1e-10
    assert np.all(np.isfinite(res.history["log_joint"]))


# ----------------------------------------------------------------------------------------------
# D4: protocol audit
# ----------------------------------------------------------------------------------------------

def test_d4_audit_only_cluster_indexed_arrays_cross_and_nothing_indexed_by_pair_or_event(partial_run):
    data, agents, res, index, audit = partial_run
    ps = pair_structure(data["agent"], data["entity"])
    E, M, P = ps["n_pairs"], len(data["y"]), index.shape[1]
    # pair-indexed arrays would carry a pair axis (the agents' padded P slots) or the global E / M
    forbidden = {E, M, P}
    assert not forbidden & {K, F}, "test data must make pair/event counts distinguishable from K and F"
    assert audit["uplink"], "the transport was not intercepted"
    assert set(audit) >= {"uplink", "downlink", "monitoring"}
    assert {tuple(r["shape"]) for r in audit["uplink"]} <= {(K, F, F), (K, F), (K,)}
    assert {tuple(r["shape"]) for r in audit["downlink"]} <= {(K, F, F), (K, F), (K,), ()}
    assert {tuple(r["shape"]) for r in audit["monitoring"]} <= {(K,), ()}
    for channel in ("uplink", "downlink", "monitoring"):
        for r in audit[channel]:
            assert not forbidden & set(r["shape"]), (channel, r)
    # bytes per round: the active agents times one message K F^2 + K F + 2 K float64
    assert res.message_nbytes == 8 * (K * F * F + K * F + 2 * K)
    assert audit["bytes_uploaded_per_round"] == (res.history["active"].sum(1) * res.message_nbytes).tolist()
    # the same records ahead of any run (eval_shape), and they do not change when an agent holds more pairs
    proto = hf.make_protocol(hf.Config(K, F, 3.0, 1.0, 1.0, 1.0, True, "exact", 0.0), jax.random.key(0))
    shard = jax.tree.map(lambda a: a[0], fed.make_shards(agents, 0.5)[0])
    bigger = jax.tree.map(lambda a: np.concatenate([a, a, a]), shard)
    spec, spec_big = hf.message_spec(proto, shard), hf.message_spec(proto, bigger)
    assert {tuple(r["shape"]) for r in spec["uplink"]} == {(K, F, F), (K, F), (K,)}
    assert spec == spec_big


# ----------------------------------------------------------------------------------------------
# C2 and fit()
# ----------------------------------------------------------------------------------------------

def test_c2_fedgibbs_best_of_3_restarts_reaches_ari_099_within_10_rounds_on_c1_data():
    """Notes C2 on the C1 data (K=3, F=3, N=64, N_*=4, N_**=20, sigma=0.3, delta=2, 80 % of events), seed 0;
    all agents, gamma = 1; best of 3 restarts chosen by the final collapsed log joint (a training quantity)."""
    data, truth = simulate(0, n_agents=64, mean_entities=4.0, mean_events=20.0, K=3, F=3, sigma=0.3, delta=2.0)
    train, _ = split_events(data, 0.2, seed=0)
    tree = inference.fit("hlcr", train, "fedgibbs", seed=0, K=3, sigma=0.3, delta=2.0, num_restarts=3, max_iter=10)
    finals = __import__("json").loads(tree.attrs["objective_per_restart"])
    assert len(finals) == 3 and float(tree.attrs["objective"]) == max(finals)   # the best restart is kept
    z = tree["posterior"]["z"].values[0, 0]
    z_true = truth["z"]   # every pair keeps >= 1 training event, so the pair order is unchanged
    assert adjusted_rand_score(z_true, z) >= 0.99
    lj = tree["sample_stats"]["log_joint"].values
    assert lj.shape == (10,) and np.all(np.isfinite(lj))
    audit = __import__("json").loads(tree.attrs["protocol_audit"])
    assert {tuple(r["shape"]) for r in audit["uplink"]} <= {(3, 3, 3), (3, 3), (3,)}


# ----------------------------------------------------------------------------------------------
# Bad input: errors before any round runs
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def no_rounds(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("a round ran before the input was checked")
    monkeypatch.setattr(hf, "run_protocol", fail)


@pytest.mark.parametrize(("options", "match"), [
    ({"gamma": 0.0}, "gamma"), ({"gamma": 1.5}, "gamma"), ({"participation": 0.0}, "participation"),
    ({"participation": 1.2}, "participation"), ({"dropout": 1.0}, "dropout"),
    ({"dp_noise_scale": -1.0}, "dp_noise_scale"), ({"prior": "ALDA"}, "prior"),
    ({"num_agents": 50}, "no data"),
])
def test_bad_options_raise_before_any_round(no_rounds, options, match):
    data, _ = small_data(0)
    with pytest.raises(ValueError, match=match):
        inference.fit("hlcr", data, "fedgibbs", seed=0, **options)


def test_bad_agents_raise_before_any_round(no_rounds):
    data, _ = small_data(0)
    agents = fed.split_by_agent(data)
    empty = [*agents, {"X": np.zeros((0, F)), "y": np.zeros(0), "entity": np.zeros(0, int)}]
    with pytest.raises(ValueError, match=r"agents\[7\]: agent has no data"):
        hf.run_federated(empty, HYPER, jax.random.key(0))
    wrong_f = [dict(a) for a in agents]
    wrong_f[2]["X"] = np.ones((len(wrong_f[2]["y"]), F + 1))
    with pytest.raises(ValueError, match=r"agents\[2\]\['X'\]: expected F = 2"):
        hf.run_federated(wrong_f, HYPER, jax.random.key(0))
    with pytest.raises(ValueError, match="gamma"):
        hf.run_federated(agents, HYPER, jax.random.key(0), gamma=-0.1)
    with pytest.raises(ValueError, match="participation"):
        hf.run_federated(agents, HYPER, jax.random.key(0), participation=2.0)


# ----------------------------------------------------------------------------------------------
# Ray runner (optional extra): same labels, a killed agent actor is a dropout
# ----------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.ray
def test_ray_runner_gives_the_in_process_labels_and_survives_a_killed_agent():
    pytest.importorskip("ray")
    import ray

    data, _ = small_data(2)
    data = {k: v[np.isin(data["agent"], [0, 1, 2, 3])] for k, v in data.items()}   # 4 actors on 2 cores
    agents = fed.split_by_agent(data)
    kw = {"max_iter": ROUNDS, "chunk": ROUNDS, "gamma": 0.5, "participation": 0.75}
    res_ip, index, _ = hf.run_federated(agents, HYPER, jax.random.key(7), **kw)
    res_ray, index_r, audit = hf.run_federated(agents, HYPER, jax.random.key(7), runner="ray", **kw)
    np.testing.assert_array_equal(fed.global_labels(res_ray, index_r), fed.global_labels(res_ip, index))
    np.testing.assert_allclose(np.asarray(res_ray.server_state.D), np.asarray(res_ip.server_state.D), atol=1e-10)
    assert {tuple(r["shape"]) for r in audit["uplink"]} <= {(K, F, F), (K, F), (K,)}

    def kill(t, run):
        if t == 2:
            ray.kill(run.actors[1])

    res, _, _ = hf.run_federated(agents, HYPER, jax.random.key(7), runner="ray", callback=kill,
                                 on_node_failure="continue", max_iter=ROUNDS)
    assert res.rounds == ROUNDS
    assert [f[1] for f in res.failures] == [1] and not res.alive[1]
    assert not res.history["active"][2:, 1].any() and res.history["active"][2:, [0, 2, 3]].all()
    assert np.all(np.isfinite(res.history["log_joint"]))


# ----------------------------------------------------------------------------------------------
# fedvb: federated VB-EM = centralised VB-EM after every iteration (notes E3)
# ----------------------------------------------------------------------------------------------

@functools.cache
def _fedvb_vs_centralised(iterations=3):
    """Max abs difference of (r, a) between federated round t and centralised ``vb.iterate`` t, t = 1..3,
    from the same initial responsibilities (the agents' round-0 draws)."""
    from inference.hlcr import vb as hv

    data, _ = small_data(0)
    agents = fed.split_by_agent(data)
    key = jax.random.key(3)
    index = fed.make_shards(agents, HYPER["sigma"])[1]
    J, P = index.shape
    valid = index >= 0
    r0 = np.zeros((int(valid.sum()), K))
    for i in range(J):
        ri = np.asarray(hv.flat_dirichlet(node_key(key, 0, i), (P, K)))   # the agents' start (fedvb's init)
        r0[index[i][valid[i]]] = ri[valid[i]]
    inp = model_inputs(data, HYPER)
    pdat, hyper = pair_data(inp), make_config(HYPER, inp["n_agents"])
    m, S = hv._update_w(jnp.asarray(r0), pdat, hyper)
    lp = jnp.full(K, -jnp.log(K))
    st = hv.State(jnp.asarray(r0), m, S, hv._update_theta(jnp.asarray(r0), lp, pdat, hyper), lp)
    step = jax.jit(lambda s: hv.iterate(s, pdat, hyper)[0])
    errs = []
    for t in range(1, iterations + 1):
        st = step(st)
        res, index, audit = fvb.run_federated_vb(agents, HYPER, key, max_iter=t, chunk=1)
        r = np.zeros_like(r0)
        r[index[valid]] = np.asarray(res.states.r)[valid]
        errs.append(max(np.abs(r - np.asarray(st.r)).max(), np.abs(np.asarray(res.states.a) - np.asarray(st.a)).max()))
    return np.asarray(errs), audit


def test_fedvb_equals_centralised_vbem_after_every_iteration_to_1e_7_and_sends_only_cluster_statistics():
    errs, audit = _fedvb_vs_centralised()
    # Measured ~1e-9..5e-9. The federated sums are the same numbers added in another order (1e-15 relative);
    # the psi step (vb._update_psi) is an ascent with an accept-if-not-worse test, and near its optimum that
    # test compares objective values equal to rounding, so 1e-15 input differences become ~1e-9 in psi and hence
    # in a and r. 1e-7 (absolute, on probabilities and Dirichlet parameters) bounds that; an algorithmic
    # difference (a missing term, a stale block) shows at 1e-2 or more.
    assert np.all(errs < 1e-7), errs
    assert {tuple(r["shape"]) for r in audit["uplink"]} <= {(K, F, F), (K, F), (K,)}
    tree = inference.fit("hlcr", small_data(0)[0], "fedvb", seed=0, max_iter=3, chunk=1, num_samples=20)
    assert tree["posterior"]["w"].shape == (1, 20, K, F) and "log_q" in tree["sample_stats"]


def test_fedvb_restarts_keep_the_run_with_the_highest_bound():
    """num_restarts independent federated runs (different random soft labels); the kept one has the largest
    final bound (vbem's rule) and its draws are the ones in the tree."""
    import json

    data = small_data(1)[0]
    many = inference.fit("hlcr", data, "fedvb", seed=3, max_iter=15, num_samples=10, num_restarts=3)
    elbos = json.loads(many.attrs["objective_per_restart"])
    assert len(elbos) == 3 and len(set(elbos)) == 3 and float(many.attrs["objective"]) == max(elbos)
    with pytest.raises(ValueError, match="num_restarts"):
        inference.fit("hlcr", data, "fedvb", seed=0, num_restarts=0)


@pytest.mark.xfail(strict=True, reason="notes E3 asks 1e-10; measured 1e-9..5e-9: rounding differences of the summed "
                                       "soft statistics are amplified by the accept test of the psi ascent "
                                       "(vb._update_psi), not by federation")
def test_fedvb_equals_centralised_vbem_to_the_notes_1e_10():
    errs, _ = _fedvb_vs_centralised()
    assert np.all(errs < 1e-10), errs
