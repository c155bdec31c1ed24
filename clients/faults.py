"""Fault injection: a seeded share of clients misbehaves in each training round (off by default).

``faults.share`` of the clients (``ceil``, at least one when the share is above 0) are picked per
round from (seed, round); each gets one of ``faults.kinds`` (comma-separated):

- ``raise``: the ClientApp raises, so the server gets an error reply;
- ``hang``: the client sleeps past ``round-timeout`` before answering;
- ``nan``: its first float array (or its train loss) becomes NaN;
- ``shape``: its first array gets one element too many;
- ``missing``: its first array record (or its metrics record) is left out;
- ``wrong-pid``: it claims the next client's partition id;
- ``huge``: its float arrays are multiplied by 1e6 (finite, but far beyond any model);
- ``overflow``: its float arrays are set to 1e30, whose norm overflows.

The client trains (or raises) as it would, so its own state moves on exactly as if the reply had
been lost on the way: a run with faults and a run whose same replies never arrive end in the same
server state (tests/test_reliability.py).
"""

from __future__ import annotations

import math
import time

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fedcore import wire
from fedcore.config import FAULT_KINDS as KINDS
from fedcore.config import parse_fault_kinds as parse_kinds


class InjectedFault(RuntimeError):
    """The fault-injection option made this client fail on purpose."""


def fault_for(cfg, pid: int, num_clients: int, server_round: int) -> str | None:
    """The fault this client injects in this round, or None. Every client computes the same plan."""
    share = cfg["faults.share"]
    if share <= 0:
        return None
    kinds = parse_kinds(cfg["faults.kinds"])
    rng = np.random.default_rng([cfg["seed"], server_round, 4242])
    k = min(num_clients, max(1, math.ceil(share * num_clients - 1e-9)))
    faulty = rng.choice(num_clients, size=k, replace=False)
    picks = rng.integers(len(kinds), size=k)
    plan = {int(c): kinds[int(i)] for c, i in zip(faulty, picks)}
    return plan.get(pid)


def before(kind: str | None, cfg) -> None:
    """Faults that strike before the method runs."""
    if kind == "raise":
        raise InjectedFault("injected fault: the client raised")
    if kind == "hang":
        time.sleep(cfg["round-timeout"] + 5)


def corrupt(kind: str | None, records: dict, metrics: dict, pid: int, num_clients: int) -> tuple[dict, dict | None]:
    """Damage a finished reply's records and metrics; metrics None means: leave the metrics record out."""
    if kind in (None, "raise", "hang"):
        return records, metrics
    records = dict(records)
    metrics = dict(metrics)
    unpacked = {name: wire.unpack_arrays(rec) for name, rec in records.items() if isinstance(rec, ArrayRecord)}
    floats = [(name, key) for name, arrays in unpacked.items() for key, view in arrays.items() if view.dtype.kind == "f"]
    if kind == "wrong-pid":
        metrics[wire.PARTITION_ID] = (pid + 1) % num_clients
    elif kind == "missing":
        if unpacked:
            records.pop(next(iter(unpacked)))
        else:
            return records, None
    elif kind in ("nan", "shape") and floats:
        name, key = floats[0]
        values = np.array(unpacked[name][key], dtype=np.float64)
        values = np.full_like(values, np.nan) if kind == "nan" else np.append(values.ravel(), 0.0)
        records[name] = _replace(records[name], unpacked[name], {key: values.astype(np.float32)})
    elif kind in ("huge", "overflow") and floats:
        for name in dict.fromkeys(n for n, _ in floats):
            new = {key: (view * 1e6 if kind == "huge" else np.full_like(view, 1e30)).astype(view.dtype)
                   for key, view in unpacked[name].items() if view.dtype.kind == "f"}
            records[name] = _replace(records[name], unpacked[name], new)
    else:  # nothing to damage in the arrays: the train loss carries the fault
        metrics[wire.TRAIN_LOSS] = float("nan")
    return records, metrics


def _replace(record: ArrayRecord, arrays: dict[str, np.ndarray], changed: dict[str, np.ndarray]) -> ArrayRecord:
    """``record`` with some arrays replaced, in the same layout (packed or one Array per name)."""
    merged = {key: changed.get(key, view) for key, view in arrays.items()}
    if wire.PACKED_KEY in record and record[wire.PACKED_KEY].stype == wire.PACKED_STYPE:
        return wire.pack_arrays(merged)
    return ArrayRecord({key: Array(np.ascontiguousarray(value)) for key, value in merged.items()})


def reply_content(records: dict, metrics: dict | None) -> RecordDict:
    content = dict(records)
    if metrics is not None:
        content[wire.METRICS] = MetricRecord(metrics)
    return RecordDict(content)
