"""The wire format: record names, metric keys and payload packers shared by server and clients.

Every message carries a ``config`` ConfigRecord (server -> client) or a ``metrics`` MetricRecord
(client -> server). Those two names are reserved: a method's payload can never replace them.
Method payloads are ArrayRecords named here, so a name is written once and both sides import it.
Payload kinds used across methods:

- ``weights``: model tensors by state-dict key (FedAvg, FedPer's body, FedSaC, FedMCSA, ...).
- ``class-features``: class-mean feature vectors ``class-ids`` (K,) int64, ``features`` (K, d) float32,
  ``counts`` (K,) int64 (FedProto, pFedPM, FedFCD).

Method-specific metrics travel in the same ``metrics`` record under keys that start with
``METHOD_METRIC_PREFIX``; the server averages them over clients and writes them to rounds.csv.
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

# Record names (CONFIG and METRICS are reserved for the base on both sides)
CONFIG = "config"
METRICS = "metrics"
RESERVED_RECORDS = (CONFIG, METRICS)
WEIGHTS = "weights"
CLASS_FEATURES = "class-features"

# Message actions beyond Flower's train/evaluate
HANDSHAKE = "query.handshake"
PREPARE = "query.prepare"  # round 0: the preparation phase of methods that ask for one

# Phases (config key PHASE, seeds, logs)
PHASES = ("handshake", "prepare", "train", "evaluate")

# Config keys the base writes into every message; a strategy's own config values may not reuse them
SERVER_ROUND = "server-round"
PHASE = "phase"
RUN_TOKEN = "run-token"  # random per run, kept on resume: names the clients' state folders
BASE_CONFIG_KEYS = (SERVER_ROUND, PHASE, RUN_TOKEN)

# Metric keys
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
EVAL_LOSS = "loss"
CORRECT = "correct"
NUM_TRAIN = "num-train"
NUM_TEST = "num-test"
TRAIN_LABEL_COUNTS = "train-label-counts"
TEST_LABEL_COUNTS = "test-label-counts"
INPUT_SHAPE = "input-shape"
NUM_CLASSES = "num-classes"
STATE_ROUND = "state-round"  # round in which the client state this reply started from was written (0: none)
STATE_SAVED = "state-saved"  # 1 if the client wrote state while handling this message
METHOD_METRIC_PREFIX = "m."  # method-specific metrics, e.g. "m.relation-acc"


def pack_arrays(arrays: Mapping[str, object]) -> ArrayRecord:
    """Numpy arrays or torch tensors by name -> ArrayRecord (torch tensors are detached to CPU)."""
    out = {}
    for key, value in arrays.items():
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        out[key] = Array(np.ascontiguousarray(value))
    return ArrayRecord(out)


def array_view(array: Array) -> np.ndarray:
    """A read-only numpy view of an Array's bytes, without the copy that ``Array.numpy()`` makes.

    Flower stores arrays as ``.npy`` bytes; the header gives dtype, shape and order, the rest is the
    data itself, so a view costs nothing whatever the array's size (about 0.4 ms saved per array,
    seconds per round at 1,000 clients). Pickled object arrays are refused, as in ``Array.numpy``.
    """
    if array.stype != "numpy.ndarray":
        return array.numpy()  # raises Flower's own error for unknown serialisations
    data = array.data
    head = memoryview(data)
    if len(head) < 10 or bytes(head[:6]) != b"\x93NUMPY":
        raise ValueError("array data is not in .npy format")
    major = head[6]
    if major == 1:
        header_len, start = int.from_bytes(head[8:10], "little"), 10
    elif major in (2, 3) and len(head) >= 12:
        header_len, start = int.from_bytes(head[8:12], "little"), 12
    else:
        raise ValueError(f"unsupported .npy format version {major}")
    if start + header_len > len(head):
        raise ValueError("array data ends inside its .npy header")
    dtype, shape, order = _npy_header(bytes(head[start:start + header_len]))
    count = math.prod(shape)
    offset = start + header_len
    if len(data) - offset != count * dtype.itemsize:
        raise ValueError(f"array data holds {len(data) - offset} bytes, its header says {count * dtype.itemsize}")
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape, order=order)


@functools.lru_cache(maxsize=4096)
def _npy_header(text: bytes) -> tuple[np.dtype, tuple[int, ...], str]:
    """(dtype, shape, order) of an .npy header; cached, since every client's copy of a tensor has the
    same header and parsing it costs more than viewing the data."""
    try:
        header = ast.literal_eval(text.decode("latin1"))
        if not isinstance(header, dict) or {"descr", "shape", "fortran_order"} - set(header):
            raise ValueError
        dtype = np.dtype(header["descr"])
        shape = tuple(int(s) for s in header["shape"])
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError("malformed .npy header") from None
    if dtype.hasobject:
        raise ValueError("object arrays are not accepted")
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    return dtype, shape, "F" if header["fortran_order"] else "C"


def unpack_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """ArrayRecord -> ``{name: read-only numpy view}`` in record order (no copies)."""
    return {key: array_view(record[key]) for key in record.keys()}


def pack_class_features(class_ids: np.ndarray, features: np.ndarray, counts: np.ndarray) -> ArrayRecord:
    """Class-mean features (one row per class present) as one record."""
    return pack_arrays(
        {
            "class-ids": np.asarray(class_ids, dtype=np.int64),
            "features": np.asarray(features, dtype=np.float32),
            "counts": np.asarray(counts, dtype=np.int64),
        }
    )


def unpack_class_features(record: ArrayRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arrays = unpack_arrays(record)
    return arrays["class-ids"], arrays["features"], arrays["counts"]


CLASS_FEATURES_SCHEMA = {"class-ids": None, "features": None, "counts": None}


# ----------------------------------------------------------------------------- bytes on the wire
def _value_bytes(value) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_value_bytes(v) for v in value) + 2
    if isinstance(value, (bytes, str)):
        return len(value) + 2
    return 9  # a number or bool: tag + up to 8 bytes


def record_bytes(record) -> int:
    """Bytes one record takes on the wire, from its arrays' sizes (no serialisation).

    Array data dominates every real payload; keys, dtype/shape fields and scalar values are
    counted with their protobuf framing, so the estimate stays within a few bytes per entry of
    the serialised size (tests/test_wire.py checks it against Flower's own serialiser).
    """
    if isinstance(record, ArrayRecord):
        total = 0
        for key in record.keys():
            a = record[key]
            total += len(a.data) + len(key) + len(a.dtype) + len(a.stype) + 3 * len(a.shape) + 16
        return total
    if isinstance(record, (ConfigRecord, MetricRecord)):
        return sum(len(k) + _value_bytes(v) + 4 for k, v in record.items())
    raise TypeError(f"unknown record type {type(record).__name__}")


def content_bytes(content: RecordDict, seen: dict | None = None) -> int:
    """Bytes of a message's content. ``seen`` (id -> bytes) lets a caller count a record shared by
    many messages (FedAvg's global model) once per message without measuring it again."""
    total = 0
    for name, record in content.items():
        if seen is not None and id(record) in seen:
            size = seen[id(record)]
        else:
            size = record_bytes(record)
            if seen is not None:
                seen[id(record)] = size
        total += size + len(name) + 6
    return total


def serialised_bytes(content: RecordDict) -> int:
    """The exact protobuf size of a content (slow: serialises it); the reference for tests."""
    from flwr.common.serde import recorddict_to_proto

    return recorddict_to_proto(content).ByteSize()
