"""Experiment tracking: the server's numbers of every round into TensorBoard and/or Weights & Biases.

The ServerApp already holds each round's row of rounds.csv, the clients' accuracies and the matrices
a strategy recorded; a tracker copies them into a tool people already use to watch and compare runs.
Run-config ``tracker`` = ``none`` (default) | ``tensorboard`` | ``wandb`` | ``tensorboard,wandb``:

- per round, every number of the rounds.csv row under ``<group>/<column>`` (accuracies weighted and
  client mean, test and validation; losses; bytes up and down; round and evaluation time; replies
  and dropped replies; every method diagnostic ``m_*`` and ``eval_*``): see ``tag``;
- per evaluated round, the clients' test accuracies as a histogram (``clients/accuracy``);
- every ``tracker-every`` rounds and at the last, each square matrix the strategy recorded (FedSaC's
  and pFedGraph's collaboration graph, FedMCSA's and FedAMP's attention) as a heatmap image;
- the resolved run config as hyperparameters, and the run's summary at its end.

TensorBoard writes event files to ``<run folder>/tensorboard`` (``tensorboard --logdir results/``);
W&B runs offline (nothing leaves the machine unless the user runs ``wandb sync``) into
``<run folder>/wandb``, grouped by ``tracker-group`` (a comparison's preset), with the method as job
type and the seed as a tag. A back-end that fails (not installed, disk full) is reported once and the
run goes on without it: tracking never stops an experiment.
"""

from __future__ import annotations

import json
import math
import os
from logging import WARNING
from pathlib import Path

import numpy as np
from flwr.common.logger import log

from fedcore.config import parse_trackers

SUMMARY_METRICS = ("final_acc", "test_acc_at_best_val", "test_client_acc_mean_at_best_val", "best_acc",
                   "client_acc_mean", "bytes_up", "bytes_down", "wall_s")  # the hyperparameter view's metrics


def tag(column: str) -> str:
    """The tracker's name of a rounds.csv column: grouped, so that each tool shows one panel per kind."""
    if column.startswith("m_") or (column.startswith("eval_") and column not in ("eval_s", "eval_bytes_down",
                                                                                  "eval_clients")):
        group = "method"
    elif "acc" in column:
        group = "accuracy"
    elif "loss" in column:
        group = "loss"
    elif "bytes" in column:
        group = "traffic"
    elif column.endswith("_s"):
        group = "time"
    else:
        group = "run"
    return f"{group}/{column}"


def _numbers(row: dict) -> dict[str, float]:
    return {tag(k): float(v) for k, v in row.items() if k != "round" and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


def _heatmap(name: str, matrix: np.ndarray, rnd: int, pids=None) -> np.ndarray:
    """A matrix as an RGB image (H x W x 3, uint8), values written on small ones; rows and columns
    named by the clients' partition ids where the strategy recorded them (``pids``, ``*-pids``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 3.6), layout="constrained")
    image = ax.imshow(matrix, cmap="viridis")
    n = len(matrix)
    if n <= 12:
        middle = (np.nanmin(matrix) + np.nanmax(matrix)) / 2
        for (i, j), value in np.ndenumerate(matrix):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6,
                    color="black" if value > middle else "white")
    if n <= 20:
        ticks = [int(p) for p in pids] if pids is not None else list(range(n))
        ax.set(xticks=range(n), yticks=range(n), xticklabels=ticks, yticklabels=ticks)
    who = "client (partition id)" if pids is not None else "index"
    ax.set(title=f"{name}, round {rnd}", xlabel=who, ylabel=who)
    fig.colorbar(image, ax=ax)
    fig.canvas.draw()
    rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return rgb


class TensorBoard:
    """Event files through TensorBoard's own writer (torch.utils.tensorboard.SummaryWriter)."""

    name = "tensorboard"

    def __init__(self, folder: Path, cfg: dict):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard"), flush_secs=30)
        config = {k: v for k, v in cfg.items() if isinstance(v, (int, float, str, bool))}
        self.writer.add_text("config", "```\n" + json.dumps(cfg, indent=2, sort_keys=True) + "\n```")
        # the hyperparameter view: the run config, and the summary metrics written at the end (same run folder,
        # not the sub-run that SummaryWriter.add_hparams would make)
        for summary in hparams(config, {f"summary/{m}": 0.0 for m in SUMMARY_METRICS}):
            self.writer.file_writer.add_summary(summary)

    def log_round(self, rnd: int, numbers: dict, client_acc: list | None, images: dict) -> None:
        for key, value in numbers.items():
            self.writer.add_scalar(key, value, rnd)
        if client_acc:
            self.writer.add_histogram("clients/accuracy", np.asarray(client_acc, dtype=float), rnd)
        for name, rgb in images.items():
            self.writer.add_image(f"matrices/{name}", rgb, rnd, dataformats="HWC")
        self.writer.flush()

    def finish(self, summary: dict) -> None:
        for metric in SUMMARY_METRICS:
            if isinstance(summary.get(metric), (int, float)):
                self.writer.add_scalar(f"summary/{metric}", summary[metric], summary.get("final_round") or 0)
        self.writer.close()

    def close(self) -> None:
        self.writer.close()


class WandB:
    """An offline Weights & Biases run in the run folder (the optional ``[wandb]`` extra)."""

    name = "wandb"

    def __init__(self, folder: Path, cfg: dict):
        for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false",
                           "WANDB_DISABLE_GIT": "true"}.items():
            os.environ.setdefault(key, value)
        import wandb

        self.wandb = wandb
        self.run = wandb.init(mode="offline", dir=str(folder), project="pfl-flower", name=folder.name,
                              group=cfg.get("tracker-group") or None, job_type=cfg["method"],
                              tags=[cfg["method"], f"seed-{cfg['seed']}", cfg["dataset"]], config=dict(cfg),
                              reinit="create_new")

    def log_round(self, rnd: int, numbers: dict, client_acc: list | None, images: dict) -> None:
        data = dict(numbers)
        if client_acc:
            data["clients/accuracy"] = self.wandb.Histogram(np.asarray(client_acc, dtype=float))
        for name, rgb in images.items():
            data[f"matrices/{name}"] = self.wandb.Image(rgb)
        self.run.log(data, step=rnd)

    def finish(self, summary: dict) -> None:
        self.run.summary.update({f"summary/{k}": v for k, v in summary.items() if isinstance(v, (int, float, str))})
        self.run.finish()

    def close(self) -> None:
        self.run.finish(exit_code=1)


BACKENDS = {"tensorboard": TensorBoard, "wandb": WandB}


class Tracking:
    """The run's trackers; each call goes to every back-end still working, and one that raises is
    reported once (a WARNING naming it and the error) and dropped: the run goes on without it."""

    def __init__(self, cfg, folder: Path):
        self.every = cfg["tracker-every"]
        self.last_round = cfg["num-server-rounds"]
        self.backends = []
        self.failed: dict[str, str] = {}  # back-end -> the error that stopped it
        for name in parse_trackers(cfg["tracker"]):
            try:
                self.backends.append(BACKENDS[name](Path(folder), cfg.to_dict() if hasattr(cfg, "to_dict") else cfg))
            except Exception as err:  # ImportError (extra not installed), OSError (disk), the library's own
                self._fail(name, err, None)

    def _fail(self, name: str, err: Exception, backend) -> None:
        self.failed[name] = repr(err)
        hint = f" (install it: pip install -e '.[{name}]')" if isinstance(err, ImportError) else ""
        log(WARNING, "tracker %s failed (%r)%s; the run goes on without it", name, err, hint)
        if backend is not None:
            self.backends.remove(backend)
            try:
                backend.close()
            except Exception:  # noqa: BLE001 (already reported; closing is a courtesy)
                pass

    def _each(self, call) -> None:
        for backend in list(self.backends):
            try:
                call(backend)
            except Exception as err:
                self._fail(backend.name, err, backend)

    def round(self, row: dict, evaluation: dict | None, matrices: dict | None) -> None:
        """One round: its rounds.csv row, the strategy's evaluation (per-client accuracies) and matrices."""
        if not self.backends:
            return
        rnd = int(row["round"])
        try:
            client_acc = list(evaluation["client-acc"]) if evaluation and "client-acc" in evaluation else None
            images = {}
            if matrices and (rnd % self.every == 0 or rnd >= self.last_round):
                vectors = [np.asarray(v) for k, v in matrices.items() if k.endswith("pids") and np.ndim(v) == 1]
                for name, value in matrices.items():
                    m = np.asarray(value, dtype=float)
                    if m.ndim == 2 and m.shape[0] == m.shape[1] and m.size > 1:
                        pids = next((v for v in vectors if len(v) == len(m)), None)
                        images[name] = _heatmap(name, m, rnd, pids)
            numbers = _numbers(row)
        except Exception as err:  # drawing failed: every back-end stops, the run does not
            for backend in list(self.backends):
                self._fail(backend.name, err, backend)
            return
        self._each(lambda b: b.log_round(rnd, numbers, client_acc, images))

    def finish(self, summary: dict) -> None:
        self._each(lambda b: b.finish(summary))
        self.backends = []
