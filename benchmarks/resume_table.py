"""Resume after SIGKILL, every method, through a real ``flwr run``: the table in docs/reliability.md.

    python -m benchmarks.resume_table [--methods fedavg,ditto] [--supernodes 3] [--rounds 4]

For each method (``benchmarks.reliability.resume_run``): an uninterrupted run; the same run with its
simulation process (ServerApp and Ray driver) killed with SIGKILL as soon as round ``rounds - 2``'s
checkpoint exists; the same command again with ``resume=true``. "equal
metrics": every rounds.csv column but the timings is the uninterrupted run's. The doc's "Resume
after SIGKILL" section is replaced (the rest of the doc is kept) and names the commit and settings
it came from.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.reliability import ROOT, resume_lines, resume_run
from runner.provenance import guard, made_by

HEADING = "## Resume after SIGKILL"


def replace_section(text: str, section: str) -> str:
    """``text`` with its HEADING section (up to the next ``## `` heading) replaced by ``section``;
    appended when there is none, under a title when the doc is new."""
    start = text.find(HEADING)
    if start < 0:
        return (text.rstrip() + "\n\n" if text.strip() else "# Reliability\n\n") + section
    end = text.find("\n## ", start + len(HEADING))
    return text[:start] + section + ("\n" + text[end + 1:] if end >= 0 else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="", help="comma-separated; default: every registered method")
    parser.add_argument("--supernodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "reliability.md")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write a docs/ table from uncommitted code (it then says so in bold)")
    args = parser.parse_args(argv)
    dirty = guard(args.doc, args.allow_dirty)  # a docs/ table is made from committed code only
    made = made_by("benchmarks.resume_table", argv)  # the full command and commit, taken before anything runs
    import flwr
    import torch

    from fedcore.registry import REGISTRY

    methods = args.methods.split(",") if args.methods else list(REGISTRY)
    rows, started = [], time.monotonic()
    with tempfile.TemporaryDirectory(prefix="resume-table-") as results:
        for i, method in enumerate(methods, 1):
            t0 = time.monotonic()
            print(f"[{i}/{len(methods)}] {method}: uninterrupted, killed, resumed ...", flush=True)
            rows.append(resume_run(method, Path(results), supernodes=args.supernodes, rounds=args.rounds))
            print(f"[{i}/{len(methods)}] {rows[-1]} ({time.monotonic() - t0:.0f} s)", flush=True)
    section = "\n".join([
        HEADING, "", made + (" **Not from committed code.**" if dirty else ""), "",
        f"Every method through a real `flwr run` (Ray simulation, {args.supernodes} SuperNodes, dataset digits, "
        f"default partition and seed, {args.rounds} rounds): an uninterrupted run; the same run with its "
        f"simulation process (ServerApp and Ray driver) killed with SIGKILL as soon as round {args.rounds - 2}'s "
        "checkpoint existed (\"resumed from\" names the newest checkpoint the kill left); the same command again "
        "with `resume=true`. "
        "\"equal metrics\": every rounds.csv column but the timings (accuracies, losses, bytes, replies, "
        f"method metrics) equals the uninterrupted run's. flwr {flwr.__version__}, torch {torch.__version__}, "
        f"{(time.monotonic() - started) / 60:.0f} min in all; the long test "
        "`test_a_run_killed_mid_round_resumes_to_the_uninterrupted_result` checks the same for every method.",
        "", *resume_lines(rows), ""])
    doc = args.doc
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(replace_section(doc.read_text() if doc.exists() else "", section))
    print(section)
    return 0 if all(r["equal_to_uninterrupted"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
