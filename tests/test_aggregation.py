"""Pure server math: FedAvg's weighted mean and the per-class prototype mean."""

import numpy as np
import pytest

from fedstrategies.aggregate import weighted_average
from fedstrategies.prototypes import aggregate_class_features


def test_weighted_average_matches_brute_force_and_keeps_dtypes():
    rng = np.random.default_rng(0)
    states = [{"w": rng.normal(size=(3, 4)).astype(np.float32), "n": np.array(i, dtype=np.int64)} for i in range(4)]
    weights = [10, 20, 30, 40]
    out = weighted_average(states, weights)
    expected = sum(w * s["w"].astype(np.float64) for w, s in zip(weights, states)) / sum(weights)
    np.testing.assert_allclose(out["w"], expected, rtol=1e-6)
    assert out["w"].dtype == np.float32
    assert out["n"] == 3  # integer counters take the max



@pytest.mark.parametrize("m", [1, 16, 37])
def test_weighted_average_of_many_float32_states_is_within_float32_noise_of_the_float64_mean(m):
    """The states are summed BLOCK at a time in float32 and each block goes into a float64 total: with m not a
    multiple of the block, the last partial block counts too, and no block counts twice."""
    from fedstrategies.aggregate import BLOCK

    assert BLOCK == 16
    rng = np.random.default_rng(2)
    base = rng.normal(scale=0.05, size=(64, 33))
    states = [{"w": (base + 1e-3 * rng.normal(size=base.shape)).astype(np.float32),
               "d": rng.normal(size=7)} for _ in range(m)]  # "d": float64, summed in float64 throughout
    weights = rng.integers(20, 3000, size=m)
    out = weighted_average(states, weights)
    p = weights / weights.sum()
    exact = {k: np.einsum("i,i...->...", p, np.stack([s[k].astype(np.float64) for s in states])) for k in ("w", "d")}
    assert out["w"].dtype == np.float32 and out["d"].dtype == np.float64
    np.testing.assert_allclose(out["w"], exact["w"], rtol=2e-6, atol=1e-8)
    np.testing.assert_allclose(out["d"], exact["d"], rtol=1e-13, atol=1e-15)



def test_many_small_contributions_after_a_large_one_are_kept_by_the_float64_total():
    """Why the float32 partial sums are short: one heavy state, then 160 light ones each adding 1e-8, under half a
    float32 ulp of the running total. One float32 sum over all states would lose all of them (1.6e-6, 13 ulps);
    blocks of 16 lose at most the light states of the heavy state's block."""
    states = [{"w": np.ones(4, np.float32)}] + [{"w": np.full(4, 0.01, np.float32)} for _ in range(160)]
    weights = [1e6] + [1.0] * 160
    exact = (1e6 + 160 * 0.01) / (1e6 + 160)
    np.testing.assert_allclose(weighted_average(states, weights)["w"], exact, rtol=3e-7)



def test_weighted_average_in_float64_keeps_the_float_means_float64_and_the_counters_integer():
    states = [{"w": np.array([1.0, 2.0], np.float32), "n": np.array(i, np.int64)} for i in range(3)]
    out = weighted_average(states, [1, 1, 2], float64=True)
    assert out["w"].dtype == np.float64 and out["n"].dtype == np.int64 and out["n"] == 2
    np.testing.assert_array_equal(out["w"], [1.0, 2.0])
    assert weighted_average(states, [1, 1, 2])["w"].dtype == np.float32


def test_weighted_average_is_order_and_scale_invariant():
    rng = np.random.default_rng(1)
    states = [{"w": rng.normal(size=5)} for _ in range(3)]
    a = weighted_average(states, [1, 2, 3])["w"]
    b = weighted_average(states[::-1], [3, 2, 1])["w"]
    c = weighted_average(states, [10, 20, 30])["w"]
    np.testing.assert_allclose(a, b)
    np.testing.assert_allclose(a, c)


@pytest.mark.parametrize("weights", [[0, 0], [-1, 2], [[1, 2]], []])
def test_weighted_average_rejects_bad_weights(weights):
    with pytest.raises(ValueError, match="non-negative numbers with a positive sum"):
        weighted_average([{"w": np.zeros(2)}, {"w": np.ones(2)}], weights)


def test_weighted_average_needs_one_weight_per_state():
    with pytest.raises(ValueError, match="more states than the 1 weights"):
        weighted_average([{"w": np.zeros(2)}, {"w": np.ones(2)}], [1])
    with pytest.raises(ValueError, match="2 states for 3 weights"):
        weighted_average([{"w": np.zeros(2)}, {"w": np.ones(2)}], [1, 1, 1])


def test_zero_and_fractional_weights_are_weights():
    """A zero weight leaves its state out; weights below 1 and summing below 1 are normalised like any others."""
    states = [{"w": np.full(2, 7.0, np.float32)}, {"w": np.zeros(2, np.float32)}, {"w": np.ones(2, np.float32)}]
    np.testing.assert_allclose(weighted_average(states, [0, 0.5, 0.25])["w"], [1 / 3, 1 / 3], rtol=1e-6)


def test_read_only_states_are_read_without_a_warning():
    """Replies are read-only views of the message bytes: torch warns on wrapping one, which the sum silences."""
    import warnings

    state = {"w": np.ones(3, np.float32)}
    state["w"].setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(weighted_average([state, state], [1, 3])["w"], np.ones(3))


def test_prototypes_weighted_and_uniform():
    ids = [np.array([0, 2]), np.array([2])]
    feats = [np.array([[1.0, 1.0], [0.0, 0.0]]), np.array([[4.0, 8.0]])]
    counts = [np.array([5, 1]), np.array([3])]
    got_ids, got, total = aggregate_class_features(ids, feats, counts, num_classes=4)
    np.testing.assert_array_equal(got_ids, [0, 2])
    np.testing.assert_allclose(got[0], [1, 1])  # single reporter: its own vector
    np.testing.assert_allclose(got[1], [3.0, 6.0])  # (1*0 + 3*(4,8)) / 4
    np.testing.assert_array_equal(total, [5, 4])
    _, uni, _ = aggregate_class_features(ids, feats, counts, num_classes=4, mode="uniform")
    np.testing.assert_allclose(uni[1], [2.0, 4.0])


def test_prototypes_identical_inputs_and_invariances():
    v = np.array([[0.3, -1.2, 2.0]])
    ids, got, _ = aggregate_class_features([np.array([1])] * 3, [v] * 3, [np.array([n]) for n in (1, 7, 9)], 3)
    np.testing.assert_allclose(got, v, rtol=1e-6)
    rng = np.random.default_rng(0)
    feats = [rng.normal(size=(2, 4)) for _ in range(3)]
    ids = [np.array([0, 1])] * 3
    counts = [np.array([2, 3]), np.array([5, 1]), np.array([4, 4])]
    a = aggregate_class_features(ids, feats, counts, 2)[1]
    b = aggregate_class_features(ids[::-1], feats[::-1], counts[::-1], 2)[1]
    c = aggregate_class_features(ids, feats, [7 * c for c in counts], 2)[1]
    np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(a, c, rtol=1e-6)


def test_fedavg_strategy_takes_the_sample_weighted_mean_of_the_replies_shared_tensors():
    """FedAvg's round: the global model becomes the replies' models weighted by each client's training samples, for
    every tensor the strategy shares; the schema asks for exactly those tensors; its reference norm is the global
    model's."""
    import dataclasses

    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.supercore.task_identity import TaskIdentity

    from fedcore import wire
    from fedcore.config import Config
    from fedcore.models import model_facts
    from fedstrategies.fedavg import FedAvgStrategy
    from tests.fakes import fake_clients, fake_reply

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # Message() needs them
    clients = {pid: dataclasses.replace(info, num_train=20 + 30 * pid) for pid, info in fake_clients(5).items()}
    facts = model_facts("cnn", (1, 8, 8), 10, 0)
    strategy = FedAvgStrategy(Config.from_run_config({"method": "fedavg", "dataset": "digits"}), clients, facts)
    assert set(strategy.reply_schema(0)[wire.WEIGHTS]) == set(facts.initial_weights)
    from fedstrategies.fedper import FedPerStrategy  # a subclass narrows what is shared, key by key

    fedper = FedPerStrategy(Config.from_run_config({"method": "fedper", "dataset": "digits"}), clients, facts)
    assert set(fedper.global_weights) == {k for k in facts.initial_weights if k.startswith("body.")} != set()
    msgs = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), None))
    replies = [fake_reply(strategy, m, "train", np.random.default_rng(3)) for m in msgs]
    strategy.aggregate_train(1, replies)
    assert not strategy.dropped
    models = {int(r.content[wire.METRICS][wire.PARTITION_ID]): wire.unpack_arrays(r.content[wire.WEIGHTS])
              for r in replies}
    sizes = np.array([clients[pid].num_train for pid in models], np.float64)
    for key, value in strategy.global_weights.items():
        stacked = np.stack([m[key] for m in models.values()])
        if value.dtype.kind == "f":
            expected = np.einsum("i,i...->...", sizes / sizes.sum(), stacked.astype(np.float64))
            np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-7)
        else:
            np.testing.assert_array_equal(value, stacked.max(axis=0))
    norm = np.sqrt(sum(float(np.vdot(v, v)) for v in strategy.global_weights.values() if v.dtype.kind == "f"))
    assert strategy.reference_norm(wire.WEIGHTS) == pytest.approx(norm)
    assert strategy.reference_norm("other") is None
