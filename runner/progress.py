"""One progress line for a whole study (a comparison, or ``make tables``' many): runs done of the total,
the round the running run(s) are at, the time elapsed and an estimate of the time left.

The runs' own rounds.csv (written every round) says where each run is, so the line works the same for
``flwr run`` jobs, in-process jobs in parallel workers and a comparison started by ``make tables``: a
watcher thread reads the last round of each unfinished run's file (only files written since this
study started: an older, cut-off run in the folder is not progress) and prints a line when something
moved, at most every ``interval`` seconds, and at once when a run ends.

``make tables`` runs one comparison after another; it passes the whole study's counts and start to
each through the environment (``PFL_STUDY``), so their lines count the whole study, not one preset.
The time left is this comparison's seconds per run so far times the runs left in the study, so it is
an estimate ("~") that sharpens as runs finish.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "PFL_STUDY"  # {"done": runs before this comparison, "total": runs in the study, "t0": its start (epoch s)}


def clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def study_env(done: int, total: int, t0: float) -> dict[str, str]:
    """The environment a child comparison needs to count itself into the whole study."""
    return {ENV: json.dumps({"done": done, "total": total, "t0": t0})}


@dataclass
class Job:
    name: str
    folder: Path  # the run's results folder
    rounds: int
    done: bool = False


def last_round(folder: Path, since: float) -> int:
    """The last round in ``folder``/rounds.csv if it was written since ``since``, else 0."""
    path = folder / "rounds.csv"
    try:
        if path.stat().st_mtime < since:
            return 0
        with open(path) as f:
            rows = list(csv.DictReader(f))
        return max(0, int(rows[-1]["round"])) if rows else 0
    except (OSError, ValueError, KeyError):
        return 0


class StudyProgress:
    """The study's progress line; ``jobs`` are the runs this process makes, ``reused`` the ones it keeps."""

    def __init__(self, jobs: list[Job], reused: int = 0, label: str = "", interval: float = 10.0, stream=None):
        outer = json.loads(os.environ.get(ENV) or "{}")
        self.jobs = jobs
        self.label = label
        self.t0 = time.time()
        self.study_t0 = float(outer.get("t0", self.t0))
        self.done_before = int(outer.get("done", 0)) + reused
        self.total = int(outer.get("total", self.done_before + len(jobs)))
        self.interval = interval
        self.stream = stream or sys.stdout
        self._last_print, self._last_state = 0.0, None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _done(self, job: Job) -> bool:
        """Recorded as done, or its summary written since the study started (parallel workers end out of order)."""
        try:
            job.done = job.done or (job.folder / "summary.json").stat().st_mtime >= self.t0
        except OSError:
            pass
        return job.done

    def line(self) -> str:
        now = time.time()
        running = [(j, last_round(j.folder, self.t0)) for j in self.jobs if not self._done(j)]
        running = [(j, r) for j, r in running if r > 0]
        finished = sum(j.done for j in self.jobs)
        work = finished + sum(min(r / max(j.rounds, 1), 1.0) for j, r in running)  # runs' worth done here
        done = self.done_before + finished
        text = f"study{f' {self.label}' if self.label else ''}: {done}/{self.total} runs done"
        if running:
            j, r = running[0]
            text += f" | now {j.name} round {r}/{j.rounds}" + (f" (+{len(running) - 1} more)" if len(running) > 1 else "")
        left = self.total - done - (work - finished)
        eta = f"~{clock((now - self.t0) / work * left)}" if work > 0 else "-"
        return f"{text} | elapsed {clock(now - self.study_t0)} | ETA {eta if left > 0 else '0m00s'}"

    def _state(self):
        return tuple((self._done(j), 0 if j.done else last_round(j.folder, self.t0)) for j in self.jobs)

    def show(self, now: bool = False) -> None:
        """Print the line if something moved: at once with ``now``, else at most every ``interval`` s."""
        with self._lock:
            state = self._state()
            if state != self._last_state and (now or time.time() - self._last_print >= self.interval):
                print(self.line(), file=self.stream, flush=True)
                self._last_print, self._last_state = time.time(), state

    def finished(self, name: str) -> None:
        """A run ended (completed or failed): it counts as done, and the line is printed now (unless the
        watcher has just printed it)."""
        for job in self.jobs:
            if job.name == name:
                job.done = True
        self.show(now=True)

    def start(self) -> StudyProgress:
        """Watch the runs' files from a thread (a daemon: it never keeps the process alive)."""
        def watch():
            while not self._stop.wait(2.0):
                self.show()

        self.show(now=True)
        self._thread = threading.Thread(target=watch, name="study-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
