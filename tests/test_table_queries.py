"""`python -m runner.table`'s command line, called in process: each query reads what it says, from the files it
needs; the rounds a row needs to reach a mark, and how every row of a rebuilt table moved against a commit."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess

import pytest

from runner import run_data
from runner.table import ROOT, main, moved_rows, parse_marks, render_rounds, rounds_to_marks, table_at

# a committed table with tuned settings, several rows and a headline in the paper's metric
TABLE = "docs/results/fedfcd-fmnist-dirichlet"


def _git(root, *args):
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo, files: dict[str, str]) -> str:
    """A commit of a fresh repository at ``repo`` holding ``files`` (path -> text); its hash."""
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "before")
    return _git(repo, "rev-parse", "HEAD")


# ------------------------------------------------------------------------------------------------------ rounds
def _run(label: str, seed: int, accs: list[float]) -> dict:
    return {"label": label, "seed": seed, "status": "completed", "final_round": len(accs),
            "rounds": {"round": list(range(1, len(accs) + 1)), "acc_weighted": accs,
                       "acc_client_mean": [a - 0.2 for a in accs]}}


def test_marks_are_percentages_in_0_100_and_100_is_a_mark():
    assert parse_marks("50") == [0.5] and parse_marks("12.5,100") == [0.125, 1.0]
    for bad in ("0", "-5", "100.5"):
        with pytest.raises(SystemExit, match="percentage in"):
            parse_marks(bad)


def test_rows_follow_the_presets_order_then_the_unlisted_ones_by_label(tmp_path):
    run_data.write(tmp_path, [_run("b", 0, [0.9]), _run("c", 0, [0.9]), _run("a", 0, [0.9]), _run("z", 0, [0.9])])
    assert list(rounds_to_marks(tmp_path, [0.5])) == ["a", "b", "c", "z"]  # no preset.json: by label
    (tmp_path / "preset.json").write_text(json.dumps({"compare": {}}))  # a preset without a methods list
    assert list(rounds_to_marks(tmp_path, [0.5])) == ["a", "b", "c", "z"]
    (tmp_path / "preset.json").write_text(json.dumps({"compare": {"methods": ["z", "c"]}}))
    assert list(rounds_to_marks(tmp_path, [0.5])) == ["z", "c", "a", "b"]


def test_the_rounds_table_has_a_column_per_mark_and_a_dash_where_a_seed_never_reached_it():
    found = {"m": {"seeds": [0, 1], 0.5: [2, None], 0.75: [None, None]}}
    assert render_rounds(found, [0.5, 0.75], "acc_client_mean").split("\n") == [
        "Column `acc_client_mean`; the first evaluated round at or above each mark, seed by seed in the order of the "
        "seeds column; - = not reached.",
        "",
        "| method | seeds | rounds to 50% | rounds to 75% |",
        "|---|---|---|---|",
        "| m | 0 / 1 | 2 / - | - / - |"]


def test_the_rounds_query_reads_the_column_and_marks_it_is_given_and_80_85_90_by_default(tmp_path, capsys):
    # weighted: 0.70, 0.86, 0.95; client mean 0.2 lower
    run_data.write(tmp_path, [_run("m", 0, [0.70, 0.86, 0.95])])
    assert main([str(tmp_path), "rounds"]) == 0
    out = capsys.readouterr().out.split("\n")
    assert out[0].startswith("Column `acc_weighted`;")
    assert "| method | seeds | rounds to 80% | rounds to 85% | rounds to 90% |" in out and "| m | 0 | 2 | 2 | 3 |" in out
    assert main([str(tmp_path), "rounds", "--marks", "66", "--column", "acc_client_mean"]) == 0
    out = capsys.readouterr().out.split("\n")
    assert out[0].startswith("Column `acc_client_mean`;")  # client mean 0.50, 0.66, 0.75
    assert "| method | seeds | rounds to 66% |" in out and "| m | 0 | 2 |" in out


# ------------------------------------------------------------------------------------------------------ paired
def test_the_paired_query_takes_several_pairs_and_another_metric_than_the_headline(tmp_path, capsys):
    runs = [{"label": label, "seed": seed, "status": "completed", "final_round": 2,
             "rounds": {"round": [1, 2], "acc_weighted": [0.1, final], "acc_client_mean": [0.1, final]}}
            for label, seed, final in [("a", 0, 0.90), ("a", 1, 0.80), ("b", 0, 0.85), ("b", 1, 0.70),
                                       ("c", 0, 0.90), ("c", 1, 0.80)]]
    run_data.write(tmp_path, runs)
    (tmp_path / "preset.json").write_text(json.dumps({"compare": {"methods": ["a", "b", "c"]}}))
    # the table's headline needs a validation split these runs do not have
    (tmp_path / "headline.csv").write_text("method,metric\na,test_acc_at_best_val\n")
    assert main([str(tmp_path), "paired", "a:b", "a:c", "--metric", "final_acc"]) == 0
    out = capsys.readouterr().out.split("\n")
    assert out[0].startswith("Metric `final_acc`;")
    # a - b: 5 and 10 points, mean 7.5, sample std 3.54; t(1 df, 97.5%) = 12.706: 7.5 -/+ 31.77
    half = 12.706204736174707 * math.sqrt(12.5) / math.sqrt(2)
    assert f"| a minus b | 2 | +7.50 [{7.5 - half:+.2f}, {7.5 + half:+.2f}] tie |" in out
    assert "| a minus c | 2 | +0.00 [+0.00, +0.00] tie |" in out
    with pytest.raises(SystemExit):  # a metric no table has
        main([str(tmp_path), "paired", "a:b", "--metric", "best_acc"])


def test_a_query_names_the_file_it_lacks_and_a_missing_query_is_refused(tmp_path):
    run_data.write(tmp_path, [_run("a", 0, [0.5])])
    with pytest.raises(SystemExit, match=r"no preset\.json"):  # paired needs the table's rows
        main([str(tmp_path), "paired", "a:b"])
    with pytest.raises(SystemExit, match=r"no table\.csv"):
        main([str(tmp_path), "moved", "--since", "HEAD"])
    (tmp_path / "table.csv").write_text("method\n")
    with pytest.raises(SystemExit, match=r"no preset\.json"):
        main([str(tmp_path), "moved", "--since", "HEAD"])
    with pytest.raises(SystemExit) as no_query:
        main([str(tmp_path)])
    assert no_query.value.code == 2  # argparse's usage error, not a crash
    with pytest.raises(SystemExit) as no_since:
        main([str(ROOT / TABLE), "moved"])
    assert no_since.value.code == 2


# ------------------------------------------------------------------------------------------------------- moved
def _rank(value: float, values: list[float]) -> int:
    """Competition rank, from the position of its first equal in the values sorted from the highest."""
    return sorted(values, reverse=True).index(value) + 1


def test_the_moved_query_prints_each_rows_move_rank_and_tuned_setting(tmp_path, monkeypatch, capsys):
    """A committed table against a 'before' made from it: its first row new since, its second 5 points lower then,
    a row gone; the before table is held by a commit of another repository (GIT_DIR), at the table's path."""
    folder = ROOT / TABLE
    with open(folder / "headline.csv") as f:
        (key,) = {r["metric"] for r in csv.DictReader(f)}
    with open(folder / "table.csv") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    after = {r["method"]: float(r[key]) for r in rows}
    assert len(after) >= 4 and not any(math.isnan(v) for v in after.values())
    new, lower = rows[0]["method"], rows[1]["method"]
    before_rows = [dict(r) for r in rows[1:]] + [{**rows[1], "method": "gone-row", key: "0.999"}]
    before_rows[0][key] = repr(after[lower] - 0.05)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(before_rows)
    repo = tmp_path / "repo"
    commit = _commit(repo, {f"{TABLE}/table.csv": text.getvalue()})
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))

    assert main([str(folder), "moved", "--since", commit]) == 0
    out = capsys.readouterr().out
    before = {r["method"]: float(r[key]) for r in before_rows}
    tuned = json.loads((folder / "preset.json").read_text()).get("tuned-config", {})
    assert any(m in tuned for m in after) and any(m not in tuned for m in after)
    expected = [f"Headline ({key}), in %: the table at `{commit}` and now (`python -m runner.table {TABLE} moved "
                f"--since {commit}`).", "",
                "| row | before | after | change (points) | rank before → after | tuned setting now |",
                "|---|---|---|---|---|---|"]
    for method in [*after, "gone-row"]:
        b, a = before.get(method), after.get(method)
        setting = ", ".join(f"{k} = {v}" for k, v in tuned.get(method, {}).items()) or "-"
        expected.append(" | ".join([
            f"| {method}", "-" if b is None else f"{100 * b:.2f}", "-" if a is None else f"{100 * a:.2f}",
            "-" if b is None or a is None else f"{100 * (a - b):+.2f}",
            f"{'-' if b is None else _rank(b, list(before.values()))} → "
            f"{'-' if a is None else _rank(a, list(after.values()))}", setting]) + " |")
    assert out == "\n".join(expected) + "\n"
    assert f"| {lower} | {100 * (after[lower] - 0.05):.2f} | {100 * after[lower]:.2f} | +5.00 |" in out
    assert f"| {new} | - |" in out and "| gone-row | 99.90 | - | - | 1 → - |" in out


def test_a_table_without_tuned_settings_moves_with_none_and_an_unknown_commit_is_refused(tmp_path):
    folder = tmp_path / "docs" / "results" / "t"
    header = "method,seeds,test_acc_at_best_val\n"
    preset = json.dumps({"compare": {}})
    commit = _commit(tmp_path, {"docs/results/t/table.csv": header + "fedavg,3,0.8\nfedprox,3,0.9\n",
                                "docs/results/t/preset.json": preset})
    (folder / "table.csv").write_text(header + "fedavg,3,0.95\nfedprox,3,0.9\n")
    key, rows = moved_rows(folder, commit, root=tmp_path)
    assert key == "test_acc_at_best_val"
    assert [(r["method"], r["rank_before"], r["rank_after"], r["settings"]) for r in rows] == [
        ("fedavg", 2, 1, {}), ("fedprox", 1, 2, {})]
    (folder / "preset.json").write_text(json.dumps({"compare": {}, "tuned-config": {"fedprox": {"fedprox.mu": 0.1}}}))
    assert [r["settings"] for r in moved_rows(folder, commit, root=tmp_path)[1]] == [{}, {"fedprox.mu": 0.1}]
    with pytest.raises(subprocess.CalledProcessError):  # never read as an empty 'before' table
        table_at(folder, "0" * 40, root=tmp_path)
