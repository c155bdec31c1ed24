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

    [paper]                  # optional: the paper's numbers, shown beside ours in the paper's metric
    metric = "client mean"   # or "weighted" / "pooled" (the same here: all clients' test samples together)
    data = "MNIST"           # optional: the paper's data where it differs from ours (shown in the header)
    values = { fedavg = 88.1, pfedpm = 98.5 }

``python -m runner.compare --rerender docs/results/<name>`` rewrites a table.md from its table.csv and
preset.json with the current code (a new column or header, no run). Each table says which command and commit made it.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import sys
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runner import provenance, run_data, stats
from runner.launch import simulate

COLUMNS = ["method", "final_acc", "final_acc_std", "client_acc_mean", "client_acc_mean_std",
           "test_acc_at_best_val", "test_acc_at_best_val_std", "test_client_acc_mean_at_best_val",
           "test_client_acc_mean_at_best_val_std", "best_acc", "best_acc_std", "best_client_acc_mean",
           "best_client_acc_mean_std", "last10_acc", "last10_acc_std", "mb_up_per_round", "mb_down_per_round",
           "wall_s_per_round", "seeds"]
TARGET_COLUMNS = ["rounds_to_target", "rounds_to_target_std", "runs_reaching_target"]
PAIRED_COLUMNS = ["paired_vs", "paired_metric", "diff_mean", "diff_lo", "diff_hi", "diff_n"]
PAPER_METHODS = ("pfedpm", "fedmcsa", "fedfcd", "mupfl", "fedsac")  # a table's focus: the first of its labels here


@dataclass(frozen=True)
class Entry:
    """One row of the comparison: its label, the method it runs and the options it adds.

    ``runs_of`` names another entry whose runs this row reads (no runs of its own), and
    ``accuracy`` the results column it reports instead of the personalised accuracy.
    """

    label: str
    method: str
    config: dict = field(default_factory=dict)
    runs_of: str | None = None
    accuracy: str | None = None

    @property
    def run_label(self) -> str:
        return self.runs_of or self.label


def load_preset(path: Path) -> dict:
    preset = tomllib.loads(Path(path).read_text())
    if "compare" not in preset or "methods" not in preset["compare"]:
        raise SystemExit(f"{path}: needs a [compare] table with a 'methods' list")
    target = preset["compare"].get("target-acc")
    if target is not None and not (isinstance(target, (int, float)) and 0 < target <= 1):
        raise SystemExit(f"{path}: target-acc is an accuracy in (0, 1], got {target!r}")
    if "tuned" in preset["compare"]:  # the tuning protocol's choices, under the preset's own options
        from fedcore.tuning_grid import load_tuned

        preset["tuned-config"] = load_tuned(Path(path).parent / preset["compare"]["tuned"])
    entries(preset)  # fail early on a bad variant
    check_paper_table(preset, str(path))
    return preset


def entries(preset: dict, labels: list[str] | None = None) -> list[Entry]:
    """The preset's rows, in order, resolved to methods and options."""
    variants = preset.get("variants", {})
    labels = labels or preset["compare"]["methods"]
    out = []
    for label in labels:
        variant = dict(variants.get(label, {}))
        runs_of = variant.pop("runs-of", None)
        accuracy = variant.pop("accuracy", None)
        if runs_of is not None:
            if runs_of not in labels:
                raise SystemExit(f"variant {label!r} reads the runs of {runs_of!r}, which is not in the list")
            base = variants.get(runs_of, {})
            method = base.get("method", runs_of)
        else:
            method = variant.pop("method", label)
        config = {**preset.get("tuned-config", {}).get(method, {}), **preset.get("method-config", {}).get(label, {}),
                  **variant}
        out.append(Entry(label, method, config, runs_of, accuracy))
    return out


def run_config(preset: dict, entry: Entry, seed: int, out: Path) -> dict:
    return {**preset.get("run-config", {}), **entry.config, "method": entry.method, "seed": seed,
            "results-dir": str(out / "runs"), "run-name": f"{entry.label}-s{seed}", "tracker-group": out.name}


def job_config(preset: dict, entry: Entry, seed: int, out: Path, resume: bool = False) -> dict:
    """What a job runs: its run config, replacing whatever its folder holds (a cut-off or older run of
    the comparison; ``--reuse`` has already kept the finished ones that match), or with ``resume``
    continuing the cut-off run there from its last checkpoint."""
    return {**run_config(preset, entry, seed, out), **({"resume": True} if resume else {"overwrite": True})}


def _run_folder(config: dict) -> Path:
    return Path(config["results-dir"]) / config["run-name"]


def _run_inprocess(config: dict, supernodes: int, code: dict | None = None) -> dict:
    """One in-process run in a worker process with one torch thread (what ``jobs`` parallelises). With the
    comparison's ``code`` stamp, a fresh run first leaves its start record (``provenance.mark_started``)."""
    import torch

    torch.set_num_threads(1)
    from runner.inprocess import run_inprocess

    if code is not None and not config.get("resume"):
        provenance.mark_started(_run_folder(config), code, config)

    try:
        summary, _ = run_inprocess(config, supernodes)
        return {"status": "finished:completed", "details": "", "summary": summary}
    except Exception as err:  # reported as a failed run, as flwr ls would
        return {"status": "finished:failed", "details": repr(err), "summary": None}


def finished_run(config: dict, code: dict) -> tuple[dict | None, str]:
    """The summary of a completed earlier run this one may reuse (``--reuse``), or None and why not.

    The run's provenance record must carry ``code``'s source hash and its resolved config every key of
    ``config`` with the same value; a run that was cut off has no ``summary.json`` and is not reused."""
    folder = Path(config["results-dir"]) / config["run-name"]
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None, "not finished"
    if summary.get("status") != "completed":
        return None, "not completed"
    keep, why = provenance.reusable(folder, config, code)
    return (summary, "") if keep else (None, why)


def committed_run(record: dict | None, config: dict, code: dict) -> tuple[dict | None, str]:
    """The summary of a completed run kept in the table's committed per-run data (``runs.json.gz``) whose folder
    is not here (a fresh clone or machine), on the terms of ``finished_run``: this source hash and config. A
    table too long for one sitting so grows across machines: each sitting commits the runs it finished."""
    if record is None:
        return None, "not finished"
    if record.get("status") != "completed":
        return None, "not completed"
    keep, why = provenance.matches(record, config, code)
    return ({**run_data.summary(record), "_record": record}, "") if keep else (None, why)


def _reuse(preset: dict, jobs: list, out: Path, code: dict, results: dict, commits: dict) -> list:
    """Keep the finished runs that still match (source and config), from their folders or, where a folder is
    not here, from the committed per-run data; say how many and from which commits."""
    left, dropped = [], {}
    committed = run_data.by_run(out)
    for entry, seed in jobs:
        config = run_config(preset, entry, seed, out)
        summary, why = finished_run(config, code)
        if summary is None and why == "not finished":
            summary, why = committed_run(committed.get((entry.label, seed)), config, code)
        if summary is None:
            left.append((entry, seed))
            if why not in ("not finished", "not completed"):
                dropped[why] = dropped.get(why, 0) + 1
            continue
        results[entry.label].append(summary)
        commit = summary["commit"] if "_record" in summary else provenance.read(Path(summary["results_dir"]))["commit"]
        commits.setdefault(commit, []).append(f"{entry.label}-s{seed}")
    kept = sum(len(v) for v in commits.values())
    origin = ", ".join(f"{c} ({len(v)})" for c, v in sorted(commits.items())) or "-"
    redo = "; ".join(f"{n} not kept: {why}" for why, n in sorted(dropped.items()))
    print(f"reuse: kept {kept} of {len(jobs)} runs, from commits {origin}" + (f"; {redo}" if redo else ""), flush=True)
    return left


def _refuse_to_drop_committed(out: Path, left: list, source_hash: str) -> None:
    """--table-only rewrites runs.json.gz with the runs it tables: refuse, before writing, where that would drop
    committed runs of another source hash (the runs a table was made from), and name the flag that tables them."""
    committed = run_data.by_run(out)
    lost = [committed[(e.label, s)] for e, s in left
            if (e.label, s) in committed and committed[(e.label, s)].get("source_hash") != source_hash]
    if lost:
        hashes = sorted({str(r.get("source_hash")) for r in lost})
        raise SystemExit(f"--table-only would drop {len(lost)} committed run(s) of {out} made under source hash "
                         f"{', '.join(hashes)} (this tables {source_hash}'s): table them with --runs-source "
                         f"{hashes[0]}, or run them again with --reuse; nothing written")


def resume_point(config: dict, code: dict) -> tuple[int | None, str]:
    """The checkpoint round ``config``'s cut-off run goes on from (noted in its start record), or None and why it
    starts over (``provenance.resumable``)."""
    at, why = provenance.resumable(_run_folder(config), config, code)
    if at is not None:
        provenance.note_resumed(_run_folder(config), at)
    return at, why


def _resumable(preset: dict, jobs: list, out: Path, code: dict) -> set:
    """The (label, seed) jobs whose cut-off run may continue from its checkpoint (``provenance.resumable``: begun
    under this source and config), each one's round noted in its start record; says which, from which round, and
    why the others start over."""
    resumed, fresh = {}, {}
    for entry, seed in jobs:
        at, why = resume_point(run_config(preset, entry, seed, out), code)
        if at is None:
            fresh[why] = fresh.get(why, 0) + 1
            continue
        resumed[(entry.label, seed)] = f"{entry.label}-s{seed} at round {at}"
    again = "; ".join(f"{n} start over: {why}" for why, n in sorted(fresh.items()))
    if jobs:
        print(f"resume: {len(resumed)} of {len(jobs)} runs left continue from their checkpoints"
              + (f" ({', '.join(resumed.values())})" if resumed else "") + (f"; {again}" if again else ""), flush=True)
    return set(resumed)


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
        jobs = _reuse(preset, jobs, out, runs_code, results, commits)
    if table_only:
        _refuse_to_drop_committed(out, jobs, runs_code["source_hash"])
    if runs_source and not commits:  # a mistyped hash would table nothing over the committed table: refuse
        found = sorted({r.get("source_hash") for r in run_data.by_run(out).values()} - {None})
        raise SystemExit(f"--runs-source {runs_source}: no finished run of {out} has that source hash and this "
                         f"preset's config (its committed runs have: {', '.join(found) or 'none'}); nothing written")
    resumed = _resumable(preset, jobs, out, code) if resume and not table_only else set()
    failures = []
    if table_only:
        failures += [f"{entry.label} seed {seed}: not run" for entry, seed in jobs]
        jobs = []
    started = time.monotonic()
    progress = _progress(preset, jobs, out, app_dir, reused=planned - len(jobs) - len(failures))
    supernodes = spec.get("supernodes", 10)
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

    if engine == "inprocess":
        workers = max(1, int(spec.get("jobs", 1)))
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        from runner.inprocess import pool_context

        configs = [job_config(preset, e, s, out, resume=(e.label, s) in resumed) for e, s in jobs]
        context = pool_context(*(c.get("device", "auto") for c in configs))
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            t0 = time.monotonic()
            futures = [pool.submit(_run_inprocess, config, supernodes, code) for config in configs]
            print(f"{len(jobs)} in-process runs on {workers} worker(s) ...", flush=True)
            for i, ((entry, seed), future) in enumerate(zip(jobs, futures), 1):
                record(i, entry, seed, future.result(), time.monotonic() - t0)
    else:
        for i, (entry, seed) in enumerate(jobs, 1):
            print(f"[{i}/{len(jobs)}] {entry.label} seed {seed} ...", flush=True)
            t0 = time.monotonic()
            config = job_config(preset, entry, seed, out, resume=(entry.label, seed) in resumed)
            if not config.get("resume"):
                provenance.mark_started(_run_folder(config), code, config)
            result = simulate(config, supernodes=supernodes, app_dir=app_dir,
                              cpus_per_client=spec.get("cpus-per-client", 1),
                              gpus_per_client=spec.get("gpus-per-client"), stream=spec.get("stream", False))
            record(i, entry, seed, result, time.monotonic() - t0)
    preset.setdefault("made", {}).setdefault("command", "runner.compare.run_all (called from Python)")
    preset["made"].update({"commit": code["commit"], "source_hash": runs_code["source_hash"],
                                          "dirty": dirty, "commits": {c: sorted(r) for c, r in commits.items()}})
    if runs_source:
        preset["made"]["table_source_hash"] = code["source_hash"]
    preset["std"] = "sample"
    spec["seeds"] = list(seeds)  # the seeds asked for (--seeds too): rows with fewer are labelled, rerender reads it
    run_data.write(out, [s.get("_record") or run_data.collect(Path(s["results_dir"]), e.label, s["seed"], code)
                         for e in rows_of if e.runs_of is None for s in results[e.label]])
    progress.stop()
    write_table(table_rows(rows_of, results, preset), out, preset, failures)
    (out / "preset.json").write_text(json.dumps(preset, indent=2))  # what made the table: rerender and tests read it
    from runner.figures import write_figures

    write_figures(out, preset, [e.label for e in rows_of], seeds)  # curves.png, headline.png
    print((out / "table.md").read_text())
    if failures:
        print("failed runs:\n  " + "\n  ".join(failures), file=sys.stderr)
    return out


def table_rows(rows_of: list[Entry], results: dict[str, list[dict]], preset: dict) -> list[dict]:
    """The table's rows from each entry's run summaries (a ``runs-of`` row reads its source's): mean ± sample std,
    rounds to target, and the paper method's paired difference to every row (``stats.paired_difference``)."""
    by_run, results = results, {e.label: results.get(e.run_label, []) for e in rows_of}
    target = preset["compare"].get("target-acc")
    rows, by_label = [], {}
    for e in rows_of:
        if results[e.label]:
            rows.append(aggregate_row(e.label, results[e.label], e.accuracy))
            by_label[e.label] = e
            if target is not None:
                rounds = [rounds_to_target(s.get("_rounds") or Path(s["results_dir"]) / "rounds.csv",
                                           e.accuracy or "acc_weighted", target) for s in results[e.label]]
                rows[-1].update(target_row(rounds))
    focus = focus_label(preset, [r["method"] for r in rows])
    if focus is not None:
        key = headline_key(preset, rows)
        per_seed = headline_by_seed(list(by_label.values()), by_run, key)
        for row in rows:
            diff = stats.paired_difference(per_seed[focus], per_seed[row["method"]])
            row.update({"paired_vs": focus, "paired_metric": key, "diff_mean": diff["mean"], "diff_lo": diff["lo"],
                        "diff_hi": diff["hi"], "diff_n": 0 if row["method"] == focus else diff["n"]})
    return rows


HEADLINE_TO_KEY = {"final_acc": "final", "test_acc_at_best_val": "at_best_val",
                   "test_client_acc_mean_at_best_val": "at_best_val_client"}


def headline_by_seed(rows_of: list[Entry], results: dict[str, list[dict]], key: str) -> dict[str, dict[int, float]]:
    """Each row's headline ``key`` by seed, in the row's own accuracy (a ``runs-of`` row reads its source's runs):
    what the paired column compares, and ``benchmarks.paired`` for any two rows."""
    return {e.label: {s["seed"]: _value(s, HEADLINE_TO_KEY[key], e.accuracy) for s in results.get(e.run_label, [])}
            for e in rows_of}


def _value(summary: dict, which: str, accuracy: str | None) -> float:
    value = summary.get(_accuracy_keys(accuracy)[which])
    return float("nan") if value is None else float(value)


def focus_label(preset: dict, labels: list[str]) -> str | None:
    """The row the others are compared with: ``[compare] focus``, else the first paper method among the rows."""
    focus = preset["compare"].get("focus") or next((m for m in labels if m in PAPER_METHODS), None)
    return focus if focus in labels else None


def headline_key(preset: dict, rows: list[dict]) -> str:
    """The table's headline metric: the test accuracy at the best-validation round (in the paper's metric where
    the preset has the paper's numbers, else weighted) where every row has a validation split, else the final
    round's weighted accuracy (never a best-of-test number)."""
    if not rows or any(np.isnan(r.get("test_acc_at_best_val", np.nan)) for r in rows):
        return "final_acc"
    paper = preset.get("paper")
    return PAPER_METRICS[paper["metric"]] if paper else "test_acc_at_best_val"


def _progress(preset: dict, jobs: list, out: Path, app_dir: Path, reused: int):
    """The study's progress line over these jobs (runner/progress.py), watching from now on."""
    from fedcore.config import pyproject_run_config
    from runner.progress import Job, StudyProgress

    default = pyproject_run_config(app_dir).get("num-server-rounds", 20) if (app_dir / "pyproject.toml").exists() else 20
    return StudyProgress([Job(f"{e.label}-s{s}", out / "runs" / f"{e.label}-s{s}",
                              int(run_config(preset, e, s, out).get("num-server-rounds", default))) for e, s in jobs],
                         reused=reused, label=out.name).start()


def _accuracy_keys(accuracy: str | None) -> dict[str, str]:
    """Summary keys of a row's accuracy columns: the personalised model's, or a method column's."""
    if accuracy is None:
        return {"final": "final_acc", "client": "client_acc_mean", "best": "best_acc", "last10": "last10_acc",
                "best_client": "best_client_acc_mean", "at_best_val": "test_acc_at_best_val",
                "at_best_val_client": "test_client_acc_mean_at_best_val"}
    return {"final": f"final_{accuracy}", "client": f"final_{accuracy}_client_mean", "best": f"best_{accuracy}",
            "last10": f"last10_{accuracy}", "best_client": f"best_{accuracy}_client_mean",
            "at_best_val": f"{accuracy}_at_best_val", "at_best_val_client": f"{accuracy}_client_mean_at_best_val"}


def aggregate_row(label: str, summaries: list[dict], accuracy: str | None = None) -> dict:
    keys = _accuracy_keys(accuracy)

    def ms(key):
        v = np.array([s.get(key, np.nan) if s.get(key) is not None else np.nan for s in summaries], dtype=float)
        return float(v.mean()), stats.sample_std(v)

    row = {"method": label, "seeds": len(summaries)}
    row["final_acc"], row["final_acc_std"] = ms(keys["final"])
    row["client_acc_mean"], row["client_acc_mean_std"] = ms(keys["client"])
    row["test_acc_at_best_val"], row["test_acc_at_best_val_std"] = ms(keys["at_best_val"])
    row["test_client_acc_mean_at_best_val"], row["test_client_acc_mean_at_best_val_std"] = ms(keys["at_best_val_client"])
    row["best_acc"], row["best_acc_std"] = ms(keys["best"])  # best-of-test: optimistic
    row["best_client_acc_mean"], row["best_client_acc_mean_std"] = ms(keys["best_client"])  # FedMCSA's BMTA
    row["last10_acc"], row["last10_acc_std"] = ms(keys["last10"])
    row["mb_up_per_round"] = ms("bytes_up_per_round")[0] / 1e6
    row["mb_down_per_round"] = ms("bytes_down_per_round")[0] / 1e6
    row["wall_s_per_round"] = ms("wall_s_per_round")[0]
    row["client_acc_std_within"] = ms("client_acc_std")[0]
    return row


def rounds_to_target(rounds_csv: Path | list[dict], column: str, target: float) -> int | None:
    """The first round whose ``column`` (an accuracy in [0, 1]) reaches ``target``; None if none
    does. Rounds are counted as logged, so with ``eval-every`` > 1 it is the first evaluated one.
    ``rounds_csv``: a rounds.csv, or its rows (the per-run data's)."""
    if isinstance(rounds_csv, list):
        rows = rounds_csv
    else:
        with open(rounds_csv) as f:
            rows = list(csv.DictReader(f))
    for row in rows:
        value = row.get(column)
        if value not in (None, "") and float(value) >= target - 1e-12:
            return int(row["round"])
    return None


def target_row(rounds: list[int | None]) -> dict:
    """Mean and std of the rounds to target over the runs that reached it, and how many did."""
    reached = np.array([r for r in rounds if r is not None], dtype=float)
    return {"rounds_to_target": float(reached.mean()) if len(reached) else float("nan"),
            "rounds_to_target_std": stats.sample_std(reached),
            "runs_reaching_target": f"{len(reached)}/{len(rounds)}"}


PAPER_METRICS = {  # the paper's metric -> the row key of ours in that metric, at the round chosen on validation
    "weighted": "test_acc_at_best_val", "pooled": "test_acc_at_best_val", "client mean": "test_client_acc_mean_at_best_val",
}
OPTIMISTIC = {"test_acc_at_best_val": "best_acc", "test_client_acc_mean_at_best_val": "best_client_acc_mean"}


def check_paper_table(preset: dict, where: str = "preset") -> None:
    """A preset's ``[paper]`` table: the paper's metric and its numbers by row label."""
    paper = preset.get("paper")
    if paper is None:
        return
    if paper.get("metric") not in PAPER_METRICS:
        raise SystemExit(f"{where}: [paper] metric must be one of {', '.join(PAPER_METRICS)}, got {paper.get('metric')!r}")
    if not isinstance(paper.get("data", ""), str):
        raise SystemExit(f"{where}: [paper] data must be a string naming the paper's data, got {paper['data']!r}")
    values = paper.get("values", {})
    unknown = sorted(set(values) - set(preset["compare"]["methods"]))
    if unknown:
        raise SystemExit(f"{where}: [paper] values name rows that are not in the methods list: {', '.join(unknown)}")


def made_line(preset: dict) -> str:
    """Which command and commit made the table and which commits its runs came from (preset.json's ``made``)."""
    made = preset.get("made")
    if not made:
        return ("Made by `python -m runner.compare` on runs from before commits were recorded; "
                "the table was re-rendered from its table.csv by the current code.")
    line = f"Made by `{made['command']}` at commit `{made['commit']}`" + (
        f"; re-rendered from table.csv at `{made['rerendered']}`." if made.get("rerendered") else ".")
    if "commits" in made:
        line += " " + provenance.commits_line(made["commits"])
        if made.get("source_hash"):  # --reuse keeps only runs of the current source hash (or --runs-source's)
            line += f" Every run has source hash `{made['source_hash']}` (sha256 of the source packages)" + (
                f"; the table's own code has `{made['table_source_hash']}` (tabled with --runs-source)."
                if made.get("table_source_hash") else ".")
    else:
        line += " The runs' own commits were not recorded (run folders did not record them then)."
    if made.get("dirty"):
        line += ("\n\n**Made from a tree with uncommitted changes (`--allow-dirty`): for trying things, "
                 "not a result.**\n")
    return line


def std_note(preset: dict) -> str:
    """What ± is: always the sample std (``aggregate_row``); a table made before that had its population stds
    converted by ``rerender`` (preset.json's ``std`` says "sample-converted"; docs tests check every table has one)."""
    if preset.get("std") == "sample-converted":
        return ("± is the sample std over seeds (ddof = 1), converted exactly from the population std that these "
                "runs' table.csv held: × sqrt(n / (n - 1)) for n seeds.")
    return "± is the sample std over seeds (ddof = 1)."


def paired_header(preset: dict, rows: list[dict]) -> str | None:
    """The paired-difference column's header, or None where the table has no paper method's row."""
    focus = focus_label(preset, [r["method"] for r in rows])
    if focus is None:
        return None
    names = {"final_acc": "final acc, weighted", "test_acc_at_best_val": "at best-val round, weighted",
             "test_client_acc_mean_at_best_val": "at best-val round, client mean"}
    return f"{focus} minus row ({names[headline_key(preset, rows)]}; points, {stats.INTERVAL_NAME})"


def paired_cell(row: dict, focus: str) -> str:
    if row["method"] == focus:
        return "-"
    if isinstance(row.get("diff_n"), float) and np.isnan(row["diff_n"]):
        return stats.NOT_AVAILABLE
    return stats.difference_cell({k: row.get(f"diff_{k}") for k in ("mean", "lo", "hi", "n")}
                                 | {"tie": bool(row.get("diff_lo", 1) <= 0 <= row.get("diff_hi", -1))})


def write_table(rows: list[dict], out: Path, preset: dict, failures: list[str]) -> None:
    target = preset["compare"].get("target-acc")
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS + ["client_acc_std_within"] + (TARGET_COLUMNS if target is not None else [])
                           + (PAIRED_COLUMNS if any("paired_vs" in r for r in rows) else []), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    (out / "table.md").write_text(render_table(rows, preset, failures))


def render_table(rows: list[dict], preset: dict, failures: list[str]) -> str:
    spec = preset["compare"]
    target = spec.get("target-acc")
    setting = ", ".join(f"{k}={v}" for k, v in preset.get("run-config", {}).items())
    engine = spec.get("engine", "flwr")
    # the round is chosen on validation where the runs have it; best-of-test only where they do not
    validated = [not np.isnan(r.get("test_acc_at_best_val", np.nan)) for r in rows]
    chosen = []  # (header, row key) of the columns that pick a round
    if any(validated):
        chosen += [("test acc at best-val round (weighted)", "test_acc_at_best_val"),
                   ("test acc at best-val round (client mean)", "test_client_acc_mean_at_best_val")]
    if not all(validated):
        chosen += [("best-of-test acc (weighted, optimistic)", "best_acc"),
                   ("best-of-test acc (client mean, optimistic)", "best_client_acc_mean")]
    paper = preset.get("paper")
    paper_cols = []  # the paper's number and ours in the paper's metric, side by side
    if paper:
        key = PAPER_METRICS[paper["metric"]]
        ours = key if all(validated) else OPTIMISTIC[key]
        when = "at best-val round" if all(validated) else "best-of-test, optimistic"
        theirs = f"{paper['data']}, {paper['metric']}" if paper.get("data") else paper["metric"]
        paper_cols = [(f"paper ({theirs})", None), (f"ours ({paper['metric']}, {when})", ours)]
    paired = paired_header(preset, rows)
    lines = [
        f"Setting: {setting}; {spec.get('supernodes', 10)} clients; engine {engine}.",
        *([f"Scale cut from the paper's setting: {preset['paper']['scale']}"] if paper and paper.get("scale") else []),
        made_line(preset),
        "Accuracy in % (personalised: each client's model on its own test split). Weighted = pooled: all clients' "
        "test samples together; client mean: the mean of the clients' accuracies. "
        + ("1 seed, so no ± (no spread over seeds)." if all(r["seeds"] == 1 for r in rows) else std_note(preset))
        + " Client spread: the std of the clients' final accuracies within a run, mean over seeds."
        + (" Best-val round: the evaluated round with the highest accuracy on the clients' validation splits "
           "(val-fraction of their training data), never chosen on test." if any(validated) else "")
        + (f" Paired difference: the table's headline accuracy of {focus_label(preset, [r['method'] for r in rows])} "
           "minus the row's, seed by seed (same seed = same split), mean and 95% t-interval (Student's t, n - 1 "
           "degrees of freedom, scipy.stats.t); \"tie\" where the interval covers 0." if paired else ""),
        "",
        "| method | " + "".join(f"{h} | " for h, _ in paper_cols)
        + "final acc (weighted) | final acc (client mean) | " + " | ".join(h for h, _ in chosen)
        + " | last-10 mean (weighted) | client spread (std over clients) | MB up / round | MB down / round | s / round |"
        + (f" rounds to {100 * target:g}% |" if target is not None else "") + (f" {paired} |" if paired else ""),
        "|---|" + "---|" * len(paper_cols) + "---|---|" + "---|" * len(chosen) + "---|---|---|---|---|"
        + ("---|" if target is not None else "") + ("---|" if paired else ""),
    ]
    focus = focus_label(preset, [r["method"] for r in rows])

    wanted = len(spec["seeds"]) if "seeds" in spec else max((r["seeds"] for r in rows), default=0)
    for r in rows:
        one = r["seeds"] == 1  # no spread to show: the row or the header says "1 seed" instead of "± 0.00"
        label = r["method"] if r["seeds"] == wanted else f"{r['method']} ({r['seeds']} seed{'s' * (not one)})"
        pct = functools.partial(pct_cell, one_seed=one)
        theirs = paper.get("values", {}).get(r["method"]) if paper else None
        compared = (f"| {'-' if theirs is None else f'{theirs:.2f}'} "
                    f"| {pct(r.get(paper_cols[1][1], np.nan), r.get(paper_cols[1][1] + '_std', np.nan))} "
                    if paper_cols else "")
        picked = "".join(f"| {pct(r.get(key, np.nan), r.get(key + '_std', np.nan))} " for _, key in chosen)
        spread = r.get("client_acc_std_within", np.nan)
        lines.append(
            f"| {label} {compared}| {pct(r['final_acc'], r['final_acc_std'])} "
            f"| {pct(r['client_acc_mean'], r['client_acc_mean_std'])} {picked}"
            f"| {pct(r['last10_acc'], r['last10_acc_std'])} "
            f"| {'-' if np.isnan(spread) else f'{100 * spread:.2f}'} "
            f"| {_num(r['mb_up_per_round'], 3)} | {_num(r['mb_down_per_round'], 3)} | {_num(r['wall_s_per_round'], 2)} |"
            + (f" {_rounds_cell(r)} |" if target is not None else "") + (f" {paired_cell(r, focus)} |" if paired else ""))
    not_run = [f for f in failures if f.endswith(": not run")]
    failed = [f for f in failures if not f.endswith(": not run")]
    if not_run:
        lines += ["", f"Not run ({len(not_run)}): " + "; ".join(f.removesuffix(": not run") for f in not_run)]
    if failed:
        lines += ["", "Failed runs: " + "; ".join(failed)]
    return "\n".join(lines) + "\n"


def _num(value: float, digits: int) -> str:
    return "-" if np.isnan(value) else f"{value:.{digits}f}"


def read_table_csv(path: Path) -> list[dict]:
    """The rows of a table.csv as write_table wrote them (numbers as floats, seeds as an int)."""
    rows = []
    with open(path) as f:
        for raw in csv.DictReader(f):
            row = {}
            for k, v in raw.items():
                if k in ("method", "runs_reaching_target", "paired_vs", "paired_metric"):
                    row[k] = v
                elif k == "seeds":
                    row[k] = int(v)
                else:
                    row[k] = float(v) if v not in ("", None) else float("nan")
            for k in COLUMNS:  # a column older code did not write is shown as "-"
                row.setdefault(k, float("nan"))
            rows.append(row)
    return rows


def rerender(folder: Path, allow_dirty: bool = False) -> Path:
    """Rewrite ``folder``/table.md from its table.csv and preset.json with the current code (no run). A table.csv
    whose stds are population stds (older runs) is converted once, exactly, to sample stds."""
    dirty = provenance.guard(folder, allow_dirty)
    preset = json.loads((folder / "preset.json").read_text())
    made = preset.get("made")
    if made:
        made["rerendered"] = _commit()
        made["dirty"] = made.get("dirty", False) or dirty
    rows = read_table_csv(folder / "table.csv")
    if preset.get("std") not in ("sample", "sample-converted"):
        rows = _population_to_sample(rows, folder / "table.csv")
        preset["std"] = "sample-converted"
    text = render_table(rows, preset, _footer_failures(folder / "table.md"))
    (folder / "table.md").write_text(text)
    (folder / "preset.json").write_text(json.dumps(preset, indent=2))
    return folder / "table.md"


def _population_to_sample(rows: list[dict], table_csv: Path) -> list[dict]:
    """Every ``*_std`` column over seeds times sqrt(n / (n - 1)), written back to ``table_csv``."""
    with open(table_csv) as f:
        fields = csv.DictReader(f).fieldnames
    for row in rows:
        for key in [k for k in row if k.endswith("_std")]:
            row[key] = stats.sample_from_population(row[key], row["seeds"]) if row["seeds"] > 1 else float("nan")
    with open(table_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        w.writeheader()
        w.writerows({k: ("" if isinstance(v, float) and np.isnan(v) else v) for k, v in r.items()} for r in rows)
    return rows


def _footer_failures(table_md: Path) -> list[str]:
    """The "Not run" / "Failed runs" notes of an existing table, kept when it is re-rendered."""
    failures = []
    if table_md.exists():
        for line in table_md.read_text().splitlines():
            if line.startswith("Not run ("):
                failures += [f"{x.strip()}: not run" for x in line.split("): ", 1)[1].split(";")]
            elif line.startswith("Failed runs: "):
                failures += [x.strip() for x in line.removeprefix("Failed runs: ").split(";")]
    return failures


def _commit() -> str:
    """HEAD's short hash, "+changes" for uncommitted changes (``provenance.tree_commit``)."""
    return provenance.tree_commit()


def pct_cell(mean: float, std: float, one_seed: bool = False) -> str:
    """An accuracy cell in %: "98.75 ± 0.10" over seeds; no ± for one seed (the row says "1 seed");
    "± <0.01" where seeds agree to two decimals (never a "± 0.00" that reads as one seed)."""
    if np.isnan(mean):
        return "-"
    if one_seed or np.isnan(std):
        return f"{100 * mean:.2f}"
    spread = f"{100 * std:.2f}"
    return f"{100 * mean:.2f} ± {'<0.01' if spread == '0.00' else spread}"


def _rounds_cell(row: dict) -> str:
    """"12.3 ± 1.2", with "(2 of 3 runs)" when some never reached the target, "not reached" if none did."""
    reached, runs = (int(v) for v in row["runs_reaching_target"].split("/"))
    if reached == 0:
        return "not reached"
    spread = row["rounds_to_target_std"]
    cell = f"{row['rounds_to_target']:.1f}" + ("" if np.isnan(spread) else f" ± {spread:.1f}")
    return cell if reached == runs else f"{cell} ({reached} of {runs} runs)"


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
