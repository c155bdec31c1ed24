"""Deployment smoke (``make test-deploy-smoke``, CI): every way of running the project, once each.

One ``flwr run`` simulation (``runner.launch``), one SuperLink + 2 SuperNodes with TLS and
SuperNode authentication (``runner.deploy_local``), one run on network namespaces
(``runner.netns``) and one docker compose run (``runner.docker_stack``): 2 rounds of FedAvg
on ``digits`` each, judged by the run's status (``finished:completed``), and each must leave no
process, namespace, container or daemon of its own behind. Marked ``smoke_deploy`` and left out of
every other run (tests/conftest.py). Where the machine cannot give what a run needs (root, iproute2,
a docker engine), the test FAILS with that reason: a smoke that skips proves nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import ExitStack
from pathlib import Path

import pytest

from runner import docker_stack, netns
from runner.deploy_local import deploy
from runner.launch import simulate
from tests.test_launch import _flower_processes, _gone

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.smoke_deploy
SETUP_HINT = "make deploy-setup installs docker.io, docker-compose, debootstrap and iproute2 with apt-get (root)"


def _config(tmp_path: Path) -> dict:
    return {"method": "fedavg", "dataset": "digits", "num-server-rounds": 2, "node-wait-s": 60,
            "results-dir": str(tmp_path / "results"), "run-name": "smoke"}


def _assert_completed_and_nothing_left(result: dict, tmp_path: Path) -> None:
    assert result["status"] == "finished:completed", result
    assert result["summary"]["num_clients"] == 2 and result["summary"]["final_acc"] is not None, result
    left = _gone(lambda: _flower_processes(str(tmp_path)))  # a process killed at the end stays a zombie for a moment
    assert not left, left


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"{what} needs root (uid {os.geteuid()}); CI runs .ci/run as root")


def _need_commands(*names: str) -> None:
    missing = [name for name in names if shutil.which(name) is None]
    if missing:
        pytest.fail(f"not installed: {', '.join(missing)} ({SETUP_HINT})")


def test_simulation_through_flwr_run(tmp_path):
    result = simulate(_config(tmp_path), supernodes=2, app_dir=ROOT, stream=False, timeout=300,
                      flwr_home=tmp_path / "home")
    _assert_completed_and_nothing_left(result, tmp_path)


def test_superlink_and_two_supernodes_with_tls_and_node_authentication(tmp_path):
    result = deploy(_config(tmp_path), supernodes=2, app_dir=ROOT, workdir=tmp_path / "deploy", secure=True,
                    timeout=300)
    _assert_completed_and_nothing_left(result, tmp_path)


def test_supernodes_on_network_namespaces(tmp_path):
    _need_root("a network-namespace deployment")
    _need_commands("ip")
    try:
        netns.check_available()
    except netns.NamespacesUnavailable as err:
        pytest.fail(str(err))
    result = netns.deploy_on_namespaces(_config(tmp_path), supernodes=2, app_dir=ROOT, workdir=tmp_path / "deploy",
                                        timeout=300)
    _assert_completed_and_nothing_left(result, tmp_path)
    assert all(received > 10_000 for received in result["bytes_over_veth"].values()), result["bytes_over_veth"]
    namespaces = subprocess.run(["ip", "netns", "list"], text=True, capture_output=True).stdout
    assert f"pfl{os.getpid() % 100000}-" not in namespaces, namespaces


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_docker_compose_stack(tmp_path, monkeypatch, capsys):
    """Also: a network left by a stack that was killed before its ``down`` (its process gone, its engine
    killed, the network restored by the next engine) holds the stack's subnet; the run removes it and goes on."""
    env = dict(os.environ)
    engine_before = docker_stack.engine_answers(env)
    if not engine_before:
        _need_root("starting a docker engine")
        _need_commands("dockerd", "docker", "docker-compose", "debootstrap")
    (tmp_path / "stack").mkdir()
    with ExitStack() as engine:
        env = docker_stack.docker_engine(engine, tmp_path / "stack")  # ours, or the one that answered
        if "DOCKER_HOST" in env:
            monkeypatch.setenv("DOCKER_HOST", env["DOCKER_HOST"])
        docker_stack.clear_stale_stacks(env, docker_stack.SUBNETS[False], "")  # what earlier runs left here
        stale = f"pfl-plain-{_dead_pid()}"
        subprocess.run(["docker", "network", "create", "--subnet", docker_stack.SUBNETS[False], "--label",
                        f"com.docker.compose.project={stale}", f"{stale}_default"], env=env, check=True)
        result = docker_stack.run_stack(_config(tmp_path), tls=False, workdir=tmp_path / "stack", timeout=480)
        networks = subprocess.run(["docker", "network", "ls", "--format", "{{.Name}}"], env=env, text=True,
                                  capture_output=True, check=True).stdout.split()
        assert f"{stale}_default" not in networks, networks
        assert f"removed compose project {stale}" in capsys.readouterr().out
    _assert_completed_and_nothing_left(result, tmp_path)  # dockerd, containerd and the shims ran under tmp_path
    assert (tmp_path / "stack" / "results" / "smoke" / "rounds.csv").exists()
    if engine_before:  # the engine was someone else's: only the stack's containers must be gone
        left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=com.docker.compose.project="
                               f"pfl-plain-{os.getpid()}"], env=env, text=True, capture_output=True).stdout
        assert not left.strip(), left
