"""A validation split per client (``val-fraction``): carved from the training pool, reported beside the
test accuracy every evaluation round, and the round (and so the reported test accuracy) chosen on it."""

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore import wire
from fedcore.config import Config, ConfigError
from partitions import PartitionError, build_splits, load_dataset
from partitions.partitioners import _build_cached, write_split_file
from server_app.results import best_validation, format_summary


def _rows(summary) -> list[dict]:
    with open(Path(summary["results_dir"]) / "rounds.csv") as f:
        return list(csv.DictReader(f))


def _clients(summary) -> list[dict]:
    with open(Path(summary["results_dir"]) / "clients.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", num_clients=3, seed=0)


# ------------------------------------------------------------------ the split
def test_validation_comes_from_the_training_pool_and_leaves_train_and_test_disjoint(digits):
    plain = build_splits(digits, "pathological", 3, 0)
    split = build_splits(digits, "pathological", 3, 0, {"val-fraction": 0.1})
    for before, s in zip(plain, split):
        assert np.array_equal(s.test, before.test)  # the test split is untouched
        assert np.array_equal(np.sort(np.concatenate([s.train, s.val])), before.train)  # from the training pool
        assert not np.intersect1d(s.val, s.train).size and not np.intersect1d(s.val, s.test).size
        assert len(s.val) == max(1, int(0.1 * len(before.train)))


def test_clients_train_without_their_validation_samples(tmp_path, monkeypatch, device):
    from clients import data as client_data, partition_cache

    monkeypatch.setenv(partition_cache.CACHE_ENV, str(tmp_path / "cache"))
    cfg = Config.from_run_config({"dataset": "digits", "partition": "pathological", "val-fraction": 0.1})
    ds = load_dataset("digits", num_clients=3, seed=0)
    split = build_splits(ds, "pathological", 3, 0, cfg.partition_params())[1]
    for _ in range(2):  # computed, then read from the partition cache
        client_data._client_data.cache_clear()
        data = client_data.load_client_data(cfg, 1, 3, device)
        assert torch.equal(data.x_train, torch.as_tensor(ds.x[split.train], device=device))
        assert torch.equal(data.x_val, torch.as_tensor(ds.x[split.val], device=device))
        assert torch.equal(data.y_test, torch.as_tensor(ds.y[split.test], device=device))
        assert data.num_val == len(split.val) > 0


def test_the_split_repeats_for_a_seed_and_differs_for_another(digits):
    first = build_splits(digits, "dirichlet", 3, 4, {"val-fraction": 0.2, "alpha": 1.0})
    _build_cached.cache_clear()
    again = build_splits(digits, "dirichlet", 3, 4, {"val-fraction": 0.2, "alpha": 1.0})
    other = build_splits(digits, "dirichlet", 3, 5, {"val-fraction": 0.2, "alpha": 1.0})
    assert all(np.array_equal(a.val, b.val) and np.array_equal(a.train, b.train) for a, b in zip(first, again))
    assert not all(np.array_equal(a.val, b.val) for a, b in zip(first, other))


def test_a_split_file_keeps_validation_in_its_training_lists(digits, tmp_path):
    split = build_splits(digits, "iid", 3, 0, {"val-fraction": 0.1})
    write_split_file(str(tmp_path / "s.json"), "digits", split)
    back = build_splits(digits, "file", 3, 0, {"file": str(tmp_path / "s.json"), "val-fraction": 0.1})
    assert all(np.array_equal(a.val, b.val) and np.array_equal(a.train, b.train) for a, b in zip(split, back))


@pytest.mark.parametrize("value", [1.0, -0.1, 1.5])
def test_a_val_fraction_outside_0_1_is_refused(digits, value):
    with pytest.raises(ConfigError, match="'val-fraction'"):
        Config.from_run_config({"val-fraction": value})
    with pytest.raises(PartitionError, match="'val-fraction'"):
        build_splits(digits, "iid", 3, 0, {"val-fraction": value})


def test_a_val_fraction_that_leaves_a_client_no_training_sample_is_refused(digits, tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"format": "pfl-split/v1", "dataset": "digits", "num_clients": 2,
                                "clients": [{"train": [0, 1, 2], "test": [3]}, {"train": [4], "test": [5]}]}))
    with pytest.raises(PartitionError, match="'val-fraction' = 0.1 leaves client 1 .* no training sample"):
        build_splits(digits, "file", 2, 0, {"file": str(path), "val-fraction": 0.1})


# ------------------------------------------------------------------ choosing the round
def test_the_best_validation_round_and_the_test_accuracy_there():
    rows = [{"round": 0},  # the preparation phase: no evaluation
            {"round": 1, "acc_weighted": 0.50, "acc_client_mean": 0.40, "val_acc_weighted": 0.60, "val_acc_client_mean": 0.7},
            {"round": 2, "acc_weighted": 0.90, "acc_client_mean": 0.95, "val_acc_weighted": 0.70, "val_acc_client_mean": 0.6},
            {"round": 3, "acc_weighted": 0.80, "acc_client_mean": 0.85, "val_acc_weighted": 0.75, "val_acc_client_mean": 0.7},
            {"round": 4, "acc_weighted": 0.70, "acc_client_mean": 0.70, "val_acc_weighted": 0.75, "val_acc_client_mean": ""}]
    got = best_validation(rows)
    # round 2 is best on test, round 3 on validation (round 4 ties it: the earlier one counts)
    assert (got["best_val_round"], got["best_val_acc"], got["test_acc_at_best_val"]) == (3, 0.75, 0.80)
    assert (got["best_val_round_client_mean"], got["test_client_acc_mean_at_best_val"]) == (1, 0.40)
    assert set(best_validation([{"round": 1, "acc_weighted": 0.5, "acc_client_mean": 0.5}]).values()) == {None}


def test_the_summary_table_names_what_picked_the_round():
    summary = {"method": "fedavg", "dataset": "digits", "partition": "iid", "num_clients": 3, "rounds": 4,
               "final_acc": 0.7, "best_acc": 0.9, "best_round": 2, "client_acc_mean": 0.7, "client_acc_std": 0.1,
               "bytes_up_per_round": 1e6, "bytes_down_per_round": 1e6, "wall_s": 1.0, "wall_s_per_round": 0.2,
               "dropped_replies": 0, "results_dir": "r", **best_validation([
                   {"round": 1, "acc_weighted": 0.8, "acc_client_mean": 0.8, "val_acc_weighted": 0.9,
                    "val_acc_client_mean": 0.9}])}
    table = format_summary(summary)
    assert "test acc at best-val round (weighted) %" in table and "80.00 (round 1, validation 90.00)" in table
    assert "best-of-test" not in table  # with a validation split the round is never picked on test
    off = format_summary({**summary, **best_validation([])})
    assert "best-val" not in off and "best-of-test acc (optimistic) %" in off


def test_comparison_tables_use_the_test_accuracy_at_the_best_validation_round(tmp_path):
    from runner.compare_rows import aggregate_row
    from runner.compare_table import write_table

    common = {"final_acc": 0.7, "client_acc_mean": 0.7, "best_acc": 0.9, "best_client_acc_mean": 0.9,
              "last10_acc": 0.7, "bytes_up_per_round": 1e6, "bytes_down_per_round": 1e6, "wall_s_per_round": 1.0}
    validated = aggregate_row("a", [{**common, "test_acc_at_best_val": 0.8, "test_client_acc_mean_at_best_val": 0.75}] * 2)
    assert (validated["test_acc_at_best_val"], validated["test_client_acc_mean_at_best_val"]) == (0.8, 0.75)
    write_table([validated], tmp_path, {"compare": {}}, [])
    table = (tmp_path / "table.md").read_text()
    assert "| test acc at best-val round (weighted) | test acc at best-val round (client mean) |" in table
    assert "| 80.00 ± <0.01 | 75.00 ± <0.01 |" in table and "best-of-test" not in table
    write_table([validated, aggregate_row("b", [common])], tmp_path, {"compare": {}}, [])  # a run without validation
    table = (tmp_path / "table.md").read_text()
    assert "best-val round (weighted)" in table and "best-of-test acc (weighted, optimistic)" in table
    relation = aggregate_row("R", [{**common, "eval_relation_acc_at_best_val": 0.6}], "eval_relation_acc")
    assert relation["test_acc_at_best_val"] == 0.6


def test_the_second_evaluation_scores_the_same_model(tmp_path):
    """FedAvg-FT fine-tunes inside its evaluation (shuffles, dropout): with the validation split
    standing in for the test split, the validation pass repeats the test pass to the bit."""
    from flwr.app import RecordDict

    from clients.base import ClientEnv
    from clients.fedavg_ft import FedAvgFTClient
    from tests.conftest import small_config

    cfg = Config.from_run_config(small_config(tmp_path, method="fedavg-ft", model="protocnn", **{"val-fraction": 0.1}))
    env = ClientEnv(cfg, pid=0, num_clients=3, state=RecordDict(), server_round=1)
    env.data = dataclasses.replace(env.data, x_val=env.data.x_test, y_val=env.data.y_test)
    client = FedAvgFTClient(env)
    content = RecordDict({wire.WEIGHTS: wire.pack_arrays(client.new_model().state_dict())})
    torch.manual_seed(3)
    test, val = client.evaluate_splits(content)
    assert (val.loss, val.correct, val.num_examples) == (test.loss, test.correct, test.num_examples)
    torch.manual_seed(3)
    assert client.evaluate(content).loss == test.loss  # the test pass is a plain evaluation


# ------------------------------------------------------------------ real runs
def test_a_run_reports_validation_and_picks_its_round_there(inprocess):
    summary, _ = inprocess(3, **{"val-fraction": 0.1, "num-server-rounds": 3, "method": "fedavg"})
    rows = _rows(summary)
    val = [float(r["val_acc_weighted"]) for r in rows]
    best = int(np.argmax(val))  # the first of equals, as the summary's
    assert summary["best_val_round"] == int(rows[best]["round"])
    assert summary["test_acc_at_best_val"] == pytest.approx(float(rows[best]["acc_weighted"]))
    mean = [float(r["val_acc_client_mean"]) for r in rows]
    at = int(np.argmax(mean))
    assert summary["test_client_acc_mean_at_best_val"] == pytest.approx(float(rows[at]["acc_client_mean"]))
    clients = _clients(summary)
    for r in rows:  # the per-client rows add up to the round's validation accuracy
        mine = [c for c in clients if c["round"] == r["round"]]
        correct = sum(float(c["val_accuracy"]) * int(c["val_samples"]) for c in mine)
        assert correct / sum(int(c["val_samples"]) for c in mine) == pytest.approx(float(r["val_acc_weighted"]))
        assert float(r["val_loss"]) > 0


def test_val_fraction_0_is_a_run_without_validation(tmp_path):
    from tests.conftest import run_inprocess

    untimed = ("wall_s", "eval_s", "startup_s")
    plain, _ = run_inprocess(tmp_path, 2, None, method="fedavg", **{"run-name": "plain"})
    zero, _ = run_inprocess(tmp_path, 2, None, method="fedavg", **{"run-name": "zero", "val-fraction": 0.0})
    assert [{k: v for k, v in r.items() if k not in untimed} for r in _rows(zero)] == \
           [{k: v for k, v in r.items() if k not in untimed} for r in _rows(plain)]
    assert not any(column.startswith("val_") for column in _rows(zero)[0]) and _clients(zero) == _clients(plain)
    assert zero["best_val_round"] is None and zero["test_acc_at_best_val"] is None


@pytest.mark.parametrize("method", ["pfedpm", "fedproto", "fedfcd", "mupfl", "fedsac"])
def test_methods_with_their_own_evaluation_report_validation(inprocess, method):
    summary, _ = inprocess(2, method=method, **{"val-fraction": 0.2, "num-server-rounds": 1})
    row = _rows(summary)[-1]
    assert 0 <= float(row["val_acc_weighted"]) <= 1 and float(row["val_loss"]) > 0
    assert summary["test_acc_at_best_val"] == pytest.approx(float(row["acc_weighted"]))
    if method == "pfedpm":  # its relation module, on validation too
        assert summary["eval_relation_acc_at_best_val"] == pytest.approx(float(row["eval_relation_acc"]))
        assert "eval_val_relation_acc" in row


def test_validation_columns_survive_a_resume(tmp_path):
    from clients.app import app as client_app
    from server_app.app import run_experiment
    from runner.inprocess import InProcessGrid, run_inprocess
    from tests.conftest import small_config

    class Crash(Exception):
        pass

    def kill_in_round_2(msg, reply):
        if msg.metadata.message_type == "evaluate" and msg.metadata.group_id == "2":
            raise Crash()
        return reply

    extra = {"num-server-rounds": 3, "val-fraction": 0.2, "method": "fedavg"}
    whole, _ = run_inprocess(small_config(tmp_path, **extra, **{"run-name": "whole"}), 2)
    config = small_config(tmp_path, **extra, **{"run-name": "cut"})
    with pytest.raises(Crash):
        run_experiment(InProcessGrid(client_app, 2, config, faults=kill_in_round_2), Config.from_run_config(config))
    resumed = run_experiment(InProcessGrid(client_app, 2, {**config, "resume": True}),
                             Config.from_run_config({**config, "resume": True}))
    untimed = ("wall_s", "eval_s", "startup_s")
    assert [{k: v for k, v in r.items() if k not in untimed} for r in _rows(resumed)] == \
           [{k: v for k, v in r.items() if k not in untimed} for r in _rows(whole)]
    assert _clients(resumed) == _clients(whole) and "val_accuracy" in _clients(resumed)[0]
    for key in ("best_val_round", "test_acc_at_best_val", "test_client_acc_mean_at_best_val"):
        assert resumed[key] == whole[key] and whole[key] is not None, key


def test_the_server_bounds_and_requires_the_validation_numbers(inprocess):
    from flwr.app import Message, MetricRecord, RecordDict

    def damage(msg, reply):  # client 0 claims more validation samples than it has, client 1 sends none
        if msg.metadata.message_type != "evaluate" or reply.has_error():
            return reply
        metrics = dict(reply.content[wire.METRICS])
        pid = metrics[wire.PARTITION_ID]
        if pid == 0:
            metrics[wire.VAL_NUM_EXAMPLES] = metrics[wire.VAL_CORRECT] = 10 ** 6
        elif pid == 1:
            metrics = {k: v for k, v in metrics.items() if k not in wire.VAL_METRICS}
        else:
            return reply
        return Message(RecordDict({wire.METRICS: MetricRecord(metrics)}), reply_to=msg)

    summary, _ = inprocess(3, method="fedavg", faults=damage, **{"val-fraction": 0.1, "num-server-rounds": 1})
    reasons = [d["reason"] for d in json.load(open(Path(summary["results_dir"]) / "dropped.json"))]
    assert any("val-num-examples 1000000 is outside 0.." in r for r in reasons)
    assert any("missing metric 'val-num-examples'" in r for r in reasons)
    row = _rows(summary)[0]
    client = [c for c in _clients(summary) if c["partition_id"] == "2"][0]
    assert row["eval_clients"] == "1" and float(row["val_acc_weighted"]) == pytest.approx(float(client["val_accuracy"]))
