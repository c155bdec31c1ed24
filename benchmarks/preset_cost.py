"""What a comparison preset will cost, measured before it runs: a few rounds of each of its rows, one seed,
in process on one torch thread (what ``runner.compare`` with ``engine = "inprocess"`` runs per job).

Each row's rounds.csv gives the seconds of training (``wall_s - eval_s``) and of evaluation (``eval_s``) per
round; the first round is left out where more than one was run (it pays for the partition cache and warm-up).
On a shared machine the wall clock counts the time other processes held the core: the run's CPU time over its wall
time scales both back to what the row costs on a core of its own (``cpu_share``; one torch thread, so CPU seconds are
the seconds an idle core needs).
A run of the preset then costs ``T * train + ceil(T / eval-every) * eval`` seconds, a table that times the seeds.
``--set`` changes the measuring runs only (e.g. ``local-epochs=1``); ``--scale key=factor`` multiplies the
measured training time back (training time grows with local epochs; name what was cut and by how much).

    python -m benchmarks.preset_cost conf/fedfcd-fmnist-dirichlet.toml --rounds 3 [--only fedavg,fedfcd]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import tempfile
import time
from pathlib import Path


def measure_row(run_config: dict, supernodes: int, rounds: int) -> dict:
    """Run ``rounds`` rounds of one row; its mean training and evaluation seconds per round."""
    import torch

    from runner.inprocess import run_inprocess

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="preset-cost-") as tmp:
        config = {**run_config, "num-server-rounds": rounds, "eval-every": 1, "results-dir": tmp,
                  "run-name": "cost", "plots": False, "overwrite": True}
        t0, c0 = time.perf_counter(), time.process_time()
        run_inprocess(config, supernodes)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        with open(Path(tmp) / "cost" / "rounds.csv") as f:
            rows = [r for r in csv.DictReader(f) if int(r["round"]) >= 1]
    kept = rows[1:] if len(rows) > 1 else rows
    share = min(1.0, cpu / total)  # the part of the wall time this process had a core
    train = [float(r["wall_s"]) - float(r["eval_s"] or 0) for r in kept]
    evals = [float(r["eval_s"]) for r in kept if r["eval_s"]]
    return {"train_s": share * sum(train) / len(train), "eval_s": share * sum(evals) / max(len(evals), 1),
            "wall_train_s": sum(train) / len(train), "measured_s": total, "cpu_share": share}


def main(argv: list[str] | None = None) -> int:
    from runner.compare_presets import entries, load_preset, run_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated row labels (default: every row that runs)")
    parser.add_argument("--set", default="", help="run-config overrides for the measuring runs, k=v,k=v (TOML values)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply the measured training seconds by this (what --set cut, e.g. 10 epochs / 1)")
    parser.add_argument("--json", type=Path, help="append the rows as JSON lines here")
    args = parser.parse_args(argv)
    import tomllib

    preset = load_preset(args.preset)
    overrides = {k: tomllib.loads(f"v = {v}")["v"] for k, v in (i.split("=", 1) for i in args.set.split(",") if i)}
    only = [x for x in args.only.split(",") if x]
    rows = [e for e in entries(preset) if e.runs_of is None and (not only or e.label in only)]
    base = preset.get("run-config", {})
    rounds_t = int(base.get("num-server-rounds", 20))
    every = int(base.get("eval-every", 1))
    seeds = len(preset["compare"].get("seeds", [0]))
    supernodes = int(preset["compare"].get("supernodes", 10))
    print(f"{args.preset}: T = {rounds_t}, eval every {every}, {seeds} seeds, {supernodes} clients"
          + (f"; measured with {args.set} (training x {args.scale:g})" if args.set else ""), flush=True)
    print("| row | train CPU-s/round | eval CPU-s/round | CPU-s/round (T-averaged) | one run h | all seeds h | "
          "CPU share while measured |")
    print("|---|---|---|---|---|---|---|")
    total = 0.0
    for entry in rows:
        config = {**run_config(preset, entry, 0, Path(".")), **overrides}
        m = measure_row(config, supernodes, args.rounds)
        train = m["train_s"] * args.scale
        run_s = rounds_t * train + math.ceil(rounds_t / every) * m["eval_s"]
        total += run_s * seeds
        print(f"| {entry.label} | {train:.2f} | {m['eval_s']:.2f} | {run_s / rounds_t:.2f} | {run_s / 3600:.2f} | "
              f"{run_s * seeds / 3600:.2f} | {m['cpu_share']:.2f} |", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"preset": str(args.preset), "row": entry.label, "set": args.set,
                                    "scale": args.scale, "train_s": train, "eval_s": m["eval_s"], "cpu_share": m["cpu_share"],
                                    "run_h": run_s / 3600, "seeds": seeds}) + "\n")
    print(f"table: {total / 3600:.1f} CPU-hours ({total / 3600 / 2:.1f} h wall on 2 cores with jobs = 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
