"""The simulation path's cost per message does not grow with the number of nodes (fedcore/flower_patches.py,
docs/scale.md): each patch is shown on Flower's real in-memory LinkState and grid, by counting the checks Flower
makes per message at two federation sizes, with and without the patch (without it the count grows with N)."""

from __future__ import annotations

import threading

import pytest

from flwr.app import Message, RecordDict

from benchmarks.flower_patches_cost import Federation
from fedcore import flower_patches
from fedcore.flower_patches import FlowerMismatch
from server_app import nodes


def _mover_checks_per_message(n: int, patched: bool) -> float:
    fed = Federation(n, patched)
    sent = fed.send(list(fed.mapping))
    fed.checks = 0
    moved = fed.mover_pass()
    assert sorted(m.metadata.message_id for m in moved) == sorted(sent)  # every message, once
    assert all(m.metadata.delivered_at for m in moved)
    assert fed.mover_pass() == []  # delivered messages are not handed out again
    return fed.checks / n


def test_the_message_mover_checks_each_message_a_bounded_number_of_times_however_many_nodes():
    stock = [_mover_checks_per_message(n, patched=False) for n in (50, 200)]
    patched = [_mover_checks_per_message(n, patched=True) for n in (50, 200)]
    assert stock[1] >= 3 * stock[0]  # Flower: every node's call walks every stored message (N x M a pass)
    assert patched == [1.0, 1.0]  # the index: one check per message handed out, none for the next pass


def test_the_index_delivers_what_flower_delivers_in_the_same_order():
    """Two messages for one node, one for another, an expired one and one sent before the patch: each node
    gets its own in the order they were stored, one per pass (Flower's ``limit=1``), the expired one never."""
    fed = Federation(3, patched=False)
    a, b, c = list(fed.mapping)
    early = fed.send([a])
    flower_patches.indexed_message_ins(fed.state)
    assert not flower_patches.indexed_message_ins(fed.state)  # once per state
    later = fed.send([a, b])
    expired = fed.send([c])
    fed.state.message_ins_store[expired[0]].metadata.__dict__["_ttl"] = 0.0  # expires now
    first = {m.metadata.dst_node_id: m.metadata.message_id for m in fed.mover_pass()}
    second = {m.metadata.dst_node_id: m.metadata.message_id for m in fed.mover_pass()}
    assert first == {a: early[0], b: later[1]} and second == {a: later[0]}
    assert expired[0] not in fed.state.message_ins_store  # deleted as Flower's own check deletes it
    assert fed.mover_pass() == []


def _pull_checks_per_message(n: int, pull) -> float:
    """Checks per message while the ServerApp pulls the replies of a phase of ``n`` messages that come in
    ten at a time (a pull after each ten, as a 10 ms pull loop sees them)."""
    fed = Federation(n, patched=True)
    waiting = set(fed.send(list(fed.mapping)))
    moved = fed.mover_pass()
    fed.checks = 0
    got = []
    for i in range(0, n, 10):
        fed.reply(moved[i:i + 10])
        replies = pull(fed, waiting)
        got += replies
        waiting.difference_update(r.metadata.reply_to_message_id for r in replies)
    assert len(got) == n and not waiting
    return fed.checks / n


def _flower_pull(fed, waiting):
    return list(fed.grid.pull_messages(waiting))


def _replied_pull(fed, waiting):
    return list(fed.grid.pull_messages(flower_patches.replied(fed.state, waiting)))


def test_pulling_only_the_replied_messages_checks_each_message_once_however_many_nodes():
    stock = [_pull_checks_per_message(n, _flower_pull) for n in (50, 200)]
    patched = [_pull_checks_per_message(n, _replied_pull) for n in (50, 200)]
    assert stock[1] >= 2.5 * stock[0]  # Flower checks every awaited message at every pull
    assert patched[0] == patched[1] <= 2  # one check as the reply is stored, one as it is pulled


def test_the_serverapps_pull_loop_gets_every_reply_and_answers_an_expired_message(monkeypatch):
    """``nodes.send_and_receive`` on the simulation grid: the replies that come in, and for a message that
    expired unanswered, Flower's own error reply (from the full pull, which also runs at the deadline)."""
    monkeypatch.setattr(nodes, "FULL_PULL_S", 0.05)
    fed = Federation(4, patched=True)
    fed.grid.pull_interval = 0.001
    ids = list(fed.mapping)
    msgs = [Message(RecordDict(), dst_node_id=n, message_type="train", group_id="1") for n in ids]
    msgs[3].metadata.ttl = 0.3
    done = threading.Event()

    def clients():  # the engine: answer three of the four messages as they are moved
        answered = 0
        while answered < 3 and not done.is_set():
            moved = [m for m in fed.mover_pass() if m.metadata.dst_node_id != ids[3]]
            fed.reply(moved)
            answered += len(moved)

    worker = threading.Thread(target=clients)
    worker.start()
    try:
        replies = nodes.send_and_receive(fed.grid, msgs, timeout=5)
    finally:
        done.set()
        worker.join()
    by_request = {r.metadata.reply_to_message_id: r for r in replies}
    assert sorted(by_request) == sorted(m.metadata.message_id for m in msgs)
    assert [m.metadata.dst_node_id for m in msgs if by_request[m.metadata.message_id].has_error()] == [ids[3]]


def test_a_state_that_is_not_flowers_in_memory_one_is_refused(monkeypatch):
    with pytest.raises(FlowerMismatch, match="not an InMemoryLinkState"):
        flower_patches.indexed_message_ins(object())
    monkeypatch.setitem(flower_patches._SIGNATURES, "get_message_ins", ["self", "node_id"])
    fed_state = Federation(2, patched=False).state
    with pytest.raises(FlowerMismatch, match="get_message_ins takes"):
        flower_patches.indexed_message_ins(fed_state)
    assert "get_message_ins" not in vars(fed_state)  # nothing patched
