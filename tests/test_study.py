"""The data-size study (``runner.study``): a table and two figures across caps on the clients' training data, built
from the comparison tables' per-run data. Checked on a tiny real run set: digits, 2 clients, 1 round, 2 seeds, two
caps (one of them no cap, read from two presets as the study's no-cap point reads FedFCD's table and its own)."""

import csv
from pathlib import Path

import numpy as np
import pytest

from runner import run_data, stats, study
from tests.conftest import test_device

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RUN_CONFIG = f"""val-fraction = 0.2
dataset = "digits"
partition = "pathological"
model = "mlr"
num-server-rounds = 1
local-steps = 0
local-epochs = 1
batch-size = 16
lr = 0.05
momentum = 0.0
weight-decay = 0.0
fraction-train = 1.0
client-threads = 1
device = "{test_device()}"
server-device = "{test_device()}"
"""


def _preset(conf: Path, name: str, methods: list[str], cap: int) -> None:
    (conf / f"{name}.toml").write_text(
        f'[compare]\nmethods = {methods!r}\nseeds = [0, 1]\nsupernodes = 2\nengine = "inprocess"\n'
        f'output = "out/{name}"\n\n[run-config]\n{RUN_CONFIG}' + (f"max-train-samples = {cap}\n" if cap else ""))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Three comparisons run for real (12 runs of one round), then the study built from their per-run data."""
    from runner.compare import load_preset, run_all

    app = tmp_path_factory.mktemp("app")
    conf = app / "conf"
    (conf / "study").mkdir(parents=True)
    _preset(conf, "cap20", ["local", "fedavg", "fedfcd"], 20)
    _preset(conf, "full-a", ["local", "fedfcd"], 0)  # an earlier table's rows ...
    _preset(conf, "full-b", ["fedavg"], 0)  # ... and the row it lacks
    for name in ("cap20", "full-a", "full-b"):
        run_all(load_preset(conf / f"{name}.toml"), app)
    path = conf / "study" / "tiny.toml"
    path.write_text('[study]\noutput = "out/study"\nmetric = "client mean"\nreference = "local"\npaper = ["fedfcd"]\n'
                    'rows = ["local", "fedavg", "fedfcd"]\n\n[[point]]\ncap = 20\npresets = ["../cap20.toml"]\n\n'
                    '[[point]]\ncap = 0\npresets = ["../full-a.toml", "../full-b.toml"]\n')
    out = study.build(path, app)
    return app, out, study.load_study(path)


def _seed_values(folder: Path, label: str) -> dict[int, float]:
    return {r["seed"]: run_data.summary(r)["test_client_acc_mean_at_best_val"] for r in run_data.load(folder)
            if r["label"] == label}


@pytest.mark.long  # 12 real runs: about 20 CPU-seconds
def test_the_table_and_csv_are_the_runs_numbers(built):
    app, out, _ = built
    with open(out / "study.csv") as f:
        rows = {(int(r["cap"]), r["label"]): r for r in csv.DictReader(f)}
    assert set(rows) == {(c, m) for c in (20, 0) for m in ("local", "fedavg", "fedfcd")}
    capped, full = _seed_values(app / "out" / "cap20", "fedfcd"), _seed_values(app / "out" / "full-a", "fedfcd")
    assert float(rows[(20, "fedfcd")]["mean"]) == pytest.approx(100 * np.mean(list(capped.values())), abs=1e-3)
    d = stats.paired_difference(full, _seed_values(app / "out" / "full-a", "local"))
    assert float(rows[(0, "fedfcd")]["lo"]) == pytest.approx(100 * d["lo"], abs=1e-3)
    fedavg = _seed_values(app / "out" / "full-b", "fedavg")  # the no-cap point reads its second preset too
    assert float(rows[(0, "fedavg")]["mean"]) == pytest.approx(100 * np.mean(list(fedavg.values())), abs=1e-3)
    # samples per client: 20 under the cap, the clients' whole training split without it
    assert float(rows[(20, "local")]["samples_per_client"]) == 20.0 < float(rows[(0, "local")]["samples_per_client"])
    table = (out / "table.md").read_text()
    assert f"{100 * np.mean(list(capped.values())):.2f} ± " in table and "no cap (" in table
    assert "- **fedfcd** beats local beyond noise at " in table and "Runs from: commit" in table


def test_the_verdict_names_the_caps_where_a_gain_is_beyond_noise():
    spec = {"study": {"reference": "local", "paper": ["fedfcd"], "rows": ["local", "fedavg", "fedfcd"]}}
    gain = study.Point(25, 25.0, {"local": {0: 0.50, 1: 0.52, 2: 0.51}, "fedavg": {0: 0.55, 1: 0.56, 2: 0.57},
                                  "fedfcd": {0: 0.60, 1: 0.63, 2: 0.61}}, [])
    tie = study.Point(0, 900.0, {"local": {0: 0.90, 1: 0.91, 2: 0.92}, "fedavg": {0: 0.80, 1: 0.80, 2: 0.81},
                                 "fedfcd": {0: 0.91, 1: 0.90, 2: 0.92}}, [])
    assert study.best_baseline(gain, spec) == "fedavg" and study.best_baseline(tie, spec) == "fedavg"
    assert study.verdicts([gain, tie], spec) == [
        "- **fedfcd** beats local beyond noise at cap 25; the best baseline at cap 25, no cap (900)."]


@pytest.mark.long
def test_both_figures_are_drawn(built):
    _, out, _ = built
    for name in ("accuracy.png", "gains.png"):
        assert (out / name).stat().st_size > 10_000 and (out / name).read_bytes()[:4] == b"\x89PNG"


def test_a_point_whose_preset_has_another_cap_is_refused(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    _preset(conf, "cap20", ["local"], 20)
    path = conf / "s.toml"
    path.write_text('[study]\noutput = "o"\nreference = "local"\npaper = []\nrows = ["local"]\n\n[[point]]\ncap = 40\n'
                    'presets = ["cap20.toml"]\n')
    with pytest.raises(SystemExit, match="max-train-samples is 20, but the study's point says 40"):
        study.build(path, tmp_path)


def test_runner_compare_builds_a_study_file_and_runs_nothing(tmp_path, capsys):
    from runner.compare import main

    conf = tmp_path / "conf"
    conf.mkdir()
    _preset(conf, "cap20", ["local", "fedfcd"], 20)
    path = conf / "s.toml"
    path.write_text('[study]\noutput = "o"\nreference = "local"\npaper = ["fedfcd"]\nrows = ["local", "fedfcd"]\n\n'
                    '[[point]]\ncap = 20\npresets = ["cap20.toml"]\n')
    assert main([str(path), "--app", str(tmp_path)]) == 0
    table = (tmp_path / "o" / "table.md").read_text()
    assert "| local | - |" in table and "(no runs of it or of local at cap 20)" in table
    assert not (tmp_path / "out").exists()  # the preset's own output: nothing ran
