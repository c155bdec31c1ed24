"""What the server accepts from a client: the reply types and their validation.

``ReplyValidation.validate`` keeps the well-formed replies of a phase, in partition-id order, and drops every
other one with a logged, counted reason: client errors, missing or non-finite metrics, a partition id that is
not the node's, sizes beyond what the client declared at the handshake, records or arrays that are missing,
misshapen, of the wrong dtype kind or hold NaN/Inf, replies from clients not asked, duplicates, and record
norms far beyond the round's median (``reply-norm-bound``). It also notes clients that come back without the
state they had (a restarted SuperNode). ``PersonalizedStrategy`` (fedstrategies/base.py) mixes it in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import WARNING

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.common.logger import log

from fedcore import wire


@dataclass(frozen=True)
class ArraySpec:
    """An array a reply must carry: its exact shape (None: any) and its dtype kind ("f" float,
    "i" signed int, "u", "b"; None: any). A plain shape tuple in a schema means any float or int."""

    shape: tuple[int, ...] | None
    kind: str | None = None


# A reply schema: record name -> {array key: expected shape, ArraySpec, or None for "any array"}.
Schema = dict[str, dict[str, "tuple[int, ...] | ArraySpec | None"]]


@dataclass
class ClientReply:
    """A validated reply: who sent it, in which phase, its weight, metrics and arrays.

    ``arrays[record][key]`` are read-only numpy views into the message's bytes (no copies); a rule
    that keeps one beyond the round must copy it (``np.array(view)``).
    """

    pid: int
    node_id: int
    num_examples: int
    metrics: dict
    arrays: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    phase: str = "train"
    norms: dict[str, float] = field(default_factory=dict)  # L2 norm of each record's float arrays

    def method_metrics(self) -> dict[str, float]:
        """The client's method-specific scalars (``m.*`` keys, prefix stripped)."""
        n = len(wire.METHOD_METRIC_PREFIX)
        return {k[n:]: v for k, v in self.metrics.items()
                if k.startswith(wire.METHOD_METRIC_PREFIX) and isinstance(v, (int, float))}


class ReplyValidation:
    """The reply checks of ``PersonalizedStrategy``; they read its ``cfg``, ``clients``, ``pid_of``, ``_pending``
    (who was asked, per phase), ``check_reply`` and ``reference_norm`` hooks, and append to its ``dropped`` and
    ``state_lost`` lists."""

    def _drop(self, server_round: int, phase: str, who, reason: str) -> None:
        self.dropped.append({"round": server_round, "phase": phase, "client": who, "reason": reason})
        log(WARNING, "round %s %s: dropped reply from client %s: %s", server_round, phase, who, reason)

    def validate(self, server_round: int, phase: str, replies: Iterable[Message], schema_of,
                 required_metrics: tuple[str, ...] = ()) -> list[ClientReply]:
        """Keep the well-formed replies, in partition-id order; log and count every other one
        (and every missing one)."""
        valid: dict[int, ClientReply] = {}
        answered: set = set()
        for msg in replies:
            node = msg.metadata.src_node_id
            who = self.pid_of.get(node, f"node {node}")
            answered.add(who)
            reason, reply = self._parse(msg, node, schema_of, required_metrics)
            if reply is not None and reply.pid not in self._pending.get(phase, ()):
                reason, reply = f"unexpected reply (client {reply.pid} was not asked this round)", None
            if reply is not None and reply.pid in valid:
                reason, reply = "duplicate reply", None
            if reply is not None:
                reply.phase = phase
                if phase != "evaluate":
                    reason = self.check_reply(reply)
            if reason is not None:
                self._drop(server_round, phase, who, reason)
            else:
                valid[reply.pid] = reply
        for pid in sorted(self._pending.get(phase, set()) - answered):
            self._drop(server_round, phase, pid, "no reply (timed out or node gone)")
        ordered = [valid[pid] for pid in sorted(valid)]
        if phase != "evaluate" and self.cfg["reply-norm-bound"] > 0:
            ordered = self._bound_norms(server_round, phase, ordered)
        for reply in ordered:
            self._track_state(server_round, phase, reply)
        return ordered

    def _bound_norms(self, server_round: int, phase: str, replies: list[ClientReply]) -> list[ClientReply]:
        """Drop replies whose record norms are absurd: beyond ``reply-norm-bound`` times the larger of
        the round's (lower) median norm and the state's ``reference_norm``. The median keeps one
        hostile client from setting the scale; the bound holds while fewer than half the replies of
        a round are absurd, and the reference covers rounds with only one or two replies."""
        bound = self.cfg["reply-norm-bound"]
        keep = list(replies)
        for record in sorted({name for r in replies for name in r.norms}):
            norms = sorted(r.norms[record] for r in keep if record in r.norms)
            if not norms:
                continue
            median = norms[(len(norms) - 1) // 2]
            reference = self.reference_norm(record) or 0.0
            scale = max(median, reference)
            if scale <= 0:
                continue
            limit = bound * scale
            for r in [r for r in keep if r.norms.get(record, 0.0) > limit]:
                self._drop(server_round, phase, r.pid,
                           f"{record} has norm {r.norms[record]:.3g}, beyond {bound:g} x {scale:.3g} (the round's "
                           f"median {median:.3g}, the server state's {reference:.3g}); see reply-norm-bound")
                keep.remove(r)
        return keep

    def _track_state(self, server_round: int, phase: str, reply: ClientReply) -> None:
        """Warn when a client that kept state comes back without it (a restarted SuperNode)."""
        had = self._state_round.get(reply.pid, 0)
        got = int(reply.metrics.get(wire.STATE_ROUND, 0))
        if had > 0 and got < had:
            self.state_lost.append({"round": server_round, "phase": phase, "client": reply.pid,
                                    "had": had, "got": got})
            log(WARNING, "round %s %s: client %s lost its state from round %s (it now has %s); its SuperNode "
                "probably restarted, so it goes on from what it has", server_round, phase, reply.pid, had,
                got or "none")
        if reply.metrics.get(wire.STATE_SAVED):
            self._state_round[reply.pid] = server_round

    def _parse(self, msg: Message, node: int, schema_of, required_metrics) -> tuple[str | None, ClientReply | None]:
        if msg.has_error():
            return f"client error: {msg.error.reason}", None
        content = msg.content  # read with .get: RecordDict.array_records/metric_records rebuild dicts per call
        if not isinstance(content.get(wire.METRICS), MetricRecord):
            return "missing metrics record", None
        metrics = dict(content[wire.METRICS])
        for key in (wire.PARTITION_ID, wire.NUM_EXAMPLES, *required_metrics):
            if key not in metrics:
                return f"missing metric {key!r}", None
        for key, value in metrics.items():
            values = value if isinstance(value, list) else [value]
            if not all(math.isfinite(v) for v in values):
                return f"non-finite metric {key!r}", None
        for key in (wire.PARTITION_ID, wire.NUM_EXAMPLES, wire.CORRECT, wire.VAL_NUM_EXAMPLES, wire.VAL_CORRECT):
            if key in metrics and (isinstance(metrics[key], list) or float(metrics[key]) != int(metrics[key])):
                return f"metric {key!r} must be an integer, got {metrics[key]!r}", None
        pid = int(metrics[wire.PARTITION_ID])
        if self.pid_of.get(node) != pid:
            return f"partition id {pid} does not match node {node} (expected {self.pid_of.get(node)})", None
        n = int(metrics[wire.NUM_EXAMPLES])
        info = self.clients[pid]
        most = info.num_test if wire.CORRECT in required_metrics else info.num_train
        if not 0 <= n <= most:
            return f"num-examples {n} is outside 0..{most} (what the client declared at the handshake)", None
        if wire.CORRECT in metrics and not 0 <= int(metrics[wire.CORRECT]) <= n:
            return f"correct = {metrics[wire.CORRECT]} is outside 0..{n}", None
        if wire.CORRECT in required_metrics and (info.num_val > 0 or any(k in metrics for k in wire.VAL_METRICS)):
            # an evaluation of a client that declared a validation split must score it, within its size
            for key in wire.VAL_METRICS:
                if key not in metrics:
                    return f"missing metric {key!r}", None
            n_val = int(metrics[wire.VAL_NUM_EXAMPLES])
            if not 0 <= n_val <= info.num_val:
                return (f"{wire.VAL_NUM_EXAMPLES} {n_val} is outside 0..{info.num_val} (what the client declared "
                        "at the handshake)"), None
            if not 0 <= int(metrics[wire.VAL_CORRECT]) <= n_val:
                return f"{wire.VAL_CORRECT} = {metrics[wire.VAL_CORRECT]} is outside 0..{n_val}", None
        arrays: dict[str, dict[str, np.ndarray]] = {}
        norms: dict[str, float] = {}
        for record_name, keys in schema_of(pid).items():
            record = content.get(record_name)
            if not isinstance(record, ArrayRecord):
                return f"missing array record {record_name!r}", None
            arrays[record_name] = {}
            try:
                views = wire.unpack_arrays(record)
            except (ValueError, TypeError) as err:
                return f"record {record_name!r} cannot be read: {err}", None
            for key, shape in keys.items():
                if key not in views:
                    return f"record {record_name!r} lacks array {key!r}", None
                array = views[key]
                spec = shape if isinstance(shape, ArraySpec) else ArraySpec(shape)
                if spec.shape is not None and tuple(array.shape) != tuple(spec.shape):
                    return f"{record_name}/{key} has shape {tuple(array.shape)}, expected {tuple(spec.shape)}", None
                if spec.kind is not None and array.dtype.kind != spec.kind:
                    return f"{record_name}/{key} has dtype {array.dtype}, expected kind {spec.kind!r}", None
                if array.dtype.kind not in "fiub":
                    return f"{record_name}/{key} has dtype {array.dtype}, not a number", None
                if array.dtype.kind in "fc":
                    problem, squared = _nonfinite(array)
                    if problem:
                        return f"{record_name}/{key} {problem}", None
                    norms[record_name] = norms.get(record_name, 0.0) + squared
                arrays[record_name][key] = array
        norms = {name: math.sqrt(value) for name, value in norms.items()}
        return None, ClientReply(pid, node, n, metrics, arrays, norms=norms)


def _nonfinite(array: np.ndarray) -> tuple[str | None, float]:
    """(problem, squared norm) in one pass without a temporary: a dot product propagates NaN/Inf,
    and it overflows for float32 values beyond about 1e19, which no model holds. The exact element
    check runs only when the dot product is not finite, to say which of the two it was."""
    flat = array.reshape(-1)
    if flat.size == 0:
        return None, 0.0
    squared = float(np.real(np.vdot(flat, flat)))
    if math.isfinite(squared):
        return None, squared
    if not np.isfinite(flat).all():
        return "contains NaN or Inf", squared
    return "holds values so large that its norm overflows", squared
