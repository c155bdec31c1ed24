"""Paired differences between any two rows of a docs/results table, seed by seed, from its per-run data.

    python -m benchmarks.paired docs/results/<table> A:B [C:D ...]

A table compares its paper method with every row. An ablation's verdicts need other pairs too (what a module
adds is the row with it minus the row without it); this prints them from the table's committed ``runs.json.gz``
with the table's own headline metric (its ``headline.csv``), each row's values as the table reads them
(``runner.compare.headline_by_seed``: a row's own accuracy column, a ``runs-of`` row's source runs; rows from its
``preset.json``) and rule (``runner.stats.paired_difference``: mean and 95% t-interval over the seeds both rows
have; a tie where the interval covers 0), so the page cites a command.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from runner import run_data, stats
from runner.compare import HEADLINE_TO_KEY, entries, headline_by_seed


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
    out = []
    for a, b in pairs:
        diff = stats.paired_difference(per_seed[a], per_seed[b])
        out.append({"a": a, "b": b, "metric": metric, **diff})
    return out


def render(rows: list[dict]) -> str:
    lines = [f"Metric `{rows[0]['metric']}`; paired over the seeds both rows have, mean and 95% t-interval in "
             "points; tie where it covers 0.", "", "| difference | seeds | a minus b |", "|---|---|---|"]
    lines += [f"| {r['a']} minus {r['b']} | {r['n']} | {stats.difference_cell(r)} |" for r in rows]
    return "\n".join(lines)


def parse_pair(text: str) -> tuple[str, str]:
    a, sep, b = text.partition(":")
    if not sep or not a or not b:
        raise SystemExit(f"pair {text!r}: write it as A:B (two run labels of the table)")
    return a, b


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path,
                        help="a docs/results table folder with runs.json.gz, preset.json and headline.csv")
    parser.add_argument("pairs", nargs="+", help="A:B, the row labels to subtract (A minus B)")
    parser.add_argument("--metric", choices=sorted(HEADLINE_TO_KEY), help="instead of the table's headline metric")
    args = parser.parse_args(argv)
    if not (args.folder / run_data.FILE).exists():
        raise SystemExit(f"{args.folder}: no {run_data.FILE} (a table made by runner.compare has one)")
    if not (args.folder / "preset.json").exists():
        raise SystemExit(f"{args.folder}: no preset.json (a table made by runner.compare has one)")
    print(render(paired_rows(args.folder, [parse_pair(p) for p in args.pairs], args.metric)))


if __name__ == "__main__":
    main()
