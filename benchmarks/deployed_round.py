"""Deployed round vs simulated round: the README's deployment benchmark (not a timed test).

    python -m benchmarks.deployed_round --supernodes 2,4 --rounds 4 --out docs/results/deployed-round

For each number of SuperNodes, the same run config (FedAvg on mnist5k, one local epoch, evaluation
every round, ``client-threads=1`` so that N clients share the cores alike everywhere) runs on

* ``simulation``: ``flwr run`` on Flower's Ray engine (``runner.launch``),
* ``deployed (Flower)``: flower-superlink + flower-supernode on loopback, Flower's commands as shipped,
* ``deployed (fast)``: the same with ``runner.fast_runtime`` (no fixed sleeps, ClientApps forked
  from a warm SuperExec),

and the round time is the ServerApp's own ``wall_s`` (rounds.csv): the median over rounds 2..R
(round 1 carries the start: Ray's actors, the first ClientApp processes). Also measured: what a
cold ClientApp process pays before it reads its message (interpreter + imports), and loading a
partition from the dataset vs from the partition cache. Writes ``table.md`` and ``results.json``.
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

from runner import flower_cli as fc
from runner.deploy_local import deploy
from runner.launch import simulate

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("simulation", "deployed (Flower)", "deployed (fast)")


def _round_times(result: dict) -> list[float]:
    with open(Path(result["results_dir"]) / "rounds.csv") as f:
        return [float(r["wall_s"]) for r in csv.DictReader(f) if int(r["round"]) >= 1]


def run_engine(engine: str, config: dict, supernodes: int, workdir: Path) -> list[float]:
    if engine == "simulation":
        result = simulate(config, supernodes=supernodes, app_dir=ROOT, stream=False, timeout=3600,
                          flwr_home=workdir / "flwr-home")
    else:
        result = deploy(config, supernodes=supernodes, app_dir=ROOT, workdir=workdir / "deploy",
                        runtime="flower" if "Flower" in engine else "fast", timeout=3600)
    if result["status"] != "finished:completed":
        raise RuntimeError(f"{engine} with {supernodes} SuperNodes: {result['status']} {result['details']}")
    return _round_times(result)


def cold_clientapp_start_s(repeats: int = 3) -> float:
    """Median seconds a fresh interpreter needs to import the ClientApp (what Flower's SuperExec
    pays for every message before the message is read)."""
    times = []
    for _ in range(repeats):
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", "import clients.app"], cwd=ROOT, check=True, env=fc.flower_env(ROOT))
        times.append(time.monotonic() - start)
    return statistics.median(times)


def partition_load_s(dataset: str, supernodes: int) -> dict[str, float]:
    """Seconds to load one client's partition: from the dataset (cache off) and from the cache."""
    code = ("import time,torch; from fedcore.config import Config; from clients.data import load_client_data;"
            f"cfg=Config.from_run_config({{'dataset':'{dataset}'}}); t=time.monotonic();"
            f"load_client_data(cfg,0,{supernodes},torch.device('cpu')); print(time.monotonic()-t)")
    out = {}
    for label, cache in (("dataset", "0"), ("cache", "")):
        env = {**fc.flower_env(ROOT), "PFL_PARTITION_CACHE": cache} if cache else fc.flower_env(ROOT)
        res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, text=True, capture_output=True, check=True)
        out[label] = float(res.stdout.strip().splitlines()[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--supernodes", default="2,4")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--out", type=Path, default=Path("docs/results/deployed-round"))
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write a docs/ table from uncommitted code (to try things)")
    args = parser.parse_args(argv)
    from runner.provenance import guard, made_by

    guard(args.out, args.allow_dirty)  # a docs/ table is made from committed code only
    made = made_by("benchmarks.deployed_round", argv)
    fc.exit_on_sigterm()
    engines = [e.strip() for e in args.engines.split(",")]
    work = Path(tempfile.mkdtemp(prefix="pfl-bench-deploy-"))
    rows = []
    for n in (int(s) for s in args.supernodes.split(",")):
        row = {"supernodes": n}
        for engine in engines:
            config = {"method": "fedavg", "dataset": "mnist5k", "num-server-rounds": args.rounds, "client-threads": 1,
                      "node-wait-s": 120, "results-dir": str(work / "results"),
                      "run-name": f"{engine.split()[0]}-{engine.split('(')[-1].rstrip(')').lower()}-{n}"}
            print(f"== {engine}, {n} SuperNodes", flush=True)
            times = run_engine(engine, config, n, work / f"{n}-{len(row)}")
            row[engine] = {"first_round_s": times[0], "round_s": statistics.median(times[1:]), "rounds_s": times}
            print(f"   rounds: {[round(t, 2) for t in times]}", flush=True)
        rows.append(row)
    facts = {"cold_clientapp_start_s": cold_clientapp_start_s(), "partition_load_s": partition_load_s("mnist5k", 2),
             "load_average": os.getloadavg(), "cpus": os.cpu_count(), "rounds": args.rounds, "made": made}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"rows": rows, "facts": facts}, indent=2))
    table = format_table(rows, engines, facts)
    (args.out / "table.md").write_text(table)
    print(table)
    return 0


def format_table(rows: list[dict], engines: list[str], facts: dict) -> str:
    head = "| SuperNodes | " + " | ".join(f"{e}: s/round (first)" for e in engines)
    if "simulation" in engines:
        head += " | " + " | ".join(f"{e} / simulation" for e in engines if e != "simulation")
    made = [facts["made"], ""] if facts.get("made") else []
    lines = made + [head + " |", "|" + "---|" * (head.count("|"))]
    for row in rows:
        cells = [str(row["supernodes"])]
        cells += [f"{row[e]['round_s']:.2f} ({row[e]['first_round_s']:.1f})" for e in engines]
        if "simulation" in engines:
            sim = row["simulation"]["round_s"]
            cells += [f"{row[e]['round_s'] / sim:.2f}x" for e in engines if e != "simulation"]
        lines.append("| " + " | ".join(cells) + " |")
    part = facts["partition_load_s"]
    lines += ["", f"Median of rounds 2..{facts['rounds']} (first round in brackets); FedAvg, mnist5k, 1 local epoch, "
              f"evaluation every round, client-threads=1, {facts['cpus']} cores, load average at the end "
              f"{facts['load_average'][0]:.1f}. A cold ClientApp process (interpreter + imports) takes "
              f"{facts['cold_clientapp_start_s']:.2f} s; one mnist5k partition loads in {part['dataset']:.2f} s from "
              f"the dataset and {part['cache']:.3f} s from the partition cache."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
