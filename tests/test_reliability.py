"""Reliability: hostile or broken replies never poison the server, runs resume exactly, results are honest."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, RecordDict

from fedcore import wire
from fedcore.config import Config
from fedcore.registry import REGISTRY
from runner.inprocess import InProcessGrid, run_inprocess
from tests import toy_method
from tests.conftest import long_but, small_config


def _rows(summary) -> list[dict]:
    with open(f"{summary['results_dir']}/rounds.csv") as f:
        return list(csv.DictReader(f))


def _untimed(row: dict) -> dict:
    """A rounds.csv row without its timings, which differ between any two runs."""
    return {k: v for k, v in row.items() if k not in ("wall_s", "eval_s", "startup_s")}


def _scale_client(pid: int, rnd: str, factor: float):
    """A fault hook: client ``pid``'s float arrays in round ``rnd`` multiplied by ``factor``."""
    def hook(msg, reply):
        if (msg.metadata.message_type != "train" or msg.metadata.group_id != rnd or reply.has_error()
                or reply.content[wire.METRICS][wire.PARTITION_ID] != pid):
            return reply
        content = {}
        for name, record in reply.content.items():
            if isinstance(record, ArrayRecord):
                record = wire.pack_arrays({k: v * factor if v.dtype.kind == "f" else v
                                           for k, v in wire.unpack_arrays(record).items()})
            content[name] = record
        return Message(RecordDict(content), reply_to=msg)
    return hook


@pytest.mark.parametrize("method", ["fedavg", "fedper", "ditto", "fedproto"])
@pytest.mark.parametrize("factor,reason", [(1e30, "overflows"), (1e6, "reply-norm-bound")])
def test_one_client_with_huge_values_cannot_poison_the_run(tmp_path, method, factor, reason):
    summary, _ = run_inprocess(small_config(tmp_path, method=method, **{"num-server-rounds": 3}), 3,
                               faults=_scale_client(1, "1", factor))
    dropped = json.load(open(f"{summary['results_dir']}/dropped.json"))
    assert len(dropped) == 1 and dropped[0]["client"] == 1 and reason in dropped[0]["reason"], dropped
    assert [r["dropped"] for r in _rows(summary)] == ["1", "0", "0"]  # later rounds are clean again

    def lose(msg, reply):  # the same reply simply lost on the way
        hit = msg.metadata.message_type == "train" and msg.metadata.group_id == "1"
        return None if hit and reply.content[wire.METRICS][wire.PARTITION_ID] == 1 else reply

    lost, _ = run_inprocess(small_config(tmp_path, method=method, **{"num-server-rounds": 3, "run-name": "lost"}), 3,
                            faults=lose)
    assert summary["final_acc"] is not None and summary["final_acc"] == lost["final_acc"]


def test_norm_bound_can_be_switched_off_and_uses_the_state_when_few_reply(tmp_path):
    summary, _ = run_inprocess(small_config(tmp_path, method="fedavg", **{"reply-norm-bound": 0.0}), 2,
                               faults=_scale_client(1, "1", 1e6))
    assert _rows(summary)[0]["dropped"] == "0"  # off: accepted in round 1 (and the model is ruined, as asked)
    summary, _ = run_inprocess(small_config(tmp_path, method="fedavg", **{"run-name": "on"}), 2,
                               faults=_scale_client(1, "1", 1e6))
    assert summary["dropped_replies"] == 1  # two replies: the median is the honest one, the state agrees


def test_fedproto_round_one_width_mismatch_is_dropped_not_a_crash(tmp_path):
    def narrow(msg, reply):
        if msg.metadata.message_type == "train" and reply.content[wire.METRICS][wire.PARTITION_ID] == 2:
            ids, feats, counts = wire.unpack_class_features(reply.content[wire.CLASS_FEATURES])
            return Message(RecordDict({wire.CLASS_FEATURES: wire.pack_class_features(ids, feats[:, :7], counts),
                                       wire.METRICS: reply.content[wire.METRICS]}), reply_to=msg)
        return reply

    summary, _ = run_inprocess(small_config(tmp_path, method="fedproto"), 3, faults=narrow)
    dropped = json.load(open(f"{summary['results_dir']}/dropped.json"))
    assert {d["round"] for d in dropped} == {1, 2} and all("feature dimension 7" in d["reason"] for d in dropped)


def test_a_client_cannot_inflate_its_weight_or_its_accuracy(tmp_path):
    def inflate(msg, reply):
        if reply.has_error() or reply.content[wire.METRICS][wire.PARTITION_ID] != 0:
            return reply
        metrics = dict(reply.content[wire.METRICS])
        if msg.metadata.message_type == "train":
            metrics[wire.NUM_EXAMPLES] = 10 ** 9
        else:
            metrics[wire.CORRECT] = metrics[wire.NUM_EXAMPLES] + 5
        content = {k: v for k, v in reply.content.items() if k != wire.METRICS}
        from flwr.app import MetricRecord
        return Message(RecordDict({**content, wire.METRICS: MetricRecord(metrics)}), reply_to=msg)

    summary, _ = run_inprocess(small_config(tmp_path, method="fedavg"), 3, faults=inflate)
    reasons = [d["reason"] for d in json.load(open(f"{summary['results_dir']}/dropped.json"))]
    assert any("num-examples 1000000000 is outside" in r for r in reasons)
    assert any("correct =" in r and "is outside" in r for r in reasons)
    assert all(r["eval_clients"] == "2" for r in _rows(summary))


def test_a_non_finite_server_state_stops_the_run(tmp_path, monkeypatch):
    from fedstrategies.base import ServerStateError
    from fedstrategies.fedavg import FedAvgStrategy

    def poisoned(self, server_round, replies):
        self.global_weights = {k: np.full_like(v, np.nan) for k, v in self.global_weights.items()}

    monkeypatch.setattr(FedAvgStrategy, "aggregate", poisoned)
    with pytest.raises(ServerStateError, match="global_weights holds NaN or Inf after round 1"):
        run_inprocess(small_config(tmp_path, method="fedavg"), 2)


# ------------------------------------------------------------------ honest results
def test_a_run_name_is_never_reused_silently(tmp_path):
    from server_app.results import RunFolderError

    first, _ = run_inprocess(small_config(tmp_path, method="fedavg", **{"num-server-rounds": 1}), 2,
                             faults=_scale_client(1, "1", 1e30))
    folder = first["results_dir"]
    assert (tmp_path / "results" / "test-run" / "dropped.json").exists()
    with pytest.raises(RunFolderError, match="already holds a run"):
        run_inprocess(small_config(tmp_path, method="local", **{"num-server-rounds": 1}), 2)
    second, _ = run_inprocess(small_config(tmp_path, method="local", overwrite=True, **{"num-server-rounds": 1}), 2)
    assert second["results_dir"] == folder and second["method"] == "local"
    assert not (tmp_path / "results" / "test-run" / "dropped.json").exists()  # nothing of the old run survives
    assert json.load(open(f"{folder}/summary.json"))["method"] == "local"


def test_final_accuracy_is_the_last_rounds_or_none(tmp_path):
    def lose_last_evaluation(msg, reply):
        return None if msg.metadata.message_type == "evaluate" and msg.metadata.group_id == "2" else reply

    summary, _ = run_inprocess(small_config(tmp_path, method="fedavg"), 3, faults=lose_last_evaluation)
    assert summary["final_acc"] is None and summary["final_eval_clients"] == 0 and summary["best_acc"] is not None
    assert summary["final_round"] == 2


# ------------------------------------------------------------------ injected faults
def _plan(config: dict, rounds: int, clients: int) -> set[tuple[int, int]]:
    from clients.faults import fault_for

    cfg = Config.from_run_config(config)
    return {(pid, r) for r in range(1, rounds + 1) for pid in range(clients) if fault_for(cfg, pid, clients, r)}


# each kind of payload the fault kinds damage (models, prototypes alone, metrics alone, a pairwise graph, round 0's
# features) and the method without train messages; `make test-long` runs every method
FAULTS_FAST = ("fedavg", "fedproto", "local", "majority", "fedsac", "mupfl")


@pytest.mark.parametrize("method", long_but(sorted(REGISTRY), FAULTS_FAST))
def test_injected_faults_equal_lost_replies_for_every_method(tmp_path, method):
    """30% of clients return NaN, wrong shapes, missing records, wrong ids or huge values every round:
    every bad reply is dropped with its reason, and the run ends exactly as if those replies had been
    lost on the way (so no aggregate holds a value from a bad reply)."""
    kinds = "nan,shape,missing,wrong-pid,huge,overflow"
    faulty = small_config(tmp_path, method=method, **{"num-server-rounds": 2, "faults.share": 0.3,
                                                      "faults.kinds": kinds, "run-name": "faulty"})
    plan = _plan(faulty, 2, 5)
    got, _ = run_inprocess(faulty, 5)

    def lose(msg, reply):
        if msg.metadata.message_type != "train":
            return reply
        pid = reply.content[wire.METRICS][wire.PARTITION_ID]
        return None if (pid, int(msg.metadata.group_id)) in plan else reply

    expected, _ = run_inprocess(small_config(tmp_path, method=method, **{"num-server-rounds": 2, "run-name": "lost"}),
                                5, faults=lose)
    columns = ("acc_weighted", "acc_client_mean", "loss", "train_loss", "replies")
    if not any(int(r["replies"]) for r in _rows(expected)):  # no train messages: nothing to fault
        assert not os.path.exists(f"{got['results_dir']}/dropped.json")
        assert [[r[c] for c in columns] for r in _rows(got)] == [[r[c] for c in columns] for r in _rows(expected)]
        return
    dropped = json.load(open(f"{got['results_dir']}/dropped.json"))
    assert len(dropped) == len(plan) == 4  # ceil(0.3 * 5) = 2 clients per round
    assert not any("no reply" in d["reason"] for d in dropped)
    assert [[r[c] for c in columns] for r in _rows(got)] == [[r[c] for c in columns] for r in _rows(expected)]


def test_raising_and_hanging_clients_are_reported(tmp_path):
    config = small_config(tmp_path, method="fedavg", **{"faults.share": 0.5, "faults.kinds": "raise",
                                                        "num-server-rounds": 2})
    summary, _ = run_inprocess(config, 4)
    dropped = json.load(open(f"{summary['results_dir']}/dropped.json"))
    assert len(dropped) == 4 and all("injected fault: the client raised" in d["reason"] for d in dropped)
    with pytest.raises(Exception, match="faults.kinds"):
        Config.from_run_config({"faults.kinds": "nan,explode"})


# ------------------------------------------------------------------ checkpoint and resume
class Crash(Exception):
    """Stands for the server process being killed."""


# round 0 and client optimiser state (toy), a global model, evaluation alone, cluster state and a pairwise graph on the
# server, prototypes; tests/test_checkpoints.py round-trips every method's state, `make test-long` resumes every method
RESUME_FAST = ("toy", "fedavg", "majority", "cfl", "fedsac", "fedproto")


@pytest.mark.parametrize("method", long_but(sorted(REGISTRY) + ["toy"], RESUME_FAST))
def test_an_interrupted_run_resumes_to_the_same_result(tmp_path, method, monkeypatch):
    """Every method, and the toy one (round 0, optimiser state on the clients): killed in round 2 of 3
    and resumed from its checkpoint file, the run's every per-round number but its timings is the
    uninterrupted run's."""
    from clients.app import app as client_app
    from server_app.app import run_experiment

    monkeypatch.setitem(REGISTRY, "toy", toy_method.METHOD)
    rounds = 3  # round 1 is checkpointed, round 2 is cut short, round 3 follows a resumed round
    whole, _ = run_inprocess(small_config(tmp_path, method=method, **{"num-server-rounds": rounds,
                                                                       "run-name": "whole"}), 3)
    config = small_config(tmp_path, method=method, **{"num-server-rounds": rounds, "run-name": "cut"})

    def kill_mid_round_2(msg, reply):  # the server dies in round 2 (in training; majority only evaluates)
        if msg.metadata.message_type in ("train", "evaluate") and msg.metadata.group_id == "2":
            raise Crash()
        return reply

    with pytest.raises(Crash):
        run_experiment(InProcessGrid(client_app, 3, config, faults=kill_mid_round_2), Config.from_run_config(config))
    resumed = run_experiment(InProcessGrid(client_app, 3, {**config, "resume": True}),  # fresh clients, no state
                             Config.from_run_config({**config, "resume": True}))
    assert [_untimed(r) for r in _rows(resumed)] == [_untimed(r) for r in _rows(whole)]
    for key in ("final_acc", "best_acc", "client_acc_std", "bytes_up", "bytes_down", "dropped_replies"):
        assert resumed[key] == whole[key], key
    with open(f"{resumed['results_dir']}/clients.csv") as f:
        assert len(list(csv.DictReader(f))) == rounds * 3  # no duplicate or missing rows


def test_resume_refuses_another_experiment_or_nothing_to_resume(tmp_path):
    from server_app.app import StartupError
    from server_app.results import RunFolderError

    with pytest.raises(RunFolderError, match="no checkpoints"):
        run_inprocess(small_config(tmp_path, method="fedavg", resume=True), 2)
    run_inprocess(small_config(tmp_path, method="fedavg"), 2)
    with pytest.raises(StartupError, match="differs from the checkpoint's in lr"):
        run_inprocess(small_config(tmp_path, method="fedavg", resume=True, lr=0.5), 2)
    with pytest.raises(StartupError, match="nothing left to do"):
        run_inprocess(small_config(tmp_path, method="fedavg", resume=True), 2)
    more, _ = run_inprocess(small_config(tmp_path, method="fedavg", resume=True, **{"num-server-rounds": 3}), 2)
    assert more["rounds"] == 3  # a finished run can be extended


def test_checkpoints_are_atomic_and_pruned(tmp_path):
    from server_app import checkpoints

    for r in range(1, 5):
        checkpoints.save(tmp_path, r, {"x": r}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["round-00003.ckpt", "round-00004.ckpt"]
    (tmp_path / "checkpoints" / "round-00004.ckpt").write_bytes(b"\x80\x05truncated")
    assert checkpoints.latest(tmp_path)["round"] == 3  # a damaged newest file falls back to the one before
