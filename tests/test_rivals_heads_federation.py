"""FedGH, FedRoD and GPFL in federations: what each message carries each way and what the clients
keep, through in-process federations (digits, 3 clients, 2 rounds), and one real `flwr run` each
(long). The rules themselves are in tests/test_rivals_heads.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clients.fedrod import PERSONAL_HEAD, FedRoDClient
from clients.gpfl import GPFLClient
from fedcore import wire
from fedcore.methods.fedgh import GLOBAL_HEAD
from fedcore.conditional_valve import initial_module_weights
from fedstrategies.fedrod import FedRoDStrategy
from tests.test_baselines import _spy
from tests.test_rivals_heads import C, _client, _keys, _strategy

ROOT = Path(__file__).resolve().parents[1]


def _federation_log(inprocess, method, **overrides):
    """A 3-client, 2-round federation and its train and evaluate (request, reply) pairs (every one)."""
    hook, log = _spy()
    summary, grid = inprocess(method=method, faults=hook, **{"run-name": method, **overrides})
    log = [(m, r) for m, r in log if m.metadata.message_type in ("train", "evaluate")]
    assert sorted(m.metadata.message_type for m, _ in log) == ["evaluate"] * 6 + ["train"] * 6
    return summary, grid, log


def test_fedgh_federation_sends_only_the_head_down_and_lars_up(inprocess):
    summary, _, log = _federation_log(inprocess, "fedgh")
    assert summary["dropped_replies"] == 0 and summary["rounds"] == 2
    for msg, reply in log:
        kind = msg.metadata.message_type
        assert set(msg.content.array_records) == {GLOBAL_HEAD}
        assert _keys(msg.content.array_records[GLOBAL_HEAD]) == {"weight", "bias"}
        if kind == "train":
            assert set(reply.content.array_records) == {wire.CLASS_FEATURES}


def test_fedrod_federation_averages_the_whole_generic_model_and_keeps_personal_heads(inprocess, tmp_path):
    summary, grid, log = _federation_log(inprocess, "fedrod")
    assert summary["dropped_replies"] == 0
    model = _client(FedRoDClient, tmp_path, "fedrod").new_model()
    for msg, reply in log:
        assert set(msg.content.array_records) == {wire.WEIGHTS}
        assert _keys(msg.content.array_records[wire.WEIGHTS]) == set(model.state_dict())
        if msg.metadata.message_type == "train":
            assert _keys(reply.content.array_records[wire.WEIGHTS]) == set(model.state_dict())
    # each client kept its own personal head, different from the initial one and from the others'
    heads = [ctx.state.array_records[PERSONAL_HEAD] for ctx in grid.contexts.values()]
    weights = [wire.unpack_arrays(h)["weight"] for h in heads]
    assert len(weights) == 3 and not np.array_equal(weights[0], weights[1])
    assert not np.array_equal(weights[0], wire.to_host(model.head.weight))
    strategy = _strategy(FedRoDStrategy, "fedrod")
    assert set(strategy.global_weights) == set(strategy.initial_weights)  # FedAvg over the whole generic model


def test_gpfl_federation_carries_body_gce_and_cov_each_way_and_keeps_the_heads(inprocess, tmp_path):
    summary, grid, log = _federation_log(inprocess, "gpfl")
    assert summary["dropped_replies"] == 0
    model = _client(GPFLClient, tmp_path, "gpfl").new_model()
    body = {k for k in model.state_dict() if k.startswith("body.")}
    expected = body | set(initial_module_weights(model.feature_dim, C, 0))
    for msg, reply in log:
        assert _keys(msg.content.array_records[wire.WEIGHTS]) == expected
        if msg.metadata.message_type == "train":
            assert _keys(reply.content.array_records[wire.WEIGHTS]) == expected
    heads = [wire.unpack_arrays(ctx.state.array_records["model"])["head.weight"] for ctx in grid.contexts.values()]
    assert not np.array_equal(heads[0], heads[1])


@pytest.mark.long  # a real flwr run / SuperLink: make test-long
@pytest.mark.parametrize("method", ["fedgh", "fedrod", "gpfl"])
def test_flwr_run_smoke(tmp_path, method):
    from runner.launch import simulate

    config = {"method": method, "dataset": "digits", "num-server-rounds": 2, "results-dir": str(tmp_path),
              "run-name": "smoke"}
    result = simulate(config, supernodes=2, app_dir=ROOT, stream=False, timeout=600, flwr_home=tmp_path / "home")
    assert result["status"] == "finished:completed", result
    summary = json.loads((tmp_path / "smoke" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["dropped_replies"] == 0
