"""The rules of checkpoint files (server_app/checkpoints.py) the round-trip tests leave open, each on its own:
which files a save keeps, that a write leaves no partial file, the header's size and hash checks, and which
run-config changes a resumption may make."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from server_app import checkpoints
from server_app.checkpoints import CheckpointError


def test_a_save_keeps_the_newest_checkpoints_and_at_least_one(tmp_path):
    for r in (1, 2, 3, 10):
        path = checkpoints.save(tmp_path, r, {"w": np.full(2, r)}, keep=2)
    folder = tmp_path / checkpoints.FOLDER
    assert path == folder / "round-00010.ckpt"
    assert sorted(p.name for p in folder.iterdir()) == ["round-00003.ckpt", "round-00010.ckpt"]  # no .tmp left
    checkpoints.save(tmp_path, 11, {}, keep=0)
    assert [p.name for p in folder.iterdir()] == ["round-00011.ckpt"]
    assert checkpoints.latest(tmp_path) == {"round": 11}


def test_a_value_the_format_cannot_hold_writes_nothing(tmp_path):
    with pytest.raises(CheckpointError):
        checkpoints.save(tmp_path, 1, {"x": object()}, keep=3)
    assert not list((tmp_path / checkpoints.FOLDER).glob("*"))


def _file(payload: bytes, **header) -> bytes:
    head = {"version": checkpoints.VERSION, "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
            **header}
    return checkpoints.MAGIC + json.dumps(head).encode() + b"\n" + payload


def test_the_header_must_give_the_payloads_exact_size_and_hash():
    good = checkpoints.dumps({"round": 1})
    payload = good[good.index(b"\n", len(checkpoints.MAGIC)) + 1:]
    assert checkpoints.loads(_file(payload)) == {"round": 1}
    for header, reason in (({"bytes": None}, "lacks the payload's size or sha256"),
                           ({"bytes": float(len(payload))}, "lacks the payload's size or sha256"),
                           ({"sha256": None}, "lacks the payload's size or sha256"),
                           ({"bytes": len(payload) - 3}, "damaged: 3 bytes beyond the payload's end"),
                           ({"bytes": len(payload) + 1}, f"truncated: {len(payload)} of {len(payload) + 1}"),
                           ({"version": None}, "format version None")):
        with pytest.raises(CheckpointError, match=reason):
            checkpoints.loads(_file(payload, **header), "f")
    with pytest.raises(CheckpointError, match="header line does not end"):
        checkpoints.loads(checkpoints.MAGIC + b" " * checkpoints._MAX_HEADER + b"\n" + payload)


def test_a_checkpoint_must_hold_an_integer_round():
    for tree in ({"round": True}, {"round": 1.0}, {"round": "1"}):
        with pytest.raises(CheckpointError, match="it holds no round"):
            checkpoints.loads(checkpoints.dumps(tree))
    assert checkpoints.loads(checkpoints.dumps({"round": 0}))["round"] == 0


def test_a_file_that_cannot_be_read_is_refused_with_its_name(tmp_path):
    with pytest.raises(CheckpointError, match=f"checkpoint {tmp_path / 'gone.ckpt'} refused: it cannot be read"):
        checkpoints.read(tmp_path / "gone.ckpt")


def test_a_resumption_may_change_only_where_and_how_long_the_run_goes():
    saved = {"method": "fedavg", "lr": 0.1, "num-server-rounds": 5, "device": "cpu", "seed": 0}
    assert checkpoints.config_changes(saved, {**saved, "num-server-rounds": 9, "device": "cuda",
                                              "results-dir": "/elsewhere", "resume": True}) == []
    assert checkpoints.config_changes(saved, {**saved, "seed": 1, "lr": 0.2}) == ["lr", "seed"]
    assert checkpoints.config_changes(saved, {**saved, "new-key": 1}) == ["new-key"]
    assert checkpoints.config_changes({**saved, "old-key": 1}, saved) == ["old-key"]
    for key in checkpoints.RESUMABLE_CHANGES:
        assert checkpoints.config_changes(saved, {**saved, key: "changed"}) == [], key


def test_a_set_of_mixed_types_round_trips_and_a_save_makes_its_run_folder(tmp_path):
    value = {"round": 2, "ids": {1, "a", 2.5}, "nums": {10, 9}}
    path = checkpoints.save(tmp_path / "new" / "run", 2, {k: v for k, v in value.items() if k != "round"}, keep=1)
    assert checkpoints.read(path) == value


def test_a_tensor_that_is_not_a_dense_cpu_copy_is_refused_when_saving(tmp_path):
    import torch

    for tensor in (torch.zeros(3).to_sparse(), torch.zeros(3, requires_grad=True)):
        with pytest.raises(CheckpointError, match="not dense; store a detached CPU copy"):
            checkpoints.save(tmp_path, 1, {"t": tensor}, keep=1)
