"""Memory of a whole process tree (a launch: SuperLink, Ray head and workers, flwr-simulation), read from /proc.

Why /proc and not psutil: psutil is not a dependency here, and /proc gives PSS (``smaps_rollup``), which
counts a page shared by N processes (torch's libraries, Ray's object store) once in all, where a sum of
RSS counts it N times. Linux only; on another system the sampler reads nothing and says so.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

PROC = Path("/proc")

# process kinds, by command line: what a per-client growth can be attributed to
KINDS = (("client actors", ("ray::ClientAppActor", "ray::IDLE", "default_worker.py")),
         ("flwr-simulation", ("flwr-simulation",)),
         ("SuperLink + SuperExec", ("flower-superlink", "flower-superexec")),
         ("Ray head", ("gcs_server", "raylet", "dashboard", "log_monitor", "ray::DashboardAgent",
                       "ray::RuntimeEnvAgent", "ray.scripts", "ray start")))


def kind(cmdline: str) -> str:
    for name, marks in KINDS:
        if any(m in cmdline for m in marks):
            return name
    return "launcher + flwr CLI"


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (``runner.flower_cli.descendants`` reads /proc for them)."""
    from runner.flower_cli import descendants as below

    return [root, *below(root)]


def process_memory(pid: int) -> tuple[int, int | None, str] | None:
    """(RSS bytes, PSS bytes or None, command line) of one process; None once it is gone."""
    base = PROC / str(pid)
    try:
        rss = None
        for line in (base / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        if rss is None:  # a zombie has no memory left
            return None
        cmd = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    pss = None
    try:
        for line in (base / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    return rss, pss, cmd


def tree_memory(root: int) -> dict:
    """One sample: summed RSS and PSS of the tree, the number of processes and PSS (else RSS) per kind."""
    rss = pss = count = 0
    pss_known = True
    by_kind: dict[str, int] = {}
    for pid in descendants(root):
        mem = process_memory(pid)
        if mem is None:
            continue
        r, p, cmd = mem
        count += 1
        rss += r
        pss_known &= p is not None
        pss += p if p is not None else r
        k = kind(cmd)
        by_kind[k] = by_kind.get(k, 0) + (p if p is not None else r)
    return {"rss": rss, "pss": pss if pss_known else None, "processes": count, "by_kind": by_kind}


class TreeSampler:
    """Samples ``tree_memory(root)`` every ``interval`` seconds from a thread; keeps the peaks."""

    def __init__(self, root: int, interval: float = 0.5):
        self.root, self.interval = root, interval
        self.samples = 0
        self.peak_rss = 0
        self.peak_pss: int | None = None
        self.at_peak: dict = {}  # the sample with the highest PSS (RSS where PSS is unreadable)
        self.max_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-sampler", daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.take()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))

    def take(self) -> None:
        sample = tree_memory(self.root)
        if sample["processes"] == 0:
            return
        self.samples += 1
        self.peak_rss = max(self.peak_rss, sample["rss"])
        self.max_processes = max(self.max_processes, sample["processes"])
        value = sample["pss"] if sample["pss"] is not None else sample["rss"]
        if self.peak_pss is None or value > self.peak_pss:
            self.peak_pss = value
            self.at_peak = sample


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None
