"""FedHLCR's round-0 carry built on the host (``fedgibbs.host_start``, issue 28): the same start as the loop's
program would compute (``protocol_kernel``'s ``init``, the server's key and the learning rate), so the run program
can hold no start.

Oracle: the in-program start itself, run as JAX (``_with_server_key`` under ``loop._optimiser_start_fn``), an
independent implementation (``jax.random.randint``, ``segment_sum``, the protocol's ``aggregate``) of what the host
replays in NumPy. Labels and integers must be equal; floating leaves are the same sums in another order, so they
agree to a few ulps: a relative tolerance of 1e-12 is far below what one wrong label does (it moves a pair's
statistics, O(1) relative, between two clusters' sums) or a missing prior term (I/delta^2).
"""

import zoo  # noqa: F401  (JAX set-up first)

# isort: split
import jax
import numpy as np
import pytest

from inference import host_keys, loop
from inference.hlcr import federated as fed
from inference.hlcr import fedgibbs as hf

K, F = 4, 3


def tiny_shards():
    """Three agents of 7, 3 and 6 pairs (padded to a common P: agents 1 and 2 hold padded slots); agent 1 is given
    the labels of its first two pairs (``z0``), the others draw theirs."""
    rng = np.random.default_rng(0)

    def agent(n, entities):
        return {"X": rng.normal(size=(n, F)), "y": rng.normal(size=n), "entity": rng.choice(entities, n)}

    agents = [agent(30, 7), agent(12, 3), agent(25, 6)]
    shards, _ = fed.make_shards(agents, 0.7)
    z0 = np.array(shards.z0)
    z0[1, :2] = [3, 1]
    return shards._replace(z0=z0)


def assert_same_state(host, program):
    host_leaves, host_tree = jax.tree.flatten(host)
    program_leaves, program_tree = jax.tree.flatten(program)
    assert host_tree == program_tree
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(host), program_leaves, strict=True):
        name = jax.tree_util.keystr(path)
        if jax.dtypes.issubdtype(b.dtype, jax.dtypes.prng_key):
            a, b = host_keys.words(a), host_keys.words(b)
        a, b = np.asarray(a), np.asarray(b)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), name
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("num_restarts", [1, 3])
@pytest.mark.parametrize("given_server_key", [True, False])
def test_host_start_equals_the_in_program_start_labels_exactly_and_sums_to_rounding(num_restarts, given_server_key):
    shards = tiny_shards()
    assert np.array_equal(shards.mask.sum(1), [7, 3, 6]) and shards.mask.shape[1] > 7   # padded slots exist
    cfg = hf.Config(K, F, 1.0, 1.0, 2.0, None, True, "exact", 0.0)
    kern, _, _ = hf.kernel(cfg)
    key = host_keys.fold_in(jax.random.key(3), 0)
    server_key = host_keys.fold_in(jax.random.key(3), 10**6) if given_server_key else None
    init, _ = fed._with_server_key(kern.init, kern.step, hf._seed_server if given_server_key else None, hf.set_rate)
    program = loop._optimiser_start_fn(init, num_restarts, num_restarts == 1)(key, (shards, server_key,
                                                                                     np.float64(0.3)))
    host = hf.host_start(cfg, fed.start_keys(key, num_restarts), shards, server_key, 0.3)
    assert_same_state(host, program)
    z = np.asarray(host.carry.states.z)
    assert np.array_equal(z[:, 1, :2], np.broadcast_to([3, 1], (num_restarts, 2)))   # the given labels are kept


def test_noisy_uploads_keep_the_in_program_start():
    cfg = hf.Config(K, F, 1.0, 1.0, 2.0, None, True, "exact", 0.1)
    key = jax.random.key(0)
    assert hf.host_start(cfg, fed.start_keys(key, 1), tiny_shards(), None, 1.0) is None


def test_a_run_from_the_host_start_follows_the_in_program_starts_label_path(monkeypatch):
    """Three rounds of a tiny run, from the host start and (host start disabled) from the program's: the same
    labels (exact: the same keys and the same conditionals up to rounding) and log joint to 1e-10 relative."""
    agents = [{"X": np.asarray(s), "y": np.asarray(y), "entity": np.asarray(e)} for s, y, e in (
        (np.random.default_rng(i).normal(size=(20, F)), np.random.default_rng(i + 9).normal(size=20),
         np.random.default_rng(i + 19).integers(0, 4 + i, 20)) for i in range(3))]
    hyper = {"K": K, "alpha": None, "beta": 1.0, "delta": 1.0, "sigma": 0.5}
    key = jax.random.key(5)
    run = lambda: hf.run_federated(agents, hyper, key, max_iter=3, gamma=0.5, chunk=3)  # noqa: E731
    host_res, _, _ = run()
    monkeypatch.setattr(hf, "host_start", lambda *args: None)
    program_res, _, _ = run()
    np.testing.assert_array_equal(np.asarray(host_res.states.z), np.asarray(program_res.states.z))
    np.testing.assert_allclose(host_res.history["log_joint"], program_res.history["log_joint"], rtol=1e-10)


def test_keys_other_than_jaxs_default_threefry_keep_the_in_program_start(monkeypatch):
    cfg = hf.Config(K, F, 1.0, 1.0, 2.0, None, True, "exact", 0.0)
    monkeypatch.setattr(hf.hd, "threefry_native", lambda: False)
    assert hf.host_start(cfg, fed.start_keys(jax.random.key(0), 1), tiny_shards(), None, 1.0) is None
