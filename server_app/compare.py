"""Compare methods side by side on one setting, through the real ``flwr run`` simulation.

A preset (TOML, in conf/) fixes the setting; every method runs on the same partition, model and
budget, for each seed. Output in the preset's ``output`` folder:

- ``table.md`` / ``table.csv``: one row per method, mean ± std over seeds,
- ``curves.png``: every method's accuracy curve (mean over seeds),
- ``runs/<method>-s<seed>/``: each run's own results.

    python -m server_app.compare conf/mnist5k-pathological.toml [--methods local,fedavg] [--seeds 0,1]

Preset format::

    [compare]
    methods = ["local", "fedavg"]
    seeds = [0, 1, 2]
    supernodes = 20
    output = "results/compare/mnist5k-pathological"   # relative to the app directory

    [run-config]            # shared run-config keys
    dataset = "mnist5k"

    [method-config.fedprox] # extra keys for one method
    "fedprox.mu" = 0.01
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

from server_app.launch import simulate

COLUMNS = ["method", "final_acc", "final_acc_std", "client_acc_mean", "client_acc_mean_std", "best_acc",
           "best_acc_std", "mb_up_per_round", "mb_down_per_round", "wall_s_per_round", "seeds"]


def load_preset(path: Path) -> dict:
    preset = tomllib.loads(Path(path).read_text())
    if "compare" not in preset or "methods" not in preset["compare"]:
        raise SystemExit(f"{path}: needs a [compare] table with a 'methods' list")
    return preset


def run_all(preset: dict, app_dir: Path, methods: list[str] | None = None, seeds: list[int] | None = None) -> Path:
    spec = preset["compare"]
    methods = methods or spec["methods"]
    seeds = seeds if seeds is not None else spec.get("seeds", [0])
    out = (app_dir / spec.get("output", "results/compare")).resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    jobs = [(m, s) for m in methods for s in seeds]
    results: dict[str, list[dict]] = {m: [] for m in methods}
    failures = []
    started = time.monotonic()
    for i, (method, seed) in enumerate(jobs, 1):
        config = {**preset.get("run-config", {}), **preset.get("method-config", {}).get(method, {}),
                  "method": method, "seed": seed, "results-dir": str(out / "runs"), "run-name": f"{method}-s{seed}"}
        print(f"[{i}/{len(jobs)}] {method} seed {seed} ...", flush=True)
        t0 = time.monotonic()
        result = simulate(config, supernodes=spec.get("supernodes", 10), app_dir=app_dir,
                          cpus_per_client=spec.get("cpus-per-client", 1),
                          gpus_per_client=spec.get("gpus-per-client", 0.0), stream=spec.get("stream", False))
        summary = result["summary"]
        if result["status"] != "finished:completed" or summary is None:
            failures.append(f"{method} seed {seed}: {result['status']} {result['details']}")
            print(f"    FAILED: {result['status']} {result['details']}", flush=True)
            continue
        results[method].append(summary)
        print(f"    final acc {100 * summary['final_acc']:.2f}%  best {100 * summary['best_acc']:.2f}%  "
              f"{time.monotonic() - t0:.0f} s (total {time.monotonic() - started:.0f} s)", flush=True)
    rows = [aggregate_row(m, results[m]) for m in methods if results[m]]
    write_table(rows, out, preset, failures)
    plot_curves(methods, seeds, out)
    print((out / "table.md").read_text())
    if failures:
        print("failed runs:\n  " + "\n  ".join(failures), file=sys.stderr)
    return out


def aggregate_row(method: str, summaries: list[dict]) -> dict:
    def ms(key):
        v = np.array([s[key] for s in summaries], dtype=float)
        return float(v.mean()), float(v.std())

    row = {"method": method, "seeds": len(summaries)}
    row["final_acc"], row["final_acc_std"] = ms("final_acc")
    row["client_acc_mean"], row["client_acc_mean_std"] = ms("client_acc_mean")
    row["best_acc"], row["best_acc_std"] = ms("best_acc")
    row["mb_up_per_round"] = ms("bytes_up_per_round")[0] / 1e6
    row["mb_down_per_round"] = ms("bytes_down_per_round")[0] / 1e6
    row["wall_s_per_round"] = ms("wall_s_per_round")[0]
    row["client_acc_std_within"] = ms("client_acc_std")[0]
    return row


def write_table(rows: list[dict], out: Path, preset: dict, failures: list[str]) -> None:
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS + ["client_acc_std_within"])
        w.writeheader()
        w.writerows(rows)
    setting = ", ".join(f"{k}={v}" for k, v in preset.get("run-config", {}).items())
    lines = [
        f"Setting: {setting}; {preset['compare'].get('supernodes', 10)} clients.",
        "Accuracy in % (personalised: each client's model on its own test split), mean ± std over seeds.",
        "",
        "| method | final acc (weighted) | final acc (client mean) | best acc (weighted) | MB up / round | MB down / round | s / round |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {100 * r['final_acc']:.2f} ± {100 * r['final_acc_std']:.2f} "
            f"| {100 * r['client_acc_mean']:.2f} ± {100 * r['client_acc_mean_std']:.2f} "
            f"| {100 * r['best_acc']:.2f} ± {100 * r['best_acc_std']:.2f} "
            f"| {r['mb_up_per_round']:.3f} | {r['mb_down_per_round']:.3f} | {r['wall_s_per_round']:.2f} |")
    if failures:
        lines += ["", "Failed runs: " + "; ".join(failures)]
    (out / "table.md").write_text("\n".join(lines) + "\n")


def plot_curves(methods: list[str], seeds: list[int], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in methods:
        curves = []
        for seed in seeds:
            path = out / "runs" / f"{method}-s{seed}" / "rounds.csv"
            if path.exists():
                rows = [r for r in csv.DictReader(open(path)) if r["acc_weighted"]]
                curves.append({int(r["round"]): float(r["acc_weighted"]) for r in rows})
        if not curves:
            continue
        rounds = sorted(set.intersection(*(set(c) for c in curves)))
        mean = np.array([np.mean([c[r] for c in curves]) for r in rounds])
        ax.plot(rounds, 100 * mean, label=method)
    ax.set(xlabel="round", ylabel="personalised test accuracy (%)", title=out.name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", type=Path)
    parser.add_argument("--methods", help="comma-separated subset of the preset's methods")
    parser.add_argument("--seeds", help="comma-separated seeds (default: the preset's)")
    parser.add_argument("--app", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    preset = load_preset(args.preset)
    methods = args.methods.split(",") if args.methods else None
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    out = run_all(preset, args.app.resolve(), methods, seeds)
    (out / "preset.json").write_text(json.dumps(preset, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
