"""pFedPM's hyperparameters chosen on the clients' validation splits: a grid over ``reg``, ``lambda`` and ``a``.

    python -m benchmarks.pfedpm_sweep conf/pfedpm-digits-sweep.toml [--reuse]

The preset is a ``runner.compare`` preset (same run config, engine and seeds) with a ``[sweep]`` table of
lists, ``reg = [...]``, ``lambda = [...]``, ``a = [...]``; every combination becomes a variant of pfedpm and runs
through ``runner.compare.run_all`` (its ``table.md`` lands in the preset's output folder as usual). Then
``sweep.md`` beside it ranks the combinations by their best validation accuracy (weighted, mean over seeds) and
names the chosen one; the test accuracy at the best-validation round is shown but never used to choose.
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
KEYS = ("reg", "lambda", "a")


def label(reg: str, lam: float, a: float) -> str:
    return f"pfedpm-{reg}-lam{lam:g}-a{a:g}"


def expand(preset: dict) -> dict:
    """The preset with one pfedpm variant per grid point added to its methods (after any listed ones)."""
    grid = preset.get("sweep", {})
    missing = [k for k in KEYS if not grid.get(k)]
    if missing:
        raise SystemExit(f"[sweep] needs non-empty lists for {', '.join(missing)}")
    variants = dict(preset.get("variants", {}))
    methods = list(preset["compare"]["methods"])
    for reg, lam, a in itertools.product(grid["reg"], grid["lambda"], grid["a"]):
        name = label(reg, lam, a)
        variants[name] = {"method": "pfedpm", "pfedpm.reg": reg, "pfedpm.lambda": float(lam), "pfedpm.a": float(a)}
        methods.append(name)
    return {**preset, "variants": variants, "compare": {**preset["compare"], "methods": methods}}


def sweep_table(preset: dict, out: Path, command: str) -> str:
    grid, seeds = preset["sweep"], preset["compare"].get("seeds", [0])
    rows = []
    for reg, lam, a in itertools.product(grid["reg"], grid["lambda"], grid["a"]):
        runs = summaries(out, label(reg, lam, a), seeds)
        val = [s.get("best_val_acc") for s in runs if s.get("best_val_acc") is not None]
        rows.append({"reg": reg, "lambda": lam, "a": a, "runs": len(runs), "val": float(np.mean(val)) if val else -1,
                     "val_text": mean_std(val), "rounds": [s.get("best_val_round") for s in runs],
                     "test": mean_std([s.get("test_acc_at_best_val") for s in runs]),
                     "relation": mean_std([s.get("eval_relation_acc_at_best_val") for s in runs])})
    rows.sort(key=lambda r: -r["val"])
    best = rows[0]
    lines = preamble(preset, command, f"reg = {best['reg']}, lambda = {best['lambda']:g}, a = {best['a']:g}") + [
        "| reg | lambda | a | best val acc (weighted) | best-val round(s) | test acc at best-val round (weighted) "
        "| relation-module test acc at best-val round | runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['reg']} | {r['lambda']:g} | {r['a']:g} | {r['val_text']} | {r['rounds']} | {r['test']} | "
              f"{r['relation']} | {r['runs']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", type=Path)
    parser.add_argument("--reuse", action="store_true", help="keep finished runs whose config matches")
    parser.add_argument("--table-only", action="store_true", help="run nothing; table the finished runs")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write the docs/ tables from uncommitted code (to try things: they say so in bold)")
    args = parser.parse_args(argv)
    command = command_line("benchmarks.pfedpm_sweep", argv)
    preset = {**expand(load_preset(args.preset)), "made": {"command": command}}  # run_all adds commit(s)
    out = run_all(preset, ROOT, reuse=args.reuse, table_only=args.table_only, allow_dirty=args.allow_dirty)
    (out / "sweep.md").write_text(sweep_table(preset, out, command))
    print((out / "sweep.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
