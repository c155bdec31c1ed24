"""Server checkpoints: everything needed to continue a run after the round it was written in.

After every round the ServerApp writes ``<run dir>/checkpoints/round-NNNNN.ckpt``: the round, the
run token (which also names the clients' state folders), the strategy's state (its
``checkpoint_attrs`` plus what the base tracks: dropped replies, client state rounds, the server's
torch generator), the results rows so far and the run config. The write is atomic (temporary file,
fsync, rename, fsync of the folder), so a crash at any moment leaves the previous checkpoint
intact, and only the last ``checkpoint-keep`` are kept.

A checkpoint is data only, so that reading one can never run code (a results folder may come from
anyone; Python pickles, the format before version 2, are refused for that reason)::

    pfl-flower checkpoint\\n                           the magic line: anything else is a foreign file
    {"version": 2, "bytes": n, "sha256": "..."}\\n    the format version and the payload's size and hash
    <n bytes>                                         Flower's RecordDict protobuf: the typed tree below

The tree (``encode``) is JSON in the RecordDict's ``tree`` ConfigRecord, with every numpy array and
torch tensor as raw bytes in its ``arrays`` ArrayRecord and every Flower ArrayRecord as a record of
its own. A value of a type the tree does not know is refused when the checkpoint is written.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from logging import WARNING
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.common.logger import log
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from fedcore import wire

FOLDER = "checkpoints"
VERSION = 2
MAGIC = b"pfl-flower checkpoint\n"
_MAX_HEADER = 4096
_NONFINITE = ("nan", "inf", "-inf")  # repr() of the floats JSON cannot hold
# keys that may differ between the interrupted run and its resumption (results-dir: a run folder moved or a clone
# elsewhere; the checkpoint was found in the folder it names, so it is the same run)
RESUMABLE_CHANGES = {"resume", "overwrite", "results-dir", "num-server-rounds", "round-timeout", "node-wait-s", "device",
                     "server-device", "deterministic", "client-threads", "checkpoint-keep", "eval-every", "plots",
                     "tracker", "tracker-every", "tracker-group",
                     # which clients evaluate between the eval-every rounds: training is the same either way, and a
                     # run checkpointed before these keys existed resumes
                     "fraction-evaluate", "min-evaluate-clients"}


class CheckpointError(Exception):
    """A checkpoint cannot be written (a value of a type it cannot hold) or read (damaged, truncated,
    foreign or of another format version); the message names the file or the value and why."""


# ----------------------------------------------------------------------------- the typed tree
class _Encoder:
    """Value -> JSON skeleton; arrays and ArrayRecords are set aside and referenced by key.

    None, bool, int, str and finite floats are themselves, lists are lists, a dict with string keys
    (none starting with "$") is an object; everything else is an object with one "$" tag:
    ``$float`` (nan, inf, -inf), ``$tuple``, ``$set``, ``$dict`` (other keys: ``[[key, value], ...]``),
    ``$array``, ``$scalar`` (a numpy scalar), ``$tensor`` and ``$record`` (a Flower ArrayRecord).
    """

    def __init__(self):
        self.arrays: dict[str, Array] = {}
        self.records: dict[str, ArrayRecord] = {}

    def tree(self, value, where: str):
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            return value if math.isfinite(value) else {"$float": repr(value)}
        if kind is list:
            return [self.tree(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if kind is tuple:
            return {"$tuple": [self.tree(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        if kind is set:
            return {"$set": [self.tree(v, f"{where}{{}}") for v in _ordered(value)]}
        if kind is dict:
            if all(type(k) is str and not k.startswith("$") for k in value):
                return {k: self.tree(v, f"{where}.{k}") for k, v in value.items()}
            return {"$dict": [[self.tree(k, f"{where} key"), self.tree(v, f"{where}[{k!r}]")]
                              for k, v in value.items()]}
        if kind is np.ndarray:
            return {"$array": self._array(value, where)}
        if isinstance(value, np.generic):
            return {"$scalar": self._array(np.asarray(value), where)}
        if kind is torch.Tensor:
            if value.requires_grad or value.device.type != "cpu" or value.layout != torch.strided:
                raise CheckpointError(f"checkpoint: {where} is a tensor that needs grad, is not on the CPU or is "
                                      "not dense; store a detached CPU copy")
            try:
                array = value.numpy()
            except (TypeError, RuntimeError) as err:  # e.g. bfloat16, which numpy lacks
                raise CheckpointError(f"checkpoint: {where}: a {value.dtype} tensor cannot be stored ({err})") from None
            return {"$tensor": self._array(array, where)}
        if kind is ArrayRecord:
            name = f"record-{len(self.records)}"
            self.records[name] = value
            return {"$record": name}
        raise CheckpointError(f"checkpoint: {where} is a {kind.__module__}.{kind.__qualname__}, which a checkpoint "
                              "cannot hold; give the strategy's state as arrays, tensors, ArrayRecords, numbers, "
                              "strings, None and lists, tuples, sets and dicts of them")

    def _array(self, array: np.ndarray, where: str) -> str:
        if array.dtype.kind not in "biufc":
            raise CheckpointError(f"checkpoint: {where} has dtype {array.dtype}; only numeric arrays can be stored")
        key = str(len(self.arrays))  # dtype.str carries the byte order, tobytes() is C order
        self.arrays[key] = Array(dtype=array.dtype.str, shape=tuple(array.shape), stype=wire.RAW_STYPE,
                                 data=array.tobytes())
        return key


def _ordered(values: set) -> list:
    """A set's items in a fixed order, so that the same state always gives the same bytes."""
    try:
        return sorted(values)
    except TypeError:
        return sorted(values, key=repr)


def encode(value) -> bytes:
    """A tree of known types -> the payload bytes (a RecordDict protobuf). CheckpointError for a
    value of any other type, naming where in the tree it sits."""
    encoder = _Encoder()
    skeleton = json.dumps(encoder.tree(value, "state"), allow_nan=False, separators=(",", ":"))
    content = RecordDict({"tree": ConfigRecord({"json": skeleton}), "arrays": ArrayRecord(encoder.arrays),
                          **encoder.records})
    return recorddict_to_proto(content).SerializeToString()


def decode(payload: bytes):
    """Payload bytes (from ``encode``) -> the tree. Only parses: protobuf, JSON and raw array bytes.
    Raises CheckpointError (without a file name) for anything malformed."""
    proto = ProtoRecordDict()
    try:
        proto.ParseFromString(payload)
        content = recorddict_from_proto(proto)
        skeleton = json.loads(content["tree"]["json"])
        arrays = content["arrays"]
    except Exception as err:  # protobuf's DecodeError, a missing record, bad JSON
        raise CheckpointError(f"malformed payload ({type(err).__name__}: {err})") from None

    def view(key) -> np.ndarray:
        if arrays[key].stype != wire.RAW_STYPE:  # never Flower's .npy or any other serialisation
            raise ValueError(f"array {key} is stored as {arrays[key].stype!r}")
        return wire.array_view(arrays[key])

    def array(key) -> np.ndarray:
        return np.array(view(key))  # a writable copy

    tags = {
        "$float": _nonfinite,
        "$tuple": lambda arg: tuple(tree(v) for v in _list(arg)),
        "$set": lambda arg: {tree(v) for v in _list(arg)},
        "$dict": lambda arg: {tree(k): tree(v) for k, v in _list(arg)},
        "$array": array,
        "$scalar": lambda key: view(key)[()],
        "$tensor": lambda key: torch.from_numpy(array(key)),
        "$record": lambda name: _record(content[name]),
    }

    def tree(node):
        if type(node) is list:
            return [tree(v) for v in node]
        if type(node) is not dict:
            return node  # JSON's own scalars
        tagged = [k for k in node if k.startswith("$")]
        if not tagged:
            return {k: tree(v) for k, v in node.items()}
        if len(node) != 1 or tagged[0] not in tags:
            raise ValueError(f"unknown entry {sorted(node)[:3]}")
        return tags[tagged[0]](node[tagged[0]])

    try:
        return tree(skeleton)
    except (KeyError, TypeError, ValueError, RecursionError) as err:
        raise CheckpointError(f"malformed tree ({type(err).__name__}: {err})") from None


def _nonfinite(arg) -> float:
    if arg not in _NONFINITE:
        raise ValueError(f"$float holds {arg!r}")
    return float(arg)


def _list(arg) -> list:
    if type(arg) is not list:
        raise TypeError(f"expected a list, got {type(arg).__name__}")
    return arg


def _record(record) -> ArrayRecord:
    if not isinstance(record, ArrayRecord):
        raise TypeError(f"expected an ArrayRecord, got {type(record).__name__}")
    return record


# ----------------------------------------------------------------------------- the file
def dumps(value) -> bytes:
    """A whole checkpoint file's bytes: magic line, header (version, size, sha256), payload."""
    payload = encode(value)
    header = json.dumps({"version": VERSION, "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()})
    return MAGIC + header.encode() + b"\n" + payload


def loads(data: bytes, name: str = "checkpoint"):
    """The tree of a checkpoint file's bytes, after checking its magic line, version, size and hash.
    CheckpointError names ``name`` and the reason for refusing it."""
    def refused(reason: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {name} refused: {reason}")

    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            raise refused(f"truncated: {len(data)} bytes, not even its magic line")
        if data[:1] == b"\x80":
            raise refused("it is a Python pickle (an old checkpoint format, or a crafted file); "
                          "pickles are never loaded, since loading one can run any code")
        raise refused("not a pfl-flower checkpoint (foreign file: it does not start with the magic line)")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
    if end < 0:
        raise refused("truncated or damaged: its header line does not end")
    try:
        header = json.loads(data[len(MAGIC):end])
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise refused("damaged: its header is not a JSON object")
    if header.get("version") != VERSION:
        raise refused(f"format version {header.get('version')!r}; this server reads version {VERSION}")
    size, digest = header.get("bytes"), header.get("sha256")
    if type(size) is not int or type(digest) is not str:
        raise refused("damaged: its header lacks the payload's size or sha256")
    payload = data[end + 1:]
    if len(payload) != size:
        raise refused(f"truncated: {len(payload)} of {size} payload bytes" if len(payload) < size else
                      f"damaged: {len(payload) - size} bytes beyond the payload's end")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise refused("damaged: the payload's sha256 does not match its header")
    try:
        tree = decode(payload)
    except CheckpointError as err:
        raise refused(str(err)) from None
    if type(tree) is not dict or type(tree.get("round")) is not int:
        raise refused("it holds no round")
    return tree


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(run_dir: Path, server_round: int, payload: dict, keep: int) -> Path:
    """Write round ``server_round``'s checkpoint atomically and prune all but the newest ``keep``.
    A value the format cannot hold raises CheckpointError before anything is written."""
    data = dumps({"round": server_round, **payload})
    folder = Path(run_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"round-{server_round:05d}.ckpt"
    tmp = final.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(folder)
    for old in sorted(folder.glob("round-*.ckpt"))[:-max(keep, 1)]:
        old.unlink()
    return final


def read(path: Path) -> dict:
    """One checkpoint file; CheckpointError naming the file and why it is refused."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise CheckpointError(f"checkpoint {path} refused: it cannot be read ({err.strerror})") from None
    return loads(data, str(path))


def latest(run_dir: Path) -> dict | None:
    """The newest good checkpoint of a run, or None when it has none at all. A refused file (damaged,
    truncated, foreign, another version) is logged with its reason and the one before is tried; when
    every file is refused, CheckpointError gives each reason."""
    refusals = []
    for path in sorted((Path(run_dir) / FOLDER).glob("round-*.ckpt"), reverse=True):
        try:
            return read(path)
        except CheckpointError as err:
            log(WARNING, "%s; trying the checkpoint before it", err)
            refusals.append(str(err))
    if refusals:
        raise CheckpointError("no usable checkpoint: " + "; ".join(refusals))
    return None


def config_changes(saved: dict, current: dict) -> list[str]:
    """Run-config keys whose values differ between a checkpoint and a resumption, other than those
    a resumption may change (more rounds, timeouts, device)."""
    keys = (set(saved) | set(current)) - RESUMABLE_CHANGES
    return sorted(k for k in keys if saved.get(k) != current.get(k))
