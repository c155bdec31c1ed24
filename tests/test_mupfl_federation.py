"""MuPFL in a federation: module switches, client state across rounds, malformed replies,
checkpoints, the presets and the real ``flwr run``; plus the comparison's rounds-to-target column."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from fedcore import wire
from tests.conftest import run_inprocess, test_device

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"model": "mupflcnn", "partition": "longtail-dirichlet", "longtail-dirichlet.alpha": 1.0,
         "client-threads": 1, "mupfl.features-per-class": 4, "mupfl.head-epochs": 2, "mupfl.match-steps": 3}


def _run(tmp_path, name, num_clients=3, faults=None, **overrides):
    config = {**SMALL, "method": "mupfl", "run-name": name, **overrides}
    config = {k: v for k, v in config.items() if v is not None}
    summary, grid = run_inprocess(tmp_path, num_clients, faults, **config)
    with open(tmp_path / "results" / name / "rounds.csv") as f:
        return summary, list(csv.DictReader(f)), grid


def _columns(rows, *names):
    return [[r[c] for c in names] for r in rows]


def test_all_modules_off_is_fedavg(tmp_path):
    """BAVD, ACMU and PKCF off (and no lr decay): the same local training and global model as FedAvg,
    so every round's training loss is identical."""
    _, mupfl, _ = _run(tmp_path, "off", **{"mupfl.bavd": False, "mupfl.acmu": False, "mupfl.pkcf": False,
                                          "mupfl.lr-decay": 1.0})
    _, fedavg, _ = _run(tmp_path, "fedavg", method="fedavg", **{k: None for k in SMALL if k.startswith("mupfl.")})
    assert _columns(mupfl, "train_loss") == _columns(fedavg, "train_loss")
    assert float(mupfl[1]["bytes_up"]) == pytest.approx(float(fedavg[1]["bytes_up"]), rel=1e-3)


@pytest.mark.parametrize("off,equivalent", [
    ({"mupfl.pkcf": False}, {"mupfl.head-epochs": 0}),   # PKCF off = no classifier pre-training
    ({"mupfl.acmu": False}, {"mupfl.clusters": 3}),      # ACMU off = every client its own cluster
])
def test_switching_a_module_off_gives_the_run_without_it(tmp_path, off, equivalent):
    _, a, _ = _run(tmp_path, "a", **off)
    _, b, _ = _run(tmp_path, "b", **equivalent)
    columns = ("acc_weighted", "acc_client_mean", "loss", "train_loss")
    assert _columns(a, *columns) == _columns(b, *columns)
    _, full, _ = _run(tmp_path, "full")
    assert _columns(full, *columns) != _columns(a, *columns)  # and the module does change the run


def test_client_state_keeps_maps_and_counters_across_rounds_and_metrics_reach_rounds_csv(tmp_path):
    from clients.mupfl import BAVD_COUNTERS, BAVD_MAPS

    summary, rows, grid = _run(tmp_path, "state", **{"num-server-rounds": 2, "batch-size": 16})
    assert summary["final_acc"] > 0.2 and summary["dropped_replies"] == 0
    assert [r["state_round_min"] for r in rows] == ["0", "1"] and [r["state_lost"] for r in rows] == ["0", "0"]
    for r in rows:
        assert 1 <= float(r["m_clusters"]) <= 2 and 0 <= float(r["m_match_loss"]) <= 2
        assert 0 < float(r["m_bavd_keep"]) <= 1
    labels = json.loads((tmp_path / "results" / "state" / "round_matrices" / "0002.json").read_text())["clusters"]
    assert labels[0] == [0, 1, 2]
    from clients.data import load_client_data
    from fedcore.config import Config

    cfg = Config.from_run_config({**SMALL, "method": "mupfl", "dataset": "digits", "batch-size": 16,
                                  "val-fraction": 0.0})  # as the run (small_config)
    for context in grid.contexts.values():
        maps = wire.unpack_arrays(context.state.array_records[BAVD_MAPS])
        assert list(maps) == ["0", "1"] and tuple(maps["0"].shape) == (8, 8) and tuple(maps["1"].shape) == (4, 4)
        # lambda counts on across rounds: two rounds of one epoch each
        data = load_client_data(cfg, context.node_config["partition-id"], 3, test_device())
        assert context.state.config_records[BAVD_COUNTERS]["steps"] == 2 * int(np.ceil(data.num_train / 16))


def test_round_one_matching_at_the_default_steps_halves_the_loss_and_rounds_csv_has_both_columns(tmp_path):
    """#27: rounds.csv carries match-loss-before and match-loss every round; at the default matching
    (steps, step size, optimiser) the loss falls at least by half in round 1 and stays low after."""
    from fedcore.methods.mupfl import HPARAMS

    defaults = {f"mupfl.{k}": HPARAMS[k].default for k in ("match-steps", "match-lr", "match-optimizer")}
    _, rows, _ = _run(tmp_path, "match", **{**defaults, "num-server-rounds": 2, "batch-size": 32})
    before, after = ([float(r[c]) for r in rows] for c in ("m_match_loss_before", "m_match_loss"))
    assert before[0] > 0.3 and after[0] <= 0.5 * before[0]
    assert after[1] <= 0.5 * before[0]


def test_a_malformed_reply_is_dropped_and_the_run_goes_on(tmp_path):
    from fedcore import wire
    from fedcore.methods.mupfl import GRADIENTS

    def corrupt(request, reply):
        config = request.content.config_records["config"]
        if config["phase"] == "train" and config["server-round"] == 1 and not reply.has_error():
            pid = reply.content.metric_records["metrics"]["partition-id"]
            arrays = wire.unpack_arrays(reply.content[GRADIENTS])
            if pid == 1:  # a present flag that is not 0/1
                reply.content[GRADIENTS] = wire.pack_arrays({"z": arrays["z"], "present": arrays["present"] * 2 + 1})
            if pid == 2:  # a gradient matrix of the wrong width
                reply.content[GRADIENTS] = wire.pack_arrays({"z": arrays["z"][:, :-1], "present": arrays["present"]})
        return reply

    summary, rows, _ = _run(tmp_path, "bad", faults=corrupt)
    assert summary["status"] == "completed" and rows[0]["dropped"] == "2" and rows[1]["dropped"] == "0"
    reasons = [d["reason"] for d in json.loads((tmp_path / "results" / "bad" / "dropped.json").read_text())]
    assert any("present must hold only 0 and 1" in r for r in reasons)
    assert any("class-gradients/z has shape" in r for r in reasons)


def test_strategy_state_round_trips_through_a_checkpoint():
    from tests.test_mupfl import _strategy_and_replies

    strategy, replies = _strategy_and_replies(pretrained=True)
    strategy.aggregate(1, replies)
    state = strategy.state_dict()
    fresh, _ = _strategy_and_replies(pretrained=False)
    fresh.load_state_dict(state)
    assert fresh.has_features and np.array_equal(fresh.features, strategy.features)
    assert all(np.array_equal(fresh.global_weights[k], v) for k, v in strategy.global_weights.items())
    strategy.aggregate(2, replies)
    fresh.aggregate(2, replies)
    assert np.array_equal(fresh.features, strategy.features)
    assert all(np.array_equal(fresh.global_weights[k], v) for k, v in strategy.global_weights.items())


def test_presets_are_valid_run_configs():
    from fedcore.config import Config
    from runner.compare_presets import entries, load_preset

    presets = sorted(ROOT.glob("conf/mupfl*.toml")) + sorted(ROOT.glob("conf/mupfl-paper/*.toml"))
    assert len(presets) >= 14
    for path in presets:
        spec = load_preset(path)
        for entry in entries(spec):
            Config.from_run_config({**spec.get("run-config", {}), **entry.config, "method": entry.method})


def test_rounds_to_target_column(tmp_path):
    from runner.compare_presets import load_preset
    from runner.compare_rows import rounds_to_target, target_row
    from runner.compare_table import write_table

    path = tmp_path / "rounds.csv"
    path.write_text("round,acc_weighted,eval_x\n1,0.5,0.1\n2,,\n3,0.91,0.2\n4,0.89,0.95\n")
    assert rounds_to_target(path, "acc_weighted", 0.9) == 3
    assert rounds_to_target(path, "eval_x", 0.9) == 4
    assert rounds_to_target(path, "acc_weighted", 0.95) is None
    rows = [{"method": m, "final_acc": 0.9, "final_acc_std": 0.0, "client_acc_mean": 0.9, "client_acc_mean_std": 0,
             "best_acc": 0.9, "best_acc_std": 0, "best_client_acc_mean": 0.9, "best_client_acc_mean_std": 0, "last10_acc": 0.9, "last10_acc_std": 0, "mb_up_per_round": 1,
             "mb_down_per_round": 1, "wall_s_per_round": 1, "seeds": 3, "client_acc_std_within": 0,
             **target_row(r)} for m, r in (("a", [3, 5, 4]), ("b", [10, None, 12]), ("c", [None, None, None]))]
    write_table(rows, tmp_path, {"compare": {"target-acc": 0.9}}, [])
    table = (tmp_path / "table.md").read_text()
    assert "rounds to 90% |" in table
    assert "| 4.0 ± 1.0 |" in table and "| 11.0 ± 1.4 (2 of 3 runs) |" in table and "| not reached |" in table
    with open(tmp_path / "table.csv") as f:
        got = {r["method"]: r for r in csv.DictReader(f)}
    assert float(got["a"]["rounds_to_target"]) == 4.0 and got["b"]["runs_reaching_target"] == "2/3"
    write_table(rows[:1], tmp_path, {"compare": {}}, [])  # without a target: no column
    assert "rounds to" not in (tmp_path / "table.md").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text('[compare]\nmethods = ["fedavg"]\ntarget-acc = 90\n')
    with pytest.raises(SystemExit, match="target-acc"):
        load_preset(bad)


@pytest.mark.long  # a real flwr run / SuperLink: make test-long
def test_flwr_run_smoke(tmp_path):
    from runner.launch import simulate

    config = {**SMALL, "method": "mupfl", "dataset": "digits", "num-server-rounds": 2, "results-dir": str(tmp_path),
              "run-name": "flwr", "mupfl.match-steps": 100}  # the default matching: round 1 halves its loss
    result = simulate(config, supernodes=2, app_dir=ROOT, stream=False, timeout=600, flwr_home=tmp_path / "home")
    assert result["status"] == "finished:completed", result
    with open(tmp_path / "flwr" / "rounds.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(r["m_clusters"] and r["m_match_loss"] for r in rows)
    assert float(rows[0]["m_match_loss"]) <= 0.5 * float(rows[0]["m_match_loss_before"])
    assert rows[1]["state_round_min"] == "1"
