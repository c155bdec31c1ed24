"""Client state on the client's own disk, so that a resumed run (or a restarted SuperNode) continues
from the state the client had, not from scratch.

After every message that wrote state, the client's whole ``context.state`` is serialised (Flower's
own protobuf) to ``<state dir>/<run token>/<partition id>/round-NNNNN.state``; the newest three are
kept. When a message finds ``context.state`` empty and files exist, the newest file of a round the
server has finished is loaded: for a train or round-0 message that is the previous round or earlier,
for an evaluate message the current one. Newer files belong to a timeline that the server did not
keep (it crashed before checkpointing that round) and are deleted. The run token comes from the
server in every message; a fresh run gets a new one, so state of another run is never picked up.

The state folder is the node's ``state-dir`` node config, else the run config's
``client-state-dir``, else ``<results-dir>/<run-name>/client-state``.
"""

from __future__ import annotations

import os
import re
from logging import WARNING
from pathlib import Path

from flwr.app import RecordDict
from flwr.common.logger import log
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

KEEP = 3
_FILE = re.compile(r"round-(\d{5})\.state$")


def state_dir(run_config, node_config: dict, token: str, pid: int) -> Path | None:
    if not token or not re.fullmatch(r"[0-9a-f]{8,64}", token):
        return None
    root = node_config.get("state-dir") or run_config["client-state-dir"] or \
        os.path.join(run_config["results-dir"], run_config["run-name"] or "unnamed", "client-state")
    return Path(str(root)).expanduser() / token / str(pid)


def _files(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _FILE.match(p.name))]
    return sorted(found)


def persist(state: RecordDict, folder: Path | None, server_round: int) -> None:
    """Write this round's client state (atomically) and keep the newest few."""
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"round-{server_round:05d}.state"
        tmp = final.with_suffix(".tmp")
        tmp.write_bytes(recorddict_to_proto(state).SerializeToString())
        os.replace(tmp, final)
        for _, old in _files(folder)[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError as err:  # a read-only disk costs resumability, not the run
        log(WARNING, "client state could not be written to %s: %s", folder, err)


def restore_if_empty(state: RecordDict, folder: Path | None, newest_allowed: int) -> int | None:
    """Fill an empty ``state`` from the newest file of a round <= ``newest_allowed``; returns that
    round, or None if nothing was restored. Files of later rounds are deleted."""
    if folder is None or len(state) > 0:
        return None
    files = _files(folder)
    for rnd, path in files:
        if rnd > newest_allowed:
            path.unlink(missing_ok=True)
    usable = [(rnd, path) for rnd, path in files if rnd <= newest_allowed]
    if not usable:
        return None
    rnd, path = usable[-1]
    proto = ProtoRecordDict()
    proto.ParseFromString(path.read_bytes())
    for key, record in recorddict_from_proto(proto).items():
        state[key] = record
    log(WARNING, "client state was empty; restored it from %s (round %s)", path, rnd)
    return rnd
