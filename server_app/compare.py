"""Compare methods side by side on one setting, through the real ``flwr run`` simulation.

A preset (TOML, in conf/) fixes the setting; every entry runs on the same partition, model and
budget, for each seed. Output in the preset's ``output`` folder:

- ``table.md`` / ``table.csv``: one row per entry, mean ± std over seeds; with a validation split
  (``val-fraction`` in the preset's run config, 0.1 in the shipped presets) the headline is the test
  accuracy at the round best on validation, else the best-of-test accuracy, marked optimistic,
- ``curves.png``: every entry's accuracy curve (mean over seeds),
- ``runs/<label>-s<seed>/``: each run's own results.

    python -m server_app.compare conf/mnist5k-pathological.toml [--methods local,fedavg] [--seeds 0,1] [--reuse]

``--reuse`` keeps every completed run in ``runs/`` whose saved config matches, so a preset can be
resumed, or its table rebuilt, without running those again.

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

``python -m server_app.compare --rerender docs/results/<name>`` rewrites a table.md from its table.csv and
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

from server_app.launch import simulate

COLUMNS = ["method", "final_acc", "final_acc_std", "client_acc_mean", "client_acc_mean_std",
           "test_acc_at_best_val", "test_acc_at_best_val_std", "test_client_acc_mean_at_best_val",
           "test_client_acc_mean_at_best_val_std", "best_acc", "best_acc_std", "best_client_acc_mean",
           "best_client_acc_mean_std", "last10_acc", "last10_acc_std", "mb_up_per_round", "mb_down_per_round",
           "wall_s_per_round", "seeds"]
TARGET_COLUMNS = ["rounds_to_target", "rounds_to_target_std", "runs_reaching_target"]


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
            "results-dir": str(out / "runs"), "run-name": f"{entry.label}-s{seed}"}


def job_config(preset: dict, entry: Entry, seed: int, out: Path) -> dict:
    """What a job runs: its run config, replacing whatever its folder holds (a cut-off or older run of
    the comparison; ``--reuse`` has already kept the finished ones that match)."""
    return {**run_config(preset, entry, seed, out), "overwrite": True}


def _run_inprocess(config: dict, supernodes: int) -> dict:
    """One in-process run in a worker process with one torch thread (what ``jobs`` parallelises)."""
    import torch

    torch.set_num_threads(1)
    from server_app.inprocess import run_inprocess

    try:
        summary, _ = run_inprocess(config, supernodes)
        return {"status": "finished:completed", "details": "", "summary": summary}
    except Exception as err:  # reported as a failed run, as flwr ls would
        return {"status": "finished:failed", "details": repr(err), "summary": None}


def finished_run(config: dict) -> dict | None:
    """The summary of a completed earlier run with this very config (``--reuse``), or None.

    The run's ``config.json`` (the full resolved config) must hold every key of ``config`` with the
    same value; a run that was cut off has no ``summary.json`` and is not reused."""
    folder = Path(config["results-dir"]) / config["run-name"]
    try:
        saved = json.loads((folder / "config.json").read_text())
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    same = all(saved.get(k) == v for k, v in config.items() if k != "results-dir")
    return summary if same and summary.get("status") == "completed" else None


def run_all(preset: dict, app_dir: Path, labels: list[str] | None = None, seeds: list[int] | None = None,
            reuse: bool = False, table_only: bool = False) -> Path:
    """Run the preset's (label, seed) jobs and write the table. ``reuse`` keeps finished runs;
    ``table_only`` runs nothing and tables the finished runs there are (rows name their seed count)."""
    spec = preset["compare"]
    rows_of = entries(preset, labels)
    seeds = seeds if seeds is not None else spec.get("seeds", [0])
    out = (app_dir / spec.get("output", "results/compare")).resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    jobs = [(e, s) for e in rows_of if e.runs_of is None for s in seeds]
    results: dict[str, list[dict]] = {e.label: [] for e in rows_of}
    if reuse or table_only:
        for entry, seed in list(jobs):
            summary = finished_run(run_config(preset, entry, seed, out))
            if summary is not None:
                print(f"reusing {entry.label} seed {seed}: final acc {100 * summary['final_acc']:.2f}%", flush=True)
                results[entry.label].append(summary)
                jobs.remove((entry, seed))
    failures = []
    if table_only:
        failures += [f"{entry.label} seed {seed}: not run" for entry, seed in jobs]
        jobs = []
    started = time.monotonic()
    supernodes = spec.get("supernodes", 10)
    engine = spec.get("engine", "flwr")
    if engine not in ("flwr", "inprocess"):
        raise SystemExit(f"engine must be 'flwr' or 'inprocess', got {engine!r}")

    def record(i: int, entry: Entry, seed: int, result: dict, seconds: float) -> None:
        summary = result["summary"]
        if result["status"] != "finished:completed" or summary is None:
            failures.append(f"{entry.label} seed {seed}: {result['status']} {result['details']}")
            print(f"[{i}/{len(jobs)}] {entry.label} seed {seed} FAILED: {result['status']} {result['details']}",
                  flush=True)
            return
        results[entry.label].append(summary)
        chosen = (f"at best-val round {100 * summary['test_acc_at_best_val']:.2f}%"
                  if summary.get("test_acc_at_best_val") is not None else
                  f"best-of-test {100 * summary['best_acc']:.2f}%")
        print(f"[{i}/{len(jobs)}] {entry.label} seed {seed}: final acc {100 * summary['final_acc']:.2f}%  "
              f"{chosen}  {seconds:.0f} s (total {time.monotonic() - started:.0f} s)", flush=True)

    if engine == "inprocess":
        workers = max(1, int(spec.get("jobs", 1)))
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        with ProcessPoolExecutor(max_workers=workers) as pool:
            t0 = time.monotonic()
            futures = [pool.submit(_run_inprocess, job_config(preset, e, s, out), supernodes) for e, s in jobs]
            print(f"{len(jobs)} in-process runs on {workers} worker(s) ...", flush=True)
            for i, ((entry, seed), future) in enumerate(zip(jobs, futures), 1):
                record(i, entry, seed, future.result(), time.monotonic() - t0)
    else:
        for i, (entry, seed) in enumerate(jobs, 1):
            print(f"[{i}/{len(jobs)}] {entry.label} seed {seed} ...", flush=True)
            t0 = time.monotonic()
            result = simulate(job_config(preset, entry, seed, out), supernodes=supernodes, app_dir=app_dir,
                              cpus_per_client=spec.get("cpus-per-client", 1),
                              gpus_per_client=spec.get("gpus-per-client", 0.0), stream=spec.get("stream", False))
            record(i, entry, seed, result, time.monotonic() - t0)
    for entry in rows_of:
        if entry.runs_of is not None:
            results[entry.label] = results[entry.runs_of]
    target = spec.get("target-acc")
    rows = []
    for e in rows_of:
        if results[e.label]:
            rows.append(aggregate_row(e.label, results[e.label], e.accuracy))
            if target is not None:
                rounds = [rounds_to_target(Path(s["results_dir"]) / "rounds.csv", e.accuracy or "acc_weighted", target)
                          for s in results[e.label]]
                rows[-1].update(target_row(rounds))
    write_table(rows, out, preset, failures)
    plot_curves(rows_of, seeds, out)
    print((out / "table.md").read_text())
    if failures:
        print("failed runs:\n  " + "\n  ".join(failures), file=sys.stderr)
    return out


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
        return float(v.mean()), float(v.std())

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


def rounds_to_target(rounds_csv: Path, column: str, target: float) -> int | None:
    """The first round whose ``column`` (an accuracy in [0, 1]) reaches ``target``; None if none
    does. Rounds are counted as logged, so with ``eval-every`` > 1 it is the first evaluated one."""
    with open(rounds_csv) as f:
        for row in csv.DictReader(f):
            value = row.get(column)
            if value not in (None, "") and float(value) >= target - 1e-12:
                return int(row["round"])
    return None


def target_row(rounds: list[int | None]) -> dict:
    """Mean and std of the rounds to target over the runs that reached it, and how many did."""
    reached = np.array([r for r in rounds if r is not None], dtype=float)
    return {"rounds_to_target": float(reached.mean()) if len(reached) else float("nan"),
            "rounds_to_target_std": float(reached.std()) if len(reached) else float("nan"),
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


def provenance(preset: dict) -> str:
    """Which command and commit made the table (recorded in preset.json's ``made`` when the runs ran)."""
    made = preset.get("made")
    if not made:
        return ("Made by `python -m server_app.compare` on runs from before commits were recorded; "
                "the table was re-rendered from its table.csv by the current code.")
    return f"Made by `{made['command']}` at commit `{made['commit']}`" + (
        f"; re-rendered from table.csv at `{made['rerendered']}`." if made.get("rerendered") else ".")


def write_table(rows: list[dict], out: Path, preset: dict, failures: list[str]) -> None:
    target = preset["compare"].get("target-acc")
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS + ["client_acc_std_within"] + (TARGET_COLUMNS if target is not None else []),
                           extrasaction="ignore")
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
    lines = [
        f"Setting: {setting}; {spec.get('supernodes', 10)} clients; engine {engine}.",
        provenance(preset),
        "Accuracy in % (personalised: each client's model on its own test split). Weighted = pooled: all clients' "
        "test samples together; client mean: the mean of the clients' accuracies. "
        + ("1 seed, so no ± (no spread over seeds)." if all(r["seeds"] == 1 for r in rows) else "± is the std over seeds.")
        + " Client spread: the std of the clients' final accuracies within a run, mean over seeds."
        + (" Best-val round: the evaluated round with the highest accuracy on the clients' validation splits "
           "(val-fraction of their training data), never chosen on test." if any(validated) else ""),
        "",
        "| method | " + "".join(f"{h} | " for h, _ in paper_cols)
        + "final acc (weighted) | final acc (client mean) | " + " | ".join(h for h, _ in chosen)
        + " | last-10 mean (weighted) | client spread (std over clients) | MB up / round | MB down / round | s / round |"
        + (f" rounds to {100 * target:g}% |" if target is not None else ""),
        "|---|" + "---|" * len(paper_cols) + "---|---|" + "---|" * len(chosen) + "---|---|---|---|---|"
        + ("---|" if target is not None else ""),
    ]

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
            + (f" {_rounds_cell(r)} |" if target is not None else ""))
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
                if k in ("method", "runs_reaching_target"):
                    row[k] = v
                elif k == "seeds":
                    row[k] = int(v)
                else:
                    row[k] = float(v) if v not in ("", None) else float("nan")
            for k in COLUMNS:  # a column older code did not write is shown as "-"
                row.setdefault(k, float("nan"))
            rows.append(row)
    return rows


def rerender(folder: Path) -> Path:
    """Rewrite ``folder``/table.md from its table.csv and preset.json with the current code (no run)."""
    preset = json.loads((folder / "preset.json").read_text())
    made = preset.get("made")
    if made:
        made["rerendered"] = _commit()
    text = render_table(read_table_csv(folder / "table.csv"), preset, _footer_failures(folder / "table.md"))
    (folder / "table.md").write_text(text)
    if made:
        (folder / "preset.json").write_text(json.dumps(preset, indent=2))
    return folder / "table.md"


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
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parent.parent).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=Path(__file__).resolve().parent.parent).stdout.strip()
        return out + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def pct_cell(mean: float, std: float, one_seed: bool = False) -> str:
    """An accuracy cell in %: "98.75 ± 0.10" over seeds; no ± for one seed (the row says "1 seed");
    "± <0.01" where seeds agree to two decimals (never a "± 0.00" that reads as one seed)."""
    if np.isnan(mean):
        return "-"
    if one_seed:
        return f"{100 * mean:.2f}"
    spread = f"{100 * std:.2f}"
    return f"{100 * mean:.2f} ± {'<0.01' if spread == '0.00' else spread}"


def _rounds_cell(row: dict) -> str:
    """"12.3 ± 1.2", with "(2 of 3 runs)" when some never reached the target, "not reached" if none did."""
    reached, runs = (int(v) for v in row["runs_reaching_target"].split("/"))
    if reached == 0:
        return "not reached"
    cell = f"{row['rounds_to_target']:.1f} ± {row['rounds_to_target_std']:.1f}"
    return cell if reached == runs else f"{cell} ({reached} of {runs} runs)"


def plot_curves(rows_of: list[Entry], seeds: list[int], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for entry in rows_of:
        column = entry.accuracy or "acc_weighted"
        curves = []
        for seed in seeds:
            path = out / "runs" / f"{entry.run_label}-s{seed}" / "rounds.csv"
            if path.exists():
                rows = [r for r in csv.DictReader(open(path)) if r.get(column)]
                curves.append({int(r["round"]): float(r[column]) for r in rows})
        if not curves:
            continue
        rounds = sorted(set.intersection(*(set(c) for c in curves)))
        mean = np.array([np.mean([c[r] for c in curves]) for r in rounds])
        ax.plot(rounds, 100 * mean, label=entry.label, linestyle="--" if entry.runs_of else "-")
    ax.set(xlabel="round", ylabel="personalised test accuracy (%)", title=out.name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    plt.close(fig)


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
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing: table the completed runs there are, with each row's number of seeds")
    args = parser.parse_args(argv)
    if args.rerender:
        for folder in args.rerender:
            print(rerender(folder))
        return 0
    if args.preset is None:
        parser.error("a preset is needed (or --rerender DIR)")
    preset = load_preset(args.preset)
    preset["made"] = {"command": f"python -m server_app.compare {args.preset}", "commit": _commit()}
    labels = args.methods.split(",") if args.methods else None
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    out = run_all(preset, args.app.resolve(), labels, seeds, reuse=args.reuse, table_only=args.table_only)
    (out / "preset.json").write_text(json.dumps(preset, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
