"""Cross-device scale (`make bench-scale`): a round of ``flwr run`` at 100 to 10,000 virtual SuperNodes, beside
the in-process engine's one-thread round of the same run config, with the peak memory of each kind of process.

    python -m benchmarks.scale_round --clients 100,1000,10000 --rounds 5 --fraction 0.01 \
        [--evaluation sampled,all] [--rounds-all 3] [--flower-path 1000] [--out docs/results/scale-round]

Setting (docs/scale.md): FedAvg on Fashion-MNIST, every client holding 6 images (``pfedpm-nk``: 2 classes, 3
images each, so a client's work is the same at every client count), ``fraction`` of the clients training each
round, one torch thread per client, plots off. Evaluation ``all``: every client evaluates after every round;
``sampled``: ``fraction-evaluate`` = ``fraction`` in rounds 1..R-1 and every client in round R (the last round
evaluates all, so that tables keep their meaning; its seconds are a column of their own); ``last``: nobody in
rounds 1..R-1, every client in round R (``eval-every`` = R: the rounds of training alone).

For each client count and evaluation the row holds

* ``flwr run``: ``benchmarks.scale_e2e.measure`` (the launcher, one CPU per client, the memory of every process
  of the launch sampled from /proc): s / round = median of rounds 2..R (``all``) or 2..R-1 (``sampled``), the
  seconds per client message of those rounds (trained + evaluated clients), the last round, start-up and the
  peak PSS, total and per kind of process;
* in-process: ``runner.inprocess`` in a fresh interpreter, one thread, the same run config and rounds;
* their ratio (the issue's target: at most 0.75 at 1,000 clients on 2 cores).

``--flower-path N,...`` adds, at those counts, a ``flwr run`` with ``PFL_SCALE_PATCHES=off``: Flower's own
message mover and reply pulls (``fedcore.flower_patches.indexed_message_ins`` and ``replied`` not applied), so the
table shows what each costs. ``--rounds-all`` runs the ``all`` rows for fewer rounds (every client evaluates
in each: at 10,000 clients a round is minutes). Every row records the 1-minute load average at its start: on a shared machine the
seconds are not an idle machine's, the ratios of a row are taken under the same load. Writes table.md and
table.csv (``--out``), stamped with the commit.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import scale_e2e
from benchmarks.proc_memory import load_average

ROOT = Path(__file__).resolve().parents[1]
SETTING = {"method": "fedavg", "dataset": "fmnist", "partition": "pfedpm-nk", "pfedpm-nk.n": 2, "pfedpm-nk.k": 3,
           "pfedpm-nk.stdev": 0, "client-threads": 1, "device": "cpu", "plots": False}
IMAGES_PER_CLIENT = SETTING["pfedpm-nk.n"] * SETTING["pfedpm-nk.k"]
EVALUATIONS = ("sampled", "last", "all")
FIELDS = ["clients", "evaluation", "path", "status", "round_s", "per_message_ms", "inprocess_round_s", "ratio",
          "last_round_s", "inprocess_last_round_s", "startup_s", "peak_pss_gb",
          *[f"pss_gb {k}" for k in scale_e2e.KIND_NAMES], "load_at_start", "rounds", "fraction", "cpus", "commit"]


def run_config(clients: int, rounds: int, fraction: float, evaluation: str, results_dir: Path, name: str) -> dict:
    """The run config of one row (the same for ``flwr run`` and the in-process engine)."""
    if evaluation not in EVALUATIONS:
        raise ValueError(f"evaluation must be one of {EVALUATIONS}, not {evaluation!r}")
    config = {**SETTING, "num-server-rounds": rounds, "fraction-train": fraction, "results-dir": str(results_dir),
              "run-name": name}
    if evaluation == "all":
        return {**config, "eval-every": 1}
    if evaluation == "last":
        return {**config, "eval-every": rounds}
    return {**config, "eval-every": rounds, "fraction-evaluate": fraction}


def check_sampled_evaluation() -> None:
    """Sampled evaluation is the run-config key ``fraction-evaluate`` (issue #77, item 1): refuse before any run
    where this checkout's schema lacks it."""
    from fedcore.config import schema

    if "fraction-evaluate" not in schema():
        raise SystemExit("error: this checkout has no 'fraction-evaluate' run-config key (sampled evaluation); "
                         "run with --evaluation all")


def to_flwr(config: dict) -> str:
    """A run config as ``--run-config`` text."""
    def value(v):
        return ("true" if v else "false") if isinstance(v, bool) else (f"'{v}'" if isinstance(v, str) else repr(v))

    return " ".join(f"{k}={value(v)}" for k, v in config.items())


def steady(rows: list[dict], evaluation: str) -> tuple[float | None, float | None, float | None]:
    """(median s / round, median s per client message, last round s) of a run's rounds.csv rows: rounds 2..R
    (``all``) or 2..R-1 (``sampled``, ``last``: the last one evaluates every client)."""
    if not rows:
        return None, None, None
    pick = rows[1:] if evaluation == "all" else rows[1:-1]
    pick = pick or rows[:1]
    walls = [float(r["wall_s"]) for r in pick]
    messages = [int(r["replies"] or 0) + int(r["eval_clients"] or 0) for r in pick]
    per_message = statistics.median(w / m for w, m in zip(walls, messages) if m) if any(messages) else None
    return statistics.median(walls), per_message, float(rows[-1]["wall_s"])


INPROCESS = """
import json, sys, time
import torch
torch.set_num_threads(1)
from runner.inprocess import run_inprocess
config, clients = json.loads(sys.argv[1]), int(sys.argv[2])
summary, _ = run_inprocess(config, clients)
print(json.dumps({"results_dir": summary["results_dir"]}))
"""


def inprocess(config: dict, clients: int, timeout: float) -> list[dict]:
    """The in-process engine's rounds.csv rows for ``config`` (a fresh interpreter, one thread)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", INPROCESS, json.dumps(config), str(clients)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"in-process run at {clients} clients failed:\n{done.stderr[-3000:]}")
    folder = Path(json.loads(done.stdout.strip().splitlines()[-1])["results_dir"])
    with open(folder / "rounds.csv") as f:
        return [r for r in csv.DictReader(f) if int(r["round"]) >= 1]


def measure(clients: int, rounds: int, fraction: float, evaluation: str, workdir: Path, timeout: float,
            flower_path: bool = False, baseline: dict | None = None) -> dict:
    """One row: ``flwr run`` (our path, or Flower's own with ``flower_path``) beside the in-process engine
    (run here unless ``baseline``, the row whose in-process figures to reuse, is given)."""
    results = workdir / "results"
    name = f"scale-{clients}"
    config = run_config(clients, rounds, fraction, evaluation, results, name)
    env = {"PFL_SCALE_PATCHES": "off"} if flower_path else {}
    load = load_average()
    flwr = scale_e2e.measure(clients, rounds, fraction, SETTING["method"], workdir, timeout=timeout,
                             config=to_flwr(config), env=env)
    shutil.rmtree(results / name, ignore_errors=True)
    round_s, per_message, last = steady(flwr.pop("rounds_csv"), evaluation)
    if baseline is None:
        seq = inprocess({**config, "run-name": f"inprocess-{clients}"}, clients, timeout)
        seq_round, _, seq_last = steady(seq, evaluation)
        shutil.rmtree(results / f"inprocess-{clients}", ignore_errors=True)
    else:
        seq_round, seq_last = baseline["inprocess_round_s"], baseline["inprocess_last_round_s"]
    return {**{k: flwr[k] for k in ("status", "startup_s", "peak_pss_gb", "cpus", "log_tail")},
            **{f"pss_gb {k}": flwr[f"pss_gb {k}"] for k in scale_e2e.KIND_NAMES},
            "clients": clients, "evaluation": evaluation, "path": "Flower's own" if flower_path else "patched",
            "round_s": round_s, "per_message_ms": per_message * 1e3 if per_message else None,
            "inprocess_round_s": seq_round, "ratio": round_s / seq_round if round_s and seq_round else None,
            "last_round_s": last, "inprocess_last_round_s": seq_last, "load_at_start": load,
            "rounds": rounds, "fraction": fraction}


def _num(v, fmt: str) -> str:
    return "-" if v is None or v == "" else fmt.format(float(v))


def table(rows: list[dict], command: str, commit: str) -> str:
    r0 = rows[0]
    lines = [f"Made by `{command}` at commit `{commit}`.",
             f"Setting: FedAvg, Fashion-MNIST, {IMAGES_PER_CLIENT} images per client (pfedpm-nk, 2 classes x 3), "
             f"{'/'.join(sorted({str(r['rounds']) for r in rows}))} rounds (column `rounds`), {float(r0['fraction']):.0%} of the clients train each round; evaluation "
             f"`sampled`: {float(r0['fraction']):.0%} of the clients evaluate in rounds 1..R-1 and all in round R, "
             "`last`: none in rounds 1..R-1 and all in round R, `all`: every client after every round; one CPU and one torch thread per client; "
             f"{r0['cpus']} cores. s / round: median of rounds 2..R (`all`) or 2..R-1 (`sampled`, `last`); ms / message: "
             "those rounds' seconds over their trained + evaluated clients; in-process: the same run config in one "
             "process on one thread (runner.inprocess), run right after; ratio = flwr / in-process. Path `Flower's "
             "own`: PFL_SCALE_PATCHES=off (no message index, every pull asks for every awaited message). Memory: "
             "peak summed PSS of the launch's processes and each kind's PSS at that peak. Load: 1-minute load "
             "average at the row's start (above 0: other jobs shared the cores).", "",
             "| clients | evaluation | rounds | path | status | flwr s / round | ms / message | in-process s / round | ratio "
             "| last round s (flwr / in-process) | start-up s | peak PSS GB | client actors GB | flwr-simulation GB "
             "| SuperLink GB | Ray head GB | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['clients']} | {r['evaluation']} | {r['rounds']} | {r['path']} | {r['status']} | {_num(r['round_s'], '{:.2f}')} "
            f"| {_num(r['per_message_ms'], '{:.1f}')} | {_num(r['inprocess_round_s'], '{:.2f}')} "
            f"| {_num(r['ratio'], '{:.2f}')} | {_num(r['last_round_s'], '{:.1f}')} / "
            f"{_num(r['inprocess_last_round_s'], '{:.1f}')} | {_num(r['startup_s'], '{:.0f}')} "
            f"| {_num(r['peak_pss_gb'], '{:.2f}')} | {_num(r['pss_gb client actors'], '{:.2f}')} "
            f"| {_num(r['pss_gb flwr-simulation'], '{:.2f}')} | {_num(r['pss_gb SuperLink + SuperExec'], '{:.2f}')} "
            f"| {_num(r['pss_gb Ray head'], '{:.2f}')} | {_num(r['load_at_start'], '{:.1f}')} |")
    return "\n".join(lines) + "\n"


def write(rows: list[dict], out: Path, command: str, commit: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, "commit": commit})
    text = table(rows, command, commit)
    (out / "table.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="100,1000,10000", help="comma-separated client counts")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fraction", type=float, default=0.01,
                        help="share of the clients that train (and, sampled, evaluate) each round")
    parser.add_argument("--evaluation", default="sampled,all", help="comma-separated: sampled, last, all")
    parser.add_argument("--rounds-all", type=int, default=None,
                        help="rounds of the rows where every client evaluates (default: --rounds)")
    parser.add_argument("--flower-path", default="", help="client counts that also get a row of Flower's own path")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    parser.add_argument("--out", type=Path, default=Path("docs/results/scale-round"))
    parser.add_argument("--allow-dirty", action="store_true", help="write a docs/ table from uncommitted code")
    args = parser.parse_args(argv)
    from runner.provenance import command_line, commit, guard

    evaluations = [e.strip() for e in args.evaluation.split(",") if e.strip()]
    bad = sorted(set(evaluations) - set(EVALUATIONS))
    if bad:
        parser.error(f"--evaluation: unknown {bad}; choose from {', '.join(EVALUATIONS)}")
    if "sampled" in evaluations:
        check_sampled_evaluation()
    counts = [int(c) for c in args.clients.split(",")]
    flower_path = {int(c) for c in args.flower_path.split(",") if c.strip()}
    dirty = guard(args.out, args.allow_dirty)
    command = command_line("benchmarks.scale_round", argv)
    stamp = commit() + (" + uncommitted changes" if dirty else "")
    plan = [(n, e, False) for n in counts for e in evaluations] + \
           [(n, e, True) for n in counts if n in flower_path for e in evaluations]

    def one(item: tuple, workdir: Path, rows: list[dict]) -> tuple[dict, str]:
        n, evaluation, flower = item
        baseline = next((r for r in rows if r["clients"] == n and r["evaluation"] == evaluation), None)
        rounds = args.rounds_all if evaluation == "all" and args.rounds_all else args.rounds
        row = measure(n, rounds, args.fraction, evaluation, workdir, args.timeout, flower, baseline)
        return row, (f"flwr {row['round_s']} s / round, in-process {row['inprocess_round_s']}, ratio {row['ratio']}, "
                     f"last round {row['last_round_s']}, peak PSS {row['peak_pss_gb']:.2f} GB")

    def describe(item: tuple) -> str:
        n, evaluation, flower = item
        return f"{n} clients, evaluation {evaluation}, {'Flower' + chr(39) + 's own path' if flower else 'patched path'}"

    rows = scale_e2e.run_rows(plan, describe, one, lambda rows: write(rows, args.out, command, stamp), "scale-round-")
    return 0 if all(r["status"] == "finished:completed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
