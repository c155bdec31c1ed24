"""A disk cache of each client's partition, so that a deployed ClientApp (one process per message)
reads its own arrays instead of loading the whole dataset and splitting it again.

The file name is a hash of everything that determines the partition: dataset, partition scheme and
their options, number of clients, seed, data-dir, the client's partition id, and the source of
the ``partitions`` package (a change to a loader or partitioner never serves stale splits). Files
are written atomically (temp file + rename), so concurrent ClientApps on one machine are safe; an
unwritable cache directory only costs speed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

import partitions
import partitions.sources

CACHE_ENV = "PFL_PARTITION_CACHE"  # a directory, or "0" to turn the cache off
FIELDS = ("x_train", "y_train", "x_test", "y_test", "x_val", "y_val")


@lru_cache(maxsize=1)
def _code_version() -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(partitions.__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir(data_dir: str) -> Path | None:
    """Where partitions are cached: ``$PFL_PARTITION_CACHE``, else ``<data-dir or ~/.cache/pfl-flower>/partitions``."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen == "0":
        return None
    if chosen:
        return Path(chosen).expanduser()
    return Path(data_dir or partitions.datasets.DEFAULT_DATA_DIR).expanduser() / "partitions"


def cache_path(key: tuple, pid: int) -> Path | None:
    """The cache file of partition ``pid`` under the data key (dataset, partition, num clients,
    seed, data dir, dataset options, partition options)."""
    directory = cache_dir(key[4])
    if directory is None:
        return None
    # the user's own data (``folder:<dir>``, ...): the version of its files, and a name without the path
    stamp = partitions.sources.fingerprint(key[0]) if partitions.is_source(key[0]) else ""
    text = json.dumps([list(map(str, key)), pid, _code_version(), stamp])
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(key[0]))[-48:]
    return directory / f"{name}-{pid}-{hashlib.sha256(text.encode()).hexdigest()[:24]}.npz"


def load(path: Path | None) -> dict | None:
    """The cached arrays and facts, or None when there is no (readable) cache file."""
    if path is None or not path.exists():
        return None
    try:
        with np.load(path) as f:
            out = {k: f[k] for k in FIELDS}
            out["num_classes"] = int(f["num_classes"])
            out["input_shape"] = tuple(int(v) for v in f["input_shape"])
        return out
    except (OSError, ValueError, KeyError):
        return None


def store(path: Path | None, arrays: dict, num_classes: int, input_shape: tuple[int, ...]) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays, num_classes=num_classes, input_shape=np.array(input_shape))
        os.replace(tmp, path)
    except OSError:
        pass
