"""The rules of provenance and per-run data (runner/provenance.py, runner/run_data.py), each checked on its own:
what makes a tree dirty, what the source hash covers, when a finished run may be reused and a cut-off one
resumed, what the records say, and that per-run data recomputes a run's summary and is byte-identical."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from runner import provenance, run_data

CODE = {"commit": "abc1234", "source_hash": "h1", "dirty": False}
CONFIG = {"method": "fedavg", "lr": 0.1, "num-server-rounds": 5, "results-dir": "/a", "overwrite": False,
          "resume": False, "tracker": "none", "tracker-project": "p"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    """A git checkout with one committed source file and a committed doc."""
    for path, text in (("fedcore/x.py", "A = 1\n"), ("docs/page.md", "words\n"), ("README.md", "r\n")):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "init")
    return tmp_path


def test_uncommitted_paths_are_modified_staged_or_untracked_less_the_builders_outputs(repo):
    assert provenance.uncommitted(repo) == []
    (repo / "docs" / "page.md").write_text("changed\n")
    (repo / "README.md").write_text("changed\n")
    assert provenance.uncommitted(repo) == []  # the builders' own outputs
    (repo / "fedcore" / "x.py").write_text("A = 2\n")
    (repo / "new dir").mkdir()
    (repo / "new dir" / "y.py").write_text("B = 1\n")
    (repo / "X.py").write_text("")
    assert sorted(provenance.uncommitted(repo)) == ["X.py", "fedcore/x.py", "new dir/y.py"]
    (repo / "X.py").unlink()
    assert provenance.uncommitted(repo, outputs=("fedcore/", "new")) == ["README.md", "docs/page.md"]
    _git(repo, "add", "fedcore/x.py")
    _git(repo, "mv", "README.md", "RENAMED.md")
    assert sorted(provenance.uncommitted(repo)) == ["RENAMED.md", "fedcore/x.py", "new dir/y.py"]
    assert provenance.uncommitted(repo / "fedcore" / "x.py") == ["(not a git checkout)"]


@pytest.fixture
def clean_root(tmp_path_factory, monkeypatch):
    """The module's default ROOT pointed at a clean checkout: a rule that ignored its ``root`` would read it."""
    other = tmp_path_factory.mktemp("clean")
    (other / "a.py").write_text("")
    _git(other, "init", "-q")
    _git(other, "add", ".")
    _git(other, "commit", "-q", "-m", "init")
    monkeypatch.setattr(provenance, "ROOT", other)
    return other


def test_the_source_hash_is_sha256_over_each_files_path_and_bytes(repo):
    import hashlib

    assert provenance.source_hash(repo) == hashlib.sha256(b"fedcore/x.py\0A = 1\n\0").hexdigest()[:16]


def test_the_commit_and_tree_commit_say_where_the_code_stands(repo, tmp_path_factory, clean_root):
    head = _git(repo, "rev-parse", "--short=7", "HEAD").strip()
    assert provenance.commit(repo) == head and provenance.tree_commit(repo) == head
    (repo / "fedcore" / "x.py").write_text("A = 2\n")
    assert provenance.tree_commit(repo) == head + "+changes"
    assert provenance.commit(tmp_path_factory.mktemp("nogit")) == "unknown"
    assert provenance.stamp(repo) == {"commit": head, "source_hash": provenance.source_hash(repo), "dirty": True}


def test_the_source_hash_covers_every_source_package_file_by_path_and_content(repo):
    before = provenance.source_hash(repo)
    assert len(before) == 16
    (repo / "fedcore" / "__pycache__").mkdir()
    (repo / "fedcore" / "__pycache__" / "x.py").write_text("cached\n")
    (repo / "docs" / "z.py").write_text("not source\n")
    assert provenance.source_hash(repo) == before
    for package in provenance.SOURCE_PACKAGES:
        (repo / package / "sub").mkdir(parents=True, exist_ok=True)
        (repo / package / "sub" / "n.py").write_text("N = 0\n")
        now = provenance.source_hash(repo)
        assert now != before, package
        before = now
    (repo / "fedcore" / "x.py").rename(repo / "fedcore" / "w.py")  # same bytes, another path
    assert provenance.source_hash(repo) != before


def test_a_docs_table_from_a_dirty_tree_is_refused_unless_allowed_and_then_says_so(repo, clean_root):
    docs = repo / "docs" / "results" / "t"
    assert provenance.writes_docs(docs, repo) and not provenance.writes_docs(repo / "elsewhere", repo)
    assert provenance.guard(docs, False, repo) is False
    for k in range(9):
        (repo / "fedcore" / f"n{k}.py").write_text("")
    with pytest.raises(provenance.DirtyTree, match=r"docs/results/t from a tree with uncommitted changes "
                                                   r"\(fedcore/n0.py, (fedcore/n\d.py, ){6}fedcore/n7.py and 1 more\)"):
        provenance.guard(docs, False, repo)
    (repo / "fedcore" / "n8.py").unlink()
    with pytest.raises(provenance.DirtyTree, match=r"\(fedcore/n0.py, (fedcore/n\d.py, ){6}fedcore/n7.py\): commit"):
        provenance.guard(docs, False, repo)
    assert provenance.guard(docs, True, repo) is True
    assert provenance.guard(repo / "elsewhere", False, repo) is True  # not docs: never refused, but it says so
    assert provenance.guard(docs, False, repo, outputs=("fedcore/", "docs/")) is False
    assert provenance.guard(repo / "elsewhere", False, repo, outputs=("fedcore/",)) is False


def test_a_finished_run_is_reused_only_under_the_same_source_and_every_deciding_key(tmp_path):
    provenance.record(tmp_path, CODE, CONFIG)
    assert provenance.reusable(tmp_path, CONFIG, CODE) == (True, "")
    assert provenance.reusable(tmp_path, CONFIG, {**CODE, "source_hash": "h2"}) == (False, "source changed")
    assert provenance.reusable(tmp_path, {**CONFIG, "lr": 0.2}, CODE) == (False, "config changed")
    assert provenance.reusable(tmp_path, {**CONFIG, "new-key": 1}, CODE) == (False, "config changed")
    where = {"results-dir": "/b", "overwrite": True, "resume": True, "tracker": "wandb", "tracker-project": "q"}
    assert provenance.reusable(tmp_path, {**CONFIG, **where}, CODE) == (True, "")  # not deciding the numbers
    assert provenance.reusable(tmp_path / "gone", CONFIG, CODE) == (False, "no provenance record")
    assert provenance.matches(None, CONFIG, CODE) == (False, "no provenance record")
    assert provenance.matches({"source_hash": "h1"}, {"lr": 0.1}, CODE) == (False, "config changed")


def test_the_record_keeps_the_resolved_config_and_a_resumption_names_the_commit_that_began_it(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    provenance.record(folder, CODE, CONFIG)
    assert provenance.read(folder) == {**CODE, "config": CONFIG}
    (folder / "config.json").write_text(json.dumps({"method": "fedavg", "resolved": True}))
    provenance.mark_started(folder, {**CODE, "commit": "first"}, CONFIG)
    provenance.note_resumed(folder, 3)
    provenance.record(folder, CODE, CONFIG)
    assert provenance.read(folder) == {**CODE, "config": {"method": "fedavg", "resolved": True},
                                       "resumed": {"began_at_commit": "first", "from_round": 3}}
    assert not provenance.started_path(folder).exists()  # the start record is done with
    provenance.mark_started(folder, CODE, CONFIG)
    provenance.record(folder, CODE, CONFIG)
    assert "resumed" not in provenance.read(folder)  # a fresh run that was never resumed


def _checkpoint(folder: Path, rnd: int) -> None:
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    (folder / "checkpoints" / f"round-{rnd:05d}.ckpt").write_bytes(b"x")


def test_a_start_record_goes_beside_a_folder_not_made_yet(tmp_path):
    folder = tmp_path / "new" / "runs" / "fedavg-s0"
    provenance.mark_started(folder, CODE, CONFIG)
    assert json.loads(provenance.started_path(folder).read_text()) == {**CODE, "config": CONFIG}


def test_a_cut_off_run_resumes_from_its_newest_checkpoint_only_under_the_code_and_config_that_began_it(tmp_path):
    folder = tmp_path / "runs" / "fedavg-s0"
    assert provenance.started_path(folder) == tmp_path / "runs" / "fedavg-s0.started.json"
    assert provenance.resumable(folder, CONFIG, CODE) == (None, "no start record")
    folder.mkdir(parents=True)
    _checkpoint(folder, 1)
    provenance.mark_started(folder, CODE, CONFIG)
    assert not (folder / "checkpoints").exists()  # a fresh job leaves nothing of an earlier run to resume
    assert provenance.resumable(folder, CONFIG, CODE) == (None, "no checkpoint")
    for rnd in (2, 10, 3):
        _checkpoint(folder, rnd)
    assert provenance.resumable(folder, {**CONFIG, "num-server-rounds": 12}, CODE) == (None, "config changed")
    assert provenance.resumable(folder, CONFIG, {**CODE, "source_hash": "h2"}) == (None, "source changed")
    (folder / "checkpoints" / "round-00010.ckpt").unlink()
    assert provenance.resumable(folder, CONFIG, CODE) == (3, "")
    _checkpoint(folder, 5)
    assert provenance.resumable(folder, CONFIG, CODE) == (None, "nothing left to resume")
    no_rounds = {k: v for k, v in CONFIG.items() if k != "num-server-rounds"}
    assert provenance.resumable(folder, no_rounds, CODE) == (5, "")
    provenance.started_path(folder).write_text(json.dumps(CODE))  # a start record without its config
    assert provenance.resumable(folder, CONFIG, CODE) == (None, "config changed")
    provenance.started_path(folder).write_text("{broken")
    assert provenance.resumable(folder, CONFIG, CODE) == (None, "no start record")


def test_the_command_lines_are_quoted_as_typed_with_their_thread_settings(monkeypatch):
    assert provenance.command_line("runner.compare", ["conf/a b.toml", "--x", 3]) == \
        "python -m runner.compare 'conf/a b.toml' --x 3"
    monkeypatch.setattr("sys.argv", ["prog", "--from-argv"])
    assert provenance.command_line("m", None) == "python -m m --from-argv"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert provenance.benchmark_command("m", []) == "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=2 python -m m"
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    assert provenance.benchmark_command("m", ["a"]) == "python -m m a"


def test_made_by_names_the_command_and_the_tree(repo, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    head = provenance.commit(repo)
    assert provenance.made_by("m", ["x"], repo) == f"Made by `python -m m x` at commit `{head}`."


def test_the_commits_line_names_each_commit_with_its_runs():
    assert provenance.commits_line({}) == ""
    assert provenance.commits_line({"a": ["fedavg-s0", "fedavg-s1"]}) == "Runs from commit `a` (2 runs)."
    assert provenance.commits_line({"b": ["local-s0"], "a": ["fedavg-s0", "fedavg-s1", "ditto-s0"]}) == \
        "Runs from commits `a` (3 runs: ditto, fedavg); `b` (1 runs: local)."
    # a row label may hold "-s" itself: only the last one starts the seed
    assert provenance.commits_line({"a": ["fedavg-sgd-s-s0", "fedavg-sgd-s-s1"], "b": ["x-s2"]}) == \
        "Runs from commits `a` (2 runs: fedavg-sgd-s); `b` (1 runs: x)."


# ------------------------------------------------------------------ per-run data
def _run_folder(folder: Path, rows: list[dict], clients: list[tuple], summary: dict, config: dict | None = None):
    folder.mkdir(parents=True)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    lines = [",".join(columns)] + [",".join(str(r.get(c, "")) for c in columns) for r in rows]
    (folder / "rounds.csv").write_text("\n".join(lines) + "\n")
    (folder / "clients.csv").write_text("round,partition_id,accuracy,test_samples\n" +
                                        "".join(f"{r},{p},{a},{n}\n" for r, p, a, n in clients))
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "config.json").write_text(json.dumps(config or {"method": "fedavg", "results-dir": "/x"}))


ROWS = [{"round": 0, "acc_weighted": "", "bytes_up": 5},
        {"round": 1, "acc_weighted": 0.5, "acc_client_mean": 0.4, "val_acc_weighted": 0.6, "eval_rel": 0.1,
         "eval_clients": 3, "eval_s": 1.5, "eval_bytes_down": 7, "loss": 2.0},
        {"round": 2, "acc_weighted": 0.7, "acc_client_mean": 0.6, "val_acc_weighted": 0.5, "eval_rel": "",
         "eval_clients": 3, "eval_s": 1.0, "eval_bytes_down": 7, "loss": 1.0},
        {"round": 3, "acc_weighted": "", "acc_client_mean": "", "val_acc_weighted": "", "eval_rel": "",
         "eval_clients": 0, "eval_s": 0.0, "eval_bytes_down": 0, "loss": ""}]
SUMMARY = {"status": "completed", "bytes_up_per_round": 10.0, "bytes_down_per_round": 20.0,
           "wall_s_per_round": 1.5, "final_acc": None}


def test_a_run_folder_becomes_a_record_of_its_evaluated_rounds_final_clients_and_provenance(tmp_path):
    folder = tmp_path / "fedavg-s1"
    _run_folder(folder, ROWS, [(2, 0, 0.1, 5), (3, 1, 0.5, 4), (3, 0, 0.25, "6.0")], SUMMARY)
    run = run_data.collect(folder, "fedavg", 1, code={"commit": "c", "source_hash": "s"})
    assert run["rounds"] == {"round": [1, 2], "acc_weighted": [0.5, 0.7], "acc_client_mean": [0.4, 0.6],
                             "val_acc_weighted": [0.6, 0.5], "eval_rel": [0.1, None]}
    assert run["clients_final"] == {"partition_id": [1, 0], "accuracy": [0.5, 0.25], "test_samples": [4, 6]}
    assert (run["label"], run["seed"], run["status"], run["final_round"]) == ("fedavg", 1, "completed", 3)
    assert (run["commit"], run["source_hash"], run["config"]) == ("c", "s", {"method": "fedavg"})
    assert {k: run[k] for k in run_data.SCALARS} == {k: SUMMARY[k] for k in run_data.SCALARS}
    provenance.record(folder, {"commit": "d", "source_hash": "t"}, {})
    assert run_data.collect(folder, "fedavg", 1, code={"commit": "c"})["commit"] == "d"  # the folder's own


def test_csv_cells_read_back_as_the_numbers_that_were_written():
    assert [run_data._number(t) for t in ("", None, "3", "3.0", "1e3", "1E-2", "0.5", "-2")] == \
        [None, None, 3, 3.0, 1000.0, 0.01, 0.5, -2]
    assert isinstance(run_data._number("3.0"), float) and isinstance(run_data._number("1e3"), float)
    assert isinstance(run_data._number("3"), int)


def test_per_run_data_is_byte_identical_for_the_same_runs_and_recomputes_each_runs_summary(tmp_path):
    from server_app.results import accuracy_summary

    runs = []
    for seed in (1, 0):
        folder = tmp_path / f"fedavg-s{seed}"
        _run_folder(folder, ROWS, [(3, 0, 0.5, 4)], SUMMARY)
        runs.append(run_data.collect(folder, "fedavg", seed))
    runs.append({**runs[0], "label": "a-first", "seed": 5})
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = run_data.write(tmp_path / "one", runs).read_bytes()
    assert run_data.write(tmp_path / "two", list(reversed(runs))).read_bytes() == first
    assert [(r["label"], r["seed"]) for r in run_data.load(tmp_path / "one")] == [("a-first", 5), ("fedavg", 0),
                                                                                  ("fedavg", 1)]
    assert json.loads(gzip.decompress(first)) == run_data.load(tmp_path / "one")
    assert set(run_data.by_run(tmp_path / "one")) == {("a-first", 5), ("fedavg", 0), ("fedavg", 1)}
    assert run_data.by_run(tmp_path / "none") == {}
    (tmp_path / "three").mkdir()  # the same runs with their keys in another order give the same bytes
    assert run_data.write(tmp_path / "three", [dict(reversed(r.items())) for r in runs]).read_bytes() == first
    assert first[4:8] == b"\0\0\0\0"  # no timestamp in the gzip header
    s = run_data.summary(runs[0])
    rows = [{"round": 1, "acc_weighted": 0.5, "acc_client_mean": 0.4, "val_acc_weighted": 0.6, "eval_rel": 0.1},
            {"round": 2, "acc_weighted": 0.7, "acc_client_mean": 0.6, "val_acc_weighted": 0.5}]
    assert s["_rounds"] == rows and run_data.evaluated_rows(runs[0])[1]["eval_rel"] is None
    assert {k: s[k] for k in accuracy_summary(rows, 3)} == accuracy_summary(rows, 3)
    assert (s["seed"], s["status"], s["commit"], s["wall_s_per_round"]) == (1, "completed", None, 1.5)
    by_label = run_data.summaries(tmp_path / "one")
    assert list(by_label) == ["fedavg", "a-first"] and [x["seed"] for x in by_label["fedavg"]] == [0, 1]


def test_a_run_of_one_row_or_none_is_collected_and_its_summary_has_its_final_accuracy_and_commit(tmp_path):
    one = [{"round": 1, "acc_weighted": 0.5, "acc_client_mean": 0.4, "acc_client_std": 0.1}]
    _run_folder(tmp_path / "one", one, [(1, 0, 0.5, 4)], SUMMARY)
    run = run_data.collect(tmp_path / "one", "x", 0, code={"commit": "c1", "source_hash": "s"})
    assert run["rounds"] == {"round": [1], "acc_weighted": [0.5], "acc_client_mean": [0.4], "acc_client_std": [0.1]}
    s = run_data.summary(run)
    assert (s["final_acc"], s["client_acc_mean"], s["commit"]) == (0.5, 0.4, "c1")
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "rounds.csv").write_text("round,acc_weighted\n")
    (tmp_path / "none" / "clients.csv").write_text("round,partition_id,accuracy,test_samples\n")
    (tmp_path / "none" / "summary.json").write_text(json.dumps(SUMMARY))
    (tmp_path / "none" / "config.json").write_text("{}")
    empty = run_data.collect(tmp_path / "none", "x", 1)
    assert (empty["final_round"], empty["rounds"], empty["clients_final"]["accuracy"]) == (None, {"round": []}, [])


def test_a_nan_in_the_per_run_data_is_no_value_when_the_summary_is_recomputed():
    run = {"label": "x", "seed": 0, "status": "completed", "final_round": 2,
           "rounds": {"round": [1, 2], "acc_weighted": [0.5, 0.6], "acc_client_mean": [0.4, 0.5],
                      "val_acc_weighted": [float("nan"), 0.1]}}
    assert run_data.summary(run)["_rounds"] == [
        {"round": 1, "acc_weighted": 0.5, "acc_client_mean": 0.4},
        {"round": 2, "acc_weighted": 0.6, "acc_client_mean": 0.5, "val_acc_weighted": 0.1}]
