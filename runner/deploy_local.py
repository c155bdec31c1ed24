"""A real deployment on this machine: one ``flower-superlink`` and N ``flower-supernode`` processes.

The same commands work across machines (see README "Deployment"): here every process has its own
FLWR_HOME and free ports, the run is submitted with ``flwr run . <connection>`` and judged by
``flwr ls``, and every process is stopped at the end.

* ``--secure``: a CA, a SuperLink certificate and one key pair per SuperNode (``runner.certs``);
  the SuperLink serves TLS with ``--enable-supernode-auth``, each SuperNode's public key is
  registered with ``flwr supernode register`` before it starts, and the CLI verifies the CA.
* ``--runtime fast`` (default): SuperNodes and ClientApp SuperExecs from ``runner.fast_runtime``
  (Flower's own, without its fixed sleeps and without a cold process per message); ``--runtime
  flower`` runs Flower's commands exactly as shipped.
* ``Host``: where a process runs (a command prefix such as ``ip netns exec <ns>`` and the address
  others reach it by); ``runner.netns`` puts each SuperNode on its own network host.

    python -m runner.deploy_local --supernodes 2 --secure --run-config "num-server-rounds=2 dataset='digits'"
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from runner import certs
from fedcore import flower_patches
from runner import fast_runtime
from runner import flower_cli as fc
from runner.staged_app import stage_app

CONNECTION = "deploy"


@dataclass(frozen=True)
class Host:
    """Where a process runs: ``prefix`` goes before its command (``ip netns exec ns``), and
    ``address`` is how the other hosts reach it."""

    address: str = "127.0.0.1"
    prefix: tuple[str, ...] = ()


@dataclass
class SuperNode:
    index: int
    partition_id: int
    procs: list = field(default_factory=list)  # the SuperNode, and its SuperExec in process isolation
    log: Path | None = None


class LocalDeployment:
    """SuperLink + SuperNodes as processes; a context manager that stops all of them on exit.

    Parameters
    ----------
    app_dir : Path
        The Flower App (this repository).
    workdir : Path
        Logs, FLWR_HOMEs, certificates and keys.
    secure : bool
        TLS + SuperNode authentication (keys registered with ``flwr supernode register``).
    runtime : str
        "fast" (``runner.fast_runtime``, ``fedcore.flower_patches``) or "flower" (Flower's commands as shipped).
    link_host : Host
        Where the SuperLink runs; the ``flwr`` CLI runs here, in this process's network.
    link_names : list[str]
        More names or addresses the SuperLink is reached by (its certificate's SANs).
    """

    def __init__(self, app_dir: Path, workdir: Path, *, secure: bool = False, runtime: str = "fast",
                 link_host: Host = Host(), link_names: list[str] = ()):
        if runtime not in ("fast", "flower"):
            raise ValueError(f"runtime must be 'fast' or 'flower', not {runtime!r}")
        self.app_dir = Path(app_dir).resolve()
        self.workdir = Path(workdir).resolve()
        self.secure, self.runtime, self.link_host = secure, runtime, link_host
        self.link_names = list(link_names)
        self.port = None
        self.ports: set[int] = set()  # chosen so far: a node's port is picked before an earlier node has bound its own
        self.link_proc = None  # the SuperLink's process: the run's flwr-serverapp runs below it
        self.supernodes: list[SuperNode] = []
        self.certs: dict = {}
        self._stack = ExitStack()
        self.cli_env: dict = {}

    # ------------------------------------------------------------------ processes
    def __enter__(self) -> LocalDeployment:
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _home(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(exist_ok=True)
        return path

    def _env(self, home: Path, task_poll_s: str | None = None) -> dict:
        env = fc.flower_env(home)
        if self.runtime == "fast":  # the ServerApp applies its patches only in a fast-runtime run
            env[flower_patches.RUNTIME_ENV] = flower_patches.FAST
            if task_poll_s is not None:
                env.setdefault(fast_runtime.TASK_POLL_ENV, task_poll_s)  # Flower's own setting
        env["PYTHONPATH"] = str(self.app_dir) + os.pathsep + env.get("PYTHONPATH", "")
        return env

    def _launch(self, cmd: list[str], home: Path, log: str, host: Host):
        exe = [sys.executable, "-m", "runner.fast_runtime", cmd[0].split("-")[-1]] \
            if cmd[0] in ("flower-supernode", "flower-superexec") and self.runtime == "fast" else [fc.bin_path(cmd[0])]
        # the SuperLink's own SuperExec (Flower's) polls only to start a run's ServerApp; the SuperNodes'
        # forking SuperExecs wait their own way (fast_runtime._TaskPoll)
        poll = fast_runtime.SERVERAPP_TASK_POLL_S if cmd[0] == "flower-superlink" else None
        proc = fc.start([*host.prefix, *exe, *cmd[1:]], self._env(home, poll), self.app_dir, self.workdir / log)
        self._stack.callback(fc.stop, proc)
        return proc

    def start_superlink(self, port: int | None = None) -> None:
        """Start the SuperLink (all APIs on one port) and write the CLI's connection."""
        self.port = port or fc.free_ports(1, exclude=self.ports)[0]
        self.ports.add(self.port)
        host = self.link_host
        cmd = ["flower-superlink", "--host", "0.0.0.0" if host.prefix else "127.0.0.1", "--port", str(self.port),
               "--disable-runtime-dependency-installation"]
        if self.secure:
            names = sorted({"localhost", "127.0.0.1", host.address, *self.link_names})
            self.certs = certs.make_all(self.workdir / "certs", 0, names)
            cmd += ["--ssl-ca-certfile", str(self.certs["ca"]), "--ssl-certfile", str(self.certs["certificate"]),
                    "--ssl-keyfile", str(self.certs["key"]), "--enable-supernode-auth"]
        else:
            cmd.insert(1, "--insecure")
        link = self.link_proc = self._launch(cmd, self._home("superlink"), "superlink.log", host)
        fc.wait_healthy(self.port, link, self.workdir / "superlink.log", host=host.address,
                        ca=self.certs.get("ca"))
        cli_home = self._home("cli")
        security = f'root-certificates = "{self.certs["ca"]}"' if self.secure else "insecure = true"
        (cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "{host.address}:{self.port}"\n{security}\n')
        self.cli_env = fc.flower_env(cli_home)

    def supernode_key(self, name: str) -> tuple[Path, Path]:
        """A SuperNode key pair under workdir/certs/supernodes (made on first use)."""
        return certs.make_supernode_key(self.workdir / "certs" / "supernodes", name)

    def register(self, public_key: Path) -> None:
        """``flwr supernode register``: the SuperLink admits the holder of the matching private key
        (``FlowerCliError`` with Flower's reason if it does not)."""
        fc.flwr("supernode", "register", str(public_key), CONNECTION, "--format", "json", env=self.cli_env,
                cwd=self.app_dir, timeout=120)

    def add_supernode(self, partition_id: int, num_partitions: int, *, host: Host = Host(), key: str | None = None,
                      register: bool = True, root_ca: Path | None = None, link_address: str | None = None) -> SuperNode:
        """Start one SuperNode (and, in the fast runtime, its ClientApp SuperExec) on ``host``.

        ``key`` names its key pair (default ``supernode-<index>``), registered first unless
        ``register=False``; ``root_ca`` replaces the CA it trusts (tests of a foreign CA);
        ``link_address`` is the SuperLink's address as this host sees it (default: ``link_host``'s).
        """
        index = len(self.supernodes)
        node = SuperNode(index, partition_id, log=self.workdir / f"supernode-{index}.log")
        home = self._home(f"supernode-{index}")
        node_port = fc.free_ports(1, exclude=self.ports)[0]
        self.ports.add(node_port)
        isolation = "process" if self.runtime == "fast" else "subprocess"
        link = link_address or self.link_host.address
        cmd = ["flower-supernode", "--superlink", f"{link}:{self.port}", "--port", str(node_port),
               "--isolation", isolation, "--node-config", f"partition-id={partition_id} num-partitions={num_partitions}"]
        if self.secure:
            private, public = self.supernode_key(key or f"supernode-{index}")
            if register:
                self.register(public)
            cmd += ["--root-certificates", str(root_ca or self.certs["ca"]), "--auth-supernode-private-key", str(private)]
        else:
            cmd.insert(1, "--insecure")
        node.procs.append(self._launch(cmd, home, node.log.name, host))
        if isolation == "process":
            node.procs.append(self._launch(["flower-superexec", "--insecure", "--runtime-api-address",
                                            f"127.0.0.1:{node_port}"], home, f"superexec-{index}.log", host))
        self.supernodes.append(node)
        return node

    def stop_supernode(self, node: SuperNode) -> None:
        """Stop a SuperNode gracefully (SIGTERM: it signs off at the SuperLink) with its SuperExec."""
        for proc in reversed(node.procs):
            fc.stop(proc)

    def wait_for_nodes(self, count: int, timeout: float = 60) -> None:
        """Block until ``count`` SuperNodes are online (``flwr supernode ls``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.online_nodes()) >= count:
                return
            time.sleep(1)
        raise RuntimeError(f"fewer than {count} SuperNodes online after {timeout:.0f} s; logs in {self.workdir}")

    def online_nodes(self) -> list[dict]:
        nodes = fc.flwr("supernode", "ls", CONNECTION, "--format", "json", env=self.cli_env, cwd=self.app_dir,
                        timeout=60).get("nodes", [])
        return [n for n in nodes if str(n.get("status", "")).lower() == "online"]

    # ------------------------------------------------------------------ runs
    def submit(self, config: dict) -> int:
        """``flwr run`` without waiting; returns the run id."""
        app = stage_app(self.app_dir, self.workdir / "app")  # flwr run's FAB build skips .venv
        return fc.submit_run(app, CONNECTION, config=config, env=self.cli_env, cwd=self.app_dir)

    def wait(self, run_id: int, timeout: float) -> list[dict]:
        """Wait until the run has finished (or ``timeout`` s); returns it (``flower_cli.wait_for_run``:
        ``flwr ls`` once the SuperLink's ``flwr-serverapp`` process has gone, and every 30 s)."""
        def mine() -> list[dict]:
            return fc.list_runs(CONNECTION, env=self.cli_env, cwd=self.app_dir, run_id=run_id)

        return fc.wait_for_run(mine, lambda: fc.running_below(self.link_proc.pid, "flwr-serverapp"), timeout)

    def run_log(self, run_id: int) -> str:
        """The run's logs so far (the ServerApp's among them), as ``flwr log --show`` prints them."""
        return fc.flwr("log", str(run_id), CONNECTION, "--show", env=self.cli_env, cwd=self.app_dir, timeout=120)

    def run(self, config: dict, timeout: float = 1800) -> dict:
        """Submit a run, wait for it, and return its status and summary (``flower_cli.run_result``)."""
        return fc.run_result(self.wait(self.submit(config), timeout), config)


def deploy(run_config: dict, *, supernodes: int, app_dir: Path, workdir: Path, secure: bool = False,
           runtime: str = "fast", timeout: float = 1800) -> dict:
    """Start SuperLink + SuperNodes, run the app, stop everything; returns status and summary."""
    app_dir = Path(app_dir).resolve()
    config = fc.resolve_config(run_config, app_dir, Path(workdir).resolve() / "results")
    with LocalDeployment(app_dir, workdir, secure=secure, runtime=runtime) as dep:
        dep.start_superlink()
        for i in range(supernodes):
            dep.add_supernode(i, supernodes)
        return dep.run(config, timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--supernodes", type=int, default=2)
    parser.add_argument("--run-config", default="")
    parser.add_argument("--app", type=Path, default=Path("."))
    parser.add_argument("--secure", action="store_true", help="TLS + SuperNode authentication")
    parser.add_argument("--runtime", choices=("fast", "flower"), default="fast",
                        help="fast: runner.fast_runtime; flower: Flower's commands as shipped")
    parser.add_argument("--workdir", type=Path, default=None, help="logs, FLWR_HOMEs, keys (default: a temp dir)")
    args = parser.parse_args(argv)
    fc.exit_on_sigterm()
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="pfl-deploy-"))).resolve()
    result = deploy(fc.parse_overrides(args.run_config), supernodes=args.supernodes, app_dir=args.app,
                    workdir=workdir, secure=args.secure, runtime=args.runtime)
    print(f"(logs in {workdir})")
    return fc.report(result, "deployment run")


if __name__ == "__main__":
    sys.exit(main())
