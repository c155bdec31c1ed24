"""`python -m runner.table <folder> rounds`: the rounds each seed took to reach accuracy marks, read from a table's per-run data."""

import json
import math
from pathlib import Path

import pytest

from runner import run_data
from runner.compare_table import read_table_csv
from runner.table import main, render_rounds, rounds_to_marks

ROOT = Path(__file__).resolve().parents[1]


def _run(label: str, seed: int, accs: list[float | None]) -> dict:
    rounds = list(range(1, len(accs) + 1))
    return {"label": label, "seed": seed, "status": "completed", "final_round": len(accs),
            "rounds": {"round": rounds, "acc_weighted": accs, "acc_client_mean": [a and a - 0.1 for a in accs]}}


def test_first_round_at_or_above_each_mark_per_seed_in_the_tables_order(tmp_path, capsys):
    run_data.write(tmp_path, [_run("zeta", 1, [0.5, 0.79, 0.9]), _run("zeta", 0, [0.8, None, 0.85]),
                              _run("alpha", 0, [0.1, 0.2, 0.3]), _run("alpha", 1, [0.9, 0.95, 0.99])])
    (tmp_path / "preset.json").write_text(json.dumps({"compare": {"methods": ["zeta", "alpha"]}}))
    found = rounds_to_marks(tmp_path, [0.8, 0.9])
    assert list(found) == ["zeta", "alpha"]  # the preset's order, not the file's
    assert found["zeta"] == {"seeds": [0, 1], 0.8: [1, 3], 0.9: [None, 3]}
    assert found["alpha"] == {"seeds": [0, 1], 0.8: [None, 1], 0.9: [None, 1]}
    assert rounds_to_marks(tmp_path, [0.78], "acc_client_mean")["zeta"][0.78] == [None, 3]  # seed 0 tops at 0.75
    main([str(tmp_path), "rounds", "--marks", "80,90"])
    out = capsys.readouterr().out
    assert "| zeta | 0 / 1 | 1 / 3 | - / 3 |" in out and "| alpha | 0 / 1 | - / 1 | - / 1 |" in out
    assert "| method | seeds | rounds to 80% | rounds to 90% |" in render_rounds(found, [0.8, 0.9], "acc_weighted")


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no runs.json.gz"):
        main([str(tmp_path), "rounds"])
    run_data.write(tmp_path, [_run("a", 0, [0.5])])
    with pytest.raises(SystemExit, match="percentage in"):
        main([str(tmp_path), "rounds", "--marks", "0.8,150"])
    with pytest.raises(SystemExit, match="comma-separated"):
        main([str(tmp_path), "rounds", "--marks", "80;90"])


def test_it_agrees_with_a_committed_tables_rounds_to_target_column():
    """The mnist5k IF = 10 table's "rounds to 80%" column (made from each run's rounds.csv) is the mean over the
    seeds that reached 80%, as read here from its runs.json.gz."""
    folder = ROOT / "docs" / "results" / "mupfl-mnist5k-lt10"
    target = json.loads((folder / "preset.json").read_text())["compare"]["target-acc"]
    found = rounds_to_marks(folder, [target])
    rows = read_table_csv(folder / "table.csv")
    assert rows and {r["method"] for r in rows} <= set(found)
    for row in rows:
        reached = [r for r in found[row["method"]][target] if r is not None]
        assert row["runs_reaching_target"] == f"{len(reached)}/{len(found[row['method']][target])}"
        if reached:
            assert row["rounds_to_target"] == pytest.approx(sum(reached) / len(reached))
        else:
            assert math.isnan(row["rounds_to_target"])
