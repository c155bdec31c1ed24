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


# ====================================================================== rows stacked by tensor
# FedSaC's and MuPFL's Gram matrices (``row_gram``), FedMCSA's attention Gram (``gram_rows``) and its attention and
# mixing in one upload (``gram_and_mix``), FedSaC's and pFedGraph's mixing W @ Theta (``product``): against numpy in
# float64 on integer-valued rows, whose float32 products are exact, so "equal" means to the last bit.
EXACT = 4097  # 4097^2 = 2^24 + 8193 needs 25 bits: float32 rounds it, float64 does not


@pytest.fixture
def server_on_session_device():
    """The products on the server device of this test session (``--device``); the CPU again after."""
    from fedstrategies import server_device
    from tests.conftest import test_device

    server_device.select(test_device())
    yield server_device.current()
    server_device.select("cpu")


def _column_blocks(rows: np.ndarray, width: int, minus: np.ndarray | None, as_list: bool):
    """(rows, reference) per column block of ``width`` (the last one shorter when the columns are not a multiple
    of it), the rows as a list of flat views (FedSaC) or one 2-D array; the reference a vector shared by every row
    (FedSaC's initial model), one row per row (MuPFL's pre-trained heads) or None."""
    out = []
    for start in range(0, rows.shape[1], width):
        block = rows[:, start:start + width]
        ref = None if minus is None else minus[..., start:start + width]
        out.append(([row for row in block] if as_list else block, ref))
    return out


@pytest.mark.parametrize("as_list", [True, False])
@pytest.mark.parametrize("reference", [None, "shared", "per row"])
def test_row_gram_over_column_blocks_equals_the_dense_gram(server_on_session_device, as_list, reference):
    """G = sum over blocks of (A_b - m_b)(A_b - m_b)^T equals the float64 Gram matrix of the whole rows, with block
    edges inside the rows and a short last block (23 columns in blocks of 5, and of 23 and 30: one block)."""
    rng = np.random.default_rng(20)
    n, d = 6, 23
    rows = rng.integers(-8, 9, size=(n, d)).astype(np.float32)
    minus = {None: None, "shared": rng.integers(-8, 9, size=d).astype(np.float32),
             "per row": rng.integers(-8, 9, size=(n, d)).astype(np.float32)}[reference]
    centred = rows.astype(np.float64) - (0.0 if minus is None else minus)
    for width in (5, 23, 30):
        got = pairwise.row_gram(iter(_column_blocks(rows, width, minus, as_list)), n, capacity=n * min(width, d))
        assert got.dtype == np.float64 and got.shape == (n, n)
        np.testing.assert_array_equal(got, centred @ centred.T)


def test_row_gram_sums_its_blocks_in_float64(server_on_session_device):
    """Two blocks whose products are 2^24 and 1: float64 keeps the sum 2^24 + 1, float32 would round it to 2^24."""
    rows = np.array([[4096.0, 1.0], [0.0, 1.0]], dtype=np.float32)
    got = pairwise.row_gram(iter(_column_blocks(rows, 1, None, True)), 2, capacity=2)
    assert got.tolist() == [[2.0 ** 24 + 1, 1.0], [1.0, 1.0]]


def test_row_gram_over_many_rows_is_exactly_symmetric_off_its_diagonal_blocks(server_on_session_device):
    """From ``SYMMETRIC_ROWS`` rows only the blocks on and above the diagonal are computed and mirrored: the
    result still equals the dense Gram matrix, and the mirrored entries equal their transposes bit for bit."""
    from fedstrategies import server_device

    n = server_device.SYMMETRIC_ROWS + 37
    rows = np.random.default_rng(21).standard_normal((n, 40)).astype(np.float32)
    got = pairwise.row_gram(iter(_column_blocks(rows, 16, None, True)), n, capacity=n * 16)
    want = rows.astype(np.float64) @ rows.T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    chunk = -(-n // server_device.SYMMETRIC_CHUNKS)
    off = ~np.kron(np.eye(server_device.SYMMETRIC_CHUNKS, dtype=bool), np.ones((chunk, chunk), bool))[:n, :n]
    np.testing.assert_array_equal(got[off], got.T[off])


def _traced_peak(call):
    """(call(), the most host memory it held at once beyond what was allocated before it, in bytes)."""
    import tracemalloc

    tracing = tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = call()
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:
            tracemalloc.stop()


GROWING = [100, 200, 7998, 7999, 8000]  # block widths: a buffer grown to each new block holds three of the last ones


def test_row_gram_uploads_into_two_buffers_of_its_capacity_however_the_blocks_grow(server_on_session_device):
    """``capacity`` is the most values a block holds: the rows of every block are stacked into one of two upload
    buffers of that size, allocated once, not grown block by block (each new block costing its page faults).
    Blocks of 100 to 8,000 columns: host memory traced during the call stays at the two buffers. (On CUDA the
    staging buffers are pinned torch memory, which tracemalloc does not see.)"""
    n = 4
    rows = np.random.default_rng(22).integers(-8, 9, size=(n, sum(GROWING))).astype(np.float32)
    edges = np.cumsum([0, *GROWING])
    blocks = [([row[a:b] for row in rows], None) for a, b in zip(edges[:-1], edges[1:])]
    capacity = n * max(GROWING)
    want = rows.astype(np.float64) @ rows.T.astype(np.float64)
    np.testing.assert_array_equal(pairwise.row_gram(iter(blocks), n, capacity=capacity), want)  # warm: imports done
    got, peak = _traced_peak(lambda: pairwise.row_gram(iter(blocks), n, capacity=capacity))
    np.testing.assert_array_equal(got, want)
    buffers = 2 * capacity * np.dtype(np.float32).itemsize
    assert peak < 1.25 * buffers, (peak, buffers)


def test_gram_uploads_into_two_buffers_of_one_column_block(server_on_session_device, monkeypatch):
    """``gram``'s column blocks hold at most BLOCK values over all states: its two upload buffers are allocated at
    that size once, however the tensors' blocks grow (tensors of 100 to 8,000 values, each one block here)."""
    n = 4
    monkeypatch.setattr(pairwise, "BLOCK", n * max(GROWING))
    rng = np.random.default_rng(25)
    states = [{f"t{i}": rng.integers(-8, 9, size=w).astype(np.float32) for i, w in enumerate(GROWING)}
              for _ in range(n)]
    x = np.stack([np.concatenate([np.asarray(s[k], np.float64) for k in s]) for s in states])
    np.testing.assert_array_equal(pairwise.gram(states), x @ x.T)  # warm: imports done
    got, peak = _traced_peak(lambda: pairwise.gram(states))
    np.testing.assert_array_equal(got, x @ x.T)
    buffers = 2 * pairwise.BLOCK * np.dtype(np.float32).itemsize
    assert peak < 1.25 * buffers, (peak, buffers)


def test_gram_rows_is_formed_in_the_dtype_asked_for_and_returned_as_float64(server_on_session_device):
    """float64 keeps 4097^2 + 1 exact where float32 rounds it; None forms it in the rows' own dtype."""
    x32 = np.array([[EXACT, 1.0, 0.0], [1.0, EXACT, 2.0]], dtype=np.float32)
    exact = x32.astype(np.float64) @ x32.astype(np.float64).T
    for x, dtype in ((x32, "float64"), (x32.astype(np.float64), None), (x32.astype(np.float64), "float64")):
        got = pairwise.gram_rows(x, dtype)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, exact)
    for x, dtype in ((x32, None), (x32.astype(np.float64), "float32"), (x32, "float32")):
        got = pairwise.gram_rows(x, dtype)
        assert got.dtype == np.float64
        assert got[0, 0] != exact[0, 0] and got[1, 1] != exact[1, 1]  # float32 lost the last digit
        np.testing.assert_allclose(got, exact, rtol=2 ** -23)
    np.testing.assert_array_equal(pairwise.gram_rows(x32.tolist(), "float64"), exact)  # any array-like


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_product_equals_numpy_in_the_arrays_dtype_and_writes_into_out(server_on_session_device, dtype):
    """left @ right in the arrays' own dtype; with ``out`` the product is written there and ``out`` itself is
    returned (FedSaC's and pFedGraph's mixing reuse one buffer for every column block)."""
    if np.dtype(dtype).kind == "i" and server_on_session_device.type == "cuda":
        pytest.skip("CUDA has no integer matrix product")
    rng = np.random.default_rng(23)
    left, right = (rng.integers(-8, 9, size=shape).astype(dtype) for shape in ((5, 7), (7, 11)))
    want = left.astype(np.int64) @ right.astype(np.int64)
    got = pairwise.product(left, right)
    assert got.dtype == dtype and got.shape == (5, 11)
    np.testing.assert_array_equal(got, want)
    out = np.full((5, 11), 99, dtype=dtype)
    assert pairwise.product(left, right, out) is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(pairwise.product(left, right.T.copy().T), want)  # a non-contiguous operand


def _row_softmax(g: np.ndarray) -> np.ndarray:
    e = np.exp(g - g.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gram_and_mix_gives_the_weights_of_the_gram_and_their_mixing(server_on_session_device, dtype):
    """FedMCSA's route: ``weights_of`` receives X X^T formed in float64 by default (exact where float32 would round
    4097^2 + 1), the weights come back as it returned them and the mixing W @ X is in x's dtype."""
    x = np.array([[EXACT, 1.0, 0.0, 3.0], [1.0, EXACT, 2.0, 0.0], [0.0, 2.0, 1.0, 1.0]], dtype=dtype)
    exact = x.astype(np.float64) @ x.astype(np.float64).T
    seen = []

    def weights_of(g):
        seen.append(g)
        return _row_softmax(g / exact.max())

    w, mixed = pairwise.gram_and_mix(x, weights_of)
    assert len(seen) == 1 and seen[0].dtype == np.float64
    np.testing.assert_array_equal(seen[0], exact)
    np.testing.assert_array_equal(w, _row_softmax(exact / exact.max()))
    assert mixed.dtype == dtype and mixed.shape == x.shape
    want = w.astype(dtype).astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_allclose(mixed, want, rtol={np.float32: 1e-6, np.float64: 1e-14}[dtype])

    seen.clear()
    pairwise.gram_and_mix(x, weights_of, "float32")
    assert seen[0].dtype == np.float64 and seen[0][0, 0] != exact[0, 0]  # formed in float32, rounded
    # a float32 dot product of n non-negative terms is within n * 2^-24 of the exact sum (how the BLAS kernel orders
    # and fuses the products varies by CPU)
    np.testing.assert_allclose(seen[0], exact, rtol=x.shape[1] * 2 ** -24)


def test_gram_and_mix_without_a_gram_matrix_mixes_with_the_weights_given(server_on_session_device):
    """FedMCSA's mean aggregation: ``gram_dtype`` None hands ``weights_of`` None (no Gram matrix formed)."""
    x = np.random.default_rng(24).integers(-8, 9, size=(4, 9)).astype(np.float32)
    mean = np.array([[0.25, 0.25, 0.5, 0.0]] * 4)
    seen = []
    w, mixed = pairwise.gram_and_mix(x, lambda g: seen.append(g) or mean, None)
    assert seen == [None] and w is mean
    np.testing.assert_array_equal(mixed, mean.astype(np.float32).astype(np.float64) @ x.astype(np.float64))
    assert mixed.dtype == np.float32
