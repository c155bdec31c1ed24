"""A comparison table's numbers: each row's mean and sample std over seeds, its rounds to target, and the paper
method's paired difference to every row seed by seed (``runner.stats``)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from runner import stats
from runner.compare_presets import PAPER_METRICS, Entry

COLUMNS = ["method", "final_acc", "final_acc_std", "client_acc_mean", "client_acc_mean_std",
           "test_acc_at_best_val", "test_acc_at_best_val_std", "test_client_acc_mean_at_best_val",
           "test_client_acc_mean_at_best_val_std", "best_acc", "best_acc_std", "best_client_acc_mean",
           "best_client_acc_mean_std", "last10_acc", "last10_acc_std", "mb_up_per_round", "mb_down_per_round",
           "wall_s_per_round", "seeds"]
TARGET_COLUMNS = ["rounds_to_target", "rounds_to_target_std", "runs_reaching_target"]
PAIRED_COLUMNS = ["paired_vs", "paired_metric", "diff_mean", "diff_lo", "diff_hi", "diff_n"]
PAPER_METHODS = ("pfedpm", "fedmcsa", "fedfcd", "mupfl", "fedsac")  # a table's focus: the first of its labels here


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
    what the paired column compares, and ``runner.table <folder> paired`` for any two rows."""
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
    does. Rounds are counted as logged, so with ``eval-every`` > 1 it is the first evaluated one; a round that
    evaluated a sample of the clients (``sampled_eval``) is not counted: a lucky sample is not the federation.
    ``rounds_csv``: a rounds.csv, or its rows (the per-run data's)."""
    from server_app.results import SAMPLED_EVAL

    if isinstance(rounds_csv, list):
        rows = rounds_csv
    else:
        with open(rounds_csv) as f:
            rows = list(csv.DictReader(f))
    for row in rows:
        if row.get(SAMPLED_EVAL) not in (None, ""):
            continue
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
