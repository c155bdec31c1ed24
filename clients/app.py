"""The ClientApp: routes each message to the configured method's client.

Every reply carries the client's ``partition-id`` (node ids are random per run) and its
``num-examples``. A client that raises produces an error reply, which the server logs and drops.
"""

from __future__ import annotations

from functools import lru_cache

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients.base import ClientEnv, set_client_threads
from fedcore import wire
from fedcore.config import Config
from fedcore.registry import get_method

app = ClientApp()


@lru_cache(maxsize=8)
def _config(items: tuple) -> Config:
    return Config.from_run_config(dict(items))


def _identity(context: Context) -> tuple[int, int]:
    try:
        return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    except KeyError as err:
        raise ValueError(
            "this SuperNode has no partition-id/num-partitions; start it with "
            "--node-config \"partition-id=<i> num-partitions=<n>\""
        ) from err


def _env(msg: Message, context: Context) -> ClientEnv:
    cfg = _config(tuple(sorted(context.run_config.items())))
    set_client_threads(cfg)
    pid, num_clients = _identity(context)
    server_round = int(msg.content.config_records[wire.CONFIG].get(wire.SERVER_ROUND, 0)) \
        if wire.CONFIG in msg.content.config_records else 0
    return ClientEnv(cfg, pid, num_clients, context.state, server_round)


def _reply(msg: Message, records: dict, metrics: dict) -> Message:
    return Message(content=RecordDict({**records, wire.METRICS: MetricRecord(metrics)}), reply_to=msg)


@app.query("handshake")
def handshake(msg: Message, context: Context) -> Message:
    """Tell the server who we are and what data we hold (sizes, label counts, input shape)."""
    env = _env(msg, context)
    data = env.data
    return _reply(msg, {}, {
        wire.PARTITION_ID: env.pid,
        wire.NUM_PARTITIONS: env.num_clients,
        wire.NUM_EXAMPLES: data.num_train,
        wire.NUM_TRAIN: data.num_train,
        wire.NUM_TEST: data.num_test,
        wire.TRAIN_LABEL_COUNTS: [int(c) for c in data.train_label_counts],
        wire.TEST_LABEL_COUNTS: [int(c) for c in data.test_label_counts],
        wire.INPUT_SHAPE: list(data.input_shape),
        wire.NUM_CLASSES: data.num_classes,
    })


@app.train()
def train(msg: Message, context: Context) -> Message:
    env = _env(msg, context)
    client = get_method(env.cfg.method).client(env)
    records, metrics = client.fit(msg.content)
    metrics.update({wire.PARTITION_ID: env.pid, wire.NUM_EXAMPLES: env.data.num_train})
    return _reply(msg, records, metrics)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    env = _env(msg, context)
    result = get_method(env.cfg.method).client(env).evaluate(msg.content)
    return _reply(msg, {}, {
        wire.PARTITION_ID: env.pid,
        wire.NUM_EXAMPLES: result.num_examples,
        wire.CORRECT: result.correct,
        wire.EVAL_LOSS: result.loss,
    })
