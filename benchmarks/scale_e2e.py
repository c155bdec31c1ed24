"""End to end at 100 to 1,000 clients: one real ``flwr run`` simulation per client count, with the peak memory
of every process of the launch and the seconds per round.

    python -m benchmarks.scale_e2e --clients 100,300,1000 --rounds 5 --fraction 0.1 [--method fedavg]
        [--out docs/results/scale-e2e]

Each count is one ``python -m runner.launch --supernodes N`` (mnist5k, its default partition, the
given share of the clients training each round, every client evaluating after every round, one CPU per
client). While it runs, the memory of its whole process tree (launcher, ``flwr`` CLI, SuperLink and
SuperExec, Ray's head processes and client actors, ``flwr-simulation``) is sampled every 0.5 s from /proc
(``benchmarks.proc_memory``): the peak of the summed PSS (a shared page counted once; this is the number
that must fit in RAM) and of the summed RSS (which counts shared libraries once per process), and the PSS
of each kind of process at the peak. Seconds per round come from the run's rounds.csv (median of rounds
2..R; round 1 apart), start-up is the launcher's (command to round 1). The 1-minute load average at the
start of each run is recorded: other jobs may share the cores, which slows rounds but not memory.

The per-client growth is a least-squares line through the completed points, total and per kind of
process, and the largest client count whose peak fits in 24 GB is that line's extrapolation (the table
says so). ``runner.memory_budget`` takes its constants from this table. Writes table.md and table.csv.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.proc_memory import KINDS, TreeSampler, load_average

ROOT = Path(__file__).resolve().parents[1]
BUDGET_BYTES = 24e9  # the "24 GB", in decimal gigabytes
KIND_NAMES = [k for k, _ in KINDS] + ["launcher + flwr CLI"]
FIELDS = ["clients", "rounds", "fraction", "method", "status", "peak_pss_gb", "peak_rss_sum_gb", "processes",
          *[f"pss_gb {k}" for k in KIND_NAMES], "startup_s", "round_s", "first_round_s", "run_s",
          "load_at_start", "cpus", "mem_total_gb", "command", "commit"]


def run_config(clients: int, rounds: int, fraction: float, method: str, results_dir: Path, device: str = "auto") -> str:
    return (f"method='{method}' dataset='mnist5k' num-server-rounds={rounds} fraction-train={fraction} device='{device}' "
            f"eval-every=1 client-threads=1 results-dir='{results_dir}' run-name='scale-{clients}'")


def _status(log: str) -> str:
    found = re.findall(r"^run \S+: (\S+)", log, flags=re.M)
    return found[-1] if found else "no-status"


def _rounds(folder: Path) -> list[dict]:
    try:
        with open(folder / "rounds.csv") as f:
            return [r for r in csv.DictReader(f) if int(r["round"]) >= 1]
    except OSError:
        return []


def _mem_total() -> float:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) * 1024 / 1e9


def measure(clients: int, rounds: int, fraction: float, method: str, workdir: Path,
            timeout: float = 3600, interval: float = 0.5, device: str = "auto", config: str | None = None,
            env: dict[str, str] | None = None) -> dict:
    """One launch of ``clients`` virtual SuperNodes, sampled while it runs; returns a table row.
    ``config`` replaces this benchmark's run config (it must write to ``workdir``/results/scale-``clients``),
    ``env`` is added to the launcher's environment."""
    results = workdir / "results"
    cmd = [sys.executable, "-m", "runner.launch", "--supernodes", str(clients), "--cpus-per-client", "1",
           "--run-config", config or run_config(clients, rounds, fraction, method, results, device)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    log_path = workdir / f"launch-{clients}.log"
    load = load_average()
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        with TreeSampler(proc.pid, interval) as sampler:
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.terminate()  # the launcher stops its SuperLink and Ray on SIGTERM
                proc.wait(60)
                code = None
    run_s = time.time() - t0
    text = log_path.read_text(errors="replace")
    status = "timeout" if code is None else ("refused: " + text.strip().splitlines()[-1][:200]
                                             if code == 2 and "configuration error" in text else _status(text))
    rows = _rounds(results / f"scale-{clients}")
    steady = [float(r["wall_s"]) for r in rows[1:]]
    by_kind = sampler.at_peak.get("by_kind", {})
    return {"clients": clients, "rounds": rounds, "fraction": fraction, "method": method, "status": status,
            "peak_pss_gb": (sampler.peak_pss or 0) / 1e9, "peak_rss_sum_gb": sampler.peak_rss / 1e9,
            "processes": sampler.max_processes,
            **{f"pss_gb {k}": by_kind.get(k, 0) / 1e9 for k in KIND_NAMES},
            "startup_s": float(rows[0]["startup_s"]) if rows and rows[0].get("startup_s") else None,
            "round_s": statistics.median(steady) if steady else None,
            "first_round_s": float(rows[0]["wall_s"]) if rows else None, "run_s": run_s,
            "load_at_start": load, "cpus": os.cpu_count(), "mem_total_gb": _mem_total(), "rounds_done": len(rows),
            "rounds_csv": rows,
            "log_tail": "\n".join(text.strip().splitlines()[-15:])}


def fit(rows: list[dict], key: str = "peak_pss_gb") -> tuple[float, float] | None:
    """(intercept GB, slope GB per client) of a least-squares line through the completed rows."""
    done = [r for r in rows if r["status"] == "finished:completed"]
    if len({r["clients"] for r in done}) < 2:
        return None
    xs, ys = [r["clients"] for r in done], [r[key] for r in done]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def _num(v, fmt: str) -> str:
    return "-" if v is None or v == "" else fmt.format(float(v))


def table(rows: list[dict], command: str, commit: str) -> str:
    r0 = rows[0]
    lines = [f"Made by `{command}` at commit `{commit}`.",
             f"Setting: {r0['method']}, mnist5k, {r0['rounds']} rounds, {r0['fraction']:.0%} of the clients train "
             f"each round, every client evaluates after every round, one CPU per client; {r0['cpus']} cores, "
             f"{r0['mem_total_gb']:.1f} GB RAM. Memory: peak over the run of the summed PSS of every process of the "
             "launch (sampled every 0.5 s), with each kind's PSS at that peak; RSS sum counts shared pages once per "
             "process. s / round: median of rounds 2..R. Load: 1-minute load average at the run's start (other "
             "jobs shared the cores where it is above 0).", "",
             "| clients | status | peak PSS GB | peak RSS sum GB | processes | client actors GB | flwr-simulation GB "
             "| SuperLink GB | Ray head GB | start-up s | round 1 s | s / round | run s | load at start |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['clients']} | {r['status']} | {_num(r['peak_pss_gb'], '{:.2f}')} "
                     f"| {_num(r['peak_rss_sum_gb'], '{:.2f}')} | {r['processes']} "
                     f"| {_num(r['pss_gb client actors'], '{:.2f}')} | {_num(r['pss_gb flwr-simulation'], '{:.2f}')} "
                     f"| {_num(r['pss_gb SuperLink + SuperExec'], '{:.2f}')} | {_num(r['pss_gb Ray head'], '{:.2f}')} "
                     f"| {_num(r['startup_s'], '{:.1f}')} | {_num(r['first_round_s'], '{:.1f}')} "
                     f"| {_num(r['round_s'], '{:.2f}')} | {_num(r['run_s'], '{:.0f}')} "
                     f"| {_num(r['load_at_start'], '{:.2f}')} |")
    line = fit(rows)
    lines.append("")
    if line is None:
        lines.append("Fewer than two completed client counts: no per-client growth fitted.")
        return "\n".join(lines) + "\n"
    a, b = line
    parts = []
    for k in KIND_NAMES:
        kl = fit(rows, f"pss_gb {k}")
        if kl is not None:
            parts.append(f"{k} {kl[1] * 1e3:+.3f} MB")
    largest = (BUDGET_BYTES / 1e9 - a) / b if b > 0 else float("inf")
    lines += [f"Per-client growth (least squares through the completed points): peak PSS = {a:.2f} GB + "
              f"{b * 1e3:.2f} MB x clients; by kind of process (PSS at the peak): {', '.join(parts)} per client.",
              f"Largest client count whose peak fits in 24 GB (24 x 10^9 bytes), an extrapolation of that line far "
              f"beyond the measured points: about {largest:,.0f} clients." if b > 0 else
              "The fitted slope is not positive: no extrapolation."]
    return "\n".join(lines) + "\n"


def write(rows: list[dict], out: Path, command: str, commit: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, "command": command, "commit": commit})
    text = table(rows, command, commit)
    (out / "table.md").write_text(text)
    return text


def read_csv(path: Path) -> list[dict]:
    """The rows of a table.csv, numbers as numbers (for ``--rebuild``)."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k, v in r.items():
            if k not in ("method", "status", "command", "commit") and v not in (None, ""):
                r[k] = int(v) if k in ("clients", "rounds", "processes", "cpus") else float(v)
            elif v == "":
                r[k] = None
    return rows


def run_rows(plan: list, describe, run_one, write_table, prefix: str) -> list[dict]:
    """Run each item of ``plan`` (``run_one(item, workdir, rows_so_far) -> (row, summary line)``) in a scratch
    folder, saying which of how many runs, and rewrite the table after every row: a later one may not finish."""
    rows: list[dict] = []
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        for i, item in enumerate(plan, 1):
            print(f"[{i}/{len(plan)}] {describe(item)} ...", flush=True)
            t0 = time.time()
            row, line = run_one(item, workdir, rows)
            print(f"  {row['status']}: {line} ({time.time() - t0:.0f} s)", flush=True)
            if row["status"] != "finished:completed":
                print(row["log_tail"], flush=True)
            rows.append(row)
            write_table(rows)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(write_table(rows))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="100,300,1000", help="comma-separated client counts, one run each")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fraction", type=float, default=0.1, help="share of the clients that train each round")
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    parser.add_argument("--out", type=Path, default=Path("docs/results/scale-e2e"))
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write a docs/ table from uncommitted code (to try things)")
    parser.add_argument("--rebuild", action="store_true",
                        help="run nothing: write table.md again from the table.csv in --out (its command and commit)")
    args = parser.parse_args(argv)
    from runner.provenance import command_line, commit, guard

    if args.rebuild:
        rows = read_csv(args.out / "table.csv")
        print(write(rows, args.out, rows[0]["command"], rows[0]["commit"]))
        return 0

    dirty = guard(args.out, args.allow_dirty)
    command = command_line("benchmarks.scale_e2e", argv)
    stamp = commit() + (" + uncommitted changes" if dirty else "")
    def one(n: int, workdir: Path, rows: list[dict]) -> tuple[dict, str]:
        row = measure(n, args.rounds, args.fraction, args.method, workdir, args.timeout)
        return row, (f"peak PSS {row['peak_pss_gb']:.2f} GB (RSS sum {row['peak_rss_sum_gb']:.2f}), "
                     f"{row['rounds_done']} rounds, s/round {row['round_s']}, start-up {row['startup_s']}, "
                     f"run {row['run_s']:.0f} s, load {row['load_at_start']}")

    counts = [int(c) for c in args.clients.split(",")]
    rows = run_rows(counts, lambda n: f"{n} clients", one, lambda rows: write(rows, args.out, command, stamp),
                    "scale-e2e-")
    return 0 if all(r["status"] == "finished:completed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
