"""Experiment tracking against the real libraries: a real (in-process) FedSaC run with TensorBoard and,
where the [wandb] extra is installed, W&B offline; their own readers give back the values of rounds.csv."""

from __future__ import annotations

import csv
import glob
import importlib.util
import json
import logging
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from fedcore.config import Config, ConfigError
from server_app.tracking import tag
from tests.conftest import run_inprocess

ROUNDS, EVERY = 3, 2
# found, not imported: importing wandb costs each test process about a second at collection
WANDB = "" if importlib.util.find_spec("wandb") else "the [wandb] extra is not installed (no module named 'wandb')"


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """FedSaC, 3 clients, 3 rounds, with a validation split: every tracker there is, one run."""
    tmp = tmp_path_factory.mktemp("tracked")
    trackers = "tensorboard" if WANDB else "tensorboard,wandb"
    summary, _ = run_inprocess(tmp, 3, None, method="fedsac", tracker=trackers, **{
        "num-server-rounds": ROUNDS, "tracker-every": EVERY, "val-fraction": 0.2, "tracker-group": "study-x"})
    folder = Path(summary["results_dir"])
    with open(folder / "rounds.csv") as f:
        rows = list(csv.DictReader(f))
    return folder, rows


def _numeric_columns(rows):
    return [k for k in rows[0] if k != "round" and all(r[k] not in ("", None) for r in rows)]


def test_tensorboard_event_files_hold_the_rounds_csv_values(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    folder, rows = tracked_run
    events = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    columns = _numeric_columns(rows)
    assert {"acc_weighted", "val_acc_client_mean", "loss", "train_loss", "bytes_up", "bytes_down", "wall_s", "eval_s",
            "dropped", "m_self_weight", "m_row_entropy"} <= set(columns)
    for column in columns:
        written = {s.step: s.value for s in events.Scalars(tag(column))}
        expected = {int(r["round"]): float(r[column]) for r in rows}
        assert written.keys() == expected.keys(), column
        np.testing.assert_allclose([written[k] for k in expected], list(expected.values()), rtol=1e-6, err_msg=column)
    # the clients' accuracies: one histogram per evaluated round, one entry per client
    histograms = events.Histograms("clients/accuracy")
    assert [h.step for h in histograms] == [int(r["round"]) for r in rows]
    assert all(h.histogram_value.num == 3 for h in histograms)
    # FedSaC's collaboration graph as an image every EVERY rounds and at the last
    assert [i.step for i in events.Images("matrices/graph")] == [2, 3]
    assert "summary/test_acc_at_best_val" in tags["scalars"]
    # the resolved run config as hyperparameters
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert start.hparams["method"].string_value == "fedsac"
    assert start.hparams["num-server-rounds"].number_value == ROUNDS
    assert start.hparams["tracker-group"].string_value == "study-x"


@pytest.mark.skipif(bool(WANDB), reason=WANDB)
def test_wandb_offline_run_history_holds_the_rounds_csv_values(tracked_run):
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal.datastore import DataStore

    folder, rows = tracked_run
    (path,) = glob.glob(str(folder / "wandb" / "offline-run-*" / "run-*.wandb"))
    store = DataStore()
    store.open_for_scan(path)
    history, run = {}, None
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record.FromString(data)
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            history[items["_step"]] = items
        elif record.WhichOneof("record_type") == "run":
            run = record.run
    assert run.run_group == "study-x" and run.job_type == "fedsac"
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["method"] == "fedsac" and config["num-server-rounds"] == ROUNDS
    assert sorted(history) == [int(r["round"]) for r in rows]
    for column in _numeric_columns(rows):
        np.testing.assert_allclose([history[int(r["round"])][tag(column)] for r in rows],
                                   [float(r[column]) for r in rows], rtol=1e-12, err_msg=column)
    assert history[ROUNDS]["clients/accuracy/_type"] == "histogram"
    assert history[2]["matrices/graph/_type"] == "image-file" and "matrices/graph/_type" not in history[1]


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def flwr_warnings():
    handler = _Warnings()
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def test_a_tracker_that_fails_is_reported_once_and_the_run_goes_on(tmp_path, monkeypatch, flwr_warnings):
    """The writer raises mid-run (a full disk) and the other back-end cannot be imported: each is named
    once, and the run finishes with all its rounds."""
    from torch.utils.tensorboard import SummaryWriter

    calls = []

    def disk_full(self, *args, **kwargs):
        calls.append(args[0])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SummaryWriter, "add_histogram", disk_full)
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    summary, _ = run_inprocess(tmp_path, 3, None, method="fedavg", tracker="tensorboard,wandb",
                               **{"num-server-rounds": ROUNDS})
    assert summary["status"] == "completed" and summary["rounds"] == ROUNDS
    failed = [m for m in flwr_warnings if m.startswith("tracker ")]
    assert len(failed) == 2, failed
    assert any("tracker wandb failed" in m and "import of wandb halted" in m and "pip install" in m for m in failed)
    assert any("tracker tensorboard failed" in m and "No space left" in m for m in failed)
    assert len(calls) == 1  # dropped after its first failure


def test_tracker_names_are_checked():
    assert Config.from_run_config({"tracker": "tensorboard,wandb"})["tracker"] == "tensorboard,wandb"
    for bad in ("tensorbord", "none,wandb", "", "tensorboard,"):
        with pytest.raises(ConfigError, match="'tracker'"):
            Config.from_run_config({"tracker": bad})


@pytest.mark.long
def test_tensorboard_serves_the_event_files_on_loopback(tracked_run):
    """``tensorboard --logdir`` on a run folder: its index page answers and it lists the run's scalars."""
    from runner.flower_cli import free_port

    folder, _ = tracked_run
    port = free_port()
    exe = Path(sys.executable).with_name("tensorboard")
    proc = subprocess.Popen([str(exe), "--logdir", str(folder.parent), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline, page = time.monotonic() + 60, None
        while page is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read().decode()
            except OSError:
                time.sleep(0.5)
        assert page is not None, proc.stderr.read().decode() if proc.poll() is not None else "no answer in 60 s"
        assert "<tf-tensorboard" in page or "TensorBoard" in page
        tags = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=10).read())
        assert "accuracy/acc_weighted" in tags[f"{folder.name}/tensorboard"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
