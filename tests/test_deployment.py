"""Real deployments on loopback: flower-superlink + 2 SuperNodes + `flwr run`, judged by `flwr ls`.

Two deployments: FedAvg (weights) without TLS, and FedProto (class features) with TLS and SuperNode
authentication, where an unregistered SuperNode and one trusting another CA are refused first; and the churn
case (a SuperNode leaves mid-run and comes back as a new node). Each is ``long`` (the TLS one alone was about
40 s of CPU, a quarter of ``make test``'s budget): ``make test-long`` and ``make test-deploy`` run them, and
``make test-deploy-smoke`` (CI) deploys with TLS and SuperNode authentication on its own.
"""

from __future__ import annotations

import csv
import re
import time
from pathlib import Path

import pytest

from runner import certs
from runner import flower_cli as fc
from runner.deploy_local import LocalDeployment, deploy

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.deploy


def _config(tmp_path, method: str, rounds: int = 2, **extra) -> dict:
    return fc.resolve_config({"method": method, "dataset": "digits", "num-server-rounds": rounds, "node-wait-s": 60,
                              "results-dir": str(tmp_path / "results"), "run-name": method, **extra},
                             ROOT, tmp_path / "results")


def _rounds(result: dict) -> list[dict]:
    with open(Path(result["results_dir"]) / "rounds.csv") as f:
        return list(csv.DictReader(f))


def _wait_for_log(read, pattern: str, timeout: float = 300, every: float = 0.5) -> str:
    """Bounded wait for a line matching ``pattern`` in a log (a path, or a function returning the
    text); returns the log. The bound is minutes for what takes seconds: it ends a wait for a line
    that never comes, and a slow machine only waits longer."""
    deadline, text = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        text = read() if callable(read) else (read.read_text(errors="replace") if read.exists() else "")
        if re.search(pattern, text):
            return text
        time.sleep(every)  # polling the log; the verdict is whether the line came, not when
    raise AssertionError(f"no {pattern!r} after {timeout} s:\n{text[-2000:]}")


@pytest.mark.long  # a real flwr run / SuperLink: make test-long
def test_fedavg_deploys_on_loopback_without_tls(tmp_path):
    result = deploy(_config(tmp_path, "fedavg"), supernodes=2, app_dir=ROOT, workdir=tmp_path / "deploy", timeout=600)
    assert result["status"] == "finished:completed", result
    assert result["summary"]["num_clients"] == 2 and result["summary"]["final_acc"] is not None
    assert [r["replies"] for r in _rounds(result)] == ["2", "2"]


@pytest.mark.long
def test_the_fast_runtime_deploys_with_stock_flowers_results(tmp_path):
    """``--runtime fast`` (the default) changes when Flower's waits end, never what is computed: the same
    FedAvg deployment on Flower's commands as shipped (``--runtime flower``) ends with the very same numbers."""
    columns = ("acc_weighted", "acc_client_mean", "loss", "train_loss")
    rows = {}
    for runtime in ("fast", "flower"):
        result = deploy(_config(tmp_path / runtime, "fedavg"), supernodes=2, app_dir=ROOT,
                        workdir=tmp_path / runtime / "deploy", runtime=runtime, timeout=600)
        assert result["status"] == "finished:completed", result
        rows[runtime] = [[r[c] for c in columns] for r in _rounds(result)]
    assert rows["fast"] == rows["flower"]


@pytest.mark.long  # SuperLink, 4 SuperNodes, flwr CLI calls: about 40 s of CPU; make test-long / test-deploy
def test_fedproto_deploys_with_tls_and_supernode_auth_refusing_strangers(tmp_path):
    """TLS + --enable-supernode-auth: a SuperNode whose key is not registered is refused, one that
    trusts another CA cannot connect, the registered two run FedProto to the end, and no private
    key appears in any log or result we write."""
    workdir = tmp_path / "deploy"
    # one round: each round starts a ClientApp process per message, and the refusals, the completed run and the
    # key check need no second one
    config = _config(tmp_path, "fedproto", rounds=1)
    with LocalDeployment(ROOT, workdir, secure=True) as dep:
        dep.start_superlink()
        stranger = dep.add_supernode(0, 2, key="unregistered", register=False)
        other_ca, _ = certs.make_ca(tmp_path / "other-ca")
        foreign = dep.add_supernode(1, 2, key="supernode-foreign-ca", root_ca=other_ca)
        _wait_for_log(stranger.log, r"Failed to activate SuperNode|code: 2004")
        _wait_for_log(foreign.log, r"CERTIFICATE_VERIFY_FAILED|certificate verify failed")
        dep.stop_supernode(stranger)
        dep.stop_supernode(foreign)
        dep.add_supernode(0, 2)
        dep.add_supernode(1, 2)
        result = dep.run(config, timeout=600)
    assert result["status"] == "finished:completed", result
    assert result["summary"]["num_clients"] == 2 and result["summary"]["final_acc"] is not None
    assert [r["replies"] for r in _rounds(result)] == ["2"]
    secrets = [p.read_text() for p in (workdir / "certs").rglob("*") if p.is_file() and p.stat().st_mode & 0o077 == 0]
    assert len(secrets) >= 4  # CA key, SuperLink key, and the SuperNode keys, all mode 0600
    bodies = {line for text in secrets for line in text.splitlines() if len(line) > 40 and "-----" not in line}
    written = [p for p in (*workdir.glob("*.log"), *Path(result["results_dir"]).rglob("*")) if p.is_file()]
    for path in written:
        text = path.read_text(errors="replace")
        assert not any(line in text for line in bodies), f"private key material in {path}"


@pytest.mark.long
def test_a_supernode_that_leaves_and_comes_back_is_picked_up_again(tmp_path):
    """Churn: SuperNode 1 stops after round 1 (its client is dropped, min-replies=1 lets the run go
    on), then a new SuperNode with the same partition id joins and takes part again."""
    config = _config(tmp_path, "fedavg", rounds=8, **{"min-replies": 1})
    with LocalDeployment(ROOT, tmp_path / "deploy") as dep:
        dep.start_superlink()
        dep.add_supernode(0, 2)
        leaving = dep.add_supernode(1, 2)
        run_id = dep.submit(config)
        serverapp_log = lambda: dep.run_log(run_id)  # noqa: E731 - the ServerApp's log, via `flwr log`
        _wait_for_log(serverapp_log, r"\[round 1/8\]", timeout=300, every=3)
        dep.stop_supernode(leaving)
        _wait_for_log(serverapp_log, r"client 1 \(node \d+\) has left", timeout=300, every=3)
        dep.add_supernode(1, 2)
        _wait_for_log(serverapp_log, r"client 1 is back on node \d+", timeout=300, every=3)
        result = fc.run_result(dep.wait(run_id, timeout=600), config)
    assert result["status"] == "finished:completed", result
    replies = [int(r["replies"]) for r in _rounds(result)]
    assert 1 in replies and replies[-1] == 2, replies
