"""Fakes of what a federation's clients send a strategy, for the tests and the server benchmark
(benchmarks/server_time.py): the clients a handshake describes and a reply of the shapes each strategy asks for,
so a strategy's rounds run without any client."""

from __future__ import annotations

import numpy as np


def fake_clients(n: int, num_classes: int = 10):
    """n clients of 100 training samples, 2 classes each, as a handshake would describe them."""
    from fedstrategies.base import ClientInfo

    infos = {}
    for pid in range(n):
        counts = np.zeros(num_classes, np.int64)
        counts[[pid % num_classes, (pid + 1) % num_classes]] = [60, 40]
        infos[pid] = ClientInfo(pid, 10_000 + pid, 100, 34, counts, counts // 3)
    return infos


def _array_for(key: str, shape, like: np.ndarray | None, rng) -> np.ndarray:
    if like is not None and like.dtype.kind != "f":
        return like.copy()
    base = like if like is not None and like.shape == tuple(shape) else np.zeros(shape, np.float32)
    return (base + 0.01 * rng.standard_normal(shape)).astype(np.float32)


def fake_reply(strategy, msg, phase: str, rng):
    """A reply to ``msg`` with the arrays the strategy's schema asks for, filled with noise around the
    initial weights (so similarities and norms are realistic)."""
    from flwr.app import Message, MetricRecord, RecordDict

    from fedcore import wire
    from fedcore.registry import get_method
    from fedstrategies.base import ArraySpec

    pid = strategy.pid_of[msg.metadata.dst_node_id]
    records = {}
    example_reply = get_method(strategy.cfg["method"]).example_reply  # the method's declaration, if it has one
    if example_reply is not None:
        records = example_reply(strategy, pid, phase, rng)
    elif phase != "evaluate":
        schema = strategy.prepare_schema(pid) if phase == "prepare" else strategy.reply_schema(pid)
        for name, keys in schema.items():
            if name == wire.CLASS_FEATURES and any(spec is None for spec in keys.values()):
                ids = np.flatnonzero(strategy.clients[pid].train_label_counts)
                feats = rng.standard_normal((len(ids), strategy.model.feature_dim)).astype(np.float32)
                records[name] = wire.pack_class_features(ids, feats, strategy.clients[pid].train_label_counts[ids])
                continue
            arrays = {}
            for key, spec in keys.items():
                shape = spec.shape if isinstance(spec, ArraySpec) else spec
                if shape is None:
                    raise SystemExit(f"{type(strategy).__name__}: schema {name}/{key} has no shape; "
                                     "give its declaration an example_reply(strategy, pid, phase, rng)")
                arrays[key] = _array_for(key, shape, strategy.initial_weights.get(key), rng)
            records[name] = wire.pack_arrays(arrays)
    info = strategy.clients[pid]
    metrics = {wire.PARTITION_ID: pid, wire.NUM_EXAMPLES: info.num_train, wire.TRAIN_LOSS: 1.0}
    if phase == "evaluate":
        metrics.update({wire.NUM_EXAMPLES: info.num_test, wire.CORRECT: info.num_test // 2, wire.EVAL_LOSS: 1.0})
        if info.num_val:  # a client with a validation split scores it too
            metrics.update({wire.VAL_NUM_EXAMPLES: info.num_val, wire.VAL_CORRECT: info.num_val // 2, wire.VAL_LOSS: 1.0})
    return Message(content=RecordDict({**records, wire.METRICS: MetricRecord(metrics)}), reply_to=msg)


def after_one_round(method: str, cfg, n: int, facts):
    """``method``'s strategy for ``n`` fake clients after one aggregated training round, and that round's replies
    (what the server benchmark's computations-alone timings read)."""
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.supercore.task_identity import TaskIdentity

    from fedcore.registry import get_method

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # Message() needs them
    strategy = get_method(method).strategy(cfg, fake_clients(n), facts)
    msgs = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), None))
    replies = [fake_reply(strategy, msg, "train", np.random.default_rng(0)) for msg in msgs]
    strategy.aggregate_train(1, replies)
    return strategy, replies
