"""Every method in a real deployment: one ``flower-superlink`` and N ``flower-supernode`` processes
per method (``runner.deploy_local``, the project's own deployment, nothing mocked).

    python -m benchmarks.deployed_methods --methods fedgh,cfl --supernodes 2 [--flwr-run] \\
        [--run-config "dataset='digits' num-server-rounds=2"] --out docs/results/deployed-rivals

For each method, ``python -m runner.deploy_local --supernodes N --run-config "method='X' ..."``
runs as its own process: the SuperLink, the SuperNodes (fast runtime) and the run, judged as that
command judges it (exit 0 only for a ``finished:completed`` run whose last round was evaluated).
``--flwr-run`` adds, per method, the ``flwr run`` simulation of ``runner.launch`` with
``--flwr-run-supernodes`` clients and ``--flwr-run-config`` (default: mnist5k, pathological,
20 clients, 3 rounds). Writes ``table.md`` and ``table.csv``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.reliability import ROOT, _launch
from runner import flower_cli as fc
from runner.provenance import tree_commit

RIVALS = "fedgh,fedrod,gpfl,creff,fedamp,heurfedamp,cfl,fesem,pfedgraph,per-fedavg,pfedme,l2gd,fednova"
DEPLOY_CONFIG = "dataset='digits' num-server-rounds=2"
FLWR_RUN_CONFIG = "dataset='mnist5k' partition='pathological' num-server-rounds=3"


def one_run(module: str, method: str, supernodes: int, overrides: dict, results: Path, name: str) -> dict:
    """One run of ``python -m <module>`` (its exit code, the summary its ServerApp wrote, the wall time)."""
    config = {"supernodes": supernodes, "method": method, **overrides, "results-dir": str(results),
              "run-name": name, "overwrite": True}
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as work:
        code, out = _launch(config, Path(work), module=module)
    wall = time.monotonic() - start
    summary_file = results / name / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    row = {"exit": code, "completed": code == 0 and bool(summary), "rounds": summary.get("rounds", 0),
           "final_acc": summary.get("final_acc"), "wall_s": round(wall, 1)}
    if not row["completed"]:
        row["output_tail"] = out[-3000:]
    return row


def command(module: str, supernodes: int, run_config: str) -> str:
    """The command line one row ran (``method='X'`` standing for the row's method; the benchmark adds a
    results-dir and a run-name)."""
    return f'python -m {module} --supernodes {supernodes} --run-config "method=\'X\' {run_config}"'


def flwr_label(supernodes: int, overrides: dict) -> str:
    """The flwr run columns' name: "flwr run mnist5k pathological 20 clients"."""
    config = {**fc.pyproject_run_config(ROOT), **overrides}
    return f"flwr run {config['dataset']} {config['partition']} {supernodes} clients"


def _acc(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def format_table(rows: list[dict], deploy_cmd: str, flwr_cmd: str | None, made_by: str, flwr_name: str = "") -> str:
    head = "| method | deployed: completed | exit | rounds | final acc | wall s |"
    if flwr_cmd:
        head += f" {flwr_name}: completed | exit | final acc | wall s |"
    lines = [f"Deployed: one `flower-superlink` and SuperNodes started per method on loopback (fast runtime), "
             f"`{deploy_cmd}` (a row's method for X).",
             *([f"flwr run: the Ray simulation of `{flwr_cmd}`."] if flwr_cmd else []),
             "completed: exit 0 and a summary written (the run finished `completed` and its last round was "
             "evaluated); final acc: weighted, %; wall s: the whole command, start and stop included.",
             made_by, "", head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        d = r["deployed"]
        cells = [r["method"], "yes" if d["completed"] else "NO", str(d["exit"]), str(d["rounds"]), _acc(d["final_acc"]),
                 f"{d['wall_s']:.0f}"]
        if flwr_cmd:
            s = r["flwr_run"]
            cells += ["yes" if s["completed"] else "NO", str(s["exit"]), _acc(s["final_acc"]), f"{s['wall_s']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict], path: Path, flwr_run: bool) -> None:
    keys = ["completed", "exit", "rounds", "final_acc", "wall_s"]
    columns = ["method", *(f"deployed_{k}" for k in keys), *((f"flwr_run_{k}" for k in keys) if flwr_run else ())]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        for r in rows:
            w.writerow({"method": r["method"], **{f"deployed_{k}": r["deployed"][k] for k in keys},
                        **({f"flwr_run_{k}": r["flwr_run"][k] for k in keys} if flwr_run else {})})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=RIVALS, help="comma-separated (default: the 13 rivals)")
    parser.add_argument("--supernodes", type=int, default=2)
    parser.add_argument("--run-config", default=DEPLOY_CONFIG, help="the deployed runs' overrides (besides method)")
    parser.add_argument("--flwr-run", action="store_true", help="also a flwr run simulation per method")
    parser.add_argument("--flwr-run-supernodes", type=int, default=20)
    parser.add_argument("--flwr-run-config", default=FLWR_RUN_CONFIG)
    parser.add_argument("--out", type=Path, default=Path("docs/results/deployed-rivals"))
    args = parser.parse_args(argv)
    made_by = (f"Made by `python -m benchmarks.deployed_methods {shlex.join(sys.argv[1:] if argv is None else argv)}` "
               f"at commit `{tree_commit()}`.")
    deploy_overrides = fc.parse_overrides(args.run_config)
    flwr_overrides = fc.parse_overrides(args.flwr_run_config)
    results = Path(tempfile.mkdtemp(prefix="deployed-methods-"))
    rows = []
    for method in args.methods.split(","):
        row = {"method": method, "deployed": one_run("runner.deploy_local", method, args.supernodes,
                                                     deploy_overrides, results, f"deployed-{method}")}
        print(f"deployed {method}: {row['deployed']}", flush=True)
        if args.flwr_run:
            row["flwr_run"] = one_run("runner.launch", method, args.flwr_run_supernodes, flwr_overrides, results,
                                      f"flwr-run-{method}")
            print(f"flwr run {method}: {row['flwr_run']}", flush=True)
        rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / "table.csv", args.flwr_run)
    table = format_table(rows, command("runner.deploy_local", args.supernodes, args.run_config),
                         command("runner.launch", args.flwr_run_supernodes, args.flwr_run_config) if args.flwr_run
                         else None, made_by, flwr_label(args.flwr_run_supernodes, flwr_overrides))
    (args.out / "table.md").write_text(table)
    print(table)
    ok = all(r["deployed"]["completed"] and (not args.flwr_run or r["flwr_run"]["completed"]) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
