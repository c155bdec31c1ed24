"""The rules of a run's results (server_app/results.py), each checked on its own: which round is best on
validation (and on test), what "final" and the last-10 mean are, the summary's byte and time figures, the run
folder rules, and what a resumed writer keeps of the rows written after its checkpoint."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from fedcore.config import Config
from server_app import results
from server_app.results import RunFolderError, ResultsWriter, accuracy_summary, best_validation, run_folder

NAN = float("nan")


def _row(rnd, test, val=None, mean=None, val_mean=None, **extra):
    row = {"round": rnd, "acc_weighted": test, "acc_client_mean": test if mean is None else mean,
           "acc_client_std": 0.01}
    if val is not None:
        row.update(val_acc_weighted=val, val_acc_client_mean=val if val_mean is None else val_mean)
    return {**row, **extra}


def test_the_best_validation_round_is_the_highest_validation_accuracy_and_its_test_accuracy_is_reported():
    rows = [_row(1, 0.5, 0.6), _row(2, 0.9, 0.5), _row(3, 0.7, 0.8), _row(4, 0.6, 0.8), _row(5, 0.95, 0.7)]
    got = best_validation(rows)
    assert (got["best_val_round"], got["best_val_acc"], got["test_acc_at_best_val"]) == (3, 0.8, 0.7)


def test_rounds_without_a_number_on_either_split_cannot_be_chosen():
    rows = [_row(1, 0.5, 0.6), _row(2, NAN, 0.99), _row(3, 0.7, NAN), _row(4, "", 0.98), _row(5, 0.6, None)]
    rows[4]["val_acc_weighted"] = "0.99"  # a string read back from a csv is no number
    got = best_validation(rows)
    assert (got["best_val_round"], got["test_acc_at_best_val"]) == (1, 0.5)
    assert set(best_validation([_row(1, 0.5), _row(2, 0.6, NAN)]).values()) == {None}


def test_the_client_mean_round_is_chosen_on_the_client_mean_columns_alone():
    rows = [_row(1, 0.5, 0.9, mean=0.3, val_mean=0.1), _row(2, 0.6, 0.1, mean=0.8, val_mean=0.9)]
    got = best_validation(rows)
    assert (got["best_val_round"], got["test_acc_at_best_val"]) == (1, 0.5)
    assert (got["best_val_round_client_mean"], got["best_val_acc_client_mean"],
            got["test_client_acc_mean_at_best_val"]) == (2, 0.9, 0.8)


def test_final_is_the_last_rounds_evaluation_or_none_when_that_one_failed():
    rows = [_row(r, 0.5 + r / 100, mean=0.4 + r / 100) for r in range(1, 5)]
    got = accuracy_summary(rows, final_round=4)
    assert (got["final_acc"], got["client_acc_mean"], got["client_acc_std"]) == (0.54, 0.44, 0.01)
    assert accuracy_summary(rows, final_round=5)["final_acc"] is None
    assert accuracy_summary(rows, final_round=5)["client_acc_mean"] is None
    assert accuracy_summary([], final_round=None)["final_acc"] is None


def test_best_of_test_is_the_first_highest_round_on_each_column():
    rows = [_row(1, 0.5, mean=0.9), _row(2, 0.8, mean=0.2), _row(3, 0.8, mean=0.9)]
    got = accuracy_summary(rows, final_round=3)
    assert (got["best_acc"], got["best_round"]) == (0.8, 2)
    assert (got["best_client_acc_mean"], got["best_client_mean_round"]) == (0.9, 1)


def test_the_last_ten_mean_is_over_the_last_ten_evaluations():
    rows = [_row(r, r / 100, mean=r / 200) for r in range(1, 13)]
    got = accuracy_summary(rows, final_round=12)
    assert got["last10_acc"] == pytest.approx(np.mean(range(3, 13)) / 100)
    assert got["last10_client_acc_mean"] == pytest.approx(np.mean(range(3, 13)) / 200)
    assert accuracy_summary([], None)["last10_acc"] is None


def test_method_columns_get_final_best_last_ten_and_their_value_at_their_best_validation_round():
    rows = [_row(r, 0.5, eval_rel=r / 10, eval_val_rel=[0.2, 0.9, 0.5, 0.95][r - 1], eval_clients=3, eval_s=1.0,
                 eval_bytes_down=9) for r in range(1, 5)]
    rows[3]["eval_rel"] = NAN  # a round whose method column failed
    got = accuracy_summary(rows, final_round=4)
    assert (got["final_eval_rel"], got["best_eval_rel"]) == (0.3, 0.3)
    assert got["last10_eval_rel"] == pytest.approx(0.2)
    assert got["eval_rel_at_best_val"] == 0.2  # round 2, best on eval_val_rel where eval_rel has a value
    assert not any(k.endswith(("eval_clients", "eval_s", "eval_bytes_down")) or "eval_val_rel" in k for k in got)
    only_val = accuracy_summary([_row(1, 0.5, eval_val_x=0.3)], final_round=1)
    assert not any("eval_val_x" in k or "eval_x" in k for k in only_val)


def _cfg(tmp_path, **over) -> Config:
    return Config.from_run_config({"method": "fedavg", "dataset": "digits", "results-dir": str(tmp_path),
                                   "plots": False, "val-fraction": 0.0, **over})


def test_a_fresh_run_needs_a_new_or_empty_folder_unless_it_overwrites(tmp_path):
    assert run_folder(_cfg(tmp_path, **{"run-name": "a"})) == tmp_path / "a"
    (tmp_path / "a").mkdir()
    assert run_folder(_cfg(tmp_path, **{"run-name": "a"})) == tmp_path / "a"  # empty: fine
    (tmp_path / "a" / "rounds.csv").write_text("x")
    with pytest.raises(RunFolderError, match="already holds a run"):
        run_folder(_cfg(tmp_path, **{"run-name": "a"}))
    assert run_folder(_cfg(tmp_path, **{"run-name": "a", "overwrite": True})) == tmp_path / "a"


def test_a_resume_needs_a_named_folder_with_checkpoints(tmp_path):
    with pytest.raises(RunFolderError, match="resume needs the run-name"):
        run_folder(_cfg(tmp_path, resume=True))
    (tmp_path / "a").mkdir()
    with pytest.raises(RunFolderError, match="has no checkpoints"):
        run_folder(_cfg(tmp_path, resume=True, **{"run-name": "a"}))
    (tmp_path / "a" / "checkpoints").mkdir()
    (tmp_path / "a" / "rounds.csv").write_text("x")
    assert run_folder(_cfg(tmp_path, resume=True, **{"run-name": "a"})) == tmp_path / "a"


def test_an_unnamed_run_never_takes_an_existing_folder(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    assert run_folder(cfg).name.startswith("fedavg-digits-")
    monkeypatch.setattr(results, "default_run_name", lambda cfg: "same-second")
    (tmp_path / "same-second").mkdir()
    assert run_folder(cfg) == tmp_path / "same-second-2"
    (tmp_path / "same-second-2").mkdir()
    assert run_folder(cfg) == tmp_path / "same-second-3"


def test_the_default_name_says_method_dataset_partition_seed_and_time_and_holds_no_path():
    import re

    cfg = Config.from_run_config({"method": "fedavg", "dataset": "digits", "seed": 7})
    assert re.fullmatch(rf"fedavg-digits-{cfg['partition']}-s7-20\d{{6}}-\d{{6}}", results.default_run_name(cfg))
    source = {"method": "ditto", "dataset": "folder:/data/cats/", "partition": "flwr:dirichlet", "seed": 0}
    assert re.fullmatch(r"ditto-folder-cats-flwr-dirichlet-s0-\d{8}-\d{6}", results.default_run_name(source))


def _read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_rounds_csv_puts_validation_after_the_client_std_and_adds_a_methods_columns_as_they_come(tmp_path):
    w = ResultsWriter(_cfg(tmp_path, **{"run-name": "r", "val-fraction": 0.2}))
    header = (w.dir / "rounds.csv").read_text().splitlines()[0].split(",")
    at = header.index("acc_client_std")
    assert header[at + 1:at + 4] == results.VAL_FIELDS and header[:at + 1] == results.ROUND_FIELDS[:at + 1]
    w.add_round(_row(1, 0.5, 0.6), None)
    w.add_round(_row(2, 0.6, 0.7, m_x=3), None)
    assert _read(w.dir / "rounds.csv")[1]["m_x"] == "3" and _read(w.dir / "rounds.csv")[0]["m_x"] == ""
    assert json.loads((w.dir / "config.json").read_text())["val-fraction"] == 0.2
    plain = ResultsWriter(_cfg(tmp_path, **{"run-name": "p"}))
    assert (plain.dir / "rounds.csv").read_text().splitlines()[0].split(",") == results.ROUND_FIELDS


def test_client_rows_carry_each_clients_validation_score_where_it_has_one(tmp_path):
    w = ResultsWriter(_cfg(tmp_path, **{"run-name": "r", "val-fraction": 0.2}))
    w.add_round(_row(3, 0.5), {"client-pids": [0, 1], "client-acc": [0.4, 0.6], "client-n": [10, 20],
                               "client-val-pids": [1], "client-val-acc": [0.7], "client-val-n": [5]},
                matrices={"S": [[1, 0], [0, 1]]})
    assert _read(w.dir / "clients.csv") == [
        {"round": "3", "partition_id": "0", "accuracy": "0.4", "test_samples": "10", "val_accuracy": "",
         "val_samples": ""},
        {"round": "3", "partition_id": "1", "accuracy": "0.6", "test_samples": "20", "val_accuracy": "0.7",
         "val_samples": "5"}]
    assert json.loads((w.dir / "round_matrices" / "0003.json").read_text()) == {"S": [[1, 0], [0, 1]]}


def test_label_counts_are_written_per_client_with_train_and_test_sizes(tmp_path):
    w = ResultsWriter(_cfg(tmp_path, **{"run-name": "r"}))
    train, test = np.array([[3, 0], [1, 2]]), np.array([[1, 1], [0, 0]])
    w.write_label_counts([5, 6], train, test)
    assert _read(w.dir / "label_counts.csv") == [
        {"partition_id": "5", "num_train": "3", "num_test": "2", "class_0": "4", "class_1": "1"},
        {"partition_id": "6", "num_train": "3", "num_test": "0", "class_0": "1", "class_1": "2"}]
    assert w.label_counts.tolist() == [[4, 1], [1, 2]]


def test_overwrite_replaces_the_old_folder_and_a_resume_drops_what_came_after_its_checkpoint(tmp_path):
    cfg = _cfg(tmp_path, **{"run-name": "r", "val-fraction": 0.2})
    w = ResultsWriter(cfg)
    for r in (1, 2, 3):
        w.add_round(_row(r, 0.5, 0.5), {"client-pids": [0], "client-acc": [0.5], "client-n": [4]},
                    matrices={"S": [[r]]})
    (w.dir / "placement.csv").write_text("round,phase,partition_id,node_ip,ray_node_id,host,pid\n"
                                         "1,train,0,,,h,1\n3,train,0,,,h,1\n")
    w.finish(1, [{"reason": "x"}])
    assert (w.dir / "summary.json").exists() and (w.dir / "dropped.json").exists()
    state = {"rounds": w.rounds[:1], "elapsed": 5.0}
    back = ResultsWriter(cfg, folder=w.dir, resume=state)
    assert [r["round"] for r in _read(back.dir / "clients.csv")] == ["1"]
    assert [r["round"] for r in _read(back.dir / "placement.csv")] == ["1"]
    assert [r["round"] for r in _read(back.dir / "rounds.csv")] == ["1"]
    assert sorted(p.name for p in (back.dir / "round_matrices").glob("*.json")) == ["0001.json"]
    assert not (back.dir / "summary.json").exists() and not (back.dir / "dropped.json").exists()
    assert 5.0 <= back.elapsed() < 5.0 + 600 and back.state()["rounds"] == w.rounds[:1]
    again = ResultsWriter(cfg, folder=w.dir, resume=back.state())  # a writer's own state resumes it
    assert again.elapsed() >= 5.0 and again.rounds == w.rounds[:1]
    ResultsWriter(_cfg(tmp_path, **{"run-name": "r", "overwrite": True}))
    assert not (w.dir / "round_matrices").exists() and _read(w.dir / "clients.csv") == []


def test_a_resumed_run_keeps_its_folder_even_with_overwrite_and_a_fresh_one_makes_its_parents(tmp_path):
    cfg = _cfg(tmp_path / "new" / "deeper", **{"run-name": "r", "overwrite": True})
    w = ResultsWriter(cfg)
    assert w.dir == tmp_path / "new" / "deeper" / "r" and w.elapsed() < 1.0
    w.add_round(_row(1, 0.5), {"client-pids": [0], "client-acc": [0.5], "client-n": [4]})
    back = ResultsWriter(cfg, folder=w.dir, resume=w.state())
    assert [r["round"] for r in _read(back.dir / "clients.csv")] == ["1"]


def test_a_resume_from_before_any_round_drops_every_row_and_a_run_without_validation_has_no_val_columns(tmp_path):
    cfg = _cfg(tmp_path, **{"run-name": "r"})
    w = ResultsWriter(cfg)
    assert _read_header(w.dir / "clients.csv") == results.CLIENT_FIELDS
    w.add_round(_row(1, 0.5), {"client-pids": [0], "client-acc": [0.5], "client-n": [4]}, matrices={"S": [[1]]})
    back = ResultsWriter(cfg, folder=w.dir, resume={"rounds": [], "elapsed": 0.0})
    assert _read(back.dir / "clients.csv") == [] and _read(back.dir / "rounds.csv") == []
    assert not list((back.dir / "round_matrices").glob("*.json"))


def _read_header(path):
    return path.read_text().splitlines()[0].split(",")


def test_a_cut_off_run_without_a_summary_or_placement_file_resumes(tmp_path):
    """A run cut off mid-way has no summary.json, and one from before placement.csv has none either."""
    cfg = _cfg(tmp_path, **{"run-name": "r"})
    w = ResultsWriter(cfg)
    w.add_round(_row(1, 0.5), {"client-pids": [0], "client-acc": [0.5], "client-n": [4]})
    (w.dir / "placement.csv").unlink()
    back = ResultsWriter(cfg, folder=w.dir, resume=w.state())
    assert [r["round"] for r in _read(back.dir / "clients.csv")] == ["1"] and _read(back.dir / "placement.csv") == []


def test_the_summary_counts_bytes_time_and_rounds_with_the_preparation_round_apart(tmp_path):
    w = ResultsWriter(_cfg(tmp_path, **{"run-name": "r", "val-fraction": 0.2, "seed": 3}))
    # a row without a byte column counts none: the preparation sent nothing, round 1 nothing up, 2 nothing down
    w.add_round({"round": 0, "startup_s": 2.5, "wall_s": 1.0}, None)
    w.add_round({**_row(1, 0.5), "bytes_down": 20, "wall_s": 9.0, "startup_s": 4.0, "eval_clients": 3}, None)
    w.add_round({**_row(2, 0.6), "bytes_up": 30, "wall_s": 2.0, "eval_clients": 2}, None)
    w.add_round({**_row(3, 0.7), "bytes_up": 50, "bytes_down": 60, "wall_s": 4.0, "eval_clients": 1}, None)
    s = w.finish(4, [], status="stopped")
    assert {k: s[k] for k in ("method", "dataset", "partition", "model", "seed", "val_fraction")} == \
        {"method": "fedavg", "dataset": "digits", "partition": w.cfg["partition"], "model": w.cfg["model"],
         "seed": 3, "val_fraction": 0.2}
    assert (s["rounds"], s["final_round"], s["final_eval_clients"], s["num_clients"]) == (3, 3, 1, 4)
    assert (s["bytes_up"], s["bytes_down"], s["bytes_prepare"]) == (80, 80, 0)
    assert (s["bytes_up_per_round"], s["bytes_down_per_round"]) == (pytest.approx(80 / 3), pytest.approx(80 / 3))
    assert (s["startup_s"], s["first_round_s"], s["wall_s_per_round"]) == (2.5, 9.0, 3.0)
    assert (s["final_acc"], s["dropped_replies"], s["status"]) == (0.7, 0, "stopped")
    assert json.loads((w.dir / "summary.json").read_text()) == s and not (w.dir / "dropped.json").exists()
    assert (s["results_dir"], s["startup_from"]) == (str(w.dir), "ServerApp start") and s["wall_s"] >= 0


def test_dropped_replies_are_written_whatever_their_values_and_plots_when_asked(tmp_path):
    w = ResultsWriter(_cfg(tmp_path, **{"run-name": "r", "plots": True}))
    w.add_round({**_row(1, 0.5), "wall_s": 9.0}, None)
    w.add_round({**_row(2, 0.6)}, None)  # a round that recorded no time counts none
    w.add_round({**_row(3, 0.6), "wall_s": 4.0}, None)
    dropped = [{"round": 1, "client": "node 7", "reason": "x"}, {"round": 2, "client": 3, "where": tmp_path}]
    s = w.finish(3, dropped)
    assert s["dropped_replies"] == 2 and s["wall_s_per_round"] == 2.0 and s["first_round_s"] == 9.0
    assert json.loads((w.dir / "dropped.json").read_text()) == [dropped[0], {**dropped[1], "where": str(tmp_path)}]
    assert (w.dir / "accuracy.png").exists()


def test_a_one_round_run_has_its_round_as_the_steady_state_and_no_rounds_has_none(tmp_path):
    w = ResultsWriter(_cfg(tmp_path, **{"run-name": "r"}))
    w.add_round({"round": 0, "bytes_up": 7, "bytes_down": 3}, None)
    w.add_round({"round": 1, "wall_s": 6.0, "bytes_up": 10, "bytes_down": 20}, None)  # its evaluation failed
    s = w.finish(2, [])
    assert (s["first_round_s"], s["wall_s_per_round"], s["startup_s"]) == (6.0, 6.0, None)
    assert (s["bytes_prepare"], s["bytes_up_per_round"], s["bytes_down_per_round"]) == (10, 10.0, 20.0)
    assert (s["final_acc"], s["final_eval_clients"], s["status"]) == (None, 0, "completed")
    empty = ResultsWriter(_cfg(tmp_path, **{"run-name": "e"})).finish(2, [])
    assert (empty["rounds"], empty["final_round"], empty["first_round_s"], empty["wall_s_per_round"]) == \
        (0, None, None, 0.0)
    assert empty["bytes_up_per_round"] == 0.0


def test_a_sampled_evaluation_round_is_never_best_nor_in_the_last_ten_mean():
    rows = [_row(1, 0.5, 0.5), _row(2, 0.99, 0.99, sampled_eval=1), _row(3, 0.6, 0.4)]
    got = accuracy_summary(rows, final_round=3)
    assert (got["best_round"], got["best_val_round"], got["last10_acc"]) == (3, 1, pytest.approx(0.55))
    assert results.complete_rounds(rows) == [rows[0], rows[2]]
    assert results.complete_rounds([_row(1, 0.5, sampled_eval="")]) != []  # an empty cell is a complete round


def test_a_rounds_validation_columns_come_from_the_strategys_evaluation_metrics():
    assert results.validation_columns(None) == {} and results.validation_columns({"acc": 0.5}) == {}
    assert results.validation_columns({"val-acc-weighted": 0.6, "val-acc-client-mean": 0.5, "val-loss": 1.2}) == \
        {"val_acc_weighted": 0.6, "val_acc_client_mean": 0.5, "val_loss": 1.2}


def test_placement_rows_name_where_each_reply_was_computed_in_partition_order(tmp_path):
    from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.app.error import Error
    from flwr.supercore.task_identity import TaskIdentity

    from fedcore import wire

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    asked = Message(RecordDict(), dst_node_id=5, message_type="train")

    def reply(pid, where=True, metrics=True):
        content = {}
        if metrics:
            content[wire.METRICS] = MetricRecord({wire.PARTITION_ID: pid})
        if where:
            content[wire.PLACEMENT] = ConfigRecord({"host": f"h{pid}", "pid": 100 + pid, "node-ip": "10.0.0.1",
                                                    "ray-node-id": "r"})
        return Message(RecordDict(content), reply_to=asked)

    w = ResultsWriter(_cfg(tmp_path, **{"run-name": "r"}))
    w.add_placement(4, "train", [reply(2), reply(1), reply(3, where=False), reply(5, metrics=False),
                                 Message(Error(code=0, reason="x"), reply_to=asked)])
    assert _read(w.dir / "placement.csv") == [
        {"round": "4", "phase": "train", "partition_id": str(p), "node_ip": "10.0.0.1", "ray_node_id": "r",
         "host": f"h{p}", "pid": str(100 + p)} for p in (1, 2)]
    w.add_placement(5, "evaluate", [reply(3, where=False)])
    assert len(_read(w.dir / "placement.csv")) == 2
