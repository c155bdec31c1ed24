"""`python -m runner.table <folder> paired`: paired differences between any two rows of a table, read from its per-run data."""

import csv
import json
import math
from pathlib import Path

import pytest

from runner import run_data
from runner.compare_table import read_table_csv
from runner.table import main, paired_rows

ROOT = Path(__file__).resolve().parents[1]


def _run(label: str, seed: int, final: float) -> dict:
    return {"label": label, "seed": seed, "status": "completed", "final_round": 2,
            "rounds": {"round": [1, 2], "acc_weighted": [0.1, final], "acc_client_mean": [0.1, final]}}


def _headline(folder: Path, metric: str) -> None:
    """The table's headline metric (headline.csv) and its rows (preset.json) beside its runs.json.gz."""
    with open(folder / "headline.csv", "w", newline="") as f:
        csv.writer(f).writerows([["method", "metric"], ["a", metric]])
    (folder / "preset.json").write_text(json.dumps({"compare": {"methods": ["a", "b"]}}))


def test_a_minus_b_over_common_seeds_with_a_t_interval(tmp_path, capsys):
    # a - b per seed: 5, 2, 10 points (seed 3 has only a, so it is left out)
    run_data.write(tmp_path, [_run("a", 0, 0.90), _run("a", 1, 0.80), _run("a", 2, 0.70), _run("a", 3, 0.5),
                              _run("b", 0, 0.85), _run("b", 1, 0.78), _run("b", 2, 0.60)])
    _headline(tmp_path, "final_acc")
    (row,) = paired_rows(tmp_path, [("a", "b")])
    d = [5.0, 2.0, 10.0]
    mean = sum(d) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    half = 4.302652729911275 * std / math.sqrt(3)  # Student's t, 2 degrees of freedom, 97.5%
    assert row["n"] == 3 and 100 * row["mean"] == pytest.approx(mean)
    assert 100 * row["lo"] == pytest.approx(mean - half) and 100 * row["hi"] == pytest.approx(mean + half)
    assert row["tie"] is True  # about [-4.37, +15.71]
    main([str(tmp_path), "paired", "b:a"])
    assert "| b minus a | 3 | -5.67 [-15.71, +4.37] tie |" in capsys.readouterr().out


def test_it_agrees_with_a_committed_tables_paired_column():
    """The FedSaC Fashion-MNIST table's "fedsac minus row" column, recomputed here from its runs.json.gz."""
    folder = ROOT / "docs" / "results" / "fedsac-fmnist-dir-high"
    rows = [r for r in read_table_csv(folder / "table.csv") if r["method"] not in ("fedsac", "fedsac-aggregated")]
    assert len(rows) >= 10
    found = paired_rows(folder, [("fedsac", r["method"]) for r in rows])
    for row, diff in zip(rows, found):
        assert diff["metric"] == row["paired_metric"]
        assert (diff["mean"], diff["lo"], diff["hi"]) == pytest.approx((row["diff_mean"], row["diff_lo"],
                                                                       row["diff_hi"]), abs=1e-9)


def test_a_runs_of_row_reads_its_source_runs_in_its_own_accuracy():
    """FedSaC-aggregated has no runs of its own (FedSaC's, scored on the aggregated model): its paired cell is the
    table's."""
    folder = ROOT / "docs" / "results" / "fedsac-fmnist-dir-high"
    (row,) = [r for r in read_table_csv(folder / "table.csv") if r["method"] == "fedsac-aggregated"]
    (diff,) = paired_rows(folder, [("fedsac", "fedsac-aggregated")])
    assert diff["n"] == 3 and (diff["mean"], diff["lo"], diff["hi"]) == pytest.approx(
        (row["diff_mean"], row["diff_lo"], row["diff_hi"]), abs=1e-9)


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no runs.json.gz"):
        main([str(tmp_path), "paired", "a:b"])
    run_data.write(tmp_path, [_run("a", 0, 0.5), _run("b", 0, 0.4)])
    _headline(tmp_path, "final_acc")
    with pytest.raises(SystemExit, match="write it as A:B"):
        main([str(tmp_path), "paired", "a-b"])
    with pytest.raises(SystemExit, match="no runs labelled c; the table's run labels are a, b"):
        main([str(tmp_path), "paired", "a:c"])
