"""The base the paper methods build on: per-message config, sampled set, round 0, client state, step
budgets, seeds, model facts, method metrics, byte accounting, config hygiene, docstrings."""

from __future__ import annotations

import csv
import inspect
import json
import logging

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedcore import wire
from fedcore.config import Config, ConfigError
from fedcore.registry import REGISTRY
from runner.inprocess import InProcessGrid, run_inprocess
from tests import toy_method
from tests.conftest import small_config


@pytest.fixture
def toy(monkeypatch):
    """Register the toy method (tests/toy_method.py) for one test."""
    monkeypatch.setitem(REGISTRY, "toy", toy_method.METHOD)
    return "toy"


def _rounds(summary) -> list[dict]:
    with open(f"{summary['results_dir']}/rounds.csv") as f:
        return list(csv.DictReader(f))


def _run(tmp_path, num_clients=3, faults=None, **overrides):
    return run_inprocess(small_config(tmp_path, **overrides), num_clients, faults=faults)


# ------------------------------------------------------------------ 1. config per message
def test_method_config_values_reach_the_client_and_the_base_keys_stay(tmp_path, toy):
    summary, grid = _run(tmp_path, method=toy, **{"num-server-rounds": 2})
    assert summary["dropped_replies"] == 0  # the toy client raises if its config or lr were wrong
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    config = dict(train[-1].content.config_records[wire.CONFIG])
    token = config.pop(wire.RUN_TOKEN)
    assert config == {wire.SERVER_ROUND: 2, wire.PHASE: "train", "mode": "train", "lr": 0.025}
    assert len(token) == 32 and all(m.content.config_records[wire.CONFIG][wire.RUN_TOKEN] == token
                                    for m in grid.sent if m.metadata.message_type != wire.HANDSHAKE)


def test_a_strategy_cannot_replace_the_config_record_or_its_base_keys(tmp_path):
    from fedcore.models import model_facts
    from fedstrategies.fedavg import FedAvgStrategy
    from tests.fakes import fake_clients

    cfg = Config.from_run_config({"method": "fedavg", "dataset": "digits"})
    facts = model_facts("dnn", (64,), 10, 0)

    class Clash(FedAvgStrategy):
        def train_config(self, pid, server_round):
            return {wire.SERVER_ROUND: 0}

    class Shadow(FedAvgStrategy):
        def train_payload(self, pid, server_round):
            return {wire.CONFIG: ConfigRecord({"x": 1})}

    for cls, match in ((Clash, "belong to the base record"), (Shadow, "reserved")):
        with pytest.raises(ValueError, match=match):
            cls(cfg, fake_clients(2), facts).configure_train(1, ArrayRecord(), ConfigRecord(), None)


def test_clients_with_the_same_config_and_payload_share_one_content_and_the_others_get_their_own():
    from flwr.supercore.task_identity import TaskIdentity

    from fedcore.models import model_facts
    from fedstrategies.fedavg import FedAvgStrategy
    from tests.fakes import fake_clients

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # Message() needs them (as the grid's)
    cfg = Config.from_run_config({"method": "fedavg", "dataset": "digits"})
    facts = model_facts("dnn", (64,), 10, 0)
    msgs = list(FedAvgStrategy(cfg, fake_clients(4), facts).configure_train(1, ArrayRecord(), ConfigRecord(), None))
    assert len({m.metadata.dst_node_id for m in msgs}) == 4 and len({id(m.content) for m in msgs}) == 1

    class PerClient(FedAvgStrategy):
        def train_config(self, pid, server_round):
            return {"parity": pid % 2, "list": [1.0, 2.0]}

    msgs = list(PerClient(cfg, fake_clients(4), facts).configure_train(1, ArrayRecord(), ConfigRecord(), None))
    assert len({id(m.content) for m in msgs}) == 2
    node_parity = {m.metadata.dst_node_id: m.content[wire.CONFIG]["parity"] for m in msgs}
    strategy_pids = PerClient(cfg, fake_clients(4), facts)
    assert node_parity == {strategy_pids.node_of[pid]: pid % 2 for pid in strategy_pids.clients}


def test_fedproto_says_explicitly_whether_prototypes_come_with_the_message(tmp_path):
    _, grid = _run(tmp_path, method="fedproto", **{"num-server-rounds": 2})
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    flags = [(m.metadata.group_id, m.content.config_records[wire.CONFIG]["has-global-prototypes"],
              wire.CLASS_FEATURES in m.content) for m in train]
    assert {f for f in flags if f[0] == "1"} == {("1", False, False)}
    assert {f for f in flags if f[0] == "2"} == {("2", True, True)}


# ------------------------------------------------------------------ 2. the round's sampled set
def test_ceil_sampling_is_seeded_and_the_strategy_sees_the_set_before_payloads(tmp_path, toy):
    from fedstrategies.base import ceil_fraction

    assert ceil_fraction(0.1, 30) == 3 and ceil_fraction(0.34, 3) == 2 and ceil_fraction(0.2, 19) == 4
    assert ceil_fraction(1.0, 5) == 5 and ceil_fraction(0.01, 5) == 1
    runs = []
    for name in ("a", "b"):
        summary, grid = _run(tmp_path, 5, method=toy, **{"fraction-train": 0.5, "num-server-rounds": 3,
                                                         "run-name": name})
        train = [m for m in grid.sent if m.metadata.message_type == "train"]
        dests = {r: sorted(grid.contexts[m.metadata.dst_node_id].node_config["partition-id"]
                           for m in train if m.metadata.group_id == str(r)) for r in (1, 2, 3)}
        runs.append(dests)
        assert all(len(p) == 3 for p in dests.values())  # ceil(0.5 * 5)
    assert runs[0] == runs[1] and len({tuple(v) for v in runs[0].values()}) > 1


# ------------------------------------------------------------------ 3. the preparation phase
def test_round_zero_is_counted_in_bytes_and_not_in_rounds(tmp_path, toy):
    summary, grid = _run(tmp_path, method=toy, **{"num-server-rounds": 2})
    rows = _rounds(summary)
    assert [r["round"] for r in rows] == ["0", "1", "2"]
    assert int(rows[0]["bytes_up"]) > 0 and int(rows[0]["bytes_down"]) > 0 and rows[0]["replies"] == "3"
    assert float(rows[0]["m_classes_seen"]) == 6  # 3 clients x 2 classes each
    assert summary["rounds"] == 2 and summary["bytes_prepare"] == int(rows[0]["bytes_up"]) + int(rows[0]["bytes_down"])
    assert summary["bytes_up"] == sum(int(r["bytes_up"]) for r in rows)
    assert summary["bytes_up_per_round"] == sum(int(r["bytes_up"]) for r in rows[1:]) / 2
    prepare = [m for m in grid.sent if m.metadata.message_type == wire.PREPARE]
    assert len(prepare) == 3 and all(m.content.config_records[wire.CONFIG]["mode"] == "init" for m in prepare)


def test_methods_without_preparation_have_no_round_zero(tmp_path):
    summary, grid = _run(tmp_path, method="fedavg")
    assert [r["round"] for r in _rounds(summary)] == ["1", "2"]
    assert not [m for m in grid.sent if m.metadata.message_type == wire.PREPARE]


# ------------------------------------------------------------------ 4. client state
def test_state_helpers_and_per_client_models_survive_serialisation(tmp_path, toy):
    summary, grid = _run(tmp_path, method=toy, momentum=0.9, **{"num-server-rounds": 3})
    rows = _rounds(summary)[1:]
    assert [float(r["m_steps_so_far"]) for r in rows] == [3, 6, 9]  # a counter kept in state
    assert [r["state_round_min"] for r in rows] == ["0", "1", "2"]
    widths = {}
    for node, context in grid.contexts.items():
        state = context.state
        assert "optimizer" in state.array_records and "counter" in state.config_records
        widths[context.node_config["partition-id"]] = wire.unpack_arrays(state.array_records["model"])["body.1.weight"].shape[0]
        assert int(state.config_records["meta"][wire.STATE_ROUND]) == 3
    assert widths == {0: 8, 1: 12, 2: 16}


def test_optimizer_state_round_trips(tmp_path):
    from clients.base import ClientEnv

    cfg = Config.from_run_config(small_config(tmp_path, method="local", momentum=0.9))
    env = ClientEnv(cfg, 0, 3, RecordDict(), 1)
    model = torch.nn.Linear(3, 2)
    opt = env.optimizer(model.parameters())
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    env.save_optimizer("opt", opt)
    fresh = env.optimizer(model.parameters())
    assert env.load_optimizer("opt", fresh)
    for a, b in zip(opt.state.values(), fresh.state.values()):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    assert not env.load_optimizer("other", fresh) and env.load_arrays("nothing") is None


def test_a_client_that_lost_its_state_is_reported(tmp_path, caplog):
    import shutil

    from clients.app import app as client_app
    from server_app.app import run_experiment

    config = small_config(tmp_path, method="local", **{"num-server-rounds": 3})
    grid = InProcessGrid(client_app, 3, config)

    def restart_node_1(msg, reply):  # client 1's SuperNode restarts after round 1, on a machine without its disk
        if msg.metadata.message_type == "evaluate" and msg.metadata.group_id == "1":
            ctx = grid.contexts[msg.metadata.dst_node_id]
            if ctx.node_config["partition-id"] == 1:
                ctx.state = RecordDict()
                token = msg.content.config_records[wire.CONFIG][wire.RUN_TOKEN]
                shutil.rmtree(tmp_path / "results" / "test-run" / "client-state" / token / "1")
        return reply

    grid.faults = restart_node_1
    with caplog.at_level(logging.WARNING):
        summary = run_experiment(grid, Config.from_run_config(config))
    rows = _rounds(summary)
    assert [r["state_lost"] for r in rows] == ["0", "1", "0"]
    assert "client 1 lost its state from round 1" in caplog.text


def test_a_restarted_node_with_its_disk_restores_its_state(tmp_path, caplog):
    from clients.app import app as client_app
    from server_app.app import run_experiment

    config = small_config(tmp_path, method="local", **{"num-server-rounds": 3})
    grid = InProcessGrid(client_app, 3, config)

    def restart_node_1(msg, reply):  # the same, but the node keeps its disk: state comes back from it
        if msg.metadata.message_type == "evaluate" and msg.metadata.group_id == "1":
            ctx = grid.contexts[msg.metadata.dst_node_id]
            if ctx.node_config["partition-id"] == 1:
                ctx.state = RecordDict()
        return reply

    grid.faults = restart_node_1
    with caplog.at_level(logging.WARNING):
        summary = run_experiment(grid, Config.from_run_config(config))
    assert [r["state_lost"] for r in _rounds(summary)] == ["0", "0", "0"]
    assert "restored it from" in caplog.text


# ------------------------------------------------------------------ 5. training budgets
def test_step_budget_reshuffles_across_epochs_and_calls_back_every_step():
    from clients.training import train_loop

    torch.manual_seed(0)
    x, y = torch.randn(25, 4), torch.randint(0, 3, (25,))
    seen, sizes = [], []
    body, head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)
    model = torch.nn.Sequential(body, head)
    opts = [torch.optim.SGD(body.parameters(), lr=0.1), torch.optim.SGD(head.parameters(), lr=0.1)]
    before = [p.clone() for p in model.parameters()]
    train_loop(model, x, y, batch_size=10, optimizer=opts, generator=torch.Generator().manual_seed(1), steps=7,
               after_step=lambda step, loss, idx: (seen.append(step), sizes.append(len(idx))))
    assert seen == list(range(7)) and sizes == [10, 10, 5, 10, 10, 5, 10]
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # both optimisers stepped
    order = []
    train_loop(model, x, y, batch_size=10, optimizer=opts, generator=torch.Generator().manual_seed(1), steps=6,
               after_step=lambda step, loss, idx: order.extend(idx.tolist()))
    assert sorted(order[:25]) == list(range(25)) and sorted(order[25:]) == sorted(order[25:]) and order[:25] != order[25:50]
    with pytest.raises(ValueError, match="exactly one"):
        train_loop(model, x, y, batch_size=10, optimizer=opts, generator=torch.Generator(), steps=1, epochs=1)


def test_epochs_budget_equals_the_old_epoch_loop():
    from clients.training import minibatches, train_loop

    x, y = torch.randn(23, 4), torch.randint(0, 3, (23,))
    got = []
    model = torch.nn.Linear(4, 3)
    train_loop(model, x, y, batch_size=5, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
               generator=torch.Generator().manual_seed(3), epochs=2, after_step=lambda s, l, idx: got.append(idx))
    g = torch.Generator().manual_seed(3)
    expected = [*minibatches(23, 5, g, x.device), *minibatches(23, 5, g, x.device)]
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))


@pytest.mark.parametrize("sgd", [{}, {"weight_decay": 0.01}, {"momentum": 0.9}, {"momentum": 0.5, "weight_decay": 0.001}],
                         ids=["plain", "weight-decay", "momentum", "momentum+weight-decay"])
def test_sgd_fast_path_takes_torch_optims_steps_exactly(sgd):
    """train_loop steps an SGD itself (foreach ops, no torch.optim wrapper): the same parameters and momentum
    buffers, bit for bit, as torch.optim's own step (which any hook brings back), over several epochs and two
    parameter groups with their own learning rates."""
    from clients.training import fast_sgd, train_loop

    def trained(hook: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        head, body = list(model[2].parameters()), list(model[0].parameters())
        opts = [torch.optim.SGD(body, lr=0.05, **sgd), torch.optim.SGD(head, lr=0.2, **sgd)]  # two groups, two lrs
        if hook:  # any hook sends the step back to torch.optim
            for opt in opts:
                opt.register_step_pre_hook(lambda *a: None)
        assert (not fast_sgd(opts[0])) == hook
        x, y = torch.randn(37, 6, generator=torch.Generator().manual_seed(1)), torch.arange(37) % 3
        train_loop(model, x, y, batch_size=5, optimizer=opts, generator=torch.Generator().manual_seed(2), epochs=3)
        assert all(p.grad is None for p in model.parameters()) or hook
        bufs = [opt.state[p].get("momentum_buffer") for opt in opts for p in opt.param_groups[0]["params"]]
        return [p.detach().clone() for p in model.parameters()], bufs

    (fast, fast_bufs), (reference, ref_bufs) = trained(False), trained(True)
    assert all(torch.equal(a, b) for a, b in zip(fast, reference))
    assert [b is None for b in fast_bufs] == [b is None for b in ref_bufs] == [not sgd.get("momentum")] * 4
    assert all(a is None or torch.equal(a, b) for a, b in zip(fast_bufs, ref_bufs))


def test_sgd_fast_path_leaves_other_steps_to_torch_optim():
    """Nesterov, dampening, maximize and every other optimiser keep torch.optim's own step."""
    from clients.training import fast_sgd

    params = list(torch.nn.Linear(2, 2).parameters())
    assert fast_sgd(torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01))
    for other in ({"momentum": 0.9, "nesterov": True}, {"momentum": 0.9, "dampening": 0.1}, {"maximize": True}):
        assert not fast_sgd(torch.optim.SGD(params, lr=0.1, **other)), other
    assert not fast_sgd(torch.optim.Adam(params))


# ------------------------------------------------------------------ 6. seeds and order
def test_message_seeds_differ_by_client_round_and_phase():
    from clients.base import message_seed

    seeds = {message_seed(0, p, r, ph) for p in range(3) for r in range(3) for ph in ("train", "evaluate")}
    assert len(seeds) == 18 and message_seed(0, 1, 2, "train") == message_seed(0, 1, 2, "train")
    assert message_seed(1, 1, 2, "train") != message_seed(0, 1, 2, "train")


def test_global_randomness_repeats_with_the_seed_and_changes_with_another(tmp_path, toy):
    a, _ = _run(tmp_path, method=toy, **{"run-name": "a"})
    b, _ = _run(tmp_path, method=toy, **{"run-name": "b"})
    c, _ = _run(tmp_path, method=toy, **{"run-name": "c", "seed": 1})
    loss = [[r["train_loss"] for r in _rounds(s)[1:]] for s in (a, b, c)]
    assert loss[0] == loss[1] and loss[0] != loss[2]


def test_the_grid_delivers_copies_and_keeps_state_only_as_it_serialises(tmp_path):
    seen = {}

    def client_app(msg, context):
        seen["content"] = msg.content
        context.state["kept"] = ArrayRecord({"x": Array(np.ones(2, np.float32))})
        seen["state"] = context.state
        return Message(RecordDict({wire.METRICS: MetricRecord({"a": 1})}), reply_to=msg)

    grid = InProcessGrid(client_app, 1, {})
    node = grid.get_node_ids()[0]
    sent = Message(RecordDict({"w": ArrayRecord({"x": Array(np.zeros(2, np.float32))})}), dst_node_id=node,
                   message_type="train", group_id="1")
    reply = grid.send_and_receive([sent])[0]
    assert seen["content"] is not sent.content and seen["state"] is not grid.contexts[node].state
    np.testing.assert_array_equal(grid.contexts[node].state.array_records["kept"]["x"].numpy(), [1, 1])
    assert reply.metadata.reply_to_message_id == sent.metadata.message_id


def test_aggregation_ignores_arrival_order(tmp_path):
    from tests.fakes import fake_reply
    from fedcore.models import model_facts
    from fedstrategies.fedavg import FedAvgStrategy
    from tests.fakes import fake_clients

    cfg = Config.from_run_config({"method": "fedavg", "dataset": "digits"})
    results = []
    for order in (1, -1):
        strategy = FedAvgStrategy(cfg, fake_clients(7), model_facts("cnn", (1, 8, 8), 10, 0))
        msgs = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), None))
        rng = np.random.default_rng(0)
        replies = [fake_reply(strategy, m, "train", rng) for m in msgs]
        strategy.aggregate_train(1, replies[::order])
        results.append(strategy.global_weights)
    assert all(np.array_equal(results[0][k], results[1][k]) for k in results[0])


# ------------------------------------------------------------------ 7. model facts
def test_strategies_get_model_facts_instead_of_deriving_them():
    from fedcore.models import model_facts

    facts = model_facts("auto", (1, 28, 28), 10, 0)
    assert (facts.name, facts.feature_dim, facts.num_classes, facts.input_shape) == ("cnn", 128, 10, (1, 28, 28))
    assert facts.num_parameters == 206_922
    assert model_facts("dnn", (60,), 10, 0).feature_dim == 20


# ------------------------------------------------------------------ 8. method metrics and matrices
def test_method_metrics_reach_rounds_csv_and_matrices_their_own_files(tmp_path, toy):
    summary, _ = _run(tmp_path, method=toy, **{"num-server-rounds": 2})
    rows = _rounds(summary)[1:]
    assert [float(r["m_round_sq"]) for r in rows] == [1, 4]
    for r in rows:
        assert float(r["eval_half_acc"]) == pytest.approx(float(r["acc_weighted"]) / 2)
        assert float(r["eval_half_acc_client_mean"]) == pytest.approx(float(r["acc_client_mean"]) / 2)
        assert r["eval_clients"] == "3"
    matrices = json.loads((tmp_path / "results" / "test-run" / "round_matrices" / "0002.json").read_text())
    assert matrices == {"eye": np.eye(3).tolist()}
    assert summary["final_eval_half_acc"] == pytest.approx(summary["final_acc"] / 2)
    for key in ("best_client_acc_mean", "best_client_mean_round", "last10_acc", "last10_client_acc_mean"):
        assert summary[key] is not None, key
    accs = [float(r["acc_weighted"]) for r in rows]
    assert summary["last10_acc"] == pytest.approx(np.mean(accs))


# ------------------------------------------------------------------ 9. bytes
def test_byte_count_from_array_sizes_matches_the_serialised_size():
    from fedcore.models import model_facts

    weights = model_facts("cnn", (1, 28, 28), 10, 0).initial_weights
    big = RecordDict({wire.CONFIG: ConfigRecord({wire.SERVER_ROUND: 3, wire.PHASE: "train", "mode": "x"}),
                      wire.WEIGHTS: wire.pack_arrays(weights)})
    small = RecordDict({wire.METRICS: MetricRecord({wire.PARTITION_ID: 1, wire.NUM_EXAMPLES: 120, "loss": 0.25,
                                                     "counts": [1, 2, 3]}),
                        wire.CLASS_FEATURES: wire.pack_class_features(np.arange(2), np.ones((2, 50)), [3, 4])})
    for content, tolerance in ((big, 0.001), (small, 0.05)):
        exact = wire.serialised_bytes(content)
        assert abs(wire.content_bytes(content) - exact) <= tolerance * exact, (wire.content_bytes(content), exact)
    seen = {}
    assert wire.content_bytes(big, seen) == wire.content_bytes(big, seen) == wire.content_bytes(big)


def test_the_byte_columns_leave_out_the_replys_placement_record():
    """placement.csv's telemetry is not the method's traffic: a reply counts the same with or without it."""
    from flwr.app import Metadata

    from server_app.app import _bytes

    records = {wire.METRICS: MetricRecord({wire.PARTITION_ID: 1, "loss": 0.25}),
               wire.CLASS_FEATURES: wire.pack_class_features(np.arange(2), np.ones((2, 50)), [3, 4])}
    placement = ConfigRecord({"host": "h", "pid": 7, "node-ip": "10.0.0.2", "ray-node-id": "ab" * 28})
    meta = Metadata(run_id=1, message_id="", src_node_id=1, dst_node_id=0, reply_to_message_id="m",
                    group_id="1", created_at=0.0, ttl=60.0, message_type="train")
    bare = Message(content=RecordDict(records), metadata=meta)
    placed = Message(content=RecordDict({**records, wire.PLACEMENT: placement}), metadata=meta)
    assert wire.content_bytes(placed.content) > wire.content_bytes(bare.content)
    assert _bytes([placed]) == _bytes([bare]) == wire.content_bytes(bare.content)


def test_array_views_equal_flowers_copies_and_refuse_bad_data():
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.asfortranarray(np.ones((3, 2))),
              np.array(5, dtype=np.int64), np.zeros(0, np.float32), np.array([True, False])]
    for a in arrays:
        view = wire.array_view(Array(a))
        np.testing.assert_array_equal(view, Array(a).numpy())
        assert view.dtype == a.dtype and view.shape == a.shape and not view.flags.writeable
    good = Array(np.ones(4, np.float32))
    with pytest.raises(ValueError):
        wire.array_view(Array(dtype="float32", shape=(4,), stype="numpy.ndarray", data=good.data[:-4]))
    with pytest.raises(ValueError):
        wire.array_view(Array(dtype="float32", shape=(4,), stype="numpy.ndarray", data=b"garbage" * 30))



def test_compact_arrays_survive_flowers_serialiser_unchanged_and_drop_the_npy_header():
    from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

    arrays = {"f": np.arange(12, dtype=np.float32).reshape(3, 4), "fortran": np.asfortranarray(np.ones((3, 2))),
              "scalar": np.array(5, dtype=np.int64), "empty": np.zeros((0, 7), np.float32),
              "bool": np.array([True, False]), "big-endian": np.arange(3, dtype=">i4"),
              "tensor": torch.arange(6, dtype=torch.float64).reshape(2, 3)}
    record = wire.pack_arrays(arrays, compact=True)
    back = recorddict_from_proto(recorddict_to_proto(RecordDict({"r": record})))["r"]
    for key, a in arrays.items():
        a = a.numpy() if isinstance(a, torch.Tensor) else a
        view = wire.unpack_arrays(back)[key]
        assert back[key].stype == wire.RAW_STYPE
        np.testing.assert_array_equal(view, a)
        assert view.shape == a.shape and view.dtype == a.dtype.newbyteorder("<") and not view.flags.writeable
    npy = ArrayRecord({k: Array(np.ascontiguousarray(a)) for k, a in arrays.items()})  # Flower's own .npy
    saved = wire.record_bytes(npy) - wire.record_bytes(record)
    assert saved >= 128 * len(arrays)  # at least the .npy header of every array
    exact = wire.serialised_bytes(RecordDict({"r": record})) - wire.serialised_bytes(RecordDict({"r": ArrayRecord()}))
    assert abs(wire.record_bytes(record) - exact) <= 2 * len(arrays)


def test_packed_arrays_round_trip_as_one_flower_object_and_load_as_writable_tensors():
    """The default packing: every array of a record in one Array, so a message of a model moves as
    a handful of Flower objects whatever the number of tensors (each object is a request per hop)."""
    from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from fedcore.models import build_model

    arrays = {"f": np.arange(12, dtype=np.float32).reshape(3, 4), "fortran": np.asfortranarray(np.ones((3, 2))),
              "scalar": np.array(5, dtype=np.int64), "empty": np.zeros((0, 7), np.float32),
              "bool": np.array([True, False]), "big-endian": np.arange(3, dtype=">i4"),
              "tensor": torch.arange(6, dtype=torch.float64).reshape(2, 3), "last-empty": np.zeros(0, np.int8)}
    record = wire.pack_arrays(arrays)
    assert list(record.keys()) == [wire.PACKED_KEY] and record[wire.PACKED_KEY].stype == wire.PACKED_STYPE
    back = recorddict_from_proto(recorddict_to_proto(RecordDict({"r": record})))["r"]
    views, tensors = wire.unpack_arrays(back), wire.torch_arrays(back)
    assert list(views) == list(tensors) == list(arrays)  # packing order kept
    for key, a in arrays.items():
        a = a.numpy() if isinstance(a, torch.Tensor) else a
        np.testing.assert_array_equal(views[key], a)
        assert views[key].shape == a.shape and views[key].dtype == a.dtype.newbyteorder("<")
        assert not views[key].flags.writeable and views[key].flags.aligned
        np.testing.assert_array_equal(tensors[key].numpy(), a)
    tensors["f"] += 1  # writable, and a copy: the record is untouched
    assert views["f"][0, 0] == 0
    exact = wire.serialised_bytes(RecordDict({"r": record})) - wire.serialised_bytes(RecordDict({"r": ArrayRecord()}))
    assert abs(wire.record_bytes(record) - exact) <= 4

    model = build_model("fedavgcnn", (1, 28, 28), 10)
    per_name = RecordDict({"w": ArrayRecord(model.state_dict())})  # a message's content: one object more
    packed = RecordDict({"w": wire.pack_arrays(model.state_dict())})
    n_per_name, n_packed = len(get_all_nested_objects(per_name)), len(get_all_nested_objects(packed))
    assert len(model.state_dict()) >= 8 and n_packed == 4 and n_per_name == 2 + 2 * len(model.state_dict())
    fresh = build_model("fedavgcnn", (1, 28, 28), 10)
    fresh.load_state_dict(wire.torch_arrays(packed["w"]))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))


def _packed(header: bytes, body: bytes = b"") -> ArrayRecord:
    data = b"PFLPACK1" + len(header).to_bytes(4, "little") + header + body
    return ArrayRecord({wire.PACKED_KEY: Array(dtype="uint8", shape=(len(data),), stype=wire.PACKED_STYPE, data=data)})


@pytest.mark.parametrize("record,reason", [
    (ArrayRecord({wire.PACKED_KEY: Array(dtype="uint8", shape=(4,), stype=wire.PACKED_STYPE, data=b"junk")}), "magic"),
    (ArrayRecord({wire.PACKED_KEY: Array(dtype="uint8", shape=(13,), stype=wire.PACKED_STYPE,
                                         data=b"PFLPACK1\x10\0\0\0[")}), "inside its header"),
    (_packed(b"{not json"), "malformed"),
    (_packed(b'[["a","|O",[1]]]'), "not a number"),
    (_packed(b'[["a","<f4",[-1]]]'), "bad shape"),
    (_packed(b'[["a","<f4",[1]],["a","<f4",[1]]]'), "distinct"),
    (_packed(b'[["a","<f4",[2]]]', b"\0" * 200), "holds"),
])
def test_malformed_packed_arrays_are_refused(record, reason):
    with pytest.raises(ValueError, match=reason):
        wire.unpack_arrays(record)


@pytest.mark.parametrize("dtype,shape,data,reason", [
    ("<f4", (4,), b"\0" * 12, "holds 12 bytes"),
    ("<f4", (2, 2), b"\0" * 20, "holds 20 bytes"),
    ("|O", (1,), b"\0" * 8, "not numeric"),
    ("<U3", (1,), b"\0" * 12, "not numeric"),
    ("nonsense", (1,), b"\0" * 4, "unknown dtype"),
])
def test_compact_arrays_with_bad_dtype_or_length_are_refused(dtype, shape, data, reason):
    with pytest.raises(ValueError, match=reason):
        wire.array_view(Array(dtype=dtype, shape=shape, stype=wire.RAW_STYPE, data=data))


# ------------------------------------------------------------------ 11. config hygiene
@pytest.mark.parametrize("key,value,selected", [
    ("fedprox.mu", 0.5, "method is 'fedavg'"),
    ("dirichlet.alpha", 0.3, "partition is 'pathological'"),
    ("synthetic.alpha", 1.0, "dataset is 'mnist5k'"),
])
def test_an_option_of_something_not_selected_is_refused(key, value, selected):
    with pytest.raises(ConfigError) as err:
        Config.from_run_config({"method": "fedavg", "partition": "pathological", key: value})
    assert key in str(err.value) and selected in str(err.value)
    Config.from_run_config({"method": "fedavg", key: Config.from_run_config({})[key]})  # the default is fine


def test_qp_and_linear_algebra_dependencies_are_installed():
    import cvxpy
    from scipy.linalg import subspace_angles

    x = cvxpy.Variable(2)
    cvxpy.Problem(cvxpy.Minimize(cvxpy.sum_squares(x - 1)), [cvxpy.sum(x) == 1, x >= 0]).solve()
    np.testing.assert_allclose(x.value, [0.5, 0.5], atol=1e-6)
    assert subspace_angles(np.eye(3)[:, :1], np.eye(3)[:, 1:2])[0] == pytest.approx(np.pi / 2)


# ------------------------------------------------------------------ 12. docstrings on the extension points
def test_every_extension_point_says_what_it_does():
    from clients.base import ClientEnv, ClientMethod
    from fedstrategies.base import PersonalizedStrategy

    hooks = {PersonalizedStrategy: ["prepare_targets", "prepare_payload", "prepare_config", "prepare_schema",
                                    "aggregate_prepare", "sample_train", "begin_round", "train_payload",
                                    "train_config", "reply_schema", "check_reply", "aggregate", "evaluate_payload",
                                    "evaluate_config", "record_matrix", "state_dict", "sample_clients"],
             ClientMethod: ["fit", "evaluate", "prepare", "build_model", "train", "load_model"],
             ClientEnv: ["save_module", "load_module", "save_arrays", "load_arrays", "save_scalars",
                         "save_optimizer", "generator", "optimizer", "lr"]}
    for cls, names in hooks.items():
        for name in names:
            doc = inspect.getdoc(getattr(cls, name))
            assert doc and len(doc) > 30, f"{cls.__name__}.{name}"


@pytest.mark.parametrize("sgd", [{}, {"momentum": 0.9, "weight_decay": 0.001}], ids=["plain", "momentum+weight-decay"])
@pytest.mark.parametrize("coef", [0.005, 0.5, 3.0])
def test_the_proximal_pull_outside_autograd_equals_the_autograd_term_bit_for_bit(sgd, coef):
    """``proximal=(anchor, c)`` adds 2c (w - anchor) to the gradients after backward: the parameters, momentum
    buffers and mean loss are those of the loss CE + c * proximal_term through autograd, bit for bit, over three
    epochs (FedProx's and Ditto's local training take it; FeSEM's and FedAMP's keep the autograd term until
    their mutation reports are made again)."""
    from clients.training import cross_entropy, proximal_term, train_loop
    from tests.conftest import test_device

    device = torch.device(test_device())

    def trained(through_autograd: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to(device)
        anchor = [p.detach().clone() + 0.1 * torch.randn_like(p) for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.05, **sgd)
        x = torch.randn(37, 6, generator=torch.Generator().manual_seed(1)).to(device)
        y = (torch.arange(37) % 3).to(device)
        kwargs = dict(batch_size=5, optimizer=opt, generator=torch.Generator(device).manual_seed(2), epochs=3)
        if through_autograd:
            loss = train_loop(model, x, y, loss_fn=lambda m, xb, yb: cross_entropy(m, xb, yb)
                              + coef * proximal_term(m, anchor), **kwargs)
        else:
            loss = train_loop(model, x, y, proximal=(anchor, coef), **kwargs)
        bufs = [opt.state[p].get("momentum_buffer") for p in model.parameters()]
        return loss, [p.detach().clone() for p in model.parameters()], bufs

    (loss, params, bufs), (ref_loss, ref_params, ref_bufs) = trained(False), trained(True)
    assert loss == ref_loss
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(bufs, ref_bufs))
