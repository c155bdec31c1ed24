"""FedAMP / HeurFedAMP, CFL and FeSEM: their defining rules on small cases computed by hand or by a
second route, what each message carries, which model is evaluated, and the state kept across rounds."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedcore import wire
from fedcore.config import Config, ConfigError
from fedcore.methods.fedamp import CLOUD, DIST_TO_CLOUD
from fedcore.models import model_facts
from fedstrategies import cfl_math, fesem_math, pairwise
from fedstrategies.base import ClientReply
from fedstrategies.fedamp_math import attention_spread, fedamp_weights, heurfedamp_weights, median_scale
from tests.conftest import test_device

RNG = np.random.default_rng(0)


def _flat(state, keys=None) -> np.ndarray:
    keys = keys or [k for k, v in state.items() if np.asarray(v).dtype.kind == "f"]
    return np.concatenate([np.asarray(state[k], dtype=np.float64).reshape(-1) for k in keys])


def _states(n, shapes=(("a", (3, 4)), ("b", (5,))), scale=1.0, rng=RNG):
    return [{k: (scale * rng.standard_normal(s)).astype(np.float32) for k, s in shapes} for _ in range(n)]


# ====================================================================== pairwise
@pytest.mark.parametrize("block", [1 << 22, 3])  # one block per tensor, or many narrow ones
def test_gram_distances_cosines_and_norms_equal_explicit_loops(monkeypatch, block):
    monkeypatch.setattr(pairwise, "BLOCK", block)
    xs, ys, m = _states(4), _states(3), _states(1)[0]
    fx, fy, fm = [_flat(s) for s in xs], [_flat(s) for s in ys], _flat(m)
    g = pairwise.gram(xs, ys, minus=m)
    assert g.shape == (4, 3)
    for i, j in itertools.product(range(4), range(3)):
        assert g[i, j] == pytest.approx(float((fx[i] - fm) @ (fy[j] - fm)), rel=1e-5, abs=1e-5)
    gs = pairwise.gram(xs)
    assert np.allclose(gs, np.array([[a @ b for b in fx] for a in fx]), rtol=1e-5)
    d = pairwise.squared_distances(xs)
    assert np.allclose(d, [[np.sum((a - b) ** 2) for b in fx] for a in fx], rtol=1e-5, atol=1e-5)
    assert np.all(np.diag(d) == 0)
    d2 = pairwise.squared_distances(xs, ys)
    assert np.allclose(d2, [[np.sum((a - b) ** 2) for b in fy] for a in fx], rtol=1e-5, atol=1e-5)
    cos = pairwise.cosine_matrix(gs)
    assert np.allclose(cos, [[a @ b / np.linalg.norm(a) / np.linalg.norm(b) for b in fx] for a in fx], atol=1e-6)
    assert np.allclose(pairwise.squared_norms(xs, minus=m), [np.sum((a - fm) ** 2) for a in fx], rtol=1e-5)
    assert np.allclose(pairwise.squared_norms(xs), [a @ a for a in fx], rtol=1e-5)
    assert np.allclose(pairwise.squared_norms(xs, keys=["b"]), [np.sum(s["b"].astype(float) ** 2) for s in xs], rtol=1e-5)
    assert np.allclose(pairwise.gram(xs, keys=["b"]), [[a["b"] @ b["b"] for b in xs] for a in xs], rtol=1e-5)


@pytest.mark.parametrize("stream_rows", [0, 16])  # matrix products only, or streaming against a few vectors
def test_vectorised_pairwise_maths_equals_a_plain_loop_over_pairs_with_repeated_states(monkeypatch, stream_rows):
    """7 clients, two of them passed as the same object as another (FedAMP's clients still at the initial
    model), against 3 centres: every function equals its per-pair definition in float64."""
    monkeypatch.setattr(pairwise, "STREAM_ROWS", stream_rows)
    monkeypatch.setattr(pairwise, "STREAM_BLOCK", 5)  # several partial products per tensor
    monkeypatch.setattr(pairwise, "BLOCK", 20)
    rng = np.random.default_rng(7)
    base = _states(5, rng=rng)
    xs = [base[0], base[1], base[0], base[2], base[3], base[1], base[4]]
    ys, m = _states(3, rng=rng), _states(1, rng=rng)[0]
    fx, fy, fm = [_flat(s) for s in xs], [_flat(s) for s in ys], _flat(m)
    loop = lambda f, a, b: np.array([[f(u, v) for v in b] for u in a])  # noqa: E731
    assert np.allclose(pairwise.gram(xs), loop(np.dot, fx, fx), rtol=1e-5)
    assert np.allclose(pairwise.gram(xs, ys, minus=m), loop(lambda u, v: (u - fm) @ (v - fm), fx, fy), rtol=1e-5, atol=1e-5)
    assert np.allclose(pairwise.gram(ys, xs, minus=m), loop(lambda u, v: (u - fm) @ (v - fm), fy, fx), rtol=1e-5, atol=1e-5)
    sq = lambda u, v: np.sum((u - v) ** 2)  # noqa: E731
    d = pairwise.squared_distances(xs)
    assert np.allclose(d, loop(sq, fx, fx), rtol=1e-5, atol=1e-5) and d[0, 2] == 0 and d[1, 5] == 0
    assert np.allclose(pairwise.squared_distances(xs, ys), loop(sq, fx, fy), rtol=1e-5, atol=1e-5)
    assert np.allclose(pairwise.squared_distances(ys, xs), loop(sq, fy, fx), rtol=1e-5, atol=1e-5)
    assert np.allclose(pairwise.squared_norms(xs, minus=m), [sq(u, fm) for u in fx], rtol=1e-5)
    dense = rng.random((7, 7))
    one_hot = fesem_math.centre_weights(np.array([0, 2, 0, 1, 2, 2, 0]), 4)  # streamed; centre 3 has no member
    for w in (dense, one_hot, fedamp_weights(d, 1.0, 100.0)):
        out = pairwise.mix(w, xs)
        assert len(out) == len(w)
        for i, row in enumerate(w):
            expected = sum(row[j] * fx[j] for j in range(7))
            assert np.allclose(_flat(out[i]), expected, rtol=1e-5, atol=1e-6)
            assert all(out[i][k].dtype == np.float32 and out[i][k].shape == xs[0][k].shape for k in xs[0])


def test_mix_of_one_repeated_state_is_one_cloud_and_counters_follow_the_original_weights():
    """FedAMP's round 1: every client at the same initial model; the rows sum to 1, so every cloud is that
    model, computed and returned once. The counter's maximum is over the objects with a non-zero weight."""
    init = _states(1)[0]
    init["n"] = np.array(3, dtype=np.int64)
    other = {**_states(1)[0], "n": np.array(9, dtype=np.int64)}
    xs = [init] * 6
    xi = fedamp_weights(pairwise.squared_distances(xs), 1.0, 100.0)
    assert np.array_equal(pairwise.squared_distances(xs), np.zeros((6, 6)))
    clouds = pairwise.mix(xi, xs)
    assert all(c is clouds[0] for c in clouds)
    assert all(np.allclose(clouds[0][k], init[k], rtol=1e-6) for k in ("a", "b")) and int(clouds[0]["n"]) == 3
    out = pairwise.mix(np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [0.25, 0.25, 0.5]]), [init, init, other])
    assert int(out[0]["n"]) == 3 and int(out[1]["n"]) == 9 and int(out[2]["n"]) == 9
    assert np.allclose(out[2]["a"], 0.5 * init["a"] + 0.5 * other["a"], atol=1e-6)


def test_small_distances_between_large_models_survive_cancellation():
    big = _states(1, scale=1e3)[0]
    near = [{k: v + np.float32(1e-2) * (i + 1) for k, v in big.items()} for i in range(3)]
    d = pairwise.squared_distances(near)
    size = sum(v.size for v in big.values())
    assert d[0, 2] == pytest.approx(size * 0.02 ** 2, rel=1e-2)


def test_a_zero_vector_has_cosine_zero_with_everything():
    g = np.array([[0.0, 0.0], [0.0, 4.0]])
    assert np.array_equal(pairwise.cosine_matrix(g), np.array([[0.0, 0.0], [0.0, 1.0]]))


def test_mix_is_a_matrix_product_per_tensor_and_counters_take_the_max():
    xs = _states(3)
    for i, s in enumerate(xs):
        s["n"] = np.array(i + 1, dtype=np.int64)
    w = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    out = pairwise.mix(w, xs)
    for i in range(2):
        for key in ("a", "b"):
            expected = sum(w[i, j] * xs[j][key].astype(np.float64) for j in range(3))
            assert np.allclose(out[i][key], expected, atol=1e-6) and out[i][key].dtype == np.float32
    assert int(out[0]["n"]) == 2 and int(out[1]["n"]) == 3  # only the states with a weight count


def test_batchnorm_statistics_are_not_parameters():
    assert pairwise.is_parameter("body.0.weight")
    assert not any(pairwise.is_parameter(k) for k in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"))
    state = {"w": np.zeros(2, np.float32), "bn.running_mean": np.zeros(2, np.float32), "c": np.zeros(1, np.int64)}
    assert pairwise.parameter_keys(state) == ["w"]


# ====================================================================== FedAMP's attention
def test_fedamp_cloud_weights_on_three_clients_with_known_distances():
    """w1 = (0, 0), w2 = (1, 0), w3 = (0, 2): squared distances 1, 4 and 5; alpha_k = 0.5, sigma = 1."""
    states = [{"w": np.array(p, dtype=np.float32)} for p in [(0, 0), (1, 0), (0, 2)]]
    d = pairwise.squared_distances(states)
    assert np.allclose(d, [[0, 1, 4], [1, 0, 5], [4, 5, 0]])
    xi = fedamp_weights(d, alpha_k=0.5, sigma=1.0)
    x12, x13, x23 = 0.5 * math.exp(-1), 0.5 * math.exp(-4), 0.5 * math.exp(-5)
    expected = np.array([[1 - x12 - x13, x12, x13], [x12, 1 - x12 - x23, x23], [x13, x23, 1 - x13 - x23]])
    assert np.allclose(xi, expected, rtol=1e-12)
    cloud = pairwise.mix(xi, states)
    assert np.allclose(cloud[0]["w"], [x12 * 1, x13 * 2], atol=1e-7)  # sum_j xi_1j w_j
    # sigma scales both the kernel and A'(x) = exp(-x / sigma) / sigma
    assert fedamp_weights(d, 1.0, 2.0)[0, 1] == pytest.approx(math.exp(-0.5) / 2)


def test_fedamp_self_weight_goes_negative_when_alpha_k_m_over_sigma_exceeds_one():
    xi = fedamp_weights(np.zeros((4, 4)), alpha_k=1.0, sigma=1.0)
    assert np.allclose(np.diag(xi), -2.0) and np.allclose(xi.sum(1), 1.0)


def test_fedamp_fixed_sigma_100_keeps_every_self_weight_non_negative_up_to_101_clients():
    assert np.all(np.diag(fedamp_weights(np.zeros((101, 101)), 1.0, 100.0)) >= -1e-12)
    assert np.any(np.diag(fedamp_weights(np.zeros((102, 102)), 1.0, 100.0)) < 0)


@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e4])
def test_fedamp_median_scale_keeps_self_weights_in_0_1_at_any_distance_scale(scale):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((30, 5)) * scale
    d = ((x[:, None] - x[None]) ** 2).sum(-1)
    sigma, step = median_scale(d, 1.0)
    assert sigma == pytest.approx(np.median(d[~np.eye(30, dtype=bool)]))
    xi = fedamp_weights(d, step, sigma)
    assert np.allclose(xi.sum(1), 1.0) and np.all(np.diag(xi) >= 0) and np.all(np.diag(xi) < 1)
    assert np.allclose(xi[~np.eye(30, dtype=bool)], (np.exp(-d / sigma) / 29)[~np.eye(30, dtype=bool)])
    assert median_scale(np.zeros((4, 4)), 1.0) == (0.0, 1.0)  # one model everywhere
    d2 = np.zeros((4, 4))
    d2[0, 1] = d2[1, 0] = 2.0  # two clients never uploaded (distance 0): the median is over the others
    assert median_scale(d2, 0.5)[0] == 2.0


def test_attention_spread_is_0_for_a_uniform_mix_and_grows_with_the_contrast():
    assert attention_spread(np.full((5, 5), 0.2)) == 0.0
    assert attention_spread(np.eye(2)) == 0.0
    xi = np.array([[0.4, 0.5, 0.1], [0.3, 0.4, 0.3], [0.2, 0.2, 0.6]])
    off = np.array([[0.5, 0.1], [0.3, 0.3], [0.2, 0.2]])
    assert attention_spread(xi) == pytest.approx(np.mean(off.std(1) / off.mean(1)))


def test_attention_spread_and_median_scale_edge_cases():
    # a client that keeps all of its own model has no weight on the others: its row counts 0, not NaN
    xi = np.array([[1.0, 0.0, 0.0], [0.2, 0.4, 0.4], [0.1, 0.3, 0.6]])
    with np.errstate(all="raise"):
        assert attention_spread(xi) == pytest.approx((0.0 + 0.1 / 0.3 + 0.1 / 0.2) / 3)
    assert median_scale(np.zeros((1, 1)), 0.7) == (0.0, 0.7)
    assert median_scale(np.array([[0.0, 3.0], [3.0, 0.0]]), 0.5) == (3.0, 1.5)  # two clients: m - 1 = 1


@pytest.mark.parametrize("sigma", [0.0, 0.5])
def test_fedamp_round_one_and_a_fixed_sigma_below_one(sigma):
    """Round 1 (one model everywhere) at the default sigma sends that model (no 0/0); a fixed sigma, even
    below 1, is used as given."""
    s = _strategy("fedamp", n=3, sigma=sigma)
    for msg in _messages(s, 1).values():
        assert all(np.allclose(v, s.initial_weights[k]) for k, v in _arrays(msg, CLOUD).items())
    size = sum(v.size for v in s.initial_weights.values())
    states = [_shifted(s.initial_weights, 0.1 * RNG.standard_normal(size)) for _ in range(3)]
    s.aggregate(1, [_reply(s, p, states[p]) for p in range(3)])
    d = pairwise.squared_distances(states)
    expected = fedamp_weights(d, *median_scale(d, 1.0)[::-1]) if sigma == 0 else fedamp_weights(d, 1.0, sigma)
    assert np.allclose(s.attention(states), expected)


def _two_clusters(s, per=5, seed=0):
    """2 x ``per`` clients drawn from two clusters at the scale of real runs: each model is the common
    initial one plus a shared drift, its cluster's direction and its own noise (squared distances
    about 0.1 within a cluster and 0.6 across, raw-parameter cosines above 0.9)."""
    rng = np.random.default_rng(seed)
    size = sum(v.size for v in s.initial_weights.values())
    unit = lambda: (v := rng.standard_normal(size)) / np.linalg.norm(v)  # noqa: E731
    drift, centres = 0.5 * unit(), [0.5 * unit(), 0.5 * unit()]
    return [_shifted(s.initial_weights, drift + centres[i // per] + 0.2 * unit()) for i in range(2 * per)]


@pytest.mark.parametrize("method, old", [("fedamp", {"sigma": 100.0}),
                                         ("heurfedamp", {"sigma": 1.0, "self-weight": 0.5, "similarity": "weights"})])
def test_fedamp_attention_at_the_defaults_tells_two_clusters_apart(method, old):
    """The defining feature: at the defaults a client's cloud model leans on its own cluster (weights
    within more than twice those across, spread logged as m_attention-spread); the old defaults (FedAMP's
    sigma = 100, HeurFedAMP's raw-parameter cosines at sigma 1) give a near-uniform mix here."""
    spreads = {}
    for name, hp in (("default", {}), ("old", old)):
        s = _strategy(method, n=10, **hp)
        _messages(s, 1)
        states = _two_clusters(s)
        metrics = s.aggregate(1, [_reply(s, pid, states[pid]) for pid in range(10)])
        assert metrics is not None
        xi = s.attention([s.model_of(pid) for pid in range(10)])
        same = np.equal.outer(np.arange(10) // 5, np.arange(10) // 5) & ~np.eye(10, dtype=bool)
        ratio = xi[same].mean() / xi[~np.equal.outer(np.arange(10) // 5, np.arange(10) // 5)].mean()
        s.begin_round(2, list(range(10)))
        spreads[name] = (ratio, s._metrics["attention-spread"])
        assert np.allclose(xi.sum(1), 1.0) and np.all(np.diag(xi) >= 0)
    assert spreads["default"][0] > 2.0 and spreads["default"][1] > 0.3, spreads
    assert spreads["old"][0] < 1.1 and spreads["old"][1] < 0.05, spreads


def test_heurfedamp_weights_fix_the_self_weight_and_softmax_the_cosines_of_the_others():
    cos = np.array([[1.0, 0.8, 0.2], [0.8, 1.0, -0.5], [0.2, -0.5, 1.0]])
    xi = heurfedamp_weights(cos, sigma=3.0, self_weight=0.4)
    e12, e13 = math.exp(3 * 0.8), math.exp(3 * 0.2)
    assert xi[0, 1] == pytest.approx(0.6 * e12 / (e12 + e13)) and xi[0, 2] == pytest.approx(0.6 * e13 / (e12 + e13))
    assert np.allclose(np.diag(xi), 0.4) and np.allclose(xi.sum(1), 1.0)
    assert xi[1, 0] > xi[1, 2]  # the more similar model gets more weight
    assert np.array_equal(heurfedamp_weights(np.ones((1, 1)), 3.0, 0.4), np.ones((1, 1)))
    assert np.allclose(heurfedamp_weights(cos, 0.0, 0.4)[0, 1:], 0.3)  # sigma 0: the others equally
    assert np.allclose(heurfedamp_weights(np.eye(3, dtype=int), 1.0, 0.4), np.where(np.eye(3), 0.4, 0.3))


def test_heurfedamp_softmax_is_stable_for_a_large_sigma_row_by_row():
    cos = np.array([[1.0, 1.0, 0.9], [1.0, 1.0, -0.9], [-0.9, -0.95, 1.0]])  # row 2's best is far below the others'
    xi = heurfedamp_weights(cos, sigma=1000.0, self_weight=0.2)
    assert np.isfinite(xi).all() and np.allclose(xi.sum(1), 1.0)
    assert xi[0, 1] == pytest.approx(0.8) and xi[2, 0] == pytest.approx(0.8)  # each row's own best takes the rest


# ---------------------------------------------------------------------- strategies on ClientReply objects
def _strategy(method, n=6, rounds=5, **hp):
    from tests.fakes import fake_clients
    from fedcore.registry import get_method

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    cfg = Config.from_run_config({"method": method, "dataset": "synthetic", "model": "mlr", "num-server-rounds": rounds,
                                  "fraction-train": 1.0, **{f"{method}.{k}": v for k, v in hp.items()}})
    return get_method(method).strategy(cfg, fake_clients(n), model_facts("mlr", (60,), 10, 0))


def _reply(strategy, pid, state, n=100):
    arrays = {wire.WEIGHTS: {k: np.asarray(v) for k, v in state.items()}}
    return ClientReply(pid, strategy.node_of[pid], n, {wire.PARTITION_ID: pid, wire.NUM_EXAMPLES: n}, arrays)


def _shifted(base, vec):
    """base + vec laid over the flattened float tensors (a model at a chosen point)."""
    out, at = {}, 0
    for k, v in base.items():
        out[k] = (v + vec[at:at + v.size].reshape(v.shape)).astype(v.dtype)
        at += v.size
    return out


def _messages(strategy, rnd, kind="train"):
    if kind == "train":
        msgs = list(strategy.configure_train(rnd, ArrayRecord(), ConfigRecord(), None))
    else:
        msgs = list(strategy.configure_evaluate(rnd, ArrayRecord(), ConfigRecord(), None))
    return {strategy.pid_of[m.metadata.dst_node_id]: m for m in msgs}


def _arrays(msg, record):
    return wire.unpack_arrays(msg.content.array_records[record])


@pytest.mark.parametrize("method", ["fedamp", "heurfedamp"])
def test_fedamp_sends_each_client_the_mix_of_the_latest_models_by_its_attention_row(method):
    s = _strategy(method, n=4, **({"sigma": 50.0, "alpha-k": 2.0} if method == "fedamp" else {}))
    first = _messages(s, 1)
    for msg in first.values():  # round 1: every model is the initial one, so every cloud model is too
        assert set(msg.content.array_records) == {CLOUD}
        assert all(np.allclose(v, s.initial_weights[k], atol=1e-5) for k, v in _arrays(msg, CLOUD).items())
    size = sum(v.size for v in s.initial_weights.values())
    trained = {pid: _shifted(s.initial_weights, RNG.standard_normal(size) * 0.3) for pid in (0, 1, 2)}
    s.aggregate(1, [_reply(s, pid, trained[pid]) for pid in (0, 1, 2)])  # client 3 never uploads
    msgs = _messages(s, 2)
    states = [trained[0], trained[1], trained[2], s.initial_weights]
    flats = [_flat(st) for st in states]
    d = np.array([[np.sum((a - b) ** 2) for b in flats] for a in flats])
    if method == "fedamp":
        xi = fedamp_weights(d, 2.0, 50.0)
    else:  # cosines of the updates from the initial model (client 3's is 0: cosine 0 with everyone)
        f0 = _flat(s.initial_weights)
        ups = [f - f0 for f in flats]
        cos = np.array([[a @ b / np.linalg.norm(a) / np.linalg.norm(b) if a.any() and b.any() else 0.0 for b in ups]
                        for a in ups])
        xi = heurfedamp_weights(cos, 10.0, 0.3)
    for i in range(4):
        expected = sum(xi[i, j] * flats[j] for j in range(4))
        assert np.allclose(_flat(_arrays(msgs[i], CLOUD)), expected, atol=1e-5)
    assert s.hp["lambda"] == 1.0 and s.reply_schema(0) == {wire.WEIGHTS: s.reply_schema(0)[wire.WEIGHTS]}
    assert all(not m.content.array_records for m in _messages(s, 2, "evaluate").values())  # w_i stays home


def test_fedamp_state_survives_a_checkpoint():
    s = _strategy("fedamp", n=3)
    _messages(s, 1)
    size = sum(v.size for v in s.initial_weights.values())
    s.aggregate(1, [_reply(s, p, _shifted(s.initial_weights, RNG.standard_normal(size))) for p in range(3)])
    fresh = _strategy("fedamp", n=3)
    fresh.load_state_dict(s.state_dict())
    a, b = _messages(s, 2), _messages(fresh, 2)
    assert all(np.array_equal(_flat(_arrays(a[p], CLOUD)), _flat(_arrays(b[p], CLOUD))) for p in range(3))


# ---------------------------------------------------------------------- the FedAMP client
def _env(tmp_path, method, state=None, server_round=1, **run):
    from clients.base import ClientEnv

    cfg = Config.from_run_config({"method": method, "dataset": "digits", "partition": "pathological", "model": "mlr",
                                  "results-dir": str(tmp_path), "momentum": 0.0, "weight-decay": 0.0,
                                  "device": test_device(), **run})
    return ClientEnv(cfg, 0, 3, RecordDict() if state is None else state, server_round,
                     {wire.SERVER_ROUND: server_round, wire.PHASE: "train"})


def _random_model(client, seed):
    model = client.new_model()
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("start", ["own", "cloud"])
def test_fedamp_client_step_is_the_gradient_of_ce_plus_lambda_over_2_alpha_times_the_distance(tmp_path, start):
    """One full-batch SGD step: w' = w - eta (grad CE(w) + (lambda / alpha_k) (w - u_i)), by autograd."""
    from clients.fedamp import MODEL, FedAMPClient, proximal_weight

    lam, alpha, eta = 3.0, 0.5, 0.1
    run = {"local-steps": 1, "batch-size": 100000, "lr": eta, "fedamp.lambda": lam, "fedamp.alpha-k": alpha,
           "fedamp.start": start}
    state = RecordDict()
    client = FedAMPClient(_env(tmp_path, "fedamp", state, **run))
    own, cloud = _random_model(client, 1), _random_model(client, 2)
    client.env.save_module(MODEL, own)
    records, metrics = client.fit(RecordDict({CLOUD: wire.pack_arrays(cloud.state_dict())}))
    assert proximal_weight(lam, alpha) == pytest.approx(3.0)
    w = (own if start == "own" else cloud)
    x, y = client.data.x_train, client.data.y_train
    params = [p.detach().clone().requires_grad_(True) for p in w.parameters()]
    u = [p.detach() for p in cloud.parameters()]
    loss = F.cross_entropy(torch.func.functional_call(w, dict(zip([n for n, _ in w.named_parameters()], params)), x), y)
    loss = loss + lam / (2 * alpha) * sum(((p - c) ** 2).sum() for p, c in zip(params, u))
    grads = torch.autograd.grad(loss, params)
    expected = {n: (p - eta * g).detach() for (n, _), p, g in zip(w.named_parameters(), params, grads)}
    sent = _arrays_of(records[wire.WEIGHTS])
    kept = wire.unpack_arrays(state.array_records[MODEL])
    for name, value in expected.items():
        assert np.allclose(sent[name], wire.to_host(value), atol=1e-6) and np.allclose(kept[name], wire.to_host(value), atol=1e-6)
    dist = sum(float(((wire.to_device(sent[n], c.device) - c) ** 2).sum())
               for (n, _), c in zip(w.named_parameters(), u))
    assert metrics[wire.METHOD_METRIC_PREFIX + DIST_TO_CLOUD] == pytest.approx(dist, rel=1e-5)


def _arrays_of(record):
    return {k: np.array(v) for k, v in wire.unpack_arrays(record).items()}


def test_fedamp_client_evaluates_its_own_model_not_the_cloud(tmp_path):
    from clients.fedamp import MODEL, FedAMPClient
    from clients.training import evaluate_model

    state = RecordDict()
    client = FedAMPClient(_env(tmp_path, "fedamp", state))
    own = _random_model(client, 3)
    client.env.save_module(MODEL, own)
    result = client.evaluate(RecordDict())
    loss, correct, n = evaluate_model(own, client.data.x_test, client.data.y_test)
    assert (result.loss, result.correct, result.num_examples) == pytest.approx((loss, correct, n))


def test_fedamp_lambda_pulls_towards_the_cloud_model(tmp_path):
    from clients.fedamp import FedAMPClient

    dists = []
    for lam in (0.0, 50.0):
        client = FedAMPClient(_env(tmp_path, "fedamp", RecordDict(), **{"local-steps": 20, "lr": 0.01,
                                                                          "fedamp.lambda": lam}))
        cloud = _random_model(client, 4)
        _, metrics = client.fit(RecordDict({CLOUD: wire.pack_arrays(cloud.state_dict())}))
        dists.append(metrics[wire.METHOD_METRIC_PREFIX + DIST_TO_CLOUD])
    assert dists[1] < 0.5 * dists[0]


# ====================================================================== CFL's split rule
def test_cfl_criterion_needs_both_thresholds_and_enough_clients():
    assert cfl_math.should_split(0.1, 2.0, 3, eps1=0.4, eps2=1.6, min_size=3)
    assert not cfl_math.should_split(0.4, 2.0, 3, eps1=0.4, eps2=1.6, min_size=3)  # mean not small enough
    assert not cfl_math.should_split(0.1, 1.6, 3, eps1=0.4, eps2=1.6, min_size=3)  # no update large enough
    assert not cfl_math.should_split(0.1, 2.0, 2, eps1=0.4, eps2=1.6, min_size=3)  # too few clients


def _best_bipartition(sim):
    """The paper's argmin over every bipartition of the largest cross similarity (brute force)."""
    n, best = len(sim), (np.inf, None)
    for mask in range(1, 2 ** (n - 1)):
        labels = np.array([(mask >> i) & 1 for i in range(n)])
        cross = cfl_math.max_cross_similarity(sim, labels)
        best = min(best, (cross, tuple(labels)), key=lambda t: t[0])
    return best


@pytest.mark.parametrize("seed", range(5))
def test_single_linkage_bipartition_is_the_papers_argmin(seed):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((7, 5))
    sim = pairwise.cosine_matrix(v @ v.T)
    labels = cfl_math.bipartition(sim, "single")
    best, _ = _best_bipartition(sim)
    assert labels[0] == 0 and set(labels) == {0, 1}
    assert cfl_math.max_cross_similarity(sim, labels) == pytest.approx(best)


def test_complete_linkage_is_the_authors_variant_and_differs_from_the_argmin_somewhere():
    differs = 0
    for seed in range(40):
        v = np.random.default_rng(seed).standard_normal((7, 5))
        sim = pairwise.cosine_matrix(v @ v.T)
        a, b = cfl_math.bipartition(sim, "single"), cfl_math.bipartition(sim, "complete")
        differs += not np.array_equal(a, b)
        assert cfl_math.max_cross_similarity(sim, b) >= cfl_math.max_cross_similarity(sim, a) - 1e-12
    assert differs > 0
    with pytest.raises(ValueError, match="linkage"):
        cfl_math.bipartition(np.eye(3), "ward")


def test_bipartition_of_clients_without_structure_cuts_off_the_last_one():
    assert cfl_math.bipartition(np.ones((4, 4)), "single").tolist() == [0, 0, 0, 1]
    assert cfl_math.bipartition(np.array([[1.0, -1.0], [-1.0, 1.0]]), "complete").tolist() == [0, 1]


def test_bipartition_defaults_to_the_papers_single_linkage_and_labels_are_integers():
    for seed in range(40):  # a case where the two linkages disagree, so that the default is seen to be single
        v = np.random.default_rng(seed).standard_normal((7, 5))
        sim = pairwise.cosine_matrix(v @ v.T)
        if not np.array_equal(cfl_math.bipartition(sim, "single"), cfl_math.bipartition(sim, "complete")):
            break
    labels = cfl_math.bipartition(sim)
    assert cfl_math.max_cross_similarity(sim, labels) == pytest.approx(_best_bipartition(sim)[0])
    assert labels.dtype.kind == "i" and np.bincount(labels, minlength=2).sum() == 7  # 0/1 labels index parts
    assert cfl_math.bipartition(np.ones((3, 3))).dtype.kind == "i"  # the no-structure cut too


def test_gamma_max_of_a_split():
    assert cfl_math.gamma_max(-1.0) == pytest.approx(1.0) and cfl_math.gamma_max(0.5) == pytest.approx(0.5)
    assert cfl_math.gamma_max(1.0) == 0.0


def _two_group_updates(size, n_a=3, n_b=3, scale=1.0):
    """Updates of two groups pointing in opposite directions plus small noise: the mean is small, each
    update is large."""
    rng = np.random.default_rng(1)
    direction = rng.standard_normal(size)
    direction /= np.linalg.norm(direction)
    ups = [scale * direction + 0.01 * rng.standard_normal(size) for _ in range(n_a)]
    ups += [-scale * direction + 0.01 * rng.standard_normal(size) for _ in range(n_b)]
    return ups


def test_cfl_splits_updates_built_to_form_two_groups_and_each_part_averages_its_own():
    s = _strategy("cfl", n=7, **{"warmup-rounds": 0})
    size = sum(v.size for v in s.initial_weights.values())
    ups = _two_group_updates(size, scale=2.0)
    sizes = [50, 60, 70, 70, 60, 50]  # the two groups weigh the same: their mean update is small
    replies = [_reply(s, pid, _shifted(s.initial_weights, u), n=sizes[pid]) for pid, u in enumerate(ups)]
    metrics = s.aggregate(1, replies)  # client 6 sent nothing this round
    assert metrics["splits"] == 1 and metrics["clusters"] == 2
    assert s.clusters == [[0, 1, 2, 6], [3, 4, 5]]  # the absent member joins the larger part (a tie: part 0)
    assert metrics["max-norm"] == pytest.approx(max(np.linalg.norm(u) for u in ups), rel=1e-4)  # max ||dtheta_i||
    p = np.array(sizes) / sum(sizes)
    assert metrics["mean-norm"] == pytest.approx(np.linalg.norm(sum(w * u for w, u in zip(p, ups))), rel=1e-3)
    base = _flat(s.initial_weights)
    for part, members in zip(s.cluster_models, ([0, 1, 2], [3, 4, 5])):
        n = np.array([sizes[p] for p in members], dtype=float)
        expected = base + sum(w * ups[p] for w, p in zip(n / n.sum(), members))  # theta + sum_i p_i dtheta_i
        assert np.allclose(_flat(part), expected, atol=1e-5)
    assert s.round_matrices["cluster-of"].tolist() == [0, 0, 0, 1, 1, 1, 0]  # saved with the round's results
    split = s.splits[0]
    assert split["parts"] == [[0, 1, 2, 6], [3, 4, 5]]
    assert (split["mean-norm"], split["max-norm"]) == (metrics["mean-norm"], metrics["max-norm"])
    assert split["round"] == 1 and split["alpha-cross"] < -0.9 and split["gamma-max"] > 0.95
    msgs = _messages(s, 2)
    for pid, msg in msgs.items():  # each client trains its own cluster's model
        assert np.allclose(_flat(_arrays(msg, wire.WEIGHTS)), _flat(s.cluster_models[0 if pid in (0, 1, 2, 6) else 1]))
    assert all(np.array_equal(_flat(_arrays(m, wire.WEIGHTS)), _flat(_arrays(msgs[p], wire.WEIGHTS)))
               for p, m in _messages(s, 2, "evaluate").items())  # and evaluates it


@pytest.mark.parametrize("change", [{"eps1": 0.01}, {"eps2": 5.0}, {"warmup-rounds": 1}, {"min-size": 7}])
def test_cfl_does_not_split_when_a_condition_is_not_met(change):
    s = _strategy("cfl", n=6, **{"warmup-rounds": 0, **change})
    size = sum(v.size for v in s.initial_weights.values())
    ups = _two_group_updates(size, scale=2.0)
    metrics = s.aggregate(1, [_reply(s, pid, _shifted(s.initial_weights, u)) for pid, u in enumerate(ups)])
    assert metrics["splits"] == 0 and s.clusters == [list(range(6))] and not s.splits
    assert np.allclose(_flat(s.cluster_models[0]), _flat(s.initial_weights) + np.mean(ups, axis=0), atol=1e-5)


def test_cfl_splits_recursively_and_uniform_weighting_is_the_plain_mean():
    s = _strategy("cfl", n=6, **{"warmup-rounds": 0, "weighting": "uniform", "min-size": 2})
    size = sum(v.size for v in s.initial_weights.values())
    ups = _two_group_updates(size, scale=2.0)
    s.aggregate(1, [_reply(s, pid, _shifted(s.initial_weights, u), n=10 + pid) for pid, u in enumerate(ups)])
    assert s.clusters == [[0, 1, 2], [3, 4, 5]]
    assert np.allclose(_flat(s.cluster_models[1]), _flat(s.initial_weights) + np.mean(ups[3:], axis=0), atol=1e-5)
    theta = s.cluster_models[0]
    sub = _two_group_updates(size, n_a=2, n_b=1, scale=2.0)
    sub[2] = 2 * sub[2]  # one update against two of half its length: the plain mean is ~0
    s.aggregate(2, [_reply(s, pid, _shifted(theta, u)) for pid, u in zip((0, 1, 2), sub)])
    assert s.clusters == [[0, 1], [2], [3, 4, 5]]
    fresh = _strategy("cfl", n=6, **{"warmup-rounds": 0, "weighting": "uniform", "min-size": 2})
    fresh.load_state_dict(s.state_dict())  # a resume goes on with the same clusters and models
    assert fresh.clusters == s.clusters and fresh.cluster_of(2) == 1
    assert all(np.array_equal(_flat(a), _flat(b)) for a, b in zip(fresh.cluster_models, s.cluster_models))
    a, b = _messages(s, 3), _messages(fresh, 3)
    assert all(np.array_equal(_flat(_arrays(a[p], wire.WEIGHTS)), _flat(_arrays(b[p], wire.WEIGHTS))) for p in a)


def _cfl_federation(s, optima, rounds, step=0.3, noise=0.005, seed=0):
    """Clients that each run local gradient descent on 0.5 ||w - c_i||^2 from their cluster's model
    (dtheta_i = step (c_i - theta) + noise), ``rounds`` rounds of ``s``; the rounds' metrics."""
    rng = np.random.default_rng(seed)
    base = _flat(s.initial_weights)
    out = []
    for rnd in range(1, rounds + 1):
        replies = []
        for pid, c in enumerate(optima):
            theta = _flat(s.cluster_models[s.cluster_of(pid)])
            update = step * (c - theta) + noise * rng.standard_normal(len(c))
            replies.append(_reply(s, pid, _shifted(s.initial_weights, theta - base + update)))
        out.append(s.aggregate(rnd, replies))
    return out


@pytest.mark.parametrize("clustered", [True, False])
def test_cfl_defaults_split_two_built_clusters_after_the_warmup_and_leave_one_population_whole(clustered):
    """The defining feature at the default thresholds: 8 clients whose optima form two clusters (a shared
    part of norm 2, +-1 apart along a cluster direction; update norms 0.3-0.7, the scale of real runs)
    are split into exactly those two right after the 20 warm-up rounds; one population (optima 0.1
    apart) is not split. The authors' absolute eps1 = 0.4 / eps2 = 1.6 never split at this scale."""
    rng = np.random.default_rng(5)
    size = sum(v.size for v in _strategy("cfl", n=8).initial_weights.values())
    unit = lambda: (v := rng.standard_normal(size)) / np.linalg.norm(v)  # noqa: E731
    shared, direction = 2.0 * unit(), unit()
    base = _flat(_strategy("cfl", n=8).initial_weights)
    sign = [1, 1, 1, 1, -1, -1, -1, -1] if clustered else [0] * 8
    optima = [base + shared + sign[i] * direction + 0.05 * unit() for i in range(8)]
    s = _strategy("cfl", n=8, rounds=30)
    metrics = _cfl_federation(s, optima, 30)
    scale = s.update_scale["sum"] / s.update_scale["rounds"]
    assert s.update_scale["rounds"] == 20 and metrics[-1]["eps1"] == pytest.approx(0.15 * scale)
    assert metrics[-1]["eps2"] == pytest.approx(0.6 * scale)
    if clustered:
        assert [r["round"] for r in s.splits] == [21] and s.clusters == [[0, 1, 2, 3], [4, 5, 6, 7]]
    else:
        assert not s.splits and s.clusters == [list(range(8))]
    absolute = _strategy("cfl", n=8, rounds=30, thresholds="absolute", eps1=0.4, eps2=1.6)
    _cfl_federation(absolute, optima, 30)
    assert not absolute.splits


def test_cfl_update_scale_is_the_mean_of_the_warmup_rounds_largest_update_norm():
    """R averages round 1..max(1, warm-up)'s largest update norm (round 1 alone without warm-up); relative
    thresholds are eps times R, absolute ones the configured values."""
    s = _strategy("cfl", n=6, **{"warmup-rounds": 0, "eps1": 0.0})
    size = sum(v.size for v in s.initial_weights.values())
    ups = _two_group_updates(size, scale=2.0)
    m1 = s.aggregate(1, [_reply(s, pid, _shifted(s.initial_weights, u)) for pid, u in enumerate(ups)])
    assert s.update_scale == {"sum": pytest.approx(m1["max-norm"]), "rounds": 1}
    theta = s.cluster_models[0]
    s.aggregate(2, [_reply(s, pid, _shifted(theta, 0.5 * u)) for pid, u in enumerate(ups)])
    assert s.update_scale["rounds"] == 1  # after the warm-up R stays
    assert s.thresholds() == (0.0, pytest.approx(0.6 * m1["max-norm"]))
    a = _strategy("cfl", n=6, thresholds="absolute", eps1=0.4, eps2=1.6, **{"warmup-rounds": 2})
    metrics = a.aggregate(1, [_reply(a, pid, _shifted(a.initial_weights, u)) for pid, u in enumerate(ups)])
    assert (metrics["eps1"], metrics["eps2"]) == (0.4, 1.6) and a.update_scale["rounds"] == 1
    a.aggregate(2, [_reply(a, pid, _shifted(a.cluster_models[0], u)) for pid, u in enumerate(ups)])
    assert a.update_scale["rounds"] == 2


def test_cfl_rejects_an_unknown_linkage_in_the_config():
    with pytest.raises(ConfigError, match="cfl.linkage"):
        Config.from_run_config({"method": "cfl", "cfl.linkage": "ward"})


# ====================================================================== FeSEM's stochastic EM
def test_fesem_e_and_m_steps_by_hand():
    d = np.array([[1.0, 4.0], [9.0, 0.5], [2.0, 2.0]])
    labels = fesem_math.assign(d)
    assert labels.tolist() == [0, 1, 0]  # a tie goes to the lower centre
    r = fesem_math.centre_weights(labels, 3, p=np.array([1.0, 2.0, 3.0]))
    assert np.allclose(r, [[0.25, 0, 0.75], [0, 1, 0], [0, 0, 0]])  # centre 2 has no member
    assert np.allclose(fesem_math.centre_weights(labels, 2), [[0.5, 0, 0.5], [0, 1, 0]])
    assert np.allclose(fesem_math.centre_weights(labels, 2, p=np.array([0.1, 0.2, 0.3])), [[0.25, 0, 0.75], [0, 1, 0]])
    picks = fesem_math.initial_centres(10, 4, np.random.default_rng(0))
    assert len(set(picks.tolist())) == 4 and all(0 <= p < 10 for p in picks)
    for seed in range(5):  # K of K models: each one exactly once
        assert fesem_math.initial_centres(5, 5, np.random.default_rng(seed)).tolist() == [0, 1, 2, 3, 4]


def _separable(s, centres, per=3, spread=0.05, seed=2):
    rng = np.random.default_rng(seed)
    size = sum(v.size for v in s.initial_weights.values())
    return [_shifted(s.initial_weights, c + spread * rng.standard_normal(size)) for c in centres for _ in range(per)]


def test_fesem_assigns_separable_models_to_their_nearest_centre_and_centres_become_member_means():
    s = _strategy("fesem", n=6, clusters=2)
    size = sum(v.size for v in s.initial_weights.values())
    a, b = np.full(size, 1.0), np.full(size, -1.0)
    models = _separable(s, [a, b])
    s.centres = [_shifted(s.initial_weights, 0.5 * b), _shifted(s.initial_weights, 0.5 * a)]  # B-ish first
    start = [_flat(c) for c in s.centres]
    metrics = s.aggregate(1, [_reply(s, pid, m) for pid, m in enumerate(models)])
    nearest = [min(np.sum((_flat(m) - c) ** 2) for c in start) for m in models]
    assert metrics["dist-to-centre"] == pytest.approx(np.mean(nearest), rel=1e-4)  # the E-step's distances
    assert s.assignment == {0: 1, 1: 1, 2: 1, 3: 0, 4: 0, 5: 0}
    assert np.allclose(_flat(s.centres[1]), np.mean([_flat(m) for m in models[:3]], axis=0), atol=1e-6)
    assert np.allclose(_flat(s.centres[0]), np.mean([_flat(m) for m in models[3:]], axis=0), atol=1e-6)
    assert metrics["clusters-used"] == 2 and metrics["moved"] == 0
    msgs = _messages(s, 2)
    assert np.array_equal(_flat(_arrays(msgs[0], wire.WEIGHTS)), _flat(s.centres[1]).astype(np.float32))
    assert np.array_equal(_flat(_arrays(msgs[4], wire.WEIGHTS)), _flat(s.centres[0]).astype(np.float32))
    ev = _messages(s, 2, "evaluate")
    assert np.array_equal(_flat(_arrays(ev[4], wire.WEIGHTS)), _flat(s.centres[0]).astype(np.float32))


def test_fesem_size_weighting_and_an_empty_centre_keeps_its_value():
    s = _strategy("fesem", n=3, clusters=2, weighting="size")
    size = sum(v.size for v in s.initial_weights.values())
    far = _shifted(s.initial_weights, np.full(size, 50.0))
    s.centres = [_shifted(s.initial_weights, np.zeros(size)), far]
    models = _separable(s, [np.zeros(size)], per=3)
    s.aggregate(1, [_reply(s, pid, m, n=10 * (pid + 1)) for pid, m in enumerate(models)])
    w = np.array([10.0, 20.0, 30.0]) / 60.0
    assert np.allclose(_flat(s.centres[0]), sum(wi * _flat(m) for wi, m in zip(w, models)), atol=1e-6)
    assert np.array_equal(_flat(s.centres[1]), _flat(far))


@pytest.mark.parametrize("weighting, sizes, weights", [
    ("uniform", (10, 20, 30), (1, 1, 1)),  # the paper's uniform mean ignores the sizes
    ("size", (0, 0, 0), (1, 1, 1)),        # no member counts a sample: the uniform mean, not a frozen centre
    ("size", (1, 0, 0), (1, 0, 0)),        # sizes summing to 1 are still sizes
])
def test_fesem_centre_is_the_members_mean_under_each_weighting_rule(weighting, sizes, weights):
    s = _strategy("fesem", n=3, clusters=2, weighting=weighting)
    size = sum(v.size for v in s.initial_weights.values())
    s.centres = [_shifted(s.initial_weights, np.zeros(size)), _shifted(s.initial_weights, np.full(size, 50.0))]
    models = _separable(s, [np.zeros(size)], per=3)
    s.aggregate(1, [_reply(s, pid, m, n=n) for pid, (m, n) in enumerate(zip(models, sizes))])
    w = np.array(weights, dtype=np.float64) / sum(weights)
    assert np.allclose(_flat(s.centres[0]), sum(wi * _flat(m) for wi, m in zip(w, models)), atol=1e-6)


def test_fesem_first_centres_are_one_em_step_from_k_of_the_round_one_models():
    """Ten models at shifts 0..9 along one direction, K = 3, one EM step: the centres are the means of the cells
    of some three of the models (Forgy start, then nearest-centre cells), checked against all 120 triples."""
    from itertools import combinations

    s = _strategy("fesem", n=10, clusters=3)
    size = sum(v.size for v in s.initial_weights.values())
    s.aggregate(1, [_reply(s, pid, _shifted(s.initial_weights, np.full(size, float(pid)))) for pid in range(10)])
    base = _flat(s.initial_weights)
    got = sorted(float(np.mean(_flat(c) - base)) for c in s.centres)
    shifts = np.arange(10.0)

    def one_step(start):
        cell = np.argmin((shifts[:, None] - shifts[list(start)][None, :]) ** 2, axis=1)
        return sorted(float(shifts[cell == c].mean()) for c in range(3))

    assert any(np.allclose(got, one_step(t), atol=1e-4) for t in combinations(range(10), 3))


def test_fesem_first_centres_are_k_distinct_models_and_unassigned_clients_get_the_nearest_to_the_start():
    s = _strategy("fesem", n=5, clusters=2, **{"em-steps": 3})
    first = _messages(s, 1)
    assert all(np.array_equal(_flat(_arrays(m, wire.WEIGHTS)), _flat(s.initial_weights)) for m in first.values())
    size = sum(v.size for v in s.initial_weights.values())
    models = _separable(s, [np.full(size, 1.0), np.full(size, -0.5)], per=2)
    s.aggregate(1, [_reply(s, pid, m) for pid, m in enumerate(models)])  # client 4 sent nothing
    swapped = [models[i] for i in (2, 3, 0, 1)]  # round 2: the two groups trade places
    assert s.aggregate(2, [_reply(s, pid, m) for pid, m in enumerate(swapped)])["moved"] == 4
    assert s.centres is not None and len(s.centres) == 2 and set(s.assignment) == {0, 1, 2, 3}
    near = int(np.argmin([np.sum((_flat(c) - _flat(s.initial_weights)) ** 2) for c in s.centres]))
    assert np.array_equal(_flat(_arrays(_messages(s, 2)[4], wire.WEIGHTS)), _flat(s.centres[near]).astype(np.float32))
    state = s.state_dict()
    state["method"]["assignment"] = {str(k): v for k, v in state["method"]["assignment"].items()}  # as JSON has it
    fresh = _strategy("fesem", n=5, clusters=2, **{"em-steps": 3})
    fresh.load_state_dict(state)
    assert fresh.assignment == s.assignment
    a, b = _messages(s, 2), _messages(fresh, 2)
    assert all(np.array_equal(_flat(_arrays(a[p], wire.WEIGHTS)), _flat(_arrays(b[p], wire.WEIGHTS))) for p in a)


def test_fesem_waits_for_k_models_before_its_first_centres():
    s = _strategy("fesem", n=4, clusters=3)
    assert s.aggregate(1, [_reply(s, 0, s.initial_weights), _reply(s, 1, s.initial_weights)]) == {"clusters-used": 0}
    assert s.centres is None


def test_fesem_with_fewer_clients_than_clusters_makes_one_centre_per_client():
    """2 clients, K = 3 (a deployment of 2 SuperNodes with the default K): K is capped at the number of
    clients, so the first round's models become the centres instead of the run waiting forever for a
    third model and never training (found by benchmarks.deployed_methods: 9% on digits, clusters-used 0)."""
    s = _strategy("fesem", n=2, clusters=3)
    size = sum(v.size for v in s.initial_weights.values())
    models = [_shifted(s.initial_weights, np.full(size, float(pid + 1))) for pid in range(2)]
    metrics = s.aggregate(1, [_reply(s, pid, m) for pid, m in enumerate(models)])
    assert s.k == 2 and len(s.centres) == 2 and metrics["clusters-used"] == 2
    assert sorted(s.assignment.values()) == [0, 1]
    for pid in range(2):  # each client gets its own model back as its centre
        sent = _flat(_arrays(_messages(s, 2)[pid], wire.WEIGHTS))
        assert np.allclose(sent, _flat(models[pid]))


def test_fesem_client_lambda_adds_the_proximal_pull_to_the_centre(tmp_path):
    from clients.fesem import FeSEMClient

    moved = []
    for lam in (0.0, 100.0):
        client = FeSEMClient(_env(tmp_path, "fesem", RecordDict(), **{"local-steps": 20, "lr": 0.005,
                                                                       "fesem.lambda": lam}))
        centre = _random_model(client, 5)
        records, _ = client.fit(RecordDict({wire.WEIGHTS: wire.pack_arrays(centre.state_dict())}))
        sent = _arrays_of(records[wire.WEIGHTS])
        moved.append(sum(float(((wire.to_device(sent[n], p.device) - p.detach()) ** 2).sum())
                         for n, p in centre.named_parameters()))
    assert moved[1] < 0.5 * moved[0]


@pytest.mark.parametrize("lam", [1.0, 4.0])
def test_fesem_client_two_full_batch_steps_follow_ce_plus_lambda_over_2_times_the_distance_to_the_centre(tmp_path, lam):
    """Two full-batch SGD steps from the centre c (the first has no pull, as w = c):
    w <- w - eta (grad CE(w) + lambda (w - c)), by autograd on the written-out objective."""
    from clients.fesem import FeSEMClient

    eta = 0.1
    client = FeSEMClient(_env(tmp_path, "fesem", RecordDict(), **{"local-steps": 2, "batch-size": 100000, "lr": eta,
                                                                   "fesem.lambda": lam}))
    centre = _random_model(client, 6)
    records, _ = client.fit(RecordDict({wire.WEIGHTS: wire.pack_arrays(centre.state_dict())}))
    names = [n for n, _ in centre.named_parameters()]
    c = [p.detach().clone() for p in centre.parameters()]
    w = [p.clone() for p in c]
    x, y = client.data.x_train, client.data.y_train
    for _ in range(2):
        params = [p.detach().requires_grad_(True) for p in w]
        loss = F.cross_entropy(torch.func.functional_call(centre, dict(zip(names, params)), x), y)
        loss = loss + lam / 2 * sum(((p - a) ** 2).sum() for p, a in zip(params, c))
        w = [(p - eta * g).detach() for p, g in zip(params, torch.autograd.grad(loss, params))]
    sent = _arrays_of(records[wire.WEIGHTS])
    moved = sum(float(((p - a) ** 2).sum()) for p, a in zip(w, c))
    assert moved > 1e-4  # the check below compares a real update
    for name, value in zip(names, w):
        assert np.allclose(sent[name], wire.to_host(value), atol=1e-6)


def test_an_unassigned_client_gets_the_centre_nearest_the_initial_model():
    s = _strategy("fesem", n=3, clusters=3)
    size = sum(v.size for v in s.initial_weights.values())
    s.centres = [_shifted(s.initial_weights, np.full(size, v)) for v in (3.0, -0.5, 1.0)]
    assert s.centre_of(0) == 1
    s.assignment = {0: 2}
    assert s.centre_of(0) == 2 and s.centre_of(1) == 1


@pytest.mark.parametrize("method", ["cfl", "fesem"])
def test_replies_must_carry_the_whole_model_and_the_norm_reference_is_the_largest_server_model(method):
    from fedstrategies.base import weights_schema

    s = _strategy(method, n=3, **({"clusters": 2} if method == "fesem" else {}))
    assert s.reply_schema(1) == {wire.WEIGHTS: weights_schema(s.initial_weights)}
    assert s.reference_norm("other") is None
    assert s.reference_norm(wire.WEIGHTS) == pytest.approx(np.linalg.norm(_flat(s.initial_weights)), rel=1e-6)
    size = sum(v.size for v in s.initial_weights.values())
    models = [_shifted(s.initial_weights, np.full(size, v)) for v in (0.5, -2.0)]
    if method == "cfl":
        s.cluster_models = models
    else:
        s.centres = models
    assert s.reference_norm(wire.WEIGHTS) == pytest.approx(max(np.linalg.norm(_flat(m)) for m in models), rel=1e-6)


def test_cfl_weights_by_size_and_uniform_when_no_reply_counts_a_sample():
    s = _strategy("cfl", n=3)
    rs = [_reply(s, p, s.initial_weights, n=n) for p, n in enumerate((10, 30, 60))]
    assert np.allclose(s.weights_of(rs), [0.1, 0.3, 0.6])
    assert np.allclose(s.weights_of([_reply(s, p, s.initial_weights, n=0) for p in range(3)]), 1 / 3)
    assert np.allclose(_strategy("cfl", n=3, weighting="uniform").weights_of(rs), 1 / 3)


def test_cfl_a_cluster_without_replies_stays_and_the_next_one_still_aggregates():
    s = _strategy("cfl", n=4)
    size = sum(v.size for v in s.initial_weights.values())
    s.clusters = [[0, 1], [2, 3]]
    s.cluster_models = [_shifted(s.initial_weights, np.full(size, 1.0)), s.initial_weights]
    s.load_state_dict(s.state_dict())
    up = RNG.standard_normal(size)
    metrics = s.aggregate(1, [_reply(s, 2, _shifted(s.initial_weights, up))])
    assert s.clusters == [[0, 1], [2, 3]] and metrics["clusters"] == 2
    assert np.allclose(_flat(s.cluster_models[0]), _flat(s.initial_weights) + 1.0, atol=1e-6)
    assert np.allclose(_flat(s.cluster_models[1]), _flat(s.initial_weights) + up, atol=1e-5)
    assert metrics["max-norm"] == pytest.approx(np.linalg.norm(up), rel=1e-4)


def test_fesem_first_centres_come_with_k_replies_and_repeat_for_the_same_seed():
    size = None
    picked = []
    for _ in range(2):
        s = _strategy("fesem", n=10, clusters=3)
        size = size or sum(v.size for v in s.initial_weights.values())
        models = [_shifted(s.initial_weights, np.full(size, float(i))) for i in range(10)]
        s.aggregate(1, [_reply(s, pid, m) for pid, m in enumerate(models)])
        picked.append([_flat(c) for c in s.centres])
    assert all(np.array_equal(a, b) for a, b in zip(*picked))
    s = _strategy("fesem", n=3, clusters=3)
    s.aggregate(1, [_reply(s, pid, _shifted(s.initial_weights, np.full(size, float(pid)))) for pid in range(3)])
    assert s.centres is not None and sorted(s.assignment.values()) == [0, 1, 2]  # K models: one per centre


def test_mix_handles_one_state_a_zero_row_and_keeps_integer_vectors_integer():
    xs = [{"n": np.array([i, 5 - i], dtype=np.int64), "w": np.full(3, float(i), dtype=np.float32)} for i in range(3)]
    out = pairwise.mix(np.array([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), xs)
    assert out[0]["n"].tolist() == [2, 5] and out[0]["n"].dtype == np.int64  # a zero row: the max over all
    assert out[1]["n"].tolist() == [1, 4] and np.allclose(out[1]["w"], 1.0)
    single = pairwise.mix(np.ones((1, 1)), xs[:1])
    assert single[0]["n"].tolist() == [0, 5] and np.array_equal(single[0]["w"], xs[0]["w"])


def test_fedamp_reports_self_weights_and_saves_the_last_rounds_attention():
    s = _strategy("fedamp", n=3, rounds=2, **{"alpha-k": 1.0, "sigma": 10.0})
    size = sum(v.size for v in s.initial_weights.values())
    _messages(s, 1)
    assert s.round_matrices == {}  # only the last round's matrix is kept
    s.aggregate(1, [_reply(s, p, _shifted(s.initial_weights, np.full(size, float(p)))) for p in range(3)])
    _messages(s, 2)
    d = np.array([[size * (i - j) ** 2 for j in range(3)] for i in range(3)], dtype=float)
    xi = fedamp_weights(d, 1.0, 10.0)
    assert np.allclose(s.round_matrices["attention"], xi, atol=1e-6)
    assert s.round_matrices["attention-pids"].tolist() == [0, 1, 2]
    metrics = s.aggregate(2, [_reply(s, 0, s.initial_weights)])
    assert metrics == pytest.approx({"self-weight": np.diag(xi).mean(), "self-weight-min": np.diag(xi).min(),
                                     "attention-spread": attention_spread(xi)}, rel=1e-5)


def test_cfl_uses_the_configured_linkage_and_the_absent_join_the_larger_part_and_clusters_split_together():
    seed = next(sd for sd in range(40) if not np.array_equal(  # a case where the two linkages disagree
        *(cfl_math.bipartition(pairwise.cosine_matrix(v @ v.T), lk) for v in [np.random.default_rng(sd).standard_normal(
            (7, 5))] for lk in ("single", "complete"))))
    v = np.random.default_rng(seed).standard_normal((7, 5))
    force = {"warmup-rounds": 0, "eps1": 1e9, "eps2": 0.0}
    for linkage in ("single", "complete"):
        s = _strategy("cfl", n=8, linkage=linkage, **force)
        size = sum(w.size for w in s.initial_weights.values())
        ups = [np.concatenate([row, np.zeros(size - 5)]) for row in v]
        s.aggregate(1, [_reply(s, pid, _shifted(s.initial_weights, u)) for pid, u in enumerate(ups)])
        labels = cfl_math.bipartition(pairwise.cosine_matrix(v @ v.T), linkage)
        parts = [[p for p in range(7) if labels[p] == k] for k in (0, 1)]
        parts[0 if len(parts[0]) >= len(parts[1]) else 1].append(7)  # client 7 sent nothing
        assert s.clusters == [sorted(parts[0]), sorted(parts[1])]
    s = _strategy("cfl", n=7, **force)  # the first client in the smaller part: the absent one joins the other
    size = sum(w.size for w in s.initial_weights.values())
    ups = _two_group_updates(size, n_a=2, n_b=4)
    s.aggregate(1, [_reply(s, pid, _shifted(s.initial_weights, u)) for pid, u in enumerate(ups)])
    assert s.clusters == [[0, 1], [2, 3, 4, 5, 6]]
    s = _strategy("cfl", n=12, **force)
    s.clusters, s.cluster_models = [list(range(6)), list(range(6, 12))], [s.initial_weights, s.initial_weights]
    s.load_state_dict(s.state_dict())
    ups = _two_group_updates(size) * 2
    metrics = s.aggregate(1, [_reply(s, pid, _shifted(s.initial_weights, u)) for pid, u in enumerate(ups)])
    assert metrics["splits"] == 2 and s.clusters == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert len(s.cluster_models) == 4  # one model per part, in the parts' order
    for c, members in enumerate(s.clusters):
        expected = _flat(s.initial_weights) + np.mean([ups[p] for p in members], axis=0)
        assert np.allclose(_flat(s.cluster_models[c]), expected, atol=1e-5)


def test_server_time_merge_keeps_old_rows_and_names_each_rows_command_and_commit(tmp_path):
    from benchmarks import server_time

    old = {"method": "fedavg", "clients": 10, "sampled": 10, "round_s": 0.1, "round_cpu_s": 0.1, "configure_s": 0.0,
           "aggregate_s": 0.1, "evaluate_s": 0.0, "prepare_s": 0.0, "peak_growth_mb": 1.0}
    with open(tmp_path / "table.csv", "w") as f:  # written before rounds, commands and commits were recorded
        f.write(",".join(old) + "\n" + ",".join(str(v) for v in old.values()) + "\n")
    rows = server_time.read_rows(tmp_path / "table.csv")
    assert rows[0]["round"] == 1 and rows[0]["clients"] == 10 and rows[0]["commit"] == ""
    new = {**old, "method": "fedamp", "round": 2, "command": "python -m benchmarks.server_time --round 2", "commit": "abc"}
    server_time.write(rows + [new], tmp_path)
    text = (tmp_path / "table.md").read_text()
    assert "Rows fedavg: made by `make bench-server` before commands and commits were recorded." in text
    assert "Rows fedamp (round 2): made by `python -m benchmarks.server_time --round 2` at commit `abc`." in text
    assert "| fedamp (round 2) | 0.100 / 0.100 | 1 |" in text
    assert [r["round"] for r in server_time.read_rows(tmp_path / "table.csv")] == [1, 2]


@pytest.mark.parametrize("method", ["fedamp", "heurfedamp"])
def test_server_time_times_fedamps_two_products_on_the_rounds_stacked_models(method):
    """#32: the benchmark's "Gram + mixing products alone" row stacks the model the server holds for each of the
    round's clients (every parameter, float32): its MB are that m x d matrix."""
    from benchmarks import server_time

    strategy = _strategy(method, n=5)
    (part,) = server_time.UNAVOIDABLE[method](strategy, [], 1)
    d = sum(v.size for k, v in strategy.initial_weights.items() if pairwise.is_parameter(k))
    assert part["what"] == "Gram + mixing products"
    assert part["mb"] == pytest.approx(5 * d * 4 / 2**20)
    assert part["s"] > 0 and part["cpu_s"] >= 0


def test_fedamp_maths_is_float64_whatever_the_input_dtype():
    """float32 distances or weights (a model's dtype) do not round FedAMP's weights, sigma or spread to float32."""
    d64 = np.array([[0.0, 1.0, 3.0], [1.0, 0.0, 2.0], [3.0, 2.0, 0.0]]) / 3.0
    d32 = d64.astype(np.float32)
    np.testing.assert_allclose(fedamp_weights(d32, 0.7, 1.3), fedamp_weights(d32.astype(np.float64), 0.7, 1.3),
                               rtol=1e-14)
    b, c = 1.0, 1.0 + 2.0 ** -23  # both exact in float32, their mean is not
    d = np.array([[0.0, 0.0, b], [0.0, 0.0, c], [b, c, 0.0]], dtype=np.float32)
    sigma, alpha = median_scale(d, 0.5)
    assert sigma == (b + c) / 2 and alpha == 0.5 * sigma / 2
    xi64 = np.array([[0.5, 0.1, 0.4], [0.3, 0.3, 0.4], [0.05, 0.15, 0.8]]) / 0.7
    xi32 = xi64.astype(np.float32)
    assert attention_spread(xi32) == pytest.approx(attention_spread(xi32.astype(np.float64)), rel=1e-14)


@pytest.mark.parametrize("method, what", [("cfl", "weighted sum + update norms"), ("fesem", "distances + centre means")])
def test_server_time_times_what_cfls_and_fesems_rules_cannot_avoid_on_the_rounds_stacked_models(method, what):
    """#77: CFL's round against its weighted mean and update norms, FeSEM's against its distances to the K centres and
    the centres' means, on the round's replies stacked (m x d float32); timing them leaves the models the round left."""
    from benchmarks import server_time
    from tests.fakes import after_one_round

    facts = model_facts("cnn", (1, 28, 28), 10, 0)  # the benchmark's model and config
    strategy, replies = after_one_round(method, server_time._config(method, {}), 5, facts)
    models = strategy.cluster_models if method == "cfl" else strategy.centres
    before = [{k: v.copy() for k, v in m.items()} for m in models]
    (part,) = server_time.UNAVOIDABLE[method](strategy, replies, 1, repeats=1)
    d = sum(v.size for k, v in facts.initial_weights.items() if pairwise.is_parameter(k))
    assert part["what"] == what and part["mb"] == pytest.approx(5 * d * 4 / 2**20)
    assert part["s"] > 0 and part["cpu_s"] >= 0
    after = strategy.cluster_models if method == "cfl" else strategy.centres
    assert all(np.array_equal(m[k], b[k]) for m, b in zip(after, before) for k in b)
