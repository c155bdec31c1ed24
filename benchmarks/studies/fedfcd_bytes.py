"""FedFCD's traffic per round against FedAvg's on the same model, with and without the evaluation messages.

    python -m benchmarks.studies.fedfcd_bytes conf/fedfcd-mnist5k-bytes.toml [--reuse]

Runs the preset through ``runner.compare.run_all`` (its ``table.md`` as usual), then reads each run's
``rounds.csv`` and writes ``traffic.md`` beside it: bytes per training round up and down, the evaluation
messages' bytes down per round (each client gets what it needs to evaluate: FedAvg's global model, FedFCD's global
head), the one-off round 0, and each row's share of the FedAvg row on the same model, counting training messages
only and counting evaluation messages too. Evaluation replies carry a few metrics only and are not counted.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from runner.compare import run_all

from runner.compare_presets import entries, load_preset

from runner.compare_table import made_line
from runner.provenance import command_line

ROOT = Path(__file__).resolve().parents[2]


def traffic(rounds_csv: Path) -> dict:
    """Mean bytes per training round (up, down, evaluation down) and round 0's total, from a run's rounds.csv."""
    with open(rounds_csv) as f:
        rows = list(csv.DictReader(f))
    training = [r for r in rows if int(r["round"]) >= 1]
    mean = lambda key: sum(float(r.get(key) or 0) for r in training) / len(training)  # noqa: E731
    prepare = sum(float(r["bytes_up"]) + float(r["bytes_down"]) for r in rows if int(r["round"]) == 0)
    return {"up": mean("bytes_up"), "down": mean("bytes_down"), "eval_down": mean("eval_bytes_down"),
            "prepare": prepare}


def table(preset: dict, out: Path, command: str) -> str:
    seed = preset["compare"].get("seeds", [0])[0]
    model_of = {e.label: e.config.get("model", preset["run-config"].get("model")) for e in entries(preset)}
    method_of = {e.label: e.method for e in entries(preset)}
    data = {label: traffic(out / "runs" / f"{label}-s{seed}" / "rounds.csv") for label in model_of}
    reference = {model_of[label]: data[label] for label in data if method_of[label] == "fedavg"}
    lines = [
        f"{made_line(preset)} Seed {seed}, {preset['compare'].get('supernodes')} clients, "
        f"{preset['run-config'].get('num-server-rounds')} rounds, evaluation every round.",
        "Bytes per training round, summed over clients; % of FedAvg: (up + down) over FedAvg's on the same model; "
        "with evaluation: (up + down + evaluation down) over FedAvg's same sum. Round 0 (FedFCD's one-off LFR "
        "collection) is counted apart.",
        "",
        "| run | model | up / round | down / round | evaluation down / round | round 0 | % of FedAvg (training) "
        "| % of FedAvg (training + evaluation) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, t in data.items():
        ref = reference.get(model_of[label])
        share = share_eval = "-"
        if ref is not None:
            share = f"{100 * (t['up'] + t['down']) / (ref['up'] + ref['down']):.2f}%"
            with_eval = (t["up"] + t["down"] + t["eval_down"]) / (ref["up"] + ref["down"] + ref["eval_down"])
            share_eval = f"{100 * with_eval:.2f}%"
        lines.append(f"| {label} | {model_of[label]} | {t['up']:,.0f} | {t['down']:,.0f} | {t['eval_down']:,.0f} | "
                     f"{t['prepare']:,.0f} | {share} | {share_eval} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", type=Path)
    parser.add_argument("--reuse", action="store_true", help="keep finished runs whose config matches")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write the docs/ tables from uncommitted code (to try things: they say so in bold)")
    args = parser.parse_args(argv)
    command = command_line("benchmarks.studies.fedfcd_bytes", argv)
    preset = {**load_preset(args.preset), "made": {"command": command}}  # run_all adds commit(s)
    out = run_all(preset, ROOT, reuse=args.reuse, allow_dirty=args.allow_dirty)
    text = table(preset, out, command)
    (out / "traffic.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
