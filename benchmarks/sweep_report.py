"""What the validation sweeps (benchmarks/pfedpm_sweep.py, benchmarks/fedfcd_sweep.py) share: their runs'
summaries, the mean ± sample-std cell and the lines that open a sweep table (provenance, setting, ranking rule)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from runner.compare import made_line, pct_cell
from runner.stats import sample_std


def summaries(out: Path, name: str, seeds: list[int]) -> list[dict]:
    """The summary.json of every finished seed of one sweep point."""
    paths = [out / "runs" / f"{name}-s{seed}" / "summary.json" for seed in seeds]
    return [json.loads(p.read_text()) for p in paths if p.exists()]


def mean_std(values: list) -> str:
    """Accuracies (fractions) as one %-cell over the seeds that have a value (``compare.pct_cell``: no ± for one
    seed, "± <0.01" where seeds agree); "-" when none has."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return pct_cell(float(np.mean(values)), sample_std(values), one_seed=len(values) == 1)


def preamble(preset: dict, command: str, chosen: str) -> list[str]:
    """The table's first lines: command and commit, the setting, how rows are ranked, and what was chosen."""
    setting = ", ".join(f"{k}={v}" for k, v in preset["run-config"].items())
    return [
        made_line(preset),
        f"Setting: {setting}; {preset['compare'].get('supernodes', 10)} clients; seeds "
        f"{preset['compare'].get('seeds', [0])}.",
        "Ranked by the best validation accuracy (weighted: all clients' validation samples together; the validation "
        "split is val-fraction of each client's training data), mean ± sample std (ddof = 1) over seeds. The test accuracy (weighted) "
        "at the best-validation round is shown for information only; it chose nothing.",
        "",
        f"**Chosen on validation: {chosen}**.",
        "",
    ]
