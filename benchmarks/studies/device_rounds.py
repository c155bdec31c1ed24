"""Steady round time of every method on CUDA against the CPU (docs/performance.md, "Rounds on CUDA").

    python -m benchmarks.studies.device_rounds --clients 10,100 --rounds 4 --out docs/results/device-rounds

Each method runs with its own settings on mnist5k (pathological, evaluation every round) for every
client count, once per device (``device='cpu'``, ``device='cuda'``), through ``flwr run`` (Ray; on
CUDA the clients share the GPU, ``runner.launch.gpu_share``) or, with ``--engine inprocess``,
the in-process engine in a fresh interpreter (clients one after another). The steady round is the
median of rounds 2..R (round 1 carries the start). Where this machine has no CUDA, the CUDA cells say
"not yet measured: needs a GPU machine" and the CPU ones are still measured. The table is stamped with
the commit, the devices' names and the torch version. Writes ``table.md`` and ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.sim_speed import training_rounds
from runner.launch import simulate

ROOT = Path(__file__).resolve().parents[2]
NOT_MEASURED = "not yet measured: needs a GPU machine"

INPROCESS = """
import json, sys, time
from runner.inprocess import run_inprocess
config, clients = json.loads(sys.argv[1]), int(sys.argv[2])
summary, _ = run_inprocess(config, clients)
print(json.dumps({"results_dir": summary["results_dir"]}))
"""


def steady_round(results_dir: str) -> float:
    """Median wall time of rounds 2..R (round 1 alone when there is only one)."""
    rows = training_rounds(results_dir)
    return statistics.median(float(r["wall_s"]) for r in (rows[1:] or rows))


def run_one(config: dict, clients: int, engine: str, workdir: Path) -> float:
    """One run's steady round in seconds; raises RuntimeError with the reason when the run fails."""
    name = f"{config['method']}-{clients}-{config['device']}"
    config = {**config, "results-dir": str(workdir), "run-name": name}
    if engine == "flwr":
        result = simulate(config, supernodes=clients, app_dir=ROOT, stream=False, timeout=7200,
                          flwr_home=workdir / f"home-{name}")
        if result["status"] != "finished:completed" or not result.get("summary"):
            raise RuntimeError(f"{result['status']} {result['details']}")
        if result["summary"].get("dropped_replies"):
            raise RuntimeError(f"{result['summary']['dropped_replies']} dropped replies")
        return steady_round(result["results_dir"])
    done = subprocess.run([sys.executable, "-c", INPROCESS, json.dumps(config), str(clients)], cwd=ROOT,
                          capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"rc {done.returncode}")
    return steady_round(json.loads(done.stdout.strip().splitlines()[-1])["results_dir"])


def stamp() -> dict:
    """What the numbers were measured with: commit, torch, the CPU and the GPU."""
    import torch

    from runner.provenance import tree_commit

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"commit": tree_commit(), "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu,
            "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version()}


def cell(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def table(rows: list[dict], setting: str, info: dict) -> str:
    lines = [f"Setting: {setting}. Steady round = median of rounds 2..R, seconds.",
             f"Commit {info['commit']}, torch {info['torch']} (CUDA {info['cuda'] or 'none'}), "
             f"CPU: {info['cpu']}, GPU: {info['gpu'] or 'none on this machine'}.", "",
             "| method | clients | CPU s / round | CUDA s / round | CUDA / CPU |", "|---|---|---|---|---|"]
    for r in rows:
        ratio = (f"{r['cuda'] / r['cpu']:.2f}" if isinstance(r["cpu"], float) and isinstance(r["cuda"], float)
                 else "-")
        lines.append(f"| {r['method']} | {r['clients']} | {cell(r['cpu'])} | {cell(r['cuda'])} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from fedcore.registry import REGISTRY

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=",".join(REGISTRY), help="comma-separated (default: every method)")
    parser.add_argument("--clients", default="10,100", help="comma-separated client counts")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--devices", default="cpu,cuda", help="which columns to measure (cpu, cuda)")
    parser.add_argument("--engine", choices=("flwr", "inprocess"), default="flwr")
    parser.add_argument("--dataset", default="mnist5k", help="mnist5k for the table; digits for a quick check")
    parser.add_argument("--out", type=Path, default=Path("docs/results/device-rounds"))
    args = parser.parse_args(argv)
    import torch

    methods, counts = args.methods.split(","), [int(c) for c in args.clients.split(",")]
    unknown = sorted(set(methods) - set(REGISTRY))
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; registered: {', '.join(REGISTRY)}")
    devices = [d for d in args.devices.split(",") if d]
    base = {"dataset": args.dataset, "partition": "pathological", "num-server-rounds": args.rounds, "eval-every": 1,
            "node-wait-s": 0, "plots": False}
    rows = []
    with tempfile.TemporaryDirectory(prefix="device-rounds-") as tmp:
        for method in methods:
            for clients in counts:
                row = {"method": method, "clients": clients, "cpu": "-", "cuda": "-"}
                for device in devices:
                    if device == "cuda" and not torch.cuda.is_available():
                        row["cuda"] = NOT_MEASURED
                        continue
                    t0 = time.time()
                    try:
                        row[device] = run_one({**base, "method": method, "device": device}, clients, args.engine,
                                              Path(tmp))
                    except (RuntimeError, subprocess.TimeoutExpired) as err:
                        row[device] = f"failed: {str(err)[:80]}"
                    print(f"{method:>12} {clients:>4} clients {device:>4}: {cell(row[device])} "
                          f"({time.time() - t0:.0f} s)", flush=True)
                rows.append(row)
    info = stamp()
    engine = "flwr run (Ray; on CUDA the clients share the GPU)" if args.engine == "flwr" else \
        "the in-process engine (clients one after another)"
    setting = (f"{args.dataset}, pathological, each method's own settings, {args.rounds} rounds, evaluation every round, "
               f"{engine}; command: python -m benchmarks.studies.device_rounds --clients {args.clients} --rounds {args.rounds} "
               f"--engine {args.engine} --devices {args.devices}"
               + ("" if methods == list(REGISTRY) else f" --methods {args.methods}")
               + ("" if args.dataset == "mnist5k" else f" --dataset {args.dataset}"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"setting": setting, **info, "rows": rows}, indent=2))
    (args.out / "table.md").write_text(table(rows, setting, info))
    print(table(rows, setting, info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
