"""FedAMP / HeurFedAMP, CFL and FeSEM in an in-process federation: each way carries exactly the contract's
records, and the evaluated model travels only where the client does not keep it (tests/test_rivals_cluster.py
has the rules; this file is kept out of their mutation runs because a federation takes seconds)."""

from __future__ import annotations

import pytest

from fedcore import wire
from fedcore.methods.fedamp import CLOUD
from tests.test_baselines import _spy


@pytest.mark.parametrize("method,evaluate_records", [("fedamp", set()), ("heurfedamp", set()),
                                                     ("cfl", {wire.WEIGHTS}), ("fesem", {wire.WEIGHTS})])
def test_messages_carry_exactly_the_contract_records(inprocess, method, evaluate_records):
    hook, log = _spy()
    extra = {"fedamp": {"fedamp.sigma": 100.0}, "heurfedamp": {}, "cfl": {"cfl.warmup-rounds": 0},
             "fesem": {"fesem.clusters": 2}}[method]
    summary, _ = inprocess(3, faults=hook, method=method, **{"num-server-rounds": 2, "local-steps": 2, **extra})
    assert summary["dropped_replies"] == 0
    down = CLOUD if method.endswith("fedamp") else wire.WEIGHTS
    for msg, reply in log:
        kind = msg.metadata.message_type
        if kind == "train":
            assert set(msg.content.array_records) == {down}
            assert set(reply.content.array_records) == {wire.WEIGHTS}
        elif kind == "evaluate":
            assert set(msg.content.array_records) == evaluate_records
