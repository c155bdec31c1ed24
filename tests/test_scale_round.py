"""`make bench-scale` (benchmarks/scale_round.py): the run config of a row, which rounds make its steady round, the
refusal of sampled evaluation where the schema lacks it, and (``make test-long``) a real row at a small count."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import scale_round
from fedcore.config import Config


def _rounds(walls, replies=10, evaluated=(10, 10, 10, 10, 1000)):
    return [{"round": i + 1, "wall_s": w, "replies": replies, "eval_clients": e}
            for i, (w, e) in enumerate(zip(walls, evaluated))]


def test_the_steady_round_leaves_out_round_one_and_under_sampling_the_complete_last_round():
    rows = _rounds([9.0, 1.0, 2.0, 3.0, 40.0])
    assert scale_round.steady(rows, "sampled") == (2.0, pytest.approx(0.1), 40.0)  # rounds 2..4; 20 messages each
    assert scale_round.steady(rows, "all")[0] == 2.5  # rounds 2..5
    assert scale_round.steady(rows, "last")[0] == 2.0
    assert scale_round.steady([], "all") == (None, None, None)


def test_a_rows_run_config_is_valid_and_samples_evaluation_only_when_asked(tmp_path):
    everyone = scale_round.run_config(100, 5, 0.01, "all", tmp_path, "x")
    assert everyone["eval-every"] == 1 and "fraction-evaluate" not in everyone
    cfg = Config.from_run_config(everyone)
    assert (cfg["dataset"], cfg["fraction-train"], cfg["plots"]) == ("fmnist", 0.01, False)
    sampled = scale_round.run_config(100, 5, 0.01, "sampled", tmp_path, "x")
    assert sampled["fraction-evaluate"] == 0.01 and sampled["eval-every"] == 5  # the last round evaluates all
    last = scale_round.run_config(100, 5, 0.01, "last", tmp_path, "x")
    assert last["eval-every"] == 5 and "fraction-evaluate" not in last
    Config.from_run_config(last)
    with pytest.raises(ValueError, match="evaluation must be one of"):
        scale_round.run_config(100, 5, 0.01, "some", tmp_path, "x")
    assert "plots=false" in scale_round.to_flwr(everyone) and "dataset='fmnist'" in scale_round.to_flwr(everyone)


def test_sampled_evaluation_is_refused_where_the_schema_has_no_fraction_evaluate(monkeypatch):
    import fedcore.config

    monkeypatch.setattr(fedcore.config, "schema", lambda: {"fraction-train": None})
    with pytest.raises(SystemExit, match="no 'fraction-evaluate'"):
        scale_round.check_sampled_evaluation()
    with pytest.raises(SystemExit, match="no 'fraction-evaluate'"):
        scale_round.main(["--clients", "10", "--evaluation", "sampled", "--out", "/nonexistent/never-written"])
    assert not Path("/nonexistent/never-written").exists()


@pytest.mark.long  # two real flwr runs and an in-process run at 30 clients: make test-long
def test_a_row_runs_both_paths_beside_the_inprocess_engine(tmp_path):
    assert scale_round.main(["--clients", "30", "--rounds", "2", "--fraction", "0.2", "--evaluation", "all",
                             "--flower-path", "30", "--out", str(tmp_path), "--allow-dirty"]) == 0
    table = (tmp_path / "table.md").read_text()
    assert "| 30 | all | 2 | patched | finished:completed |" in table
    assert "| 30 | all | 2 | Flower's own | finished:completed |" in table
    rows = (tmp_path / "table.csv").read_text().splitlines()
    assert len(rows) == 3 and all(r.split(",")[7] for r in rows[1:])  # a ratio in each row
