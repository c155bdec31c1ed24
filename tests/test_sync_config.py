"""``make sync-config`` (tools/sync_config.py): pyproject.toml's per-method run-config tables are written from the
declarations, and nothing else of the file changes."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fedcore.config import Key
from fedcore import registry
from fedcore.registry import REGISTRY, get_method
from tests import toy_method
from tools import sync_config

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_method_tables_are_the_declarations():
    text = (ROOT / "pyproject.toml").read_text()
    assert sync_config.synced(text) == text, "pyproject.toml's method tables are stale: run `make sync-config`"
    assert sync_config.main(["--check"]) == 0


def _without(monkeypatch, *names: str) -> None:
    """The registry without ``names`` for one test (a copy: deleting and restoring items would reorder it)."""
    monkeypatch.setattr(registry, "REGISTRY", {k: v for k, v in registry.REGISTRY.items() if k not in names})


def _config(text: str) -> dict:
    return tomllib.loads(text)["tool"]["flwr"]["app"]["config"]


def test_a_stale_table_is_rewritten_and_the_rest_of_the_file_stays_byte_for_byte(tmp_path, capsys):
    text = (ROOT / "pyproject.toml").read_text()
    # another hand adds a common key and a table after the method tables; someone edits a method default by hand
    edited = text.replace("[tool.flwr.app.config]\n", "[tool.flwr.app.config]\nnew-common-key = 7\n", 1)
    edited = edited.replace("[tool.flwr.app.config.fedprox]\nmu = 0.01\n", "[tool.flwr.app.config.fedprox]\nmu = 9.0\n")
    edited += "\n# a later table\n[tool.other]\nx = 1\n"
    assert edited.count("mu = 9.0") == 1 and "new-common-key = 7" in edited
    path = tmp_path / "pyproject.toml"
    path.write_text(edited)
    assert sync_config.main(["--check", "--pyproject", str(path)]) == 1
    assert "run `make sync-config`" in capsys.readouterr().err
    assert sync_config.main(["--pyproject", str(path)]) == 0
    out = path.read_text()
    assert out == text.replace("[tool.flwr.app.config]\n", "[tool.flwr.app.config]\nnew-common-key = 7\n", 1) \
        + "\n# a later table\n[tool.other]\nx = 1\n"
    assert _config(out)["fedprox"]["mu"] == get_method("fedprox").hparams["mu"].default == 0.01
    assert sync_config.main(["--check", "--pyproject", str(path)]) == 0


def test_a_new_declaration_gets_its_table_in_registry_order(monkeypatch):
    text = (ROOT / "pyproject.toml").read_text()
    monkeypatch.setitem(REGISTRY, "toy", toy_method.METHOD)
    monkeypatch.setattr(toy_method.METHOD.declaration, "HPARAMS",
                        {"steps": Key(3, "SGD steps"), "mode": Key("a b\"c", "a string with a quote"),
                         "on": Key(False, "a flag"), "rate": Key(1e-05, "a small float")})
    out = sync_config.synced(text)
    assert _config(out)["toy"] == {"steps": 3, "mode": 'a b"c', "on": False, "rate": 1e-05}
    assert list(_config(out))[-1] == "toy"  # POSITION 1000: after every real method
    _without(monkeypatch, "toy", "fedprox")
    gone = sync_config.synced(out)  # a retired method's table goes with its declaration
    assert gone == text.replace("[tool.flwr.app.config.fedprox]\nmu = 0.01\n\n", "")


def test_a_file_without_the_marks_is_read_by_its_tables_and_a_stray_one_is_refused(monkeypatch):
    """The first run (a file written by hand) finds the run of method tables; a table among them that is no
    declared method's is named, not dropped; marks out of order are refused."""
    text = (ROOT / "pyproject.toml").read_text()
    unmarked = text.replace(sync_config.HEADER, "# Method hyperparameters: <method>.<key>").replace(
        sync_config.FOOTER + "\n", "")
    assert sync_config.synced(unmarked) == text
    stray = unmarked.replace("[tool.flwr.app.config.fedprox]\n", "[tool.flwr.app.config.stray]\nx = 1\n\n"
                             "[tool.flwr.app.config.fedprox]\n")
    with pytest.raises(SystemExit, match="config.stray stands among them"):
        sync_config.synced(stray)
    _without(monkeypatch, "fedprox")
    with pytest.raises(SystemExit, match="config.fedprox stands among them.*no longer declared"):
        sync_config.synced(unmarked)
    with pytest.raises(SystemExit, match="between one line"):
        sync_config.synced(text.replace(sync_config.FOOTER + "\n", ""))


@pytest.mark.parametrize("value,expected", [(True, "true"), (3, "3"), (0.5, "0.5"), ("x", '"x"'), (1e-05, "1e-05")])
def test_values_are_written_as_toml(value, expected):
    assert sync_config.toml_value(value) == expected
    assert tomllib.loads(f"v = {expected}")["v"] == value


def test_a_value_toml_cannot_hold_as_a_default_is_refused():
    with pytest.raises(ValueError, match="finite"):
        sync_config.toml_value(float("nan"))
    with pytest.raises(TypeError, match="list"):
        sync_config.toml_value([1])
