"""Server checkpoints: everything needed to continue a run after the round it was written in.

After every round the ServerApp writes ``<run dir>/checkpoints/round-NNNNN.ckpt``: the round, the
run token (which also names the clients' state folders), the strategy's state (its
``checkpoint_attrs`` plus what the base tracks: dropped replies, client state rounds, the server's
torch generator), the results rows so far and the run config. The write is atomic (temporary file,
fsync, rename, fsync of the folder), so a crash at any moment leaves the previous checkpoint
intact, and only the last ``checkpoint-keep`` are kept.

The files are pickles written by this server for itself; never load one from elsewhere.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

FOLDER = "checkpoints"
VERSION = 1
# keys that may differ between the interrupted run and its resumption
RESUMABLE_CHANGES = {"resume", "overwrite", "num-server-rounds", "round-timeout", "node-wait-s", "device",
                     "client-threads", "checkpoint-keep", "eval-every"}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(run_dir: Path, server_round: int, payload: dict, keep: int) -> Path:
    """Write round ``server_round``'s checkpoint atomically and prune all but the newest ``keep``."""
    folder = Path(run_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"round-{server_round:05d}.ckpt"
    tmp = final.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump({"version": VERSION, "round": server_round, **payload}, f, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(folder)
    for old in sorted(folder.glob("round-*.ckpt"))[:-max(keep, 1)]:
        old.unlink()
    return final


def latest(run_dir: Path) -> dict | None:
    """The newest readable checkpoint of a run, or None. A truncated newest file (a crash during
    the rename is impossible, but a damaged disk is not) falls back to the one before."""
    folder = Path(run_dir) / FOLDER
    for path in sorted(folder.glob("round-*.ckpt"), reverse=True):
        try:
            with open(path, "rb") as f:
                data = pickle.load(f)
        except (EOFError, pickle.UnpicklingError, OSError):
            continue
        if data.get("version") == VERSION:
            return data
    return None


def config_changes(saved: dict, current: dict) -> list[str]:
    """Run-config keys whose values differ between a checkpoint and a resumption, other than those
    a resumption may change (more rounds, timeouts, device)."""
    keys = (set(saved) | set(current)) - RESUMABLE_CHANGES
    return sorted(k for k in keys if saved.get(k) != current.get(k))
