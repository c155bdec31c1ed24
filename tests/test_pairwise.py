"""The pairwise maths over model states (``fedstrategies.pairwise``) against a plain second route: float64
loops over pairs on tiny cases. FedAMP's distances and clouds, CFL's cosines and FeSEM's distances to centres
are these functions, so every argument (``others``, ``keys``, ``minus``), repeated state objects, zero
vectors, non-parameter tensors and the dtypes of the models are checked through the public API only."""

from __future__ import annotations

import numpy as np
import pytest

from fedstrategies import pairwise

MANY = 20  # more distinct models than the few centres FeSEM streams against (pairwise.STREAM_ROWS = 16)


def _states(n, rng, scale=1.0, dtype=np.float32):
    """n models with two parameter tensors, a BatchNorm statistic and an integer counter."""
    return [{"w": (scale * rng.standard_normal((2, 3))).astype(dtype), "b": (scale * rng.standard_normal(4)).astype(dtype),
             "bn.running_mean": rng.standard_normal(3).astype(dtype), "bn.num_batches_tracked": np.array(5 + i)}
            for i in range(n)]


def _vec(state, keys=("w", "b")) -> np.ndarray:
    return np.concatenate([np.asarray(state[k], dtype=np.float64).reshape(-1) for k in keys])


def _loop(f, xs, ys, keys=("w", "b")) -> np.ndarray:
    return np.array([[f(_vec(x, keys), _vec(y, keys)) for y in ys] for x in xs])


def _sq(u, v):
    return float(np.sum((u - v) ** 2))


# ====================================================================== gram
@pytest.mark.parametrize("n_states,n_others", [(5, 2), (2, 5), (MANY, 3), (3, MANY), (MANY, MANY - 2), (4, 4)])
def test_gram_against_others_with_and_without_a_reference_equals_the_loop(n_states, n_others):
    """Every route (a few centres on either side, or two large sets) gives <x_i - m, y_j - m>; the
    BatchNorm statistic and the counter are not part of the vector."""
    rng = np.random.default_rng(n_states * 100 + n_others)
    xs, ys, m = _states(n_states, rng), _states(n_others, rng), _states(1, rng)[0]
    fm = _vec(m)
    g = pairwise.gram(xs, ys)
    assert g.shape == (n_states, n_others)
    np.testing.assert_allclose(g, _loop(np.dot, xs, ys), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pairwise.gram(xs, ys, minus=m), _loop(lambda u, v: (u - fm) @ (v - fm), xs, ys),
                               rtol=1e-5, atol=1e-5)


def test_gram_of_one_state_and_of_itself():
    rng = np.random.default_rng(1)
    (x,) = _states(1, rng)
    np.testing.assert_allclose(pairwise.gram([x]), [[_vec(x) @ _vec(x)]], rtol=1e-6)
    np.testing.assert_allclose(pairwise.gram([x], [x]), [[_vec(x) @ _vec(x)]], rtol=1e-6)
    assert pairwise.squared_distances([x]).tolist() == [[0.0]]
    np.testing.assert_allclose(pairwise.squared_norms([x]), [_vec(x) @ _vec(x)], rtol=1e-6)


def test_repeated_state_objects_give_the_rows_and_columns_of_their_copies():
    """[a, a] against [b, c]: one distinct row expanded to two (and the other way round)."""
    rng = np.random.default_rng(2)
    a, b, c = _states(3, rng)
    for xs, ys in (([a, a], [b, c]), ([b, c], [a, a]), ([a, b, a], [c, c, b]), ([a, a], [b])):
        expected = _loop(np.dot, xs, ys)
        got = pairwise.gram(xs, ys)
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(pairwise.squared_distances(xs, ys), _loop(_sq, xs, ys), rtol=1e-5, atol=1e-5)
    many = _states(MANY, rng)
    xs = many + many[:3]  # repeated objects on the large side of the streamed route
    np.testing.assert_allclose(pairwise.squared_distances(xs, [b, c, b]), _loop(_sq, xs, [b, c, b]), rtol=1e-5, atol=1e-5)


def test_keys_select_the_tensors_even_a_statistic_and_an_integer_one():
    rng = np.random.default_rng(3)
    xs, ys = _states(4, rng), _states(MANY, rng)
    for keys in (["b"], ["bn.running_mean", "w"], ["bn.num_batches_tracked"]):
        np.testing.assert_allclose(pairwise.gram(xs, keys=keys), _loop(np.dot, xs, xs, keys), rtol=1e-5)
        np.testing.assert_allclose(pairwise.gram(xs, ys, keys=keys), _loop(np.dot, xs, ys, keys), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(pairwise.squared_norms(xs, keys=keys), [_vec(x, keys) @ _vec(x, keys) for x in xs],
                                   rtol=1e-5)
        for a, b in ((xs, None), (xs, ys), (ys, xs), (ys, xs[:2]), (xs, xs[::-1])):
            expected = _loop(_sq, a, a if b is None else b, keys)
            np.testing.assert_allclose(pairwise.squared_distances(a, b, keys=keys), expected, rtol=1e-5, atol=1e-4)


def test_half_precision_models_are_summed_in_float32_at_least():
    """float16 tensors whose products exceed float16's range (65504) still give finite, exact sums."""
    rng = np.random.default_rng(4)
    xs = [{"w": np.full(8, 100.0 + i, dtype=np.float16)} for i in range(MANY)]
    centres = [{"w": np.full(8, -50.0 - i, dtype=np.float16)} for i in range(2)]
    for a, b in ((xs, centres), (centres, xs), (xs[:3], xs[3:7]), (xs, xs[:MANY - 2])):
        np.testing.assert_allclose(pairwise.gram(a, b), _loop(np.dot, a, b, ["w"]), rtol=1e-6)
        np.testing.assert_allclose(pairwise.gram(a, b, minus=centres[0]),
                                   _loop(lambda u, v: (u - _vec(centres[0], ["w"])) @ (v - _vec(centres[0], ["w"])), a, b, ["w"]),
                                   rtol=1e-6)
        np.testing.assert_allclose(pairwise.squared_distances(a, b), _loop(_sq, a, b, ["w"]), rtol=1e-6)
    np.testing.assert_allclose(pairwise.gram(xs), _loop(np.dot, xs, xs, ["w"]), rtol=1e-6)
    np.testing.assert_allclose(pairwise.squared_norms(xs), [_vec(x, ["w"]) @ _vec(x, ["w"]) for x in xs], rtol=1e-6)
    np.testing.assert_allclose(pairwise.squared_norms(xs, minus=centres[1]),
                               [_sq(_vec(x, ["w"]), _vec(centres[1], ["w"])) for x in xs], rtol=1e-6)
    del rng


# ====================================================================== squared distances and norms
def test_squared_distances_to_a_few_centres_equal_the_loop():
    """FeSEM's case: many models against K centres (one pass over the models), every tensor counted."""
    rng = np.random.default_rng(5)
    xs, centres = _states(MANY + 3, rng), _states(3, rng)
    d = pairwise.squared_distances(xs, centres)
    assert d.shape == (MANY + 3, 3) and np.all(d >= 0)
    np.testing.assert_allclose(d, _loop(_sq, xs, centres), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pairwise.squared_distances(centres, xs), _loop(_sq, centres, xs), rtol=1e-5, atol=1e-5)


def test_a_model_equal_to_the_first_one_is_at_distance_exactly_zero():
    rng = np.random.default_rng(6)
    xs = _states(MANY, rng, scale=10.0)
    twins = [{k: v.copy() for k, v in xs[0].items()}, xs[3]]
    for others in (twins, twins * 9):
        d = pairwise.squared_distances(xs, others)
        assert d[0, 0] == 0.0 and np.all(d >= 0)


def test_nearly_equal_models_never_get_a_negative_squared_distance():
    """Rounding in ||x||^2 + ||y||^2 - 2<x, y> can go below 0 between nearly equal models; a distance
    cannot (FedAMP's exp(-d / sigma) would exceed its bound)."""
    rng = np.random.default_rng(7)
    far = rng.standard_normal(4096).astype(np.float32)  # the others are far from the first model, near each other
    xs = [{"w": np.zeros(4096, np.float32)}] + [
        {"w": far + np.float32(1e-4) * rng.standard_normal(4096).astype(np.float32)} for _ in range(11)]
    for b in (None, xs[::-1], xs[:2]):
        d = pairwise.squared_distances(xs, b)
        assert np.all(d >= 0)
    d = pairwise.squared_distances(xs)
    assert np.array_equal(d, d.T) and np.all(np.diag(d) == 0)


def test_squared_norms_with_repeats_and_a_reference():
    rng = np.random.default_rng(8)
    a, b, m = _states(3, rng)
    xs = [a, b, a, a]
    np.testing.assert_allclose(pairwise.squared_norms(xs), [_vec(x) @ _vec(x) for x in xs], rtol=1e-6)
    np.testing.assert_allclose(pairwise.squared_norms(xs, minus=m), [_sq(_vec(x), _vec(m)) for x in xs], rtol=1e-6)
    np.testing.assert_allclose(pairwise.squared_norms(xs, keys=["b"], minus=m),
                               [_sq(_vec(x, ["b"]), _vec(m, ["b"])) for x in xs], rtol=1e-6)
    assert pairwise.squared_norms([a, a], minus=a).tolist() == [0.0, 0.0]


# ====================================================================== cosines
def test_cosine_matrix_equals_the_loop_and_is_float64_whatever_the_gram_dtype():
    rng = np.random.default_rng(9)
    v = rng.standard_normal((5, 7))
    expected = np.array([[a @ b / np.linalg.norm(a) / np.linalg.norm(b) for b in v] for a in v])
    np.testing.assert_allclose(pairwise.cosine_matrix(v @ v.T), expected, rtol=1e-12, atol=1e-15)
    g32 = np.array([[3.0, 1.0], [1.0, 7.0]], dtype=np.float32)  # exact in float32; the cosine is not
    np.testing.assert_allclose(pairwise.cosine_matrix(g32), [[1.0, 1 / np.sqrt(21)], [1 / np.sqrt(21), 1.0]],
                               rtol=1e-13)
    np.testing.assert_allclose(pairwise.cosine_matrix([[3, 1], [1, 7]]), [[1.0, 1 / np.sqrt(21)], [1 / np.sqrt(21), 1.0]],
                               rtol=1e-13)


def test_cosines_of_short_vectors_do_not_depend_on_their_scale():
    v = np.array([[0.03, 0.0], [0.02, 0.05]])
    for scale in (1e-6, 1e-2, 1.0, 1e3):
        w = scale * v
        np.testing.assert_allclose(pairwise.cosine_matrix(w @ w.T), pairwise.cosine_matrix(v @ v.T), rtol=1e-12)
    assert pairwise.cosine_matrix(np.array([[0.25]])).tolist() == [[1.0]]


def test_zero_vectors_have_cosine_zero_and_rounding_stays_in_minus_one_one():
    """A client that did not move (zero row, or a diagonal rounded below 0) has cosine 0 with every
    client; an off-diagonal entry rounded past the norms' product is clipped to +-1."""
    g = np.array([[4.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, -1e-12]])
    cos = pairwise.cosine_matrix(g)
    assert np.all(cos[1] == 0) and np.all(cos[:, 1] == 0) and np.all(cos[3] == 0) and np.all(cos[:, 3] == 0)
    assert cos[0, 2] == 1.0 and cos[0, 0] == 1.0
    over = np.array([[1.0, 1.5, -1.5], [1.5, 1.0, -2.0], [-1.5, -2.0, 1.0]])
    assert pairwise.cosine_matrix(over).tolist() == [[1.0, 1.0, -1.0], [1.0, 1.0, -1.0], [-1.0, -1.0, 1.0]]


# ====================================================================== mix
def _mixed(w, xs, keys=("w", "b")):
    return [{k: sum(float(w[i, j]) * np.asarray(xs[j][k], dtype=np.float64) for j in range(len(xs))) for k in keys}
            for i in range(len(w))]


@pytest.mark.parametrize("kind", ["dense", "one-hot", "sparse"])
def test_mix_equals_the_weighted_sum_and_keeps_dtypes_and_shapes(kind):
    rng = np.random.default_rng({"dense": 10, "one-hot": 11, "sparse": 12}[kind])
    base = _states(5, rng)
    xs = [base[0], base[1], base[0], base[2], base[3], base[4]]
    if kind == "dense":
        w = rng.standard_normal((4, 6))
    elif kind == "one-hot":
        w = np.eye(6)[[3, 0, 5, 1]]
    else:
        w = np.zeros((3, 6))
        w[0, 2], w[1, 4], w[2, 0], w[2, 2] = 0.5, -1.0, 0.25, 0.75
    out = pairwise.mix(w, xs)
    assert len(out) == len(w)
    for got, expected in zip(out, _mixed(w, xs)):
        assert set(got) == set(xs[0])
        for k in ("w", "b"):
            assert got[k].dtype == np.float32 and got[k].shape == xs[0][k].shape
            np.testing.assert_allclose(got[k], expected[k], rtol=1e-5, atol=1e-6)
        assert got["bn.running_mean"].dtype == np.float32  # a float statistic is mixed like a parameter
        assert got["bn.num_batches_tracked"].dtype == xs[0]["bn.num_batches_tracked"].dtype


def test_mix_in_float64_and_float16_models_keeps_their_dtype():
    rng = np.random.default_rng(13)
    for dtype in (np.float64, np.float16):
        xs = _states(3, rng, dtype=dtype)
        for w in (np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]), np.full((3, 3), 1 / 3), np.eye(3)):
            out = pairwise.mix(w, xs)
            for got, expected in zip(out, _mixed(w, xs)):
                assert got["w"].dtype == dtype and got["b"].dtype == dtype
                np.testing.assert_allclose(got["w"], expected["w"], rtol=2e-3, atol=2e-3)


def test_mix_counters_take_the_max_over_the_states_used_by_the_row():
    """The counter is not mixed: a row takes the largest one among the states it gives a weight to (an
    object repeated with weights that cancel is still used); an all-zero row takes the largest of all."""
    rng = np.random.default_rng(14)
    a, b, c = _states(3, rng)
    a["bn.num_batches_tracked"], b["bn.num_batches_tracked"], c["bn.num_batches_tracked"] = (
        np.array(7), np.array(3), np.array(5))
    w = np.array([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.5, 0.0, 0.5]])
    out = pairwise.mix(w, [a, b, a, c])
    assert [int(o["bn.num_batches_tracked"]) for o in out] == [3, 7, 7, 5]
    np.testing.assert_allclose(out[1]["w"], np.zeros((2, 3)), atol=1e-7)  # a - a
    np.testing.assert_allclose(out[2]["b"], np.zeros(4))


def test_mix_rows_equal_in_float32_are_one_output_and_other_rows_are_not():
    rng = np.random.default_rng(15)
    xs = _states(3, rng)
    w = np.array([[0.1, 0.9, 0.0], [0.1 + 1e-12, 0.9 - 1e-12, 0.0], [0.9, 0.1, 0.0], [0.1, 0.9, 0.0]])
    out = pairwise.mix(w, xs)
    assert out[0] is out[1] and out[0] is out[3] and out[2] is not out[0]
    np.testing.assert_allclose(out[2]["w"], 0.9 * xs[0]["w"] + 0.1 * xs[1]["w"], rtol=1e-5)
    # the same weights but a different set of used states (a zero weight on the counter's owner) differ
    xs[2]["bn.num_batches_tracked"] = np.array(99)
    w2 = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]])
    assert len({id(o) for o in pairwise.mix(w2, xs)}) == 1


def test_mix_of_many_models_with_a_few_non_zero_weights():
    """FeSEM's M-step at a large K: few non-zero weights, repeated objects summed into one column."""
    rng = np.random.default_rng(16)
    base = _states(MANY, rng)
    xs = base + base[:4]
    w = np.zeros((3, len(xs)))
    w[0, [0, MANY]] = 0.5  # the same object twice: weight 1 on it
    w[1, 5] = 1.0
    w[2, [1, 2, MANY + 1]] = [0.2, 0.3, 0.5]
    out = pairwise.mix(w, xs)
    for got, expected in zip(out, _mixed(w, xs)):
        np.testing.assert_allclose(got["w"], expected["w"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["b"], expected["b"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[0]["w"], base[0]["w"], rtol=1e-6)


def test_pairwise_alone_forms_the_servers_products_on_the_server_device():
    """One path for Gram matrices, distances and mixing: no strategy module reaches the server device's products
    (``GramSum``, ``matmul``, ``gram``, ``product``, ``put``, ``tensor``, ``Uploader``) but through this module.
    Placing a method's own training on the device (MuPFL's feature matching: ``current``, ``to_host``) is no
    pairwise product."""
    import ast
    from pathlib import Path

    placement = {"current", "to_host"}
    package = Path(pairwise.__file__).parent
    found = []
    for path in sorted(package.glob("*.py")):
        if path.name in ("pairwise.py", "server_device.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "fedstrategies.server_device":
                found.append(f"{path.name}: from fedstrategies.server_device import ...")
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "server_device" and node.attr not in placement):
                found.append(f"{path.name}:{node.lineno}: server_device.{node.attr}")
    assert not found, found
