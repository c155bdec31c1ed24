"""Pieces of the deployment that need no running Flower: certificates and keys, the partition
cache, and the fast runtime's capped sleeps, object-pull back-off and FAB install."""

from __future__ import annotations

import os
import stat
import time

import numpy as np
import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from clients import data as client_data, partition_cache
from fedcore import flower_patches
from fedcore.config import Config
from runner import certs
from runner import fast_runtime


def test_certificates_chain_to_the_ca_with_the_right_names_and_private_keys_stay_private(tmp_path):
    paths = certs.make_all(tmp_path, 2, ["superlink", "localhost", "127.0.0.1"])
    ca = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
    server = x509.load_pem_x509_certificate(paths["certificate"].read_bytes())
    server.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["superlink", "localhost"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    other = x509.load_pem_x509_certificate(certs.make_ca(tmp_path / "other")[0].read_bytes())
    with pytest.raises(Exception):
        server.verify_directly_issued_by(other)
    for private, public in paths["supernode_keys"]:
        key = load_ssh_private_key(private.read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
        assert load_ssh_public_key(public.read_bytes()).public_numbers() == key.public_key().public_numbers()
    for private in [tmp_path / "ca.key", paths["key"], *(p for p, _ in paths["supernode_keys"])]:
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private


def test_supernode_keys_are_kept_on_a_second_run_and_replaced_only_when_forced(tmp_path):
    first = certs.make_all(tmp_path, 1, ["localhost"])["supernode_keys"][0][1].read_bytes()
    again = certs.make_all(tmp_path, 2, ["localhost"])["supernode_keys"]
    assert again[0][1].read_bytes() == first and len(again) == 2
    forced = certs.make_all(tmp_path, 1, ["localhost"], force=True)["supernode_keys"][0][1].read_bytes()
    assert forced != first


def _load(cfg, pid=0, n=3):
    client_data._client_data.cache_clear()
    return client_data.load_client_data(cfg, pid, n, torch.device("cpu"))


def test_partition_cache_serves_the_same_split_keyed_by_what_determines_it(tmp_path, monkeypatch):
    monkeypatch.setenv(partition_cache.CACHE_ENV, str(tmp_path / "cache"))
    cfg = Config.from_run_config({"dataset": "digits", "partition": "pathological", "seed": 0})
    fresh = _load(cfg)
    files = list((tmp_path / "cache").glob("*.npz"))
    assert len(files) == 1
    cached = _load(cfg)  # now read from the file
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(fresh, name), getattr(cached, name))
    assert np.array_equal(fresh.train_label_counts, cached.train_label_counts)
    _load(Config.from_run_config({"dataset": "digits", "partition": "pathological", "seed": 1}))
    _load(cfg, pid=1)
    _load(cfg, n=4)
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 4
    monkeypatch.setenv(partition_cache.CACHE_ENV, "0")
    assert partition_cache.cache_path(("digits", "iid", 2, 0, "", (), ()), 0) is None


def test_the_fast_supernode_caps_flowers_fixed_sleeps_and_backs_off_when_idle(monkeypatch):
    now = [100.0]
    slept = []

    def fake_sleep(seconds):
        slept.append(round(seconds, 6))
        now[0] += seconds

    monkeypatch.setattr(fast_runtime.time, "sleep", fake_sleep)
    capped = fast_runtime._CappedSleep(0.2, local_cap=0.01, first=0.01, clock=lambda: now[0])
    for _ in range(10):
        capped.sleep(3)  # idle polls of the SuperLink (Flower sleeps 3 s after each empty poll)
    assert slept[:3] == [0.01, 0.015, 0.0225] and slept[-2:] == [0.2, 0.2]  # 1.5x each, up to the cap
    assert all(b >= a for a, b in zip(slept, slept[1:]))
    slept.clear()
    capped.sleep(0.5)  # waiting on the node's own state for its ClientApp's reply
    now[0] += 0.8  # the node ran a task
    capped.sleep(3)  # the next message is expected soon: poll again quickly
    assert slept == [0.01, 0.01]
    assert capped.monotonic() > 0  # every other attribute is the time module's


def test_fast_object_pulls_retry_a_missing_object_after_10_ms_not_flowers_1_s(monkeypatch):
    import threading

    from flwr.supercore.inflatable import inflatable_utils
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    waits = []

    class RecordingEvent(threading.Event):  # the back-off sleeps are Event.wait(timeout) calls
        def wait(self, timeout=None):
            if timeout is None:
                return super().wait()
            waits.append(timeout)
            return self.is_set()

    def pull_after_three_misses(object_id, misses=[]):  # noqa: B006 - the call counter
        if len(misses) < 3:
            misses.append(object_id)
            raise ObjectUnavailableError(object_id)
        return b"content"

    for fn in (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree):
        monkeypatch.setattr(fn, "__kwdefaults__", dict(fn.__kwdefaults__))  # restored after the test
    monkeypatch.setattr(inflatable_utils.threading, "Event", RecordingEvent)
    flower_patches.object_pulls(0.03)
    assert inflatable_utils.pull_objects(["a"], pull_after_three_misses) == {"a": b"content"}
    assert len(waits) == 3
    assert 0.008 <= waits[0] <= 0.012  # 10 ms +- Flower's 20% jitter
    assert 0.016 <= waits[1] <= 0.024
    assert 0.024 <= waits[2] <= 0.036  # 40 ms, capped at 30 ms
    assert inflatable_utils.pull_and_inflate_object_from_tree.__kwdefaults__["initial_backoff"] == 0.01


def test_a_fab_already_installed_is_not_unpacked_again(tmp_path, monkeypatch):
    import hashlib

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    installs = []

    def flower_install(content, skip_prompt=False):
        installs.append(content)
        folder = tmp_path / "apps" / f"pub.app.1.0.{hashlib.sha256(content).hexdigest()[:8]}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "mod.py").write_text("x = 1\n")
        return folder

    install = fast_runtime.install_fab_once(flower_install)
    first = install(b"fab one", skip_prompt=True)
    assert list((first / "__pycache__").glob("mod.*.pyc"))  # compiled once, when installed
    assert install(b"fab one", skip_prompt=True) == first
    assert installs == [b"fab one"]
    assert install(b"fab two", skip_prompt=True) != first  # other bytes: installed by Flower
    assert installs == [b"fab one", b"fab two"]


def test_simulation_grid_waits_10_ms_between_reply_pulls_not_flowers_100_ms(monkeypatch):
    """Flower's in-memory grid (simulation) sleeps ``pull_interval`` between pulls; after
    ``tune_grid`` its own ``send_and_receive`` loop waits 10 ms, so a phase ends soon after its last reply."""
    from types import SimpleNamespace

    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import InMemoryGrid, inmemory_grid
    from flwr.supercore.object_store import ObjectStoreFactory

    from server_app.nodes import IN_MEMORY_PULL_INTERVAL_S, tune_grid

    grid = InMemoryGrid(LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()))
    assert grid.pull_interval == 0.1  # Flower's default, which the test would otherwise record
    tune_grid(grid)
    sleeps, pulls = [], []
    reply = SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id="m1"))
    monkeypatch.setattr(grid, "push_messages", lambda messages: ["m1"])
    monkeypatch.setattr(grid, "pull_messages", lambda ids: [reply] if pulls.append(ids) or len(pulls) == 3 else [])
    monkeypatch.setattr(inmemory_grid.time, "sleep", sleeps.append)
    assert list(grid.send_and_receive([object()], timeout=60)) == [reply]
    assert sleeps == [IN_MEMORY_PULL_INTERVAL_S] * 2 == [0.01, 0.01]


def test_the_forking_superexec_asks_for_the_next_task_as_soon_as_a_clientapp_ends(monkeypatch):
    """Flower's SuperExec sleeps a fixed interval between asks; ours backs off from 10 ms to the cap
    and is woken by a byte that each forked ClientApp writes as it ends."""
    import types

    from flwr.supercore.constant import TaskType
    from flwr.supernode.runtime import run_clientapp as flower_clientapp

    monkeypatch.setattr(flower_clientapp, "run_clientapp", lambda **kwargs: None)  # what the forked child runs
    read_end, write_end = os.pipe()
    poll = fast_runtime._TaskPoll(read_end, first=0.01, cap=0.03)
    for expected in (0.015, 0.0225, 0.03, 0.03):
        poll.sleep(60)  # Flower's interval is replaced: each empty wait is the current delay, at most the cap
        assert poll.delay == pytest.approx(expected)

    class Fallback:
        def reconcile(self):
            pass

    executor = fast_runtime.ForkExecutor(Fallback(), write_end)
    spec = types.SimpleNamespace(task_type=TaskType.CLIENT_APP, task_id=1, runtime_api_address="127.0.0.1:1",
                                 token="t", insecure=True, root_certificates_path=None, parent_pid=os.getpid(),
                                 runtime_dependency_install=False, suppress_output=True)
    executor.launch(spec)
    (child,) = executor.children
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0  # the child ran the patched run_clientapp
    poll.sleep(60)  # the ended ClientApp's byte is waiting: no wait, and the next ask comes after 10 ms
    assert poll.delay == 0.01
    os.close(read_end)
    os.close(write_end)


def test_deployed_methods_counts_a_run_complete_only_with_exit_0_and_a_summary(tmp_path, monkeypatch):
    """benchmarks.deployed_methods: a row says "yes" only where the deploy command exited 0 and its
    ServerApp wrote summary.json; the table names the command each row ran."""
    import json

    from benchmarks import deployed_methods as dm

    def fake_launch(config, workdir, module):  # what runner.deploy_local leaves behind
        assert module == "runner.deploy_local" and config["supernodes"] == 2 and config["dataset"] == "digits"
        if config["method"] != "no-summary":
            folder = tmp_path / config["run-name"]
            folder.mkdir()
            (folder / "summary.json").write_text(json.dumps({"rounds": 2, "final_acc": 0.5}))
        return (1 if config["method"] == "failed" else 0), "log"

    monkeypatch.setattr(dm, "_launch", fake_launch)
    rows = [{"method": m, "deployed": dm.one_run("runner.deploy_local", m, 2, {"dataset": "digits"}, tmp_path,
                                                 f"deployed-{m}")} for m in ("ok", "failed", "no-summary")]
    assert [r["deployed"]["completed"] for r in rows] == [True, False, False]
    assert rows[1]["deployed"]["exit"] == 1 and rows[2]["deployed"]["rounds"] == 0
    table = dm.format_table(rows, dm.command("runner.deploy_local", 2, "dataset='digits'"), None, "Made by x")
    assert "| ok | yes | 0 | 2 | 50.0 |" in table and "| failed | NO | 1 | 2 | 50.0 |" in table
    assert "| no-summary | NO | 0 | 0 | - |" in table
    assert "--supernodes 2 --run-config \"method='X' dataset='digits'\"" in table
    dm.write_csv(rows, tmp_path / "table.csv", flwr_run=False)
    assert (tmp_path / "table.csv").read_text().splitlines()[0] == (
        "method,deployed_completed,deployed_exit,deployed_rounds,deployed_final_acc,deployed_wall_s")
