"""FedFCD through in-process federations (digits, 3 clients) and one real `flwr run`: what crosses the wire each
way, round 0, persistence across rounds, a corrupted reply. Slow next to tests/test_fedfcd.py and
tests/test_fedfcd_units.py, which test every piece directly (and are the ones mutation testing runs)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from clients.base import ClientEnv
from clients.fedfcd import FedFCDClient
from fedcore import wire
from fedcore.methods.fedfcd import GLOBAL_HEAD
from fedcore.models import model_facts
from fedstrategies.fedfcd import FedFCDStrategy
from fedstrategies.fedfcd_math import GlobalHead
from tests.test_baselines import _spy  # records every (request, reply) pair
from tests.test_fedfcd import C, _cfg, _client

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture
def federation(inprocess):
    """An in-process FedFCD federation (digits, 3 clients) with one torch thread per client."""
    def run(**overrides):
        return inprocess(**{"method": "fedfcd", "client-threads": 1, **overrides})

    return run


def _rows(tmp_path, name="test-run") -> list[dict]:
    with open(tmp_path / "results" / name / "rounds.csv") as f:
        return list(csv.DictReader(f))


# ====================================================================== 1. the upload
def _param_shapes(model) -> set:
    return {tuple(p.shape) for p in model.parameters()}


def test_1_fit_reply_carries_only_lfrs_labels_and_counts_no_extractor_or_personal_head(federation, tmp_path):
    hook, log = _spy()
    federation(faults=hook)
    model = _client(tmp_path).new_model()
    forbidden = _param_shapes(model.body) | _param_shapes(model.head)
    ups = [r for m, r in log if m.metadata.message_type in (wire.PREPARE, "train")]
    assert len(ups) == 3 * 3  # round 0 + 2 rounds, 3 clients
    for reply in ups:
        assert set(reply.content.array_records) == {wire.CLASS_FEATURES}
        ids, feats, counts = wire.unpack_class_features(reply.content.array_records[wire.CLASS_FEATURES])
        assert feats.shape == (2, model.feature_dim) and len(ids) == 2 and (counts > 0).all()  # 2 local classes
        for array in wire.unpack_arrays(reply.content.array_records[wire.CLASS_FEATURES]).values():
            assert tuple(array.shape) not in forbidden
    # Downlink: the global head and the GFRs only; no extractor tensor ever goes down either.
    body = _param_shapes(model.body)
    for msg, _ in log:
        for record in msg.content.array_records.values():
            assert all(tuple(a.shape) not in body for a in wire.unpack_arrays(record).values())


# ====================================================================== 8, 12, round 0: the wire through a federation
def test_8_12_round_0_init_upload_head_epoch_all_gfrs_payload_size_and_bytes(federation, tmp_path):
    """Round 0 asks every client for its untrained LFRs; round 1's download then carries phi_g after
    one epoch on those pairs and a GFR for every class present; 2Cd + C floats go down; round 0 is
    counted in bytes but not in rounds."""
    hook, log = _spy()
    summary, _ = federation(faults=hook, **{"num-server-rounds": 2, "fedfcd.gfr-download": "all"})  # the spec's
    prep = [(m, r) for m, r in log if m.metadata.message_type == wire.PREPARE]
    train = [m for m, _ in log if m.metadata.message_type == "train"]
    assert len(prep) == 3 and not any(m.content.array_records for m, _ in prep)
    strategy_like = _strategy_for_digits(tmp_path)
    init_lfrs = [wire.unpack_class_features(r.content.array_records[wire.CLASS_FEATURES]) for _, r in prep]
    present = sorted(set(np.concatenate([ids for ids, _, _ in init_lfrs]).tolist()))
    round_1 = [m for m in train if m.content.config_records[wire.CONFIG][wire.SERVER_ROUND] == 1]
    head = wire.unpack_arrays(round_1[0].content.array_records[GLOBAL_HEAD])
    gfr_ids, gfr, _ = wire.unpack_class_features(round_1[0].content.array_records[wire.CLASS_FEATURES])
    assert gfr_ids.tolist() == present  # every class present at any client has a GFR
    expected = GlobalHead(strategy_like.initial_weights["head.weight"], strategy_like.initial_weights["head.bias"], 0.01)
    x = torch.from_numpy(np.concatenate([f for _, f, _ in init_lfrs]))
    y = torch.from_numpy(np.concatenate([i for i, _, _ in init_lfrs]))
    expected.train(x, y, batch_size=10, epochs=1, generator=strategy_like.torch_generator)
    assert np.array_equal(head["weight"], expected.arrays()["weight"])  # one epoch from phi_g(0)
    assert not np.array_equal(head["weight"], strategy_like.initial_weights["head.weight"])
    # one record object for every client, 2Cd + C floats when every class has a GFR
    assert all(m.content.array_records[GLOBAL_HEAD] is round_1[0].content.array_records[GLOBAL_HEAD]
               for m in round_1)
    d = head["weight"].shape[1]
    floats = head["weight"].size + head["bias"].size + gfr.size
    assert floats == C * d + C + len(present) * d
    rows = _rows(tmp_path)
    assert [r["round"] for r in rows] == ["0", "1", "2"] and int(rows[0]["bytes_up"]) > 0
    assert float(rows[0]["m_gfr_classes"]) == len(present) and float(rows[0]["m_head_pairs"]) == 6
    assert summary["rounds"] == 2  # round 0 is not a round ...
    assert summary["bytes_prepare"] == int(rows[0]["bytes_up"]) + int(rows[0]["bytes_down"]) > 0  # ... but its bytes count
    assert summary["bytes_up"] == sum(int(r["bytes_up"]) for r in rows)
    assert summary["bytes_up_per_round"] == sum(int(r["bytes_up"]) for r in rows[1:]) / 2


def _strategy_for_digits(tmp_path) -> FedFCDStrategy:
    """A strategy with the in-process run's config and model, for its seeded generator and phi_g(0)."""
    from partitions import load_dataset

    cfg = _cfg(tmp_path, **{"num-server-rounds": 2})
    facts = model_facts(cfg["model"], load_dataset("digits", num_clients=3, seed=0).input_shape, C, cfg["seed"])
    return FedFCDStrategy(cfg, {}, facts)


def test_10_11_clients_keep_theta_and_phi_i_between_participations_and_all_clients_evaluate(federation, tmp_path):
    hook, log = _spy()
    summary, grid = federation(faults=hook, **{"num-server-rounds": 4, "fraction-train": 0.5})
    last_fit: dict[int, tuple[int, object]] = {}
    for msg, reply in log:
        kind, rnd = msg.metadata.message_type, msg.content.config_records[wire.CONFIG][wire.SERVER_ROUND]
        pid = int(reply.content.metric_records[wire.METRICS][wire.PARTITION_ID])
        if kind == "train":
            started_from = reply.content.metric_records[wire.METRICS][wire.STATE_ROUND]
            assert started_from == (last_fit[pid][0] if pid in last_fit else 0)  # its own last round
            last_fit[pid] = (rnd, reply)
    trained_per_round = [sum(1 for m, _ in log if m.metadata.message_type == "train"
                             and m.content.config_records[wire.CONFIG][wire.SERVER_ROUND] == r) for r in range(1, 5)]
    assert trained_per_round == [2, 2, 2, 2]  # ceil(0.5 * 3)
    rows = _rows(tmp_path)
    assert [int(r["eval_clients"]) for r in rows[1:]] == [3, 3, 3, 3]  # every client evaluates every round
    assert summary["best_acc"] == max(float(r["acc_weighted"]) for r in rows[1:])  # max_t sum(correct)/sum(n)
    # The state each client holds is the model of its last fit: its LFR reproduces that fit's upload.
    for node, context in grid.contexts.items():
        pid = context.node_config["partition-id"]
        client = FedFCDClient(ClientEnv(_cfg(tmp_path, **{"fraction-train": 0.5}), pid, 3, context.state, 5))
        assert client.env.state_round == last_fit[pid][0]
        uploaded = wire.unpack_class_features(last_fit[pid][1].content.array_records[wire.CLASS_FEATURES])
        again = wire.unpack_class_features(client.lfr_upload(client.load_model())[wire.CLASS_FEATURES])
        assert np.array_equal(uploaded[1], again[1])


def test_a_corrupted_reply_in_a_federation_is_dropped_and_the_run_goes_on(federation):
    def hook(msg, reply):
        if msg.metadata.message_type == "train" and msg.metadata.dst_node_id == 1000:  # client 0
            feats = np.full((2, 128), np.nan, np.float32)
            content = RecordDict({wire.CLASS_FEATURES: wire.pack_class_features(np.array([0, 1]), feats,
                                                                                np.array([1, 1])),
                                  wire.METRICS: reply.content.metric_records[wire.METRICS]})
            from flwr.app import Message

            return Message(content=content, reply_to=msg)
        return reply

    summary, _ = federation(faults=hook)
    assert summary["dropped_replies"] == 2 and summary["rounds"] == 2 and summary["final_acc"] > 0.3


# ====================================================================== bytes and the real runtime
def test_own_gfr_rows_give_the_same_run_with_fewer_bytes_down(federation, tmp_path):
    full, _ = federation(**{"run-name": "all", "fedfcd.gfr-download": "all"})
    own, _ = federation(**{"run-name": "own", "fedfcd.gfr-download": "own"})
    for key in ("final_acc", "best_acc", "client_acc_mean", "bytes_up"):
        assert full[key] == own[key], key
    assert own["bytes_down"] < full["bytes_down"]


@pytest.mark.long  # a real flwr run / SuperLink: make test-long
def test_flwr_run_smoke(tmp_path):
    """The real Ray simulation: 2 SuperNodes, 2 rounds on digits, judged by `flwr ls`."""
    from runner.launch import simulate

    config = {"method": "fedfcd", "dataset": "digits", "num-server-rounds": 2, "results-dir": str(tmp_path),
              "run-name": "smoke"}
    result = simulate(config, supernodes=2, app_dir=ROOT, stream=False, timeout=600, flwr_home=tmp_path / "home")
    assert result["status"] == "finished:completed", result
    summary = json.loads((tmp_path / "smoke" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["bytes_prepare"] > 0 and summary["dropped_replies"] == 0
