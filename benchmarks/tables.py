"""Rebuild every comparison table in docs/results from its preset (``make tables``), then refresh the copies of those
tables in README.md and docs/ (``make readme``).

A preset is a conf/**/*.toml whose ``[compare].output`` lies under docs/results. Presets on data this machine cannot
load (CIFAR, FEMNIST, ... need a download; Fashion-MNIST needs ``make data``) are listed as skipped, with the reason;
``--list`` also says which tables were never run. Runs that
finished earlier with the same config are reused (``--reuse``) and a comparison's runs cut off part way continue
from their checkpoints (``--resume``), so a rebuild cut off part way goes on where it stopped (only while their
source hash and config still match). From a clean tree only (``--allow-dirty`` to
try things). The other tables in docs/results come from their own benchmarks (``make bench-server``, ``make bench-sim``,
``make bench-deploy``, ``python -m benchmarks.reliability``), named in ``BENCHMARKS`` and run with ``--benchmarks``.

    python -m benchmarks.tables [--only fedsac-mnist5k] [--list] [--benchmarks]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from runner.compare_presets import sweep_grid
from runner.progress import study_env
from runner.provenance import uncommitted

ROOT = Path(__file__).resolve().parents[1]
OFFLINE_DATASETS = ("digits", "mnist5k", "synthetic")  # embedded or generated: always available

# docs/results folders that no compare preset writes, and the command that does
BENCHMARKS = {
    "server-time": ["-m", "benchmarks.server_time", "--clients", "10,100,1000", "--out", "docs/results/server-time"],
    "sim-speed": ["-m", "benchmarks.sim_speed", "--methods", "fedavg,fedproto,ditto", "--clients", "20", "--rounds",
                  "50", "--out", "docs/results/sim-speed"],
    "deployed-round": ["-m", "benchmarks.deployed_round", "--supernodes", "2,4", "--out", "docs/results/deployed-round"],
    "fedsac-self-weight": ["-m", "benchmarks.studies.fedsac_self_weight", "--rounds", "20", "--out",
                           "docs/results/fedsac-self-weight"],
    "peravg-test-adaptation": ["-m", "benchmarks.studies.peravg_test_adaptation", "conf/fedmcsa-fmnist-mlr.toml", "--out",
                               "docs/results/peravg-test-adaptation"],
}

# presets whose folder holds more than the comparison writes (a traffic table): the module that runs the preset and
# writes that too, called with the preset and --reuse like runner.compare (a [sweep] grid's rows and its sweep.md
# are runner.compare's own)
BUILDERS = {
    "fedfcd-mnist5k-bytes": "benchmarks.studies.fedfcd_bytes",  # + traffic.md
}


@dataclass(frozen=True)
class Preset:
    path: Path
    output: str
    dataset: str
    runs: int  # (row, seed) runs it makes

    @property
    def name(self) -> str:
        """conf/<name>.toml; a preset in a sub-folder of conf/ is named <folder>/<stem>."""
        return self.path.stem if self.path.parent.name == "conf" else f"{self.path.parent.name}/{self.path.stem}"

    @property
    def builder(self) -> str:
        """The module that rebuilds this preset's folder."""
        return BUILDERS.get(self.name, "runner.compare")


def presets(root: Path = ROOT) -> list[Preset]:
    """Every preset whose table lands in docs/results, in file-name order."""
    found = []
    for path in sorted((root / "conf").glob("**/*.toml")):
        data = tomllib.loads(path.read_text())
        compare = data.get("compare", {})
        output = compare.get("output", "")
        if not output.startswith("docs/results/"):
            continue
        own_rows = [m for m in compare.get("methods", []) if "runs-of" not in data.get("variants", {}).get(m, {})]
        grid_points = len(sweep_grid(data))
        found.append(Preset(path, output, data.get("run-config", {}).get("dataset", "mnist5k"),
                            (len(own_rows) + grid_points) * len(compare.get("seeds", [0]))))
    return found


def available(preset: Preset, data_dir: Path | None = None) -> bool:
    """Whether its data loads here without a download: embedded, generated, installed (Debian's package) or
    already in the dataset cache."""
    if preset.dataset in OFFLINE_DATASETS:
        return True
    from partitions.datasets import DatasetUnavailable, check_available

    try:
        where = check_available(preset.dataset, str(data_dir or ""))
    except DatasetUnavailable:
        return False
    return not where.startswith("the hub")  # a download is not run by a table rebuild


def stamp(preset: Preset) -> str:
    """'not yet run', or the commit line of the table.md that its last build wrote."""
    table = ROOT / preset.output / "table.md"
    if not table.exists():
        return "not yet run"
    made = re.search(r"at commit `([^`]+)`", table.read_text())
    return f"table.md of commit {made.group(1)}" if made else "table.md present"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated substrings of preset names to rebuild")
    parser.add_argument("--list", action="store_true", help="list the presets and what each runs; run nothing")
    parser.add_argument("--benchmarks", action="store_true", help="also run the benchmarks that write the other tables")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="build from uncommitted code (to try things: every table says so in bold)")
    args = parser.parse_args(argv)
    wanted = [w for w in args.only.split(",") if w]
    chosen = [p for p in presets() if not wanted or any(w in p.name for w in wanted)]
    for p in chosen:
        state = (f"ready, {stamp(p)}" if available(p)
                 else f"skipped: {p.dataset} is not embedded, installed or downloaded here")
        print(f"{p.name:40s} {p.runs:4d} runs  -> {p.output}  ({state}; {p.builder})")
    if args.list:
        return 0
    changed = uncommitted()
    if changed and not args.allow_dirty:
        raise SystemExit(f"refusing to rebuild docs/ tables from a tree with uncommitted changes ({', '.join(changed[:8])}"
                         f"{' ...' if len(changed) > 8 else ''}): commit first, or pass --allow-dirty to try things")
    failed = []
    ready = [p for p in chosen if available(p)]
    # one progress line for the whole study: each comparison counts its runs into these (runner/progress.py)
    total, done, t0 = sum(p.runs for p in ready), 0, time.time()
    for i, p in enumerate(ready, 1):
        print(f"== {p.name} (preset {i}/{len(ready)}; runs {done}/{total} before it)", flush=True)
        go_on = "--resume" if p.builder == "runner.compare" else "--reuse"  # resume: cut-off runs continue
        rc = subprocess.run([sys.executable, "-m", p.builder, str(p.path.relative_to(ROOT)), go_on,
                             *(["--allow-dirty"] if args.allow_dirty else [])],
                            cwd=ROOT, env={**os.environ, **study_env(done, total, t0)}).returncode
        done += p.runs
        if rc:
            failed.append(p.name)
    if args.benchmarks:
        for name, cmd in BENCHMARKS.items():
            if wanted and not any(w in name for w in wanted):
                continue
            print(f"== {name}", flush=True)
            if subprocess.run([sys.executable, *cmd], cwd=ROOT).returncode:
                failed.append(name)
    subprocess.run([sys.executable, "-m", "benchmarks.summary"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "benchmarks.readme_tables"], cwd=ROOT, check=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
