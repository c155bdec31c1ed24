"""The docker compose stack, run for real: bring it up, run a method, collect the results, take it down.

    python -m runner.docker_stack [--tls] --run-config "method='fedper' num-server-rounds=2"

Steps: find a docker engine (``DOCKER_HOST`` or the default socket), or start our own ``dockerd`` as
root on a private socket with bridge addresses from 198.18.0.0/15 only (``--bip``,
``--default-address-pool``), stopped again at the end by its pid; pick the images (the official
``flwr/*`` of the pinned version if present, else the local base from docker/build-local-base.sh,
built on first use); remove what a stack killed before its ``down`` left on our subnet;
``docker-compose up`` (with ``--tls``: certificates and SuperNode keys from
``runner.certs``, the SuperLink first, each SuperNode key registered with ``flwr supernode
register``, then the rest); ``flwr run`` against the published SuperLink and judge it by ``flwr ls``;
copy the results out; ``docker-compose down`` (containers, network; images are kept).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

from runner import certs
from runner import flower_cli as fc
from runner.staged_app import stage_app

ROOT = Path(__file__).resolve().parents[1]
FLWR_VERSION = "1.41.0"
LOCAL_BASE = f"pfl-flower/local-base:{FLWR_VERSION}"
BRIDGE_IP = "198.18.0.1/24"  # docker0
ADDRESS_POOL = "base=198.19.0.0/16,size=24"  # networks compose creates without a subnet of their own
SUBNETS = {False: "198.18.10.0/24", True: "198.18.11.0/24"}  # the plain and the TLS stack
APP_UID = 49999  # user `app` in the official images and in the local base


class DockerUnavailable(RuntimeError):
    """No docker engine, and none can be started here (not root, or dockerd not installed)."""


def _docker(*args: str, env: dict, check: bool = True, capture: bool = True, timeout: float = 600):
    out = subprocess.run(["docker", *args], env=env, text=True, capture_output=capture, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed: {out.stdout}{out.stderr}")
    return out


def engine_answers(env: dict) -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return _docker("info", env=env, check=False, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def docker_engine(stack: ExitStack, workdir: Path) -> dict:
    """Environment whose ``DOCKER_HOST`` answers: the caller's engine if one runs, else a ``dockerd``
    of our own (root only) on a private socket, stopped by ``stack``."""
    env = dict(os.environ)
    if engine_answers(env):
        return env
    if os.geteuid() != 0 or shutil.which("dockerd") is None or shutil.which("docker") is None:
        raise DockerUnavailable("no docker engine answers, and starting one needs root and dockerd "
                                "(apt-get install docker.io docker-compose)")
    sock = workdir / "docker.sock"
    log = workdir / "dockerd.log"
    proc = fc.start(["dockerd", "--host", f"unix://{sock}", "--bip", BRIDGE_IP, "--default-address-pool",
                     ADDRESS_POOL, "--pidfile", str(workdir / "dockerd.pid"), "--exec-root", str(workdir / "exec")],
                    dict(os.environ), workdir, log)
    stack.callback(fc.stop, proc)
    env["DOCKER_HOST"] = f"unix://{sock}"
    deadline = time.monotonic() + 90
    while not engine_answers(env):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise DockerUnavailable(f"dockerd did not start; see {log}")
        time.sleep(1)
    return env


def image_env(env: dict, images: str) -> dict:
    """Compose variables for the images: the official ones, or the local base (built if missing)."""
    if images == "auto":
        present = _docker("image", "inspect", f"flwr/superlink:{FLWR_VERSION}", env=env, check=False).returncode == 0
        images = "official" if present else "local"
    if images == "official":
        return {}
    if _docker("image", "inspect", LOCAL_BASE, env=env, check=False).returncode != 0:
        print(f"building {LOCAL_BASE} (a Debian root + the pinned wheels; minutes, once)", flush=True)
        subprocess.run(["bash", str(ROOT / "docker" / "build-local-base.sh")], env={**env, "PYTHON": sys.executable},
                       check=True)
    return {"SUPERLINK_IMAGE": LOCAL_BASE, "SUPERNODE_IMAGE": LOCAL_BASE, "BASE_IMAGE": LOCAL_BASE}


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, from /proc), or None where there is none."""
    fields = fc._stat_fields(pid)
    try:
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, IndexError, StopIteration, ValueError):
        return None
    if len(fields) < 20:
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: start time in clock ticks


def _owner_runs(pid: int, network_created: str) -> bool:
    """Whether the stack process ``pid`` still runs: a process of that pid that started before the network was
    created (a pid reused since, or any process on a machine restored after it, is not the owner)."""
    started = _process_start(pid)
    if started is None:
        return False
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", network_created.strip().strip('"')).replace("Z", "+00:00")
    try:
        created = datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return True  # unknown creation time: a live pid may be the owner, so leave its stack alone
    return started <= created + 1.0


def clear_stale_stacks(env: dict, subnet: str, own_project: str) -> list[str]:
    """Remove the stacks that hold ``subnet`` and whose process is gone, and return their project names.

    A stack killed before ``down`` (its process and engine killed) leaves its containers and network in
    the engine's data root; the next engine restores them, and our ``up`` then fails with "Pool overlaps
    with other one on this address space". A network on ``subnet`` that is not a stack of ours, or a
    stack whose process (the pid in its project name) still runs, is an error that names it."""
    names = _docker("network", "ls", "--format", "{{.Name}}", env=env).stdout.split()
    removed = []
    for name in names:
        info = _docker("network", "inspect", name, "--format",
                       '{{index .Labels "com.docker.compose.project"}}|{{json .Created}}|'
                       '{{range .IPAM.Config}}{{.Subnet}} {{end}}', env=env).stdout.strip()
        project, created, subnets = info.split("|", 2)
        if subnet not in subnets.split() or project == own_project:
            continue
        owner = re.fullmatch(r"pfl-(?:plain|tls)-(\d+)", project)
        if owner is None or _owner_runs(int(owner.group(1)), created):
            raise RuntimeError(f"docker network {name} (compose project {project or 'none'}) holds {subnet}, which "
                               f"this stack needs; " + ("it is not one of ours" if owner is None else
                                                        f"its process {owner.group(1)} still runs") +
                               f": remove it with `docker network rm {name}` once it is no longer used")
        containers = _docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={project}",
                             env=env).stdout.split()
        if containers:
            _docker("rm", "-f", *containers, env=env)
        _docker("network", "rm", name, env=env)
        print(f"removed compose project {project}, left by a run that was killed before its `down` "
              f"({len(containers)} containers and network {name} on {subnet})", flush=True)
        removed.append(project)
    return removed


class ComposeStack:
    """One compose project (plain or TLS) under ``workdir``; ``down`` removes its containers."""

    def __init__(self, env: dict, workdir: Path, tls: bool, port: int):
        self.tls, self.port, self.workdir = tls, port, workdir
        self.project = f"pfl-{'tls' if tls else 'plain'}-{os.getpid()}"
        self.results = workdir / "results"
        self.certs_dir = workdir / "certs"
        self.files = ["-f", str(ROOT / "docker" / "compose.yml")]
        if tls:
            self.files += ["-f", str(ROOT / "docker" / "with-tls.yml")]
        self.env = {**env, "PFL_SUBNET": SUBNETS[tls], "RESULTS_DIR": str(self.results),
                    "CERTS_DIR": str(self.certs_dir), "COMPOSE_PROJECT_NAME": self.project,
                    "SUPERLINK_PUBLISH": f"127.0.0.1:{port}"}
        self.cli_env: dict = {}

    def compose(self, *args: str, timeout: float = 1800) -> None:
        cmd = ["docker-compose", *self.files, *args]
        print("$", " ".join(cmd[:1] + cmd[-len(args):]), flush=True)
        subprocess.run(cmd, env=self.env, check=True, timeout=timeout, cwd=ROOT / "docker")

    def up(self, images: dict) -> None:
        self.env.update(images)
        self.results.mkdir(parents=True, exist_ok=True)
        _share_with_app_user(self.results, writable=True)
        self.compose("build")
        clear_stale_stacks(self.env, SUBNETS[self.tls], self.project)
        if self.tls:
            certs.make_all(self.certs_dir, 2, ["superlink", "localhost", "127.0.0.1"])
            _share_with_app_user(self.certs_dir, writable=False, keep=("ca.key",))  # no container reads it
            self.compose("up", "-d", "superlink")
        else:
            self.compose("up", "-d")
        self._connect()
        if self.tls:
            for i in range(2):
                answer = fc.flwr("supernode", "register", str(self.certs_dir / "supernodes" / f"supernode-{i}.pub"),
                                 "docker", "--format", "json", env=self.cli_env, cwd=ROOT, timeout=120)
                print(f"registered supernode-{i}: node id {answer.get('node-id')}", flush=True)
            self.compose("up", "-d")

    def _connect(self) -> None:
        """The CLI's connection to the published SuperLink; wait until ``flwr ls`` gets an answer
        (its JSON says so: the CLI exits 0 also when it cannot connect)."""
        home = self.workdir / "cli"
        home.mkdir(exist_ok=True)
        security = f'root-certificates = "{self.certs_dir / "ca.crt"}"' if self.tls else "insecure = true"
        (home / "config.toml").write_text(f'[superlink]\ndefault = "docker"\n\n[superlink.docker]\n'
                                          f'address = "127.0.0.1:{self.port}"\n{security}\n')
        self.cli_env = fc.flower_env(home)
        deadline = time.monotonic() + 120
        while True:
            try:
                fc.list_runs("docker", env=self.cli_env, cwd=ROOT)
                return
            except fc.FlowerCliError as err:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the SuperLink container did not answer within 120 s: {err}") from err
            time.sleep(2)

    def run(self, run_config: dict, timeout: float) -> dict:
        """``flwr run`` (results-dir inside the ServerApp container = the mounted results folder)."""
        config = fc.resolve_config({**run_config, "results-dir": "/app/results"}, ROOT, self.results)
        config["results-dir"] = "/app/results"
        app = stage_app(ROOT, self.results.parent / "app")  # flwr run's FAB build skips .venv
        run_id = fc.submit_run(app, "docker", config=config, env=self.cli_env, cwd=ROOT)
        print(f"run {run_id} submitted; its log:", flush=True)
        try:  # ends when the run has finished; a broken stream only costs the log
            fc.flwr("log", str(run_id), "docker", "--stream", env=self.cli_env, cwd=ROOT, timeout=timeout, echo=True)
        except fc.FlowerCliError as err:
            print(f"(log stream ended: {err})", flush=True)

        def mine() -> list[dict]:
            return fc.list_runs("docker", env=self.cli_env, cwd=ROOT, run_id=run_id)

        runs = mine()  # the log stream ends with the run, so it has usually finished; else wait for it
        if not fc.finished(runs):
            runs = fc.wait_for_run(mine, lambda: False, timeout)  # its processes are in the containers
        return fc.run_result(runs, {**config, "results-dir": str(self.results)})

    def down(self) -> None:
        subprocess.run(["docker-compose", *self.files, "logs", "--no-color"], env=self.env, cwd=ROOT / "docker",
                       stdout=open(self.workdir / "compose.log", "w"), stderr=subprocess.STDOUT, timeout=120)
        self.compose("down", "--remove-orphans", "--timeout", "20", timeout=300)


def _share_with_app_user(path: Path, writable: bool, keep: tuple[str, ...] = ()) -> None:
    """Containers run as uid 49999: give it the folder (as root), else make it world-readable/writable;
    files named in ``keep`` stay as they are."""
    for p in [path, *path.rglob("*")]:
        if p.name in keep:
            continue
        if os.geteuid() == 0:
            os.chown(p, APP_UID, APP_UID)
        elif writable:
            p.chmod(0o777 if p.is_dir() else 0o666)


def run_stack(run_config: dict, *, tls: bool, workdir: Path, images: str = "auto", timeout: float = 1800) -> dict:
    """Engine, images, stack up, one run, results, stack down; returns the run's status and summary."""
    workdir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        env = docker_engine(stack, workdir)
        image_vars = image_env(env, images)
        compose = ComposeStack(env, workdir, tls, fc.free_port())
        stack.callback(compose.down)
        compose.up(image_vars)
        return compose.run(run_config, timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tls", action="store_true", help="TLS + SuperNode authentication (docker/with-tls.yml)")
    parser.add_argument("--run-config", default="method='fedavg' dataset='digits' num-server-rounds=2")
    parser.add_argument("--images", choices=("auto", "official", "local"), default="auto")
    parser.add_argument("--workdir", type=Path, default=None, help="results, certificates, logs (default: temp dir)")
    args = parser.parse_args(argv)
    fc.exit_on_sigterm()
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="pfl-docker-"))).resolve()
    result = run_stack(fc.parse_overrides(args.run_config), tls=args.tls, workdir=workdir, images=args.images)
    print(f"(results, certificates and container logs in {workdir})")
    return fc.report(result, "docker compose run")


if __name__ == "__main__":
    sys.exit(main())
