"""The real thing: `flwr run` on Flower's Ray simulation engine, judged by `flwr ls`, not by exit code.

The fast suite keeps one real run (the smoke test); the others start Ray and a SuperLink several times
and run in ``make test-long``."""

import csv
import json
from pathlib import Path

import pytest

from runner.launch import simulate
from tests.conftest import test_device

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, name: str, **config) -> dict:
    config = {"method": "ditto", "dataset": "digits", "num-server-rounds": 3, "results-dir": str(tmp_path),
              "run-name": name, "device": test_device(), **config}
    return simulate(config, supernodes=3, app_dir=ROOT, stream=False, timeout=600, flwr_home=tmp_path / f"home-{name}")


def _rounds(tmp_path, name: str) -> list[dict]:
    with open(tmp_path / name / "rounds.csv") as f:
        return list(csv.DictReader(f))


def test_flwr_run_smoke_keeps_client_state_and_equals_the_inprocess_engine(tmp_path):
    """One real ``flwr run`` (Ray, a SuperLink, 3 simulated clients, 2 rounds of Ditto): it completes, client
    state survives between rounds, and its numbers are the in-process engine's, to the last digit."""
    result = _run(tmp_path, "smoke", **{"num-server-rounds": 2})
    assert result["status"] == "finished:completed", result
    rows = _rounds(tmp_path, "smoke")
    assert [r["state_round_min"] for r in rows] == ["0", "1"] and [r["state_lost"] for r in rows] == ["0", "0"]
    from runner.inprocess import run_inprocess

    config = {"method": "ditto", "dataset": "digits", "num-server-rounds": 2, "results-dir": str(tmp_path),
              "run-name": "inprocess", "client-threads": 1, "node-wait-s": 0, "device": test_device()}
    run_inprocess(config, 3)
    columns = ("acc_weighted", "acc_client_mean", "loss", "train_loss")
    assert [[r[c] for c in columns] for r in _rounds(tmp_path, "inprocess")] == [[r[c] for c in columns] for r in rows]


@pytest.mark.long
def test_flwr_run_keeps_client_state_and_repeats_exactly_with_the_same_seed(tmp_path):
    """Ditto keeps a personal model in context.state and averages a global one: under Ray the state
    survives across rounds, and the same seed gives identical accuracies and losses (replies are
    aggregated in partition-id order, whatever order they arrive in); another seed does not."""
    results = {name: _run(tmp_path, name, seed=seed) for name, seed in (("a", 0), ("b", 0), ("c", 1))}
    for name, result in results.items():
        assert result["status"] == "finished:completed", result
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["num_clients"] == 3 and summary["rounds"] == 3 and summary["final_acc"] is not None
    rows = {name: _rounds(tmp_path, name) for name in results}
    assert [r["state_round_min"] for r in rows["a"]] == ["0", "1", "2"]  # each round starts from the last one's state
    assert [r["state_lost"] for r in rows["a"]] == ["0", "0", "0"]
    columns = ("acc_weighted", "acc_client_mean", "loss", "train_loss")
    same = [[r[c] for c in columns] for r in rows["a"]] == [[r[c] for c in columns] for r in rows["b"]]
    assert same, (rows["a"], rows["b"])
    assert [r["train_loss"] for r in rows["a"]] != [r["train_loss"] for r in rows["c"]]
    # the in-process engine (comparison presets with engine = "inprocess") gives the very same numbers
    from runner.inprocess import run_inprocess

    config = {"method": "ditto", "dataset": "digits", "num-server-rounds": 3, "results-dir": str(tmp_path),
              "run-name": "inprocess", "client-threads": 1, "node-wait-s": 0, "device": test_device()}
    run_inprocess(config, 3)
    inproc = [[r[c] for c in columns] for r in _rounds(tmp_path, "inprocess")]
    assert inproc == [[r[c] for c in columns] for r in rows["a"]]


@pytest.mark.long
def test_the_fast_runtime_gives_stock_flowers_results(tmp_path):
    """The fast runtime is the launcher's default because it changes when waits end, never what is computed:
    the same run on Flower as shipped (runtime='flower', no patch applied) ends with the very same numbers."""
    results = {name: simulate({"method": "ditto", "dataset": "digits", "num-server-rounds": 2,
                               "results-dir": str(tmp_path), "run-name": name}, supernodes=3, app_dir=ROOT,
                              stream=False, timeout=600, flwr_home=tmp_path / f"home-{name}", runtime=name)
               for name in ("fast", "flower")}
    assert all(r["status"] == "finished:completed" for r in results.values()), results
    columns = ("acc_weighted", "acc_client_mean", "loss", "train_loss")
    fast, stock = ([[r[c] for c in columns] for r in _rounds(tmp_path, name)] for name in ("fast", "flower"))
    assert fast == stock


def test_a_bad_config_is_refused_before_flwr_run_starts():
    from fedcore.config import ConfigError

    with pytest.raises(ConfigError, match="num-server-rounds"):
        simulate({"method": "fedavg", "num-server-rounds": 0}, supernodes=2, app_dir=ROOT)


@pytest.mark.long  # a second real flwr run (Ray, a SuperLink): make test-long
def test_a_failing_server_app_is_reported_as_failed(tmp_path):
    """flwr run exits 0 here; the launcher must still see the failure: a run to resume whose checkpoints
    folder holds no readable checkpoint passes the config check and fails inside the ServerApp."""
    (tmp_path / "bad" / "checkpoints").mkdir(parents=True)
    result = simulate({"method": "fedavg", "dataset": "digits", "num-server-rounds": 1, "resume": True,
                       "results-dir": str(tmp_path), "run-name": "bad"},
                      supernodes=2, app_dir=ROOT, stream=False, timeout=600, flwr_home=tmp_path / "flwr-home")
    assert result["status"] == "finished:failed", result
    assert result["summary"] is None


@pytest.mark.long
def test_a_run_flower_refuses_to_start_is_reported_at_once_not_waited_for(tmp_path):
    """`flwr run` that submits nothing (here Flower refuses a fractional CPU share) must come back with
    Flower's reason, not leave the launcher polling for a run that does not exist until the timeout."""
    result = simulate({"method": "fedavg", "dataset": "digits", "num-server-rounds": 1, "results-dir": str(tmp_path),
                       "run-name": "refused"}, supernodes=2, app_dir=ROOT, stream=False, timeout=600,
                      cpus_per_client=0.5, flwr_home=tmp_path / "home")
    assert result["status"] == "not-submitted"
    assert result["run_id"] is None and result["summary"] is None
    assert "float" in result["details"]
