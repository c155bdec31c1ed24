"""Per-run results kept in the repository beside a comparison table (``runs.json.gz``), so every number of the
table can be recomputed from them: each run's evaluated rounds (test and validation accuracy, weighted and client
mean, and any method column a row reports), its per-client final accuracy, traffic and time per round, and its
provenance (commit, source hash, resolved config less this machine's paths). The run folders themselves
(``runs/``) stay out of git.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path

from server_app.results import SAMPLED_EVAL, accuracy_summary

FILE = "runs.json.gz"
SCALARS = ("bytes_up_per_round", "bytes_down_per_round", "wall_s_per_round")
NOT_SERIES = {"eval_clients", "eval_bytes_down", "eval_s"}
MACHINE_KEYS = ("results-dir",)  # where the run folder lay on the machine that ran it: not for the repository


def _number(text: str):
    if text in ("", None):
        return None
    value = float(text)
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def _is_series(column: str) -> bool:
    """Kept per evaluated round: the accuracies, method evaluation columns, and the size of a sampled evaluation
    (which keeps such rounds out of the recomputed summary, as out of the run's own)."""
    return ((column.startswith(("acc_", "val_acc_")) or column.startswith("eval_")) and column not in NOT_SERIES
            or column == SAMPLED_EVAL)


def collect(folder: Path, label: str, seed: int, code: dict | None = None) -> dict:
    """One finished run folder as a compact record (``code``: its provenance stamp where the folder has none)."""
    folder = Path(folder)
    summary = json.loads((folder / "summary.json").read_text())
    with open(folder / "rounds.csv") as f:
        rows = [{k: _number(v) for k, v in r.items()} for r in csv.DictReader(f)]
    evaluated = [r for r in rows if isinstance(r.get("acc_weighted"), (int, float))]
    columns = [c for c in (rows[0] if rows else {}) if _is_series(c)]
    final_round = max((r["round"] for r in rows), default=None)
    clients = {"partition_id": [], "accuracy": [], "test_samples": []}
    with open(folder / "clients.csv") as f:
        for r in csv.DictReader(f):
            if int(r["round"]) == final_round:
                clients["partition_id"].append(int(r["partition_id"]))
                clients["accuracy"].append(float(r["accuracy"]))
                clients["test_samples"].append(int(float(r["test_samples"])))
    from runner import provenance

    stamp = provenance.read(folder) or {**(code or {}), "config": json.loads((folder / "config.json").read_text())}
    config = {k: v for k, v in (stamp.get("config") or {}).items() if k not in MACHINE_KEYS}
    return {"label": label, "seed": seed, "status": summary.get("status"), "final_round": final_round,
            "commit": stamp.get("commit"), "source_hash": stamp.get("source_hash"), "config": config,
            "rounds": {"round": [r["round"] for r in evaluated],
                       **{c: [r.get(c) for r in evaluated] for c in columns}},
            "clients_final": clients, **{k: summary.get(k) for k in SCALARS}}


def write(out: Path, runs: list[dict]) -> Path:
    """``out``/runs.json.gz, byte-identical for the same runs (no timestamp in the gzip header)."""
    text = json.dumps(sorted(runs, key=lambda r: (r["label"], r["seed"])), separators=(",", ":"), sort_keys=True)
    path = Path(out) / FILE
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(text.encode())
    return path


def load(out: Path) -> list[dict]:
    with gzip.open(Path(out) / FILE, "rt") as f:
        return json.load(f)


def by_run(out: Path) -> dict[tuple[str, int], dict]:
    """``out``'s per-run data by (run label, seed); none where the folder has no such file."""
    return {(r["label"], r["seed"]): r for r in load(out)} if (Path(out) / FILE).exists() else {}


def evaluated_rows(run: dict) -> list[dict]:
    """The run's evaluated rounds as rounds.csv rows (None where a column had no value that round)."""
    series = run["rounds"]
    return [{c: series[c][i] for c in series} for i in range(len(series["round"]))]


def summary(run: dict) -> dict:
    """The run's summary recomputed from its rounds (what compare tables), plus its recorded scalars."""
    rows = evaluated_rows(run)
    clean = [{k: v for k, v in r.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
             for r in rows]
    return {**accuracy_summary(clean, run["final_round"]), **{k: run.get(k) for k in SCALARS},
            "seed": run["seed"], "status": run["status"], "commit": run.get("commit"), "_rounds": clean}


def summaries(out: Path) -> dict[str, list[dict]]:
    """Recomputed summaries by run label (a row's ``runs-of`` label), in seed order."""
    by_label: dict[str, list[dict]] = {}
    for run in sorted(load(out), key=lambda r: r["seed"]):
        by_label.setdefault(run["label"], []).append(summary(run))
    return by_label
