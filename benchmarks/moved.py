"""Which rows of a rebuilt comparison moved, and by how much (issue #45: each paper page says which rival moved
when the tuned presets were rebuilt, and whether the paper method's verdict changed).

    python -m benchmarks.moved docs/results/<table> --since <commit>

Reads the table's ``table.csv`` now and as committed at ``<commit>`` (``git show``), and prints one markdown row
per method: the headline accuracy (the table's own headline metric, ``runner.compare.headline_key``) before and
after, the change, the hyperparameters the row runs with now (its tuned choice) and its rank among the rows before
and after. A row new in the table, or gone from it, says so.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from runner.compare import headline_key, read_table_csv

ROOT = Path(__file__).resolve().parents[1]


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


def render(folder: Path, commit: str) -> str:
    key, rows = moved_rows(folder, commit)
    lines = [f"Headline ({key}), in %: the table at `{commit}` and now (`python -m benchmarks.moved "
             f"{folder.resolve().relative_to(ROOT).as_posix()} --since {commit}`).", "",
             "| row | before | after | change (points) | rank before → after | tuned setting now |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        cell = lambda v: "-" if v is None else f"{100 * v:.2f}"  # noqa: E731
        change = "-" if r["change"] is None else f"{100 * r['change']:+.2f}"
        ranks = f"{r['rank_before'] or '-'} → {r['rank_after'] or '-'}"
        setting = ", ".join(f"{k} = {v}" for k, v in r["settings"].items()) or "-"
        lines.append(f"| {r['method']} | {cell(r['before'])} | {cell(r['after'])} | {change} | {ranks} | {setting} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--since", required=True, help="the commit whose table.csv is the 'before'")
    args = parser.parse_args(argv)
    sys.stdout.write(render(args.folder, args.since))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
