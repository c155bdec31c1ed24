"""Server checkpoints hold data only: every method's state comes back exactly, and damaged, truncated,
foreign, other-version and pickled files are refused with their reason (a pickle is never loaded)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import pickle
from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.common.serde import recorddict_to_proto

from fedcore import wire
from fedcore.registry import REGISTRY
from server_app import checkpoints
from server_app.app import StartupError
from tests import toy_method
from tests.conftest import run_inprocess

METHODS = sorted(REGISTRY) + ["toy"]


def _difference(a, b, where: str = "state") -> str | None:
    """Where ``b`` is not exactly ``a`` (same types, arrays bit for bit with dtype and shape), or None."""
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} came back as {type(b).__name__}"
    if isinstance(a, (np.ndarray, np.generic, torch.Tensor)):
        a, b = (np.asarray(x.numpy() if isinstance(x, torch.Tensor) else x) for x in (a, b))
        same = a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    elif isinstance(a, ArrayRecord):
        same = list(a) == list(b) and all((x.dtype, tuple(x.shape), x.stype, x.data) == (y.dtype, tuple(y.shape),
                                          y.stype, y.data) for x, y in zip(a.values(), b.values()))
    elif isinstance(a, dict):
        if list(a) != list(b):
            return f"{where}: keys {list(a)} came back as {list(b)}"
        return next((d for k in a if (d := _difference(a[k], b[k], f"{where}[{k!r}]"))), None)
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: {len(a)} items came back as {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := _difference(x, y, f"{where}[{i}]"))), None)
    elif isinstance(a, float):
        same = (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    else:
        same = a == b
    return None if same else f"{where}: {a!r} came back as {b!r}"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every method (and the toy method, which uses every extension point) run for 2 rounds on 2
    clients; for each checkpoint, the difference between what the server held and what the file gives back."""
    found: dict[str, list] = {}
    real_save = checkpoints.save

    def save_and_compare(run_dir, server_round, payload, keep):
        path = real_save(run_dir, server_round, payload, keep)
        found[method].append((server_round, _difference({"round": server_round, **payload}, checkpoints.read(path))))
        return path

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(REGISTRY, "toy", toy_method.METHOD)
        mp.setattr(checkpoints, "save", save_and_compare)
        for method in METHODS:
            found[method] = []
            run_inprocess(tmp_path_factory.mktemp(method), 2, method=method, **{"num-server-rounds": 2})
    return found


@pytest.mark.parametrize("method", METHODS)
def test_every_methods_state_comes_back_exactly(saved, method):
    rounds = [r for r, _ in saved[method]]
    assert rounds[-2:] == [1, 2] and set(rounds) <= {0, 1, 2}, rounds
    assert [d for _, d in saved[method] if d] == []


def test_the_tree_holds_every_known_type_exactly():
    generator = torch.Generator().manual_seed(5)
    value = {
        "none": None, "flags": [True, False], "ints": [0, -3, 2 ** 70], "text": "é $x",
        "floats": [1.5, -0.0, 1e-310, float("nan"), float("inf"), -float("inf")],
        "tuple": (1, ("a", None)), "set": {3, 1, 2}, "by-pid": {0: {"n": 5}, 7: [1.0]}, "$dollar": 1,
        "mixed-keys": {(1, 2): "t", None: 0, "s": 1},
        "arrays": [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(2.5), np.zeros((0, 4), np.int64),
                   np.arange(4, dtype=">i4"), np.array([True, False]), np.array([1 + 2j], np.complex64),
                   np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.arange(10.0)[::3]],
        "scalars": [np.float64(0.1), np.int64(-4), np.bool_(True), np.float32(np.nan)],
        "tensors": [torch.arange(6, dtype=torch.float32).reshape(3, 2), torch.tensor(3, dtype=torch.int64),
                    generator.get_state(), torch.zeros(2, 3).t()],
        "records": [wire.pack_arrays({"w": np.ones((2, 2), np.float32)}),
                    wire.pack_class_features(np.array([1]), np.ones((1, 3)), np.array([4]))],
    }
    back = checkpoints.loads(checkpoints.dumps({"round": 3, "value": value}))
    assert back["round"] == 3 and _difference(value, back["value"]) is None
    assert back["value"]["arrays"][0].flags.writeable  # the state can be updated in place again
    restored = torch.Generator()
    restored.set_state(back["value"]["tensors"][2])
    assert torch.equal(torch.rand(3, generator=restored), torch.rand(3, generator=generator))
    assert checkpoints.dumps(value) == checkpoints.dumps(back["value"])  # the same state, the same bytes


@pytest.mark.parametrize("value, named", [
    ({"head": torch.nn.Linear(2, 2)}, "state.x.head is a torch.nn.modules.linear.Linear"),
    ({"w": OrderedDict(a=1)}, "state.x.w is a collections.OrderedDict"),
    ({"f": frozenset({1})}, "state.x.f is a builtins.frozenset"),
    ([b"raw"], "state.x[0] is a builtins.bytes"),
    ({"a": np.array([object()])}, "state.x.a has dtype object"),
    ({"p": torch.nn.Parameter(torch.ones(2))}, "state.x.p is a torch.nn.parameter.Parameter"),
    ({"g": torch.ones(2, requires_grad=True)}, "state.x.g is a tensor that needs grad"),
    ({"b": torch.ones(2, dtype=torch.bfloat16)}, "state.x.b: a torch.bfloat16 tensor cannot be stored"),
])
def test_a_value_of_an_unknown_type_is_refused_when_saving(tmp_path, value, named):
    with pytest.raises(checkpoints.CheckpointError) as err:
        checkpoints.save(tmp_path, 1, {"x": value}, keep=2)
    assert named in str(err.value)
    assert not (tmp_path / checkpoints.FOLDER).exists()  # refused before anything is written


class _Pwn:
    """A pickle that runs a shell command when loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _header(data: bytes) -> dict:
    return json.loads(data[len(checkpoints.MAGIC):data.index(b"\n", len(checkpoints.MAGIC))])


def _framed(tree: str, arrays: ArrayRecord | None = None, payload: bytes | None = None) -> bytes:
    """A well-framed file (right magic, version, size and hash) around a crafted payload."""
    if payload is None:
        content = RecordDict({"tree": ConfigRecord({"json": tree}), "arrays": arrays or ArrayRecord()})
        payload = recorddict_to_proto(content).SerializeToString()
    header = {"version": checkpoints.VERSION, "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    return checkpoints.MAGIC + json.dumps(header).encode() + b"\n" + payload


def _damages(good: bytes, tmp_path) -> dict[str, tuple[bytes, str]]:
    """Broken versions of a good file: name -> (bytes, the reason it must be refused with)."""
    npy = ArrayRecord({"0": Array(np.arange(3))})  # Flower's own .npy serialisation, not ours
    head_end = good.index(b"\n", len(checkpoints.MAGIC)) + 1
    flipped = bytearray(good)
    flipped[-5] ^= 0x01
    v1 = good[:len(checkpoints.MAGIC)] + json.dumps({**_header(good), "version": 1}).encode() + good[head_end - 1:]
    return {
        "damaged": (bytes(flipped), "damaged: the payload's sha256 does not match its header"),
        "truncated": (good[:-100], "truncated: "),
        "truncated-header": (good[:head_end - 3], "header line does not end"),
        "truncated-magic": (good[:7], "truncated: 7 bytes"),
        "empty": (b"", "truncated: 0 bytes"),
        "foreign": (b"PK\x03\x04 a zip file" + good, "not a pfl-flower checkpoint (foreign file"),
        "wrong-version": (v1, "format version 1; this server reads version 2"),
        "bad-header": (checkpoints.MAGIC + b"{nope\n" + good[head_end:], "damaged: its header is not a JSON object"),
        "pickle": (pickle.dumps(_Pwn(tmp_path / "pwned")), "it is a Python pickle"),
        "unknown-tag": (_framed('{"round": 1, "x": {"$import": "os.system"}}'), "malformed tree (ValueError: "
                        "unknown entry ['$import'])"),
        "npy-array": (_framed('{"round": 1, "x": {"$array": "0"}}', npy), "array 0 is stored as 'numpy.ndarray'"),
        "no-round": (_framed('{"x": 1}'), "it holds no round"),
        "not-protobuf": (_framed("", payload=b"\xff" * 40), "malformed payload"),
    }


def test_broken_files_are_refused_with_the_file_and_reason(tmp_path):
    good = checkpoints.dumps({"round": 1, "w": np.arange(50.0)})
    for name, (data, reason) in _damages(good, tmp_path).items():
        path = tmp_path / f"{name}.ckpt"
        path.write_bytes(data)
        with pytest.raises(checkpoints.CheckpointError) as err:
            checkpoints.read(path)
        assert f"checkpoint {path} refused: " in str(err.value) and reason in str(err.value), (name, str(err.value))
    assert not (tmp_path / "pwned").exists()


def test_latest_skips_refused_files_to_the_previous_good_one(tmp_path, caplog):
    for r in (1, 2):
        checkpoints.save(tmp_path, r, {"w": np.full(3, r)}, keep=5)
    folder = tmp_path / checkpoints.FOLDER
    good = (folder / "round-00002.ckpt").read_bytes()
    (folder / "round-00002.ckpt").write_bytes(good[:-1])
    (folder / "round-00003.ckpt").write_bytes(pickle.dumps(_Pwn(tmp_path / "pwned")))
    with caplog.at_level(logging.WARNING):
        back = checkpoints.latest(tmp_path)
    assert back["round"] == 1 and back["w"].tolist() == [1, 1, 1]
    assert f"{folder / 'round-00003.ckpt'} refused: it is a Python pickle" in caplog.text
    assert f"{folder / 'round-00002.ckpt'} refused: truncated" in caplog.text
    (folder / "round-00001.ckpt").write_bytes(b"garbage")
    with pytest.raises(checkpoints.CheckpointError, match="no usable checkpoint: .*round-00003.*pickle.*"
                                                          "round-00002.*truncated.*round-00001.*foreign"):
        checkpoints.latest(tmp_path)
    assert checkpoints.latest(tmp_path / "elsewhere") is None
    assert not (tmp_path / "pwned").exists()


def test_a_resume_goes_back_past_refused_checkpoints_and_stops_when_none_is_left(tmp_path):
    """A real run: its newest checkpoint damaged and a crafted pickle as a later round; the resumption
    continues from the round before, never runs the pickle, and refuses to start over when all are bad."""
    marker = tmp_path / "pwned"
    run_inprocess(tmp_path, 2, method="fedavg", **{"num-server-rounds": 2})
    folder = tmp_path / "results" / "test-run" / checkpoints.FOLDER
    newest = folder / "round-00002.ckpt"
    newest.write_bytes(newest.read_bytes()[:-10])
    (folder / "round-00003.ckpt").write_bytes(pickle.dumps(_Pwn(marker)))
    resumed, _ = run_inprocess(tmp_path, 2, method="fedavg", resume=True, **{"num-server-rounds": 3})
    assert resumed["rounds"] == 3 and not marker.exists()
    for path in folder.iterdir():
        path.write_bytes(pickle.dumps(_Pwn(marker)))
    with pytest.raises(StartupError, match="resume: no usable checkpoint: checkpoint .*round-00003.ckpt refused: "
                                           "it is a Python pickle"):
        run_inprocess(tmp_path, 2, method="fedavg", resume=True, **{"num-server-rounds": 4})
    assert not marker.exists()
