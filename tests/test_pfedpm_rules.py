"""pFedPM, one function at a time: each rule's numbers against a second computation (explicit loops, torch's
functional ops, hand sums), the direction of every loss term, what the client keeps between rounds, what it
uploads and which model each evaluation scores. Fast (no federation), so that mutation testing
(``python -m tools.mutation pfedpm``) runs them against every mutant first."""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

import clients.pfedpm as client_module
from clients.base import ClientEnv
from clients.fedproto import FedProtoClient
from clients.pfedpm import (LOCAL_FEATURES, MIXED_FEATURES, MODEL, OPTIMIZER, RELATION, RELATION_OPTIMIZER,
                            RELATION_SEED_TAG, REGULARISERS, PFedPMClient, RelationModule, batch_class_means,
                            fedproto_regulariser, l2_regulariser, l2sq_regulariser, logits_of, mix_features)
from clients.training import class_means, extract_features
from fedcore import wire
from fedcore.config import Config, ConfigError
from fedcore.methods.fedproto import HAS_PROTOTYPES
from fedcore.methods.pfedpm import (FEATURE_REG, GLOBAL_FEATURES, HAS_GLOBAL, HPARAMS, RELATION_ACC, RELATION_LOSS,
                                    example_reply)
from fedcore.models import build_model, model_facts, seed_torch
from fedstrategies.base import ClientInfo
from fedstrategies.pfedpm import PFedPMStrategy
from fedstrategies.prototypes import (aggregate_class_features, check_class_features, check_whole_class_features,
                                      merge_class_features)
from tests.conftest import small_config

D = 50  # protocnn's feature width
FAST = {"method": "pfedpm", "model": "protocnn", "lr": 0.05, "momentum": 0.5, "batch-size": 10,
        "client-threads": 1, "local-steps": 3}


# ------------------------------------------------------------------ Eq. 7: the shared server rule
def _three_clients():
    """Class 1 held by all three (counts 7, 9, 2), class 0 by client 0 only, class 2 by client 1 only."""
    rng = np.random.default_rng(3)
    ids = [np.array([0, 1]), np.array([1, 2]), np.array([1])]
    feats = [rng.standard_normal((len(i), 4)) for i in ids]
    counts = [np.array([5, 7]), np.array([9, 3]), np.array([2])]
    return ids, feats, counts


def test_weighted_uniform_and_literal_readings_of_eq7_by_hand():
    ids, feats, counts = _three_clients()
    v = [feats[0][1], feats[1][0], feats[2][0]]  # the three class-1 features
    got = {mode: aggregate_class_features(ids, feats, counts, 5, mode) for mode in ("weighted", "uniform",
                                                                                   "paper_literal")}
    weighted = (7 * v[0] + 9 * v[1] + 2 * v[2]) / 18
    expected = {"weighted": weighted, "uniform": (v[0] + v[1] + v[2]) / 3, "paper_literal": weighted / 3}
    for mode, (present, means, total) in got.items():
        assert present.tolist() == [0, 1, 2] and present.dtype == np.int64
        assert total.tolist() == [5, 18, 3] and total.dtype == np.int64  # N_j: total counts in every mode
        assert means.dtype == np.float32 and means.shape == (3, 4)
        np.testing.assert_allclose(means[1], expected[mode], rtol=1e-5)
        np.testing.assert_allclose(means[0], feats[0][0], rtol=1e-6)  # one holder: its own feature
        np.testing.assert_allclose(means[2], feats[1][1], rtol=1e-6)


def test_eq7_weights_read_off_with_unit_vectors_sum_to_one_in_any_client_order_and_count_scale():
    """Spec section 12, invariant 3: client i sends the unit vector e_i as its class-1 feature, so the aggregate
    *is* the weight vector (w_0, w_1, w_2). By hand it is n_i1 / N_1 = (7, 9, 2) / 18, summing to 1, for each of
    the 6 client orders and for every common scaling of the counts; uniform gives 1/3 each and the literal Eq. 7
    1/|holders| of the weighted ones (summing to 1/3)."""
    n = {0: 7, 1: 9, 2: 2}
    weighted = np.array([7.0, 9.0, 2.0]) / 18.0
    expected = {"weighted": weighted, "uniform": np.full(3, 1 / 3), "paper_literal": weighted / 3}
    for order in itertools.permutations(range(3)):
        for scale in (1, 2, 5, 1000):
            ids = [np.array([1]) for _ in order]
            feats = [np.eye(3)[[i]] for i in order]  # (1, 3): e_i
            counts = [np.array([scale * n[i]]) for i in order]
            for mode, weights in expected.items():
                present, means, total = aggregate_class_features(ids, feats, counts, 3, mode)
                assert present.tolist() == [1] and total.tolist() == [18 * scale]
                np.testing.assert_allclose(means[0], weights, rtol=1e-6)
            assert float(aggregate_class_features(ids, feats, counts, 3)[1][0].sum()) == pytest.approx(1.0, abs=1e-6)


def test_classes_nobody_holds_are_absent_and_an_empty_round_gives_empty_arrays():
    ids, feats, counts = _three_clients()
    present, means, total = aggregate_class_features(ids, feats, counts, 10)
    assert present.tolist() == [0, 1, 2] and len(means) == 3 and len(total) == 3
    present, means, total = aggregate_class_features([np.zeros(0, int)], [np.zeros((0, 4))], [np.zeros(0, int)], 10)
    assert present.shape == (0,) and means.shape == (0, 4) and means.dtype == np.float32 and total.shape == (0,)
    # ids and counts come back as int64 even from untyped empty lists, features (0, 0) without a width
    present, means, total = aggregate_class_features([np.array([])], [np.zeros(0)], [np.array([])], 10)
    assert present.dtype == np.int64 and total.dtype == np.int64 and means.shape == (0, 0)
    present, means, total = aggregate_class_features([np.array([7])], [np.array([[0.5, -2.0]])], [np.array([3])], 10)
    assert present.tolist() == [7] and means.tolist() == [[0.5, -2.0]] and total.tolist() == [3]  # one report
    with pytest.raises(ValueError, match="mode must be"):
        aggregate_class_features(ids, feats, counts, 10, "median")


def test_merge_keeps_unreported_classes_in_class_order_and_replaces_reported_ones():
    new = (np.array([3, 1]), np.array([[3.0], [1.0]]), np.array([30, 10]))
    old = (np.array([0, 1, 4]), np.array([[-0.0], [-1.0], [-4.0]]), np.array([1, 2, 3]))
    assert merge_class_features(new, None) is new
    ids, feats, counts = merge_class_features(new, old)
    assert ids.tolist() == [0, 1, 3, 4]
    assert feats[:, 0].tolist() == [-0.0, 1.0, 3.0, -4.0] and counts.tolist() == [1, 10, 30, 3]


def _upload(ids=(0, 9), counts=(1, 2), width=4, feats=None):
    ids = np.asarray(ids)
    return {"class-ids": ids, "features": np.zeros((len(ids), width), np.float32) if feats is None else feats,
            "counts": np.asarray(counts)}


def test_class_feature_checks_accept_the_edges_and_refuse_just_past_them():
    assert check_class_features(_upload(), 10, 4) is None  # ids 0 and C-1, a count of 1
    assert check_class_features(_upload(ids=np.array([0, 9], np.uint8), counts=np.array([1, 2], np.uint16)),
                                10, 4) is None
    assert check_class_features(_upload(ids=np.zeros(0, int), counts=np.zeros(0, int)), 10, 4) is None
    assert "in 0..9" in check_class_features(_upload(ids=(-1, 9)), 10, 4)
    assert "in 0..9" in check_class_features(_upload(ids=(0, 10)), 10, 4)
    assert "distinct" in check_class_features(_upload(ids=(9, 9)), 10, 4)
    assert "positive" in check_class_features(_upload(counts=(0, 2)), 10, 4)
    assert "integers" in check_class_features(_upload(counts=np.array([1.0, 2.0])), 10, 4)
    assert "integers" in check_class_features(_upload(ids=np.array([0.0, 9.0])), 10, 4)
    assert "differs from 4" in check_class_features(_upload(width=5), 10, 4)
    assert "shapes" in check_class_features(_upload(counts=(1, 2, 3)), 10, 4)
    assert "shapes" in check_class_features(_upload(feats=np.zeros((3, 4))), 10, 4)
    assert "shapes" in check_class_features(_upload(feats=np.zeros(8)), 10, 4)
    assert "shapes" in check_class_features({**_upload(), "class-ids": np.zeros((2, 1), int)}, 10, 4)
    column = {**_upload(), "class-ids": np.array([[0], [9]]), "counts": np.array([[1], [2]])}  # only the ids' ndim
    assert "shapes" in check_class_features(column, 10, 4)
    own = np.array([1, 0, 0, 0, 0, 0, 0, 0, 0, 2])
    assert check_whole_class_features(_upload(ids=(9, 0), counts=(2, 1)), 10, 4, own) is None  # any order
    assert check_whole_class_features(_upload(ids=(0,), counts=(1,)), 10, 4, own) == \
        "class ids [0] are not the client's classes [0, 9]"
    assert "counts differ" in check_whole_class_features(_upload(counts=(1, 3)), 10, 4, own)
    assert "in 0..9" in check_whole_class_features(_upload(ids=(0, 10)), 10, 4, own)


# ------------------------------------------------------------------ the strategy
def _strategy(label_counts, **hp) -> PFedPMStrategy:
    cfg = Config.from_run_config({"method": "pfedpm", "dataset": "digits", **{f"pfedpm.{k}": v for k, v in hp.items()}})
    clients = {pid: ClientInfo(pid, 100 + pid, int(sum(c)), 5, np.array(c), np.array(c) // 3)
               for pid, c in enumerate(label_counts)}
    return PFedPMStrategy(cfg, clients, model_facts("protocnn", (1, 8, 8), 10, 0))


class _Reply:
    """What ``aggregate``/``check_reply`` read of a validated reply."""

    def __init__(self, pid, upload):
        self.pid, self.arrays = pid, {wire.CLASS_FEATURES: upload}


def test_defaults_and_bounds_follow_the_spec():
    assert {k: v.default for k, v in HPARAMS.items()} == {"a": 0.5, "lambda": 1.0, "reg": "l2", "agg": "weighted",
                                                          "heterogeneous": False}
    assert set(HPARAMS["reg"].choices) == {"l2", "l2sq", "fedproto"} == set(REGULARISERS)
    assert set(HPARAMS["agg"].choices) == {"weighted", "paper_literal", "uniform"}
    base = {"method": "pfedpm", "dataset": "digits"}
    for good in ({"pfedpm.a": 0.0}, {"pfedpm.a": 1.0}, {"pfedpm.lambda": 0.0}, {"pfedpm.reg": "l2sq"}):
        assert Config.from_run_config({**base, **good}).hparams()[next(iter(good)).split(".")[1]] == next(
            iter(good.values()))
    for bad in ({"pfedpm.a": 1.01}, {"pfedpm.a": -0.01}, {"pfedpm.lambda": -0.1}, {"pfedpm.reg": "l1"}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            Config.from_run_config({**base, **bad})


def test_the_strategy_sends_its_global_features_compactly_and_renews_them_after_each_round():
    counts = [[5, 7] + [0] * 8, [0, 9, 3] + [0] * 7]
    s = _strategy(counts, agg="uniform")
    assert s.class_ids.shape == (0,) and s.features is None and s.counts.shape == (0,)
    assert s.class_ids.dtype == np.int64 and s.counts.dtype == np.int64  # the checkpoint's ids are integers
    assert s.train_payload(0, 1) == {} and s.train_config(0, 1) == {HAS_GLOBAL: False}  # round 1: nothing yet
    assert s.reply_schema(0) == {wire.CLASS_FEATURES: {"class-ids": (2,), "features": (2, D), "counts": (2,)}}
    assert s.reply_schema(1)[wire.CLASS_FEATURES]["features"] == (2, D)
    f0, f1 = np.ones((2, D), np.float32), 3 * np.ones((2, D), np.float32)
    up = [_Reply(0, _upload((0, 1), (5, 7), D, f0)), _Reply(1, _upload((1, 2), (9, 3), D, f1))]
    assert all(s.check_reply(r) is None for r in up)
    assert "counts differ" in s.check_reply(_Reply(0, _upload((0, 1), (5, 8), D, f0)))
    assert s.aggregate(1, up) == {"classes-reported": 3, "global-classes": 3}
    assert s.train_config(0, 2) == {HAS_GLOBAL: True} == s.train_config(1, 2)  # the flag the client mixes on
    record = s.train_payload(0, 2)[GLOBAL_FEATURES]
    assert s.train_payload(1, 2)[GLOBAL_FEATURES] is record  # packed once for every client
    assert all(a.stype == wire.RAW_STYPE for a in record.values())  # compact: one raw Array per name
    sent = wire.unpack_arrays(record)
    assert set(sent) == {"class-ids", "features"}  # no counts, no weights
    assert sent["class-ids"].tolist() == [0, 1, 2] and sent["features"][:, 0].tolist() == [1.0, 2.0, 3.0]
    assert s.aggregate(2, [up[0]]) == {"classes-reported": 2, "global-classes": 3}  # class 2 kept
    again = wire.unpack_arrays(s.train_payload(0, 3)[GLOBAL_FEATURES])
    assert again["features"][:, 0].tolist() == [1.0, 1.0, 3.0]  # the new round's features, not the cached ones
    fresh = _strategy(counts)
    fresh.train_payload(0, 1)
    fresh.load_state_dict(s.state_dict())
    assert wire.unpack_arrays(fresh.train_payload(0, 3)[GLOBAL_FEATURES])["features"][:, 0].tolist() == [1, 1, 3]
    assert s.evaluate_payload(0, 3) == {} and s.evaluate_config(0, 3) == {}  # evaluation needs nothing


def test_pfedpm_mh_starts_on_a_model_with_variants_and_stops_on_one_without():
    assert _strategy([[5, 7] + [0] * 8], heterogeneous=True).hp["heterogeneous"] is True  # protocnn: 18/20/22
    cfg = Config.from_run_config({"method": "pfedpm", "dataset": "digits", "pfedpm.heterogeneous": True})
    with pytest.raises(ValueError, match="pfedpm.heterogeneous needs model one of .*got 'cnn'"):
        PFedPMStrategy(cfg, {}, model_facts("cnn", (1, 8, 8), 10, 0))


def test_a_strategy_loaded_after_it_sent_features_sends_the_restored_ones():
    counts = [[5, 7] + [0] * 8]
    s, other = _strategy(counts), _strategy(counts)
    s.aggregate(1, [_Reply(0, _upload((0, 1), (5, 7), D, np.ones((2, D), np.float32)))])
    other.aggregate(1, [_Reply(0, _upload((0, 1), (5, 7), D, np.zeros((2, D), np.float32)))])
    other.train_payload(0, 2)  # caches its own record
    other.load_state_dict(s.state_dict())
    assert wire.unpack_arrays(other.train_payload(0, 2)[GLOBAL_FEATURES])["features"].max() == 1.0


def test_benchmark_replies_carry_the_clients_classes_and_evaluation_replies_nothing():
    counts = [[5, 7] + [0] * 8, [0, 9, 3] + [0] * 7]
    s = _strategy(counts)
    rng = np.random.default_rng(0)
    assert example_reply(s, 0, "evaluate", rng) == {}
    for pid in (0, 1):
        reply = example_reply(s, pid, "train", rng)
        ids, feats, got = wire.unpack_class_features(reply[wire.CLASS_FEATURES])
        assert ids.tolist() == np.flatnonzero(counts[pid]).tolist() and feats.shape == (2, D)
        assert got.tolist() == [c for c in counts[pid] if c]
        assert s.check_reply(_Reply(pid, wire.unpack_arrays(reply[wire.CLASS_FEATURES]))) is None


# ------------------------------------------------------------------ Eq. 8 and Eq. 11
def test_mixing_is_a_local_plus_one_minus_a_global_by_hand():
    local = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    glob = torch.tensor([[10.0, 20.0], [30.0, 50.0]])
    ids, mixed = mix_features(torch.tensor([1, 2]), local, torch.tensor([2, 4]), glob, 0.25, 6)
    assert ids.tolist() == [1, 2, 4]
    expected = [[1.0, 2.0], [0.25 * 3 + 0.75 * 10, 0.25 * 4 + 0.75 * 20], [30.0, 50.0]]
    torch.testing.assert_close(mixed, torch.tensor(expected))
    ids, mixed = mix_features(torch.tensor([1, 2]), local, torch.zeros(0, dtype=torch.int64), glob[:0], 0.25, 6)
    assert ids.tolist() == [1, 2] and torch.equal(mixed, local)  # an empty global set: the local features


def test_each_regulariser_equals_its_formula_computed_by_loops():
    g = torch.Generator().manual_seed(1)
    h, table = torch.randn(9, 3, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g, dtype=torch.float64)
    y = torch.tensor([4, 1, 4, 4, 5, 1, 4, 5, 5])
    groups = {j: [h[s] for s in range(9) if int(y[s]) == j] for j in (1, 4, 5)}
    means = {j: sum(v) / len(v) for j, v in groups.items()}
    classes, got = batch_class_means(h, y)
    assert classes.tolist() == [1, 4, 5]
    torch.testing.assert_close(got, torch.stack([means[j] for j in (1, 4, 5)]))
    dist = [float(((table[j] - means[j]) ** 2).sum()) for j in (1, 4, 5)]
    assert float(l2_regulariser(h, y, table)) == pytest.approx(sum(d ** 0.5 for d in dist) / 3, rel=1e-12)
    assert float(l2sq_regulariser(h, y, table)) == pytest.approx(sum(dist) / 3, rel=1e-12)
    per_value = [float((h[s, k] - table[int(y[s]), k]) ** 2) for s in range(9) for k in range(3)]
    assert float(fedproto_regulariser(h, y, table)) == pytest.approx(sum(per_value) / 27, rel=1e-12)


@pytest.mark.parametrize("reg", sorted(REGULARISERS))
def test_a_small_gradient_step_on_the_features_lowers_every_regulariser(reg):
    g = torch.Generator().manual_seed(2)
    h = torch.randn(8, 5, generator=g, requires_grad=True)
    y, table = torch.tensor([0, 2, 2, 3, 0, 3, 3, 2]), torch.randn(4, 5, generator=g)
    value = REGULARISERS[reg](h, y, table)
    value.backward()
    with torch.no_grad():
        after = REGULARISERS[reg](h - 0.01 * h.grad, y, table)
    assert float(after) < value.item() and value.item() > 0
    on_target = REGULARISERS[reg](table[y].clone(), y, table)
    assert float(on_target) == pytest.approx(0.0, abs=1e-6)  # features on their mixed class features: no pull


def test_the_decision_module_is_the_models_whole_classify_with_dropout_in_training():
    torch.manual_seed(0)
    model = build_model("protocnn", (1, 8, 8), 10).train()
    h = torch.rand(6, D) + 0.5
    torch.manual_seed(7)
    got = logits_of(model, h)
    torch.manual_seed(7)
    assert torch.equal(got, model.head(model.head_dropout(h)))
    assert not torch.equal(got, model.head(h))  # the dropout is really applied
    plain = build_model("cnn", (1, 8, 8), 10)
    hp = torch.randn(3, plain.feature_dim)
    assert torch.equal(logits_of(plain, hp), plain.head(hp))


# ------------------------------------------------------------------ the relation module (Eq. 12-13)
def _relation_by_hand(relation: RelationModule, pair: torch.Tensor) -> torch.Tensor:
    """The spec's g_psi in the functional API, BatchNorm with its running statistics (eval mode)."""
    conv, bn = relation.conv[0], relation.conv[1]
    z = F.conv1d(pair, conv.weight, conv.bias, padding=1)
    z = (z - bn.running_mean[None, :, None]) / torch.sqrt(bn.running_var[None, :, None] + bn.eps)
    z = F.max_pool1d(F.relu(z * bn.weight[None, :, None] + bn.bias[None, :, None]), 2).flatten(1)
    z = F.relu(F.linear(z, relation.fc[0].weight, relation.fc[0].bias))
    return torch.sigmoid(F.linear(z, relation.fc[2].weight, relation.fc[2].bias)).squeeze(1)


def test_relation_scores_match_the_spec_network_pair_by_pair():
    torch.manual_seed(0)
    relation = RelationModule(D)
    shapes = {k: tuple(v.shape) for k, v in relation.state_dict().items() if v.dim()}
    assert shapes == {"conv.0.weight": (64, 2, 3), "conv.0.bias": (64,), "conv.1.weight": (64,), "conv.1.bias": (64,),
                      "conv.1.running_mean": (64,), "conv.1.running_var": (64,), "fc.0.weight": (8, 64 * 25),
                      "fc.0.bias": (8,), "fc.2.weight": (1, 8), "fc.2.bias": (1,)}
    with torch.no_grad():  # BatchNorm statistics other than the identity
        relation.conv[1].running_mean.uniform_(-0.5, 0.5)
        relation.conv[1].running_var.uniform_(0.5, 2.0)
    relation.eval()
    h, c = torch.randn(5, D), torch.randn(3, D)
    scores = relation.scores(h, c)
    assert scores.shape == (5, 3)
    for s in range(5):
        for j in range(3):  # feature first, class feature second
            expected = _relation_by_hand(relation, torch.stack([h[s], c[j]])[None])
            torch.testing.assert_close(scores[s, j], expected[0])
    assert not torch.allclose(scores[0], _relation_by_hand(relation, torch.stack([c, h[:1].expand(3, D)], 1)))


def test_the_relation_step_is_one_sgd_step_on_the_mse_to_the_one_hot_comparison():
    """Target 1 where the sample's label is the candidate's class, else 0; the loss is plain MSE over samples and
    candidates; the step lowers it on the same batch and leaves the body alone."""
    client = _client(FAST)
    dev = client.env.device
    model = client.load_model().train()
    torch.manual_seed(0)
    relation = RelationModule(D).to(dev)
    x, y = client.data.x_train[:8], client.data.y_train[:8]
    ids = torch.tensor(sorted({*torch.unique(y).tolist(), 9 - int(y.max())}), device=dev)[:3]
    mixed = torch.randn(3, D).to(dev)
    model.eval()
    with torch.no_grad():
        z = model.features(x)
    model.train()
    probe = RelationModule(D).to(dev)
    probe.load_state_dict(relation.state_dict())
    probe.train()
    with torch.no_grad():
        scores = probe.scores(z, mixed)
    target = torch.tensor([[1.0 if int(y[s]) == int(ids[j]) else 0.0 for j in range(3)] for s in range(8)],
                          device=dev)
    assert target.sum() > 0  # the batch holds candidate classes
    expected = float(((scores - target) ** 2).mean())
    body = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(relation.parameters(), lr=0.05)
    loss = client.relation_step(model, relation, optimizer, x, y, ids, mixed)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert all(torch.equal(body[k], v) for k, v in model.state_dict().items()) and model.training
    with torch.no_grad():
        assert float(((relation.scores(z, mixed) - target) ** 2).mean()) < expected


# ------------------------------------------------------------------ the client
def _client(overrides, state=None, server_round=1, has_global=False, pid=0, tmp=os.path.join(tempfile.gettempdir(), "pfedpm-rules")):  # nothing is written there
    cfg = Config.from_run_config(small_config(Path(tmp), **overrides))
    config = {wire.SERVER_ROUND: server_round, wire.PHASE: "train", HAS_GLOBAL: has_global}
    return PFedPMClient(ClientEnv(cfg, pid, 3, RecordDict() if state is None else state, server_round, config))


def _copy(state: RecordDict) -> RecordDict:
    return recorddict_from_proto(recorddict_to_proto(state))


def _global(ids, feats) -> RecordDict:
    return RecordDict({GLOBAL_FEATURES: wire.pack_arrays({"class-ids": np.asarray(ids), "features": feats},
                                                         compact=True)})


def _stored(state, name):
    arrays = wire.unpack_arrays(state.array_records[name])
    return arrays["class-ids"], arrays["features"]


def _brute_force_means(model, client):
    model.eval()
    out = {}
    with torch.no_grad():
        for j in torch.unique(client.data.y_train).tolist():
            out[j] = wire.to_host(model.features(client.data.x_train[client.data.y_train == j]).double().mean(0))
    return out


def test_round_one_uploads_eq6_means_and_keeps_model_relation_optimisers_and_features():
    state = RecordDict()
    client = _client(FAST, state)
    records, metrics = client.fit(RecordDict())
    assert set(records) == {wire.CLASS_FEATURES}
    ids, feats, counts = wire.unpack_class_features(records[wire.CLASS_FEATURES])
    own = client.data.train_label_counts
    assert ids.tolist() == np.flatnonzero(own).tolist() and counts.tolist() == own[ids].tolist()
    model = client.load_model(MODEL)
    means = _brute_force_means(model, client)
    for j, f in zip(ids, feats):
        np.testing.assert_allclose(f, means[int(j)], rtol=1e-5, atol=1e-6)
    assert set(state.array_records) >= {MODEL, RELATION, OPTIMIZER, RELATION_OPTIMIZER, LOCAL_FEATURES, MIXED_FEATURES}
    stored_ids, stored = _stored(state, LOCAL_FEATURES)
    assert stored_ids.tolist() == ids.tolist() and np.array_equal(stored, feats)
    assert metrics[wire.METHOD_METRIC_PREFIX + FEATURE_REG] == 0.0  # no global features: L_R off
    assert metrics[wire.METHOD_METRIC_PREFIX + RELATION_LOSS] > 0
    # round 1's mixed features are the initial body's own class features (C_prev of the seeded model)
    initial = _brute_force_means(_client(FAST).new_model(), client)
    mixed_ids, mixed = _stored(state, MIXED_FEATURES)
    assert mixed_ids.tolist() == ids.tolist()
    for j, f in zip(mixed_ids, mixed):
        np.testing.assert_allclose(f, initial[int(j)], rtol=1e-5, atol=1e-6)
    # the momentum buffers come back in the next round's optimisers
    nxt = _client(FAST, _copy(state), server_round=2)
    for name, module in ((OPTIMIZER, nxt.load_model(MODEL)), (RELATION_OPTIMIZER, nxt.load_relation(D))):
        optimizer = nxt.optimizer_for(name, module)
        saved = wire.unpack_arrays(state.array_records[name])
        assert optimizer.param_groups[0]["lr"] == 0.05 and optimizer.param_groups[0]["momentum"] == 0.5
        assert len(saved) == len(list(module.parameters())) > 0
        for idx, p in enumerate(module.parameters()):
            assert np.array_equal(wire.to_host(optimizer.state[p]["momentum_buffer"]), saved[f"{idx}/momentum_buffer"])


def test_round_two_mixes_the_stored_local_features_with_the_received_ones_and_regularises():
    state = RecordDict()
    _client(FAST, state).fit(RecordDict())
    ids, _ = _stored(state, LOCAL_FEATURES)
    planted = np.random.default_rng(0).standard_normal((len(ids), D)).astype(np.float32)
    state[LOCAL_FEATURES] = wire.pack_arrays({"class-ids": ids, "features": planted})  # C_prev comes from here
    glob = np.random.default_rng(1).standard_normal((10, D)).astype(np.float32)
    content = _global(np.arange(10), glob)
    reg_values = []
    original = client_module.REGULARISERS["l2"]
    overrides = {**FAST, "pfedpm.a": 0.25, "pfedpm.lambda": 0.5}
    client = _client(overrides, state, server_round=2, has_global=True)
    client_module.REGULARISERS["l2"] = lambda h, y, t: reg_values.append(original(h, y, t).detach()) or original(h, y, t)
    try:
        _, metrics = client.fit(content)
    finally:
        client_module.REGULARISERS["l2"] = original
    mixed_ids, mixed = _stored(state, MIXED_FEATURES)
    assert mixed_ids.tolist() == list(range(10))  # every class the server knows is a candidate
    expected = glob.copy()
    expected[ids] = 0.25 * planted + 0.75 * glob[ids]
    np.testing.assert_allclose(mixed, expected, rtol=1e-5, atol=1e-6)
    assert len(reg_values) == 3  # one L_R per body + head step
    assert metrics[wire.METHOD_METRIC_PREFIX + FEATURE_REG] == pytest.approx(float(torch.stack(reg_values).mean()))
    # the server saying it has nothing switches L_R off even if a record were there
    off = _client(overrides, _copy(state), server_round=3, has_global=False)
    _, metrics = off.fit(content)
    assert metrics[wire.METHOD_METRIC_PREFIX + FEATURE_REG] == 0.0
    assert _stored(off.env.state, MIXED_FEATURES)[0].tolist() == ids.tolist()  # only the local classes
    _, metrics = _client({**overrides, "pfedpm.lambda": 0.0}, _copy(state), 3, True).fit(content)
    assert metrics[wire.METHOD_METRIC_PREFIX + FEATURE_REG] == 0.0  # lambda = 0: no L_R term at all


@pytest.mark.parametrize("reg", sorted(REGULARISERS))
def test_the_body_head_loss_is_ce_plus_lambda_times_the_configured_regulariser(reg):
    client = _client({**FAST, "pfedpm.reg": reg, "pfedpm.lambda": 0.3})
    model = client.load_model().train()
    x, y = client.data.x_train[:10], client.data.y_train[:10]
    table = torch.randn(10, D).to(client.env.device)
    log = []
    torch.manual_seed(5)
    got = client.body_head_loss(table, log)(model, x, y)
    torch.manual_seed(5)
    h = model.features(x)
    expected = F.cross_entropy(model.classify(h), y) + 0.3 * REGULARISERS[reg](h, y, table)
    torch.testing.assert_close(got, expected)
    assert len(log) == 1 and float(log[0]) == pytest.approx(float(REGULARISERS[reg](h, y, table)), rel=1e-5)
    torch.manual_seed(5)
    plain = client.body_head_loss(None, log)(model, x, y)
    torch.manual_seed(5)
    torch.testing.assert_close(plain, F.cross_entropy(model.classify(model.features(x)), y))
    assert len(log) == 1


def test_a_second_round_starts_from_the_kept_model_and_relation(monkeypatch):
    """What round 2 trains from is exactly what round 1 left (weights and momentum), not a fresh start."""
    state = RecordDict()
    _client(FAST, state).fit(RecordDict())
    kept = {name: wire.unpack_arrays(state.array_records[name])
            for name in (MODEL, RELATION, OPTIMIZER, RELATION_OPTIMIZER)}
    seen = {}
    original_train, original_step = PFedPMClient.train, PFedPMClient.relation_step

    def buffers(module, optimizer):  # the momentum buffers the first step of this round starts from
        return {f"{i}/momentum_buffer": wire.to_host(optimizer.state[p]["momentum_buffer"].clone())
                for i, p in enumerate(module.parameters()) if p in optimizer.state}

    def train(self, model, **kwargs):
        seen.setdefault(MODEL, {k: wire.to_host(v.detach().clone()) for k, v in model.state_dict().items()})
        seen.setdefault(OPTIMIZER, buffers(model, kwargs["optimizer"]))
        return original_train(self, model, **kwargs)

    def relation_step(self, model, relation, optimizer, *args):
        seen.setdefault(RELATION, {k: wire.to_host(v.detach().clone()) for k, v in relation.state_dict().items()})
        seen.setdefault(RELATION_OPTIMIZER, buffers(relation, optimizer))
        return original_step(self, model, relation, optimizer, *args)

    monkeypatch.setattr(PFedPMClient, "train", train)
    monkeypatch.setattr(PFedPMClient, "relation_step", relation_step)
    _client(FAST, state, server_round=2, has_global=True).fit(_global([0, 1], np.zeros((2, D), np.float32)))
    for name, arrays in kept.items():
        assert arrays.keys() == seen[name].keys()
        assert all(np.array_equal(seen[name][k], v) for k, v in arrays.items()), name


def test_the_relation_module_starts_from_its_own_seed_without_touching_the_global_rng():
    client = _client({**FAST, "seed": 3})
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    relation = client.load_relation(D)
    assert torch.equal(torch.rand(1), expected_next)  # the global stream is untouched
    with torch.random.fork_rng(devices=[]):
        seed_torch(3 * 1000 + RELATION_SEED_TAG)
        reference = RelationModule(D).to(client.env.device)
    assert all(torch.equal(a, b) for a, b in zip(relation.state_dict().values(), reference.state_dict().values()))


def test_heterogeneous_clients_get_their_width_and_a_common_seeded_init():
    widths = [_client({**FAST, "pfedpm.heterogeneous": True}, pid=p).build_model().body[3].out_channels
              for p in range(3)]
    assert widths == [18, 20, 22]
    same = [_client(FAST, pid=p).build_model().state_dict() for p in (0, 1)]
    assert all(torch.equal(same[0][k], same[1][k]) for k in same[0])
    assert _client({**FAST, "seed": 1}).build_model().state_dict()["head.weight"].ne(same[0]["head.weight"]).any()


def _state_of(module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: wire.to_host(v.detach().clone()) for k, v in module.state_dict().items()}


def _equal_states(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_in_one_fit_each_relation_step_keeps_body_and_head_and_each_ce_step_keeps_the_relation(monkeypatch):
    """Spec section 12, invariant 6, in a round with L_R on: across every relation step (phi, varphi) are
    bit-identical while psi moves; across every CE + lambda L_R step (between two relation steps, and before the
    first) psi is bit-identical while the model moves; every sample is scored against all |K| candidates."""
    state = RecordDict()
    _client(FAST, state).fit(RecordDict())
    kept_model = wire.unpack_arrays(state.array_records[MODEL])
    kept_relation = wire.unpack_arrays(state.array_records[RELATION])
    steps = []
    original = PFedPMClient.relation_step

    def spy(self, model, relation, optimizer, xb, yb, ids, mixed):
        before = (_state_of(model), _state_of(relation))
        loss = original(self, model, relation, optimizer, xb, yb, ids, mixed)
        with torch.no_grad():
            shape = tuple(relation.scores(model.features(xb), mixed).shape)
        steps.append((before, (_state_of(model), _state_of(relation)), ids.tolist(), shape, len(yb)))
        return loss

    monkeypatch.setattr(PFedPMClient, "relation_step", spy)
    glob = np.random.default_rng(4).standard_normal((6, D)).astype(np.float32)
    _, metrics = _client(FAST, state, server_round=2, has_global=True).fit(_global([0, 2, 4, 6, 8, 9], glob))
    assert metrics[wire.METHOD_METRIC_PREFIX + FEATURE_REG] > 0  # the regulariser was in the CE steps
    assert len(steps) == 3
    local = np.flatnonzero(_client(FAST).data.train_label_counts).tolist()
    candidates = sorted({0, 2, 4, 6, 8, 9} | set(local))
    for (model_before, rel_before), (model_after, rel_after), ids, shape, batch in steps:
        assert _equal_states(model_before, model_after)  # relation step: body and head bit-identical
        assert not _equal_states(rel_before, rel_after)  # ... and the relation module moved
        assert ids == candidates and shape == (batch, len(candidates))  # |K| scores per sample
    # the first CE step: from the kept model and relation; the model moves, the relation does not
    assert _equal_states(steps[0][0][1], kept_relation) and not _equal_states(steps[0][0][0], kept_model)
    for (_, (model_after, rel_after), *_), ((model_before, rel_before), *_) in zip(steps, steps[1:]):
        assert _equal_states(rel_after, rel_before)  # a CE + L_R step leaves psi bit-identical
        assert not _equal_states(model_after, model_before)  # ... and moves phi / varphi
    assert _equal_states(steps[-1][1][1], wire.unpack_arrays(state.array_records[RELATION]))  # kept as left

def test_with_lambda_zero_the_global_features_reach_only_the_relation_module():
    """Spec section 12, invariant 7: from one round-1 state and the same torch seed, round 2 with lambda = 0 leaves
    (phi, varphi) and the upload bit-identical for two different G, while psi differs; with lambda = 1 (the
    control) G moves the model too."""
    state = RecordDict()
    _client(FAST, state).fit(RecordDict())
    gs = [np.random.default_rng(seed).standard_normal((10, D)).astype(np.float32) for seed in (1, 2)]

    def round_two(lam, glob):
        client = _client({**FAST, "pfedpm.lambda": lam}, _copy(state), server_round=2, has_global=True)
        torch.manual_seed(1)
        records, _ = client.fit(_global(np.arange(10), glob))
        model, relation = client.load_model(MODEL), client.load_relation(D)
        return _state_of(model), _state_of(relation), wire.unpack_arrays(records[wire.CLASS_FEATURES])

    (model_a, rel_a, up_a), (model_b, rel_b, up_b) = (round_two(0.0, g) for g in gs)
    assert _equal_states(model_a, model_b) and _equal_states(up_a, up_b)
    assert not _equal_states(rel_a, rel_b)  # G still reaches the relation module (its candidates' features)
    (model_c, *_), (model_d, *_) = (round_two(1.0, g) for g in gs)
    assert not _equal_states(model_c, model_d)


def test_heterogeneous_clients_upload_d_wide_records_sized_free_of_the_model_and_the_server_takes_the_mix():
    """Spec section 12, invariants 4 and 8: clients with 18/20/22 conv2 channels (different parameter counts P) all
    upload (class ids, (n_i, d) features, counts) for their own classes; a client's record has the same arrays and
    the same bytes whatever its P; the server accepts the mix and averages it by hand (n_ij / N_j)."""
    nk = {**FAST, "local-steps": 1, "partition": "pfedpm-nk", "pfedpm-nk.n": 4, "pfedpm-nk.k": 20}  # shared classes
    hetero = {**nk, "pfedpm.heterogeneous": True}
    uploads, infos, params = {}, {}, {}
    for pid in range(3):
        client = _client(hetero, RecordDict(), pid=pid)
        records, _ = client.fit(RecordDict())
        model = client.load_model(MODEL)
        assert model.body[3].out_channels == (18, 20, 22)[pid]
        params[pid] = sum(p.numel() for p in model.parameters())
        ids, feats, counts = wire.unpack_class_features(records[wire.CLASS_FEATURES])
        own = client.data.train_label_counts
        assert set(ids.tolist()) <= set(np.flatnonzero(own).tolist()) and counts.tolist() == own[ids].tolist()
        assert feats.shape == (len(ids), D) and set(records) == {wire.CLASS_FEATURES}
        uploads[pid] = records[wire.CLASS_FEATURES]
        infos[pid] = ClientInfo(pid, 100 + pid, int(own.sum()), 5, own, own)
    assert len(set(params.values())) == 3  # three different model sizes
    # the same client with the homogeneous width (20 channels instead of 18): same record, other P
    plain = _client(nk, RecordDict(), pid=0)
    same_pid = plain.fit(RecordDict())[0][wire.CLASS_FEATURES]
    assert sum(p.numel() for p in plain.load_model(MODEL).parameters()) != params[0]
    shapes = {k: (v.shape, v.dtype) for k, v in wire.unpack_arrays(same_pid).items()}
    assert shapes == {k: (v.shape, v.dtype) for k, v in wire.unpack_arrays(uploads[0]).items()}
    assert wire.record_bytes(same_pid) == wire.record_bytes(uploads[0])
    cfg = Config.from_run_config({"method": "pfedpm", "dataset": "digits", "pfedpm.heterogeneous": True})
    strategy = PFedPMStrategy(cfg, infos, model_facts("protocnn", (1, 8, 8), 10, 0))
    replies = [_Reply(pid, wire.unpack_arrays(uploads[pid])) for pid in range(3)]
    assert [strategy.check_reply(r) for r in replies] == [None, None, None]
    strategy.aggregate(1, replies)
    sums, totals = {}, {}
    for pid in range(3):  # Eq. 7 (weighted) by an explicit loop
        for j, f, c in zip(*wire.unpack_class_features(uploads[pid])):
            sums[int(j)] = sums.get(int(j), 0.0) + int(c) * f.astype(np.float64)
            totals[int(j)] = totals.get(int(j), 0) + int(c)
    holders = {j: [int(info.train_label_counts[j]) for info in infos.values() if info.train_label_counts[j]]
               for j in sums}
    assert any(len(set(c)) > 1 for c in holders.values())  # a class shared with unequal counts: weighted != uniform
    assert strategy.class_ids.tolist() == sorted(sums)
    for j, row in zip(strategy.class_ids.tolist(), strategy.features):
        np.testing.assert_allclose(row, sums[j] / totals[j], rtol=1e-5, atol=1e-6)


def test_global_features_are_read_only_when_the_flag_says_so():
    content = _global([2, 5], np.ones((2, D), np.float32))
    assert _client(FAST, has_global=False).global_features(content) is None
    ids, feats = _client(FAST, has_global=True).global_features(content)
    assert ids.tolist() == [2, 5] and feats.shape == (2, D) and feats.dtype == torch.float32
    feats += 1  # a writable copy, not a view of the message
    assert _client(FAST, has_global=True).global_features(content)[1].max() == 1.0


# ------------------------------------------------------------------ evaluation: which model, which prediction
def _relation_predictions(client, state):
    model = client.load_model(MODEL).eval()
    relation = client.load_relation(D).eval()
    ids, feats = (wire.to_device(a, client.env.device) for a in _stored(state, MIXED_FEATURES))
    with torch.no_grad():
        h = model.features(client.data.x_test)
        scores = relation.scores(h, feats)
    return model, ids[scores.argmax(1)], scores


def test_evaluation_scores_the_kept_head_and_the_relation_module_on_the_kept_mixed_features(monkeypatch):
    state = RecordDict()
    _client(FAST, state).fit(RecordDict())
    glob = np.random.default_rng(1).standard_normal((10, D)).astype(np.float32)
    _client(FAST, state, server_round=2, has_global=True).fit(_global(np.arange(10), glob))
    client = _client(FAST, state, server_round=2)
    result = client.evaluate(RecordDict())
    model, pred, scores = _relation_predictions(client, state)
    y = client.data.y_test
    with torch.no_grad():
        logits = model(client.data.x_test)
        fresh = F.cross_entropy(client.new_model().eval()(client.data.x_test), y)
    assert result.num_examples == len(y)
    assert result.correct == int((logits.argmax(1) == y).sum())  # the trained decision head, not a fresh model
    assert result.loss == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-5)
    assert result.loss != pytest.approx(float(fresh), rel=1e-3)
    assert result.metrics == {RELATION_ACC: pytest.approx(float((pred == y).double().mean()))}
    worst = int((wire.to_device(_stored(state, MIXED_FEATURES)[0], y.device)[scores.argmin(1)] == y).sum())
    assert worst != int((pred == y).sum())  # argmax, not argmin, is the prediction
    monkeypatch.setattr(client_module, "MAX_PAIR_VALUES", 3 * D * 10)  # scored in chunks of 3 samples
    assert _client(FAST, state, server_round=2).evaluate(RecordDict()).metrics == result.metrics


def test_an_untrained_client_predicts_with_its_own_class_features():
    client = _client(FAST)
    result = client.evaluate(RecordDict())
    model = client.new_model().eval()
    ids, means, _ = class_means(extract_features(model, client.data.x_train), client.data.y_train, 10)
    relation = client.load_relation(D).eval()
    with torch.no_grad():
        pred = ids[relation.scores(extract_features(model, client.data.x_test), means).argmax(1)]
    assert result.metrics[RELATION_ACC] == pytest.approx(float((pred == client.data.y_test).double().mean()))
    assert result.num_examples == len(client.data.y_test) > 0


def test_no_candidate_classes_means_no_relation_prediction_and_no_failure():
    state = RecordDict()
    state[MIXED_FEATURES] = wire.pack_arrays({"class-ids": np.zeros(0, np.int64), "features": np.zeros((0, D), np.float32)})
    result = _client(FAST, state).evaluate(RecordDict())
    assert result.num_examples > 0 and result.metrics == {RELATION_ACC: 0.0}  # nothing to compare with: no prediction


# ------------------------------------------------------------------ FedProto trains with the same head dropout
def test_fedproto_trains_through_the_same_dropout_head_as_pfedpm(monkeypatch):
    """Both prototype methods put protocnn's Dropout + Linear decision module in their CE term, in every round."""
    cfg = Config.from_run_config(small_config(Path(tempfile.gettempdir()) / "fedproto-rules", method="fedproto", model="protocnn",
                                              **{"local-steps": 1, "fedproto.lambda": 0.5}))
    seen = []
    from fedcore import models

    original = models.HeadDropoutModel.classify
    monkeypatch.setattr(models.HeadDropoutModel, "classify",
                        lambda self, h: seen.append(self.training) or original(self, h))
    for has in (False, True):
        client = FedProtoClient(ClientEnv(cfg, 0, 3, RecordDict(), 1, {HAS_PROTOTYPES: has}))
        content = RecordDict({wire.CLASS_FEATURES: wire.pack_class_features(np.arange(10), np.zeros((10, D),
                                                                            np.float32), np.ones(10, int))})
        seen.clear()
        client.fit(content if has else RecordDict())
        assert True in seen, has  # a training-mode pass through the dropout head


# ------------------------------------------------------------------ the paper's setting and the validation sweep
def test_method_pfedpm_alone_gets_the_papers_training_setting():
    """Section 5.1 of the paper: SGD lr 0.01, momentum 0.5, batch 10, one local epoch, every client each round;
    the two-conv CNN on MNIST/FEMNIST and ResNet-18 on CIFAR-10."""
    for dataset, model in (("mnist5k", "protocnn"), ("mnist", "protocnn"), ("femnist", "protocnn-femnist"),
                           ("cifar10", "resnet18-tv")):
        cfg = Config.from_run_config({"method": "pfedpm", "dataset": dataset})
        assert (cfg["model"], cfg["lr"], cfg["momentum"], cfg["weight-decay"], cfg["batch-size"], cfg["local-epochs"],
                cfg["local-steps"], cfg["fraction-train"]) == (model, 0.01, 0.5, 0.0, 10, 1, 0, 1.0), dataset


def test_the_sweep_runs_every_grid_point_and_chooses_on_validation_not_test():
    """conf/pfedpm-digits-sweep.toml's [sweep]: one pfedpm row per (reg, lambda, a), ranked in sweep.md on validation."""
    from runner.compare_presets import expand_sweep
    from runner.compare_table import render_sweep

    preset = {"compare": {"methods": ["local"], "seeds": [0, 1]}, "run-config": {"dataset": "digits"},
              "sweep": {"method": "pfedpm", "label": "pfedpm-{pfedpm.reg}-lam{pfedpm.lambda:g}-a{pfedpm.a:g}",
                        "pfedpm.reg": ["l2", "fedproto"], "pfedpm.lambda": [0.1, 1.0], "pfedpm.a": [0.5]}}
    grown = expand_sweep(preset)
    assert grown["compare"]["methods"][0] == "local" and len(grown["compare"]["methods"]) == 5
    assert grown["variants"]["pfedpm-fedproto-lam0.1-a0.5"] == {"method": "pfedpm", "pfedpm.reg": "fedproto",
                                                                 "pfedpm.lambda": 0.1, "pfedpm.a": 0.5}
    # validation and test disagree on purpose: the row best on validation is chosen
    scores = {"pfedpm-l2-lam0.1-a0.5": (0.9, 0.5), "pfedpm-l2-lam1-a0.5": (0.7, 0.99),
              "pfedpm-fedproto-lam0.1-a0.5": (0.8, 0.6), "pfedpm-fedproto-lam1-a0.5": (0.6, 0.7)}
    results = {name: [{"seed": seed, "best_val_acc": val + seed / 100, "best_val_round": 3,
                       "test_acc_at_best_val": test} for seed in (0, 1)] for name, (val, test) in scores.items()}
    table = render_sweep({**grown, "made": {"command": "cmd", "commit": "abc"}}, results)
    assert "Chosen on validation: pfedpm.reg = l2, pfedpm.lambda = 0.1, pfedpm.a = 0.5" in table
    rows = [line for line in table.splitlines() if line.startswith("| l2 |") or line.startswith("| fedproto |")]
    assert [r.split(" | ")[1:3] for r in rows] == [["0.1", "0.5"], ["0.1", "0.5"], ["1", "0.5"], ["1", "0.5"]]
    assert rows[0].split(" | ")[3] == "90.50 ± 0.71"  # mean ± sample std over the two seeds: 0.01 / sqrt(2)
    with pytest.raises(SystemExit, match="non-empty list"):
        expand_sweep({**preset, "sweep": {**preset["sweep"], "pfedpm.lambda": []}})
