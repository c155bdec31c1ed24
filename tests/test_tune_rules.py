"""The tuning rule's re-choice (benchmarks/tune.py ``rechoose``), on its own: a record whose grid runs all failed
keeps no choice, and a record without its validation size gets it from its preset's own client count (10 where
the preset names none, as a comparison runs it)."""

from __future__ import annotations

from benchmarks import tune
from fedcore.config import Config
from partitions import federated_data


def _record(grid, **extra):
    return {"chosen": {"fedprox.mu": 0.5}, "preset": "tiny", "seed": 3, "grid": grid, **extra}


def test_a_grid_whose_runs_all_failed_keeps_no_choice(tmp_path):
    failed = [{"setting": {"fedprox.mu": 0.01}, "val_acc": None}, {"setting": {"fedprox.mu": 0.5}, "val_acc": None}]
    records = {"fedprox": _record(failed, **{"val-samples": 100})}
    assert tune.rechoose(records, tmp_path) == {"fedprox": ({"fedprox.mu": 0.5}, {})}
    assert records["fedprox"]["chosen"] == {}


def test_the_validation_size_comes_from_the_presets_clients_ten_by_default(tmp_path):
    (tmp_path / "tiny.toml").write_text('[compare]\nmethods = ["fedprox"]\nseeds = [3]\nengine = "inprocess"\n'
                                        f'output = "{tmp_path / "out"}"\n[run-config]\ndataset = "digits"\n'
                                        'partition = "iid"\nmodel = "mlr"\nval-fraction = 0.2\n'
                                        'num-server-rounds = 2\n')
    grid = [{"setting": {"fedprox.mu": 0.01}, "val_acc": 0.8}, {"setting": {"fedprox.mu": 0.5}, "val_acc": 0.81}]
    records = {"fedprox": _record(grid)}
    tune.rechoose(records, tmp_path)
    run = {"dataset": "digits", "partition": "iid", "model": "mlr", "val-fraction": 0.2, "seed": 3}
    _, splits = federated_data(*Config.from_run_config(run).data_key(10))
    assert records["fedprox"]["val-samples"] == sum(len(s.val) for s in splits) == 267  # 264 with 11 clients


def test_a_preset_without_a_run_config_has_the_defaults_budget_family_and_no_validation(tmp_path):
    import pytest

    from fedcore.tuning_grid import family

    assert tune.tuning_budget({}) == tune.tuning_budget({"run-config": {}}) == 5  # half of 10 rounds
    assert tune.tuned_path(tmp_path / "p.toml", {"compare": {}}) == tmp_path / "tuned" / f"{family({})}.toml"
    with pytest.raises(SystemExit, match="val-fraction"):
        tune.check_validation({}, "p.toml")
