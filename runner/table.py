"""Questions asked of one docs/results table folder, answered from its committed per-run data and table.csv.

    python -m runner.table docs/results/<table> paired A:B [C:D ...] [--metric final_acc]
    python -m runner.table docs/results/<table> rounds --marks 80,85,90 [--column acc_weighted]
    python -m runner.table docs/results/<table> moved --since <commit>

- ``paired``: a minus b seed by seed, for any two rows. A table compares its paper method with every row; an
  ablation's verdicts need other pairs too (what a module adds is the row with it minus the row without it). Same
  headline metric (the table's ``headline.csv``), row values (``compare_rows.headline_by_seed``: a ``runs-of`` row
  reads its source runs) and rule (``stats.paired_difference``: mean and 95% t-interval over the seeds both rows
  have; a tie where the interval covers 0) as the table's own paired column.
- ``rounds``: the rounds each run took to reach accuracy marks. A table's "rounds to X%" column has one mark, the
  paper's; where the runs do not reach it, a page's training-speed verdict reads the same runs at lower marks,
  with the table's rule (``compare_rows.rounds_to_target``: the first evaluated round at or above the mark).
- ``moved``: which rows of a rebuilt table moved (issue #45), against its ``table.csv`` as committed at
  ``<commit>`` (``git show``): the headline before and after, the change, the row's tuned setting now and its
  rank before and after; a row new in the table, or gone from it, says so.

So a page cites a command for each number it quotes beyond the table.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from runner import run_data, stats
from runner.compare_presets import entries
from runner.compare_rows import HEADLINE_TO_KEY, headline_by_seed, headline_key, rounds_to_target
from runner.compare_table import read_table_csv

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------------ paired
def headline_metric(folder: Path) -> str:
    """The summary key the table's headline column reads (its headline.csv's ``metric``)."""
    with open(folder / "headline.csv") as f:
        metrics = {row["metric"] for row in csv.DictReader(f)}
    if len(metrics) != 1:
        raise SystemExit(f"{folder}/headline.csv: expected one headline metric, found {sorted(metrics)}")
    return metrics.pop()


def paired_rows(folder: Path, pairs: list[tuple[str, str]], metric: str | None = None) -> list[dict]:
    """For each (a, b): a minus b in points of ``metric`` (default: the table's headline) over their common seeds."""
    metric = metric or headline_metric(folder)
    rows_of = entries(json.loads((folder / "preset.json").read_text()))
    per_seed = {label: v for label, v in headline_by_seed(rows_of, run_data.summaries(folder), metric).items() if v}
    missing = sorted({label for pair in pairs for label in pair} - set(per_seed))
    if missing:
        raise SystemExit(f"{folder}: no runs labelled {', '.join(missing)}; the table's run labels are "
                         f"{', '.join(sorted(per_seed))}")
    return [{"a": a, "b": b, "metric": metric, **stats.paired_difference(per_seed[a], per_seed[b])} for a, b in pairs]


def render_paired(rows: list[dict]) -> str:
    lines = [f"Metric `{rows[0]['metric']}`; paired over the seeds both rows have, mean and 95% t-interval in "
             "points; tie where it covers 0.", "", "| difference | seeds | a minus b |", "|---|---|---|"]
    lines += [f"| {r['a']} minus {r['b']} | {r['n']} | {stats.difference_cell(r)} |" for r in rows]
    return "\n".join(lines)


def parse_pair(text: str) -> tuple[str, str]:
    a, sep, b = text.partition(":")
    if not sep or not a or not b:
        raise SystemExit(f"pair {text!r}: write it as A:B (two run labels of the table)")
    return a, b


# ------------------------------------------------------------------------------------------------------ rounds
def rounds_to_marks(folder: Path, marks: list[float], column: str = "acc_weighted") -> dict[str, dict]:
    """{label: {"seeds": [...], mark: [first round reaching it, or None, one per seed]}}, labels in the table's
    order (its preset.json's methods), seeds ascending."""
    preset = folder / "preset.json"
    order = json.loads(preset.read_text())["compare"].get("methods", []) if preset.exists() else []
    rank = {label: i for i, label in enumerate(order)}
    out: dict[str, dict] = {}
    for run in sorted(run_data.load(folder), key=lambda r: (rank.get(r["label"], len(rank)), r["label"], r["seed"])):
        rows = run_data.evaluated_rows(run)
        entry = out.setdefault(run["label"], {"seeds": []})
        entry["seeds"].append(run["seed"])
        for mark in marks:
            entry.setdefault(mark, []).append(rounds_to_target(rows, column, mark))
    return out


def render_rounds(found: dict[str, dict], marks: list[float], column: str) -> str:
    """One markdown row per label: the rounds of each seed at each mark ("-" where a seed never reached it)."""
    head = "| method | seeds | " + " | ".join(f"rounds to {100 * m:g}%" for m in marks)
    lines = [f"Column `{column}`; the first evaluated round at or above each mark, seed by seed in the order of the "
             "seeds column; - = not reached.", "", head + " |", "|---|---|" + "---|" * len(marks)]
    for label, entry in found.items():
        seeds = " / ".join(map(str, entry["seeds"]))
        per_mark = [" / ".join("-" if r is None else str(r) for r in entry[m]) for m in marks]
        lines.append(f"| {label} | {seeds} | " + " | ".join(per_mark) + " |")
    return "\n".join(lines)


def parse_marks(text: str) -> list[float]:
    """Comma-separated percentages as accuracies in (0, 1]."""
    try:
        marks = [float(m) / 100 for m in text.split(",")]
    except ValueError:
        raise SystemExit(f"--marks: comma-separated percentages, got {text!r}") from None
    if not all(0 < m <= 1 for m in marks):
        raise SystemExit(f"--marks: each mark is a percentage in (0, 100], got {text!r}")
    return marks


# ------------------------------------------------------------------------------------------------------- moved
def table_at(folder: Path, commit: str, root: Path = ROOT) -> list[dict]:
    """The rows of ``folder/table.csv`` as committed at ``commit`` in the repository at ``root``, parsed as
    ``read_table_csv`` parses the current one."""
    rel = folder.resolve().relative_to(root.resolve()).as_posix()
    text = subprocess.run(["git", "show", f"{commit}:{rel}/table.csv"], cwd=root, check=True,
                          capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "table.csv").write_text(text)
        return read_table_csv(Path(tmp) / "table.csv")


def _ranks(rows: dict[str, dict], key: str) -> dict[str, int]:
    """Competition ranks: 1 + the number of rows strictly above (equal accuracies share a rank)."""
    scores = {m: r[key] for m, r in rows.items() if not math.isnan(r.get(key, math.nan))}
    return {m: 1 + sum(other > s for other in scores.values()) for m, s in scores.items()}


def moved_rows(folder: Path, commit: str, root: Path = ROOT) -> tuple[str, list[dict]]:
    """The headline metric and, per method (the table's order, then rows that are gone), before / after / rank."""
    preset = json.loads((folder / "preset.json").read_text())
    after = {r["method"]: r for r in read_table_csv(folder / "table.csv")}
    before = {r["method"]: r for r in table_at(folder, commit, root)}
    key = headline_key(preset, list(after.values()))
    tuned = preset.get("tuned-config", {})
    rank_before, rank_after = _ranks(before, key), _ranks(after, key)
    out = []
    for method in list(after) + [m for m in before if m not in after]:
        b, a = before.get(method, {}).get(key), after.get(method, {}).get(key)
        out.append({"method": method, "before": b, "after": a,
                    "change": None if b is None or a is None else a - b,
                    "rank_before": rank_before.get(method), "rank_after": rank_after.get(method),
                    "settings": tuned.get(method, {})})
    return key, out


def render_moved(folder: Path, commit: str) -> str:
    key, rows = moved_rows(folder, commit)
    lines = [f"Headline ({key}), in %: the table at `{commit}` and now (`python -m runner.table "
             f"{folder.resolve().relative_to(ROOT).as_posix()} moved --since {commit}`).", "",
             "| row | before | after | change (points) | rank before → after | tuned setting now |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        cell = lambda v: "-" if v is None else f"{100 * v:.2f}"  # noqa: E731
        change = "-" if r["change"] is None else f"{100 * r['change']:+.2f}"
        ranks = f"{r['rank_before'] or '-'} → {r['rank_after'] or '-'}"
        setting = ", ".join(f"{k} = {v}" for k, v in r["settings"].items()) or "-"
        lines.append(f"| {r['method']} | {cell(r['before'])} | {cell(r['after'])} | {change} | {ranks} | {setting} |")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a docs/results table folder made by runner.compare")
    queries = parser.add_subparsers(dest="query", required=True)
    paired = queries.add_parser("paired", help="a minus b seed by seed, mean and 95%% t-interval")
    paired.add_argument("pairs", nargs="+", help="A:B, the row labels to subtract (A minus B)")
    paired.add_argument("--metric", choices=sorted(HEADLINE_TO_KEY), help="instead of the table's headline metric")
    rounds = queries.add_parser("rounds", help="the rounds each seed took to reach accuracy marks")
    rounds.add_argument("--marks", default="80,85,90", help="comma-separated accuracies in percent")
    rounds.add_argument("--column", default="acc_weighted", help="the rounds.csv accuracy column to read")
    moved = queries.add_parser("moved", help="each row's headline now against the table committed at a commit")
    moved.add_argument("--since", required=True, help="the commit whose table.csv is the 'before'")
    args = parser.parse_args(argv)
    needs = {"paired": [run_data.FILE, "preset.json"], "rounds": [run_data.FILE], "moved": ["table.csv", "preset.json"]}
    for name in needs[args.query]:
        if not (args.folder / name).exists():
            raise SystemExit(f"{args.folder}: no {name} (a table made by runner.compare has one)")
    if args.query == "paired":
        print(render_paired(paired_rows(args.folder, [parse_pair(p) for p in args.pairs], args.metric)))
    elif args.query == "rounds":
        marks = parse_marks(args.marks)
        print(render_rounds(rounds_to_marks(args.folder, marks, args.column), marks, args.column))
    else:
        sys.stdout.write(render_moved(args.folder, args.since))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
