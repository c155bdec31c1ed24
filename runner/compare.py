"""Compare methods side by side on one setting, through the real ``flwr run`` simulation.

A preset (TOML, in conf/) fixes the setting; every entry runs on the same partition, model and
budget, for each seed. Output in the preset's ``output`` folder:

- ``table.md`` / ``table.csv``: one row per entry, mean ± std over seeds; with a validation split
  (``val-fraction`` in the preset's run config, 0.1 in the shipped presets) the headline is the test
  accuracy at the round best on validation, else the best-of-test accuracy, marked optimistic,
- ``curves.png`` and ``headline.png``: the accuracy curves (± one std over seeds, a zoom on the last
  half) and each entry's headline with its 95% interval over seeds (runner/figures.py),
- ``runs/<label>-s<seed>/``: each run's own results.

- ``runs.json.gz``: every run's per-round accuracies, per-client final accuracy and provenance
  (``runner.run_data``): the table recomputes from it, and it is committed with the table.

    python -m runner.compare conf/mnist5k-pathological.toml [--methods local,fedavg] [--seeds 0,1] [--reuse]

``--resume`` does what ``--reuse`` does and continues each run that was cut off (its folder holds checkpoints
and its start record, ``<run-name>.started.json``, this source hash and config) from its last checkpoint; a
resumed run repeats the uninterrupted one bit for bit, and its provenance names the commit that began it.

A table under docs/ is made from committed code only (``--allow-dirty`` to try things; the table then says so in
bold). Each run folder records its commit, a hash of the source packages and its resolved config
(``runner.provenance``); ``--reuse`` keeps a completed run in ``runs/`` only while both still match (where its
folder is gone, its record in the committed ``runs.json.gz`` on the same terms), and says how many it kept and
from which commits; the table lists the commits its runs came from. ``--table-only --runs-source HASH`` tables
the committed runs of an earlier source hash instead (seeds added later at the runs' own commit). ± is the sample
std over seeds; the paper method's row is compared with every other row seed by seed (``runner.stats``).

Preset format::

    [compare]
    methods = ["local", "fedavg", "fedprox-0.1", "R-pfedpm"]   # labels: a method name or a variant
    seeds = [0, 1, 2]
    supernodes = 20
    output = "results/compare/mnist5k-pathological"   # relative to the app directory
    engine = "flwr"          # or "inprocess": same ServerApp and ClientApp in one process, no Ray
    jobs = 1                 # inprocess only: runs in parallel processes, one thread each
    target-acc = 0.9         # optional: a "rounds to 90%" column (first round each run reaches it)

    tuned = "tuned/mnist5k-pathological.toml"   # optional, beside the preset: each method's hyperparameters
                             # as chosen on validation by `python -m benchmarks.tune` (fedcore/tuning_grid.py)

    [run-config]             # shared run-config keys
    dataset = "mnist5k"

    [method-config.fedprox]  # extra keys for one label
    "fedprox.mu" = 0.01

    [variants.fedprox-0.1]   # a labelled variant: a method with its own options
    method = "fedprox"
    "fedprox.mu" = 0.1

    [variants.R-pfedpm]      # a row read from another entry's runs (no runs of its own):
    runs-of = "pfedpm"       # the relation module's accuracy that pfedpm reports beside its head's
    accuracy = "eval_relation_acc"

    [sweep]                  # optional: a grid of rows after the listed ones, one variant of `method` per
    method = "fedfcd"        # combination of the run-config values below (the last key varies fastest)
    label = "fedfcd-lam{fedfcd.lambda:g}-lr{lr:g}"   # optional: each {key[:format]} filled from the row
    "fedfcd.lambda" = [0.0, 1.0, 5.0]
    lr = [0.01, 0.05]

    [paper]                  # optional: the paper's numbers, shown beside ours in the paper's metric
    metric = "client mean"   # or "weighted" / "pooled" (the same here: all clients' test samples together)
    data = "MNIST"           # optional: the paper's data where it differs from ours (shown in the header)
    values = { fedavg = 88.1, pfedpm = 98.5 }

``python -m runner.compare --rerender docs/results/<name>`` rewrites a table.md from its table.csv and
preset.json with the current code (a new column or header, no run). Each table says which command and commit made it.

The work is split by concern: ``runner.compare_presets`` (the preset, its rows and run configs, the sweep's grid),
``runner.compare_jobs`` (reuse, resume, running the jobs), ``runner.compare_rows`` (means, stds, paired
differences) and ``runner.compare_table`` (table.md / table.csv); this module runs them in order.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
import time
from pathlib import Path

from runner import provenance, run_data
from runner.compare_jobs import (
    refuse_to_drop_committed, resumable_jobs, reuse_finished, run_jobs, study_progress,
)
from runner.compare_presets import Entry, entries, load_preset, run_config
from runner.compare_rows import table_rows
from runner.compare_table import render_sweep, rerender, write_table


def run_all(preset: dict, app_dir: Path, labels: list[str] | None = None, seeds: list[int] | None = None,
            reuse: bool = False, table_only: bool = False, allow_dirty: bool = False, resume: bool = False,
            runs_source: str | None = None) -> Path:
    """Run the preset's (label, seed) jobs and write the table. ``reuse`` keeps finished runs; ``resume`` also
    continues the cut-off ones from their checkpoints where they began under the same source and config;
    ``table_only`` runs nothing and tables the finished runs there are (rows name their seed count).
    ``runs_source`` (with ``table_only``): table the runs made under that earlier source hash instead of the
    current one, so seeds added later at the runs' own commit join a table whose runs' code has since moved on.
    A table under docs/ needs a clean tree unless ``allow_dirty`` (``provenance.guard``)."""
    if runs_source and not table_only:
        raise SystemExit("--runs-source tables runs made earlier: it needs --table-only (runs are made by the "
                         "current source only)")
    spec = preset["compare"]
    rows_of = entries(preset, labels)
    seeds = seeds if seeds is not None else spec.get("seeds", [0])
    out = (app_dir / spec.get("output", "results/compare")).resolve()
    dirty = provenance.guard(out, allow_dirty)
    code = provenance.stamp()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    jobs = [(e, s) for e in rows_of if e.runs_of is None for s in seeds]
    planned = len(jobs)
    results: dict[str, list[dict]] = {e.label: [] for e in rows_of}
    commits: dict[str, list[str]] = {}  # commit -> the runs ("label-s<seed>") made there
    runs_code = {**code, "source_hash": runs_source} if runs_source else code
    if reuse or table_only or resume:
        jobs = reuse_finished(preset, jobs, out, runs_code, results, commits)
    if table_only:
        refuse_to_drop_committed(out, jobs, runs_code["source_hash"])
    if runs_source and not commits:  # a mistyped hash would table nothing over the committed table: refuse
        found = sorted({r.get("source_hash") for r in run_data.by_run(out).values()} - {None})
        raise SystemExit(f"--runs-source {runs_source}: no finished run of {out} has that source hash and this "
                         f"preset's config (its committed runs have: {', '.join(found) or 'none'}); nothing written")
    resumed = resumable_jobs(preset, jobs, out, code) if resume and not table_only else set()
    failures = []
    if table_only:
        failures += [f"{entry.label} seed {seed}: not run" for entry, seed in jobs]
        jobs = []
    started = time.monotonic()
    progress = study_progress(preset, jobs, out, app_dir, reused=planned - len(jobs) - len(failures))
    engine = spec.get("engine", "flwr")
    if engine not in ("flwr", "inprocess"):
        raise SystemExit(f"engine must be 'flwr' or 'inprocess', got {engine!r}")

    def record(i: int, entry: Entry, seed: int, result: dict, seconds: float) -> None:
        progress.finished(f"{entry.label}-s{seed}")
        summary = result["summary"]
        if result["status"] != "finished:completed" or summary is None:
            failures.append(f"{entry.label} seed {seed}: {result['status']} {result['details']}")
            print(f"[{i}/{len(jobs)}] {entry.label} seed {seed} FAILED: {result['status']} {result['details']}",
                  flush=True)
            return
        results[entry.label].append(summary)
        provenance.record(Path(summary["results_dir"]), code, run_config(preset, entry, seed, out))
        commits.setdefault(code["commit"], []).append(f"{entry.label}-s{seed}")
        chosen = (f"at best-val round {100 * summary['test_acc_at_best_val']:.2f}%"
                  if summary.get("test_acc_at_best_val") is not None else
                  f"best-of-test {100 * summary['best_acc']:.2f}%")
        print(f"[{i}/{len(jobs)}] {entry.label} seed {seed}: final acc {100 * summary['final_acc']:.2f}%  "
              f"{chosen}  {seconds:.0f} s (total {time.monotonic() - started:.0f} s)", flush=True)

    run_jobs(preset, jobs, out, app_dir, code, resumed, record)
    preset.setdefault("made", {}).setdefault("command", "runner.compare.run_all (called from Python)")
    preset["made"].update({"commit": code["commit"], "source_hash": runs_code["source_hash"], "dirty": dirty,
                            "commits": {c: sorted(r) for c, r in commits.items()}})
    if runs_source:
        preset["made"]["table_source_hash"] = code["source_hash"]
    preset["std"] = "sample"
    spec["seeds"] = list(seeds)  # the seeds asked for (--seeds too): rows with fewer are labelled, rerender reads it
    run_data.write(out, [s.get("_record") or run_data.collect(Path(s["results_dir"]), e.label, s["seed"], code)
                         for e in rows_of if e.runs_of is None for s in results[e.label]])
    progress.stop()
    write_table(table_rows(rows_of, results, preset), out, preset, failures)
    if "sweep" in preset:  # the grid ranked on validation
        (out / "sweep.md").write_text(render_sweep(preset, results))
    (out / "preset.json").write_text(json.dumps(preset, indent=2))  # what made the table: rerender and tests read it
    from runner.figures import write_figures

    write_figures(out, preset, [e.label for e in rows_of], seeds)  # curves.png, headline.png
    print((out / "table.md").read_text())
    if failures:
        print("failed runs:\n  " + "\n  ".join(failures), file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", type=Path, nargs="?")
    parser.add_argument("--rerender", type=Path, metavar="DIR", nargs="+",
                        help="rewrite DIR/table.md from its table.csv and preset.json with the current code; run nothing")
    parser.add_argument("--methods", help="comma-separated subset of the preset's labels")
    parser.add_argument("--seeds", help="comma-separated seeds (default: the preset's)")
    parser.add_argument("--app", type=Path, default=Path("."))
    parser.add_argument("--reuse", action="store_true",
                        help="keep completed runs whose saved config matches instead of running them again")
    parser.add_argument("--resume", action="store_true",
                        help="as --reuse, and continue each run cut off under the same source and config from its "
                             "last checkpoint instead of starting it over")
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing: table the completed runs there are, with each row's number of seeds")
    parser.add_argument("--runs-source", metavar="HASH",
                        help="with --table-only: table the committed runs made under this earlier source hash")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write a docs/ table from uncommitted code (to try things: the table says so in bold)")
    parser.add_argument("--tracker", help="run-config tracker of every run (tensorboard, wandb): grouped by the preset")
    args = parser.parse_args(argv)
    if args.rerender:
        for folder in args.rerender:
            print(rerender(folder, args.allow_dirty))
        return 0
    if args.preset is None:
        parser.error("a preset is needed (or --rerender DIR)")
    if args.preset.suffix == ".toml" and "study" in tomllib.loads(args.preset.read_text()):  # a study across tables
        from runner import study  # built from their committed runs: nothing runs

        print(study.build(args.preset, args.app.resolve(), argv, args.allow_dirty))
        return 0
    preset = load_preset(args.preset)
    if args.tracker:
        preset.setdefault("run-config", {})["tracker"] = args.tracker
    preset["made"] = {"command": provenance.command_line("runner.compare", argv)}
    labels = args.methods.split(",") if args.methods else None
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    run_all(preset, args.app.resolve(), labels, seeds, reuse=args.reuse, table_only=args.table_only,
            allow_dirty=args.allow_dirty, resume=args.resume, runs_source=args.runs_source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
