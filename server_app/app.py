"""The ServerApp: run config -> handshake with the clients -> strategy -> rounds -> results.

``run_experiment`` is the whole server side and takes any Flower ``Grid``: the real one under
``flwr run`` / a SuperLink, or the in-process one (runner/inprocess.py).

One round: ``configure_train`` -> send and receive -> ``aggregate_train`` -> (every ``eval-every``
rounds and after the last) ``configure_evaluate`` -> send and receive -> ``aggregate_evaluate``.
A strategy with a preparation phase gets a round 0 first: ``configure_prepare`` ->
``aggregate_prepare_replies``; it appears as round 0 in rounds.csv and does not count towards
``num-server-rounds``. ``wall_s`` is the round's own time; counting bytes and writing results are
done outside it.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedcore import determinism, wire
from fedcore.config import Config
from fedcore.models import model_facts
from fedcore.registry import get_method
from fedstrategies import server_device
from fedstrategies.base import ClientInfo, PersonalizedStrategy, evaluation_at
from server_app import checkpoints
from server_app.nodes import Membership, StartupError, send_and_receive  # noqa: F401 (StartupError: re-exported)
from server_app.results import SAMPLED_EVAL, ResultsWriter, format_summary, run_folder, validation_columns
from server_app.tracking import Tracking

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    from server_app.nodes import tune_grid

    tune_grid(grid)
    run_experiment(grid, Config.from_run_config(context.run_config))


def _started_at() -> tuple[float, str]:
    """Wall-clock time the user's command started, and what that start is: the launcher passes it
    (PFL_LAUNCH_T0); under a plain ``flwr run``, a deployment or in process it is this ServerApp's own
    start. Start-up (``startup_s``) runs from it to the start of the first round the run does."""
    try:
        return float(os.environ["PFL_LAUNCH_T0"]), "command start"
    except (KeyError, ValueError):
        return time.time(), "ServerApp start"


def _exchange(grid: Grid, msgs: list[Message], timeout: float) -> tuple[list[Message], float]:
    """Send and receive one phase; returns the replies and the seconds it took."""
    start = time.monotonic()
    replies = send_and_receive(grid, msgs, timeout) if msgs else []
    return replies, time.monotonic() - start


def _bytes(messages: list[Message]) -> int:
    """The method's traffic: a reply's placement record is run telemetry (where it was computed), left out so
    that the byte columns compare methods, and runs made before replies carried it, on what they send."""
    seen: dict = {}
    return sum(wire.content_bytes(m.content, seen, leave_out=(wire.PLACEMENT,)) for m in messages if not m.has_error())


def _method_columns(metrics, prefix: str) -> dict:
    """MetricRecord ``m.<name>`` entries as rounds.csv columns ``<prefix><name>``."""
    n = len(wire.METHOD_METRIC_PREFIX)
    out = {}
    for key, value in (metrics or {}).items():
        if key.startswith(wire.METHOD_METRIC_PREFIX):
            name = key[n:].replace("@client-mean", "_client_mean").replace("-", "_")
            out[prefix + name] = value
    return out


def _resume_point(cfg: Config) -> tuple[object, dict | None]:
    """The run folder and, with ``resume``, the checkpoint to continue from (checked against the config)."""
    folder = run_folder(cfg)
    if not cfg["resume"]:
        return folder, None
    try:
        checkpoint = checkpoints.latest(folder)
    except checkpoints.CheckpointError as err:  # files there, none usable: stop rather than start over
        raise StartupError(f"resume: {err}") from None
    if checkpoint is None:
        raise StartupError(f"resume: no readable checkpoint in {folder / checkpoints.FOLDER}")
    changed = checkpoints.config_changes(checkpoint["config"], cfg.to_dict())
    if changed:
        raise StartupError(f"resume: the run config differs from the checkpoint's in {', '.join(changed)}; "
                           "a resumed run must be the same experiment")
    if checkpoint["round"] >= cfg["num-server-rounds"]:
        raise StartupError(f"resume: the checkpoint is of round {checkpoint['round']}, the run has "
                           f"num-server-rounds={cfg['num-server-rounds']}: nothing left to do")
    return folder, checkpoint


def _check_same_clients(clients: dict[int, ClientInfo], saved: dict[int, ClientInfo]) -> None:
    for pid, info in saved.items():
        now = clients.get(pid)
        if now is None:
            log(WARNING, "resume: client %s of the interrupted run has not connected; going on without it", pid)
        elif (now.num_train, now.num_test) != (info.num_train, info.num_test):
            raise StartupError(f"resume: client {pid} now holds {now.num_train}/{now.num_test} train/test samples, "
                               f"{info.num_train}/{info.num_test} before: not the same data")


def run_experiment(grid: Grid, cfg: Config) -> dict:
    """Run one federated experiment end to end (or continue one with ``resume``) and return its summary."""
    t0 = _started_at()
    determinism.apply(cfg["deterministic"])  # the server's own torch work, on CUDA where the machine has it
    with server_device.using(cfg["server-device"]):  # a CUDA server device the machine lacks: stops before any client
        return _run(grid, cfg, *t0)


def _run(grid: Grid, cfg: Config, t0: float, t0_is: str) -> dict:
    """``run_experiment`` on its server device."""
    method = get_method(cfg.method)
    log(INFO, "method=%s dataset=%s partition=%s rounds=%s seed=%s server-device=%s", cfg.method, cfg["dataset"],
        cfg["partition"], cfg["num-server-rounds"], cfg["seed"], server_device.describe())
    if cfg.auto_sources:
        log(INFO, "left at auto: %s", ", ".join(f"{k}={cfg[k]} ({src})" for k, src in cfg.auto_sources.items()))
    folder, checkpoint = _resume_point(cfg)
    membership = Membership(grid, cfg)
    clients, input_shape, num_classes = membership.connect()
    writer = ResultsWriter(cfg, folder, resume=checkpoint["writer"] if checkpoint else None)
    writer.startup_from = t0_is
    tracking = Tracking(cfg, writer.dir)  # tracker = none: nothing
    log(INFO, "%s clients connected; results go to %s", len(clients), writer.dir)
    pids = list(clients)
    writer.write_label_counts(pids, np.stack([clients[p].train_label_counts for p in pids]),
                              np.stack([clients[p].test_label_counts for p in pids]))

    strategy = method.strategy(cfg, clients, model_facts(cfg["model"], input_shape, num_classes, cfg["seed"]))
    strategy.summary()
    first_round = 1
    if checkpoint is not None:
        _check_same_clients(clients, {pid: ClientInfo(**info) for pid, info in checkpoint["clients"].items()})
        strategy.load_state_dict(checkpoint["strategy"])
        strategy.run_token = checkpoint["token"]
        first_round = checkpoint["round"] + 1
        log(WARNING, "resuming from the checkpoint of round %s", checkpoint["round"])
    else:
        strategy.run_token = uuid.uuid4().hex

    rounds = _Rounds(grid, cfg, strategy, membership, writer, tracking, clients, t0)
    prepared = first_round == 1 and rounds.prepare()
    for rnd in range(first_round, cfg["num-server-rounds"] + 1):
        rounds.train(rnd, startup=rnd == first_round and not prepared)
    summary = writer.finish(len(clients), strategy.dropped)
    tracking.finish(summary)
    if os.environ.get("PFL_LAUNCHER"):  # the launcher prints the table itself, once
        log(INFO, "results: %s", summary["results_dir"])
    else:
        log(INFO, "\n%s", format_summary(summary))
    return summary


class _Rounds:
    """The rounds of one run: each exchanges its messages, makes its rounds.csv row and records it (results,
    placement, tracker, checkpoint) the same way, round 0 (the preparation phase) and training rounds alike."""

    def __init__(self, grid: Grid, cfg: Config, strategy: PersonalizedStrategy, membership: Membership,
                 writer: ResultsWriter, tracking: Tracking, clients: dict[int, ClientInfo], t0: float):
        self.grid, self.cfg, self.strategy, self.membership = grid, cfg, strategy, membership
        self.writer, self.tracking, self.t0 = writer, tracking, t0
        self.clients = clients  # as they connected at the start: what a checkpoint checks a resume against
        self.empty_arrays, self.empty_config = ArrayRecord(), ConfigRecord()

    def _exchange(self, msgs: list[Message]) -> list[Message]:
        return _exchange(self.grid, msgs, self.cfg["round-timeout"])[0]

    def prepare(self) -> bool:
        """Round 0 for a method that asks for one; whether there was one (start-up then ends where it starts)."""
        start, startup = time.monotonic(), time.time() - self.t0
        msgs = self.strategy.configure_prepare(self.grid)
        if not msgs:
            return False
        replies = self._exchange(msgs)
        metrics = self.strategy.aggregate_prepare_replies(replies)
        row = {**_reply_columns(0, metrics), "wall_s": time.monotonic() - start, "startup_s": startup,
               "bytes_down": _bytes(msgs), "bytes_up": _bytes(replies)}
        self._record(row, None, [("prepare", replies)])
        log(INFO, "[round 0] preparation: %s replies (dropped %s)  %.2f s", row["replies"], row["dropped"],
            row["wall_s"])
        return True

    def train(self, rnd: int, startup: bool) -> None:
        """One training round and, where ``evaluation_at`` says so, its evaluation (all clients or a sample)."""
        strategy, start = self.strategy, time.monotonic()
        self.membership.refresh(strategy, rnd)  # SuperNodes that left or came back
        startup_s = time.time() - self.t0 if startup else ""
        msgs = list(strategy.configure_train(rnd, self.empty_arrays, self.empty_config, self.grid))
        replies = self._exchange(msgs)
        lost_before = len(strategy.state_lost)
        _, train_metrics = strategy.aggregate_train(rnd, replies)
        row = _reply_columns(rnd, train_metrics, train_loss=train_metrics.get(wire.TRAIN_LOSS, ""),
                             state_round_min=train_metrics.get("state-round-min", ""))
        evaluation, eval_msgs, eval_replies = None, [], []
        eval_start = time.monotonic()
        if evaluation_at(self.cfg, rnd) is not None:
            eval_msgs = list(strategy.configure_evaluate(rnd, self.empty_arrays, self.empty_config, self.grid))
            eval_replies = self._exchange(eval_msgs)
            evaluation = strategy.aggregate_evaluate(rnd, eval_replies)
            if evaluation is not None:
                row.update(acc_weighted=evaluation["acc-weighted"], acc_client_mean=evaluation["acc-client-mean"],
                           acc_client_std=evaluation["acc-client-std"], loss=evaluation["loss"],
                           eval_clients=evaluation["eval-clients"], **validation_columns(evaluation),
                           **_method_columns(evaluation, "eval_"))
            if len(eval_msgs) < len(strategy.clients):  # a sample: its accuracy never chooses the best round
                row[SAMPLED_EVAL] = len(eval_msgs)
        row["wall_s"] = time.monotonic() - start
        row["eval_s"] = time.monotonic() - eval_start if eval_msgs else ""
        row["startup_s"] = startup_s
        row["state_lost"] = len(strategy.state_lost) - lost_before
        row.update(bytes_down=_bytes(msgs), bytes_up=_bytes(replies), eval_bytes_down=_bytes(eval_msgs))
        self._record(row, evaluation, [("train", replies)] + ([("evaluate", eval_replies)] if eval_msgs else []))
        self._log(row)

    def _record(self, row: dict, evaluation, placements: list[tuple[str, list[Message]]]) -> None:
        """A finished round into the results, the tracker and a checkpoint."""
        strategy, writer = self.strategy, self.writer
        writer.add_round(row, evaluation, strategy.round_matrices)
        for phase, replies in placements:
            writer.add_placement(row["round"], phase, replies)
        self.tracking.round(row, evaluation, strategy.round_matrices)
        strategy.round_matrices = {}
        checkpoints.save(writer.dir, row["round"], {
            "token": strategy.run_token, "strategy": strategy.state_dict(), "writer": writer.state(),
            "config": self.cfg.to_dict(),
            "clients": {pid: dataclasses.asdict(info) for pid, info in self.clients.items()}},
            self.cfg["checkpoint-keep"])

    def _log(self, row: dict) -> None:
        rnd, rounds = row["round"], self.cfg["num-server-rounds"]
        acc = f"{100 * row['acc_weighted']:.2f}%" if "acc_weighted" in row else "-"
        if "val_acc_weighted" in row:
            acc += f" (validation {100 * row['val_acc_weighted']:.2f}%)"
        if SAMPLED_EVAL in row:
            acc += f" (a sample of {row[SAMPLED_EVAL]} clients)"
        done = [r["wall_s"] for r in self.writer.rounds if r["round"] >= 1]
        eta = sum(done) / len(done) * (rounds - rnd)
        log(INFO, "[round %s/%s] acc %s  train-loss %s  replies %s (dropped %s)  %.2f s  elapsed %.0f s  left ~%.0f s",
            rnd, rounds, acc, f"{row['train_loss']:.4f}" if row["train_loss"] != "" else "-", row["replies"],
            row["dropped"], row["wall_s"], self.writer.elapsed(), eta)


def _reply_columns(rnd: int, metrics, **more) -> dict:
    """A round's first rounds.csv columns: its number, valid and dropped replies, ``more``, the method's ``m_*``."""
    return {"round": rnd, "replies": metrics["replies"], "dropped": metrics["dropped"], **more,
            **_method_columns(metrics, "m_")}
