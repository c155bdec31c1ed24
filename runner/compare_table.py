"""A comparison table's files: table.md rendered from its rows (paper columns, paired column, rounds to
target, the command and commits that made it), table.csv written and read back, ``--rerender``, and a
``[sweep]`` preset's sweep.md (its grid ranked on validation)."""

from __future__ import annotations

import csv
import functools
import json
from pathlib import Path

import numpy as np

from runner import provenance, stats
from runner.compare_presets import PAPER_METRICS, sweep_grid, sweep_label
from runner.compare_rows import COLUMNS, PAIRED_COLUMNS, TARGET_COLUMNS, focus_label, headline_key

OPTIMISTIC = {"test_acc_at_best_val": "best_acc", "test_client_acc_mean_at_best_val": "best_client_acc_mean"}


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
    text = render_table(rows, preset, footer_failures(folder / "table.md"))
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


def footer_failures(table_md: Path) -> list[str]:
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


def render_sweep(preset: dict, results: dict[str, list[dict]]) -> str:
    """sweep.md: the ``[sweep]`` grid's rows ranked by their best validation accuracy (weighted, mean over seeds),
    the first one named as chosen; the test accuracy at the best-validation round (and at ``[sweep] also``'s
    accuracy columns) is shown and chooses nothing."""
    also = preset["sweep"].get("also", [])
    rows = []
    for point in sweep_grid(preset):
        runs = results.get(sweep_label(preset, point), [])
        val = [s["best_val_acc"] for s in runs if s.get("best_val_acc") is not None]
        rows.append({"point": point, "runs": len(runs), "val": float(np.mean(val)) if val else -1.0,
                     "cells": [_mean_std(val), str([s.get("best_val_round") for s in runs]),
                               _mean_std([s.get("test_acc_at_best_val") for s in runs]),
                               *(_mean_std([s.get(f"{a}_at_best_val") for s in runs]) for a in also)]})
    rows.sort(key=lambda r: -r["val"])  # stable: ties keep the grid's order
    keys = list(rows[0]["point"]) if rows else []
    value = lambda v: f"{v:g}" if isinstance(v, float) else str(v)  # noqa: E731
    setting = ", ".join(f"{k}={v}" for k, v in preset.get("run-config", {}).items())
    lines = [
        made_line(preset),
        f"Setting: {setting}; {preset['compare'].get('supernodes', 10)} clients; seeds "
        f"{preset['compare'].get('seeds', [0])}.",
        "Ranked by the best validation accuracy (weighted: all clients' validation samples together; the validation "
        "split is val-fraction of each client's training data), mean ± sample std (ddof = 1) over seeds. The test "
        "accuracy (weighted) at the best-validation round is shown for information only; it chose nothing.",
        "",
        f"**Chosen on validation: {', '.join(f'{k} = {value(v)}' for k, v in rows[0]['point'].items())}**."
        if rows and rows[0]["runs"] else "**Nothing chosen: no run of the grid has finished.**",
        "",
        "| " + " | ".join(keys) + " | best val acc (weighted) | best-val round(s) | test acc at best-val round "
        "(weighted) | " + "".join(f"{a} test acc at best-val round | " for a in also) + "runs |",
        "|---" * (len(keys) + 4 + len(also)) + "|",
    ]
    lines += ["| " + " | ".join(value(v) for v in r["point"].values()) + " | " + " | ".join(r["cells"])
              + f" | {r['runs']} |" for r in rows]
    return "\n".join(lines) + "\n"


def _mean_std(values: list) -> str:
    """Accuracies (fractions) as one %-cell over the seeds that have a value; "-" when none has."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return pct_cell(float(np.mean(values)), stats.sample_std(values), one_seed=len(values) == 1)
