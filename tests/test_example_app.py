"""examples/fedsac-in-your-app: FedSaC's strategy and client in a Flower App of the user's own, with its data
and model defined in the app. Its wiring runs in process here (fast); the real ``flwr run`` is marked long."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from fedcore.config import pyproject_run_config
from tests.conftest import test_device

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fedsac-in-your-app"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def example(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return EXAMPLE


def run_config(tmp_path, **overrides) -> dict:
    return {**pyproject_run_config(EXAMPLE), "num-server-rounds": 2, "results-dir": str(tmp_path / "results"),
            "run-name": "example", "node-wait-s": 0, "device": test_device(), "server-device": test_device(),
            **overrides}


def test_the_example_is_small_and_its_own_app():
    lines = [line for f in EXAMPLE.rglob("*.py") for line in f.read_text().splitlines() if line.strip()]
    assert len(lines) < 100
    config = pyproject_run_config(EXAMPLE)
    assert config["method"] == "fedsac" and config["dataset"].startswith("py:fedsac_app.")
    assert config["model"].startswith("fedsac_app.")
    server = ast.parse((EXAMPLE / "fedsac_app" / "server_app.py").read_text())
    assert any(isinstance(n, ast.Attribute) and n.attr == "start" for n in ast.walk(server))  # Flower's own loop


def test_the_examples_server_and_client_apps_run_two_rounds_in_process(example, tmp_path):
    from fedsac_app import client_app, server_app

    from runner.inprocess import InProcessGrid

    config = run_config(tmp_path)
    grid = InProcessGrid(client_app.app, 4, config)
    final = server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config))
    assert final["eval-clients"] == 4 and 0.25 < final["acc-weighted"] <= 1  # four classes: better than chance
    trained = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(trained) == 2 * 4  # every client trained in both rounds


def test_the_examples_data_and_model_load_through_pfl_flower(example):
    from fedcore.models import build_model
    from partitions import load_dataset

    ds = load_dataset("py:fedsac_app.task:stripes", num_clients=4, seed=0)
    assert ds.x.shape == (800, 1, 8, 8) and ds.num_classes == 4
    model = build_model("fedsac_app.task:small_cnn", ds.input_shape, ds.num_classes)
    assert model.feature_dim == 32


@pytest.mark.long
def test_flwr_run_of_the_example(tmp_path, monkeypatch):
    """``flwr run`` of the example through the launcher (a private SuperLink and Ray head) for two rounds."""
    import os

    from runner.launch import simulate

    root = str(EXAMPLE.parent.parent)  # pfl-flower itself, for the Ray workers that import it
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH", "")])))
    out = simulate({"num-server-rounds": 2, "results-dir": str(tmp_path / "results"), "run-name": "example"},
                   supernodes=3, app_dir=EXAMPLE, stream=False, timeout=600, flwr_home=tmp_path / "flwr-home")
    assert out["status"] == "finished:completed", out

