"""Which SuperNode holds which partition, for the whole run: identity, refusals and churn.

Node ids are random per SuperNode start; clients are known by the partition id they claim at the
handshake. ``Membership`` asks every SuperNode once who it is, and

* refuses (logs the reason, the run goes on) a node whose claim is out of range, disagrees on
  ``num-partitions`` or data shape, or names a partition that a live node already holds;
* before every round, picks up SuperNodes that joined since: one claiming the partition of a node
  that has gone (a restarted SuperNode: same partition id, new node id) takes over that partition
  in the strategy's ``node_of``/``pid_of``; a partition whose node is gone and not replaced is
  logged once and its replies are missing until it comes back (``min-replies`` decides whether a
  round goes on without it).

With SuperNode authentication on, only registered SuperNodes reach the SuperLink at all, so only
they can claim a partition. ``send_and_receive`` is ``Grid.send_and_receive`` with a short pull
interval (Flower's deployed grid waits a fixed 3 s between pulls).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from logging import INFO, WARNING

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedcore import wire
from fedstrategies.base import ClientInfo
from fedcore import flower_patches

PULL_INTERVALS_S = (0.01, 0.05)  # first and longest wait between pulls (each wait 1.5x the last)
IN_MEMORY_PULL_INTERVAL_S = 0.01  # simulation: a pull is a dict lookup, Flower's default waits 0.1 s
FULL_PULL_S = 1.0  # simulation: Flower's pull of every awaited message (expired ones answered) at least this apart
FULL_PULL_SHARE = 0.05  # ... and at most this share of the wall time (a full pull costs a check per message)


def tune_grid(grid: Grid) -> None:
    """Shorten Flower's waits for replies, once per run, before the first exchange.

    Simulation (``InMemoryGrid``): its ``send_and_receive`` sleeps ``pull_interval`` (0.1 s) between
    pulls, so each phase ended up to 0.1 s after its last reply, twice per round; 10 ms instead; an
    actor of a lost Ray node leaves the engine's pool (``flower_patches.dead_actors``, any runtime); and
    the engine finds each node's messages in an index instead of a scan of every stored message
    (``flower_patches.indexed_message_ins``, any runtime: a pass cost N x M checks).
    Deployed (``HttpGrid``), in a fast-runtime run only (``PFL_RUNTIME=fast``): a reply's objects that are not on
    the SuperLink yet are retried after 10 ms, not Flower's fixed 1 s (``flower_patches.object_pulls``).
    """
    from flwr.superlink.grid import InMemoryGrid
    from flwr.superlink.grid.http_grid import HttpGrid

    if isinstance(grid, InMemoryGrid):
        grid.pull_interval = IN_MEMORY_PULL_INTERVAL_S
        flower_patches.dead_actors()  # a lost Ray node costs only the replies it was computing
        if flower_patches.scale_asked():
            flower_patches.indexed_message_ins(grid.state)  # the cost of a message does not grow with the nodes
    elif isinstance(grid, HttpGrid) and flower_patches.asked():
        flower_patches.object_pulls(PULL_INTERVALS_S[1])


def send_and_receive(grid: Grid, messages: Iterable[Message], timeout: float) -> list[Message]:
    """Push ``messages`` and pull their replies until all are in or ``timeout`` s have passed.

    On Flower's deployed grid (``HttpGrid``, whose own loop sleeps 3 s) the waits between pulls grow
    from 10 ms to 50 ms: quick replies are seen at once, long training costs few requests (the
    ServerApp's ``main`` shortens the retries of a reply's objects likewise, once per run). In
    simulation (``InMemoryGrid``) every wait is the grid's ``pull_interval``, a pull asks only for the
    messages whose reply is in (``flower_patches.replied``; Flower checks every id it is asked for, so
    pulling all W awaited ids every 10 ms cost W checks a pull) and, in a fast-runtime run, the engine is
    woken as soon as the messages are in (``flower_patches.kick``). Any other grid (in-process) keeps its
    own ``send_and_receive``.
    """
    from flwr.superlink.grid import InMemoryGrid
    from flwr.superlink.grid.http_grid import HttpGrid

    messages = list(messages)
    if not isinstance(grid, (HttpGrid, InMemoryGrid)):
        return list(grid.send_and_receive(messages, timeout=timeout))
    waiting = set(grid.push_messages(messages))
    first, longest = PULL_INTERVALS_S
    if isinstance(grid, InMemoryGrid):  # simulation: the engine takes the messages now, not at its next poll
        if flower_patches.asked():
            flower_patches.kick()
        return _pull_in_memory(grid, waiting, timeout)
    deadline = time.monotonic() + timeout
    replies: list[Message] = []
    wait = first
    while waiting:
        got = list(grid.pull_messages(waiting))
        replies.extend(got)
        waiting.difference_update(m.metadata.reply_to_message_id for m in got)
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(wait)
        wait = min(wait * 1.5, longest)
    return replies


def _pull_in_memory(grid, waiting: set[str], timeout: float) -> list[Message]:
    """The replies to ``waiting`` from a simulation's grid: every ``pull_interval`` those that are in,
    and Flower's pull of all of them (which answers an expired message with an error reply) every
    ``FULL_PULL_S`` s, at most ``FULL_PULL_SHARE`` of the time, and at the deadline."""
    deadline = time.monotonic() + timeout
    next_full = time.monotonic() + FULL_PULL_S
    scaled = flower_patches.scale_asked()  # else every pull asks for every awaited message, as Flower's does
    replies: list[Message] = []
    while waiting:
        start = time.monotonic()
        full = start >= next_full or start >= deadline
        asked = waiting if full or not scaled else flower_patches.replied(grid.state, waiting)
        if asked:
            got = list(grid.pull_messages(asked))
            replies.extend(got)
            waiting.difference_update(m.metadata.reply_to_message_id for m in got)
        if full:
            next_full = time.monotonic() + max(FULL_PULL_S, (time.monotonic() - start) / FULL_PULL_SHARE)
        if not waiting or start >= deadline:
            break
        time.sleep(grid.pull_interval)
    return replies


class StartupError(RuntimeError):
    """The federation cannot start: a client failed to load its data, or no client answered."""


class Membership:
    """The run's clients by partition id, and the SuperNode that holds each one now."""

    def __init__(self, grid: Grid, cfg):
        self.grid = grid
        self.cfg = cfg
        self.claims: dict[int, ClientInfo] = {}  # node id -> what it claimed at its handshake
        self.refused: dict[int, str] = {}  # node id -> why it was not taken
        self.holder: dict[int, int] = {}  # partition id -> node id serving it now
        self.shape: dict | None = None  # input shape and class count all clients must share
        self.expected: int | None = None  # num-partitions all clients must agree on
        self.gone: set[int] = set()  # partitions whose node left and has not been replaced
        self.duplicates: set[int] = set()  # nodes refused because a live node holds their partition

    # ------------------------------------------------------------------ start of the run
    def connect(self) -> tuple[dict[int, ClientInfo], tuple[int, ...], int]:
        """Handshake every SuperNode until all partitions are held or ``node-wait-s`` runs out.

        Returns the clients by partition id, the input shape and the number of classes. If no
        client can start (e.g. every partition is too small), ``StartupError`` says why.
        """
        deadline = time.monotonic() + self.cfg["node-wait-s"]
        while True:
            live = set(self.grid.get_node_ids())
            self._ask_new_nodes(live)
            for node in sorted(live):
                info = self.claims.get(node)
                if info is not None and info.pid not in self.holder:
                    self.holder[info.pid] = node
                elif info is not None and self.holder[info.pid] != node:
                    self._refuse_duplicate(node, info.pid)
            if self.expected is not None and len(self.holder) >= self.expected:
                break
            if time.monotonic() >= deadline:
                if not self.holder and self.refused:
                    node, reason = next(iter(self.refused.items()))
                    raise StartupError(f"no client could start ({len(self.refused)} refused); "
                                       f"the client on node {node}: {reason}")
                if not self.holder:
                    raise StartupError(
                        f"no SuperNode answered its handshake within node-wait-s={self.cfg['node-wait-s']} s "
                        f"({len(live)} connected; each handshake waits round-timeout={self.cfg['round-timeout']} s and "
                        "is asked again until node-wait-s runs out, so a client's cold start must fit in node-wait-s)")
                log(WARNING, "only %s of %s clients connected after %s s; going on without partitions %s",
                    len(self.holder), self.expected, self.cfg["node-wait-s"],
                    sorted(set(range(self.expected)) - set(self.holder)))
                break
            time.sleep(0.2)
        clients = {pid: self.claims[node] for pid, node in sorted(self.holder.items())}
        return clients, self.shape["input_shape"], self.shape["num_classes"]

    # ------------------------------------------------------------------ between rounds
    def refresh(self, strategy, server_round: int) -> None:
        """Before a round: hand the partitions of SuperNodes that left to the ones that came back."""
        live = set(self.grid.get_node_ids())
        self._ask_new_nodes(live)
        for pid, node in sorted(self.holder.items()):
            if node not in live and pid not in self.gone:
                self.gone.add(pid)
                log(WARNING, "round %s: client %s (node %s) has left; it is left out until a SuperNode with "
                    "partition-id=%s comes back (min-replies=%s decides whether rounds go on)", server_round,
                    pid, node, pid, self.cfg["min-replies"])
        for node in sorted(live - set(self.holder.values()) - set(self.refused)):
            info = self.claims.get(node)
            if info is None:
                continue
            pid, started = info.pid, strategy.clients.get(info.pid)
            if started is None:
                self._refuse(node, f"partition-id {pid} was not part of this run at its start "
                                   f"(partitions {sorted(strategy.clients)})")
            elif (info.num_train, info.num_test, info.num_val) != (started.num_train, started.num_test, started.num_val):
                self._refuse(node, f"partition-id {pid} reports {info.num_train}/{info.num_test}/{info.num_val} "
                                   f"train/test/validation samples, the run started with {started.num_train}/"
                                   f"{started.num_test}/{started.num_val}")
            elif self.holder.get(pid) in live:
                self._refuse_duplicate(node, pid)
            else:
                self._hand_over(strategy, pid, node, server_round)

    def _hand_over(self, strategy, pid: int, node: int, server_round: int) -> None:
        old = self.holder.get(pid)
        self.holder[pid] = node
        self.gone.discard(pid)
        strategy.pid_of.pop(old, None)
        strategy.pid_of[node] = pid
        strategy.node_of[pid] = node
        strategy.clients[pid] = replace(strategy.clients[pid], node_id=node)
        log(INFO, "round %s: client %s is back on node %s (was node %s)", server_round, pid, node, old)

    # ------------------------------------------------------------------ handshakes
    def _ask_new_nodes(self, live: set[int]) -> None:
        """Handshake the live SuperNodes not asked before; their claims go to ``claims`` or ``refused``
        (a client that cannot build its partition is refused with its own error message)."""
        new = sorted(live - set(self.claims) - set(self.refused))
        if not new:
            return
        config = ConfigRecord({wire.SERVER_ROUND: 0, wire.PHASE: "handshake"})
        msgs = [Message(RecordDict({wire.CONFIG: config}), dst_node_id=n, message_type=wire.HANDSHAKE, group_id="0")
                for n in new]
        for reply in send_and_receive(self.grid, msgs, self.cfg["round-timeout"]):
            node = reply.metadata.src_node_id
            reason, info = (f"its client could not start: {reply.error.reason}", None) if reply.has_error() \
                else self._read_claim(node, reply)
            if reason is not None:
                self._refuse(node, reason)
            else:
                self.claims[node] = info

    def _read_claim(self, node: int, reply: Message) -> tuple[str | None, ClientInfo | None]:
        try:
            m = reply.content.metric_records[wire.METRICS]
            pid, n_parts = int(m[wire.PARTITION_ID]), int(m[wire.NUM_PARTITIONS])
            shape = {"input_shape": tuple(int(v) for v in m[wire.INPUT_SHAPE]), "num_classes": int(m[wire.NUM_CLASSES])}
            info = ClientInfo(pid, node, int(m[wire.NUM_TRAIN]), int(m[wire.NUM_TEST]),
                              np.array(m[wire.TRAIN_LABEL_COUNTS]), np.array(m[wire.TEST_LABEL_COUNTS]),
                              int(m.get(wire.NUM_VAL, 0)))
        except (KeyError, TypeError, ValueError) as err:
            return f"malformed handshake ({err!r})", None
        if self.expected is not None and n_parts != self.expected:
            return f"num-partitions={n_parts}, the other SuperNodes say {self.expected}", None
        if not 0 <= pid < n_parts:
            return f"partition-id {pid} is outside 0..{n_parts - 1}", None
        if self.shape is not None and shape != self.shape:
            return f"data shape {shape} differs from the other clients' {self.shape}", None
        self.expected, self.shape = n_parts, shape
        return None, info

    def _refuse(self, node: int, reason: str) -> None:
        """Leave a node out for the rest of the run (its claim cannot become valid)."""
        self.refused[node] = reason
        log(WARNING, "refused SuperNode %s: %s; the run goes on without it", node, reason)

    def _refuse_duplicate(self, node: int, pid: int) -> None:
        """Leave a node out while another live node holds its partition (logged once); it takes
        the partition over if that node leaves."""
        if node not in self.duplicates:
            self.duplicates.add(node)
            log(WARNING, "refused SuperNode %s: partition-id %s is already held by node %s; the run goes on "
                "without it", node, pid, self.holder[pid])
