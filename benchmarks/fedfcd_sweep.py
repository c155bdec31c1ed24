"""FedFCD's lambda and learning rate chosen on the clients' validation splits (issue #29), never on test.

    python -m benchmarks.fedfcd_sweep conf/fedfcd-mnist5k-sweep.toml [--reuse] [--table-only]

The preset is a ``runner.compare`` preset with a ``[sweep]`` table of two lists, ``lambda = [...]`` (the
alignment weight, ``fedfcd.lambda``) and ``lr = [...]`` (the common learning rate, which FedFCD's two client stages
use); every pair becomes a variant of fedfcd and runs through ``runner.compare.run_all`` (its ``table.md``
lands in the preset's output folder as usual). ``sweep.md`` beside it ranks the pairs by their best validation
accuracy (weighted, mean over seeds) and names the chosen one; the test accuracy at the best-validation round is
shown for information and chooses nothing.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np

from benchmarks.sweep_report import mean_std, preamble, summaries
from runner.compare import load_preset, run_all
from runner.provenance import command_line

ROOT = Path(__file__).resolve().parent.parent


def label(lam: float, lr: float) -> str:
    return f"fedfcd-lam{lam:g}-lr{lr:g}"


def grid(preset: dict) -> list[tuple[float, float]]:
    sweep = preset.get("sweep", {})
    if not sweep.get("lambda") or not sweep.get("lr"):
        raise SystemExit("[sweep] needs non-empty lists 'lambda' and 'lr'")
    return [(float(lam), float(lr)) for lam, lr in itertools.product(sweep["lambda"], sweep["lr"])]


def expand(preset: dict) -> dict:
    """The preset with one fedfcd variant per (lambda, lr) added after any listed methods."""
    variants, methods = dict(preset.get("variants", {})), list(preset["compare"]["methods"])
    for lam, lr in grid(preset):
        variants[label(lam, lr)] = {"method": "fedfcd", "fedfcd.lambda": lam, "lr": lr}
        methods.append(label(lam, lr))
    return {**preset, "variants": variants, "compare": {**preset["compare"], "methods": methods}}


def sweep_table(preset: dict, out: Path, command: str) -> str:
    seeds = preset["compare"].get("seeds", [0])
    rows = []
    for lam, lr in grid(preset):
        runs = summaries(out, label(lam, lr), seeds)
        val = [s["best_val_acc"] for s in runs if s.get("best_val_acc") is not None]
        rows.append({"lambda": lam, "lr": lr, "runs": len(runs), "val": float(np.mean(val)) if val else -1.0,
                     "val_text": mean_std(val), "rounds": [s.get("best_val_round") for s in runs],
                     "test": mean_std([s.get("test_acc_at_best_val") for s in runs])})
    rows.sort(key=lambda r: -r["val"])
    best = rows[0]
    lines = preamble(preset, command, f"lambda = {best['lambda']:g}, lr = {best['lr']:g}") + [
        "| lambda | lr | best val acc (weighted) | best-val round(s) | test acc at best-val round (weighted) | runs |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['lambda']:g} | {r['lr']:g} | {r['val_text']} | {r['rounds']} | {r['test']} | {r['runs']} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", type=Path)
    parser.add_argument("--reuse", action="store_true", help="keep finished runs whose config matches")
    parser.add_argument("--table-only", action="store_true", help="run nothing; table the finished runs")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write the docs/ tables from uncommitted code (to try things: they say so in bold)")
    args = parser.parse_args(argv)
    command = command_line("benchmarks.fedfcd_sweep", argv)
    preset = {**expand(load_preset(args.preset)), "made": {"command": command}}  # run_all adds commit(s)
    out = run_all(preset, ROOT, reuse=args.reuse, table_only=args.table_only, allow_dirty=args.allow_dirty)
    (out / "sweep.md").write_text(sweep_table(preset, out, command))
    print((out / "sweep.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
