"""End-to-end in-process runs of the real ServerApp loop and ClientApp (no Ray), and reply validation."""

import csv
import json
import os

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.app.error import Error

from fedcore import wire
from server_app.app import StartupError

SUMMARY_KEYS = {"method", "dataset", "partition", "num_clients", "rounds", "final_acc", "best_acc",
                "client_acc_mean", "client_acc_std", "bytes_up", "bytes_down", "wall_s"}


@pytest.mark.parametrize("method", ["local", "fedavg"])
def test_two_rounds_three_clients_write_all_results(inprocess, method):
    summary, _ = inprocess(method=method, plots=True)
    assert SUMMARY_KEYS <= set(summary)
    assert summary["num_clients"] == 3 and summary["rounds"] == 2
    assert 0.0 <= summary["final_acc"] <= 1.0
    run_dir = summary["results_dir"]
    with open(f"{run_dir}/rounds.csv") as f:
        rounds = list(csv.DictReader(f))
    assert [r["round"] for r in rounds] == ["1", "2"]
    with open(f"{run_dir}/clients.csv") as f:
        clients = list(csv.DictReader(f))
    assert len(clients) == 2 * 3 and {c["partition_id"] for c in clients} == {"0", "1", "2"}
    assert json.load(open(f"{run_dir}/summary.json"))["method"] == method
    assert json.load(open(f"{run_dir}/config.json"))["method"] == method
    for png in ["accuracy.png", "label_counts.png"]:
        with open(f"{run_dir}/{png}", "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots_off_writes_every_result_but_the_pictures(inprocess):
    summary, _ = inprocess(method="fedavg", plots=False)
    run_dir = summary["results_dir"]
    assert {"rounds.csv", "clients.csv", "summary.json"} <= set(os.listdir(run_dir))
    assert not [name for name in os.listdir(run_dir) if name.endswith(".png")]


def test_local_sends_no_weights_and_fedavg_sends_models(inprocess):
    local, _ = inprocess(method="local")
    fedavg, _ = inprocess(method="fedavg", **{"run-name": "fedavg"})
    assert local["bytes_up"] < 2_000 * 3 * 2  # metrics only
    assert fedavg["bytes_up"] > 100 * local["bytes_up"]
    assert fedavg["bytes_down"] > 100 * local["bytes_down"]


def test_local_training_learns(inprocess):
    summary, _ = inprocess(method="local", **{"num-server-rounds": 5})
    assert summary["best_acc"] > 0.8  # 2 classes per client: local models separate them quickly


def test_fedavg_server_model_is_the_weighted_mean_of_replies(inprocess):
    """The strategy's global model equals the sample-weighted mean of what the clients sent."""
    seen = []

    def spy(msg, reply):
        if msg.metadata.message_type == "train":
            seen.append((reply.content.metric_records[wire.METRICS][wire.NUM_EXAMPLES],
                         wire.unpack_arrays(reply.content.array_records[wire.WEIGHTS])))
        return reply

    summary, grid = inprocess(method="fedavg", faults=spy, **{"num-server-rounds": 1})
    last_eval = [m for m in grid.sent if m.metadata.message_type == "evaluate"][-1]
    sent = wire.unpack_arrays(last_eval.content.array_records[wire.WEIGHTS])
    n = np.array([s[0] for s in seen], dtype=float)
    for key, value in sent.items():
        expected = sum(w * s[1][key] for w, s in zip(n / n.sum(), seen))
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6)


def _corrupt(kind):
    """A fault injector that damages client 1's train replies in the given way."""
    def fault(msg, reply):
        if msg.metadata.message_type != "train" or reply.has_error():
            return reply
        metrics = reply.content.metric_records[wire.METRICS]
        if metrics[wire.PARTITION_ID] != 1:
            return reply
        content = reply.content
        arrays = wire.unpack_arrays(content.array_records[wire.WEIGHTS])
        key = next(iter(arrays))
        if kind == "nan":
            arrays[key] = np.full_like(arrays[key], np.nan)
        elif kind == "shape":
            arrays[key] = np.zeros((3, 3), dtype=np.float32)
        elif kind == "missing-array":
            arrays.pop(key)
        elif kind == "missing-record":
            return Message(RecordDict({wire.METRICS: metrics}), reply_to=msg)
        elif kind == "error":
            return Message(Error(code=0, reason="ClientApp raised RuntimeError('boom')"), reply_to=msg)
        elif kind == "no-reply":
            return None
        elif kind == "wrong-pid":
            metrics = MetricRecord({**dict(metrics), wire.PARTITION_ID: 2})
        elif kind == "nan-metric":
            metrics = MetricRecord({**dict(metrics), wire.NUM_EXAMPLES: float("inf")})
        return Message(RecordDict({wire.WEIGHTS: ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                                   wire.METRICS: metrics}), reply_to=msg)
    return fault


@pytest.mark.parametrize("kind,reason", [
    ("nan", "NaN or Inf"), ("shape", "has shape (3, 3)"), ("missing-array", "lacks array"),
    ("missing-record", "missing array record"), ("error", "client error: ClientApp raised"),
    ("no-reply", "no reply"), ("wrong-pid", "does not match"), ("nan-metric", "non-finite metric"),
])
def test_bad_replies_are_dropped_logged_and_counted_and_the_run_goes_on(tmp_path, kind, reason):
    from tests.conftest import run_inprocess
    summary, _ = run_inprocess(tmp_path, faults=_corrupt(kind), method="fedavg")
    assert summary["dropped_replies"] == 2  # client 1, both rounds
    dropped = json.load(open(f"{summary['results_dir']}/dropped.json"))
    assert all(d["client"] == 1 and reason in d["reason"] for d in dropped), dropped
    rows = list(csv.DictReader(open(f"{summary['results_dir']}/rounds.csv")))
    assert [r["replies"] for r in rows] == ["2", "2"] and [r["dropped"] for r in rows] == ["1", "1"]
    assert summary["final_acc"] is not None  # evaluation still ran on every client


def test_min_replies_leaves_server_state_unchanged(inprocess):
    """With min-replies above what arrives, the global model stays the initial one."""
    summary, grid = inprocess(method="fedavg", faults=_corrupt("error"), **{"min-replies": 3,
                                                                             "num-server-rounds": 1})
    train = [m for m in grid.sent if m.metadata.message_type == "train"][0]
    evaluate = [m for m in grid.sent if m.metadata.message_type == "evaluate"][0]
    before = wire.unpack_arrays(train.content.array_records[wire.WEIGHTS])
    after = wire.unpack_arrays(evaluate.content.array_records[wire.WEIGHTS])
    for key in before:
        np.testing.assert_array_equal(before[key], after[key])


def test_a_crashing_client_is_dropped_not_fatal(inprocess, monkeypatch):
    import clients.fedavg as fedavg_client

    original = fedavg_client.FedAvgClient.fit

    def flaky(self, content):
        if self.env.pid == 0:
            raise RuntimeError("GPU fell off the bus")
        return original(self, content)

    monkeypatch.setattr(fedavg_client.FedAvgClient, "fit", flaky)
    summary, _ = inprocess(method="fedavg")
    assert summary["dropped_replies"] == 2 and summary["final_acc"] is not None


def test_too_few_samples_is_refused_before_any_client_starts(inprocess):
    from fedcore.config import ConfigError

    with pytest.raises(ConfigError, match=r"1797 samples.*At most \d+ clients can be served"):
        inprocess(method="local", num_clients=1000, partition="iid")


def test_clients_that_cannot_make_their_split_stop_the_run_at_start(tmp_path):
    """Deployed, the data is on the SuperNodes and the server cannot check it first: the clients' own failure
    still stops the run at its start (the same run, with the launcher's check left out)."""
    from clients.app import app as client_app
    from fedcore.config import Config
    from runner.inprocess import InProcessGrid
    from server_app.app import run_experiment
    from tests.conftest import small_config

    config = small_config(tmp_path, method="local", partition="iid")
    with pytest.raises(StartupError, match="could not start.*"):
        run_experiment(InProcessGrid(client_app, 1000, config), Config.from_run_config(config))


def test_fraction_train_samples_clients_deterministically(inprocess):
    _, grid = inprocess(method="fedavg", **{"fraction-train": 0.5, "num-server-rounds": 3})
    picked = [[m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "train"
               and m.metadata.group_id == str(r)] for r in (1, 2, 3)]
    assert all(len(p) == 2 for p in picked)  # round(0.5 * 3) = 2
    _, grid2 = inprocess(method="fedavg", **{"fraction-train": 0.5, "num-server-rounds": 3, "run-name": "again"})
    picked2 = [[m.metadata.dst_node_id for m in grid2.sent if m.metadata.message_type == "train"
                and m.metadata.group_id == str(r)] for r in (1, 2, 3)]
    assert picked == picked2


def test_same_seed_same_result(inprocess):
    a, _ = inprocess(method="fedavg", **{"run-name": "a"})
    b, _ = inprocess(method="fedavg", **{"run-name": "b"})
    assert a["final_acc"] == b["final_acc"] and a["bytes_up"] == b["bytes_up"]
