"""The study's progress line: runs done of the total, the running run's round, elapsed and time left."""

from __future__ import annotations

import io
import os
import time

from runner.progress import ENV, Job, StudyProgress, study_env


def _rounds(folder, last):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rounds.csv").write_text("round,acc_weighted\n" + "".join(f"{r},0.5\n" for r in range(1, last + 1)))


def test_the_line_counts_the_whole_study_and_the_running_round(tmp_path, monkeypatch):
    old = tmp_path / "c-s0"
    _rounds(old, 4)  # a cut-off run of an earlier study: not progress of this one
    os.utime(old / "rounds.csv", (time.time() - 3600, time.time() - 3600))
    monkeypatch.setenv(ENV, study_env(10, 20, time.time() - 125)[ENV])
    out = io.StringIO()
    jobs = [Job("a-s0", tmp_path / "a-s0", 5), Job("b-s0", tmp_path / "b-s0", 5), Job("c-s0", old, 5)]
    progress = StudyProgress(jobs, reused=2, label="cmp", stream=out)
    assert progress.line().startswith("study cmp: 12/20 runs done | elapsed 2m0")
    assert progress.line().endswith("ETA -")  # nothing measured yet
    progress.finished("a-s0")
    _rounds(tmp_path / "b-s0", 2)
    line = progress.line()
    assert "13/20 runs done | now b-s0 round 2/5 |" in line and "ETA ~" in line, line
    assert out.getvalue().count("\n") == 1 and "13/20 runs done" in out.getvalue()  # printed when a run ended


def test_without_an_outer_study_the_total_is_this_comparison(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    progress = StudyProgress([Job("a-s0", tmp_path / "a", 3)], reused=1, stream=io.StringIO())
    assert progress.line().startswith("study: 1/2 runs done")
