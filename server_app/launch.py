"""Run one experiment through the real ``flwr run`` simulation, safely, and print its results table.

Why a launcher: ``flwr run`` exits 0 even when the run failed, and its managed local SuperLink
outlives the command, keeping the cwd/env of whoever started it (foreign code can be imported by
Ray workers). This module starts a private simulation SuperLink (own FLWR_HOME and ports), runs
``flwr run . --stream``, judges the run by ``flwr ls --format json``, stops the SuperLink, and
prints the summary table. Exit status 0 only for ``finished:completed``.

    python -m server_app.launch --supernodes 10 --run-config "method='fedavg' num-server-rounds=5"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from fedcore.config import pyproject_run_config
from server_app.results import default_run_name, format_summary

FLWR_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    """The CLI next to this interpreter (the project's virtualenv), else from PATH."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


class LocalSimulationLink:
    """A private ``flower-superlink --simulation`` that this process starts and stops."""

    def __init__(self, app_dir: Path, flwr_home: Path):
        self.app_dir = app_dir
        self.home = flwr_home
        self.port = _free_port()
        bin_dir = str(Path(sys.executable).parent)  # flower-superexec etc. must be found by the SuperLink
        self.env = {**os.environ, **FLWR_ENV, "FLWR_HOME": str(flwr_home),
                    "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
                    "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.port)}
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LocalSimulationLink:
        self.home.mkdir(parents=True, exist_ok=True)
        log_file = self.home / "superlink.log"
        cmd = [_bin("flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
               "--host", "127.0.0.1",
               "--port", str(self.port), "--log-file", str(log_file),
               "--disable-runtime-dependency-installation"]
        self.proc = subprocess.Popen(cmd, cwd=self.app_dir, env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with {self.proc.returncode}; see {log_file}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).is_success:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.__exit__(None, None, None)
        raise RuntimeError(f"flower-superlink did not become ready in 60 s; see {log_file}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def flwr(self, *args: str, capture: bool = False, timeout: float | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([_bin("flwr"), *args], cwd=self.app_dir, env=self.env, text=True,
                              capture_output=capture, timeout=timeout)

    def runs(self) -> list[dict]:
        out = self.flwr("ls", "--format", "json", capture=True, timeout=120)
        try:
            return json.loads(out.stdout).get("runs", [])
        except json.JSONDecodeError:
            return []


def simulate(run_config: dict[str, object], *, supernodes: int, app_dir: Path = Path("."),
             cpus_per_client: int = 1, gpus_per_client: float = 0.0, stream: bool = True,
             timeout: float = 7200, flwr_home: Path | None = None) -> dict:
    """Run one simulation; returns {"status", "details", "summary" (or None), "results_dir"}."""
    app_dir = Path(app_dir).resolve()
    config = dict(run_config)
    config.setdefault("results-dir", str((app_dir / "results").resolve()))
    config["results-dir"] = str(Path(str(config["results-dir"])).expanduser().resolve())
    if not config.get("run-name"):
        config["run-name"] = default_run_name({**pyproject_run_config(app_dir), **config})
    overrides = " ".join(f"{k}={_toml(v)}" for k, v in config.items())
    federation = (f"num-supernodes={supernodes} client-resources-num-cpus={cpus_per_client} "
                  f"client-resources-num-gpus={gpus_per_client}")
    home = flwr_home or Path(tempfile.mkdtemp(prefix="flwr-home-"))
    with LocalSimulationLink(app_dir, home) as link:
        args = ["run", str(app_dir), "--run-config", overrides, "--federation-config", federation]
        proc = link.flwr(*args, *(["--stream"] if stream else []), timeout=timeout)
        # without --stream flwr returns after submitting: wait for the run to finish
        runs = link.runs() if stream else _wait_finished(link, timeout)
    run = max(runs, key=lambda r: r.get("run-id", 0), default={})
    status = run.get("status", f"unknown (flwr run exited {proc.returncode})")
    result_dir = Path(config["results-dir"]) / config["run-name"]
    summary_file = result_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
    return {"status": status, "details": run.get("status-details", ""), "summary": summary,
            "results_dir": str(result_dir), "run_id": run.get("run-id")}


def _wait_finished(link: LocalSimulationLink, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = link.runs()
        if runs and all(str(r.get("status", "")).startswith("finished") for r in runs):
            return runs
        time.sleep(2)
    return link.runs()


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


def parse_overrides(text: str) -> dict[str, object]:
    """Parse ``k=v k2='s'`` (TOML values) into a dict."""
    import tomllib

    out: dict[str, object] = {}
    for item in shlex.split(text, posix=False):
        key, _, value = item.partition("=")
        if not _:
            raise SystemExit(f"bad --run-config item {item!r}: expected key=value")
        out[key] = tomllib.loads(f"v = {value}")["v"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--supernodes", type=int, default=10, help="number of simulated clients")
    parser.add_argument("--run-config", default="", help="run-config overrides, e.g. \"method='fedavg' seed=1\"")
    parser.add_argument("--cpus-per-client", type=int, default=1)
    parser.add_argument("--gpus-per-client", type=float, default=0.0)
    parser.add_argument("--app", default=".", help="the Flower App directory")
    args = parser.parse_args(argv)
    result = simulate(parse_overrides(args.run_config), supernodes=args.supernodes, app_dir=Path(args.app),
                      cpus_per_client=args.cpus_per_client, gpus_per_client=args.gpus_per_client)
    details = "" if result["details"] in ("", "N/A") else result["details"]
    print(f"\nrun {result['run_id']}: {result['status']} {details}".rstrip())
    if result["summary"]:
        print(format_summary(result["summary"]))
    return 0 if result["status"] == "finished:completed" else 1


if __name__ == "__main__":
    sys.exit(main())
