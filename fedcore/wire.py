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


RAW_STYPE = "raw-le"  # little-endian C-order bytes; dtype and shape are the Array's own fields


def pack_arrays(arrays: Mapping[str, object], compact: bool = False) -> ArrayRecord:
    """Numpy arrays or torch tensors by name -> ArrayRecord (torch tensors are detached to CPU).

    By default each array is Flower's ``.npy`` serialisation, which Flower's own ``ArrayRecord``
    methods read. ``compact`` stores the raw bytes instead (``RAW_STYPE``): the Array message already
    carries dtype and shape, so the 128-byte ``.npy`` header is redundant, and for the small payloads of
    the feature-exchanging methods (class features, FedFCD's head) it is a tenth of what they send.
    Only ``array_view``/``unpack_arrays`` read compact arrays, so client state and model weights stay ``.npy``.
    """
    out = {}
    for key, value in arrays.items():
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        if compact:
            value = np.asarray(value, order="C")  # keeps 0-d arrays 0-d, unlike ascontiguousarray
            if value.dtype.kind not in "biufc":
                raise ValueError(f"{key}: only numeric arrays can be sent compact, not {value.dtype}")
            value = value.astype(value.dtype.newbyteorder("<"), copy=False)
            out[key] = Array(dtype=value.dtype.str, shape=tuple(value.shape), stype=RAW_STYPE, data=value.tobytes())
        else:
            out[key] = Array(np.ascontiguousarray(value))
    return ArrayRecord(out)


def _raw_view(array: Array) -> np.ndarray:
    try:
        dtype = np.dtype(array.dtype)
    except TypeError:
        raise ValueError(f"unknown dtype {array.dtype!r}") from None
    if dtype.kind not in "biufc":
        raise ValueError(f"dtype {dtype} is not numeric")
    shape = tuple(int(s) for s in array.shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    count = math.prod(shape)
    if len(array.data) != count * dtype.itemsize:
        raise ValueError(f"array data holds {len(array.data)} bytes, its shape {shape} and dtype need "
                         f"{count * dtype.itemsize}")
    return np.frombuffer(array.data, dtype=dtype, count=count).reshape(shape)


def array_view(array: Array) -> np.ndarray:
    """A read-only numpy view of an Array's bytes, without the copy that ``Array.numpy()`` makes.

    Flower stores arrays as ``.npy`` bytes (compact ones, ``RAW_STYPE``, as the bare data); the header
    gives dtype, shape and order, the rest is the data itself, so a view costs nothing whatever the array's size (about 0.4 ms saved per array,
    seconds per round at 1,000 clients). Pickled object arrays are refused, as in ``Array.numpy``.
    """
    if array.stype == RAW_STYPE:
        return _raw_view(array)
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
    """Class-mean features (one row per class present) as one record (compact arrays)."""
    return pack_arrays(
        {
            "class-ids": np.asarray(class_ids, dtype=np.int64),
            "features": np.asarray(features, dtype=np.float32),
            "counts": np.asarray(counts, dtype=np.int64),
        },
        compact=True,
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


def _varint_len(n: int) -> int:
    return max(1, (int(n).bit_length() + 6) // 7)


def _field_len(n: int) -> int:
    """A length-delimited protobuf field of ``n`` bytes: tag, length, payload."""
    return 1 + _varint_len(n) + n


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
            dims = sum(_varint_len(d) for d in a.shape)
            array = (_field_len(len(a.dtype)) + (_field_len(dims) if dims else 0) + _field_len(len(a.stype))
                     + _field_len(len(a.data)))
            total += _field_len(_field_len(len(key)) + _field_len(array))
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
