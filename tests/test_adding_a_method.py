"""docs/adding-a-method.md, done: a new method is a declaration found by the scan of ``fedcore/methods/``, a
strategy, a client and its tests; ``make sync-config`` gives it its run-config table, and nothing else is
edited. The toy method (tests/toy_method.py, declared in tests/toy_declaration.py) stands in for the new
method: its declaration is placed among the package's modules for one test."""

from __future__ import annotations

import csv
import shutil
import sys
from pathlib import Path

import pytest

import fedcore.methods
from fedcore import registry
from fedcore.config import Config, schema
from runner.inprocess import run_inprocess
from tests import toy_declaration
from tests.conftest import small_config
from tools import sync_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A folder whose modules count as modules of ``fedcore/methods/`` for one test (and are gone after it)."""
    package = tmp_path / "methods"
    package.mkdir()
    monkeypatch.setattr(fedcore.methods, "__path__", [*fedcore.methods.__path__, str(package)])
    yield package
    for path in package.glob("*.py"):
        sys.modules.pop(f"fedcore.methods.{path.stem}", None)
        fedcore.methods.__dict__.pop(path.stem, None)


def test_a_declaration_placed_in_fedcore_methods_is_registered_configured_and_run(scratch, tmp_path, monkeypatch):
    shutil.copy(toy_declaration.__file__, scratch / "toy.py")  # fedcore/methods/toy.py, as a new method's
    scanned = registry.scan()
    assert list(scanned)[:-1] == list(registry.REGISTRY) and list(scanned)[-1] == "toy"  # POSITION: last
    toy = scanned["toy"]
    assert (toy.summary, toy.strategy_path, toy.client_path) == (
        toy_declaration.SUMMARY, "tests.toy_method:ToyStrategy", "tests.toy_method:ToyClient")
    assert toy.declaration.__name__ == "fedcore.methods.toy" and toy.hparams.keys() == {"steps"}
    monkeypatch.setitem(registry.REGISTRY, "toy", toy)

    # its keys are valid run config, and `make sync-config` writes them into pyproject.toml and nothing else
    assert schema()["toy.steps"].default == 3 and Config.from_run_config({"method": "toy"})["toy.steps"] == 3
    text = (ROOT / "pyproject.toml").read_text()
    synced = sync_config.synced(text)
    assert synced == text.replace(sync_config.FOOTER, "\n[tool.flwr.app.config.toy]\nsteps = 3\n" + sync_config.FOOTER)

    summary, _ = run_inprocess(small_config(tmp_path, method="toy", **{"num-server-rounds": 2}), 3)
    with open(f"{summary['results_dir']}/rounds.csv") as f:
        rounds = [int(row["round"]) for row in csv.DictReader(f)]
    assert summary["dropped_replies"] == 0 and max(rounds) == 2


def test_a_declaration_without_its_record_is_refused_by_name(scratch):
    (scratch / "half.py").write_text('"""A declaration that forgot its record."""\nHPARAMS = {}\n')
    with pytest.raises(ValueError, match="fedcore.methods.half does not name SUMMARY, STRATEGY, CLIENT, POSITION"):
        registry.scan()


def test_two_declarations_may_not_claim_one_position(scratch):
    text = Path(toy_declaration.__file__).read_text().replace("POSITION = 1000", "POSITION = 2")
    (scratch / "toy.py").write_text(text)
    with pytest.raises(ValueError, match="toy and fedavg both declare POSITION = 2|fedavg and toy both declare"):
        registry.scan()
