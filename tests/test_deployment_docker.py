"""The docker compose stacks, run for real (``long``: minutes; the first run builds the images).

Skipped with the reason where no docker engine answers and none can be started (not root, or
Debian's docker.io not installed: ``make docker-setup``).
"""

from __future__ import annotations

import os
import shutil

import pytest

from runner import docker_stack

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.deploy]


def _need_docker():
    if docker_stack.engine_answers(dict(os.environ)):
        return
    if os.geteuid() != 0:
        pytest.skip("no docker engine answers and starting dockerd needs root")
    if not (shutil.which("dockerd") and shutil.which("docker") and shutil.which("docker-compose")):
        pytest.skip("docker.io / docker-compose are not installed (make docker-setup)")


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_compose_stack_runs_a_method_to_completion(tmp_path, tls):
    _need_docker()
    result = docker_stack.run_stack({"method": "fedper" if tls else "fedavg", "dataset": "digits",
                                     "num-server-rounds": 2, "run-name": "compose"},
                                    tls=tls, workdir=tmp_path / "stack", timeout=1200)
    print(result)
    assert result["status"] == "finished:completed", result
    assert result["summary"]["num_clients"] == 2 and result["summary"]["final_acc"] is not None
    assert (tmp_path / "stack" / "results" / "compose" / "rounds.csv").exists()
