"""The base's cache of packed records (``PersonalizedStrategy.packed``): a record shared by many messages is
packed once, and the base forgets it after every aggregation and on ``load_state_dict``, so no method clears
a cache of its own and no message carries a state older than the strategy's."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord

from tests.conftest import SMALL_CREFF, SMALL_MUPFL
from tests.fakes import fake_clients, fake_reply
from fedcore import wire
from fedcore.config import Config
from fedcore.models import model_facts
from fedcore.registry import REGISTRY

# the strategies that share packed records between messages (the global model, heads, features, clusters)
SHARING = ("fedavg", "fednova", "creff", "fedfcd", "fedgh", "fedproto", "mupfl", "pfedpm", "fedsac", "cfl", "fesem")
SMALL = {"mupfl": SMALL_MUPFL, "creff": SMALL_CREFF}  # their server's matching, at a small size


def _strategy(method: str):
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    cfg = Config.from_run_config({"method": method, "dataset": "digits", "fraction-train": 1.0,
                                  **SMALL.get(method, {})})
    return REGISTRY[method].strategy(cfg, fake_clients(4), model_facts(cfg["model"], (1, 8, 8), 10, 0))


def _payloads(strategy, server_round: int) -> dict:
    """{(node, record name): the record object} of the round's train and evaluate messages."""
    out = {}
    for phase, configure in (("train", strategy.configure_train), ("evaluate", strategy.configure_evaluate)):
        for msg in configure(server_round, ArrayRecord(), ConfigRecord(), None):
            for name, record in msg.content.array_records.items():
                out[(phase, msg.metadata.dst_node_id, name)] = record
    return out


def _values(records: dict) -> dict:
    return {k: dict(wire.unpack_arrays(r)) for k, r in records.items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        v.keys() == b[k].keys() and all(np.array_equal(v[x], b[k][x]) for x in v) for k, v in a.items())


def _round(strategy, server_round: int, rng) -> None:
    msgs = list(strategy.configure_train(server_round, ArrayRecord(), ConfigRecord(), None))
    strategy.aggregate_train(server_round, [fake_reply(strategy, m, "train", rng) for m in msgs])
    assert not strategy.dropped


@pytest.mark.parametrize("method", SHARING)
def test_a_packed_record_is_shared_until_aggregation_and_load_forget_it(method):
    rng = np.random.default_rng(0)
    strategy, other = _strategy(method), _strategy(method)
    for s in (strategy, other):
        prepare = s.configure_prepare(None)
        if prepare:
            s.aggregate_prepare_replies([fake_reply(s, m, "prepare", rng) for m in prepare])
    _round(strategy, 1, rng)  # FedProto and pFedPM send their shared records from round 2 on
    first = _payloads(strategy, 2)
    again = _payloads(strategy, 2)
    assert first and first.keys() == again.keys()
    assert [k for k in first if first[k] is again[k]], "no record was packed once and reused"
    _payloads(other, 3)  # the witness of a stale cache: records packed before a load
    _round(strategy, 2, rng)
    after = _payloads(strategy, 3)
    assert not _same(_values(first), _values(after)), "the records did not follow the aggregated state"
    other.load_state_dict(copy.deepcopy(strategy.state_dict()))
    assert _same(_values(_payloads(other, 3)), _values(after))  # nothing packed before the load survives it
