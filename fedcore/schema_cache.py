"""The run-config schema read from a disk cache, so that checking a config needs neither torch nor flwr.

Building the schema imports every method's strategy module for its ``HPARAMS``, and with them torch
and Flower: 1.1 s here. The launcher checks a config before it starts anything, so those 1.1 s were
the first second of every launch's start-up with one core idle. The keys (defaults, help, choices,
bounds) are plain values, written as JSON under a hash of the sources they come from (every module
of ``fedcore``, ``fedstrategies`` and ``partitions``): any change to those sources builds the schema
afresh, the same way as without a cache, and so does a method registered from another module (its
file is hashed too). An unwritable cache directory only costs the 1.1 s. The launcher's check, the
ServerApp and the ClientApp read it (a forked deployed ClientApp no longer imports every strategy).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from fedcore.config import Key, schema

_IMPORTED_AT = time.time()
CACHE_ENV = "PFL_SCHEMA_CACHE"  # a directory, or "0" to build the schema every time
SOURCE_PACKAGES = ("fedcore", "fedstrategies", "partitions")  # where keys, models, datasets and HPARAMS live
_TUPLES = ("choices",)  # JSON keeps tuples as lists


def _registered_sources() -> list[Path]:
    """The files of the registered methods' strategy modules, found without importing them."""
    from fedcore.registry import REGISTRY

    files = []
    for method in REGISTRY.values():
        spec = importlib.util.find_spec(method.strategy_path.split(":")[0])
        if spec is None or not spec.origin or not os.path.isfile(spec.origin):
            raise ModuleNotFoundError(f"method {method.name!r}: no module {method.strategy_path}")
        files.append(Path(spec.origin))
    return files


def source_digest(roots: list[Path] | None = None) -> str:
    """Hash of every ``*.py`` under the packages that declare run-config keys and of every registered
    method's strategy module (names and bytes), with the registry's entries."""
    from fedcore.registry import REGISTRY

    here = Path(__file__).resolve().parent.parent
    if roots is None:
        roots = [here / name for name in SOURCE_PACKAGES]
    files = {path for root in roots for path in root.rglob("*.py")} | set(_registered_sources())
    digest = hashlib.sha256(repr(sorted((m.name, m.strategy_path) for m in REGISTRY.values())).encode())
    for path in sorted(files):
        name = path.relative_to(here) if path.is_relative_to(here) else path.name  # the same wherever installed
        digest.update(str(name).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def cache_dir() -> Path | None:
    """``$PFL_SCHEMA_CACHE``, else ``~/.cache/pfl-flower/schema``; None when the cache is off."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen == "0":
        return None
    if chosen:
        return Path(chosen).expanduser()
    from partitions.datasets import DEFAULT_DATA_DIR  # the project's cache folder, as the partition cache's

    return Path(DEFAULT_DATA_DIR).expanduser() / "schema"


def _process_start() -> float:
    """When this process started (its /proc entry's time on Linux), else when this module was imported."""
    try:
        return min(os.stat(f"/proc/{os.getpid()}").st_ctime, _IMPORTED_AT)
    except OSError:
        return _IMPORTED_AT


def _loaded_sources_changed() -> bool:
    """Whether a source module this process already imported was edited since the process started: its keys in
    memory may then be older than the files the digest hashes, and storing them under that digest would serve an
    old schema to every later launch."""
    here = Path(__file__).resolve().parent.parent
    started = _process_start()
    for module in list(sys.modules.values()):
        origin = getattr(module, "__file__", None)
        if not origin:
            continue
        path = Path(origin)
        if path.is_relative_to(here) and path.parts[len(here.parts)] in SOURCE_PACKAGES:
            try:
                if path.stat().st_mtime > started:
                    return True
            except OSError:
                return True
    return False


def _decode(entry: dict) -> Key:
    return Key(**{k: tuple(v) if k in _TUPLES and v is not None else v for k, v in entry.items()})


def cached_schema() -> dict[str, Key]:
    """``fedcore.config.schema()``, from the cache when the sources are unchanged (built and stored
    otherwise)."""
    directory = cache_dir()
    if directory is None:
        return schema()
    try:
        path = directory / f"schema-{source_digest()}.json"
    except (OSError, ModuleNotFoundError):  # a source that cannot be read: build (and fail) as without a cache
        return schema()
    try:
        entries = json.loads(path.read_text())
        return {name: _decode(entry) for name, entry in entries.items()}
    except (OSError, ValueError, TypeError):
        pass  # not there yet (or unreadable): build it
    keys = schema()
    if not _loaded_sources_changed():
        _store(path, {name: asdict(key) for name, key in keys.items()})
    return keys


def _store(path: Path, entries: dict) -> None:
    """Write atomically (launches side by side may race); a failure only loses the cache."""
    try:
        text = json.dumps(entries)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            f.write(text)
        os.replace(f.name, path)
    except (OSError, TypeError, ValueError):
        pass

