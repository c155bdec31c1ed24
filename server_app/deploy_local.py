"""A real deployment on this machine: one ``flower-superlink`` and N ``flower-supernode`` processes.

The same commands work across machines (see README "Deployment"): here everything listens on
127.0.0.1 with free ports, each process has its own FLWR_HOME, the run is submitted with
``flwr run . <connection> --stream`` and judged by ``flwr ls``, and every process is stopped at the end.

    python -m server_app.deploy_local --supernodes 2 --run-config "num-server-rounds=2 dataset='digits'"
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from server_app import flower_cli as fc


def deploy(run_config: dict, *, supernodes: int, app_dir: Path, workdir: Path, isolation: str = "subprocess",
           timeout: float = 1800) -> dict:
    """Start SuperLink + SuperNodes, run the app, stop everything; returns status and summary.

    ``isolation="process"`` also starts one ``flower-superexec`` for the SuperLink and one per
    SuperNode, exactly as docker/compose.yml does with containers.
    """
    app_dir = app_dir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    config = fc.resolve_config(run_config, app_dir, workdir / "results")
    port = fc.free_port()

    def home(name: str) -> Path:
        path = workdir / name
        path.mkdir(exist_ok=True)
        return path

    with ExitStack() as stack:
        def launch(cmd: list[str], flwr_home: Path, log: str):
            proc = fc.start([fc.bin_path(cmd[0]), *cmd[1:]], fc.flower_env(flwr_home), app_dir, workdir / log)
            stack.callback(fc.stop, proc)
            return proc

        link = launch(["flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(port),
                       "--isolation", isolation, "--disable-runtime-dependency-installation"],
                      home("superlink"), "superlink.log")
        fc.wait_healthy(port, link, workdir / "superlink.log")
        if isolation == "process":
            launch(["flower-superexec", "--insecure", "--runtime-api-address", f"127.0.0.1:{port}"],
                   home("superlink"), "superexec-serverapp.log")
        for i in range(supernodes):
            node_port = fc.free_port()
            launch(["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}", "--port", str(node_port),
                    "--isolation", isolation, "--node-config", f"partition-id={i} num-partitions={supernodes}"],
                   home(f"supernode-{i}"), f"supernode-{i}.log")
            if isolation == "process":
                launch(["flower-superexec", "--insecure", "--runtime-api-address", f"127.0.0.1:{node_port}"],
                       home(f"supernode-{i}"), f"superexec-clientapp-{i}.log")
        cli_home = home("cli")
        (cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "deploy"\n\n[superlink.deploy]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
        cli_env = fc.flower_env(cli_home)
        fc.flwr("run", str(app_dir), "deploy", "--run-config", fc.toml_overrides(config), "--stream",
                env=cli_env, cwd=app_dir, timeout=timeout)
        runs = fc.list_runs("deploy", env=cli_env, cwd=app_dir)
    return fc.run_result(runs, config)


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
    result = deploy(fc.parse_overrides(args.run_config), supernodes=args.supernodes, app_dir=args.app,
                    workdir=workdir, isolation=args.isolation)
    print(f"(logs in {workdir})")
    return fc.report(result, "deployment run")


if __name__ == "__main__":
    sys.exit(main())
