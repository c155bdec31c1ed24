"""Base of every personalised strategy: per-client messages, per-client state, validated replies.

A method subclasses ``PersonalizedStrategy`` and overrides the hooks it needs (each documents when
it is called, with what, and what it returns):

=====================  ==========================================================================
``prepare_targets``    round 0: which clients to ask before training (default: none, no round 0)
``prepare_payload``    round 0: records for one client; ``prepare_config``: its config values
``prepare_schema``     round 0: arrays a reply must carry; ``aggregate_prepare``: the server rule
``sample_train``       which partition ids train this round (seeded, ``ceil(fraction * N)``)
``begin_round``        the sampled set, before any payload of the round is built
``train_payload``      records for one client; ``train_config``: its config values
``reply_schema``       arrays a train reply must carry, with their shapes
``check_reply``        method-specific checks of one reply (return a reason to drop it)
``aggregate``          the server rule on the round's valid replies, in partition-id order
``evaluate_payload``   records one client needs to evaluate; ``evaluate_config``: config values
``sample_evaluate``    which partition ids evaluate this round (all, or a seeded ``fraction-evaluate`` sample)
=====================  ==========================================================================

All per-client state is keyed by partition id (node ids are random per run). Replies that are
errors, miss records, carry NaN/Inf or wrong shapes are dropped with a logged reason and counted
(the checks are in ``fedstrategies/replies.py``); a round with fewer valid replies than ``min-replies``
leaves the server state unchanged. Valid replies reach every rule in partition-id order, whatever order
they arrived in, so that floating point sums (and so whole runs) repeat exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedcore import wire
from fedcore.config import Config, ConfigError
from fedcore.models import ModelFacts
from fedstrategies.replies import ArraySpec, ClientReply, ReplyValidation, Schema, _nonfinite

Payload = dict[str, ArrayRecord | ConfigRecord | MetricRecord]


@dataclass(frozen=True)
class ClientInfo:
    """What a client told the server at the handshake."""

    pid: int
    node_id: int
    num_train: int
    num_test: int
    train_label_counts: np.ndarray
    test_label_counts: np.ndarray
    num_val: int = 0  # validation samples, carved from the training pool (val-fraction)


class ServerStateError(RuntimeError):
    """The server state holds NaN or Inf: the run must stop as failed rather than go on from it."""


def ceil_fraction(fraction: float, n: int) -> int:
    """``ceil(fraction * n)`` clamped to 1..n, robust to float noise (0.1 * 30 is 3, not 4)."""
    return min(n, max(1, math.ceil(fraction * n - 1e-9)))


def _forgetting_packed(hook):
    """``hook`` (a method's aggregation) followed by forgetting the packed records (``PersonalizedStrategy.packed``)."""
    if getattr(hook, "forgets_packed", False):
        return hook

    @functools.wraps(hook)
    def aggregate_then_forget(self, *args, **kwargs):
        try:
            return hook(self, *args, **kwargs)
        finally:
            self._packed_records.clear()

    aggregate_then_forget.forgets_packed = True
    return aggregate_then_forget


EVALUATE_STREAM = 13  # the evaluation sample's seed stream (training's is 11): the two samples are independent


def evaluation_at(cfg: Config, server_round: int) -> str | None:
    """What evaluation round ``server_round`` has: "all" (every client) on the eval-every rounds and the last,
    "sample" in the rounds between them when ``fraction-evaluate`` < 1, None (no evaluation) otherwise."""
    if server_round % cfg["eval-every"] == 0 or server_round == cfg["num-server-rounds"]:
        return "all"
    return "sample" if cfg["fraction-evaluate"] < 1.0 else None


class PersonalizedStrategy(ReplyValidation, Strategy):
    """Sends one message per client and keeps per-client server state keyed by partition id.

    Parameters
    ----------
    cfg : Config
        The validated run config; ``self.hp`` holds the selected method's hyperparameters.
    clients : dict[int, ClientInfo]
        Every connected client by partition id (sizes and label counts from the handshake).
    model : ModelFacts
        Input shape, number of classes, feature dimension and the seeded initial weights.
    """

    #: Attributes that make up the strategy's state between rounds; ``state_dict`` saves them
    #: (checkpoints) and ``load_state_dict`` restores them. Every method lists its own.
    checkpoint_attrs: tuple[str, ...] = ()
    #: Whether the method's clients train on raw images through ``ClientBase.train``, where the
    #: ``augmentation`` key applies; a method that draws its own batches says False and refuses the key.
    augments: bool = True

    def __init_subclass__(cls, **kwargs):
        """A method's ``aggregate`` and ``aggregate_prepare`` forget the packed records when they return (or
        raise), however they are called: a record packed before a state change is never sent after it."""
        super().__init_subclass__(**kwargs)
        for hook in ("aggregate", "aggregate_prepare"):
            if hook in cls.__dict__:
                setattr(cls, hook, _forgetting_packed(cls.__dict__[hook]))

    def __init__(self, cfg: Config, clients: dict[int, ClientInfo], model: ModelFacts):
        if cfg["augmentation"] != "none":
            if not self.augments:
                raise ConfigError(f"'augmentation' = {cfg['augmentation']!r}: method {cfg['method']!r} draws its own "
                                  "batches and trains without augmentation; set augmentation = 'none'")
            if len(model.input_shape) != 3:
                raise ConfigError(f"'augmentation' = {cfg['augmentation']!r} needs image inputs (C, H, W); "
                                  f"dataset {cfg['dataset']!r} has inputs of shape {tuple(model.input_shape)}")
        self.cfg = cfg
        self.hp = cfg.hparams()
        self.clients = dict(sorted(clients.items()))
        self.node_of = {pid: info.node_id for pid, info in self.clients.items()}
        self.pid_of = {info.node_id: pid for pid, info in self.clients.items()}
        self.model = model
        self.initial_weights = model.initial_weights
        self.num_classes = model.num_classes
        self.dropped: list[dict] = []  # every dropped reply: round, phase, client, reason
        self.state_lost: list[dict] = []  # every client that came back without the state it had
        self.round_matrices: dict[str, np.ndarray] = {}  # filled by record_matrix, taken by the loop
        self._pending: dict[str, set[int]] = {}
        self._state_round: dict[int, int] = {}  # pid -> last round in which it saved client state
        self.run_token = ""  # set by the ServerApp; clients keep their state on disk under it
        self._packed_records: dict = {}  # packed(): records shared by many messages until the state changes

    # ================================================================= hooks for methods
    def prepare_targets(self) -> list[int]:
        """Clients asked in the preparation phase (round 0), before any training.

        Returns
        -------
        list[int]
            Partition ids; empty (the default) means the method has no preparation phase.
        """
        return []

    def prepare_payload(self, pid: int) -> Payload:
        """Records sent to client ``pid`` in round 0 (see ``train_payload``)."""
        return {}

    def prepare_config(self, pid: int) -> dict:
        """Config values of client ``pid``'s round-0 message (see ``train_config``)."""
        return {}

    def prepare_schema(self, pid: int) -> Schema:
        """What a round-0 reply must carry (see ``reply_schema``)."""
        return {}

    def aggregate_prepare(self, replies: list[ClientReply]) -> dict | None:
        """Server rule on the valid round-0 replies (partition-id order).

        Returns
        -------
        dict or None
            Method metrics (name -> number) for round 0's row in rounds.csv.
        """
        return None

    def sample_train(self, server_round: int) -> list[int]:
        """Partition ids that get a train message this round.

        Called first in every round. The default samples ``ceil(fraction-train * N)`` clients
        uniformly without replacement, seeded by (seed, round), and returns them sorted.
        """
        return self.sample_clients(self.cfg["fraction-train"], server_round)

    def begin_round(self, server_round: int, pids: list[int]) -> None:
        """Called once per round with the ``sample_train`` result, before any payload is built
        (FedMCSA's attention runs over exactly these clients here)."""

    def train_payload(self, pid: int, server_round: int) -> Payload:
        """Records sent to client ``pid`` with its train message.

        Returns
        -------
        dict[str, ArrayRecord | ConfigRecord | MetricRecord]
            Record name -> record. ``config`` and ``metrics`` are reserved (use ``train_config``).
            Return the *same* record object for clients that get the same content (a global
            model): it is then packed and measured once.
        """
        return {}

    def train_config(self, pid: int, server_round: int) -> dict:
        """Method values merged into the train message's ``config`` record (modes, flags, a
        round-dependent learning rate). A key of the base record (``server-round``, ``phase``)
        is an error. Clients read them from ``ClientEnv.config``."""
        return {}

    def reply_schema(self, pid: int) -> Schema:
        """What a train reply of client ``pid`` must carry.

        Returns
        -------
        dict[str, dict[str, tuple[int, ...] | None]]
            Record name -> {array key: exact shape, or None for any shape}. Missing records or
            arrays, other shapes and NaN/Inf values drop the reply before ``aggregate`` sees it.
        """
        return {}

    def check_reply(self, reply: ClientReply) -> str | None:
        """Method-specific checks of one schema-valid reply (``reply.phase`` says which phase).

        Returns
        -------
        str or None
            A reason to drop the reply, or None to keep it.
        """
        return None

    def reference_norm(self, record: str) -> float | None:
        """The L2 norm a reply's ``record`` is expected to be near, from the current server state
        (FedAvg: the global model's), or None when the state says nothing (then only the round's
        other replies bound it). Replies beyond ``reply-norm-bound`` times the larger of this and the
        round's median norm are dropped."""
        return None

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> dict | None:
        """The method's server rule: update the server state from this round's valid replies.

        Called only when at least ``min-replies`` replies are valid; replies come in partition-id
        order. Pure math belongs in plain functions beside the strategy.

        Returns
        -------
        dict or None
            Method metrics (name -> number, e.g. the chosen cluster count) for rounds.csv, where
            they appear as ``m_<name>``. Matrices go through ``record_matrix``.
        """
        return None

    def evaluate_payload(self, pid: int, server_round: int) -> Payload:
        """Records client ``pid`` needs to evaluate its personalised model (the clients of ``sample_evaluate``)."""
        return {}

    def evaluate_config(self, pid: int, server_round: int) -> dict:
        """Config values of client ``pid``'s evaluate message (see ``train_config``)."""
        return {}

    # ================================================================= helpers for methods
    def sample_clients(self, fraction: float, server_round: int, stream: int = 11, at_least: int = 1) -> list[int]:
        """``ceil(fraction * N)`` (and at least ``at_least``) partition ids, uniformly without replacement, seeded
        by (seed, round, stream); all of them, in order, when the count covers everyone."""
        pids = list(self.clients)
        k = max(ceil_fraction(fraction, len(pids)), min(at_least, len(pids)))
        if k >= len(pids):
            return pids
        rng = np.random.default_rng([self.cfg["seed"], server_round, stream])
        return sorted(rng.choice(pids, size=k, replace=False).tolist())

    @cached_property
    def torch_generator(self):
        """A torch generator seeded by the run seed, for the server's own training (FedFCD's head,
        MuPFL's synthetic features); it is part of the checkpoint."""
        import torch

        return torch.Generator().manual_seed(int(np.random.SeedSequence([self.cfg["seed"], 7]).generate_state(1)[0]))

    def packed(self, name, build: Callable[[], ArrayRecord]) -> ArrayRecord:
        """The record ``name`` (any hashable), built by ``build()`` once and then shared by every message that
        carries it (packing copies every array) while the server state it packs stands: the base forgets every
        packed record when ``aggregate`` or ``aggregate_prepare`` returns and on ``load_state_dict``, so a method
        keeps no cache of its own."""
        if name not in self._packed_records:
            self._packed_records[name] = build()
        return self._packed_records[name]

    def record_matrix(self, name: str, matrix) -> None:
        """Save a matrix of this round (a collaboration graph, attention weights) with the results:
        ``round_matrices/<round>.json``."""
        self.round_matrices[name] = np.asarray(matrix)

    def state_dict(self) -> dict:
        """The strategy's state between rounds: ``checkpoint_attrs`` plus what the base tracks.

        The values are the live objects (no copies: a method may hold one model per client);
        serialise the result before the strategy changes again, as the checkpoint writer does.
        An attribute with ``state_dict``/``load_state_dict`` (a model, an optimiser) is saved as its
        ``state_dict()``, since checkpoints hold data, not objects (server_app/checkpoints.py)."""
        state = {}
        for name in self.checkpoint_attrs:
            value = getattr(self, name)
            state[name] = value.state_dict() if _stateful(value) else value
        base = {"dropped": list(self.dropped), "state_lost": list(self.state_lost),
                "state_round": dict(self._state_round)}
        if "torch_generator" in self.__dict__:
            base["torch_generator"] = self.torch_generator.get_state()
        return {"method": state, "base": base}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a ``state_dict`` (freshly read from a checkpoint, so not shared); an
        attribute with ``load_state_dict`` is loaded in place."""
        for name, value in state["method"].items():
            current = getattr(self, name, None)
            if _stateful(current):
                current.load_state_dict(value)
            else:
                setattr(self, name, value)
        self._packed_records.clear()
        base = state["base"]
        self.dropped, self.state_lost = list(base["dropped"]), list(base["state_lost"])
        self._state_round = dict(base["state_round"])
        if "torch_generator" in base:
            self.torch_generator.set_state(base["torch_generator"])

    def check_state_finite(self, where: str) -> None:
        """Raise ``ServerStateError`` if any number in the server state is NaN or Inf, naming the
        attribute: a run must fail loudly rather than continue from a poisoned state."""
        for name in self.checkpoint_attrs:
            if not _finite_tree(getattr(self, name, None)):
                raise ServerStateError(f"{type(self).__name__}.{name} holds NaN or Inf after {where}; "
                                       "the run stops rather than go on from it")

    def summary(self) -> None:
        log(INFO, "%s: %s clients, hyperparameters %s", type(self).__name__, len(self.clients), self.hp)

    # ================================================================= Flower Strategy API
    def configure_prepare(self, grid: Grid) -> list[Message]:
        """Round 0's messages (empty when the method has no preparation phase)."""
        pids = sorted(self.prepare_targets())
        return self._messages("prepare", wire.PREPARE, 0, pids,
                              lambda pid: (self.prepare_payload(pid), self.prepare_config(pid)))

    def aggregate_prepare_replies(self, replies: Iterable[Message]) -> MetricRecord:
        valid = self.validate(0, "prepare", replies, self.prepare_schema)
        metrics = {"replies": len(valid), "dropped": len(self._pending["prepare"]) - len(valid)}
        extra = self.aggregate_prepare(valid) if valid else None
        self.check_state_finite("round 0 aggregation")
        metrics.update(self._method_metrics(extra, valid))
        return MetricRecord(metrics)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        pids = self.sample_train(server_round)
        self.begin_round(server_round, pids)
        return self._messages("train", MessageType.TRAIN, server_round, pids,
                              lambda pid: (self.train_payload(pid, server_round),
                                           self.train_config(pid, server_round)))

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.validate(server_round, "train", replies, self.reply_schema)
        metrics = {"replies": len(valid), "dropped": len(self._pending["train"]) - len(valid)}
        if valid:
            metrics["state-round-min"] = min(int(r.metrics.get(wire.STATE_ROUND, 0)) for r in valid)
        if len(valid) < self.cfg["min-replies"]:
            log(WARNING, "round %s: only %s valid train replies (min-replies=%s); server state unchanged",
                server_round, len(valid), self.cfg["min-replies"])
            return None, MetricRecord(metrics)
        extra = self.aggregate(server_round, valid)
        self.check_state_finite(f"round {server_round} aggregation")
        n = sum(r.num_examples for r in valid)
        losses = [(r.metrics.get(wire.TRAIN_LOSS), r.num_examples) for r in valid]
        if n > 0 and all(loss is not None for loss, _ in losses):
            metrics[wire.TRAIN_LOSS] = float(sum(loss * w for loss, w in losses) / n)
        metrics.update(self._method_metrics(extra, valid))
        return None, MetricRecord(metrics)

    def sample_evaluate(self, server_round: int) -> list[int]:
        """Partition ids that get an evaluate message this round: every client, except in a round between the
        eval-every rounds (``evaluation_at`` "sample"), where ``ceil(fraction-evaluate * N)`` of them, at least
        ``min-evaluate-clients``, are drawn seeded by (seed, round) as ``sample_clients`` draws."""
        if evaluation_at(self.cfg, server_round) != "sample":
            return list(self.clients)
        return self.sample_clients(self.cfg["fraction-evaluate"], server_round, EVALUATE_STREAM,
                                   self.cfg["min-evaluate-clients"])

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self._messages("evaluate", MessageType.EVALUATE, server_round, self.sample_evaluate(server_round),
                              lambda pid: (self.evaluate_payload(pid, server_round),
                                           self.evaluate_config(pid, server_round)))

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Personalised accuracy: each client's model on its own test split.

        Weighted accuracy is sum(correct) / sum(test samples); the client mean and std weigh every
        client equally. Method metrics (``m.*``) are averaged both ways too. When clients hold a
        validation split, the same numbers on it come as ``val-*`` (and ``m.val-*``) beside them.
        """
        valid = self.validate(server_round, "evaluate", replies, lambda pid: {},
                              required_metrics=(wire.CORRECT, wire.EVAL_LOSS))
        if not valid:
            log(WARNING, "round %s: no valid evaluation replies", server_round)
            return None
        n = np.array([r.num_examples for r in valid], dtype=np.float64)
        correct = np.array([r.metrics[wire.CORRECT] for r in valid], dtype=np.float64)
        loss = np.array([r.metrics[wire.EVAL_LOSS] for r in valid], dtype=np.float64)
        acc, scores = _split_scores(n, correct, loss, [r.method_metrics() for r in valid])
        out = {**scores, "acc-client-std": float(acc.std()), "eval-clients": len(valid),
               "client-pids": [r.pid for r in valid], "client-acc": acc.tolist(), "client-n": [int(x) for x in n]}
        with_val = [r for r in valid if wire.VAL_CORRECT in r.metrics]
        if with_val:  # the same numbers on the clients' validation splits
            n = np.array([r.metrics[wire.VAL_NUM_EXAMPLES] for r in with_val], dtype=np.float64)
            correct = np.array([r.metrics[wire.VAL_CORRECT] for r in with_val], dtype=np.float64)
            loss = np.array([r.metrics[wire.VAL_LOSS] for r in with_val], dtype=np.float64)
            prefix = wire.VAL_METHOD_METRIC_PREFIX
            method = [{k[len(prefix):]: v for k, v in r.metrics.items() if k.startswith(prefix)} for r in with_val]
            acc, scores = _split_scores(n, correct, loss, method, "val-")
            out.update(scores, **{"client-val-pids": [r.pid for r in with_val], "client-val-acc": acc.tolist(),
                                  "client-val-n": [int(x) for x in n]})
        return MetricRecord(out)

    # ================================================================= internals
    def _method_metrics(self, extra: dict | None, valid: list[ClientReply]) -> dict:
        """Strategy metrics plus the sample-weighted mean of the clients' own ``m.*`` metrics."""
        out: dict = {}
        per_client = [r.method_metrics() for r in valid]
        for name in sorted(set().union(*per_client)) if per_client else ():
            values = [(m[name], r.num_examples) for m, r in zip(per_client, valid) if name in m]
            total = sum(w for _, w in values)
            out[wire.METHOD_METRIC_PREFIX + name] = (float(sum(v * w for v, w in values) / total) if total > 0
                                                     else float(np.mean([v for v, _ in values])))
        for name, value in (extra or {}).items():
            if not isinstance(value, (int, float, np.integer, np.floating)):
                raise TypeError(f"method metric {name!r} must be a number, got {type(value).__name__}; "
                                "use record_matrix for arrays")
            out[wire.METHOD_METRIC_PREFIX + name] = float(value)
        return out

    def _messages(self, phase: str, message_type: str, server_round: int, pids: list[int],
                  content_of: Callable[[int], tuple[Payload, dict]]) -> list[Message]:
        self._pending[phase] = set(pids)
        messages = []
        # clients that get the same config and the same payload records share one RecordDict, as Flower's own
        # strategies send theirs (its records' type checks cost ~0.17 ms a message: 0.34 CPU-s a round at 1,000)
        contents: dict[tuple, RecordDict] = {}
        for pid in pids:
            payload, method_config = content_of(pid)
            clash = set(payload) & set(wire.RESERVED_RECORDS)
            if clash:
                raise ValueError(f"{type(self).__name__}: payload record name(s) {sorted(clash)} are reserved; "
                                 "put config values in train_config/evaluate_config")
            clash = set(method_config) & set(wire.BASE_CONFIG_KEYS)
            if clash:
                raise ValueError(f"{type(self).__name__}: config key(s) {sorted(clash)} belong to the base record")
            same = (tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in method_config.items()),
                    tuple((name, id(record)) for name, record in payload.items()))
            content = contents.get(same)
            if content is None:
                config = ConfigRecord({wire.SERVER_ROUND: server_round, wire.PHASE: phase,
                                       wire.RUN_TOKEN: self.run_token, **method_config})
                content = contents[same] = RecordDict({wire.CONFIG: config, **payload})
            messages.append(Message(content=content, dst_node_id=self.node_of[pid], message_type=message_type,
                                    group_id=str(server_round)))
        return messages

def _split_scores(n: np.ndarray, correct: np.ndarray, loss: np.ndarray, method: list[dict],
                  tag: str = "") -> tuple[np.ndarray, dict]:
    """One split's evaluation over the clients (``tag`` "" for test, "val-" for validation): their
    accuracies, and the sample-weighted accuracy and loss, the client-mean accuracy, and each method
    metric averaged both ways (``m.<tag><name>`` and ``...@client-mean``)."""
    acc = np.divide(correct, n, out=np.zeros_like(n), where=n > 0)
    weight = n / max(n.sum(), 1.0)
    out = {f"{tag}acc-weighted": float(correct.sum() / max(n.sum(), 1.0)), f"{tag}acc-client-mean": float(acc.mean()),
           f"{tag}loss": float((loss * weight).sum())}
    for name in sorted(set().union(*method)):
        values = [(m[name], w) for m, w in zip(method, weight) if name in m]
        total = sum(w for _, w in values)
        key = f"{wire.METHOD_METRIC_PREFIX}{tag}{name}"
        out[key] = float(sum(v * w for v, w in values) / total) if total > 0 else 0.0
        out[key + "@client-mean"] = float(np.mean([v for v, _ in values]))
    return acc, out


def _stateful(value) -> bool:
    """Whether ``value`` saves and loads its own state (a torch module or optimiser, FedFCD's head)."""
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def _finite_tree(value) -> bool:
    """True when every float in a nested structure of dicts, lists, arrays and tensors is finite."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind not in "fc" or _nonfinite(value)[0] is None
    if isinstance(value, dict):
        return all(_finite_tree(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite_tree(v) for v in value)
    if isinstance(value, (float, np.floating)):
        return math.isfinite(value)
    if hasattr(value, "detach") and hasattr(value, "is_floating_point"):  # a torch tensor
        return not value.is_floating_point() or bool(value.detach().isfinite().all())
    if hasattr(value, "state_dict") and callable(value.state_dict):  # a torch module or optimiser
        return _finite_tree(value.state_dict())
    return True


def weights_schema(weights: dict[str, np.ndarray]) -> dict[str, ArraySpec]:
    """Schema entry for a ``weights`` record: exactly these tensors, with these shapes and dtype kinds
    (an integer tensor sent as float, or the reverse, would change how it is averaged)."""
    return {key: ArraySpec(tuple(value.shape), value.dtype.kind) for key, value in weights.items()}
