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
import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

if TYPE_CHECKING:
    import torch

# Record names (CONFIG and METRICS are reserved for the base on both sides)
CONFIG = "config"
METRICS = "metrics"
PLACEMENT = "placement"  # client -> server ConfigRecord: where the reply was computed (PLACEMENT_KEYS)
RESERVED_RECORDS = (CONFIG, METRICS, PLACEMENT)
PLACEMENT_KEYS = ("host", "pid", "node-ip", "ray-node-id")  # node-ip and ray-node-id: "" outside Ray
WEIGHTS = "weights"
CLASS_FEATURES = "class-features"
# array keys of the class-feature payload (and of the records made of class features: pFedPM's global features,
# MuPFL's federated features): (K,) int64 class ids, (K, d) float32 features, (K,) int64 counts
CLASS_IDS = "class-ids"
FEATURES = "features"
COUNTS = "counts"

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
# Config key any strategy may send: this message's learning rate (a decay schedule); the client base
# reads it (``ClientEnv.lr``) and falls back to the run config's ``lr``
LR = "lr"

# Metric keys
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
EVAL_LOSS = "loss"
CORRECT = "correct"
NUM_TRAIN = "num-train"
NUM_TEST = "num-test"
NUM_VAL = "num-val"  # validation samples (val-fraction of the training split); 0 or absent: none
TRAIN_LABEL_COUNTS = "train-label-counts"
TEST_LABEL_COUNTS = "test-label-counts"
INPUT_SHAPE = "input-shape"
NUM_CLASSES = "num-classes"
STATE_ROUND = "state-round"  # round in which the client state this reply started from was written (0: none)
STATE_SAVED = "state-saved"  # 1 if the client wrote state while handling this message
METHOD_METRIC_PREFIX = "m."  # method-specific metrics, e.g. "m.relation-acc"
# An evaluate reply of a client that holds a validation split scores the same model on it as well:
VAL_NUM_EXAMPLES = "val-num-examples"
VAL_CORRECT = "val-correct"
VAL_LOSS = "val-loss"
VAL_METRICS = (VAL_NUM_EXAMPLES, VAL_CORRECT, VAL_LOSS)
VAL_METHOD_METRIC_PREFIX = "val.m."  # its method metrics on validation, e.g. "val.m.relation-acc"


RAW_STYPE = "raw-le"  # little-endian C-order bytes; dtype and shape are the Array's own fields
PACKED_STYPE = "pfl-packed/1"  # many arrays in one Array: see pack_arrays
PACKED_KEY = "packed"  # the one key of a packed ArrayRecord
_PACKED_MAGIC = b"PFLPACK1"
_PACKED_ALIGN = 64  # every array starts at a multiple of this: views are aligned for any dtype


def to_host(value) -> np.ndarray:
    """A tensor (on any device, with or without grad) or array-like as a numpy array in host memory.

    The one way from a device to numpy or the wire: ``Tensor.numpy()`` refuses CUDA tensors and
    tensors that require grad, so every conversion that may meet one goes through here."""
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def to_device(value, device, dtype=None) -> torch.Tensor:
    """A writable tensor on ``device`` from a numpy array (a read-only wire view is copied, never
    aliased) or a tensor on another device: the way back from the wire to a client's device."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype)
    return torch.tensor(np.asarray(value), device=device, dtype=dtype)


def pack_arrays(arrays: Mapping[str, object], compact: bool = False) -> ArrayRecord:
    """Numpy arrays or torch tensors by name -> ArrayRecord (torch tensors are detached to CPU).

    By default all arrays travel as ONE Flower ``Array`` (``PACKED_STYPE``, under ``PACKED_KEY``):
    Flower 1.41 moves every Array of a message as its own object (an Array and its chunk, each a
    request to pull and a request to push), so a model of 8 tensors cost 16 object requests per hop
    and message; deployed, those requests took more CPU than the training (README "Deployment").
    The one Array's bytes are ``PFLPACK1``, a 4-byte header length, a JSON header
    ``[[name, dtype, shape], ...]`` and then each array's little-endian C-order bytes, each starting
    at a multiple of 64 bytes. ``unpack_arrays``/``torch_arrays`` read it (and plain ArrayRecords
    of one Array per name, e.g. from a client written with Flower's own ``ArrayRecord``).

    ``compact`` keeps one raw Array per name instead (``RAW_STYPE``: the Array message already
    carries dtype and shape): the small class-feature and head payloads of the feature-exchanging
    methods, where a few hundred bytes count and there are only two or three arrays.
    """
    values = {}
    for key, value in arrays.items():
        value = np.asarray(to_host(value), order="C")  # keeps 0-d arrays 0-d, unlike ascontiguousarray
        if value.dtype.kind not in "biufc":
            raise ValueError(f"{key}: only numeric arrays can be sent, not {value.dtype}")
        values[str(key)] = value.astype(value.dtype.newbyteorder("<"), copy=False)
    if compact:
        return ArrayRecord({key: Array(dtype=v.dtype.str, shape=tuple(v.shape), stype=RAW_STYPE, data=v.tobytes())
                            for key, v in values.items()})
    header = json.dumps([[k, v.dtype.str, list(v.shape)] for k, v in values.items()], separators=(",", ":")).encode()
    offsets, end = _packed_offsets(len(header), [v.nbytes for v in values.values()])
    # one copy of the arrays, straight into the record's bytes (a bytearray filled and then turned into bytes
    # was two: 1.6-2.6 ms against 0.7 ms for the 0.8 MB CNN on a loaded 2-core machine)
    parts: list = [_PACKED_MAGIC, len(header).to_bytes(4, "little"), header]
    at = len(_PACKED_MAGIC) + 4 + len(header)
    for value, offset in zip(values.values(), offsets):
        parts += [bytes(offset - at), memoryview(value.reshape(-1).view(np.uint8))]
        at = offset + value.nbytes
    return ArrayRecord({PACKED_KEY: Array(dtype="uint8", shape=(end,), stype=PACKED_STYPE, data=b"".join(parts))})


def empty_packed(layout: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> tuple[bytearray, dict[str, np.ndarray]]:
    """The bytes of a packed record of arrays with these names, dtypes and shapes (zeroed), and a writable view
    of each array in them: a server that computes a record's arrays piece by piece writes them there and then
    makes the record with ``packed_record``, byte for byte what ``pack_arrays`` makes of the same arrays, with
    no array of its own in between."""
    dtypes = {str(k): np.dtype(dtype).newbyteorder("<") for k, (dtype, _) in layout.items()}
    shapes = {str(k): tuple(int(d) for d in shape) for k, (_, shape) in layout.items()}
    header = json.dumps([[k, dtypes[k].str, list(shapes[k])] for k in dtypes], separators=(",", ":")).encode()
    offsets, end = _packed_offsets(len(header), [dtypes[k].itemsize * math.prod(shapes[k]) for k in dtypes])
    buffer = bytearray(end)
    buffer[:len(_PACKED_MAGIC) + 4 + len(header)] = _PACKED_MAGIC + len(header).to_bytes(4, "little") + header
    views = {k: np.frombuffer(buffer, dtype=dtypes[k], count=math.prod(shapes[k]), offset=offset).reshape(shapes[k])
             for k, offset in zip(dtypes, offsets)}
    return buffer, views


def packed_record(buffer: bytearray) -> ArrayRecord:
    """The record of an ``empty_packed`` buffer once its views are filled (Flower's Array holds bytes: one copy)."""
    return ArrayRecord({PACKED_KEY: Array(dtype="uint8", shape=(len(buffer),), stype=PACKED_STYPE,
                                          data=bytes(buffer))})


def _packed_offsets(header_len: int, sizes: list[int]) -> tuple[list[int], int]:
    """Where each array of a packed Array starts, and where the last one ends."""
    offsets, end = [], len(_PACKED_MAGIC) + 4 + header_len
    for size in sizes:
        start = -(-end // _PACKED_ALIGN) * _PACKED_ALIGN
        offsets.append(start)
        end = start + size
    return offsets, end


def _packed_views(data: bytes | bytearray) -> dict[str, np.ndarray]:
    """``{name: view}`` of a packed Array's bytes (read-only for bytes, writable for a bytearray)."""
    head = memoryview(data)
    start = len(_PACKED_MAGIC) + 4
    if len(head) < start or bytes(head[:len(_PACKED_MAGIC)]) != _PACKED_MAGIC:
        raise ValueError("packed array data does not start with its magic bytes")
    header_len = int.from_bytes(head[len(_PACKED_MAGIC):start], "little")
    if start + header_len > len(head):
        raise ValueError("packed array data ends inside its header")
    layout = _packed_layout(bytes(head[start:start + header_len]))
    offsets, end = _packed_offsets(header_len, [dtype.itemsize * math.prod(shape) for _, dtype, shape in layout])
    if end != len(head):
        raise ValueError(f"packed array data holds {len(head)} bytes, its header says {end}")
    return {name: np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
            for (name, dtype, shape), offset in zip(layout, offsets)}


@functools.lru_cache(maxsize=1024)
def _packed_layout(text: bytes) -> tuple[tuple[str, np.dtype, tuple[int, ...]], ...]:
    """The (name, dtype, shape) entries of a packed header; cached, as every client's copy of a
    model has the same header."""
    try:
        entries = json.loads(text.decode())
        layout = tuple((name, np.dtype(dtype), tuple(shape)) for name, dtype, shape in entries)
    except (ValueError, TypeError, UnicodeDecodeError, RecursionError):
        raise ValueError("malformed packed array header") from None
    names = [name for name, _, _ in layout]
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError("packed array header names must be distinct strings")
    for name, dtype, shape in layout:
        if dtype.kind not in "biufc":
            raise ValueError(f"packed array {name!r} has dtype {dtype}, not a number")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ValueError(f"packed array {name!r} has a bad shape {list(shape)}")
    return layout


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


def _is_packed(record: ArrayRecord) -> bool:
    return PACKED_KEY in record and record[PACKED_KEY].stype == PACKED_STYPE


def unpack_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """ArrayRecord (packed or one Array per name) -> ``{name: read-only numpy view}`` in the order
    they were packed (no copies). Malformed data raises ValueError."""
    if _is_packed(record):
        return _packed_views(record[PACKED_KEY].data)
    return {key: array_view(record[key]) for key in record.keys()}


def torch_arrays(record: ArrayRecord, device=None) -> dict[str, torch.Tensor]:
    """ArrayRecord -> ``{name: writable tensor}``, for ``load_state_dict``: one copy of the packed
    bytes that every CPU tensor views, where Flower's ``to_torch_state_dict`` copies per array;
    ``device`` (a client's GPU) moves them there, one host-to-device copy per tensor."""
    import torch

    if _is_packed(record):
        tensors = {k: torch.from_numpy(v) for k, v in _packed_views(bytearray(record[PACKED_KEY].data)).items()}
    else:
        tensors = {k: torch.from_numpy(np.array(v)) for k, v in unpack_arrays(record).items()}
    if device is not None and torch.device(device).type != "cpu":
        tensors = {k: v.to(device) for k, v in tensors.items()}
    return tensors


def pack_class_features(class_ids: np.ndarray, features: np.ndarray, counts: np.ndarray) -> ArrayRecord:
    """Class-mean features (one row per class present) as one record (compact arrays)."""
    return pack_arrays(
        {
            CLASS_IDS: np.asarray(class_ids, dtype=np.int64),
            FEATURES: np.asarray(features, dtype=np.float32),
            COUNTS: np.asarray(counts, dtype=np.int64),
        },
        compact=True,
    )


def unpack_class_features(record: ArrayRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arrays = unpack_arrays(record)
    return arrays[CLASS_IDS], arrays[FEATURES], arrays[COUNTS]


CLASS_FEATURES_SCHEMA = {CLASS_IDS: None, FEATURES: None, COUNTS: None}


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


def content_bytes(content: RecordDict, seen: dict | None = None, leave_out: tuple[str, ...] = ()) -> int:
    """Bytes of a message's content. ``seen`` (id -> bytes) lets a caller count a record shared by
    many messages (FedAvg's global model) once per message without measuring it again; the records
    named in ``leave_out`` are not counted."""
    total = 0
    for name, record in content.items():
        if name in leave_out:
            continue
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


def placement_of(msg) -> dict | None:
    """A reply's ``PLACEMENT`` record as a dict of ``PLACEMENT_KEYS`` (None for an error reply or a
    client that sent none): which machine and process computed it, for the run's placement.csv."""
    if msg.has_error():
        return None
    record = msg.content.get(PLACEMENT)
    if not isinstance(record, ConfigRecord):
        return None
    return {key: record.get(key, "") for key in PLACEMENT_KEYS}
