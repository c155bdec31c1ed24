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


def test_weighted_average_is_order_and_scale_invariant():
    rng = np.random.default_rng(1)
    states = [{"w": rng.normal(size=5)} for _ in range(3)]
    a = weighted_average(states, [1, 2, 3])["w"]
    b = weighted_average(states[::-1], [3, 2, 1])["w"]
    c = weighted_average(states, [10, 20, 30])["w"]
    np.testing.assert_allclose(a, b)
    np.testing.assert_allclose(a, c)


@pytest.mark.parametrize("weights", [[0, 0], [-1, 2], [1]])
def test_weighted_average_rejects_bad_weights(weights):
    with pytest.raises(ValueError):
        weighted_average([{"w": np.zeros(2)}, {"w": np.ones(2)}], weights)


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
