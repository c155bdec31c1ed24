"""Node identity and churn (server_app/nodes.py) on the in-process grid: SuperNodes that claim a
partition that is taken or out of range are refused while the run goes on; a SuperNode that leaves
is dropped with a log line, and one that comes back under a new node id takes its partition again.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error

from clients.app import app as client_app
from fedcore.config import Config
from server_app.app import run_experiment
from runner.inprocess import InProcessGrid
from tests.conftest import small_config


class ChurnGrid(InProcessGrid):
    """An in-process grid whose SuperNodes can leave and join: ``events[r]`` runs before round r's
    first message (as the ServerApp's refresh sees it); messages to a node that left get the error
    reply the SuperLink gives for an offline node."""

    def __init__(self, num_clients: int, run_config: dict, events: dict | None = None):
        super().__init__(client_app, num_clients, run_config)
        self.run_config = run_config
        self.events = dict(events or {})
        self.round = 0

    def add_node(self, node: int, pid: int, num_partitions: int) -> None:
        self.contexts[node] = Context(run_id=1, node_id=node, state=RecordDict(), run_config=dict(self.run_config),
                                      node_config={"partition-id": pid, "num-partitions": num_partitions})

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        rounds = [int(m.metadata.group_id) for m in messages if m.metadata.message_type == "train"]
        if rounds and rounds[0] > self.round:
            self.round = rounds[0]
        live = [m for m in messages if m.metadata.dst_node_id in self.contexts]
        gone = [Message(Error(code=5, reason="node unavailable"), reply_to=m) for m in messages
                if m.metadata.dst_node_id not in self.contexts]
        return super().send_and_receive(live, timeout=timeout) + gone


class ChurnEvents(ChurnGrid):
    def get_node_ids(self):
        event = self.events.pop(self.round + 1, None)
        if event is not None:
            event(self)
        return super().get_node_ids()


def _rounds(cfg: dict) -> list[dict]:
    with open(Path(cfg["results-dir"]) / cfg["run-name"] / "rounds.csv") as f:
        return list(csv.DictReader(f))


def test_a_second_claim_on_a_partition_is_refused_and_the_run_goes_on(tmp_path, caplog):
    cfg = small_config(tmp_path, method="fedavg")
    grid = ChurnGrid(3, cfg)
    grid.add_node(4242, 0, 3)  # claims partition 0, which node 1000 holds
    grid.add_node(4343, 7, 3)  # partition 7 of 3
    with caplog.at_level(logging.WARNING):
        summary = run_experiment(grid, Config.from_run_config(cfg))
    assert summary["num_clients"] == 3 and summary["final_acc"] is not None
    assert "refused SuperNode 4242: partition-id 0 is already held by node 1000" in caplog.text
    assert "refused SuperNode 4343: its client could not start: ValueError('partition-id 7 is outside 0..2')" in caplog.text
    assert not any(m.metadata.dst_node_id in (4242, 4343) for m in grid.sent if m.metadata.message_type == "train")


def test_a_node_that_leaves_is_dropped_and_its_successor_takes_the_partition_back(tmp_path, caplog):
    cfg = small_config(tmp_path, method="fedavg", **{"num-server-rounds": 4, "min-replies": 1})
    events = {2: lambda g: g.contexts.pop(1007),  # client 1's SuperNode stops after round 1
              3: lambda g: g.add_node(5000, 1, 3)}  # and comes back as a new node before round 3
    grid = ChurnEvents(3, cfg, events)
    with caplog.at_level(logging.INFO):
        summary = run_experiment(grid, Config.from_run_config(cfg))
    assert summary["final_acc"] is not None
    assert "client 1 (node 1007) has left" in caplog.text
    assert "client 1 is back on node 5000 (was node 1007)" in caplog.text
    assert [r["replies"] for r in _rounds(cfg)] == ["3", "2", "3", "3"]
    trained = {r: {m.metadata.dst_node_id for m in grid.sent
                   if m.metadata.message_type == "train" and m.metadata.group_id == str(r)} for r in (1, 3, 4)}
    assert trained[1] == {1000, 1007, 1014} and trained[3] == trained[4] == {1000, 5000, 1014}


def test_a_successor_with_other_data_is_refused(tmp_path, caplog):
    """A node claiming a departed client's partition with a different split (another num-partitions
    or dataset) is refused; the partition stays missing."""
    cfg = small_config(tmp_path, method="fedavg", **{"num-server-rounds": 3, "min-replies": 1})
    events = {2: lambda g: g.contexts.pop(1007), 3: lambda g: g.add_node(5000, 1, 4)}
    grid = ChurnEvents(3, cfg, events)
    with caplog.at_level(logging.INFO):
        run_experiment(grid, Config.from_run_config(cfg))
    assert "refused SuperNode 5000: num-partitions=4, the other SuperNodes say 3" in caplog.text
    assert [r["replies"] for r in _rounds(cfg)] == ["3", "2", "2"]
