"""A private Ray head started next to the simulation SuperLink, so Ray boots while Flower does.

Flower's simulation calls ``ray.init()`` only once the run has been submitted and ``flwr-simulation``
has started; starting Ray's GCS, raylet and agents then took 3 to 4 s of the 12 s before round 1,
after everything else. ``ray.init()`` joins the cluster named by ``RAY_ADDRESS`` instead of starting
one, so the launcher starts ``ray start --head --block`` first and hands its address down (SuperLink
-> SuperExec -> ``flwr-simulation``); Ray then boots while the SuperLink starts, the app is staged and
the run is submitted (``ray.init`` waits for a head that is still starting). ``--block`` keeps the command in the foreground: stopping it stops every Ray
process it started, so nothing outlives the launch. The cluster has what ``ray.init()`` would have
found (all cores and GPUs), and Flower's init arguments that a joining driver may pass (logging
level, log to driver) still apply.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from server_app import flower_cli as fc

READY_LINE = "Ray runtime started"


class RayHead:
    """``ray start --head --block`` on loopback with free ports; a context manager."""

    def __init__(self, env: dict, cwd: Path, log: Path):
        self.env, self.cwd, self.log = env, cwd, log
        self.port = fc.free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> RayHead:
        cmd = [fc.bin_path("ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
               "--port", str(self.port), "--include-dashboard=false", "--disable-usage-stats",
               "--num-cpus", str(os.cpu_count() or 1)]
        self.proc = fc.start(cmd, {**self.env, "RAY_USAGE_STATS_ENABLED": "0"}, self.cwd, self.log)
        return self

    def check_alive(self) -> None:
        """Fail now, with the log to read, if ``ray start`` has already exited (a joining ``ray.init``
        waits for a head that is still starting, so nothing waits for it to be ready)."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {self.proc.returncode}; see {self.log}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            fc.stop(self.proc)
