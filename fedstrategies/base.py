"""Base of every personalised strategy: per-client messages, per-client state, validated replies.

A method subclasses ``PersonalizedStrategy`` and fills four hooks:

- ``train_payload(pid, round)``: the records sent to one client (its personalised content),
- ``reply_schema(pid)``: which records/arrays/shapes a train reply must carry,
- ``aggregate(round, replies)``: the method's server rule on validated replies (pure math lives in
  plain functions beside it),
- ``evaluate_payload(pid)``: what a client needs to evaluate its personalised model.

All per-client state is keyed by partition id (node ids are random per run). Replies that are
errors, miss records, carry NaN/Inf or wrong shapes are dropped with a logged reason and counted;
a round with fewer valid replies than ``min-replies`` leaves the server state unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedcore import wire
from fedcore.config import Config

# A reply schema: record name -> {array key: expected shape, or None for "any shape"}.
Schema = dict[str, dict[str, tuple[int, ...] | None]]


@dataclass(frozen=True)
class ClientInfo:
    """What a client told the server at the handshake."""

    pid: int
    node_id: int
    num_train: int
    num_test: int
    train_label_counts: np.ndarray
    test_label_counts: np.ndarray


@dataclass
class ClientReply:
    """A validated reply: who sent it, its weight and its arrays as numpy."""

    pid: int
    node_id: int
    num_examples: int
    metrics: dict
    arrays: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


class PersonalizedStrategy(Strategy):
    """Sends one message per client and keeps per-client server state keyed by partition id."""

    def __init__(self, cfg: Config, clients: dict[int, ClientInfo], initial_weights: dict[str, np.ndarray]):
        self.cfg = cfg
        self.hp = cfg.hparams()
        self.clients = dict(sorted(clients.items()))
        self.node_of = {pid: info.node_id for pid, info in self.clients.items()}
        self.pid_of = {info.node_id: pid for pid, info in self.clients.items()}
        self.initial_weights = initial_weights
        self.rng = np.random.default_rng([cfg["seed"], 2024])
        self.dropped: list[dict] = []  # every dropped reply: round, phase, pid, reason
        self._pending: dict[str, set[int]] = {}

    # ----------------------------------------------------------------- hooks for methods
    def train_payload(self, pid: int, server_round: int) -> dict[str, ArrayRecord]:
        return {}

    def reply_schema(self, pid: int) -> Schema:
        return {}

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> None:
        """Update the server state from this round's valid replies."""

    def evaluate_payload(self, pid: int) -> dict[str, ArrayRecord]:
        return {}

    def check_reply(self, reply: ClientReply) -> str | None:
        """Extra method-specific checks; return a reason to drop the reply, or None."""
        return None

    # ----------------------------------------------------------------- sampling
    def sample_train(self, server_round: int) -> list[int]:
        """Partition ids that train this round (seeded; all of them when fraction-train = 1)."""
        pids = list(self.clients)
        k = max(1, int(round(self.cfg["fraction-train"] * len(pids))))
        if k >= len(pids):
            return pids
        rng = np.random.default_rng([self.cfg["seed"], server_round, 11])
        return sorted(rng.choice(pids, size=k, replace=False).tolist())

    # ----------------------------------------------------------------- Flower Strategy API
    def _messages(self, phase: str, message_type: str, server_round: int, pids: list[int], payload) -> list[Message]:
        self._pending[phase] = set(pids)
        messages = []
        for pid in pids:
            content = RecordDict({wire.CONFIG: ConfigRecord({wire.SERVER_ROUND: server_round}), **payload(pid)})
            messages.append(
                Message(content=content, dst_node_id=self.node_of[pid], message_type=message_type,
                        group_id=str(server_round))
            )
        return messages

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        pids = self.sample_train(server_round)
        return self._messages("train", MessageType.TRAIN, server_round, pids,
                              lambda pid: self.train_payload(pid, server_round))

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.validate(server_round, "train", replies, self.reply_schema)
        metrics = {"replies": len(valid), "dropped": len(self._pending["train"]) - len(valid)}
        if len(valid) < self.cfg["min-replies"]:
            log(WARNING, "round %s: only %s valid train replies (min-replies=%s); server state unchanged",
                server_round, len(valid), self.cfg["min-replies"])
            return None, MetricRecord(metrics)
        self.aggregate(server_round, valid)
        n = sum(r.num_examples for r in valid)
        losses = [(r.metrics.get(wire.TRAIN_LOSS), r.num_examples) for r in valid]
        if n > 0 and all(loss is not None for loss, _ in losses):
            metrics[wire.TRAIN_LOSS] = float(sum(loss * w for loss, w in losses) / n)
        return None, MetricRecord(metrics)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self._messages("evaluate", MessageType.EVALUATE, server_round, list(self.clients),
                              self.evaluate_payload)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Personalised accuracy: each client's model on its own test split."""
        valid = self.validate(server_round, "evaluate", replies, lambda pid: {},
                              required_metrics=(wire.CORRECT, wire.EVAL_LOSS))
        if not valid:
            log(WARNING, "round %s: no valid evaluation replies", server_round)
            return None
        valid.sort(key=lambda r: r.pid)
        n = np.array([r.num_examples for r in valid], dtype=np.float64)
        correct = np.array([r.metrics[wire.CORRECT] for r in valid], dtype=np.float64)
        loss = np.array([r.metrics[wire.EVAL_LOSS] for r in valid], dtype=np.float64)
        acc = np.divide(correct, n, out=np.zeros_like(n), where=n > 0)
        return MetricRecord({
            "acc-weighted": float(correct.sum() / max(n.sum(), 1.0)),
            "acc-client-mean": float(acc.mean()),
            "acc-client-std": float(acc.std()),
            "loss": float((loss * n).sum() / max(n.sum(), 1.0)),
            "client-pids": [r.pid for r in valid],
            "client-acc": acc.tolist(),
            "client-n": [int(x) for x in n],
        })

    def summary(self) -> None:
        log(INFO, "%s: %s clients, hyperparameters %s", type(self).__name__, len(self.clients), self.hp)

    # ----------------------------------------------------------------- validation
    def _drop(self, server_round: int, phase: str, who, reason: str) -> None:
        self.dropped.append({"round": server_round, "phase": phase, "client": who, "reason": reason})
        log(WARNING, "round %s %s: dropped reply from client %s: %s", server_round, phase, who, reason)

    def validate(self, server_round: int, phase: str, replies: Iterable[Message], schema_of,
                 required_metrics: tuple[str, ...] = ()) -> list[ClientReply]:
        """Keep the well-formed replies; log and count every other one (and every missing one)."""
        valid: list[ClientReply] = []
        answered: set = set()
        for msg in replies:
            node = msg.metadata.src_node_id
            who = self.pid_of.get(node, f"node {node}")
            answered.add(who)
            reason, reply = self._parse(msg, node, schema_of, required_metrics)
            if reply is not None and reply.pid not in self._pending.get(phase, ()):
                reason, reply = f"unexpected reply (client {reply.pid} was not asked this round)", None
            if reply is not None and any(r.pid == reply.pid for r in valid):
                reason, reply = "duplicate reply", None
            if reply is not None and phase == "train":
                reason = self.check_reply(reply)
            if reason is not None:
                self._drop(server_round, phase, who, reason)
            else:
                valid.append(reply)
        for pid in sorted(self._pending.get(phase, set()) - answered):
            self._drop(server_round, phase, pid, "no reply (timed out or node gone)")
        return valid

    def _parse(self, msg: Message, node: int, schema_of, required_metrics) -> tuple[str | None, ClientReply | None]:
        if msg.has_error():
            return f"client error: {msg.error.reason}", None
        content = msg.content
        if wire.METRICS not in content.metric_records:
            return "missing metrics record", None
        metrics = dict(content.metric_records[wire.METRICS])
        for key in (wire.PARTITION_ID, wire.NUM_EXAMPLES, *required_metrics):
            if key not in metrics:
                return f"missing metric {key!r}", None
        for key, value in metrics.items():
            values = value if isinstance(value, list) else [value]
            if not all(math.isfinite(v) for v in values):
                return f"non-finite metric {key!r}", None
        pid = int(metrics[wire.PARTITION_ID])
        if self.pid_of.get(node) != pid:
            return f"partition id {pid} does not match node {node} (expected {self.pid_of.get(node)})", None
        if metrics[wire.NUM_EXAMPLES] < 0:
            return "negative num-examples", None
        arrays: dict[str, dict[str, np.ndarray]] = {}
        for record_name, keys in schema_of(pid).items():
            if record_name not in content.array_records:
                return f"missing array record {record_name!r}", None
            record = content.array_records[record_name]
            arrays[record_name] = {}
            for key, shape in keys.items():
                if key not in record:
                    return f"record {record_name!r} lacks array {key!r}", None
                array = record[key].numpy()
                if shape is not None and tuple(array.shape) != tuple(shape):
                    return f"{record_name}/{key} has shape {tuple(array.shape)}, expected {tuple(shape)}", None
                if array.dtype.kind in "fc" and not np.isfinite(array).all():
                    return f"{record_name}/{key} contains NaN or Inf", None
                arrays[record_name][key] = array
        return None, ClientReply(pid, node, int(metrics[wire.NUM_EXAMPLES]), metrics, arrays)


def weights_schema(weights: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Schema entry for a ``weights`` record: exactly these tensors, with these shapes."""
    return {key: tuple(value.shape) for key, value in weights.items()}
