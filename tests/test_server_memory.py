"""Server memory at scale: a method's per-client server state grows with the clients it has aggregated (never
with N^2), and the launcher's memory estimate counts it (runner/memory_budget.py)."""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedcore import wire
from fedcore.config import Config
from runner import memory_budget as mb


def _strategy(method: str, num_clients: int, **run_config):
    """``method``'s strategy for the MLR model on 28x28 inputs, over clients of 40 samples of two classes."""
    from flwr.supercore.task_identity import TaskIdentity

    from fedcore.models import model_facts
    from fedcore.registry import get_method
    from fedstrategies.base import ClientInfo

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # Message() needs them
    cfg = Config.from_run_config({"method": method, "dataset": "mnist5k", "model": "mlr", "fraction-train": 1.0,
                                  **run_config})
    clients = {}
    for pid in range(num_clients):
        counts = np.zeros(10, np.int64)
        counts[[pid % 10, (pid + 1) % 10]] = 20
        clients[pid] = ClientInfo(pid, 7000 + pid, 40, 14, counts, counts // 3)
    return get_method(method).strategy(cfg, clients, model_facts("mlr", (1, 28, 28), 10, 0))


def _train_round(strategy, server_round: int, rng) -> list[int]:
    """One round in which every messaged client replies with weights near the initial ones (and what else its
    schema asks for); returns the partition ids that replied."""
    from fedcore.registry import get_method

    msgs = list(strategy.configure_train(server_round, ArrayRecord(), ConfigRecord(), None))
    replies = []
    for msg in msgs:
        pid = strategy.pid_of[msg.metadata.dst_node_id]
        example_reply = get_method(strategy.cfg["method"]).example_reply  # the declaration's, where it has one
        if example_reply is not None:
            records = example_reply(strategy, pid, "train", rng)
        else:
            records = {name: wire.pack_arrays({k: (strategy.initial_weights[k] + 0.01 * rng.standard_normal(
                strategy.initial_weights[k].shape)).astype(strategy.initial_weights[k].dtype) for k in keys})
                for name, keys in strategy.reply_schema(pid).items()}
        metrics = MetricRecord({wire.PARTITION_ID: pid, wire.NUM_EXAMPLES: 40, wire.TRAIN_LOSS: 1.0})
        replies.append(Message(content=RecordDict({**records, wire.METRICS: metrics}), reply_to=msg))
    strategy.aggregate_train(server_round, replies)
    assert not strategy.dropped, strategy.dropped[:1]
    return sorted(strategy.pid_of[m.metadata.dst_node_id] for m in msgs)


def state_bytes(value) -> int:
    """Bytes of the arrays in a strategy's state (numpy arrays, Flower ArrayRecords, nested containers)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, ArrayRecord):
        return sum(len(a.data) for a in value.values())
    if isinstance(value, dict):
        return sum(state_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(state_bytes(v) for v in value)
    return 0


def _model_bytes(strategy) -> int:
    return sum(v.nbytes for v in strategy.initial_weights.values())


@pytest.mark.parametrize("method", ["fedsac", "pfedgraph"])
def test_fedsac_state_grows_with_the_clients_it_aggregated_not_with_n_squared(method):
    """3,000 clients, 6 of them in a round: the graph keeps 6 rows of 6 weights, not 3,000 x 3,000 (72 MB)."""
    s = _strategy(method, 3000, **{"fraction-train": 0.002})
    rng = np.random.default_rng(0)
    seen = _train_round(s, 1, rng)
    assert len(seen) == 6
    graph = state_bytes(s.graph_rows)
    assert graph == 6 * 6 * (8 + 8)  # a partition id and a weight per entry
    total = state_bytes(s.state_dict()["method"])
    assert total < (len(seen) + 1) * 1.05 * _model_bytes(s) + graph + 10_000
    seen += _train_round(s, 2, rng)
    assert state_bytes(s.graph_rows) <= len(set(seen)) * 12 * 16  # still per aggregated client
    dense = s.graph  # the N x N matrix, built on demand, agrees with the round's block
    block = np.asarray(s.round_matrices["graph"])
    pids = np.asarray(s.round_matrices["pids"])
    np.testing.assert_allclose(dense[np.ix_(pids, pids)], block)


def test_a_fedsac_checkpoint_of_the_dense_graph_loads_as_its_rows():
    s = _strategy("fedsac", 5)
    _train_round(s, 1, np.random.default_rng(1))
    dense = s.graph
    state = s.state_dict()
    state["method"] = {**{k: v for k, v in state["method"].items() if k != "graph_rows"}, "graph": dense}
    fresh = _strategy("fedsac", 5)
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.graph, dense)


@pytest.mark.parametrize("method, run_config", [(m, {}) for m in mb.SERVER_MODELS_PER_CLIENT]
                         + [("fedsac", {"fedsac.regulariser": "authors"})])
def test_the_budgets_models_per_client_are_what_the_strategies_keep(method, run_config):
    s = _strategy(method, 8, **run_config)
    before = state_bytes(s.state_dict()["method"])
    rng = np.random.default_rng(2)
    seen = set()
    for rnd in (1, 2, 3):
        seen.update(_train_round(s, rnd, rng))
    grown = state_bytes(s.state_dict()["method"]) - before
    per_client = grown / len(seen) / _model_bytes(s)
    assert mb.server_models_per_client(s.cfg) == pytest.approx(per_client, rel=0.1)


def test_the_estimate_counts_the_per_client_state_and_refuses_what_would_not_fit():
    fedamp = Config.from_run_config({"method": "fedamp", "dataset": "digits", "model": "mlr"})
    fedavg = Config.from_run_config({"method": "fedavg", "dataset": "digits", "model": "mlr"})
    one = mb.model_bytes_in_child("mlr", (1, 8, 8), 10)  # as the launcher, which has no torch, counts it
    assert one == (64 * 10 + 10) * 4 == mb.model_bytes("mlr", (1, 8, 8), 10)  # the MLR's weights and biases
    assert mb.server_state_bytes(fedamp, 500) == 500 * one
    assert mb.server_state_bytes(fedavg, 500) == 0
    authors = Config.from_run_config({"method": "fedsac", "dataset": "digits", "model": "mlr",
                                      "fedsac.regulariser": "authors"})
    assert mb.server_models_per_client(authors) == 2
    state = 2_000_000_000
    fits = int(mb.estimate_bytes(100, 2) * mb.HEADROOM) + 1
    assert mb.check_fits(100, 2, fits) == mb.estimate_bytes(100, 2)
    with pytest.raises(mb.NotEnoughMemory, match=r"2.00 GB of the method's per-client server state"):
        mb.check_fits(100, 2, fits, state_bytes=state)


def test_the_launchers_check_adds_the_methods_state(monkeypatch):
    monkeypatch.delenv(mb.SKIP_ENV, raising=False)
    fedamp = Config.from_run_config({"method": "fedamp", "dataset": "digits", "model": "mlr"})
    assert mb.check_launch(200, 1, fedamp) - mb.check_launch(200, 1) == mb.server_state_bytes(fedamp, 200) > 0
