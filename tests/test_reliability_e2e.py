"""Reliability through the real runtimes: faults and a killed-and-resumed run under `flwr run`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from benchmarks import reliability
from clients.faults import fault_for
from fedcore.config import Config
from fedcore.registry import REGISTRY

pytestmark = [pytest.mark.e2e, pytest.mark.long]  # real flwr runs: make test-long
EXPECTED = {"raise": "injected fault", "hang": "no reply", "nan": "NaN", "shape": "has shape", "missing": "missing",
            "wrong-pid": "does not match", "huge": "reply-norm-bound", "overflow": "overflows"}


def _rows(folder: Path) -> list[dict]:
    with open(folder / "rounds.csv") as f:
        return list(csv.DictReader(f))


def test_faulty_clients_under_flwr_run_are_dropped_and_the_run_completes(tmp_path):
    """30% of 6 clients misbehave every round (raise, hang past round-timeout, NaN, wrong shapes, missing
    records, wrong ids, huge values): the run completes and dropped.json says why for each."""
    config = {"supernodes": 6, "method": "fedavg", "dataset": "digits", "num-server-rounds": 3,
              "faults.share": 0.3, "faults.kinds": "raise,hang,nan,shape,wrong-pid,huge", "round-timeout": 30,
              "node-wait-s": 120, "results-dir": str(tmp_path / "results"), "run-name": "faults"}
    code, out = reliability._launch(config, tmp_path)
    assert code == 0, out[-3000:]
    folder = tmp_path / "results" / "faults"
    dropped = {(d["client"], d["round"]): d["reason"] for d in json.loads((folder / "dropped.json").read_text())}
    cfg = Config.from_run_config({k: v for k, v in config.items() if k != "supernodes"})
    plan = {(pid, r): fault_for(cfg, pid, 6, r) for r in (1, 2, 3) for pid in range(6)}
    plan = {k: v for k, v in plan.items() if v}
    assert set(plan) <= set(dropped)  # every faulty reply, 2 per round, is dropped for its own reason
    for key, kind in plan.items():
        assert EXPECTED[kind] in dropped[key], (kind, dropped[key])
    # a hanging client stalls the simulation actor it runs on, so a reply queued behind it may miss
    # the round's deadline too: those, and only those, are dropped as missing
    assert all("no reply" in dropped[k] for k in set(dropped) - set(plan))
    assert json.loads((folder / "summary.json").read_text())["final_acc"] is not None


@pytest.mark.long  # 1-3 minutes of flwr runs per method; the in-process resume test covers them by default
@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_a_run_killed_mid_round_resumes_to_the_uninterrupted_result(tmp_path, method):
    """SIGKILL of the simulation process (ServerApp + Ray driver) once round 2 of 4 is checkpointed,
    then `resume=true`: the same rounds.csv as a run that was never interrupted, for every method
    (client state comes back from the clients' disks). `python -m benchmarks.resume_table` writes
    the same as a table."""
    row = reliability.resume_run(method, tmp_path / "results", supernodes=3, rounds=4)
    assert row["killed_exit"] != 0 and row["resumed_exit"] == 0, row
    assert row["resumed_from"] in (2, 3) and row["rounds"] == 4 and row["equal_to_uninterrupted"], row
