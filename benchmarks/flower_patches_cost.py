"""What each scale patch of ``fedcore.flower_patches`` saves, on Flower's own simulation state (no Ray, no clients):
the seconds and the checks of stored messages Flower makes while one phase of a round is moved to the workers and
its replies are pulled, with the patch and without it, at 1,000 and 10,000 nodes.

    python -m benchmarks.flower_patches_cost [--out docs/results/flower-patches-cost]

* ``indexed_message_ins``: the engine's message mover (``vce_api.add_messages_to_queue``) makes passes over
  every node while a phase's messages are stored; a row times one pass that hands the phase's M messages out
  and one pass after it (the messages stay stored, delivered, until their replies are pulled: every pass of
  the phase costs this);
* ``replied``: the ServerApp pulls the phase's replies as they come in, 1% of them between two pulls (at a
  10 ms pull interval, a phase of 100 s); a row is the phase's pulls together.

Seconds are taken on whatever machine runs it (a shared one is slower, not differently shaped); the checks are
exact counts. Writes table.md and table.csv.
"""

from __future__ import annotations

import argparse
import csv
import sys
import threading
import time
from pathlib import Path
from queue import Queue

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
from flwr.server.superlink.fleet.vce.vce_api import _register_nodes, add_messages_to_queue
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from fedcore import flower_patches

class Federation:
    """Flower's simulation state with ``n`` registered nodes and a run, as ``flwr-simulation`` builds it, and
    a count of the checks of stored messages Flower makes (``_check_stored_messages``, one per id)."""

    def __init__(self, n: int, patched: bool):
        factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
        self.mapping = _register_nodes(n, factory)
        self.state = factory.state()
        run = Run.create_empty(run_id=7)
        run.primary_task_id, run.federation_id = 11, NOOP_FEDERATION_ID
        self.state.run_ids[run.run_id] = RunRecord(run=run)
        self.state.task_store[11] = Task(task_id=11, run_id=run.run_id)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run.run_id, 1, 11
        self.grid = InMemoryGrid(state_factory=factory)
        self.grid.set_run(run)
        self.checks = 0
        flower_check = self.state._check_stored_messages

        def counted(message_ids, run_id=None):
            self.checks += len(message_ids)
            return flower_check(message_ids, run_id)

        self.state._check_stored_messages = counted
        if patched and not flower_patches.indexed_message_ins(self.state):
            raise RuntimeError("the state was indexed already")

    def send(self, node_ids) -> list[str]:
        return list(self.grid.push_messages(
            [Message(RecordDict({"c": ConfigRecord({"x": 1})}), dst_node_id=n, message_type="train", group_id="1")
             for n in node_ids]))

    def mover_pass(self) -> list[Message]:
        """One pass of Flower's own message mover (``vce_api.add_messages_to_queue``) over every node."""
        stop, queue = threading.Event(), Queue()
        stop.wait = lambda timeout=None: stop.set()  # one pass, then the loop ends
        add_messages_to_queue(self.state, queue, self.mapping, stop)
        return [queue.get_nowait() for _ in range(queue.qsize())]

    def reply(self, messages) -> None:
        for m in messages:
            reply = Message(RecordDict(), reply_to=m)
            reply.metadata.__dict__["_message_id"] = f"r-{m.metadata.message_id}"
            self.state.store_message_res(reply)



# (nodes, messages of the phase): a full evaluation at 1,000 and 1% of 10,000; Flower's scan at 10,000 nodes with
# every node's message stored is 10^8 checks a pass, which this benchmark does not wait for
CASES = ((1_000, 1_000), (10_000, 100))


def mover_row(nodes: int, messages: int, patched: bool) -> dict:
    fed = Federation(nodes, patched)
    fed.send(list(fed.mapping)[:messages])
    fed.checks = 0
    t0 = time.perf_counter()
    moved = fed.mover_pass()
    t1 = time.perf_counter()
    fed.mover_pass()
    t2 = time.perf_counter()
    if len(moved) != messages:
        raise RuntimeError(f"{len(moved)} of {messages} messages moved")
    return {"patch": "indexed_message_ins", "nodes": nodes, "messages": messages, "path": _path(patched),
            "what": "mover pass handing the phase out / next pass", "seconds": t1 - t0, "seconds_after": t2 - t1,
            "checks": fed.checks}


def pull_row(nodes: int, messages: int, patched: bool) -> dict:
    fed = Federation(nodes, patched=True)
    waiting = set(fed.send(list(fed.mapping)[:messages]))
    moved = fed.mover_pass()
    fed.checks = 0
    step = max(1, messages // 100)
    seconds = 0.0
    for i in range(0, messages, step):
        fed.reply(moved[i:i + step])
        t0 = time.perf_counter()
        asked = flower_patches.replied(fed.state, waiting) if patched else waiting
        got = list(fed.grid.pull_messages(asked))
        seconds += time.perf_counter() - t0
        waiting.difference_update(m.metadata.reply_to_message_id for m in got)
    if waiting:
        raise RuntimeError(f"{len(waiting)} replies not pulled")
    return {"patch": "replied", "nodes": nodes, "messages": messages, "path": _path(patched),
            "what": "the phase's pulls, 1% of the replies between two", "seconds": seconds, "seconds_after": None,
            "checks": fed.checks}


def _path(patched: bool) -> str:
    return "patched" if patched else "Flower's own"


def table(rows: list[dict], command: str, commit: str) -> str:
    lines = [f"Made by `{command}` at commit `{commit}`.", "",
             "| patch | nodes | messages in the phase | path | what is timed | seconds | checks of stored messages |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        secs = f"{r['seconds']:.4f}" + (f" / {r['seconds_after']:.4f}" if r["seconds_after"] is not None else "")
        lines.append(f"| {r['patch']} | {r['nodes']:,} | {r['messages']:,} | {r['path']} | {r['what']} | {secs} "
                     f"| {r['checks']:,} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/results/flower-patches-cost"))
    parser.add_argument("--allow-dirty", action="store_true", help="write a docs/ table from uncommitted code")
    args = parser.parse_args(argv)
    from runner.provenance import command_line, commit, guard

    dirty = guard(args.out, args.allow_dirty)
    stamp = commit() + (" + uncommitted changes" if dirty else "")
    rows = []
    for nodes, messages in CASES:
        for make in (mover_row, pull_row):
            for patched in (False, True):
                rows.append(make(nodes, messages, patched))
                print(rows[-1], flush=True)
    text = table(rows, command_line("benchmarks.flower_patches_cost", argv), stamp)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(text)
    with open(args.out / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, [*rows[0], "commit"])
        writer.writeheader()
        writer.writerows({**r, "commit": stamp} for r in rows)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
