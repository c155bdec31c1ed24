"""Sampled evaluation (``fraction-evaluate``): which clients evaluate, what rounds.csv says, and that a run's
best round is chosen only among the rounds where every client evaluated."""

import csv
import json

import pytest

from fedcore.config import Config, ConfigError
from server_app.results import SAMPLED_EVAL, accuracy_summary


def _strategy(num_clients: int, **run_config):
    """FedAvg's strategy over ``num_clients`` clients that each hold 10 samples of one class."""
    import numpy as np
    from flwr.supercore.task_identity import TaskIdentity

    from fedcore.models import model_facts
    from fedcore.registry import get_method
    from fedstrategies.base import ClientInfo

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # Message() needs them
    cfg = Config.from_run_config({"method": "fedavg", "dataset": "mnist5k", "model": "mlr", **run_config})
    counts = np.eye(10, dtype=np.int64) * 10
    clients = {pid: ClientInfo(pid, 5000 + pid, 10, 4, counts[pid % 10], counts[pid % 10] // 3)
               for pid in range(num_clients)}
    return get_method("fedavg").strategy(cfg, clients, model_facts("mlr", (1, 28, 28), 10, 0))


@pytest.mark.parametrize("bad, message", [
    ({"fraction-evaluate": 0.0, "eval-every": 5}, "'fraction-evaluate' = 0.0 is out of range; it must be > 0.0"),
    ({"fraction-evaluate": 1.5, "eval-every": 5}, "'fraction-evaluate' = 1.5 is out of range; it must be <= 1.0"),
    ({"min-evaluate-clients": 0}, "'min-evaluate-clients' = 0 is out of range"),
    ({"fraction-evaluate": 0.1}, "'eval-every' = 1 evaluates every client in every round; set eval-every > 1"),
])
def test_bad_sampled_evaluation_values_are_refused_at_start(bad, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Config.from_run_config(bad)


def test_the_sample_is_seeded_sized_and_complete_on_eval_every_rounds_and_the_last():
    s = _strategy(200, **{"fraction-evaluate": 0.05, "eval-every": 4, "num-server-rounds": 10, "seed": 3})
    again = _strategy(200, **{"fraction-evaluate": 0.05, "eval-every": 4, "num-server-rounds": 10, "seed": 3})
    other_seed = _strategy(200, **{"fraction-evaluate": 0.05, "eval-every": 4, "num-server-rounds": 10, "seed": 4})
    everyone = list(range(200))
    for rnd in (4, 8, 10):  # eval-every rounds and the last
        assert s.sample_evaluate(rnd) == everyone
    samples = {rnd: s.sample_evaluate(rnd) for rnd in (1, 2, 3, 5, 9)}
    for rnd, sample in samples.items():
        assert len(sample) == 10 and sample == sorted(set(sample)) and set(sample) <= set(everyone)
        assert sample == again.sample_evaluate(rnd)  # the same seed: the same clients
    assert len({tuple(v) for v in samples.values()}) == len(samples)  # a new sample every round
    assert any(other_seed.sample_evaluate(rnd) != sample for rnd, sample in samples.items())
    assert samples[1] != s.sample_train(1)[:10]  # its own stream, not the training sample's first clients
    msgs = list(s.configure_evaluate(3, None, None, None))
    assert sorted(s.pid_of[m.metadata.dst_node_id] for m in msgs) == samples[3]


def test_min_evaluate_clients_raises_a_small_sample_and_never_exceeds_the_clients():
    assert len(_strategy(200, **{"fraction-evaluate": 0.01, "eval-every": 4, "min-evaluate-clients": 7})
               .sample_evaluate(1)) == 7
    assert len(_strategy(200, **{"fraction-evaluate": 0.1, "eval-every": 4, "min-evaluate-clients": 7})
               .sample_evaluate(1)) == 20
    assert _strategy(5, **{"fraction-evaluate": 0.1, "eval-every": 4, "min-evaluate-clients": 9}
                     ).sample_evaluate(1) == list(range(5))


def test_fraction_evaluate_one_keeps_the_rounds_between_eval_every_rounds_without_evaluation(tmp_path, inprocess):
    summary, grid = inprocess(**{"method": "fedavg", "num-server-rounds": 3, "eval-every": 2})
    evaluated = sorted({int(m.metadata.group_id) for m in grid.sent if m.metadata.message_type == "evaluate"})
    assert evaluated == [2, 3]
    with open(f"{summary['results_dir']}/rounds.csv") as f:
        assert SAMPLED_EVAL not in next(csv.reader(f))  # runs without a sample keep their columns


def test_a_sampled_run_records_its_samples_and_chooses_its_best_round_among_complete_rounds(inprocess):
    config = {"method": "fedavg", "num-server-rounds": 4, "eval-every": 3, "fraction-evaluate": 0.3,
              "min-evaluate-clients": 1, "val-fraction": 0.2}
    summary, grid = inprocess(num_clients=6, **config)
    asked = {}
    for m in grid.sent:
        if m.metadata.message_type == "evaluate":
            asked.setdefault(int(m.metadata.group_id), set()).add(m.metadata.dst_node_id)
    assert {rnd: len(nodes) for rnd, nodes in asked.items()} == {1: 2, 2: 2, 3: 6, 4: 6}
    folder = summary["results_dir"]
    with open(f"{folder}/rounds.csv") as f:
        rows = {int(r["round"]): r for r in csv.DictReader(f)}
    assert [rows[r][SAMPLED_EVAL] for r in (1, 2, 3, 4)] == ["2", "2", "", ""]
    assert [rows[r]["eval_clients"] for r in (1, 2, 3, 4)] == ["2", "2", "6", "6"]
    with open(f"{folder}/clients.csv") as f:
        per_round = {}
        for r in csv.DictReader(f):
            per_round.setdefault(int(r["round"]), []).append(int(r["partition_id"]))
    assert {rnd: len(p) for rnd, p in per_round.items()} == {1: 2, 2: 2, 3: 6, 4: 6}
    complete = [float(rows[r]["acc_weighted"]) for r in (3, 4)]
    assert summary["best_round"] in (3, 4) and summary["best_acc"] == max(complete)
    assert summary["best_val_round"] in (3, 4) and summary["final_eval_clients"] == 6
    assert json.load(open(f"{folder}/summary.json"))["best_val_round"] == summary["best_val_round"]


def _row(rnd, acc, val, sampled=None):
    row = {"round": rnd, "acc_weighted": acc, "acc_client_mean": acc, "acc_client_std": 0.0,
           "val_acc_weighted": val, "val_acc_client_mean": val, "eval_head": acc}
    if sampled is not None:
        row[SAMPLED_EVAL] = sampled
    return row


def test_summary_accuracies_come_from_complete_rounds_only():
    """A lucky sample (round 2: 0.99 on validation and test) chooses nothing; without its marker it would."""
    rows = [_row(1, 0.5, 0.5), _row(2, 0.99, 0.99, sampled=3), _row(3, 0.6, 0.7), _row(4, 0.65, 0.6)]
    summary = accuracy_summary(rows, 4)
    assert (summary["best_val_round"], summary["test_acc_at_best_val"]) == (3, 0.6)
    assert (summary["best_round"], summary["best_acc"]) == (4, 0.65)
    assert summary["best_client_mean_round"] == 4 and summary["best_eval_head"] == 0.65
    assert summary["last10_acc"] == pytest.approx((0.5 + 0.6 + 0.65) / 3)
    unmarked = accuracy_summary([{k: v for k, v in r.items() if k != SAMPLED_EVAL} for r in rows], 4)
    assert unmarked["best_val_round"] == 2  # the rule above is what keeps it out


def test_the_tables_recomputed_summary_leaves_sampled_rounds_out_too(inprocess, tmp_path):
    from runner import run_data

    summary, _ = inprocess(num_clients=6, **{"method": "fedavg", "num-server-rounds": 4, "eval-every": 3,
                                             "fraction-evaluate": 0.3, "val-fraction": 0.2})
    run = run_data.collect(summary["results_dir"], "fedavg", 0, code={"commit": "x", "source_hash": "y"})
    assert run["rounds"][SAMPLED_EVAL][:2] == [2, 2] and run["rounds"][SAMPLED_EVAL][2:] == [None, None]
    again = run_data.summary(json.loads(json.dumps(run)))
    for key in ("best_val_round", "test_acc_at_best_val", "best_round", "best_acc", "last10_acc"):
        assert again[key] == summary[key], key


def test_rounds_to_a_target_count_complete_rounds_only(tmp_path):
    from runner.compare_rows import rounds_to_target

    rows = [_row(1, 0.5, 0.5), _row(2, 0.95, 0.9, sampled=3), _row(3, 0.92, 0.9), _row(4, 0.97, 0.9)]
    assert rounds_to_target(rows, "acc_weighted", 0.9) == 3  # round 2's sample reached it first
    path = tmp_path / "rounds.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, ["round", "acc_weighted", SAMPLED_EVAL])
        writer.writeheader()
        writer.writerows({"round": r["round"], "acc_weighted": r["acc_weighted"], SAMPLED_EVAL: r.get(SAMPLED_EVAL, "")}
                         for r in rows)
    assert rounds_to_target(path, "acc_weighted", 0.96) == 4
    assert rounds_to_target(path, "acc_weighted", 0.94) == 4


def test_a_run_resumes_with_another_evaluation_sample_or_from_before_the_keys_existed():
    from server_app import checkpoints

    now = Config.from_run_config({"fraction-evaluate": 0.2, "eval-every": 5}).to_dict()
    before_the_keys = {k: v for k, v in now.items() if k not in ("fraction-evaluate", "min-evaluate-clients")}
    assert checkpoints.config_changes(before_the_keys, now) == []
    assert checkpoints.config_changes(now, {**now, "fraction-evaluate": 0.5, "min-evaluate-clients": 9}) == []
    assert checkpoints.config_changes(now, {**now, "fraction-train": 0.5}) == ["fraction-train"]
