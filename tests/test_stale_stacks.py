"""Which leftover compose stack the docker runner may remove (``runner.docker_stack._owner_runs``): its project
name holds the pid of the process that ran it, and that pid counts as the owner only while a process of that pid
runs that started before the stack's network was created. (The removal itself runs for real in the deploy
smoke, tests/test_deploy_smoke.py.)"""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone

from runner.docker_stack import _owner_runs, _process_start


def _rfc3339(when: datetime) -> str:
    """As ``docker network inspect --format '{{json .Created}}'`` writes it: nanoseconds, quoted."""
    return '"' + when.strftime("%Y-%m-%dT%H:%M:%S.%f") + '123Z"'


def test_a_live_process_older_than_the_network_owns_it():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        started = _process_start(proc.pid)
        assert started is not None and abs(started - datetime.now(timezone.utc).timestamp()) < 5
        later = datetime.now(timezone.utc) + timedelta(seconds=5)
        assert _owner_runs(proc.pid, _rfc3339(later))
        # the same pid, but the network is older than the process: the pid was reused, the stack is stale
        assert not _owner_runs(proc.pid, _rfc3339(datetime.now(timezone.utc) - timedelta(hours=1)))
    finally:
        proc.kill()
        proc.wait()
    assert _process_start(proc.pid) is None and not _owner_runs(proc.pid, _rfc3339(datetime.now(timezone.utc)))


def test_an_unreadable_creation_time_leaves_a_live_owners_stack_alone():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert _owner_runs(proc.pid, "not a time")
    finally:
        proc.kill()
        proc.wait()
