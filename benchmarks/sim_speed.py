"""Simulation throughput: `flwr run` against the same work done sequentially in one process on one
thread (the README's "Simulation speed" table; a benchmark, not a timed test).

    python -m benchmarks.sim_speed --methods fedavg,fedproto,ditto --clients 20 --rounds 50 \
        --out docs/results/sim-speed

For each method the same run config (mnist5k, pathological, FedAvgCNN, batch 10, one local epoch,
evaluation every round, ``client-threads=1``) runs

* ``flwr run``: Flower's Ray simulation engine through ``runner.launch`` (one CPU per client, so
  as many clients train at once as there are cores),
* ``sequential``: the same ServerApp and ClientApp in one process, one client after another, one torch
  thread (``runner.inprocess``), in a fresh interpreter.

Reported per method: the steady-state round (median of rounds 2..R: round 1 carries Ray's and the
clients' start), the whole run from the command to the end (start-up included), their ratios
(target: the flwr round at most 0.5x the sequential one on 2 cores), the evaluation's share of a
flwr round (target at most 15%), the start-up (command to round 1, target under 10 s) and round 1.
With a GPU, a ``flwr run`` row with the GPU shared by the clients is added; without one the table
says so. Writes ``table.md`` and ``results.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runner.launch import auto_gpu_share, simulate

ROOT = Path(__file__).resolve().parents[1]


def training_rounds(results_dir: str) -> list[dict]:
    """The training rounds (1 on) of a finished run's rounds.csv, as its rows."""
    with open(Path(results_dir) / "rounds.csv") as f:
        return [r for r in csv.DictReader(f) if int(r["round"]) >= 1]


def _figures(rows: list[dict], wall_s: float) -> dict:
    steady = [float(r["wall_s"]) for r in rows[1:]] or [float(rows[0]["wall_s"])]
    evals = [float(r["eval_s"]) for r in rows[1:] if r.get("eval_s") not in (None, "")]
    return {"round_s": statistics.median(steady), "first_round_s": float(rows[0]["wall_s"]),
            "eval_share": statistics.median(e / w for e, w in zip(evals, steady)) if evals else None,
            "startup_s": float(rows[0]["startup_s"]) if rows[0].get("startup_s") not in (None, "") else None,
            "run_s": wall_s}


def run_flwr(config: dict, clients: int, workdir: Path, gpus: float = 0.0) -> dict:
    t0 = time.time()
    result = simulate({**config, "results-dir": str(workdir), "run-name": f"flwr-{config['method']}-g{gpus:g}"},
                      supernodes=clients, app_dir=ROOT, stream=False, timeout=7200, gpus_per_client=gpus,
                      flwr_home=workdir / "flwr-home", started=t0)
    if result["status"] != "finished:completed":
        raise RuntimeError(f"flwr run of {config['method']}: {result['status']} {result['details']}")
    return _figures(training_rounds(result["results_dir"]), time.time() - t0)


SEQUENTIAL = """
import json, sys, time
t0 = time.time()
import torch
torch.set_num_threads(1)
from runner.inprocess import run_inprocess
config, clients = json.loads(sys.argv[1]), int(sys.argv[2])
summary, _ = run_inprocess(config, clients)
print(json.dumps({"results_dir": summary["results_dir"], "wall_s": time.time() - t0}))
"""


def run_sequential(config: dict, clients: int, workdir: Path) -> dict:
    """The same run in a fresh interpreter (imports counted), one process, one thread."""
    config = {**config, "results-dir": str(workdir), "run-name": f"seq-{config['method']}"}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", SEQUENTIAL, json.dumps(config), str(clients)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise RuntimeError(f"sequential run of {config['method']} failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    figures = _figures(training_rounds(out["results_dir"]), out["wall_s"])
    figures["startup_s"] = None  # in one process there is no start-up apart from the imports
    return figures


def _against(sequential: dict, engine: str, figures: dict) -> dict:
    """A flwr row with its ratios to the sequential run of the same method."""
    return {"method": sequential["method"], "engine": engine, **figures,
            "round_ratio": figures["round_s"] / sequential["round_s"], "run_ratio": figures["run_s"] / sequential["run_s"]}


def table(rows: list[dict], setting: str, gpu_note: str, made: str = "") -> str:
    def num(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    lines = ([made] if made else []) + [
             f"Setting: {setting}. Round = median of rounds 2..R; run = command to end, start-up included.", "",
             "| method | engine | s / round | round ratio | s / run | run ratio | eval share of round | start-up s | round 1 s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['engine']} | {r['round_s']:.3f} | {num(r.get('round_ratio'))} "
                     f"| {r['run_s']:.1f} | {num(r.get('run_ratio'))} | {num(r['eval_share'], '{:.0%}')} "
                     f"| {num(r['startup_s'], '{:.1f}')} | {r['first_round_s']:.2f} |")
    lines += ["", "Ratios are flwr run / sequential (target: round ratio at most 0.50 on 2 cores).", gpu_note]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="fedavg,fedproto,ditto")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("docs/results/sim-speed"))
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write a docs/ table from uncommitted code (to try things)")
    args = parser.parse_args(argv)
    from runner.provenance import guard, made_by

    guard(args.out, args.allow_dirty)  # a docs/ table is made from committed code only
    made = made_by("benchmarks.sim_speed", argv)
    config = {"dataset": "mnist5k", "partition": "pathological", "model": "fedavgcnn", "batch-size": 10,
              "local-epochs": 1, "num-server-rounds": args.rounds, "eval-every": 1, "client-threads": 1}
    gpus = auto_gpu_share(args.clients, 1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="simspeed-") as tmp:
        for method in args.methods.split(","):
            cfg = {**config, "method": method, "device": "cpu"}
            seq = {"method": method, "engine": "sequential, 1 thread", **run_sequential(cfg, args.clients, Path(tmp))}
            runs = [seq, _against(seq, f"flwr run, {os.cpu_count()} cores", run_flwr(cfg, args.clients, Path(tmp)))]
            if gpus > 0:
                runs.append(_against(seq, f"flwr run, GPU share {gpus:.2f}",
                                     run_flwr({**cfg, "device": "cuda"}, args.clients, Path(tmp), gpus)))
            for r in runs:
                print(f"{method:>9} {r['engine']:>24}: round {r['round_s']:.3f} s, run {r['run_s']:.1f} s, "
                      f"start-up {r['startup_s']}, round 1 {r['first_round_s']:.2f} s", flush=True)
            rows += runs
    import torch

    gpu_note = (f"GPU: {torch.cuda.get_device_name(0)}, each client's share {gpus:.2f}." if gpus > 0
                else "GPU: none on this machine, so there is no GPU row (with CUDA the benchmark adds one).")
    setting = (f"mnist5k, pathological, {args.clients} clients, {args.rounds} rounds, fedavgcnn, batch 10, "
               f"1 local epoch, evaluation every round, {os.cpu_count()} cores")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"made": made, "setting": setting, "rows": rows}, indent=2))
    text = table(rows, setting, gpu_note, made)
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
