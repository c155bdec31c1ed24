"""benchmarks.studies.cuda_vs_cpu: the GPU kit's per-method lines against the same runs on the CPU."""

import json

from benchmarks.studies.cuda_vs_cpu import main, parse

KIT = """# dataset='digits' partition='pathological' num-server-rounds=1 device='cuda', 3 supernodes, through python3 -m runner.launch (2026-11-27T07:19Z)
fedavg       ok             acc 0.5000  client-mean 0.4800  rounds 1  dropped 0   startup  84.1s round1  6.02s took 101s
majority     FAIL(rc=1)     acc -       client-mean -       rounds -  dropped -   startup     -s round1     -s took 30s  | the run ended finished:failed
cfl          NOT-RUN        (29s left in the step)
"""


def test_the_kit_lines_parse_into_the_run_config_and_one_row_a_method():
    config, supernodes, rows = parse(KIT)
    assert config == {"dataset": "digits", "partition": "pathological", "num-server-rounds": 1}
    assert supernodes == 3
    assert [(r["method"], r["status"], r["cuda_acc"], r["cuda_client_mean"]) for r in rows] == [
        ("fedavg", "ok", 0.5, 0.48), ("majority", "FAIL(rc=1)", None, None), ("cfl", "NOT-RUN", None, None)]


def test_each_method_runs_on_the_cpu_and_the_table_gives_the_difference(tmp_path):
    kit = tmp_path / "methods.txt"
    kit.write_text("\n".join(KIT.splitlines()[:3]).replace("majority", "local"))  # cfl left out: time
    assert main([str(kit), "--out", str(tmp_path / "out"), "--gpu", "a test GPU"]) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    fedavg = rows[0]
    assert 0 < fedavg["cpu_acc"] <= 1 and 0 < fedavg["cpu_client_mean"] <= 1
    text = (tmp_path / "out" / "table.md").read_text()
    assert f"| fedavg | ok | 50.00 | {100 * fedavg['cpu_acc']:.2f} | {100 * (0.5 - fedavg['cpu_acc']):+.2f} |" in text
    assert "| local | FAIL(rc=1) | - |" in text and "a test GPU" in text


def test_with_seeds_each_cuda_run_stands_beside_the_cpus_spread(tmp_path):
    kit = tmp_path / "methods.txt"
    kit.write_text(KIT)
    assert main([str(kit), "--out", str(tmp_path / "out"), "--methods", "fedavg", "--seeds", "0,1"]) == 0
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    (row,) = result["rows"]
    a, b = row["cpu_seeds"]
    assert result["seeds"] == [0, 1] and a != b  # the seed draws the split: two different runs
    text = (tmp_path / "out" / "table.md").read_text()
    mean, std = 50 * (a + b), 100 * abs(a - b) / 2 ** 0.5  # the sample std of two values
    within = "yes" if min(a, b) <= 0.5 <= max(a, b) else "no"
    assert f"| fedavg | 50.00 | {100 * a:.2f} | {100 * b:.2f} | {mean:.2f} ± {std:.2f} | {within} |" in text
