"""A real deployment on loopback: flower-superlink + 2 flower-supernode processes + flwr run."""

from pathlib import Path

from server_app.deploy_local import deploy

ROOT = Path(__file__).resolve().parents[1]


def test_superlink_and_supernodes_run_the_app(tmp_path):
    result = deploy({"method": "fedper", "dataset": "digits", "num-server-rounds": 1, "node-wait-s": 60,
                     "results-dir": str(tmp_path / "results"), "run-name": "deployed"},
                    supernodes=2, app_dir=ROOT, workdir=tmp_path / "deploy", timeout=600)
    assert result["status"] == "finished:completed", result
    assert result["summary"]["num_clients"] == 2 and result["summary"]["final_acc"] is not None
