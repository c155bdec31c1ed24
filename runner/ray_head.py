"""A private Ray head started next to the simulation SuperLink, so Ray boots while Flower does.

Flower's simulation calls ``ray.init()`` only once the run has been submitted and ``flwr-simulation``
has started; starting Ray's GCS, raylet and agents then took 3 to 4 s of the 12 s before round 1,
after everything else. ``ray.init()`` joins the cluster named by ``RAY_ADDRESS`` instead of starting
one, so the launcher starts ``ray start --head --block`` first and hands its address down (SuperLink
-> SuperExec -> ``flwr-simulation``); Ray then boots while the SuperLink starts, the app is staged and
the run is submitted (``ray.init`` waits for a head that is still starting). ``--block`` keeps the
command in the foreground: stopping it stops every Ray process it started, so nothing outlives the
launch, and ``watch`` ends a run whose head died under it. The cluster has what ``ray.init()`` would
have found (all cores and GPUs), without what a one-node simulation never uses (idle prestarted
workers, the autoscaler monitor, the Ray Client server), and Flower's init arguments that a joining
driver may pass (logging level, log to driver) still apply.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from runner import flower_cli as fc

PORT_FLAGS = ("--dashboard-port", "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port",
              "--node-manager-port", "--object-manager-port")


# Ray's own settings (read by the raylet from RAY_<name>). When the first driver connects, a raylet
# starts one idle worker per CPU for it; Flower's backend asks for actors with a runtime env of their
# own (its PYTHONPATH), which those workers do not have, so Ray starts two more for the actors and
# stops the idle ones: two interpreters importing Ray for nothing, in the busiest second of the start
HEAD_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_prestart_worker_first_driver": "0", "RAY_enable_worker_prestart": "0"}


# ``ray start`` itself, without its Ray Client server: flwr-simulation joins through RAY_ADDRESS, not
# ray://, and ``ray start`` has no option to leave the server out (it starts one on port 10001 when
# grpc is installed and no port is given), so this run of its CLI sees no Ray Client dependencies.
# The server and the autoscaler monitor (``--no-monitor``, one fixed node) were two Python processes
# and 1.4 s of CPU in the start-up.
START_WITHOUT_CLIENT_SERVER = ("import sys; import ray.scripts.scripts as cli; "
                               "cli.get_ray_client_dependency_error = lambda: ImportError('not used here'); "
                               "sys.argv[0] = 'ray'; sys.exit(cli.main())")


class RayHeadEnded(RuntimeError):
    """The Ray head exited before it was stopped: during the launch's start-up (``check_alive``) or
    under its run (``watch``); the launch ends with this reason either way."""


class ClusterUnreachable(RuntimeError):
    """``--ray-address`` names a Ray cluster that this machine cannot reach: refused at start, before
    the SuperLink starts (``ray.init`` would otherwise retry for a minute under a submitted run)."""


def check_cluster(address: str, timeout: float = 5.0) -> str:
    """``address`` (``HOST:PORT`` of an existing cluster's head, its GCS port) as given, once a TCP
    connection to it succeeds and a Ray GCS answers there, each within ``timeout`` s; else
    ``ClusterUnreachable`` with the address and the reason (connection refused, timed out, unknown
    host, not a Ray GCS)."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterUnreachable(f"Ray cluster address {address!r} is not HOST:PORT (the head's GCS port, "
                                 "6379 unless `ray start --head --port` said otherwise)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
        return _check_gcs(address, timeout)
    except socket.timeout:
        reason = f"no answer within {timeout:g} s (a firewall, or no such host on this network)"
    except socket.gaierror as err:
        reason = f"unknown host ({err.strerror})"
    except OSError as err:
        reason = err.strerror or str(err)
        if isinstance(err, ConnectionRefusedError):
            reason = "connection refused (no Ray head listens there)"
    raise ClusterUnreachable(f"cannot reach the Ray cluster at {address}: {reason}")


def _check_gcs(address: str, timeout: float) -> str:
    """``address`` once a Ray GCS answers there (its cluster id): a port that accepts connections may
    be another service (a proxy answered HTTP 404 on one here). The client blocks in Ray's C++ code for
    up to 35 s, so it runs in a thread that is left behind when it has not answered in ``timeout`` s."""
    from ray._raylet import GcsClient  # about 1 s: only for a launch that joins a cluster

    answer: list = []

    def ask():
        try:
            answer.append(GcsClient(address=address).cluster_id.hex())
        except Exception as err:  # Ray's RpcError, with its reason
            answer.append(err)

    thread = threading.Thread(target=ask, name="ray-gcs-check", daemon=True)
    thread.start()
    thread.join(timeout)
    if not answer:
        raise ClusterUnreachable(f"cannot reach the Ray cluster at {address}: a connection opens but no Ray GCS "
                                 f"answered within {timeout:g} s (is it the head's --port?)")
    if isinstance(answer[0], Exception):
        raise ClusterUnreachable(f"cannot reach the Ray cluster at {address}: not a Ray GCS ({answer[0]})")
    return address


class RayHead:
    """``ray start --head --block`` with free ports and its own session folder; a context manager."""

    def __init__(self, env: dict, cwd: Path, log: Path, avoid_ports: tuple[int, ...] = ()):
        self.env, self.cwd, self.log = env, cwd, log
        # every port a head listens on is a free one (``ray start`` has fixed defaults for some), so
        # launches side by side do not collide; all distinct, and none of ``avoid_ports`` (the
        # SuperLink's, chosen but not yet bound)
        self.port, *self.component_ports = fc.free_ports(1 + len(PORT_FLAGS), exclude=avoid_ports)
        self.address = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.temp_dir: str | None = None
        self.failure: str | None = None  # why the head ended before it was stopped (``watch``)
        self._stopping = threading.Event()

    def command(self, temp_dir: str) -> list[str]:
        ports = [arg for flag, port in zip(PORT_FLAGS, self.component_ports) for arg in (flag, str(port))]
        # no autoscaler monitor (one fixed node) and no Ray Client server (``START_WITHOUT_CLIENT_SERVER``)
        return [sys.executable, "-c", START_WITHOUT_CLIENT_SERVER, "start", "--head", "--block", "--no-monitor",
                "--port", str(self.port), *ports, "--include-dashboard=false", "--disable-usage-stats",
                "--num-cpus", str(os.cpu_count() or 1), "--temp-dir", temp_dir]

    def __enter__(self) -> RayHead:
        self.proc = fc.start(self.command(self._temp_dir()), {**self.env, **HEAD_ENV}, self.cwd, self.log)
        return self

    def _temp_dir(self) -> str:
        """A session folder of this head's own: two heads sharing Ray's default folder (``ray`` in the system's
        temp dir) would share its ``session_latest``, and a driver could find the other cluster's sockets there.
        Short, as Ray's socket paths must stay under 107 bytes (``flower_cli._ray_tmpdir``)."""
        base = self.env.get("RAY_TMPDIR") or tempfile.gettempdir()
        self.temp_dir = tempfile.mkdtemp(prefix="ray-", dir=base)
        return self.temp_dir

    def watch(self, on_exit, every: float = 0.5) -> None:
        """Call ``on_exit(reason)`` once, from a thread, if ``ray start`` exits before this head is
        stopped: the run's ``ray.init`` would otherwise wait for a cluster that is gone, and the
        launch with it (a head that failed after its start, e.g. on a bad option, hung a launch)."""
        def loop():
            while not self._stopping.wait(every):
                if self.proc.poll() is not None and not self._stopping.is_set():  # not our own stop
                    self.failure = self._exit_reason()
                    on_exit(self.failure)
                    return

        threading.Thread(target=loop, name="ray-head-watch", daemon=True).start()

    def _exit_reason(self) -> str:
        return f"ray start exited with {self.proc.returncode}: {self.last_lines()}"

    def last_lines(self, n: int = 3) -> str:
        """The end of ``ray start``'s output (its log goes with a temporary FLWR_HOME)."""
        try:
            lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return f"no log at {self.log}"
        return " | ".join(lines[-n:]) or "no output"

    def check_alive(self) -> None:
        """Fail now, with the log to read, if ``ray start`` has already exited (a joining ``ray.init``
        waits for a head that is still starting, so nothing waits for it to be ready)."""
        if self.proc.poll() is not None:
            self.failure = self._exit_reason()
            raise RayHeadEnded(self.failure)

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        if self.proc is not None:
            fc.stop(self.proc)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
