"""Driving Flower's own processes and CLI: shared by the simulation launcher and the local deployment.

Both start Flower servers they must stop again, both submit a run with ``flwr run`` (which exits 0
even when the run failed) and both judge it by ``flwr ls --format json`` and the run's summary.json.
Every ``flwr`` command goes through ``flwr``, which reads Flower's JSON answer (the CLI exits 0 even
when it cannot reach the SuperLink) and raises ``FlowerCliError`` with Flower's own message.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path

import httpx

from fedcore.config import pyproject_run_config
from server_app.results import default_run_name, format_summary

FLWR_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int, exclude: Iterable[int] = ()) -> list[int]:
    """``n`` distinct free ports, none in ``exclude``. Every socket stays bound until all are chosen:
    ports asked for one at a time can repeat (the OS may hand a just-released port out again), and a
    ``ray start`` given one port for two of its components fails, leaving the simulation waiting."""
    exclude = set(exclude)
    with ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < n:
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if port not in exclude:
                ports.append(port)
        return ports


def bin_path(name: str) -> str:
    """The CLI next to this interpreter (the project's virtualenv), else from PATH."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


def flower_env(home: Path, **extra: str) -> dict[str, str]:
    """Environment for one Flower process: our env vars, its own FLWR_HOME, and the virtualenv's
    bin/ first on PATH (a SuperLink or SuperNode spawns ``flower-superexec`` by name)."""
    path = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    return {**os.environ, **FLWR_ENV, "FLWR_HOME": str(home), "PATH": path, **_ray_tmpdir(), **extra}


RAY_SOCKET_TAIL = len("/ray/session_2026-01-01_00-00-00_000000_1234567/sockets/plasma_store")


def _ray_tmpdir() -> dict[str, str]:
    """Ray puts AF_UNIX sockets under the temp dir, and a path over 107 bytes crashes the simulation
    ("Simulation Runtime crashed"); with a long TMPDIR, point Ray at /tmp instead."""
    tmp = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    if len(tmp) + RAY_SOCKET_TAIL <= 107 or not os.access("/tmp", os.W_OK):
        return {}
    return {"RAY_TMPDIR": "/tmp"}


def start(cmd: list[str], env: dict, cwd: Path, log: Path | None = None) -> subprocess.Popen:
    """Start a Flower process in its own session, so that ``stop`` ends it with its children."""
    out = open(log, "w") if log is not None else subprocess.DEVNULL
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc; empty where there is none). Ray's workers and agents
    start their own sessions, so killing the process group alone leaves them running."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        fields = _stat_fields(int(entry))
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


LS_EVERY_S = 30  # while the run's process lives, ask the SuperLink for the run's status this seldom
START_LS_EVERY_S = 5  # and this seldom before its process has appeared


def wait_for_run(runs_of: Callable[[], list[dict]], running: Callable[[], bool], timeout: float) -> list[dict]:
    """Wait until every run ``runs_of()`` lists has finished (or ``timeout`` s); returns them.

    ``runs_of`` asks ``flwr ls``: a new interpreter with Flower's imports, about 1 s of CPU, which,
    asked every 2 s, took half a core from the clients being waited for. ``running()`` (a read of
    /proc: is the run's ServerApp process there?) decides when to ask: at once when the process has
    gone, every ``LS_EVERY_S`` seconds while it lives, and every ``START_LS_EVERY_S`` seconds before
    it has been seen at all (a run that fails before its process starts is still noticed; asked
    every 0.5 s there, it took one to two seconds of CPU from the start-up itself).
    """
    start = time.monotonic()
    deadline = start + timeout
    asked, runs, seen = start, [], False
    while time.monotonic() < deadline:
        alive = running()
        seen = seen or alive
        waited = time.monotonic() - asked
        if (seen and not alive) or waited >= (LS_EVERY_S if seen else START_LS_EVERY_S):
            runs, asked = runs_of(), time.monotonic()
            if finished(runs):
                return runs
        time.sleep(0.5)
    return runs_of()


def finished(runs: list[dict]) -> bool:
    """Whether there are runs and every one has finished (``finished:completed``, ``:failed``, ...)."""
    return bool(runs) and all(str(r.get("status", "")).startswith("finished") for r in runs)


def running_below(pid: int, name: str) -> bool:
    """Whether a live process below ``pid`` has ``name`` in its command line (from /proc)."""
    for child in descendants(pid):
        try:
            if name.encode() in Path(f"/proc/{child}/cmdline").read_bytes() and _alive(child):
                return True
        except OSError:
            continue
    return False


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _kill_left(pids: list[int], deadline: float) -> None:
    """Wait until ``deadline`` for ``pids`` (already sent SIGTERM) to end; SIGKILL those still alive."""
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    _signal_all([p for p in pids if _alive(p)], signal.SIGKILL)


def stop(proc: subprocess.Popen, grace: float = 15) -> None:
    """Stop ``proc``, its process group and every descendant (SIGTERM, then SIGKILL after ``grace`` s)."""
    if proc.poll() is not None:
        return
    tree = descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGTERM)
    _signal_all(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    _kill_left(tree, deadline)


def stop_matching(marker: str, env_entry: str, grace: float = 3) -> list[int]:
    """Stop every process whose command line holds ``marker`` and whose environment holds the entry
    ``env_entry`` (``KEY=value``, exactly), SIGTERM then SIGKILL after ``grace`` s; returns their
    pids. For what ``stop`` cannot reach: a process its parent started while being stopped, left to
    init (a ``flwr-simulation`` caught starting, waiting on a Ray head that is gone). Both must
    match, so that a port number reused by another launch never selects that launch's processes."""
    found, entry_bytes = [], b"\0" + env_entry.encode() + b"\0"
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if (marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes()
                        and entry_bytes in b"\0" + Path(f"/proc/{entry}/environ").read_bytes()):
                    found.append(int(entry))
            except OSError:
                continue
    _signal_all(found, signal.SIGTERM)
    _kill_left(found, time.monotonic() + grace)
    return found


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name (state, ppid, ...); empty if the process is gone.
    The name may hold spaces and parentheses, so the fields start after the last ')'."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """True for a running process (a zombie waiting for its parent counts as gone)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so that context managers stop the Flower processes they started."""
    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def wait_healthy(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60, host: str = "127.0.0.1",
                 ca: Path | None = None) -> None:
    """Block until the SuperLink on ``host:port`` answers /health (over TLS verified against ``ca``
    when given); fail early if it exits."""
    url = f"{'https' if ca else 'http'}://{host}:{port}/health"
    verify = ssl.create_default_context(cafile=str(ca)) if ca else True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url, timeout=1, verify=verify).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)  # the launch waits on this: a longer poll is start-up time
    raise RuntimeError(f"flower-superlink did not become ready in {timeout:.0f} s; see {log}")


# Lines Flower prints on every simulation that are not true for runs started here: the launcher
# always sets the federation size and its own configuration, and never needs `flwr federation`.
NOISE = (
    "Flower configuration not found",
    "default simulated SuperNodes changed",
    "To change federation size, use the following command",
    "flwr federation simulation-config",
    "Ray will no longer override accelerator visible devices",
    "warnings.warn(",
    "Manually terminating ClientAppActor",  # Ray forwards each actor's stop at the end of every run
)
LOCAL_CONFIG = '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n'


class FlowerCliError(RuntimeError):
    """A ``flwr`` command that failed, with Flower's own reason: the CLI exits 0 when it cannot reach
    the SuperLink and says so only in its JSON (``"success": false``), so no caller may trust the exit
    status alone."""


def flwr(*args: str, env: dict, cwd: Path, timeout: float | None = None, echo: bool = False):
    """``flwr <args>``: the one way this project calls the Flower CLI.

    With ``--format json`` among ``args``: the parsed answer; ``FlowerCliError`` carrying Flower's
    ``error-message`` when ``success`` is false or the output is not its JSON. Other commands (``flwr
    log``, ``flwr run --stream``, which have no JSON answer): their output, and ``FlowerCliError`` on a
    non-zero exit status. ``echo`` passes the output through as it comes, less Flower's lines in
    ``NOISE``; the child is stopped if this process is interrupted or ``timeout`` s pass.
    """
    cmd = [bin_path("flwr"), *args]
    label = "flwr " + " ".join(args[:2])
    try:
        code, out = _echoed(cmd, env, cwd, timeout) if echo else _captured(cmd, env, cwd, timeout)
    except subprocess.TimeoutExpired:
        raise FlowerCliError(f"{label}: no answer within {timeout:.0f} s") from None
    if ("--format", "json") not in zip(args, args[1:]):
        if code != 0:
            raise FlowerCliError(f"{label}: exit status {code}: {out.strip()[-2000:]}")
        return out
    try:
        answer = json.JSONDecoder().raw_decode(out, out.index("{"))[0]  # stdout first; stderr after it
    except ValueError:  # no "{" or not JSON
        raise FlowerCliError(f"{label}: exit status {code}, no JSON answer: {out.strip()[-2000:]}") from None
    if answer.get("success") is not True:
        raise FlowerCliError(f"{label}: {answer.get('error-message') or answer}")
    return answer


def _captured(cmd: list[str], env: dict, cwd: Path, timeout: float | None) -> tuple[int, str]:
    """Exit status and stdout (stderr appended: Flower's text errors go there)."""
    done = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout)
    return done.returncode, done.stdout + (("\n" + done.stderr) if done.stderr else "")


def _echoed(cmd: list[str], env: dict, cwd: Path, timeout: float | None) -> tuple[int, str]:
    """Exit status and output, each line passed through as it comes (less ``NOISE``)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            bufsize=1)
    deadline = None if timeout is None else time.monotonic() + timeout
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if not any(noise in line for noise in NOISE):
                sys.stdout.write(line)
                sys.stdout.flush()
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(cmd, timeout)
        return proc.wait(timeout=5), "".join(lines[-200:])
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()


def list_runs(*connection: str, env: dict, cwd: Path, run_id: int | None = None) -> list[dict]:
    """``flwr ls [connection] [--run-id N] --format json``: the runs the SuperLink lists (only run
    ``run_id`` when given); ``FlowerCliError`` with Flower's reason when it cannot answer."""
    selected = ("--run-id", str(run_id)) if run_id is not None else ()
    return flwr("ls", *connection, *selected, "--format", "json", env=env, cwd=cwd, timeout=120).get("runs", [])


def submit_run(app: Path, *connection: str, config: dict, env: dict, cwd: Path, extra: tuple[str, ...] = (),
               timeout: float = 300) -> int:
    """``flwr run <app> [connection] --format json`` without waiting: the new run's id;
    ``FlowerCliError`` with Flower's reason when no run started."""
    answer = flwr("run", str(app), *connection, "--run-config", toml_overrides(config), *extra, "--format", "json",
                  env=env, cwd=cwd, timeout=timeout)
    return int(answer["run-id"])


def resolve_config(run_config: dict, app_dir: Path, results_dir: Path) -> dict:
    """Run config with an absolute results-dir and a run-name, so the results can be found afterwards."""
    config = dict(run_config)
    config.setdefault("results-dir", str(results_dir))
    config["results-dir"] = str(Path(str(config["results-dir"])).expanduser().resolve())
    if not config.get("run-name"):
        config["run-name"] = default_run_name({**pyproject_run_config(app_dir), **config})
    return config


def run_result(runs: list[dict], config: dict) -> dict:
    """The newest run's status plus the summary.json the ServerApp wrote (None if it wrote none)."""
    run = max(runs, key=lambda r: int(r.get("run-id") or 0), default={})  # flwr ls gives ids as text
    result_dir = Path(config["results-dir"]) / config["run-name"]
    summary_file = result_dir / "summary.json"
    details = run.get("status-details", "")
    return {"status": run.get("status", "unknown"), "details": "" if details == "N/A" else details,
            "summary": json.loads(summary_file.read_text()) if summary_file.exists() else None,
            "results_dir": str(result_dir), "run_id": run.get("run-id")}


def verdict(result: dict, min_replies: int = 1) -> str | None:
    """Why a run must not count as a success, or None: it failed, wrote no summary, evaluated nothing
    in its last round, or its last evaluation heard from fewer than ``min-replies`` clients."""
    if result["status"] != "finished:completed":
        return f"the run ended {result['status']}"
    summary = result["summary"]
    if summary is None:
        return "the run wrote no summary"
    if summary.get("final_acc") is None:
        return "no evaluation of the last round succeeded"
    if (summary.get("final_eval_clients") or 0) < min_replies:
        return f"the last evaluation heard from {summary.get('final_eval_clients')} clients, fewer than " \
               f"min-replies={min_replies}"
    return None


def report(result: dict, label: str, min_replies: int = 1) -> int:
    """Print the status line and the results table; exit status 0 only for a run that truly succeeded."""
    print(f"\n{label} {result['run_id']}: {result['status']} {result['details']}".rstrip())
    if result["summary"]:
        print(format_summary(result["summary"]))
    problem = verdict(result, min_replies)
    if problem:
        print(f"NOT a success: {problem}", file=sys.stderr)
        return 1
    return 0


class Interrupted(Exception):
    """SIGTERM or SIGINT reached the launcher: stop what it started, then exit."""


def stop_on_signals() -> None:
    """Turn SIGTERM and SIGINT into ``Interrupted`` so that every ``with`` block stops its processes."""
    def handler(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def check_config(run_config: dict, app_dir: Path) -> dict:
    """Validate a run config (pyproject defaults + overrides) and its results folder before any
    process starts; raises ConfigError / RunFolderError with the key or folder named. The schema is
    built from the plain method declarations: no torch or Flower import before the start."""
    from fedcore.config import Config, check_data
    from server_app.results import run_folder

    cfg = Config.from_run_config({**pyproject_run_config(app_dir), **run_config})
    run_folder(cfg)
    check_data(cfg)  # a dataset this machine cannot load is refused now, not in every client later
    if cfg["server-device"] == "cuda":  # the local ServerApp runs here; torch only for the one value that needs it
        from fedstrategies.server_device import check

        check(cfg["server-device"])
    return cfg


def toml_overrides(config: dict) -> str:
    """A run config as ``--run-config`` text (TOML values)."""
    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        return json.dumps(str(v))  # a TOML basic string

    return " ".join(f"{k}={value(v)}" for k, v in config.items())


def parse_overrides(text: str) -> dict[str, object]:
    """Parse ``k=v k2='s'`` (TOML values) into a dict."""
    out: dict[str, object] = {}
    for item in shlex.split(text, posix=False):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"bad --run-config item {item!r}: expected key=value")
        out[key] = tomllib.loads(f"v = {value}")["v"]
    return out
