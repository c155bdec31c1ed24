"""The comparison command's table and curves, built from real (in-process) runs; presets are valid."""

import csv
from pathlib import Path

import pytest

from fedcore.config import Config
from server_app.compare import aggregate_row, load_preset, plot_curves, write_table

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("preset", sorted((ROOT / "conf").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_presets_are_valid_run_configs(preset):
    spec = load_preset(preset)
    for method in spec["compare"]["methods"]:
        Config.from_run_config({**spec.get("run-config", {}), **spec.get("method-config", {}).get(method, {}),
                                "method": method})


def test_table_and_curves_from_real_runs(tmp_path):
    from tests.conftest import run_inprocess

    out = tmp_path / "cmp"
    summaries = {}
    for method in ("local", "fedavg"):
        summaries[method] = [run_inprocess(tmp_path, 3, None, method=method, seed=seed,
                                           **{"results-dir": str(out / "runs"), "run-name": f"{method}-s{seed}"})[0]
                             for seed in (0, 1)]
    rows = [aggregate_row(m, s) for m, s in summaries.items()]
    preset = {"compare": {"supernodes": 3}, "run-config": {"dataset": "digits"}}
    write_table(rows, out, preset, failures=[])
    plot_curves(["local", "fedavg"], [0, 1], out)

    local = summaries["local"]
    expected = sum(s["final_acc"] for s in local) / 2
    table = (out / "table.md").read_text()
    assert f"| local | {100 * expected:.2f} ±" in table and "| fedavg |" in table
    with open(out / "table.csv") as f:
        got = {r["method"]: r for r in csv.DictReader(f)}
    assert float(got["local"]["final_acc"]) == pytest.approx(expected)
    assert int(got["fedavg"]["seeds"]) == 2
    assert float(got["local"]["mb_up_per_round"]) < float(got["fedavg"]["mb_up_per_round"])
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
