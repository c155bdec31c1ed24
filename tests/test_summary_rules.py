"""README's summary (benchmarks.summary): the best baseline of the same table in the same metric, the paired interval
and its tie, a table not all run left out, ± only over several seeds, and the command that writes both files."""

from __future__ import annotations

import json

import pytest

from benchmarks import summary
from benchmarks.summary import main, render, split_by_data, summary_rows

PAIRED = "paired_vs,paired_metric,diff_mean,diff_lo,diff_hi,diff_n"


def _table(results, name: str, rows: list[str], columns: str, preset: dict | None = None, md: str | None = None):
    folder = results / name
    folder.mkdir(parents=True)
    (folder / "preset.json").write_text(json.dumps(preset or {"compare": {"methods": []}}))
    (folder / "table.csv").write_text(columns + "\n" + "\n".join(rows) + "\n")
    if md is not None:
        (folder / "table.md").write_text(md)
    return folder


def test_a_majority_class_row_is_a_floor_not_a_baseline(tmp_path):
    _table(tmp_path, "t", ["fedsac,0.80,0.01,3", "majority,0.95,0.00,3", "fedavg,0.70,0.01,3"],
           "method,final_acc,final_acc_std,seeds")
    (row,) = summary_rows(tmp_path)
    assert (row["baseline"], row["base"]) == ("fedavg", 0.70)


def test_one_seed_shows_no_spread_and_several_seeds_show_the_std(tmp_path):
    """± is the sample std over seeds: none for one seed, even where an older table wrote its std as 0."""
    _table(tmp_path, "one", ["fedsac,0.9123,0.0,1", "fedavg,0.8041,0.0,1"], "method,final_acc,final_acc_std,seeds")
    _table(tmp_path, "two", ["fedsac,0.9123,0.0125,2", "fedavg,0.8041,,2"], "method,final_acc,final_acc_std,seeds")
    one, two = summary_rows(tmp_path)
    text = render([one, two])
    # the metric column names the final round's weighted accuracy (no validation split here)
    assert "| fedsac | `one` | final acc (weighted) | 1 | 91.23 | fedavg 80.41 | +10.82 " in text
    # two seeds: the std where the table has one, none where it is missing
    assert "| fedsac | `two` | final acc (weighted) | 2 | 91.23 ± 1.25 | fedavg 80.41 | +10.82 " in text


def test_a_row_label_is_everything_before_the_last_seed_of_a_not_run_entry(tmp_path):
    """A not-run ablation row whose label itself holds " seed " (a variant of fedavg run on one split) is not the
    baseline fedavg: the table is complete."""
    md = "| method |\n\nNot run (1): fedavg seed 3 split seed 0\n"
    _table(tmp_path, "t", ["fedsac,0.90,0.01,3", "fedavg,0.80,0.01,3"], "method,final_acc,final_acc_std,seeds", md=md)
    assert [r["baseline"] for r in summary_rows(tmp_path)] == ["fedavg"]
    (tmp_path / "t" / "table.md").write_text("| method |\n\nNot run (1): fedavg seed 0\n")
    assert summary_rows(tmp_path) == []


def test_the_paired_interval_is_the_tables_only_in_this_metric_against_this_method(tmp_path):
    columns = "method,final_acc,final_acc_std,test_acc_at_best_val,test_acc_at_best_val_std,seeds," + PAIRED
    # made on the final round's accuracy, while the headline is at the best-validation round: not this difference
    _table(tmp_path, "metric", ["fedsac,0.9,0.01,0.91,0.01,3,,,,,,", "fedavg,0.8,0.01,0.86,0.01,3,fedsac,final_acc,"
                                "0.10,0.05,0.15,3"], columns)
    # two paper methods; the table's paired column is FedSaC's, so FedFCD's row has no interval
    _table(tmp_path, "method", ["fedfcd,0.9,0.01,0.93,0.01,3,,,,,,", "fedsac,0.9,0.01,0.91,0.01,3,,,,,,",
                                "fedavg,0.8,0.01,0.86,0.01,3,fedsac,test_acc_at_best_val,0.05,0.01,0.09,3"], columns)
    rows = {(r["table"], r["method"]): r for r in summary_rows(tmp_path)}
    assert rows["metric", "fedsac"]["paired"] is None and rows["method", "fedfcd"]["paired"] is None
    assert rows["method", "fedsac"]["paired"] == {"mean": 0.05, "lo": 0.01, "hi": 0.09, "n": 3, "tie": False}
    text = render(list(rows.values()))
    assert "| +5.00 (paired interval not available until rebuilt) |" in text  # metric: 91 - 86
    assert "| +7.00 (paired interval not available until rebuilt) |" in text  # FedFCD: 93 - 86
    assert "| +5.00 [+1.00, +9.00] |" in text


@pytest.mark.parametrize("lo,hi,tie", [(0.0, 0.02, True), (-0.02, 0.0, True), (0.001, 0.02, False),
                                       (-0.02, -0.001, False)])
def test_tie_where_the_interval_covers_0_its_ends_included(tmp_path, lo, hi, tie):
    columns = "method,final_acc,final_acc_std,seeds," + PAIRED
    _table(tmp_path, "t", ["fedsac,0.9,0.01,3,,,,,,", f"fedavg,0.89,0.01,3,fedsac,final_acc,0.01,{lo},{hi},3"],
           columns)
    (row,) = summary_rows(tmp_path)
    assert row["paired"]["tie"] is tie


def test_the_command_writes_both_files_by_data_where_it_is_told_and_in_docs_by_default(tmp_path, monkeypatch,
                                                                                       capsys):
    expected = {name: render(rows) for name, rows in split_by_data(summary_rows()).items()}
    assert set(expected) == {"table.md", "embedded-data.md"}
    out = tmp_path / "new" / "summary"  # its parent does not exist yet
    for _ in range(2):  # and a second time over the first's files
        assert main(["--out", str(out)]) == 0
        assert {f.name: f.read_text() for f in out.iterdir()} == expected
        assert capsys.readouterr().out == "".join(text + "\n" for text in expected.values())
    monkeypatch.setattr(summary, "ROOT", tmp_path)  # where the default output lies (the tables are read as before)
    assert main([]) == 0
    assert {f.name: f.read_text() for f in (tmp_path / "docs" / "results" / "summary").iterdir()} == expected
