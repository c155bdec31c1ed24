"""benchmarks.studies.peravg_test_adaptation: its "ours" row is the run's own Per-FedAvg evaluation, redone."""

from __future__ import annotations

import re

from benchmarks.studies import peravg_test_adaptation
from tests.conftest import test_device

PRESET = """
[compare]
methods = ["per-fedavg"]
supernodes = 3

[run-config]
dataset = "digits"
partition = "pathological"
num-server-rounds = 2
local-epochs = 1
local-steps = 0
batch-size = 16
lr = 0.05
momentum = 0.0
weight-decay = 0.0
node-wait-s = 0
client-threads = 1
plots = false
device = "{device}"
server-device = "{device}"
deterministic = true
"per-fedavg.alpha" = 0.05
"""


def test_ours_repeats_the_runs_own_evaluation_and_the_other_ways_differ(tmp_path, capsys):
    preset = tmp_path / "preset.toml"
    preset.write_text(PRESET.format(device=test_device()))
    out = tmp_path / "out"
    peravg_test_adaptation.main([str(preset), "--out", str(out), "--draws", "2"])
    table = (out / "table.md").read_text()
    recorded, redone = re.search(r"client mean\): ([\d.]+); .* draw 0: ([\d.]+)\.", table).groups()
    assert recorded == redone  # same model, same training batch, same alpha: the run's number exactly
    rows = {line.split(" | ")[0].lstrip("| "): float(line.split(" | ")[1]) for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| scoring")}
    assert len(rows) == len(peravg_test_adaptation.WAYS)
    assert len(set(rows.values())) == len(rows)  # five ways, five different scores on this seed
    lines = (out / "scores.csv").read_text().splitlines()
    assert len(lines) == 1 + 3 * 2 * len(peravg_test_adaptation.WAYS)  # clients x draws x ways
