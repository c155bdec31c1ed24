"""The run-config schema's disk cache: the same keys as building it, rebuilt when a source changes,
and a config check that imports neither torch nor Flower's server once the cache is there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedcore import schema_cache
from fedcore.config import Config, ConfigError, schema
from fedcore.registry import REGISTRY, Method

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "schema-cache"
    monkeypatch.setenv(schema_cache.CACHE_ENV, str(folder))
    return folder


def test_cached_schema_is_the_built_schema_and_is_read_back(cache):
    built = schema()
    assert schema_cache.cached_schema() == built  # built and stored
    files = list(cache.glob("schema-*.json"))
    assert len(files) == 1
    assert schema_cache.cached_schema() == built  # read back: tuples, bounds and types as built
    assert isinstance(schema_cache.cached_schema()["method"].choices, tuple)
    entries = json.loads(files[0].read_text())
    entries["lr"]["default"] = 123.0  # what is read is the file: the next test shows a source change misses it
    files[0].write_text(json.dumps(entries))
    assert schema_cache.cached_schema()["lr"].default == 123.0


def test_a_changed_source_or_registry_entry_gives_another_file(tmp_path, monkeypatch):
    copy = tmp_path / "fedstrategies"
    shutil.copytree(ROOT / "fedstrategies", copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = schema_cache.source_digest([copy])
    (copy / "fedavg.py").write_text((copy / "fedavg.py").read_text() + "\n# changed\n")
    assert schema_cache.source_digest([copy]) != before
    plain = schema_cache.source_digest()
    monkeypatch.setitem(REGISTRY, "toy", Method("toy", "test method", "tests.toy_method:ToyStrategy",
                                                "tests.toy_method:ToyClient"))
    assert schema_cache.source_digest() != plain


def test_a_method_registered_elsewhere_is_in_the_cached_schema(cache, monkeypatch):
    schema_cache.cached_schema()
    monkeypatch.setitem(REGISTRY, "toy", Method("toy", "test method", "tests.toy_method:ToyStrategy",
                                                "tests.toy_method:ToyClient"))
    keys = schema_cache.cached_schema()
    assert keys["toy.steps"].default == 3
    assert Config.from_run_config({"method": "toy", "toy.steps": 5}, keys=keys)["toy.steps"] == 5


def test_an_unreadable_cache_is_rebuilt_and_a_bad_key_still_fails(cache):
    schema_cache.cached_schema()
    next(cache.glob("schema-*.json")).write_text("{not json")
    keys = schema_cache.cached_schema()
    assert keys == schema()
    with pytest.raises(ConfigError, match="num-rounds"):
        Config.from_run_config({"num-rounds": 3}, keys=keys)


def test_the_cache_off_builds_every_time(monkeypatch, tmp_path):
    monkeypatch.setenv(schema_cache.CACHE_ENV, "0")
    assert schema_cache.cache_dir() is None
    assert schema_cache.cached_schema() == schema()


def test_the_launchers_check_imports_neither_torch_nor_flowers_server(cache):
    code = ("import sys; from pathlib import Path; from server_app import flower_cli as fc;"
            "cfg = fc.check_config({'method': 'fedsac', 'fedsac.solver': 'cvxpy'}, Path('.'));"
            "print(cfg['fedsac.solver'], 'torch' in sys.modules, 'flwr.serverapp' in sys.modules)")
    env = {**os.environ, schema_cache.CACHE_ENV: str(cache)}
    runs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           check=True).stdout.split() for _ in range(2)]
    assert runs[0][0] == runs[1][0] == "cvxpy"
    assert runs[1][1:] == ["False", "False"]  # the second check reads the cache the first one wrote


def test_a_schema_built_from_modules_edited_since_they_were_imported_is_not_stored(tmp_path, monkeypatch):
    """A long-lived process (a launcher, a comparison) that imported a strategy before its source was edited
    would otherwise store its old keys under the new sources' hash and serve them to every later launch."""
    import os
    import time

    import fedstrategies.fedavg as module
    from fedcore import schema_cache

    monkeypatch.setenv(schema_cache.CACHE_ENV, str(tmp_path))
    source = module.__file__
    before = os.stat(source)
    try:
        later = time.time() + 60  # as if the file were edited after this process imported it
        os.utime(source, (later, later))
        schema_cache.cached_schema()
        assert list(tmp_path.glob("schema-*.json")) == []
    finally:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    schema_cache.cached_schema()  # unchanged sources: stored as before
    assert len(list(tmp_path.glob("schema-*.json"))) == 1
