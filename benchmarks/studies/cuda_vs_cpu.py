"""Each method's accuracy after the GPU kit's CUDA runs against the same runs on the CPU.

    python -m benchmarks.studies.cuda_vs_cpu docs/results/cuda-vs-cpu/methods.txt --out docs/results/cuda-vs-cpu

The GPU kit (step d) runs every registered method for a few rounds with ``device='cuda'`` through
``flwr run`` and writes one line per method (``methods.txt``: status, final accuracy pooled and client
mean, dropped replies) under a header that holds the run config. This command runs the same config with
``device='cpu'`` in the in-process engine (the same ServerApp and ClientApp; the flwr-run smoke test shows
the two engines give the same numbers), and writes ``table.md`` and ``results.json``: both accuracies
and their difference per method. Split, initial model and data order come from the seed on the CPU, so a
difference is what CUDA's kernels and random streams (dropout, sampling on the device) change.

``--seeds 0,1,2`` runs each method on the CPU once per seed (the seed also draws the split) and adds the
CPU's mean and sample std over them and whether the CUDA run lies within the CPU seeds' range: the
yardstick for a difference that is not float noise. ``--methods`` keeps some of the kit's lines.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from runner.flower_cli import parse_overrides

LINE = re.compile(r"^(?P<method>[\w+.-]+)\s+(?P<status>\S+)\s+(?:acc (?P<acc>[\d.]+|-)\s+client-mean (?P<mean>[\d.]+|-)"
                  r".*?dropped (?P<dropped>\d+|-))?")
HEADER = re.compile(r"^# (?P<config>.*?), (?P<supernodes>\d+) supernodes")


def parse(text: str) -> tuple[dict, int, list[dict]]:
    """The kit's methods.txt -> (run config without the device, supernodes, one dict per method)."""
    config, supernodes, rows = None, None, []
    for line in text.splitlines():
        line = line.strip()
        head = HEADER.match(line)
        if head:
            config = {k: v for k, v in parse_overrides(head["config"]).items() if k != "device"}
            supernodes = int(head["supernodes"])
            continue
        match = LINE.match(line)
        if match and not line.startswith("#"):
            num = lambda key: float(match[key]) if match[key] not in (None, "-") else None  # noqa: E731
            rows.append({"method": match["method"], "status": match["status"], "cuda_acc": num("acc"),
                         "cuda_client_mean": num("mean"), "cuda_dropped": num("dropped")})
    if config is None:
        raise SystemExit("no '# <run config>, N supernodes' header line: is this the GPU kit's methods.txt?")
    return config, supernodes, rows


def cpu_run(config: dict, method: str, supernodes: int, seed: int | None = None) -> dict:
    """The CUDA run's config on the CPU (with ``seed`` where given), in-process; its final accuracies (or the
    error)."""
    from runner.inprocess import run_inprocess

    with tempfile.TemporaryDirectory(prefix="cuda-vs-cpu-") as tmp:
        cfg = {**config, "method": method, "device": "cpu", "results-dir": tmp, "run-name": f"cpu-{method}",
               "plots": False, "overwrite": True, **({} if seed is None else {"seed": seed})}
        try:
            summary, _ = run_inprocess(cfg, supernodes)
        except Exception as err:  # a method that fails on the CPU is a row that says so
            return {"cpu_error": f"{type(err).__name__}: {err}"[:160]}
    return {"cpu_acc": summary["final_acc"], "cpu_client_mean": summary["client_acc_mean"],
            "cpu_dropped": summary.get("dropped_replies", 0)}


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def table(rows: list[dict], config: dict, supernodes: int, made: dict) -> str:
    lines = [f"CUDA: the GPU kit's flwr run ({made['gpu']}); CPU: the in-process engine on this machine, the same "
             f"run config ({', '.join(f'{k}={v}' for k, v in config.items())}), {supernodes} clients.",
             f"Command: `{made['command']}` at commit `{made['commit']}`.", "",
             "| method | CUDA status | CUDA acc % | CPU acc % | CUDA - CPU | CUDA client mean % | CPU client mean % |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = (f"{100 * (r['cuda_acc'] - r['cpu_acc']):+.2f}" if r.get("cuda_acc") is not None
                and r.get("cpu_acc") is not None else "-")
        lines.append(f"| {r['method']} | {r['status']} | {pct(r.get('cuda_acc'))} | "
                     f"{pct(r.get('cpu_acc')) if 'cpu_error' not in r else r['cpu_error']} | {diff} | "
                     f"{pct(r.get('cuda_client_mean'))} | {pct(r.get('cpu_client_mean'))} |")
    return "\n".join(lines) + "\n"


def seed_table(rows: list[dict], config: dict, supernodes: int, made: dict, seeds: list[int]) -> str:
    """Each CUDA run against the CPU's runs over ``seeds``: their accuracies, mean, sample std and range."""
    lines = [f"CUDA: the GPU kit's flwr run ({made['gpu']}, the default seed); CPU: the in-process engine on this "
             f"machine, seeds {', '.join(map(str, seeds))} (the seed also draws the split), the same run config "
             f"({', '.join(f'{k}={v}' for k, v in config.items())}), {supernodes} clients. Pooled accuracy; ± is the "
             "sample std over the CPU's seeds.",
             f"Command: `{made['command']}` at commit `{made['commit']}`.", "",
             "| method | CUDA acc % | " + " | ".join(f"CPU seed {s} %" for s in seeds)
             + " | CPU mean ± std | CUDA within the CPU seeds' range |", "|---|---|" + "---|" * (len(seeds) + 2)]
    for r in rows:
        accs = [a for a in r["cpu_seeds"] if a is not None]
        spread = (f"{100 * np.mean(accs):.2f} ± {100 * np.std(accs, ddof=1):.2f}" if len(accs) > 1 else "-")
        within = ("-" if r.get("cuda_acc") is None or not accs
                  else "yes" if min(accs) <= r["cuda_acc"] <= max(accs) else "no")
        lines.append(f"| {r['method']} | {pct(r.get('cuda_acc'))} | " + " | ".join(pct(a) for a in r["cpu_seeds"])
                     + f" | {spread} | {within} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("methods_txt", type=Path, help="the GPU kit's methods.txt")
    parser.add_argument("--out", type=Path, default=Path("docs/results/cuda-vs-cpu"))
    parser.add_argument("--gpu", default="the GPU named in the kit's summary", help="the GPU's name, for the table")
    parser.add_argument("--methods", default="", help="comma-separated: only these of the kit's lines")
    parser.add_argument("--seeds", default="", help="comma-separated CPU seeds: the CPU's spread beside each CUDA run")
    args = parser.parse_args(argv)
    from runner import provenance

    provenance.guard(args.out, allow_dirty=False)
    config, supernodes, rows = parse(args.methods_txt.read_text())
    if args.methods:
        rows = [r for r in rows if r["method"] in args.methods.split(",")]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    for row in rows:
        if seeds:
            row["cpu_seeds"] = [cpu_run(config, row["method"], supernodes, seed).get("cpu_acc") for seed in seeds]
        else:
            row.update(cpu_run(config, row["method"], supernodes))
        print(f"{row['method']:>12}: CUDA {pct(row['cuda_acc'])}  CPU "
              f"{row.get('cpu_seeds') or pct(row.get('cpu_acc'))}", flush=True)
    made = {"command": provenance.command_line("benchmarks.studies.cuda_vs_cpu", argv), "commit": provenance.tree_commit(), "gpu": args.gpu}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"config": config, "supernodes": supernodes, **made,
                                                       "seeds": seeds, "rows": rows}, indent=1) + "\n")
    text = seed_table(rows, config, supernodes, made, seeds) if seeds else table(rows, config, supernodes, made)
    (args.out / "table.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
