"""The server device (run-config ``server-device``, fedstrategies/server_device.py): bad input refused at
start, and the server's big products on the session's device (``--device``) equal to a plain-numpy
reference. The column blocks are made small so that every product runs over many blocks (and, on
CUDA, reuses both pinned staging buffers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore.config import Config, ConfigError
from fedstrategies import pairwise, server_device
from runner.launch import main, simulate
from tests.conftest import test_device

ROOT_DIR = Path(__file__).resolve().parents[1]
NO_CUDA = not torch.cuda.is_available()


@pytest.fixture
def on_session_device(monkeypatch):
    """The server device of this test session (``--device``), with small column blocks; the CPU again after."""
    monkeypatch.setattr(pairwise, "BLOCK", 96)
    server_device.select(test_device())
    yield server_device.current()
    server_device.select("cpu")


def _states(rng, n: int, integers: bool) -> list[dict[str, np.ndarray]]:
    """n model states of two float tensors (and a counter); integer-valued floats make every float32
    product exact, so the device's sums must equal numpy's float64 ones to the last bit."""
    def draw(shape):
        x = rng.integers(-8, 9, size=shape) if integers else rng.standard_normal(shape)
        return x.astype(np.float32)

    return [{"w": draw((7, 11)), "b": draw((7,)), "bn.num_batches_tracked": np.array(3, np.int64)} for _ in range(n)]


def _flat(states, keys=("w", "b")) -> np.ndarray:
    return np.stack([np.concatenate([np.asarray(s[k], np.float64).reshape(-1) for k in keys]) for s in states])


@pytest.mark.parametrize("integers", [True, False])
def test_gram_distances_and_mixing_on_the_server_device_equal_numpy(on_session_device, integers):
    rng = np.random.default_rng(0)
    states = _states(rng, 20, integers)  # more than STREAM_ROWS: the matrix-product path
    others = _states(rng, 18, integers)
    x, y = _flat(states), _flat(others)
    ref = x[0]
    tol = dict(rtol=0, atol=0) if integers else dict(rtol=1e-5, atol=1e-4)

    np.testing.assert_allclose(pairwise.gram(states), x @ x.T, **tol)
    np.testing.assert_allclose(pairwise.gram(states, others, minus=states[0]), (x - ref) @ (y - ref).T, **tol)
    d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    np.testing.assert_allclose(pairwise.squared_distances(states), d, **tol)

    weights = rng.random((20, 20))
    weights /= weights.sum(1, keepdims=True)
    if integers:  # weights k/64: float32 products and sums exact as well
        weights = np.round(weights * 64) / 64
    mixed = pairwise.mix(weights, states)
    expect = weights.astype(np.float32).astype(np.float64) @ x
    got = np.stack([np.concatenate([m["w"].reshape(-1), m["b"]]) for m in mixed]).astype(np.float64)
    np.testing.assert_allclose(got, expect, **(tol if integers else dict(rtol=1e-5, atol=1e-5)))
    assert all(m["w"].dtype == np.float32 and m["bn.num_batches_tracked"] == 3 for m in mixed)


def test_auto_is_cuda_where_present_else_the_cpu_and_describe_names_it():
    assert server_device.resolve("auto").type == ("cpu" if NO_CUDA else "cuda")
    assert server_device.resolve("cpu") == torch.device("cpu")
    assert server_device.describe(torch.device("cpu")) == "cpu"
    with pytest.raises(ValueError, match="use auto, cpu, cuda"):
        server_device.resolve("gpu")


@pytest.mark.parametrize("value", ["gpu", "cuda:0", "CUDA", ""])
def test_a_server_device_outside_the_choices_is_a_config_error(value):
    with pytest.raises(ConfigError, match="'server-device' = .* choose one of: auto, cpu, cuda"):
        Config.from_run_config({"server-device": value})
    assert Config.from_run_config({})["server-device"] == "auto"


@pytest.mark.skipif(not NO_CUDA, reason="a machine with CUDA runs server-device='cuda'")
def test_server_device_cuda_without_cuda_stops_a_run_at_start(tmp_path, capsys):
    with pytest.raises(ConfigError, match="'server-device': server-device 'cuda' requested but CUDA is not available"):
        simulate({"server-device": "cuda", "device": "cpu"}, supernodes=2, app_dir=ROOT_DIR,
                 flwr_home=tmp_path / "home")
    assert not (tmp_path / "home").exists()  # nothing was started
    assert main(["--run-config", "server-device='cuda' device='cpu'"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    from tests.conftest import run_inprocess

    with pytest.raises(ConfigError, match="'server-device'"):  # the ServerApp itself, before any client is asked
        run_inprocess(tmp_path, 2, None, **{"server-device": "cuda"})
    assert not (tmp_path / "results").exists()
    assert server_device.current() == torch.device("cpu")


def test_fedsac_mixing_mupfl_gram_and_fedmcsa_attention_on_the_server_device_equal_numpy(on_session_device):
    from scipy.special import softmax

    from fedstrategies.fedmcsa_math import mcsa
    from fedstrategies.fedsac_math import aggregate_by_graph

    rng = np.random.default_rng(1)
    stacked = rng.integers(-8, 9, size=(6, 4, 5)).astype(np.float32)
    graph = rng.integers(0, 9, size=(6, 6)) / 64.0  # float32 products and sums exact: equal to the last bit
    np.testing.assert_array_equal(aggregate_by_graph(graph, stacked),
                                  (graph @ stacked.reshape(6, -1).astype(np.float64)).reshape(6, 4, 5))

    starts = rng.integers(-8, 9, size=(6, 20)).astype(np.float32)  # MuPFL's pre-trained heads: one start per row
    gram = server_device.GramSum(6, capacity=1)  # CUDA: staging buffers grow to the first block
    gram.add(list(stacked.reshape(6, -1)), minus=server_device.tensor(starts))
    delta = stacked.reshape(6, -1).astype(np.float64) - starts
    np.testing.assert_array_equal(gram.result(), delta @ delta.T)

    models = [{"fc.weight": rng.standard_normal((3, 4)).astype(np.float32), "fc.bias": rng.standard_normal(3).astype(
        np.float32)} for _ in range(5)]
    out, matrices = mcsa(models, sigma=5.0)
    x = np.stack([np.concatenate([m["fc.weight"].ravel(), m["fc.bias"]]) for m in models]).astype(np.float64)
    norms = np.sqrt((x * x).sum(1))
    psi = softmax(5.0 * (x @ x.T) / np.outer(norms, norms), axis=1)
    np.testing.assert_allclose(matrices["fc"], psi, rtol=1e-12, atol=1e-15)
    mixed = psi.astype(np.float32).astype(np.float64) @ x.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(np.stack([np.concatenate([m["fc.weight"].ravel(), m["fc.bias"]]) for m in out]), mixed,
                               rtol=1e-5, atol=1e-6)


def test_the_server_time_floor_row_names_its_device_and_the_models_size(on_session_device):
    from benchmarks.server_time import product_floor

    row = product_floor(3, {"server-device": test_device()}, repeats=1)
    assert row["method"] == "matrix-product floor" and row["clients"] == 3 and row["round_s"] > 0
    assert row["d"] > 100_000  # the CNN on 28x28's parameters
    assert row["device"].startswith(test_device()) and (test_device() == "cpu") == (row["device"] == "cpu")


def test_a_run_uses_its_server_device_and_leaves_the_one_before_it(tmp_path):
    """FedAMP's products run on the run's server device; afterwards the process has its device of before
    (here torch's meta device, which no run would pick), so in-process runs do not leak theirs."""
    from tests.conftest import run_inprocess

    server_device.select(torch.device("meta"))
    try:
        summary, _ = run_inprocess(tmp_path, 3, None, method="fedamp", **{"num-server-rounds": 2})
        assert summary["final_round"] == 2 and summary["dropped_replies"] == 0
        assert server_device.current() == torch.device("meta")
    finally:
        server_device.select("cpu")


def test_small_cpu_products_run_on_one_thread_and_large_ones_on_the_processs(on_session_device):
    before = torch.get_num_threads()
    with server_device.threads_for(10.0):
        inside = torch.get_num_threads()
    with server_device.threads_for(server_device.THREADED_FLOPS):
        large = torch.get_num_threads()
    assert torch.get_num_threads() == before == large
    assert inside == (before if on_session_device.type == "cuda" else 1)


def test_a_symmetric_gram_over_many_rows_computes_the_upper_blocks_and_mirrors_them(on_session_device):
    """Above ``SYMMETRIC_ROWS`` rows the Gram sum computes only the blocks on and above the diagonal: every
    entry still equals the float64 Gram matrix (to float32 rounding) and the result is exactly symmetric."""
    n = server_device.SYMMETRIC_ROWS + 37  # chunks of unequal length
    rows = np.random.default_rng(3).standard_normal((n, 64)).astype(np.float32)
    gram = server_device.GramSum(n, capacity=n * 32)
    for start in (0, 32):  # two column blocks, summed
        gram.add(list(rows[:, start:start + 32]))
    got, want = gram.result(), rows.astype(np.float64) @ rows.T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    chunk = -(-n // server_device.SYMMETRIC_CHUNKS)
    off = ~np.kron(np.eye(server_device.SYMMETRIC_CHUNKS, dtype=bool), np.ones((chunk, chunk), bool))[:n, :n]
    np.testing.assert_array_equal(got[off], got.T[off])
