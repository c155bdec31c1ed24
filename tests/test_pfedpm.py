"""pFedPM: every invariant of the spec's section 12, the method's equations, its wire rules and its
runs (in-process and through the real `flwr run`)."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

from clients.base import ClientEnv
from clients.data import load_client_data
from clients.pfedpm import PFedPMClient, RelationModule, fedproto_regulariser, l2_regulariser, mix_features
from fedcore import wire
from fedcore.config import Config
from fedcore.methods.pfedpm import GLOBAL_FEATURES, HAS_GLOBAL
from fedcore.models import ModelFacts, build_model, heterogeneous_kwargs, model_facts
from fedstrategies.base import ClientInfo
from fedstrategies.pfedpm import PFedPMStrategy
from tests.conftest import small_config
from tests.test_baselines import _spy

ROOT = Path(__file__).resolve().parents[1]
D = 50  # protocnn's feature width
PFEDPM = {"method": "pfedpm", "model": "protocnn", "lr": 0.01, "momentum": 0.5, "batch-size": 10, "client-threads": 1}


def _rounds(summary) -> list[dict]:
    with open(f"{summary['results_dir']}/rounds.csv") as f:
        return list(csv.DictReader(f))


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------ Eq. 8: mixed features
def _features(seed=0, local=(1, 3, 4), glob=(0, 1, 3, 7)):
    g = torch.Generator().manual_seed(seed)
    return (torch.tensor(local), torch.randn(len(local), D, generator=g),
            torch.tensor(glob), torch.randn(len(glob), D, generator=g))


def test_a_equal_1_gives_the_local_features_and_a_equal_0_the_global_ones():
    local_ids, local, global_ids, glob = _features()
    ids, mixed = mix_features(local_ids, local, global_ids, glob, 1.0, 10)
    table = dict(zip(ids.tolist(), mixed))
    for j, v in zip(local_ids.tolist(), local):
        assert torch.equal(table[j], v)  # bit-identical
    ids, mixed = mix_features(local_ids, local, global_ids, glob, 0.0, 10)
    table = dict(zip(ids.tolist(), mixed))
    for j, v in zip(global_ids.tolist(), glob):
        assert torch.equal(table[j], v)
    assert torch.equal(table[4], local[2])  # a local class the server does not know keeps its own feature


@pytest.mark.parametrize("a", [0.0, 0.3, 0.7, 1.0])
def test_a_class_missing_locally_takes_the_global_feature_for_any_a(a):
    local_ids, local, global_ids, glob = _features()
    ids, mixed = mix_features(local_ids, local, global_ids, glob, a, 10)
    assert ids.tolist() == [0, 1, 3, 4, 7]  # candidate set K: every class with a feature
    table = dict(zip(ids.tolist(), mixed))
    assert torch.equal(table[0], glob[0]) and torch.equal(table[7], glob[3])


def test_mixed_features_are_linear_in_a():
    """C̃ - C_prev = (1 - a)(C̄ - C_prev) for every class held on both sides."""
    local_ids, local, global_ids, glob = _features()
    prev = {1: local[0], 3: local[1]}
    bar = {1: glob[1], 3: glob[2]}
    for a in (0.0, 0.25, 0.5, 0.9, 1.0):
        ids, mixed = mix_features(local_ids, local, global_ids, glob, a, 10)
        table = dict(zip(ids.tolist(), mixed))
        for j in (1, 3):
            torch.testing.assert_close(table[j] - prev[j], (1 - a) * (bar[j] - prev[j]))


def test_round_one_without_global_features_uses_the_local_ones():
    local_ids, local, _, _ = _features()
    ids, mixed = mix_features(local_ids, local, None, None, 0.3, 10)
    assert torch.equal(ids, local_ids) and torch.equal(mixed, local)


# ------------------------------------------------------------------ Eq. 11: both forms of L_R
def test_l2_regulariser_is_the_mean_unsquared_distance_to_the_batch_class_means():
    g = torch.Generator().manual_seed(1)
    h, table = torch.randn(12, D, generator=g), torch.randn(10, D, generator=g)
    y = torch.tensor([2, 2, 5, 5, 5, 9, 2, 9, 9, 9, 5, 2])
    brute = np.mean([np.linalg.norm(wire.to_host(table[j]) - wire.to_host(h[y == j]).mean(0)) for j in (2, 5, 9)])
    assert float(l2_regulariser(h, y, table)) == pytest.approx(brute, rel=1e-5)
    same = table[y].clone()  # features sitting on their mixed features: no pull, and a finite gradient
    same.requires_grad_(True)
    l2_regulariser(same, y, table).backward()
    assert float(l2_regulariser(same, y, table).detach()) == 0.0 and torch.isfinite(same.grad).all()
    expected = ((h - table[y]) ** 2).mean()
    assert float(fedproto_regulariser(h, y, table)) == pytest.approx(float(expected), rel=1e-6)


# ------------------------------------------------------------------ Eq. 7: the server rule
def _clients(label_counts: list[list[int]]) -> dict[int, ClientInfo]:
    return {pid: ClientInfo(pid, 100 + pid, int(sum(c)), 5, np.array(c), np.array(c) // 3)
            for pid, c in enumerate(label_counts)}


def _strategy(label_counts, facts=None, **hp) -> PFedPMStrategy:
    cfg = Config.from_run_config({"method": "pfedpm", "dataset": "digits", **{f"pfedpm.{k}": v for k, v in hp.items()}})
    return PFedPMStrategy(cfg, _clients(label_counts), facts or model_facts("protocnn", (1, 8, 8), 10, 0))


def _reply(strategy, pid, ids, feats, counts=None) -> Message:
    """A train reply of client ``pid`` carrying these class features (counts: its label counts)."""
    own = strategy.clients[pid].train_label_counts
    counts = own[ids] if counts is None else counts
    msg = Message(RecordDict({wire.CONFIG: ConfigRecord({})}), dst_node_id=100 + pid, message_type="train")
    metrics = MetricRecord({wire.PARTITION_ID: pid, wire.NUM_EXAMPLES: int(own.sum()), wire.TRAIN_LOSS: 1.0})
    content = RecordDict({wire.CLASS_FEATURES: wire.pack_class_features(np.array(ids), np.asarray(feats), counts),
                          wire.METRICS: metrics})
    return Message(content, reply_to=msg)


def _round(strategy, server_round, replies):
    strategy.configure_train(server_round, ArrayRecord(), ConfigRecord(), None)
    strategy.aggregate_train(server_round, replies)
    return dict(zip(strategy.class_ids.tolist(), strategy.features))


@pytest.fixture(autouse=True)
def _task_identity():
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


def test_identical_reporters_give_that_vector_and_a_single_reporter_its_own():
    counts = [[5, 7, 0, 0, 0, 0, 0, 0, 0, 0], [0, 9, 3, 0, 0, 0, 0, 0, 0, 0], [0, 2, 0, 0, 0, 0, 0, 0, 0, 0]]
    v, w, u = (np.random.default_rng(s).standard_normal(D).astype(np.float32) for s in range(3))
    for agg in ("weighted", "uniform"):
        s = _strategy(counts, agg=agg)
        g = _round(s, 1, [_reply(s, 0, [0, 1], [u, v]), _reply(s, 1, [1, 2], [v, w]), _reply(s, 2, [1], [v])])
        np.testing.assert_allclose(g[1], v, rtol=1e-6)  # three reporters of the same v
        assert np.array_equal(g[0], u) and np.array_equal(g[2], w)  # one reporter each
    s = _strategy(counts, agg="paper_literal")  # Eq. 7 as printed shrinks by the number of holders
    g = _round(s, 1, [_reply(s, 0, [0, 1], [u, v]), _reply(s, 1, [1, 2], [v, w]), _reply(s, 2, [1], [v])])
    np.testing.assert_allclose(g[1], v / 3, rtol=1e-6)


def test_weights_sum_to_one_and_the_rule_ignores_client_order_and_count_scale():
    counts = [[5, 7] + [0] * 8, [0, 9, 3] + [0] * 7, [0, 2] + [0] * 8]
    rng = np.random.default_rng(0)
    feats = [rng.standard_normal((2, D)).astype(np.float32), rng.standard_normal((2, D)).astype(np.float32),
             rng.standard_normal((1, D)).astype(np.float32)]
    ids = [[0, 1], [1, 2], [1]]
    s = _strategy(counts)
    g = _round(s, 1, [_reply(s, p, ids[p], feats[p]) for p in range(3)])
    expected = (7 * feats[0][1] + 9 * feats[1][0] + 2 * feats[2][0]) / 18  # weights 7/18, 9/18, 2/18
    np.testing.assert_allclose(g[1], expected, rtol=1e-5)
    s = _strategy(counts)
    reversed_order = _round(s, 1, [_reply(s, p, ids[p], feats[p]) for p in (2, 1, 0)])
    assert all(np.array_equal(g[j], reversed_order[j]) for j in g)
    scaled = [[3 * c for c in row] for row in counts]
    s = _strategy(scaled)
    g3 = _round(s, 1, [_reply(s, p, ids[p], feats[p]) for p in range(3)])
    assert all(np.allclose(g[j], g3[j], rtol=1e-6) for j in g)


def test_a_class_nobody_reported_keeps_its_previous_global_feature():
    counts = [[5, 7] + [0] * 8, [0, 9, 3] + [0] * 7]
    rng = np.random.default_rng(0)
    s = _strategy(counts)
    first = _round(s, 1, [_reply(s, 0, [0, 1], rng.standard_normal((2, D))),
                          _reply(s, 1, [1, 2], rng.standard_normal((2, D)))])
    second = _round(s, 2, [_reply(s, 0, [0, 1], rng.standard_normal((2, D)))])  # client 1 is silent
    assert np.array_equal(second[2], first[2]) and not np.array_equal(second[1], first[1])
    assert s.train_config(0, 3) == {HAS_GLOBAL: True}


def test_server_state_holds_no_model_parameters_and_needs_no_architecture():
    counts = [[5, 7] + [0] * 8, [0, 9, 3] + [0] * 7]
    facts = ModelFacts("unknown", (1, 8, 8), 10, D, initial_weights={})  # no weights, no buildable model
    s = _strategy(counts, facts=facts)
    assert s.train_payload(0, 1) == {} and s.train_config(0, 1) == {HAS_GLOBAL: False}  # G starts empty
    rng = np.random.default_rng(0)
    _round(s, 1, [_reply(s, 0, [0, 1], rng.standard_normal((2, D))), _reply(s, 1, [1, 2], rng.standard_normal((2, D)))])
    state = s.state_dict()["method"]
    assert set(state) == {"class_ids", "features", "counts"} and state["features"].shape == (3, D)
    payload = s.train_payload(1, 2)[GLOBAL_FEATURES]
    assert {k: v.shape for k, v in wire.unpack_arrays(payload).items()} == {"class-ids": (3,), "features": (3, D)}
    restored = _strategy(counts, facts=facts)
    restored.load_state_dict(copy.deepcopy(s.state_dict()))
    assert np.array_equal(wire.unpack_arrays(restored.train_payload(0, 2)[GLOBAL_FEATURES])["features"],
                          wire.unpack_arrays(payload)["features"])


@pytest.mark.parametrize("change,reason", [
    (lambda ids, f, c: (ids, np.zeros((len(ids), D + 1), np.float32), c), "shape"),
    (lambda ids, f, c: (np.array([0, 0]), f, c), "distinct"),
    (lambda ids, f, c: (np.array([0, 10]), f, c), "in 0..9"),
    (lambda ids, f, c: (np.array([0, 5]), f, c), "are not the client's classes"),
    (lambda ids, f, c: (ids, f, c * 2), "counts differ"),
    (lambda ids, f, c: (ids, f, -c), "positive"),
    (lambda ids, f, c: (ids, np.full_like(f, np.nan), c), "NaN"),
    (lambda ids, f, c: (ids.astype(np.float32), f, c), "integers"),
])
def test_malformed_replies_are_dropped_and_leave_the_state_alone(change, reason):
    counts = [[5, 7] + [0] * 8, [0, 9, 3] + [0] * 7]
    rng = np.random.default_rng(0)
    s = _strategy(counts)
    good = _reply(s, 0, [0, 1], rng.standard_normal((2, D)))
    ids, f, c = change(np.array([1, 2]), rng.standard_normal((2, D)).astype(np.float32), np.array([9, 3]))
    arrays = {"class-ids": ids, "features": f, "counts": c}
    bad = _reply(s, 1, [1, 2], rng.standard_normal((2, D)))
    bad.content[wire.CLASS_FEATURES] = ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})
    g = _round(s, 1, [good, bad])
    assert len(s.dropped) == 1 and reason in s.dropped[0]["reason"], s.dropped
    assert sorted(g) == [0, 1]  # only client 0's classes


# ------------------------------------------------------------------ relation module
def test_relation_module_scores_every_candidate_class_in_the_unit_interval():
    relation = RelationModule(D)
    assert relation.conv[0].in_channels == 2 and relation.fc[0].in_features == 64 * (D // 2)  # input (2, d)
    h, candidates = torch.randn(7, D), torch.randn(4, D)
    scores = relation.scores(h, candidates)
    assert scores.shape == (7, 4) and bool(((scores >= 0) & (scores <= 1)).all())
    relation.eval()  # pair (s, j) scores h_s against C̃^(j), whatever else is in the batch
    one = relation(torch.stack([h[2], candidates[3]])[None])
    torch.testing.assert_close(relation.scores(h, candidates)[2, 3], one[0])


def test_the_relation_step_leaves_body_and_head_bit_identical_and_the_ce_step_leaves_relation_alone(
        tmp_path, monkeypatch):
    """Spy on every relation step of a real run: the model is bit-identical across it and the relation
    module changes; between two relation steps (one CE + L_R step) the relation module is unchanged
    while the model moved."""
    original = PFedPMClient.relation_step
    steps = []

    def spy(self, model, relation, optimizer, xb, yb, ids, mixed):
        before = (_snapshot(model), _snapshot(relation))
        loss = original(self, model, relation, optimizer, xb, yb, ids, mixed)
        steps.append((id(relation), before, (_snapshot(model), _snapshot(relation))))
        return loss

    monkeypatch.setattr(PFedPMClient, "relation_step", spy)
    from tests.conftest import run_inprocess

    run_inprocess(tmp_path, 2, None, **PFEDPM, **{"num-server-rounds": 2})
    assert len(steps) > 20
    for _, (model_before, rel_before), (model_after, rel_after) in steps:
        assert _same(model_before, model_after)
        assert not _same(rel_before, rel_after)
    pairs = [(a, b) for a, b in zip(steps, steps[1:]) if a[0] == b[0]]  # consecutive steps of one fit
    assert len(pairs) > 10
    for (_, _, (model_after, rel_after)), (_, (model_before, rel_before), _) in pairs:
        assert _same(rel_after, rel_before)
        assert not _same(model_after, model_before)


def test_the_relation_step_keeps_a_batchnorm_body_bit_identical(tmp_path):
    """ResNet bodies have BatchNorm: the frozen body runs in eval mode, so its statistics stay too."""
    client = _client(tmp_path, model="resnet8")
    model = client.load_model()
    model.train()
    relation = RelationModule(model.feature_dim).to(client.env.device)
    optimizer = torch.optim.SGD(relation.parameters(), lr=0.1)
    x, y = client.data.x_train[:6], client.data.y_train[:6]
    before = _snapshot(model)
    client.relation_step(model, relation, optimizer, x, y, torch.unique(y),
                         torch.randn(len(torch.unique(y)), 256, device=client.env.device))
    assert _same(before, _snapshot(model)) and model.training


# ------------------------------------------------------------------ client update
def _client(tmp_path, state=None, server_round=1, has_global=False, pid=0, **overrides) -> PFedPMClient:
    cfg = Config.from_run_config(small_config(tmp_path, **{**PFEDPM, **overrides}))
    config = {wire.SERVER_ROUND: server_round, wire.PHASE: "train", HAS_GLOBAL: has_global}
    return PFedPMClient(ClientEnv(cfg, pid, 3, RecordDict() if state is None else state, server_round, config))


def _copy_state(state: RecordDict) -> RecordDict:
    return recorddict_from_proto(recorddict_to_proto(state))


def _round_two(tmp_path, lam: float, global_seed: int) -> tuple[dict, dict]:
    """Round 1 from scratch, then round 2 from a copy of that state with random global features G."""
    state = RecordDict()
    torch.manual_seed(0)
    _client(tmp_path, state, **{"pfedpm.lambda": lam}).fit(RecordDict())
    state = _copy_state(state)
    g = np.random.default_rng(global_seed).standard_normal((10, D)).astype(np.float32)
    content = RecordDict({GLOBAL_FEATURES: wire.pack_arrays({"class-ids": np.arange(10), "features": g})})
    torch.manual_seed(1)
    client = _client(tmp_path, state, server_round=2, has_global=True, **{"pfedpm.lambda": lam})
    client.fit(content)
    model, relation = client.load_model(), client.load_relation(D)
    return _snapshot(model), _snapshot(relation)


def test_lambda_zero_makes_body_and_head_independent_of_the_global_features(tmp_path):
    model_a, relation_a = _round_two(tmp_path, 0.0, global_seed=1)
    model_b, relation_b = _round_two(tmp_path, 0.0, global_seed=2)
    assert _same(model_a, model_b)  # G reaches only the relation module
    assert not _same(relation_a, relation_b)
    model_c, _ = _round_two(tmp_path, 1.0, global_seed=1)
    model_d, _ = _round_two(tmp_path, 1.0, global_seed=2)
    assert not _same(model_c, model_d)  # with the regulariser on, G moves the body


@pytest.fixture(scope="module")
def spied(tmp_path_factory) -> dict:
    """pFedPM's 3-round run of 3 clients, plain and with heterogeneous clients (pFedPM-mh), each run once for the
    module with every (request, reply) pair recorded: name -> (summary, grid, log)."""
    from tests.conftest import run_inprocess

    base, runs = tmp_path_factory.mktemp("pfedpm"), {}
    for name, extra in (("plain", {}), ("mh", {"pfedpm.heterogeneous": True})):
        hook, log = _spy()
        summary, grid = run_inprocess(base, 3, hook, **PFEDPM, **{"num-server-rounds": 3, "run-name": name, **extra})
        runs[name] = (summary, grid, log)
    return runs


def test_uploaded_features_equal_the_brute_force_class_means(tmp_path, spied, device):
    summary, grid, log = spied["plain"]
    cfg = Config.from_run_config(small_config(tmp_path, **PFEDPM))
    last_train = [(m, r) for m, r in log if m.metadata.message_type == "train"][-3:]
    for msg, reply in last_train:
        pid = int(reply.content.metric_records[wire.METRICS][wire.PARTITION_ID])
        ids, feats, counts = wire.unpack_class_features(reply.content.array_records[wire.CLASS_FEATURES])
        state = grid.contexts[msg.metadata.dst_node_id].state
        model = build_model("protocnn", (1, 8, 8), 10).to(device)
        model.load_state_dict(wire.torch_arrays(state.array_records["model"]))
        model.eval()
        data = load_client_data(cfg, pid, 3, device)
        own = np.flatnonzero(data.train_label_counts)
        assert np.array_equal(ids, own) and np.array_equal(counts, data.train_label_counts[own])
        for j, feature in zip(ids, feats):
            with torch.no_grad():
                per_sample = [wire.to_host(model.features(x[None])[0].double())
                              for x, y in zip(data.x_train, data.y_train) if int(y) == j]
            np.testing.assert_allclose(feature, np.mean(per_sample, axis=0), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ runs and payloads
def test_round_one_sends_no_global_features_and_switches_the_regulariser_off(spied):
    summary, _, log = spied["plain"]
    train = [m for m, _ in log if m.metadata.message_type == "train"]
    first, later = train[:3], train[3:]
    assert all(not m.content.config_records[wire.CONFIG][HAS_GLOBAL] and not m.content.array_records for m in first)
    assert all(m.content.config_records[wire.CONFIG][HAS_GLOBAL] for m in later)
    rows = _rounds(summary)
    assert float(rows[0]["m_feature_reg"]) == 0.0 and float(rows[1]["m_feature_reg"]) > 0
    assert [r["state_round_min"] for r in rows] == ["0", "1", "2"]
    for r in rows:  # both predictions, side by side
        assert 0 <= float(r["eval_relation_acc"]) <= 1 and 0 <= float(r["acc_weighted"]) <= 1
    assert summary["dropped_replies"] == 0 and "final_eval_relation_acc" in summary


def test_no_tensor_of_a_model_parameter_shape_or_value_ever_leaves_a_client(spied):
    summary, grid, log = spied["plain"]
    params = []
    for context in grid.contexts.values():
        for name in ("model", "relation"):
            params += [np.asarray(v) for v in wire.unpack_arrays(context.state.array_records[name]).values()]
    n_params = sum(p.size for p in params)
    for msg, reply in log:
        for message in (msg, reply):
            records = message.content.array_records
            assert set(records) <= {wire.CLASS_FEATURES, GLOBAL_FEATURES}
            for name, record in records.items():
                arrays = wire.unpack_arrays(record)
                assert set(arrays) <= {"class-ids", "features", "counts"}
                assert arrays["features"].shape[1] == D and len(arrays["features"]) <= 10
                assert sum(a.size for a in arrays.values()) <= 10 * (D + 2) < n_params / 10
                for a in arrays.values():  # not even a parameter that happens to share a shape
                    assert not any(p.shape == a.shape and np.array_equal(p, a) for p in params)
            if message is msg and message.metadata.message_type == "evaluate":
                assert not records  # evaluation needs nothing from the server
    # the payload does not grow with the model: wider clients (pFedPM-mh) send exactly as many bytes
    wide = spied["mh"][0]
    assert wide["bytes_up"] == summary["bytes_up"] and wide["bytes_down"] == summary["bytes_down"]


def test_heterogeneous_clients_train_together_with_the_same_feature_width(spied):
    summary, grid, log = spied["mh"]
    assert summary["dropped_replies"] == 0
    widths = {ctx.node_config["partition-id"]: wire.unpack_arrays(ctx.state.array_records["model"])["body.3.weight"].shape[0]
              for ctx in grid.contexts.values()}
    assert widths == {0: 18, 1: 20, 2: 22}
    ups = [r.content.array_records[wire.CLASS_FEATURES] for m, r in log if m.metadata.message_type == "train"]
    assert {wire.unpack_class_features(u)[1].shape[1] for u in ups} == {D}


def test_heterogeneous_variants_by_partition_id_and_unsupported_models_stop_the_run():
    assert [heterogeneous_kwargs("protocnn", p, 20)["channels"] for p in range(20)] == [18] * 7 + [20] * 7 + [22] * 6
    assert [heterogeneous_kwargs("resnet18-tv", p, 20)["stem_strides"] for p in (0, 9, 10, 19)] == \
        [(1, 4), (1, 4), (2, 2), (2, 2)]
    for strides in ((1, 4), (2, 2)):  # both CIFAR-10 variants give d = 512 features
        model = build_model("resnet18-tv", (3, 32, 32), 10, stem_strides=strides).eval()
        assert model.features(torch.zeros(2, 3, 32, 32)).shape == (2, 512)
    with pytest.raises(ValueError, match="pfedpm.heterogeneous needs model"):
        _strategy([[5, 7] + [0] * 8], facts=model_facts("cnn", (1, 8, 8), 10, 0), heterogeneous=True)


def test_the_server_benchmark_replies_are_valid_and_nothing_is_dropped():
    from tests.fakes import fake_clients, fake_reply

    cfg = Config.from_run_config({"method": "pfedpm", "dataset": "mnist5k", "model": "protocnn"})
    s = PFedPMStrategy(cfg, fake_clients(50), model_facts("protocnn", (1, 28, 28), 10, 0))
    rng = np.random.default_rng(0)
    for rnd in (1, 2):
        msgs = list(s.configure_train(rnd, ArrayRecord(), ConfigRecord(), None))
        s.aggregate_train(rnd, [fake_reply(s, m, "train", rng) for m in msgs])
    assert not s.dropped and len(s.class_ids) == 10


def test_bytes_per_round_are_a_small_fraction_of_fedavgs_on_the_same_cnn(tmp_path):
    """On MNIST-sized input (the paper's 21,840-parameter CNN), pFedPM's upload is about 1% of
    FedAvg's in bytes on the wire and its whole round under 3%."""
    from runner.inprocess import run_inprocess

    config = {**small_config(tmp_path, **PFEDPM), "dataset": "mnist5k", "partition": "pfedpm-nk",
              "pfedpm-nk.n": 4, "pfedpm-nk.k": 25, "num-server-rounds": 2, "eval-every": 2}
    ours, _ = run_inprocess({**config, "run-name": "pfedpm"}, 3)
    fedavg, _ = run_inprocess({**config, "method": "fedavg", "run-name": "fedavg"}, 3)
    assert ours["bytes_up_per_round"] < 0.02 * fedavg["bytes_up_per_round"]
    total = ours["bytes_up_per_round"] + ours["bytes_down_per_round"]
    assert total < 0.03 * (fedavg["bytes_up_per_round"] + fedavg["bytes_down_per_round"])


def test_pfedpm_presets_are_valid_run_configs_with_the_paper_settings():
    import tomllib

    from runner.compare_presets import entries

    presets = sorted(p for p in (ROOT / "conf").glob("pfedpm-*.toml") if "digits" not in p.name)
    assert len(presets) >= 6
    for path in presets:
        preset = tomllib.loads(path.read_text())
        run = preset["run-config"]
        assert run["partition"] == "pfedpm-nk" and run["batch-size"] == 10 and run["lr"] == 0.01
        assert run["momentum"] == 0.5 and preset["compare"]["supernodes"] == 20
        for entry in entries(preset):
            Config.from_run_config({**run, **entry.config, "method": entry.method})
            assert "model" in run or "model" in entry.config
        rows = {e.label: e for e in entries(preset)}
        assert rows["R-pfedpm"].runs_of == "pfedpm" and rows["R-pfedpm"].accuracy == "eval_relation_acc"


def test_the_small_sweep_and_ablation_presets_share_one_training_rule_and_validate():
    """conf/pfedpm-digits-*.toml: every row runs with the paper's optimiser set explicitly in the shared run config
    (no row changes a common key), and each holds out a validation split to choose on."""
    import tomllib

    from runner.compare_presets import entries, load_preset

    for name in ("pfedpm-digits-sweep.toml", "pfedpm-digits-ablation.toml"):
        preset = load_preset(ROOT / "conf" / name)  # with the sweep's grid rows
        run = preset["run-config"]
        assert (run["lr"], run["momentum"], run["batch-size"], run["model"]) == (0.01, 0.5, 10, "protocnn")
        assert run["val-fraction"] > 0
        rows = entries(preset)
        assert rows and all(not {"lr", "momentum", "batch-size", "model", "local-epochs"} & set(e.config) for e in rows)
        for entry in rows:
            Config.from_run_config({**run, **entry.config, "method": entry.method})
    sweep = tomllib.loads((ROOT / "conf" / "pfedpm-digits-sweep.toml").read_text())["sweep"]
    assert set(sweep["pfedpm.reg"]) == {"l2", "l2sq", "fedproto"}


@pytest.mark.long  # a real flwr run / SuperLink: make test-long
def test_flwr_run_with_heterogeneous_clients(tmp_path):
    """The real runtime: `flwr run` on Ray, 2 SuperNodes of different widths, 2 rounds, judged by flwr ls."""
    from runner.launch import simulate

    config = {**PFEDPM, "dataset": "digits", "partition": "pfedpm-nk", "pfedpm-nk.n": 3, "pfedpm-nk.k": 40,
              "num-server-rounds": 2, "pfedpm.heterogeneous": True, "results-dir": str(tmp_path), "run-name": "smoke"}
    result = simulate(config, supernodes=2, app_dir=ROOT, stream=False, timeout=600, flwr_home=tmp_path / "home")
    assert result["status"] == "finished:completed", result
    summary = json.loads((tmp_path / "smoke" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["dropped_replies"] == 0
    rows = list(csv.DictReader(open(tmp_path / "smoke" / "rounds.csv")))
    assert [r["state_round_min"] for r in rows] == ["0", "1"]
    assert all(r["eval_relation_acc"] != "" for r in rows)
