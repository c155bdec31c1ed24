"""`python -m runner.table <folder> moved`: which rows of a rebuilt table moved, against the table as committed before."""

from __future__ import annotations

import json
import subprocess

import pytest

from runner.compare_rows import COLUMNS
from runner.table import moved_rows


def _table(path, rows):
    cols = ["method", *[c for c in COLUMNS if c != "method"]]
    lines = [",".join(cols)]
    for method, acc in rows:
        values = {"method": method, "seeds": "3", "test_acc_at_best_val": str(acc)}
        lines.append(",".join(values.get(c, "") for c in cols))
    path.write_text("\n".join(lines) + "\n")


def _git(root, *args):
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def test_each_row_says_how_far_it_moved_and_its_rank_before_and_after(tmp_path):
    folder = tmp_path / "docs" / "results" / "t"
    folder.mkdir(parents=True)
    (folder / "preset.json").write_text(json.dumps({"compare": {}, "tuned-config": {"fedprox": {"fedprox.mu": 1.0}}}))
    _table(folder / "table.csv", [("fedavg", 0.90), ("fedprox", 0.90), ("cfl", 0.95)])
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "before")
    before = _git(tmp_path, "rev-parse", "HEAD")
    _table(folder / "table.csv", [("fedavg", 0.90), ("fedprox", 0.97), ("ditto", 0.91)])

    key, rows = moved_rows(folder, before, root=tmp_path)
    by = {r["method"]: r for r in rows}
    assert key == "test_acc_at_best_val"
    assert by["fedavg"]["change"] == pytest.approx(0.0)
    assert by["fedprox"]["change"] == pytest.approx(0.07)
    assert (by["fedprox"]["rank_before"], by["fedprox"]["rank_after"]) == (2, 1)
    assert by["fedavg"]["rank_before"] == 2  # equal accuracies share a rank
    assert by["fedprox"]["settings"] == {"fedprox.mu": 1.0}
    assert by["ditto"]["before"] is None and by["ditto"]["change"] is None  # new in the table
    assert by["cfl"]["after"] is None and by["cfl"]["rank_before"] == 1  # gone from it
