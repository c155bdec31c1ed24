"""The real thing: `flwr run` on Flower's Ray simulation engine, judged by `flwr ls`, not by exit code."""

import json
from pathlib import Path

from server_app.launch import simulate

ROOT = Path(__file__).resolve().parents[1]


def test_flwr_run_simulation_completes_and_writes_results(tmp_path):
    result = simulate({"method": "fedavg", "dataset": "digits", "num-server-rounds": 2,
                       "results-dir": str(tmp_path), "run-name": "smoke"},
                      supernodes=2, app_dir=ROOT, stream=False, timeout=600, flwr_home=tmp_path / "flwr-home")
    assert result["status"] == "finished:completed", result
    summary = json.loads((tmp_path / "smoke" / "summary.json").read_text())
    assert summary["num_clients"] == 2 and summary["rounds"] == 2 and summary["final_acc"] is not None


def test_a_failing_server_app_is_reported_as_failed(tmp_path):
    """flwr run exits 0 here; the launcher must still see the failure (num-server-rounds=0 is invalid)."""
    result = simulate({"method": "fedavg", "dataset": "digits", "num-server-rounds": 0,
                       "results-dir": str(tmp_path), "run-name": "bad"},
                      supernodes=2, app_dir=ROOT, stream=False, timeout=600, flwr_home=tmp_path / "flwr-home")
    assert result["status"] == "finished:failed", result
    assert result["summary"] is None
