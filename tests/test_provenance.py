"""Tables anyone can audit: made from committed code only, runs reused only while their code and config match,
per-run data that recomputes every committed table, and the paired t-interval checked by hand."""

import json
import math
import subprocess
from pathlib import Path

import pytest

from runner import provenance, run_data, stats
from tests.conftest import begin_and_cut_off, git as _git, test_device

ROOT = Path(__file__).resolve().parents[1]


def test_compare_refuses_to_write_docs_from_a_dirty_tree(repo, capsys):
    from runner.compare import main

    preset = repo / "p.toml"  # untracked: a dirty tree
    preset.write_text('[compare]\nmethods = ["local"]\nseeds = [0]\nsupernodes = 2\nengine = "inprocess"\n'
                      f'output = "{repo / "docs" / "results" / "x"}"\n[run-config]\ndataset = "digits"\n'
                      'num-server-rounds = 1\n')
    with pytest.raises(provenance.DirtyTree, match=r"refusing to write docs/results/x .*p\.toml.*--allow-dirty"):
        main([str(preset)])
    assert not (repo / "docs").exists()  # nothing written, nothing run
    _git(repo, "add", "p.toml")
    _git(repo, "commit", "-q", "-m", "preset")
    (repo / "docs" / "results" / "x").mkdir(parents=True)
    (repo / "docs" / "results" / "x" / "table.md").write_text("old\n")  # the builders' own outputs do not count
    assert provenance.uncommitted() == [] and provenance.guard(repo / "docs" / "results" / "x", False) is False
    (repo / "fedcore" / "x.py").write_text("A = 2\n")  # a source edit
    with pytest.raises(provenance.DirtyTree, match="fedcore/x.py"):
        provenance.guard(repo / "docs" / "results" / "x", False)
    assert provenance.guard(repo / "docs" / "results" / "x", True) is True  # --allow-dirty: marked, not refused
    assert provenance.guard(repo / "elsewhere", False) is True  # outside docs/: tried freely


def test_the_resume_table_refuses_a_dirty_tree_before_it_runs_anything(repo, monkeypatch):
    from benchmarks import resume_table

    monkeypatch.setattr(resume_table, "resume_run", lambda *a, **k: pytest.fail("ran from a dirty tree"))
    (repo / "fedcore" / "x.py").write_text("A = 2\n")  # a source edit
    doc = repo / "docs" / "reliability.md"
    with pytest.raises(provenance.DirtyTree, match=r"refusing to write docs/reliability\.md .*fedcore/x\.py"):
        resume_table.main(["--methods", "fedavg", "--doc", str(doc)])
    assert not doc.exists()


def test_the_dirty_table_says_so_in_bold_and_lists_its_runs_commits():
    from runner.compare_table import made_line

    made = {"command": "python -m runner.compare conf/x.toml --reuse --seeds 0,1", "commit": "abc1234",
            "commits": {"abc1234": ["fedavg-s0", "fedavg-s1"], "0def567": ["local-s0"]}, "dirty": True}
    line = made_line({"made": made})
    assert "`python -m runner.compare conf/x.toml --reuse --seeds 0,1`" in line
    assert "Runs from commits `0def567` (1 runs: local); `abc1234` (2 runs: fedavg)." in line
    assert "**Made from a tree with uncommitted changes (`--allow-dirty`)" in line
    assert "Runs from commit `abc1234` (2 runs)." in made_line({"made": {**made, "dirty": False,
                                                                         "commits": {"abc1234": ["a-s0", "a-s1"]}}})


def test_the_recorded_command_is_the_full_command_line():
    assert provenance.command_line("runner.compare", ["conf/a b.toml", "--reuse", "--methods", "x,y"]) == \
        "python -m runner.compare 'conf/a b.toml' --reuse --methods x,y"


def test_a_benchmark_table_names_its_command_thread_settings_and_commit(repo, monkeypatch):
    from benchmarks import deployed_round, sim_speed

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()
    line = provenance.made_by("benchmarks.sim_speed", ["--clients", "20", "--out", "docs/results/sim speed"])
    assert line == (f"Made by `OMP_NUM_THREADS=1 python -m benchmarks.sim_speed --clients 20 --out "
                    f"'docs/results/sim speed'` at commit `{head}`.")
    (repo / "fedcore" / "x.py").write_text("A = 2\n")  # uncommitted code: the line says so
    assert provenance.made_by("benchmarks.reliability", []).endswith(f"at commit `{head}+changes`.")
    row = {"method": "fedavg", "engine": "sequential, 1 thread", "round_s": 1.0, "run_s": 9.0, "eval_share": 0.1,
           "startup_s": None, "first_round_s": 1.5}
    assert sim_speed.table([row], "s", "GPU: none", line).splitlines()[0] == line
    facts = {"cold_clientapp_start_s": 1.0, "partition_load_s": {"dataset": 0.1, "cache": 0.01},
             "load_average": (1.0, 1.0, 1.0), "cpus": 2, "rounds": 4, "made": line}
    times = {"round_s": 1.0, "first_round_s": 2.0}
    assert deployed_round.format_table([{"supernodes": 2, "simulation": times}], ["simulation"], facts) \
        .splitlines()[0] == line


def test_the_source_hash_follows_the_source_packages_only(repo):
    before = provenance.source_hash()
    (repo / "docs").mkdir()
    (repo / "docs" / "page.md").write_text("words\n")
    assert provenance.source_hash() == before  # docs do not decide numbers
    (repo / "fedcore" / "x.py").write_text("A = 2\n")
    assert provenance.source_hash() != before


def _preset(out: Path, methods=("fedavg", "local"), seeds=(0, 1)) -> dict:
    return {"compare": {"methods": list(methods), "seeds": list(seeds), "supernodes": 3, "output": str(out),
                        "engine": "inprocess", "focus": "fedavg"},
            "run-config": {"dataset": "digits", "num-server-rounds": 3, "val-fraction": 0.2, "node-wait-s": 0,
                           "device": test_device()}}


@pytest.fixture(scope="module")
def made_once(tmp_path_factory):
    """The default comparison (fedavg and local, seeds 0 and 1) and fedavg seed 0 alone, each run once for the
    module: tests copy the first (``compared``) and only read the second."""
    from runner.compare import run_all

    base = tmp_path_factory.mktemp("provenance")
    return {"cmp": run_all(_preset(base / "cmp"), ROOT),
            "whole": run_all(_preset(base / "whole", ("fedavg",), (0,)), ROOT) / "runs" / "fedavg-s0"}


@pytest.fixture
def compared(tmp_path, made_once) -> Path:
    """A private copy of the default comparison's folder, ``tmp_path / "cmp"``, as ``run_all`` left it."""
    import shutil

    return Path(shutil.copytree(made_once["cmp"], tmp_path / "cmp"))


def test_tuning_refuses_a_dirty_tree_but_not_the_family_file_it_writes_itself(repo, monkeypatch):
    """``benchmarks.tune`` writes docs/ and the family file every table of the family reads: from a tree with
    uncommitted source it refuses before running anything (``--allow-dirty`` runs and says ``+changes``). The
    family file that an earlier, cut-off call left uncommitted is its own output: a second call runs, and its
    record names the plain commit (it said ``+changes`` before)."""
    from benchmarks import tune
    from fedcore.registry import get_method

    monkeypatch.setattr(get_method("fedprox").declaration, "TUNING_GRID", [{"mu": 0.01}, {"mu": 5.0}])
    (repo / "conf").mkdir()
    preset = repo / "conf" / "tiny.toml"
    preset.write_text(f'''[compare]
methods = ["fedprox"]
seeds = [0]
supernodes = 3
engine = "inprocess"
output = "{repo / 'docs' / 'results' / 'tiny'}"
tuned = "tuned/fam.toml"
[run-config]
dataset = "digits"
model = "mlr"
val-fraction = 0.2
num-server-rounds = 2
device = "{test_device()}"
''')
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "preset")
    family = repo / "conf" / "tuned" / "fam.toml"
    (repo / "fedcore" / "x.py").write_text("A = 2\n")  # an uncommitted source edit
    with pytest.raises(SystemExit, match=r"uncommitted changes \(fedcore/x\.py\).*--allow-dirty"):
        tune.main([str(preset)])
    assert not (repo / "docs").exists() and not family.exists()  # nothing run, nothing written
    assert tune.main([str(preset), "--allow-dirty"]) == 0
    assert tune.read_family(family)["fedprox"]["commit"] == provenance.commit() + "+changes"
    # the dirty tree's own source hash, so a later reader can match it to a committed commit's
    assert tune.read_family(family)["fedprox"]["source-hash"] == provenance.source_hash() != ""
    _git(repo, "checkout", "fedcore/x.py")
    assert provenance.uncommitted() == ["conf/tuned/fam.toml"]  # the first call's output, not committed yet
    assert tune.main([str(preset), "--retune"]) == 0
    assert tune.read_family(family)["fedprox"]["commit"] == provenance.commit()


def test_reuse_keeps_a_run_only_while_its_source_and_config_match(tmp_path, monkeypatch, capsys):
    from runner.compare import run_all

    out = tmp_path / "cmp"
    run_all(_preset(out, ("local",), (0,)), ROOT)
    record = json.loads((out / "runs" / "local-s0" / "provenance.json").read_text())
    assert record["source_hash"] == provenance.source_hash() and record["config"]["method"] == "local"
    assert record["commit"] == provenance.commit()
    capsys.readouterr()
    run_all(_preset(out, ("local",), (0,)), ROOT, reuse=True)
    assert f"reuse: kept 1 of 1 runs, from commits {provenance.commit()} (1)" in capsys.readouterr().out
    real = provenance.source_hash
    monkeypatch.setattr(provenance, "source_hash", lambda root=None: "changed" + real(root)[7:])  # a source edit
    run_all(_preset(out, ("local",), (0,)), ROOT, reuse=True)
    assert "reuse: kept 0 of 1 runs, from commits -; 1 not kept: source changed" in capsys.readouterr().out
    assert json.loads((out / "runs" / "local-s0" / "provenance.json").read_text())["source_hash"].startswith("changed")
    changed = _preset(out, ("local",), (0,))
    changed["run-config"]["lr"] = 0.5
    run_all(changed, ROOT, reuse=True)
    assert "1 not kept: config changed" in capsys.readouterr().out


def test_reuse_takes_a_run_from_the_committed_per_run_data_when_its_folder_is_gone(compared, capsys):
    """A fresh clone has the table's runs.json.gz but no runs/: --reuse keeps each committed run made by this
    source with this config (no run is made again), the table and its figures come out the same, and a record
    of other source is run again."""
    import shutil

    from runner.compare import run_all

    out = compared
    table, records = (out / "table.md").read_text(), run_data.load(out)
    shutil.rmtree(out / "runs")
    (out / "curves.png").unlink()
    capsys.readouterr()
    run_all(_preset(out), ROOT, reuse=True)
    assert f"reuse: kept 4 of 4 runs, from commits {provenance.commit()} (4)" in capsys.readouterr().out
    assert not any((out / "runs").iterdir())  # nothing ran
    assert (out / "table.md").read_text() == table and run_data.load(out) == records
    assert (out / "curves.png").exists()

    edited = [{**r, "source_hash": "edited"} if r["label"] == "local" and r["seed"] == 1 else r for r in records]
    run_data.write(out, edited)
    run_all(_preset(out), ROOT, reuse=True)
    said = capsys.readouterr().out
    assert f"reuse: kept 3 of 4 runs, from commits {provenance.commit()} (3); 1 not kept: source changed" in said
    assert sorted(p.name for p in (out / "runs").iterdir() if p.is_dir()) == ["local-s1"]  # the one run again

    def untimed(runs):
        return [{k: v for k, v in r.items() if k != "wall_s_per_round"} for r in runs]

    assert untimed(run_data.load(out)) == untimed(records)  # and it repeats the committed run's numbers


def test_table_only_tables_runs_of_an_earlier_source_only_when_named(compared, capsys):
    """Seeds added later at the runs' own (older) commit join the committed table: --table-only keeps only runs of
    the current source, --runs-source HASH tables those of HASH (and only those) with the same numbers, and the
    Made-by line names both hashes. Without --table-only it is refused (runs are made by the current source), and
    so is a hash no run has, before anything is written."""
    import shutil

    from runner.compare import run_all

    from runner.compare_table import made_line

    out = compared
    table, records = (out / "table.csv").read_text(), run_data.load(out)
    current = records[0]["source_hash"]
    older = [{**r, "source_hash": "0ld50urce"} for r in records]  # as if made before the code moved on
    mixed = older[:-1] + records[-1:]  # one run of the current source beside three of the older one
    shutil.rmtree(out / "runs")
    capsys.readouterr()
    run_data.write(out, mixed)
    with pytest.raises(SystemExit, match=r"would drop 3 committed run\(s\) .* table them with --runs-source 0ld50urce"):
        run_all(_preset(out), ROOT, table_only=True)  # it would table the current source's one run only
    with pytest.raises(SystemExit, match=rf"would drop 1 committed run\(s\) .* under source hash {current}"):
        run_all(_preset(out), ROOT, table_only=True, runs_source="0ld50urce")
    assert run_data.load(out) == sorted(mixed, key=lambda r: (r["label"], r["seed"]))  # nothing written
    run_data.write(out, older[:-1])  # three runs of the older source, one seed not run
    run_all(_preset(out), ROOT, table_only=True, runs_source="0ld50urce")
    assert "reuse: kept 3 of 4 runs" in capsys.readouterr().out
    last = records[-1]
    assert f"Not run (1): {last['label']} seed {last['seed']}" in (out / "table.md").read_text()
    run_data.write(out, older)
    run_all(_preset(out), ROOT, table_only=True, runs_source="0ld50urce")
    assert (out / "table.csv").read_text() == table  # the same numbers as when the runs were made
    made = json.loads((out / "preset.json").read_text())
    line = made_line(made)
    assert "Every run has source hash `0ld50urce`" in line and f"the table's own code has `{current}`" in line
    assert not any((out / "runs").iterdir())  # nothing ran
    with pytest.raises(SystemExit, match="--runs-source .* needs --table-only"):
        run_all(_preset(out), ROOT, reuse=True, runs_source="0ld50urce")
    committed = (out / "runs.json.gz").read_bytes()
    with pytest.raises(SystemExit, match=r"would drop 4 committed run\(s\) .* --runs-source 0ld50urce"):
        run_all(_preset(out), ROOT, table_only=True, runs_source="0ld")  # a mistyped hash
    assert (out / "runs.json.gz").read_bytes() == committed and (out / "table.csv").read_text() == table
    (out / "runs.json.gz").unlink()  # no committed run at all
    with pytest.raises(SystemExit, match=r"--runs-source 0ld50urce: no finished run .* have: none\); nothing written"):
        run_all(_preset(out), ROOT, table_only=True, runs_source="0ld50urce")


def _cut_off_in_round_2(preset: dict, out: Path, code: dict) -> None:
    """Begin fedavg seed 0 of ``preset`` as its comparison job does and stop it in round 2, after round 1's
    checkpoint."""
    from runner.compare_presets import entries, job_config

    begin_and_cut_off(job_config(preset, entries(preset)[0], 0, out), code)


def _untimed_rounds(folder: Path) -> list[dict]:
    import csv

    with open(folder / "rounds.csv") as f:
        return [{k: v for k, v in r.items() if k not in ("wall_s", "eval_s", "startup_s")} for r in csv.DictReader(f)]


def test_a_cut_off_run_moved_to_another_folder_resumes_there_to_the_uninterrupted_result(tmp_path, made_once, capsys):
    """A comparison's folder moved (or its clone checked out elsewhere) after a run was cut off: the checkpoint's
    results-dir is the old path, and the run still goes on from it in the new one."""
    import shutil

    from runner.compare import run_all

    whole = made_once["whole"]
    first, moved = tmp_path / "first", tmp_path / "moved"
    _cut_off_in_round_2(_preset(first, ("fedavg",), (0,)), first, provenance.stamp())
    shutil.move(first, moved)
    capsys.readouterr()
    run_all(_preset(moved, ("fedavg",), (0,)), ROOT, resume=True)
    assert "resume: 1 of 1 runs left continue from their checkpoints (fedavg-s0 at round 1)" in capsys.readouterr().out
    assert _untimed_rounds(moved / "runs" / "fedavg-s0") == _untimed_rounds(whole)
    assert provenance.read(moved / "runs" / "fedavg-s0")["resumed"]["from_round"] == 1


def test_a_run_cut_off_after_its_last_checkpoint_starts_over_instead_of_resuming_nothing(tmp_path):
    """Killed between its last round's checkpoint and its summary, a run has no round left to resume (the server
    would refuse it): it starts over; one round earlier it goes on from there."""
    from server_app import checkpoints

    folder, code = tmp_path / "fedavg-s0", provenance.stamp()
    config = {"method": "fedavg", "num-server-rounds": 3, "results-dir": str(tmp_path), "run-name": "fedavg-s0"}
    provenance.mark_started(folder, code, config)
    for r in (2, 3):
        checkpoints.save(folder, r, {"x": r}, keep=2)
    assert provenance.resumable(folder, config, code) == (None, "nothing left to resume")
    (folder / checkpoints.FOLDER / "round-00003.ckpt").unlink()
    assert provenance.resumable(folder, config, code) == (2, "")


def test_resume_continues_a_cut_off_run_only_under_the_code_that_began_it(tmp_path, made_once, monkeypatch, capsys):
    """``--resume``: a comparison run cut off mid-way continues from its checkpoint to the uninterrupted
    result and its record names where it went on from; begun under other source code, it starts over."""
    from runner.compare import run_all

    whole = made_once["whole"]
    out = tmp_path / "cut"
    _cut_off_in_round_2(_preset(out, ("fedavg",), (0,)), out, provenance.stamp())
    run = out / "runs" / "fedavg-s0"
    assert provenance.started_path(run).exists() and not (run / "summary.json").exists()
    capsys.readouterr()
    run_all(_preset(out, ("fedavg",), (0,)), ROOT, resume=True)
    said = capsys.readouterr().out
    assert "resume: 1 of 1 runs left continue from their checkpoints (fedavg-s0 at round 1)" in said
    assert _untimed_rounds(run) == _untimed_rounds(whole)
    record = provenance.read(run)
    assert record["resumed"] == {"began_at_commit": provenance.commit(), "from_round": 1}
    assert not provenance.started_path(run).exists()  # the record supersedes it

    other = tmp_path / "other"
    _cut_off_in_round_2(_preset(other, ("fedavg",), (0,)), other, {**provenance.stamp(), "source_hash": "edited"})
    capsys.readouterr()
    run_all(_preset(other, ("fedavg",), (0,)), ROOT, resume=True)
    assert "resume: 0 of 1 runs left continue from their checkpoints; 1 start over: source changed" in capsys.readouterr().out
    assert _untimed_rounds(other / "runs" / "fedavg-s0") == _untimed_rounds(whole)
    assert "resumed" not in provenance.read(other / "runs" / "fedavg-s0")


def _recomputed_table(folder: Path) -> str:
    from runner.compare_presets import entries
    from runner.compare_rows import table_rows
    from runner.compare_table import footer_failures, render_table

    preset = json.loads((folder / "preset.json").read_text())
    rows = table_rows(entries(preset), run_data.summaries(folder), preset)
    return render_table(rows, preset, footer_failures(folder / "table.md"))


def test_a_table_recomputes_from_its_per_run_data(made_once):
    out = made_once["cmp"]
    assert _recomputed_table(out) == (out / "table.md").read_text()
    for run in run_data.load(out):  # the recomputed summary is the run's own
        saved = json.loads((out / "runs" / f"{run['label']}-s{run['seed']}" / "summary.json").read_text())
        again = run_data.summary(run)
        for key in ("final_acc", "client_acc_mean", "test_acc_at_best_val", "test_client_acc_mean_at_best_val",
                    "best_acc", "last10_acc"):
            assert again[key] == saved[key], key
        clients = run["clients_final"]
        assert sum(clients["accuracy"]) / len(clients["accuracy"]) == pytest.approx(saved["client_acc_mean"])
    assert str(out.parent) not in json.dumps(run_data.load(out))  # no path of the machine that ran it
    table = (out / "table.md").read_text()
    assert "± is the sample std over seeds (ddof = 1)" in table and "95% t-interval" in table
    assert "| fedavg minus row (at best-val round, weighted; points, paired 95% t-interval over seeds) |" in table


@pytest.mark.parametrize("folder", sorted(p.parent for p in (ROOT / "docs" / "results").glob(f"*/{run_data.FILE}")),
                         ids=lambda p: p.name)
def test_every_docs_table_with_per_run_data_recomputes_from_it(folder):
    assert _recomputed_table(folder) == (folder / "table.md").read_text()
    assert (folder / run_data.FILE).stat().st_size < 400_000, "per-run data must stay small"
    commits = json.loads((folder / "preset.json").read_text())["made"]["commits"]
    assert {r["commit"] for r in run_data.load(folder)} == set(commits)
    paths = {v for r in run_data.load(folder) for v in r["config"].values() if isinstance(v, str) and v.startswith("/")}
    assert not paths, f"machine paths in {run_data.FILE}: {sorted(paths)[:3]}"


def test_the_paired_t_interval_matches_a_hand_computation():
    # d = 0.02, 0.01, 0.05: mean 0.0266667, sample sd sqrt(((-1/150)^2 + (-1/60)^2 + (7/300)^2) / 2) = 0.0208167;
    # t(0.975, 2 df) = 4.302653 (any t table), half-width = 4.302653 * 0.0208167 / sqrt(3) = 0.0517114
    got = stats.paired_difference({0: 0.90, 1: 0.92, 2: 0.95, 3: 0.5}, {0: 0.88, 1: 0.91, 2: 0.90})
    assert got["n"] == 3 and got["mean"] == pytest.approx(0.0266667, abs=1e-7)
    assert (got["lo"], got["hi"]) == (pytest.approx(0.0266667 - 0.0517114, abs=1e-6),
                                      pytest.approx(0.0266667 + 0.0517114, abs=1e-6))
    assert got["tie"] and stats.difference_cell(got) == "+2.67 [-2.50, +7.84] tie"
    clear = stats.paired_difference({0: 0.92, 1: 0.931, 2: 0.919}, {0: 0.90, 1: 0.91, 2: 0.90})
    # d = 0.020, 0.021, 0.019: sd 0.001, half-width 4.302653 * 0.001 / sqrt(3) = 0.0024841
    assert (clear["lo"], clear["hi"]) == (pytest.approx(0.02 - 0.0024841, abs=1e-6),
                                          pytest.approx(0.02 + 0.0024841, abs=1e-6))
    assert not clear["tie"] and stats.difference_cell(clear) == "+2.00 [+1.75, +2.25]"
    assert stats.difference_cell(stats.paired_difference({0: 0.9}, {0: 0.8})) == "+10.00 (1 seed: no interval)"


def test_sample_std_and_its_conversion_from_a_population_std():
    values = [0.90, 0.92, 0.95]
    population = math.sqrt(sum((v - sum(values) / 3) ** 2 for v in values) / 3)
    assert stats.sample_std(values) == pytest.approx(math.sqrt(sum((v - sum(values) / 3) ** 2 for v in values) / 2))
    assert stats.sample_from_population(population, 3) == pytest.approx(stats.sample_std(values))
    assert math.isnan(stats.sample_std([0.5]))


@pytest.mark.parametrize("preset", sorted((ROOT / "docs" / "results").glob("*/preset.json")), ids=lambda p: p.parent.name)
def test_no_docs_table_shows_a_population_std(preset):
    assert json.loads(preset.read_text()).get("std") in ("sample", "sample-converted")
