"""What the run's times measure: start-up runs from the command's start (the ServerApp's without the
launcher) to the first round the run does, round 0 included where a method has one; wall_s from all
clients connected to the last round's end; and the end-of-run table names each."""

from __future__ import annotations

import csv
import time

from server_app.results import format_summary


def _table(summary) -> dict[str, str]:
    """The end-of-run table as {label: value}."""
    cells = [line.strip("|").split(" | ") for line in format_summary(summary).splitlines() if line.startswith("| ")]
    return {key.strip(): value.strip() for key, value in cells}


def _rows(summary) -> list[dict]:
    with open(f"{summary['results_dir']}/rounds.csv") as f:
        return list(csv.DictReader(f))


def test_startup_ends_where_round_0_starts_and_the_table_names_each_time(inprocess, monkeypatch):
    monkeypatch.setenv("PFL_LAUNCH_T0", str(time.time() - 100.0))  # as the launcher passes it
    summary, _ = inprocess(num_clients=2, method="fedfcd", **{"num-server-rounds": 2})
    rows = _rows(summary)
    assert [r["round"] for r in rows] == ["0", "1", "2"]
    # round 0 (the LFR collection) is the run's first round: start-up stops before it, not after it
    assert rows[0]["startup_s"] != "" and rows[1]["startup_s"] == "" and rows[2]["startup_s"] == ""
    assert summary["startup_s"] == float(rows[0]["startup_s"]) >= 100.0
    assert summary["startup_from"] == "command start"
    assert summary["wall_s"] >= sum(float(r["wall_s"]) for r in rows)  # every round, round 0 included
    assert summary["first_round_s"] == float(rows[1]["wall_s"])

    table = _table(summary)
    assert table["start-up s (command start to first round)"] == f"{summary['startup_s']:.2f}"
    assert table["wall s (clients connected to last round's end)"] == f"{summary['wall_s']:.1f}"
    assert table["s per round: round 1, mean of the rest"] == \
        f"{summary['first_round_s']:.2f}, {summary['wall_s_per_round']:.2f}"
    assert not any("total" in label for label in table)


def test_without_the_launcher_startup_counts_from_the_serverapp_and_sits_in_round_1(inprocess, monkeypatch):
    monkeypatch.delenv("PFL_LAUNCH_T0", raising=False)
    summary, _ = inprocess(num_clients=2, method="fedavg", **{"num-server-rounds": 2})
    rows = _rows(summary)
    assert [r["round"] for r in rows] == ["1", "2"]
    assert rows[0]["startup_s"] != "" and rows[1]["startup_s"] == ""
    assert summary["startup_from"] == "ServerApp start" and 0 <= summary["startup_s"] < 100
    assert "start-up s (ServerApp start to first round)" in _table(summary)
