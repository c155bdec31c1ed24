"""Rounds each run of a docs/results table took to reach accuracy marks, seed by seed, from its per-run data.

    python -m benchmarks.rounds_to docs/results/<table> --marks 80,85,90 [--column acc_weighted]

A table's "rounds to X%" column has one mark, the paper's (MuPFL's RoA@90, say). Where the runs do not reach it
(fewer local epochs than the paper's), a page's training-speed verdict reads the same runs at lower marks; this
prints them from the table's committed ``runs.json.gz`` with the table's own rule (``runner.compare.
rounds_to_target``: the first evaluated round at or above the mark), so the page cites a command.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runner import run_data
from runner.compare import rounds_to_target


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


def render(found: dict[str, dict], marks: list[float], column: str) -> str:
    """One markdown row per label: the rounds of each seed at each mark ("-" where a seed never reached it)."""
    head = "| method | seeds | " + " | ".join(f"rounds to {100 * m:g}%" for m in marks)
    lines = [f"Column `{column}`; the first evaluated round at or above each mark, seed by seed in the order of the "
             "seeds column; - = not reached.", "", head + " |", "|---|---|" + "---|" * len(marks)]
    for label, entry in found.items():
        seeds = " / ".join(map(str, entry["seeds"]))
        per_mark = [" / ".join("-" if r is None else str(r) for r in entry[m]) for m in marks]
        lines.append(f"| {label} | {seeds} | " + " | ".join(per_mark) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a docs/results table folder with runs.json.gz")
    parser.add_argument("--marks", default="80,85,90", help="comma-separated accuracies in percent")
    parser.add_argument("--column", default="acc_weighted", help="the rounds.csv accuracy column to read")
    args = parser.parse_args(argv)
    if not (args.folder / run_data.FILE).exists():
        raise SystemExit(f"{args.folder}: no {run_data.FILE} (a table made by runner.compare has one)")
    try:
        marks = [float(m) / 100 for m in args.marks.split(",")]
    except ValueError:
        raise SystemExit(f"--marks: comma-separated percentages, got {args.marks!r}") from None
    if not all(0 < m <= 1 for m in marks):
        raise SystemExit(f"--marks: each mark is a percentage in (0, 100], got {args.marks!r}")
    print(render(rounds_to_marks(args.folder, marks, args.column), marks, args.column))


if __name__ == "__main__":
    main()
