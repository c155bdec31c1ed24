"""pFedGraph (Ye et al., ICML 2023), FedSaC's similarity-only ancestor: its graph rule against the authors'
own formulation solved by cvxpy, its messages (no subspace), its defaults and a short federation."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import RecordDict

from tests.fakes import fake_clients
from clients.base import ClientEnv
from clients.pfedgraph import PFedGraphClient
from fedcore import wire
from fedcore.config import Config, ConfigError
from fedcore.methods.fedsac import REGULARISER
from fedcore.methods.pfedgraph import example_reply
from fedcore.models import ModelFacts, seeded_model
from fedcore.registry import get_method
from tests.conftest import test_device
from fedstrategies.base import ClientReply
from fedstrategies.pfedgraph import PFedGraphStrategy

WEIGHTS = {"body.w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "head.b": np.zeros(2, np.float32),
           "body.bn.running_mean": np.zeros(4, np.float32)}


def strategy(n=4, **hp):
    config = {"method": "pfedgraph", "dataset": "digits", "model": "simplecnn", "num-server-rounds": 10,
              **{f"pfedgraph.{k}": v for k, v in hp.items()}}
    return PFedGraphStrategy(Config.from_run_config(config), fake_clients(n, 2),
                             ModelFacts("tiny", (1, 8, 8), 2, 4, dict(WEIGHTS)))


def replies_for(s, rng, pids, sizes):
    out = []
    for pid, n in zip(pids, sizes):
        weights = {k: (v + 0.3 * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in WEIGHTS.items()}
        out.append(ClientReply(pid, s.node_of[pid], n, {}, {wire.WEIGHTS: weights}))
    return out


def authors_graph(replies, alpha, clamp=0.9):
    """The authors' graph inference written out: d_ij = -cos(dw_i, dw_j) over the trained parameters
    (dw = theta - theta(0)), d < -0.9 -> -1, then per row min x^T (alpha I) x + (d_i - 2 alpha p)^T x
    s.t. x >= 0, sum x = 1, solved by cvxpy."""
    import cvxpy as cp

    dw = [np.concatenate([(r.arrays[wire.WEIGHTS][k] - WEIGHTS[k]).ravel() for k in ("body.w", "head.b")])
          for r in replies]
    n = len(replies)
    d = np.array([[-(dw[i] @ dw[j]) / np.linalg.norm(dw[i]) / np.linalg.norm(dw[j]) for j in range(n)]
                  for i in range(n)])
    d[d < -clamp] = -1.0
    sizes = np.array([r.num_examples for r in replies], float)
    p = sizes / sizes.sum()
    rows = []
    for i in range(n):
        x = cp.Variable(n)
        cp.Problem(cp.Minimize(alpha * cp.sum_squares(x) + (d[i] - 2 * alpha * p) @ x), [x >= 0, cp.sum(x) == 1]).solve(
            solver=cp.CLARABEL)
        rows.append(x.value)
    return np.array(rows)


@pytest.mark.parametrize("alpha", [0.8, 0.3, 5.0])
def test_graph_is_the_authors_qp_on_update_cosines(alpha):
    rng = np.random.default_rng(0)
    s = strategy(5, alpha=alpha)
    replies = replies_for(s, rng, range(5), [30, 60, 90, 20, 50])
    replies[3].arrays[wire.WEIGHTS]["body.w"] = (WEIGHTS["body.w"] + 1.02 * (replies[2].arrays[wire.WEIGHTS]["body.w"]
                                                                             - WEIGHTS["body.w"]))
    replies[3].arrays[wire.WEIGHTS]["head.b"] = 1.02 * replies[2].arrays[wire.WEIGHTS]["head.b"]  # cos > 0.9: clamped
    metrics = s.aggregate(1, replies)
    np.testing.assert_allclose(s.graph, authors_graph(replies, alpha), atol=1e-6)
    assert s.round_matrices["similarity"][2, 3] == 1.0
    assert "complementarity" not in s.round_matrices and "alpha" not in metrics
    assert set(metrics) == {"self-weight", "row-entropy", "dist-to-p", "similarity", "similarity-std"}
    assert metrics["self-weight"] == pytest.approx(np.diag(s.graph).mean())
    for i in range(5):  # every tensor mixed by row i of W
        mixed = s.personal_weights(i)
        for key in WEIGHTS:
            manual = sum(s.graph[i, j] * replies[j].arrays[wire.WEIGHTS][key].astype(float) for j in range(5))
            np.testing.assert_allclose(mixed[key], manual, rtol=1e-5, atol=1e-6)


def test_alpha_weighs_data_size_against_similarity():
    """A large alpha gives FedAvg's weights p in every row; a smaller one moves weight to similar clients."""
    rng = np.random.default_rng(1)
    big, small = strategy(4, alpha=1e6), strategy(4, alpha=0.2)
    replies = replies_for(big, rng, range(4), [10, 20, 30, 40])
    big.aggregate(1, replies)
    small.aggregate(1, replies)
    np.testing.assert_allclose(big.graph, np.tile([0.1, 0.2, 0.3, 0.4], (4, 1)), atol=1e-5)
    assert np.abs(small.graph - np.array([0.1, 0.2, 0.3, 0.4])).sum(axis=1).min() > 0.1
    np.testing.assert_allclose(np.diag(small.graph), small.graph.max(axis=1))  # a model is most similar to itself


def test_messages_carry_weights_only_and_the_regulariser_once_aggregated():
    rng = np.random.default_rng(2)
    s = strategy(3)
    assert set(s.reply_schema(0)) == {wire.WEIGHTS}
    assert s.train_config(0, 1) == {REGULARISER: "off"}
    s.aggregate(1, replies_for(s, rng, [0, 1], [5, 5]))
    assert set(s.train_payload(0, 2)) == {wire.WEIGHTS} and s.train_config(0, 2) == {REGULARISER: "paper"}
    assert s.train_config(2, 2) == {REGULARISER: "off"}
    bad = ClientReply(0, s.node_of[0], 0, {}, {wire.WEIGHTS: dict(WEIGHTS)})
    assert "positive" in s.check_reply(bad) and s.check_reply(replies_for(s, rng, [0], [1])[0]) is None
    example = example_reply(s, 0, "train", rng)  # the server benchmark's reply: weights only
    assert set(example) == {wire.WEIGHTS}
    arrays = {wire.WEIGHTS: dict(wire.unpack_arrays(example[wire.WEIGHTS]))}
    assert s.check_reply(ClientReply(0, s.node_of[0], 10, {}, arrays)) is None
    authors = strategy(3, regulariser="authors")
    authors.aggregate(1, replies_for(authors, rng, [0, 1], [5, 5]))
    assert set(authors.train_payload(0, 2)) == {wire.WEIGHTS, "fedsac-reference"}


def test_defaults_are_the_authors_and_every_mode_refuses_unknown_values():
    hp = Config.from_run_config({"method": "pfedgraph", "dataset": "digits"}).hparams()
    assert hp == {"lambda": 0.01, "alpha": 0.8, "sim-vector": "delta_init", "sim-clamp": 0.9, "regulariser": "paper",
                  "solver": "closed_form", "eval-model": "local"}
    for key, valid in (("sim-vector", ("delta_init", "params")), ("regulariser", ("paper", "authors")),
                       ("solver", ("closed_form", "cvxpy")), ("eval-model", ("aggregated", "local"))):
        with pytest.raises(ConfigError) as err:
            Config.from_run_config({"method": "pfedgraph", "dataset": "digits", f"pfedgraph.{key}": "nonsense"})
        assert key in str(err.value) and all(v in str(err.value) for v in valid)
    with pytest.raises(ConfigError, match="alpha"):
        Config.from_run_config({"method": "pfedgraph", "dataset": "digits", "pfedgraph.alpha": 0.0})
    assert get_method("pfedgraph").strategy is PFedGraphStrategy


def test_client_uploads_its_trained_weights_and_no_subspace():
    cfg = Config.from_run_config({"method": "pfedgraph", "dataset": "digits", "model": "simplecnn", "local-steps": 2,
                                  "batch-size": 16, "client-threads": 1, "device": test_device()})
    env = ClientEnv(cfg, 0, 3, RecordDict(), 2, {wire.SERVER_ROUND: 2, wire.PHASE: "train", REGULARISER: "paper"})
    start = seeded_model("simplecnn", env.data.input_shape, env.data.num_classes, 0).to(env.device)
    records, metrics = PFedGraphClient(env).fit(RecordDict({wire.WEIGHTS: wire.pack_arrays(start.state_dict())}))
    assert set(records) == {wire.WEIGHTS}
    uploaded = wire.unpack_arrays(records[wire.WEIGHTS])
    assert set(uploaded) == set(start.state_dict())
    assert any(not np.allclose(uploaded[k], wire.to_host(v)) for k, v in start.state_dict().items())
    assert 0.9 < metrics[wire.METHOD_METRIC_PREFIX + "cos-to-received"] < 1.0


def test_a_short_federation(inprocess):
    summary, _ = inprocess(num_clients=3, method="pfedgraph", model="simplecnn", **{"local-steps": 3,
                           "num-server-rounds": 2, "batch-size": 16, "lr": 0.01})
    assert summary["dropped_replies"] == 0 and summary["rounds"] == 2 and 0 < summary["final_acc"] <= 1


def test_the_cvxpy_solver_option_solves_the_graph_with_cvxpy(monkeypatch):
    """pfedgraph.solver = cvxpy reaches the numerical QP (the reference route) and gives the authors' graph."""
    from fedstrategies import fedsac_math

    calls = []
    real = fedsac_math.solve_graph_cvxpy

    def counted(*args, **kwargs):
        calls.append(len(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(fedsac_math, "solve_graph_cvxpy", counted)
    s = strategy(4, solver="cvxpy")
    replies = replies_for(s, np.random.default_rng(3), range(4), [30, 60, 90, 20])
    s.aggregate(1, replies)
    assert calls == [4]
    np.testing.assert_allclose(s.graph, authors_graph(replies, 0.8), atol=1e-5)
    closed = strategy(4)
    closed.aggregate(1, replies)
    assert calls == [4]  # the default route does not call cvxpy
