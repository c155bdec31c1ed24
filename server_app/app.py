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
from fedstrategies.base import ClientInfo
from server_app import checkpoints
from server_app.nodes import Membership, StartupError, send_and_receive  # noqa: F401 (StartupError: re-exported)
from server_app.results import ResultsWriter, format_summary, run_folder, validation_columns
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
    timeout = cfg["round-timeout"]
    first_round = 1
    if checkpoint is not None:
        _check_same_clients(clients, {pid: ClientInfo(**info) for pid, info in checkpoint["clients"].items()})
        strategy.load_state_dict(checkpoint["strategy"])
        strategy.run_token = checkpoint["token"]
        first_round = checkpoint["round"] + 1
        log(WARNING, "resuming from the checkpoint of round %s", checkpoint["round"])
    else:
        strategy.run_token = uuid.uuid4().hex

    def save_checkpoint(server_round: int) -> None:
        checkpoints.save(writer.dir, server_round, {
            "token": strategy.run_token, "strategy": strategy.state_dict(), "writer": writer.state(),
            "config": cfg.to_dict(), "clients": {pid: dataclasses.asdict(info) for pid, info in clients.items()}},
            cfg["checkpoint-keep"])

    # round 0: the preparation phase, for methods that ask for one
    start = time.monotonic()
    prep_startup = time.time() - t0  # start-up ends where round 0 starts, for a method that has one
    msgs = strategy.configure_prepare(grid) if first_round == 1 else []
    prepared = bool(msgs)
    if msgs:
        replies, _ = _exchange(grid, msgs, timeout)
        metrics = strategy.aggregate_prepare_replies(replies)
        row = {"round": 0, "replies": metrics["replies"], "dropped": metrics["dropped"],
               **_method_columns(metrics, "m_"), "wall_s": time.monotonic() - start, "startup_s": prep_startup}
        row.update(bytes_down=_bytes(msgs), bytes_up=_bytes(replies))
        writer.add_round(row, None, strategy.round_matrices)
        writer.add_placement(0, "prepare", replies)
        tracking.round(row, None, strategy.round_matrices)
        strategy.round_matrices = {}
        save_checkpoint(0)
        log(INFO, "[round 0] preparation: %s replies (dropped %s)  %.2f s", row["replies"], row["dropped"],
            row["wall_s"])

    empty_arrays, empty_config = ArrayRecord(), ConfigRecord()
    rounds = cfg["num-server-rounds"]
    for rnd in range(first_round, rounds + 1):
        start = time.monotonic()
        membership.refresh(strategy, rnd)
        startup = time.time() - t0 if rnd == first_round and not prepared else ""
        msgs = list(strategy.configure_train(rnd, empty_arrays, empty_config, grid))
        replies, _ = _exchange(grid, msgs, timeout)
        lost_before = len(strategy.state_lost)
        _, train_metrics = strategy.aggregate_train(rnd, replies)
        row = {"round": rnd, "replies": train_metrics["replies"], "dropped": train_metrics["dropped"],
               "train_loss": train_metrics.get(wire.TRAIN_LOSS, ""),
               "state_round_min": train_metrics.get("state-round-min", ""),
               **_method_columns(train_metrics, "m_")}
        evaluation, eval_msgs = None, []
        eval_start = time.monotonic()
        if rnd % cfg["eval-every"] == 0 or rnd == rounds:
            eval_msgs = list(strategy.configure_evaluate(rnd, empty_arrays, empty_config, grid))
            eval_replies, _ = _exchange(grid, eval_msgs, timeout)
            evaluation = strategy.aggregate_evaluate(rnd, eval_replies)
            if evaluation is not None:
                row.update(acc_weighted=evaluation["acc-weighted"], acc_client_mean=evaluation["acc-client-mean"],
                           acc_client_std=evaluation["acc-client-std"], loss=evaluation["loss"],
                           eval_clients=evaluation["eval-clients"], **validation_columns(evaluation),
                           **_method_columns(evaluation, "eval_"))
        row["wall_s"] = time.monotonic() - start
        row["eval_s"] = time.monotonic() - eval_start if eval_msgs else ""
        row["startup_s"] = startup
        row["state_lost"] = len(strategy.state_lost) - lost_before
        row.update(bytes_down=_bytes(msgs), bytes_up=_bytes(replies), eval_bytes_down=_bytes(eval_msgs))
        writer.add_round(row, evaluation, strategy.round_matrices)
        writer.add_placement(rnd, "train", replies)
        if eval_msgs:
            writer.add_placement(rnd, "evaluate", eval_replies)
        tracking.round(row, evaluation, strategy.round_matrices)
        strategy.round_matrices = {}
        save_checkpoint(rnd)
        acc = f"{100 * row['acc_weighted']:.2f}%" if "acc_weighted" in row else "-"
        if "val_acc_weighted" in row:
            acc += f" (validation {100 * row['val_acc_weighted']:.2f}%)"
        done = [r["wall_s"] for r in writer.rounds if r["round"] >= 1]
        eta = sum(done) / len(done) * (rounds - rnd)
        log(INFO, "[round %s/%s] acc %s  train-loss %s  replies %s (dropped %s)  %.2f s  elapsed %.0f s  left ~%.0f s",
            rnd, rounds, acc, f"{row['train_loss']:.4f}" if row["train_loss"] != "" else "-", row["replies"],
            row["dropped"], row["wall_s"], writer.elapsed(), eta)
    summary = writer.finish(len(clients), strategy.dropped)
    tracking.finish(summary)
    if os.environ.get("PFL_LAUNCHER"):  # the launcher prints the table itself, once
        log(INFO, "results: %s", summary["results_dir"])
    else:
        log(INFO, "\n%s", format_summary(summary))
    return summary
