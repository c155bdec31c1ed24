"""Reliability table: every method through the real ``flwr run`` with faults injected, and runs
killed with SIGKILL mid-round then resumed, compared with uninterrupted runs of the same seed.

    python -m benchmarks.reliability [--methods fedavg,ditto] [--out docs/results/reliability]

Faults: 6 clients on ``digits``, 4 rounds, ``faults.share = 0.3`` (2 faulty clients per round) with
every kind but ``hang`` (a hang costs a whole ``round-timeout``; tests/test_reliability_e2e.py has
one). Resume: the simulation process is killed with SIGKILL as soon as round 2 of 4 is checkpointed
(so in round 3); the same command with ``resume=true`` finishes the run; its rounds.csv must equal
an uninterrupted run's. Writes ``table.md`` and ``table.csv``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMINGS = ("wall_s", "eval_s", "startup_s")  # the rounds.csv columns that differ between any two runs
FAULT_KINDS = "raise,nan,shape,missing,wrong-pid,huge,overflow"


REASON_KINDS = (  # (text in the drop reason, what the table calls it), first match wins
    ("injected fault", "client raised"), ("client error", "client raised"), ("no reply", "no reply"),
    ("NaN or Inf", "NaN/Inf"), ("overflow", "overflow"), ("norm", "norm over bound"),
    ("shape", "wrong shape"), ("missing", "missing record/metric"), ("partition id", "wrong partition id"),
    ("num-examples", "bad count"), ("dtype", "wrong dtype"),
)


def _kind(reason: str) -> str:
    """A drop reason as the kind of fault it reveals (the full reasons are in each run's dropped.json)."""
    return next((kind for text, kind in REASON_KINDS if text in reason), reason[:40])


def _overrides(config: dict) -> str:
    from runner.flower_cli import toml_overrides

    return toml_overrides(config)


def _launch(config: dict, workdir: Path, kill_when: Path | None = None,
            module: str = "runner.launch") -> tuple[int, str]:
    """``python -m runner.launch`` for one run (``module``: another launcher with the same
    ``--supernodes`` and ``--run-config``, such as ``runner.deploy_local``); with ``kill_when``,
    SIGKILL the simulation process as soon as that file (a checkpoint) exists."""
    env = {**os.environ, "TMPDIR": str(workdir), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", module, "--supernodes", str(config.pop("supernodes")),
           "--run-config", _overrides(config)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if kill_when is not None:
        threading.Thread(target=_kill_when, args=(kill_when, str(workdir), proc), daemon=True).start()
    out = list(proc.stdout)
    return proc.wait(), "".join(out)


def _kill_when(path: Path, marker: str, launcher: subprocess.Popen) -> None:
    """SIGKILL the simulation started under ``marker`` once ``path`` exists. The file is polled every
    2 ms with the process found beforehand: a log line reaches the launcher's output seconds late,
    by when a fast method (majority: 25 ms a round) has finished its run."""
    pids: list[int] = []
    while launcher.poll() is None:
        pids = pids or simulation_pids(marker)
        if pids and path.exists():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.002 if pids else 0.2)


def simulation_pids(marker: str) -> list[int]:
    """The ``flwr-simulation`` processes (ServerApp + Ray driver) started under ``marker`` (in their environment)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"flwr-simulation" in cmd and marker.encode() in env:
            found.append(int(pid))
    return found


def _rows(path: Path) -> list[dict]:
    with open(path / "rounds.csv") as f:
        return list(csv.DictReader(f))


def fault_run(method: str, results: Path) -> dict:
    config = {"supernodes": 6, "method": method, "dataset": "digits", "num-server-rounds": 4, "faults.share": 0.3,
              "faults.kinds": FAULT_KINDS, "results-dir": str(results), "run-name": f"faults-{method}",
              "overwrite": True}
    with tempfile.TemporaryDirectory() as work:
        code, out = _launch(config, Path(work))
    folder = results / f"faults-{method}"
    dropped = json.loads((folder / "dropped.json").read_text()) if (folder / "dropped.json").exists() else []
    summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").exists() else {}
    reasons = sorted({_kind(d["reason"]) for d in dropped})
    row = {"method": method, "exit": code, "completed": code == 0 and bool(summary),
           "dropped": len(dropped), "final_acc": summary.get("final_acc"), "reasons": "; ".join(reasons)}
    if not row["completed"]:  # what went wrong, for the log (not a column of the table)
        row["output_tail"] = out[-3000:]
    return row


def resume_run(method: str, results: Path, supernodes: int = 4, rounds: int = 4, **overrides) -> dict:
    """An uninterrupted run, then the same run killed with SIGKILL as soon as round ``rounds - 2``'s
    checkpoint exists (``resumed_from`` says which checkpoint the kill left) and resumed with
    ``resume=true``; whether their rounds.csv agree but for timings."""
    base = {"supernodes": supernodes, "method": method, "dataset": "digits", "num-server-rounds": rounds,
            "results-dir": str(results), "overwrite": True, **overrides}
    with tempfile.TemporaryDirectory() as work:
        _launch({**base, "run-name": f"whole-{method}"}, Path(work))
    checkpoint = results / f"cut-{method}" / "checkpoints" / f"round-{rounds - 2:05d}.ckpt"
    with tempfile.TemporaryDirectory() as work:
        killed_code, killed_out = _launch({**base, "run-name": f"cut-{method}"}, Path(work), kill_when=checkpoint)
    with tempfile.TemporaryDirectory() as work:
        resumed = {k: v for k, v in base.items() if k != "overwrite"}
        code, out = _launch({**resumed, "run-name": f"cut-{method}", "resume": True}, Path(work))
    whole, cut = _untimed(results / f"whole-{method}"), _untimed(results / f"cut-{method}")
    resumed_from = re.search(r"resuming from the checkpoint of round (\d+)", out)
    row = {"method": method, "killed_exit": killed_code, "resumed_exit": code,
           "resumed_from": int(resumed_from.group(1)) if resumed_from else None,
           "rounds": int(cut[-1]["round"]) if cut else 0, "equal_to_uninterrupted": bool(cut) and whole == cut}
    if not row["equal_to_uninterrupted"]:  # what went wrong, for the log
        row["output_tails"] = [killed_out[-2000:], out[-2000:]]
    return row


def resume_lines(rows: list[dict]) -> list[str]:
    """``resume_run`` results as a markdown table; "equal metrics": every rounds.csv column but the
    timings is the uninterrupted run's."""
    lines = ["| method | rounds | killed run exit | resumed from round | resumed run exit | equal metrics |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        start = "-" if r.get("resumed_from") is None else r["resumed_from"]
        lines.append(f"| {r['method']} | {r['rounds']} | {r['killed_exit']} | {start} | {r['resumed_exit']} "
                     f"| {'yes' if r['equal_to_uninterrupted'] else 'NO'} |")
    return lines


def _untimed(folder: Path) -> list[dict]:
    """A run's rounds.csv without its timings (empty when the run wrote none)."""
    if not (folder / "rounds.csv").exists():
        return []
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in _rows(folder)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="")
    parser.add_argument("--resume-methods", default="fedavg,ditto,fedproto")
    parser.add_argument("--out", type=Path, default=Path("docs/results/reliability"))
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write a docs/ table from uncommitted code (to try things)")
    args = parser.parse_args(argv)
    from fedcore.registry import REGISTRY
    from runner.provenance import guard, made_by

    guard(args.out, args.allow_dirty)  # a docs/ table is made from committed code only
    made = made_by("benchmarks.reliability", argv)

    methods = args.methods.split(",") if args.methods else list(REGISTRY)
    args.out.mkdir(parents=True, exist_ok=True)
    results = Path(tempfile.mkdtemp(prefix="reliability-"))
    faults = []
    for m in methods:
        t0 = time.monotonic()
        faults.append(fault_run(m, results))
        print(f"faults {m}: {faults[-1]} ({time.monotonic() - t0:.0f} s)", flush=True)
    resumes = []
    for m in args.resume_methods.split(","):
        resumes.append(resume_run(m, results))
        print(f"resume {m}: {resumes[-1]}", flush=True)
    with open(args.out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["method", "exit", "completed", "dropped", "final_acc", "reasons"], extrasaction="ignore")
        w.writeheader()
        w.writerows(faults)
    lines = [made, "", "Faults: 6 clients, digits, 4 rounds, 30% of clients faulty every round (kinds: "
             f"{FAULT_KINDS}), through `flwr run`.", "",
             "| method | completed | exit | replies dropped | final acc | drop reasons |", "|---|---|---|---|---|---|"]
    for r in faults:
        acc = "-" if r["final_acc"] is None else f"{100 * r['final_acc']:.1f}"
        lines.append(f"| {r['method']} | {'yes' if r['completed'] else 'NO'} | {r['exit']} | {r['dropped']} | {acc} "
                     f"| {r['reasons']} |")
    lines += ["", "Resume: the simulation process killed with SIGKILL once round 2 of 4 is checkpointed, then the same "
              "command with `resume=true`; compared with an uninterrupted run of the same seed.", "",
              *resume_lines(resumes)]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print((args.out / "table.md").read_text())
    return 0 if all(r["completed"] for r in faults) and all(r["equal_to_uninterrupted"] for r in resumes) else 1


if __name__ == "__main__":
    sys.exit(main())
