"""The comparison command's table and curves, built from real (in-process) runs; presets are valid."""

import csv
import json
from pathlib import Path

import pytest

from fedcore.config import Config
from runner.compare import run_all
from runner.compare_presets import Entry, entries, load_preset
from runner.compare_rows import aggregate_row
from runner.compare_table import write_table
from runner.figures import write_figures

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("preset", sorted((ROOT / "conf").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_presets_are_valid_run_configs(preset):
    spec = load_preset(preset)
    for entry in entries(spec):
        Config.from_run_config({**spec.get("run-config", {}), **entry.config, "method": entry.method})


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
    write_figures(out, {**preset, "compare": {**preset["compare"], "methods": ["local", "fedavg"], "seeds": [0, 1]}})

    local = summaries["local"]
    expected = sum(s["final_acc"] for s in local) / 2
    table = (out / "table.md").read_text()
    assert f"| local | {100 * expected:.2f} ±" in table and "| fedavg |" in table
    with open(out / "table.csv") as f:
        got = {r["method"]: r for r in csv.DictReader(f)}
    assert float(got["local"]["final_acc"]) == pytest.approx(expected)
    assert int(got["fedavg"]["seeds"]) == 2
    assert float(got["local"]["mb_up_per_round"]) < float(got["fedavg"]["mb_up_per_round"])
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG" and (out / "headline.png").exists()
    # the figure's headline (no validation split here: best-of-test): mean and sample std over the seeds' runs
    with open(out / "headline.csv") as f:
        plotted = {r["method"]: r for r in csv.DictReader(f)}
    best = [s["best_acc"] for s in local]
    assert float(plotted["local"]["mean"]) == pytest.approx(sum(best) / 2, abs=1e-6)
    assert float(plotted["local"]["std"]) == pytest.approx(abs(best[0] - best[1]) / 2 ** 0.5, abs=1e-6)
    assert plotted["local"]["metric"] == "best_acc" and plotted["fedavg"]["seeds"] == "2"


def test_variants_have_labels_options_and_rows_read_from_other_runs():
    preset = {"compare": {"methods": ["fedprox", "fedprox-strong", "R-x"]},
              "run-config": {"dataset": "digits"},
              "method-config": {"fedprox": {"fedprox.mu": 0.01}},
              "variants": {"fedprox-strong": {"method": "fedprox", "fedprox.mu": 1.0},
                           "R-x": {"runs-of": "fedprox-strong", "accuracy": "eval_relation_acc"}}}
    got = {e.label: e for e in entries(preset)}
    assert got["fedprox"] == Entry("fedprox", "fedprox", {"fedprox.mu": 0.01})
    assert got["fedprox-strong"].method == "fedprox" and got["fedprox-strong"].config == {"fedprox.mu": 1.0}
    assert got["R-x"].runs_of == "fedprox-strong" and got["R-x"].method == "fedprox" and got["R-x"].run_label == "fedprox-strong"
    with pytest.raises(SystemExit, match="not in the list"):
        entries({**preset, "compare": {"methods": ["R-x"]}})
    summaries = [{"final_acc": 0.5, "final_eval_relation_acc": 0.9, "final_eval_relation_acc_client_mean": 0.8,
                  "best_eval_relation_acc": 0.95, "last10_eval_relation_acc": 0.85, "client_acc_mean": 0.4,
                  "best_acc": 0.6, "last10_acc": 0.5, "bytes_up_per_round": 1e6, "bytes_down_per_round": 1e6,
                  "wall_s_per_round": 1.0, "client_acc_std": 0.1}]
    row = aggregate_row("R-x", summaries, "eval_relation_acc")
    assert (row["final_acc"], row["client_acc_mean"], row["best_acc"], row["last10_acc"]) == (0.9, 0.8, 0.95, 0.85)
    assert aggregate_row("fedprox", summaries)["final_acc"] == 0.5


def test_inprocess_engine_runs_a_preset_end_to_end(tmp_path, monkeypatch, capsys):
    """engine = "inprocess": the same ServerApp and ClientApp in worker processes, table and curves written;
    started by `make tables` (which passes its study's counts), its progress line counts the whole study."""
    from runner.compare import run_all
    from runner.progress import study_env

    monkeypatch.setenv(*next(iter(study_env(5, 9, 0.0).items())))
    from tests.conftest import test_device

    preset = {"compare": {"methods": ["local", "fedavg-strong"], "seeds": [0], "supernodes": 3,
                          "output": str(tmp_path / "cmp"), "engine": "inprocess", "jobs": 2},
              "run-config": {"dataset": "digits", "num-server-rounds": 2, "node-wait-s": 0, "device": test_device()},
              "variants": {"fedavg-strong": {"method": "fedprox", "fedprox.mu": 1.0}}}
    out = run_all(preset, ROOT)  # on CUDA its workers are spawned (runner.inprocess.pool_context)
    table = (out / "table.md").read_text()
    assert "| local |" in table and "| fedavg-strong |" in table and "engine inprocess" in table
    assert (out / "runs" / "fedavg-strong-s0" / "summary.json").exists()
    assert (out / "curves.png").exists()
    assert "study cmp: 7/9 runs done | elapsed" in capsys.readouterr().out


def test_table_only_tables_the_finished_runs_and_names_the_missing(tmp_path):
    from tests.conftest import run_inprocess

    preset = {"compare": {"methods": ["local", "fedavg"], "seeds": [0, 1], "supernodes": 3, "output": "cmp",
                          "engine": "inprocess"},
              "run-config": {"dataset": "digits", "num-server-rounds": 2}}
    out = tmp_path / "cmp"
    for method, seeds in (("local", (0, 1)), ("fedavg", (0,))):
        for seed in seeds:
            run_inprocess(tmp_path, 3, None, method=method, seed=seed, **{"num-server-rounds": 2,
                          "results-dir": str(out / "runs"), "run-name": f"{method}-s{seed}"})
    from runner import provenance

    code = provenance.stamp()
    for folder in (out / "runs").iterdir():  # what compare records beside each run it makes
        provenance.record(folder, code, {})
    (out / "runs" / "fedavg-s1").mkdir()  # a cut-off run: no summary, so it is missing, not reused
    run_all(preset, tmp_path, table_only=True)
    table = (out / "table.md").read_text()
    assert "| local | " in table and "| fedavg (1 seed) | " in table
    assert "Not run (1): fedavg seed 1" in table

    # seeds asked for on the command line (--seeds) are the ones a row is labelled against and preset.json records
    preset["compare"]["seeds"] = [0]
    run_all(preset, tmp_path, seeds=[0, 1], table_only=True)
    table = (out / "table.md").read_text()
    assert "| local | " in table and "| fedavg (1 seed) | " in table
    assert json.loads((out / "preset.json").read_text())["compare"]["seeds"] == [0, 1]


def test_readme_tables_are_copied_from_their_files_and_checked(tmp_path, capsys):
    from benchmarks.readme_tables import ROOT, main, markdown_files, rebuild

    (tmp_path / "t.md").write_text("| a |\n|---|\n| 1 |\n")
    text = "intro\n<!-- table: t.md -->\nold\n<!-- /table -->\nend\n"
    new, changed = rebuild(text, tmp_path)
    assert new == "intro\n<!-- table: t.md -->\n| a |\n|---|\n| 1 |\n<!-- /table -->\nend\n" and changed == ["t.md"]
    assert rebuild(new, tmp_path)[1] == []  # up to date
    with pytest.raises(SystemExit, match="docs/x.md names missing.md"):
        rebuild("<!-- table: missing.md -->\n<!-- /table -->\n", tmp_path, "docs/x.md")

    # every page is covered: README.md and docs/**/*.md, block paths from the repository root
    (tmp_path / "README.md").write_text(text)
    (tmp_path / "docs" / "papers").mkdir(parents=True)
    (tmp_path / "docs" / "papers" / "m.md").write_text(text)
    (tmp_path / "docs" / "plain.md").write_text("no blocks\n")
    assert markdown_files(tmp_path) == [tmp_path / "README.md", tmp_path / "docs" / "papers" / "m.md",
                                        tmp_path / "docs" / "plain.md"]
    assert main(["--check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "README.md: out of date: t.md" in out and "docs/papers/m.md: out of date: t.md" in out
    assert (tmp_path / "docs" / "papers" / "m.md").read_text() == text  # --check changes nothing
    assert main(["--root", str(tmp_path)]) == 0
    assert (tmp_path / "README.md").read_text() == new == (tmp_path / "docs" / "papers" / "m.md").read_text()
    assert main(["--check", "--root", str(tmp_path)]) == 0

    # and this repository's pages hold the current tables (run `make readme` after a benchmark)
    assert [p.name for p in markdown_files(ROOT)][0] == "README.md"
    assert main(["--check"]) == 0, capsys.readouterr().out


def _result_tables():
    root = Path(__file__).resolve().parents[1] / "docs" / "results"
    return sorted(p for p in root.glob("*/table.md") if (p.parent / "preset.json").exists())


@pytest.mark.parametrize("table", _result_tables(), ids=lambda p: p.parent.name)
def test_every_comparison_table_in_docs_is_what_the_current_code_renders_from_its_csv(table):
    """A table in docs/ whose columns or headers the current code no longer writes fails here; rebuild it with
    its preset, or `python -m runner.compare --rerender docs/results/<name>` where only the layout changed."""
    from runner.compare_table import footer_failures, read_table_csv, render_table

    preset = json.loads((table.parent / "preset.json").read_text())
    rendered = render_table(read_table_csv(table.parent / "table.csv"), preset, footer_failures(table))
    assert table.read_text() == rendered


def test_the_papers_numbers_sit_beside_ours_in_the_papers_metric():
    from runner.compare_table import render_table

    preset = {"compare": {"methods": ["a", "b"], "seeds": [0, 1]}, "run-config": {"dataset": "digits"},
              "paper": {"metric": "client mean", "values": {"a": 91.5}}}
    row = {"final_acc": 0.9, "final_acc_std": 0.01, "client_acc_mean": 0.8, "client_acc_mean_std": 0.02,
           "test_acc_at_best_val": 0.93, "test_acc_at_best_val_std": 0.0,
           "test_client_acc_mean_at_best_val": 0.85, "test_client_acc_mean_at_best_val_std": 0.03,
           "last10_acc": 0.9, "last10_acc_std": 0.0, "client_acc_std_within": 0.05,
           "mb_up_per_round": 1.0, "mb_down_per_round": 1.0, "wall_s_per_round": 0.5, "seeds": 2}
    text = render_table([{**row, "method": "a"}, {**row, "method": "b"}], preset, [])
    header = next(line for line in text.splitlines() if line.startswith("| method"))
    assert "| paper (client mean) | ours (client mean, at best-val round) |" in header
    assert "| a | 91.50 | 85.00 ± 3.00 |" in text  # ours in the paper's metric: the client mean at best-val round
    assert "| b | - | 85.00 ± 3.00 |" in text
    assert "| 5.00 |" in text  # the client spread, in its own column
    preset["paper"]["data"] = "CIFAR-10"  # the paper's data, where it is not ours, named in the header
    header = next(line for line in render_table([{**row, "method": "a"}], preset, []).splitlines()
                  if line.startswith("| method"))
    assert "| paper (CIFAR-10, client mean) | ours (client mean, at best-val round) |" in header


def test_a_paper_table_with_an_unknown_metric_or_row_is_refused(tmp_path):
    from runner.compare_presets import load_preset

    base = '[compare]\nmethods = ["fedavg"]\n[run-config]\ndataset = "digits"\n'
    (tmp_path / "a.toml").write_text(base + '[paper]\nmetric = "best"\nvalues = { fedavg = 1.0 }\n')
    with pytest.raises(SystemExit, match="metric must be one of"):
        load_preset(tmp_path / "a.toml")
    (tmp_path / "b.toml").write_text(base + '[paper]\nmetric = "pooled"\nvalues = { fedper = 1.0 }\n')
    with pytest.raises(SystemExit, match="not in the methods list: fedper"):
        load_preset(tmp_path / "b.toml")
    (tmp_path / "c.toml").write_text(base + '[paper]\nmetric = "pooled"\ndata = 10\nvalues = { fedavg = 1.0 }\n')
    with pytest.raises(SystemExit, match="data must be a string"):
        load_preset(tmp_path / "c.toml")


def test_a_sweep_table_becomes_one_row_per_combination_and_bad_ones_are_refused(tmp_path):
    """[sweep]: the last key varies fastest; labels from the template (or method-value-value); a sweep without a
    method, a value that is not a non-empty list, a template naming an unswept key, or a grid label that is already
    a row are refused when the preset loads."""
    base = ('[compare]\nmethods = ["fedavg"]\n[run-config]\ndataset = "digits"\n'
            '[sweep]\nmethod = "fedprox"\n"fedprox.mu" = [0.1, 1.0]\nlr = [0.01, 0.05]\n')
    (tmp_path / "a.toml").write_text(base)
    preset = load_preset(tmp_path / "a.toml")
    assert preset["compare"]["methods"] == ["fedavg", "fedprox-0.1-0.01", "fedprox-0.1-0.05", "fedprox-1-0.01",
                                            "fedprox-1-0.05"]
    rows = {e.label: e for e in entries(preset)}
    assert (rows["fedprox-1-0.01"].method, rows["fedprox-1-0.01"].config) == ("fedprox", {"fedprox.mu": 1.0, "lr": 0.01})
    (tmp_path / "b.toml").write_text(base.replace('method = "fedprox"\n', 'method = "fedprox"\nlabel = "p{fedprox.mu:g}-{lr:.3f}"\n'))
    assert load_preset(tmp_path / "b.toml")["compare"]["methods"][1:3] == ["p0.1-0.010", "p0.1-0.050"]
    for name, text, match in [("c", base.replace('method = "fedprox"\n', ""), "needs method"),
                              ("d", base.replace("lr = [0.01, 0.05]", "lr = 0.01"), "not a non-empty list"),
                              ("e", base.replace("lr = [0.01, 0.05]", "lr = []"), "not a non-empty list"),
                              ("f", base.replace('method = "fedprox"\n', 'method = "fedprox"\nlabel = "p{mu}"\n'),
                               "'mu' is not a swept key"),
                              ("g", base.replace('method = "fedprox"\n', 'method = "fedprox"\nlabel = "fedavg"\n'),
                               "already taken"),
                              ("h", base.replace('method = "fedprox"\n', 'method = "fedprox"\nlabel = "p{lr}"\n'),
                               "already taken")]:
        (tmp_path / f"{name}.toml").write_text(text)
        with pytest.raises(SystemExit, match=match):
            load_preset(tmp_path / f"{name}.toml")


@pytest.mark.parametrize("name", ["pfedpm-digits-sweep", "fedfcd-mnist5k-sweep"])
def test_a_sweep_preset_has_the_rows_of_its_committed_table(name):
    """The [sweep] grids that replaced the two sweep scripts give the rows (labels, methods, run-config values) the
    committed runs were made with, so --reuse keeps them and --table-only tables them."""
    preset = load_preset(ROOT / "conf" / f"{name}.toml")
    committed = json.loads((ROOT / "docs" / "results" / name / "preset.json").read_text())
    assert preset["compare"]["methods"] == committed["compare"]["methods"]
    assert preset["variants"] == committed["variants"]


def test_make_tables_rebuilds_every_comparison_table_in_docs():
    """Each docs/results table written by the comparison has a preset that `make tables` runs."""
    from benchmarks.tables import presets

    outputs = {p.output for p in presets()}
    for table in _result_tables():
        assert f"docs/results/{table.parent.name}" in outputs, table.parent.name


def test_make_tables_rebuilds_a_traffic_preset_with_its_own_builder():
    """A folder with more than the comparison writes (a [sweep] preset's sweep.md is the comparison's own) is rebuilt
    by the module that writes all of it: runner.compare alone would leave its extra tables stale."""
    import importlib
    import tomllib

    from benchmarks.tables import BUILDERS, presets

    found = {p.name: p for p in presets()}
    for name, module in BUILDERS.items():
        assert name in found, f"BUILDERS names {name}, which is no preset"
        assert found[name].builder == module and callable(importlib.import_module(module).main)
    for p in found.values():
        # tuning.md is benchmarks.tune's (issue #45), which a table rebuild leaves alone
        ours = {"table.md", "tuning.md"} | ({"sweep.md"} if "sweep" in tomllib.loads(p.path.read_text()) else set())
        extra = {f.name for f in (ROOT / p.output).glob("*.md")} - ours
        if extra:
            assert p.builder != "runner.compare", f"{p.name} ({sorted(extra)}) needs a builder in BUILDERS"
    sweep = found["pfedpm-digits-sweep"]
    assert sweep.runs == 36, "its 12 grid points, 3 seeds"


def test_the_readme_summary_is_built_from_the_current_docs_tables():
    from benchmarks.summary import ROOT, render, split_by_data, summary_rows

    files = split_by_data(summary_rows())
    for name, rows in files.items():
        assert (ROOT / "docs" / "results" / "summary" / name).read_text() == render(rows), "run `make readme`"
    # README leads with the papers' own data (Fashion-MNIST); the package's embedded data has its own page
    assert {r["dataset"] for r in files["table.md"]} == {"fmnist"}
    assert {r["dataset"] for r in files["embedded-data.md"]} == {"mnist5k", "synthetic"}


def test_the_summary_compares_with_the_best_baseline_in_the_same_metric(tmp_path):
    from benchmarks.summary import render, summary_rows

    folder = tmp_path / "x-table"
    folder.mkdir()
    (folder / "preset.json").write_text(json.dumps({"compare": {"methods": ["fedsac", "fedavg", "local"]},
                                                    "paper": {"metric": "weighted", "values": {},
                                                              "source": ["fedsac/table1-cifar10-iid"]}}))
    cols = "method,final_acc,final_acc_std,test_acc_at_best_val,test_acc_at_best_val_std,seeds\n"
    (folder / "table.csv").write_text(cols + "fedsac,0.90,0.01,0.91,0.02,3\nfedavg,0.95,0.01,0.89,0.01,3\n"
                                             "local,0.80,0.01,0.85,0.01,3\n")
    (row,) = summary_rows(tmp_path)
    # chosen on validation where there is one: fedavg's higher final accuracy does not count
    assert (row["metric"], row["baseline"], row["ours"], row["base"]) == ("test_acc_at_best_val", "fedavg", 0.91, 0.89)
    # the paper's gain: FedSaC 70.89 minus the best baseline of the paper's column (pFedGraph 67.37), on CIFAR-10
    assert row["claimed"]["gain"] == pytest.approx(3.52) and row["claimed"]["baseline"] == "pFedGraph"
    text = render([row])
    assert "| +3.52 vs pFedGraph (CIFAR-10; Table 1, CIFAR-10, Homo; client mean) |" in text
    assert "| +2.00 (paired interval not available until rebuilt) |" in text  # a table without per-seed data


def test_the_summary_difference_carries_the_tables_paired_interval_and_says_tie(tmp_path):
    from benchmarks.summary import render, summary_rows

    folder = tmp_path / "x-table"
    folder.mkdir()
    (folder / "preset.json").write_text(json.dumps({"compare": {"methods": ["fedsac", "fedrep"]},
                                                    "paper": {"metric": "client mean", "data": "CIFAR-10",
                                                              "source": ["fedsac/table1-cifar10-iid"]}}))
    cols = ("method,final_acc,final_acc_std,test_acc_at_best_val,test_acc_at_best_val_std,"
            "test_client_acc_mean_at_best_val,test_client_acc_mean_at_best_val_std,seeds,paired_vs,paired_metric,"
            "diff_mean,diff_lo,diff_hi,diff_n\n")
    # weighted, fedsac wins; client mean, fedrep wins: the row must follow the paper's metric
    (folder / "table.csv").write_text(
        cols + "fedsac,0.9,0,0.92,0.01,0.86,0.01,3,fedsac,test_client_acc_mean_at_best_val,,,,0\n"
               "fedrep,0.9,0,0.90,0.01,0.88,0.01,3,fedsac,test_client_acc_mean_at_best_val,-0.02,-0.05,0.01,3\n")
    (row,) = summary_rows(tmp_path)
    assert (row["metric"], row["ours"], row["base"]) == ("test_client_acc_mean_at_best_val", 0.86, 0.88)
    assert row["paired"]["tie"] and "| -2.00 [-5.00, +1.00] tie |" in render([row])


def test_the_summary_leaves_out_a_table_whose_runs_are_not_all_made(tmp_path):
    """A table committed part-way through (its records kept across sittings) has no best baseline yet."""
    from benchmarks.summary import summary_rows

    folder = tmp_path / "x-table"
    folder.mkdir()
    (folder / "preset.json").write_text(json.dumps({"compare": {"methods": ["fedsac", "fedavg", "local"]}}))
    (folder / "table.csv").write_text("method,final_acc,final_acc_std,seeds\nfedsac,0.90,0.01,3\nfedavg,0.80,0.01,3\n")
    (folder / "table.md").write_text("| method |\n\nNot run (3): local seed 0; local seed 1; local seed 2\n")
    assert summary_rows(tmp_path) == []
    (folder / "table.md").write_text("| method |\n\nNot run (1): fedsac-no-graph seed 0\n")  # an ablation row
    assert [r["baseline"] for r in summary_rows(tmp_path)] == ["fedavg"]
    (folder / "table.md").write_text("| method |\n\nFailed runs: local seed 0: crashed\n")  # run, and failed: shown
    (row,) = summary_rows(tmp_path)
    assert (row["method"], row["baseline"]) == ("fedsac", "fedavg")
