"""README's summary table, built from the comparison tables in docs/results (``make readme`` runs it first).

For each table whose preset has a paper method's own row, one line: the paper method against the best baseline of
the same table, in one metric, and the paper's claimed gain where the preset records the paper's numbers
(``[paper]`` in its preset). The metric is the test accuracy at the round best on validation where the runs have a
validation split (in the paper's metric where the preset names it, else weighted), else the final round's weighted
accuracy (never a best-of-test number).

    python -m benchmarks.summary [--out docs/results/summary]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from server_app.compare import PAPER_METRICS, read_table_csv

ROOT = Path(__file__).resolve().parents[1]
PAPER_METHODS = ("pfedpm", "fedmcsa", "fedfcd", "mupfl", "fedsac")
# tables that are not accuracy comparisons of a paper's setting
LEFT_OUT = {"fedfcd-mnist5k-bytes": "a bytes count over a few rounds",
            "fedmcsa-synthetic-n20-t400": "a diagnostic: the acceptance check run 8 times longer",
            "fedmcsa-synthetic-dnn-options": "FedMCSA's options one at a time, no baselines",
            "fedsac-digits-quick": "a few-minute check of the comparison figures on digits, not the paper's setting"}


def _baselines() -> set[str]:
    from fedcore.registry import REGISTRY

    return set(REGISTRY) - set(PAPER_METHODS) - {"majority"}


def summary_rows(results: Path = ROOT / "docs" / "results") -> list[dict]:
    rows, baselines = [], _baselines()
    for folder in sorted(p.parent for p in results.glob("*/table.csv") if (p.parent / "preset.json").exists()):
        if folder.name in LEFT_OUT:
            continue
        preset = json.loads((folder / "preset.json").read_text())
        table = {r["method"]: r for r in read_table_csv(folder / "table.csv")}
        validated = all(not math.isnan(r.get("test_acc_at_best_val", math.nan)) for r in table.values())
        key = "test_acc_at_best_val" if validated else "final_acc"
        if validated and preset.get("paper"):  # ours in the paper's metric, beside the paper's claimed gain
            key = PAPER_METRICS[preset["paper"]["metric"]]
        for method in (m for m in PAPER_METHODS if m in table):
            rivals = [r for label, r in table.items() if label in baselines and not math.isnan(r[key])]
            if not rivals:
                continue
            best = max(rivals, key=lambda r: r[key])
            paper = preset.get("paper", {}).get("values", {})
            paper_rivals = [v for label, v in paper.items() if label in baselines]
            claimed = (paper[method] - max(paper_rivals)) if method in paper and paper_rivals else None
            rows.append({"method": method, "table": folder.name, "metric": key, "seeds": int(table[method]["seeds"]),
                         "ours": table[method][key], "ours_std": table[method][f"{key}_std"],
                         "baseline": best["method"], "base": best[key], "base_std": best[f"{key}_std"],
                         "claimed": claimed, "paper_metric": preset.get("paper", {}).get("metric")})
    return rows


def _pct(mean: float, std: float, seeds: int) -> str:
    return f"{100 * mean:.2f}" if seeds == 1 else f"{100 * mean:.2f} ± {100 * std:.2f}"


def render(rows: list[dict]) -> str:
    metric_names = {"test_acc_at_best_val": "test acc at best-val round (weighted)", "final_acc": "final acc (weighted)",
                    "test_client_acc_mean_at_best_val": "test acc at best-val round (client mean)"}
    lines = [
        "Made by `python -m benchmarks.summary` (run by `make readme`) from the docs/results tables named below, "
        "each of which says the command and commit that made it. "
        "Metric per row: test acc at best-val round where the table's runs have a validation split (in the paper's "
        "metric where the table has the paper's numbers, else weighted), else final acc (weighted, last round); never "
        "best-of-test. ± over seeds (none for 1 seed). Difference: ours minus "
        "the best baseline of the same table (a method's own variants and ablations are not baselines). Paper's gain: "
        "the paper's number for the method minus its best baseline in the same paper table, in the paper's metric.",
        "",
        "| method | table (`docs/results/<name>`) | metric | seeds | method | best baseline | difference (points) "
        "| paper's gain (points, paper's metric) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        diff = 100 * (r["ours"] - r["base"])
        claimed = "-" if r["claimed"] is None else f"{r['claimed']:+.2f} ({r['paper_metric']})"
        lines.append(f"| {r['method']} | `{r['table']}` | {metric_names[r['metric']]} | {r['seeds']} "
                     f"| {_pct(r['ours'], r['ours_std'], r['seeds'])} "
                     f"| {r['baseline']} {_pct(r['base'], r['base_std'], r['seeds'])} | {diff:+.2f} | {claimed} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "summary")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(render(summary_rows()))
    print((args.out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
