"""The ClientApp: routes each message to the configured method's client.

Every reply carries the client's ``partition-id`` (node ids are random per run), its
``num-examples``, the round its client state comes from and where it ran (``clients.placement``). Before a method sees a message,
torch's, numpy's and Python's global generators are seeded from (seed, partition id, round,
phase), so dropout and any other random operation repeat exactly under Ray and in deployment.
A client that raises produces an error reply, which the server logs and drops; one whose GPU runs
out of memory frees the memory it held and says so in that reply (the run goes on without it).
"""

from __future__ import annotations

import contextlib
import random
from functools import lru_cache

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients import faults, placement, state_store
from clients.base import ClientEnv, message_seed, set_client_threads
from fedcore import wire
from fedcore.config import Config
from fedcore.models import seed_torch
from fedcore.registry import get_method

app = ClientApp()


@lru_cache(maxsize=8)
def _config(items: tuple) -> Config:
    return Config.from_run_config(dict(items))  # the schema imports the plain declarations, no strategy module


def _identity(context: Context) -> tuple[int, int]:
    try:
        return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    except KeyError as err:
        raise ValueError(
            "this SuperNode has no partition-id/num-partitions; start it with "
            "--node-config \"partition-id=<i> num-partitions=<n>\""
        ) from err


def _env(msg: Message, context: Context, phase: str) -> ClientEnv:
    cfg = _config(tuple(sorted(context.run_config.items())))
    set_client_threads(cfg)
    pid, num_clients = _identity(context)
    config = dict(msg.content.config_records[wire.CONFIG]) if wire.CONFIG in msg.content.config_records else {}
    server_round = int(config.get(wire.SERVER_ROUND, 0))
    seed = message_seed(cfg["seed"], pid, server_round, phase)
    seed_torch(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    folder = state_store.state_dir(cfg, dict(context.node_config), str(config.get(wire.RUN_TOKEN, "")), pid)
    finished = server_round if phase == "evaluate" else server_round - 1  # newest round the server kept
    state_store.restore_if_empty(context.state, folder, finished)
    env = ClientEnv(cfg, pid, num_clients, context.state, server_round, config)
    env.state_folder = folder
    return env


def _reply(msg: Message, env: ClientEnv, records: dict, metrics: dict, fault: str | None = None) -> Message:
    clash = set(records) & set(wire.RESERVED_RECORDS)
    if clash:
        raise ValueError(f"reply record name(s) {sorted(clash)} are reserved")
    metrics = {**metrics, wire.PARTITION_ID: env.pid, wire.STATE_ROUND: env.state_round,
               wire.STATE_SAVED: int(env.state_saved)}
    if env.state_saved:
        state_store.persist(env.state, env.state_folder, env.server_round)
    if fault is not None:
        records, metrics = faults.corrupt(fault, records, metrics, env.pid, env.num_clients)
        return Message(content=faults.reply_content(records, metrics), reply_to=msg)
    return Message(content=RecordDict({**records, wire.METRICS: MetricRecord(metrics),
                                       wire.PLACEMENT: ConfigRecord(placement.where())}), reply_to=msg)


def _client(env: ClientEnv):
    return get_method(env.cfg.method).client(env)


@contextlib.contextmanager
def _device_memory(env: ClientEnv, phase: str):
    """Turn a GPU's out-of-memory error into a plain error with who, where and when: the reply is
    dropped with that reason, and the memory the failed step held goes back to the device, so the
    next message this process serves (another client's, under Ray) does not fail as well."""
    try:
        yield
    except torch.OutOfMemoryError as err:
        if env.device.type == "cuda":
            torch.cuda.empty_cache()
        raise RuntimeError(f"client {env.pid} ran out of memory on {env.device} in round {env.server_round} "
                           f"({phase}): {str(err).splitlines()[0] if str(err) else 'OutOfMemoryError'}") from None


@app.query("handshake")
def handshake(msg: Message, context: Context) -> Message:
    """Tell the server who we are and what data we hold (sizes, label counts, input shape)."""
    env = _env(msg, context, "handshake")
    data = env.data
    return _reply(msg, env, {}, {
        wire.NUM_PARTITIONS: env.num_clients,
        wire.NUM_EXAMPLES: data.num_train,
        wire.NUM_TRAIN: data.num_train,
        wire.NUM_TEST: data.num_test,
        wire.NUM_VAL: data.num_val,
        wire.TRAIN_LABEL_COUNTS: [int(c) for c in data.train_label_counts],
        wire.TEST_LABEL_COUNTS: [int(c) for c in data.test_label_counts],
        wire.INPUT_SHAPE: list(data.input_shape),
        wire.NUM_CLASSES: data.num_classes,
    })


@app.query("prepare")
def prepare(msg: Message, context: Context) -> Message:
    """Round 0: what the method's strategy asks of every client before training starts."""
    env = _env(msg, context, "prepare")
    with _device_memory(env, "prepare"):
        records, metrics = _client(env).prepare(msg.content)
    return _reply(msg, env, records, {**metrics, wire.NUM_EXAMPLES: env.data.num_train})


@app.train()
def train(msg: Message, context: Context) -> Message:
    env = _env(msg, context, "train")
    fault = faults.fault_for(env.cfg, env.pid, env.num_clients, env.server_round)
    faults.before(fault, env.cfg)
    with _device_memory(env, "train"):
        records, metrics = _client(env).fit(msg.content)
    return _reply(msg, env, records, {**metrics, wire.NUM_EXAMPLES: env.data.num_train}, fault)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    env = _env(msg, context, "evaluate")
    with _device_memory(env, "evaluate"):
        result, val = _client(env).evaluate_splits(msg.content)
    extra = {wire.METHOD_METRIC_PREFIX + k: float(v) for k, v in result.metrics.items()}
    if val is not None:  # the same model on the client's validation split
        extra.update({wire.VAL_METHOD_METRIC_PREFIX + k: float(v) for k, v in val.metrics.items()})
        extra.update({wire.VAL_NUM_EXAMPLES: val.num_examples, wire.VAL_CORRECT: val.correct,
                      wire.VAL_LOSS: val.loss})
    return _reply(msg, env, {}, {
        **extra,
        wire.NUM_EXAMPLES: result.num_examples,
        wire.CORRECT: result.correct,
        wire.EVAL_LOSS: result.loss,
    })
