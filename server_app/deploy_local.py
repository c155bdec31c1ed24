"""A real deployment on this machine: one ``flower-superlink`` and N ``flower-supernode`` processes.

The same commands work across machines (see README "Deployment"): here everything listens on
127.0.0.1 with free ports, each process has its own FLWR_HOME, the run is submitted with
``flwr run . <connection> --stream`` and judged by ``flwr ls``, and every process is stopped at the end.

    python -m server_app.deploy_local --supernodes 2 --run-config "num-server-rounds=2 dataset='digits'"
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from fedcore.config import pyproject_run_config
from server_app.launch import FLWR_ENV, _bin, _free_port, _toml, parse_overrides
from server_app.results import default_run_name, format_summary


def _start(cmd: list[str], env: dict, log: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def deploy(run_config: dict, *, supernodes: int, app_dir: Path, workdir: Path, isolation: str = "subprocess",
           timeout: float = 1800) -> dict:
    """Start SuperLink + SuperNodes, run the app, stop everything; returns status and summary.

    ``isolation="process"`` also starts one ``flower-superexec`` for the SuperLink and one per
    SuperNode, exactly as docker/compose.yml does with containers.
    """
    app_dir = app_dir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    bin_dir = str(Path(sys.executable).parent)
    base_env = {**os.environ, **FLWR_ENV, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    port = _free_port()
    config = dict(run_config)
    config.setdefault("results-dir", str(workdir / "results"))
    config.setdefault("run-name", default_run_name({**pyproject_run_config(app_dir), **config}))
    with ExitStack() as stack:
        link_home = workdir / "superlink"
        link_home.mkdir(exist_ok=True)
        link = _start([_bin("flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port),
                       "--isolation", isolation, "--disable-runtime-dependency-installation"],
                      {**base_env, "FLWR_HOME": str(link_home)}, workdir / "superlink.log", app_dir)
        stack.callback(_stop, link)
        _wait_health(port, link, workdir / "superlink.log")
        if isolation == "process":
            stack.callback(_stop, _start([_bin("flower-superexec"), "--insecure", "--runtime-api-address",
                                          f"127.0.0.1:{port}"], {**base_env, "FLWR_HOME": str(link_home)},
                                         workdir / "superexec-serverapp.log", app_dir))
        for i in range(supernodes):
            home = workdir / f"supernode-{i}"
            home.mkdir(exist_ok=True)
            node_port = _free_port()
            node = _start([_bin("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}",
                           "--port", str(node_port), "--isolation", isolation,
                           "--node-config", f"partition-id={i} num-partitions={supernodes}"],
                          {**base_env, "FLWR_HOME": str(home)}, workdir / f"supernode-{i}.log", app_dir)
            stack.callback(_stop, node)
            if isolation == "process":
                stack.callback(_stop, _start([_bin("flower-superexec"), "--insecure", "--runtime-api-address",
                                              f"127.0.0.1:{node_port}"], {**base_env, "FLWR_HOME": str(home)},
                                             workdir / f"superexec-clientapp-{i}.log", app_dir))
        cli_home = workdir / "cli"
        cli_home.mkdir(exist_ok=True)
        (cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "deploy"\n\n[superlink.deploy]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
        cli_env = {**base_env, "FLWR_HOME": str(cli_home)}
        overrides = " ".join(f"{k}={_toml(v)}" for k, v in config.items())
        subprocess.run([_bin("flwr"), "run", str(app_dir), "deploy", "--run-config", overrides, "--stream"],
                       env=cli_env, cwd=app_dir, timeout=timeout)
        out = subprocess.run([_bin("flwr"), "ls", "deploy", "--format", "json"], env=cli_env, cwd=app_dir,
                             capture_output=True, text=True, timeout=120)
    runs = json.loads(out.stdout or "{}").get("runs", [])
    run = max(runs, key=lambda r: r.get("run-id", 0), default={})
    summary_file = Path(config["results-dir"]) / config["run-name"] / "summary.json"
    return {"status": run.get("status", "unknown"), "details": run.get("status-details", ""),
            "summary": json.loads(summary_file.read_text()) if summary_file.exists() else None}


def _wait_health(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"flower-superlink did not become ready; see {log}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--supernodes", type=int, default=2)
    parser.add_argument("--run-config", default="")
    parser.add_argument("--app", type=Path, default=Path("."))
    parser.add_argument("--isolation", choices=("subprocess", "process"), default="subprocess",
                        help="process: separate flower-superexec processes, as in docker/compose.yml")
    parser.add_argument("--workdir", type=Path, default=None, help="logs and FLWR_HOMEs (default: a temp dir)")
    args = parser.parse_args(argv)
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="pfl-deploy-"))).resolve()
    result = deploy(parse_overrides(args.run_config), supernodes=args.supernodes, app_dir=args.app, workdir=workdir,
                    isolation=args.isolation)
    print(f"\ndeployment run: {result['status']} {result['details']}  (logs in {workdir})")
    if result["summary"]:
        print(format_summary(result["summary"]))
    return 0 if result["status"] == "finished:completed" else 1


if __name__ == "__main__":
    sys.exit(main())
