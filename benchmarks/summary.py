"""README's summary table, built from the comparison tables in docs/results (``make readme`` runs it first).

For each table whose preset has a paper method's own row, one line: the paper method against the best baseline of
the same table, in the table's headline metric (``compare_rows.headline_key``: the test accuracy at the round best on
validation, in the paper's metric where the preset has the paper's numbers, else weighted; else the final round's
weighted accuracy, never a best-of-test number). A table still being filled over several sittings (its table.md
says "Not run (...)" for a paper method or a baseline) is left out: a best baseline among the rows run so far is no
comparison; not-run ablation rows (a method's own variants) do not count. The difference carries the table's paired 95% t-interval over
seeds and reads "tie" where it covers 0 (``runner.stats``). The paper's gain comes from the paper's own table
(docs/papers/numbers, ``benchmarks.paper_numbers``): its method minus the best baseline of that table column, on
the paper's dataset, which the cell names.

Two files: ``table.md``, the rows on the papers' own data (Fashion-MNIST, which every paper but FedSaC and pFedPM
reports, and the nearest public data to theirs), which README.md leads with; ``embedded-data.md``, the rows on the
data shipped inside the package (``mnist5k``, ``synthetic``: cut-down stand-ins for the papers' data), which
docs/papers/embedded-data.md shows.

    python -m benchmarks.summary [--out docs/results/summary]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from benchmarks import paper_numbers
from runner import stats
from runner.compare_rows import PAPER_METHODS, headline_key
from runner.compare_table import footer_failures, read_table_csv

ROOT = Path(__file__).resolve().parents[1]
# tables that are not accuracy comparisons of a paper's setting
LEFT_OUT = {"fedfcd-mnist5k-bytes": "a bytes count over a few rounds",
            "fedmcsa-synthetic-n20-t400": "a diagnostic: the acceptance check run 8 times longer",
            "fedmcsa-synthetic-dnn-options": "FedMCSA's options one at a time, no baselines",
            "fedsac-digits-quick": "a few-minute check of the comparison figures on digits, not the paper's setting"}
# the datasets shipped inside the package: their rows go to embedded-data.md, not README's table
EMBEDDED_DATA = ("mnist5k", "synthetic")


def _baselines() -> set[str]:
    from fedcore.registry import REGISTRY

    return set(REGISTRY) - set(PAPER_METHODS) - {"majority"}


def incomplete(folder: Path, compared: set[str]) -> bool:
    """Whether runs of a ``compared`` row (paper method or baseline) of the table in ``folder`` are not all made."""
    not_run = [f.removesuffix(": not run") for f in footer_failures(folder / "table.md") if f.endswith(": not run")]
    return any(run.rsplit(" seed ", 1)[0] in compared for run in not_run)


def summary_rows(results: Path = ROOT / "docs" / "results") -> list[dict]:
    rows, baselines = [], _baselines()
    compared = set(PAPER_METHODS) | baselines
    for folder in sorted(p.parent for p in results.glob("*/table.csv") if (p.parent / "preset.json").exists()):
        if folder.name in LEFT_OUT or incomplete(folder, compared):
            continue
        preset = json.loads((folder / "preset.json").read_text())
        table = {r["method"]: r for r in read_table_csv(folder / "table.csv")}
        key = headline_key(preset, list(table.values()))
        sources = preset.get("paper", {}).get("source", [])
        for method in (m for m in PAPER_METHODS if m in table):
            rivals = [r for label, r in table.items() if label in baselines and not math.isnan(r[key])]
            if not rivals:
                continue
            best = max(rivals, key=lambda r: r[key])
            paired = None  # the table's paired difference, where it was made in this metric against this method
            if best.get("paired_vs") == method and best.get("paired_metric") == key:
                paired = {k: best.get(f"diff_{k}") for k in ("mean", "lo", "hi", "n")}
                paired["tie"] = bool(paired["lo"] <= 0 <= paired["hi"])
            rows.append({"method": method, "table": folder.name, "dataset": preset.get("run-config", {}).get("dataset"),
                         "metric": key, "seeds": int(table[method]["seeds"]),
                         "ours": table[method][key], "ours_std": table[method][f"{key}_std"],
                         "baseline": best["method"], "base": best[key], "base_std": best[f"{key}_std"],
                         "paired": paired, "claimed": paper_numbers.gain(sources[0]) if sources else None})
    return rows


def _pct(mean: float, std: float, seeds: int) -> str:
    return f"{100 * mean:.2f}" if seeds == 1 or math.isnan(std) else f"{100 * mean:.2f} ± {100 * std:.2f}"


def _difference(r: dict) -> str:
    if r["paired"] is None:
        return f"{100 * (r['ours'] - r['base']):+.2f} (paired interval {stats.NOT_AVAILABLE})"
    return stats.difference_cell(r["paired"])


def _claimed(c: dict | None) -> str:
    if c is None:
        return "-"
    return f"{c['gain']:+.2f} vs {c['baseline']} ({c['dataset']}; {c['table']}, {c['column']}; {c['metric']})"


def render(rows: list[dict]) -> str:
    metric_names = {"test_acc_at_best_val": "test acc at best-val round (weighted)", "final_acc": "final acc (weighted)",
                    "test_client_acc_mean_at_best_val": "test acc at best-val round (client mean)"}
    lines = [
        "Made by `python -m benchmarks.summary` (run by `make readme`) from the docs/results tables named below, "
        "each of which says the command and commits that made it. "
        "Metric per row: the table's headline, test acc at best-val round where the table's runs have a validation "
        "split (in the paper's metric where the table has the paper's numbers, else weighted), else final acc "
        "(weighted, last round); never best-of-test. ± is the sample std over seeds. Difference: ours minus the best "
        "baseline of the same table (a method's own variants and ablations are not baselines), with its paired 95% "
        "t-interval over seeds (same seed = same split; Student's t, scipy.stats.t) and \"tie\" where the interval "
        "covers 0. Paper's gain: the paper's number for the method minus the best baseline of the same table column "
        "in the paper (docs/papers/numbers), on the paper's dataset, in the paper's metric.",
        "",
        "| method | table (`docs/results/<name>`) | metric | seeds | method | best baseline | difference (points, paired "
        "95% t-interval) | paper's gain (points: vs the paper's best baseline, on the paper's dataset) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['method']} | `{r['table']}` | {metric_names[r['metric']]} | {r['seeds']} "
                     f"| {_pct(r['ours'], r['ours_std'], r['seeds'])} "
                     f"| {r['baseline']} {_pct(r['base'], r['base_std'], r['seeds'])} | {_difference(r)} "
                     f"| {_claimed(r['claimed'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "summary")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in split_by_data(summary_rows()).items():
        (args.out / name).write_text(render(rows))
        print((args.out / name).read_text())
    return 0


def split_by_data(rows: list[dict]) -> dict[str, list[dict]]:
    """File name -> its rows: the papers' own data in ``table.md``, the embedded data in ``embedded-data.md``."""
    return {"table.md": [r for r in rows if r["dataset"] not in EMBEDDED_DATA],
            "embedded-data.md": [r for r in rows if r["dataset"] in EMBEDDED_DATA]}


if __name__ == "__main__":
    raise SystemExit(main())
