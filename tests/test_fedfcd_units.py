"""FedFCD's equations on small cases computed by hand or by a second route, the order of a round's stages, the
values each message carries and the learning-rate rule. Direct calls only (no federation): each test takes well
under a second, so that mutation testing (tools/mutation.py) can afford them for every mutant."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from clients.fedfcd import GlobalKnowledge, alignment_loss, fused_logits
from fedcore import wire
from fedcore.methods.fedfcd import ALIGNMENT_LOSS, GLOBAL_HEAD, HEAD_LOSS
from fedstrategies.fedfcd_math import GlobalHead
from tests.test_fedfcd import C, _client, _known, _pairs, _payload, _replies, _reply, _same, _snapshot, _strategy


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _tiny_known(has=(1.0, 1.0, 1.0)) -> GlobalKnowledge:
    """C = 3 classes, d = 2: integer heads and GFRs that a hand computation can follow."""
    return GlobalKnowledge(weight=torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0]]),
                           bias=torch.tensor([0.5, -1.0, 0.0]),
                           gfr=torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, -1.0]]),
                           has_gfr=torch.tensor(has))


# ====================================================================== Eq. 6: feature alignment, value and direction
def test_alignment_loss_by_hand_and_its_gradient_pulls_features_towards_their_gfr():
    known = _tiny_known()
    z = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = torch.tensor([0, 1])
    # lambda * (1/|B|) sum_b (1/d) ||z_b - GFR_{y_b}||^2 = 2 * ((1 + 4) + (4 + 9)) / (2 * 2) = 9
    r = alignment_loss(z, y, known, 2.0)
    assert r.item() == pytest.approx(9.0)
    (grad,) = torch.autograd.grad(r, z)
    # dR/dz_b = 2 lambda (z_b - GFR_y) / (|B| d) = (z_b - GFR_y) here: it points away from the GFR
    assert torch.allclose(grad, torch.tensor([[1.0, 2.0], [2.0, 3.0]]))
    stepped = (z - 0.1 * grad).detach()
    before = (z.detach() - known.gfr[y]).norm(dim=1)
    assert ((stepped - known.gfr[y]).norm(dim=1) < before).all()  # a descent step moves z towards its GFR
    assert float(alignment_loss(stepped, y, known, 2.0)) < 9.0
    # lambda scales the term linearly; lambda = 0 removes it
    assert alignment_loss(z.detach(), y, known, 5.0).item() == pytest.approx(22.5)
    assert alignment_loss(z.detach(), y, known, 0.0).item() == 0.0


def test_alignment_loss_without_a_gfr_adds_zero_but_keeps_the_normaliser():
    known = _tiny_known(has=(1.0, 0.0, 1.0))  # class 1 has no GFR this round
    z = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    # only sample 0 counts, still divided by |B| d = 4: 2 * (1 + 4) / 4 = 2.5
    assert float(alignment_loss(z, torch.tensor([0, 1]), known, 2.0)) == pytest.approx(2.5)
    assert float(alignment_loss(z, torch.tensor([1, 1]), known, 2.0)) == 0.0


# ====================================================================== Eq. 7-8: decision fusion
def test_fused_logits_by_hand_global_plus_personal_unweighted():
    known = _tiny_known()
    personal = torch.nn.Linear(2, 3)
    with torch.no_grad():
        personal.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 1.0], [2.0, 0.0]]))
        personal.bias.copy_(torch.tensor([0.0, 0.0, -3.0]))
    z = torch.tensor([[1.0, 2.0]])
    g = [1 * 1 + 0 * 2 + 0.5, 0 * 1 + 2 * 2 - 1, -1 * 1 + 1 * 2 + 0]  # [1.5, 3, 1]
    p = [0 * 1 + 1 * 2 + 0, 1 + 2 + 0, 2 * 1 + 0 - 3]  # [2, 3, -1]
    assert fused_logits(z, personal, known).tolist() == [[g[0] + p[0], g[1] + p[1], g[2] + p[2]]]
    assert fused_logits(z, personal, known, fusion=False).tolist() == [p]
    assert known.logits(z).tolist() == [g]
    # softmax comes after the sum: CE of the fused decision, by hand
    s = torch.tensor([3.5, 6.0, 0.0])
    assert float(F.cross_entropy(fused_logits(z, personal, known), torch.tensor([0]))) == pytest.approx(
        float(torch.logsumexp(s, 0) - s[0]))


def test_objective_is_ce_of_the_fused_logits_plus_lambda_r(tmp_path):
    client = _client(tmp_path, **{"fedfcd.lambda": 3.0})
    model = client.new_model()
    known = _known(client, model)
    xb, yb = client.data.x_train[:12], client.data.y_train[:12]
    z = model.features(xb)
    s = z @ known.weight.T + known.bias + z @ model.head.weight.T + model.head.bias
    ce = F.cross_entropy(s, yb)
    r = 3.0 * ((z - known.gfr[yb]) ** 2).sum() / z.numel()
    parts: list = []
    assert torch.allclose(client.objective(known, parts)(model, xb, yb), ce + r, atol=1e-6)
    assert len(parts) == 1 and float(parts[0]) == pytest.approx(float(r), rel=1e-5)
    assert float(client.head_objective(known)(model.head, z, yb)) == pytest.approx(float(ce), rel=1e-6)
    client.hp["feature-alignment"] = False  # w/o FA: CE alone, no part recorded
    parts.clear()
    assert torch.allclose(client.objective(known, parts)(model, xb, yb), ce, atol=1e-6) and not parts


# ====================================================================== Eq. 4: the server's global head
def test_global_head_step_is_the_closed_form_softmax_gradient_on_two_classes():
    w0 = np.array([[0.5, -1.0], [0.0, 1.0]], np.float32)
    b0 = np.array([0.1, -0.2], np.float32)
    head = GlobalHead(w0, b0, lr=0.5)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 2.0]])
    y = torch.tensor([0, 1, 1, 0])
    # by hand: grad W = (softmax(Wx + b) - onehot(y))^T x / n, grad b = mean(softmax - onehot)
    logits = wire.to_host(x) @ w0.T + b0
    prob = np.exp(logits - logits.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    err = prob - np.eye(2)[wire.to_host(y)]
    ce = float(-np.log(prob[np.arange(4), wire.to_host(y)]).mean())
    assert head.loss(x, y) == pytest.approx(ce, rel=1e-6)
    batch_loss = head.train(x, y, batch_size=4, epochs=1, generator=torch.Generator().manual_seed(0))
    assert batch_loss == pytest.approx(ce, rel=1e-6)  # one batch: the loss before its step
    got = head.arrays()
    assert np.allclose(got["weight"], w0 - 0.5 * err.T @ wire.to_host(x) / 4, atol=1e-6)
    assert np.allclose(got["bias"], b0 - 0.5 * err.mean(0), atol=1e-6)
    assert head.loss(x, y) < ce  # the step lowers the head's loss
    assert head.loss(x[:0], y[:0]) == 0.0


def test_global_head_epochs_batches_and_momentum_follow_the_arguments():
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    w0, b0 = np.zeros((3, 3), np.float32), np.zeros(3, np.float32)
    head = GlobalHead(w0, b0, lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(3)
    losses = []
    w, b = torch.zeros(3, 3, requires_grad=True), torch.zeros(3, requires_grad=True)
    vw, vb = torch.zeros(3, 3), torch.zeros(3)
    order_gen = torch.Generator().manual_seed(3)
    for _ in range(2):  # two epochs of batch 3: batches of 3, 3, 1, heavy-ball SGD as torch writes it
        for idx in torch.randperm(7, generator=order_gen).split(3):
            loss = F.cross_entropy(x[idx] @ w.T + b, y[idx])
            gw, gb = torch.autograd.grad(loss, [w, b])
            with torch.no_grad():
                vw = gw if not losses else 0.9 * vw + gw
                vb = gb if not losses else 0.9 * vb + gb
                w -= 0.1 * vw
                b -= 0.1 * vb
            losses.append(float(loss))
    mean_loss = head.train(x, y, batch_size=3, epochs=2, generator=gen)
    assert mean_loss == pytest.approx(np.mean(losses), rel=1e-5) and len(losses) == 6
    assert np.allclose(head.arrays()["weight"], wire.to_host(w), atol=1e-6)
    assert np.allclose(head.arrays()["bias"], wire.to_host(b), atol=1e-6)
    assert head.train(x[:0], y[:0], batch_size=3, epochs=1, generator=gen) == 0.0


def test_global_head_state_dict_round_trip_keeps_the_optimiser_bound_and_is_a_copy():
    head = GlobalHead(np.ones((2, 2), np.float32), np.zeros(2, np.float32), lr=0.1, momentum=0.5)
    x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1])
    head.train(x, y, batch_size=1, epochs=1, generator=torch.Generator().manual_seed(0))
    state = head.state_dict()
    twin = copy.deepcopy(head)
    head.train(x, y, batch_size=1, epochs=1, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(state["linear"]["weight"], head.linear.weight)  # the saved state is a copy
    other = GlobalHead(np.zeros((2, 2), np.float32), np.zeros(2, np.float32), lr=0.1, momentum=0.5)
    other.load_state_dict(state)
    other.train(x, y, batch_size=1, epochs=1, generator=torch.Generator().manual_seed(1))  # momentum restored too
    twin.train(x, y, batch_size=1, epochs=1, generator=torch.Generator().manual_seed(1))
    assert np.array_equal(other.arrays()["weight"], twin.arrays()["weight"])
    assert np.array_equal(other.arrays()["weight"], head.arrays()["weight"])


# ====================================================================== the server's round: what aggregate does
def test_aggregate_trains_the_head_on_every_lfr_pair_and_reports_its_numbers():
    strategy = _strategy(num_clients=4, **{"server-batch-size": 3, "server-epochs": 2, "lr-global-head": 0.2})
    replies = _replies(strategy)
    x, y = _pairs(replies)
    expected = GlobalHead(strategy.initial_weights["head.weight"], strategy.initial_weights["head.bias"], lr=0.2)
    generator = copy.deepcopy(strategy.torch_generator)
    before = expected.loss(x, y)
    batch_loss = expected.train(x, y, batch_size=3, epochs=2, generator=generator)
    metrics = strategy.aggregate(1, replies)
    assert np.array_equal(strategy.head.arrays()["weight"], expected.arrays()["weight"])
    assert metrics == {"head-loss-before": pytest.approx(before), "head-loss-after": pytest.approx(expected.loss(x, y)),
                       "head-batch-loss": pytest.approx(batch_loss), "head-pairs": 8, "gfr-classes": 5}
    assert metrics["head-loss-after"] < metrics["head-loss-before"]


def test_downloads_after_aggregate_carry_the_new_head_and_gfrs_not_the_previous_ones():
    strategy = _strategy(num_clients=4, **{"gfr-download": "all"})
    strategy.aggregate(0, _replies(strategy, 0))
    first = wire.unpack_arrays(strategy.train_payload(1, 1)[GLOBAL_HEAD])
    strategy.aggregate(1, _replies(strategy, 1))
    head = wire.unpack_arrays(strategy.train_payload(1, 2)[GLOBAL_HEAD])
    evaluated = wire.unpack_arrays(strategy.evaluate_payload(1, 2)[GLOBAL_HEAD])
    now = strategy.head.arrays()
    assert np.array_equal(head["weight"], now["weight"]) and np.array_equal(head["bias"], now["bias"])
    assert np.array_equal(evaluated["weight"], now["weight"]) and not np.array_equal(first["weight"], now["weight"])
    ids, feats, counts = wire.unpack_class_features(strategy.train_payload(1, 2)[wire.CLASS_FEATURES])
    assert ids.tolist() == [0, 1, 2, 3, 4]
    assert np.array_equal(feats, strategy.gfr[ids]) and np.array_equal(counts, strategy.gfr_counts[ids])


def test_the_head_goes_down_as_compact_arrays_one_raw_array_per_tensor():
    """The head is two small arrays: each travels raw (dtype and shape in Flower's own Array fields), without the
    packed header, which keeps the MLP round under 1% of FedAvg's bytes (docs/papers/fedfcd.md)."""
    strategy = _strategy(num_clients=4)
    record = strategy.train_payload(0, 1)[GLOBAL_HEAD]
    assert sorted(record.keys()) == ["bias", "weight"]
    assert {a.stype for a in record.values()} == {wire.RAW_STYPE}
    assert wire.record_bytes(record) < wire.record_bytes(wire.pack_arrays(strategy.head.arrays()))


def test_own_download_holds_the_rows_of_the_clients_classes_with_their_values():
    strategy = _strategy(num_clients=4)  # client pid holds classes pid and pid + 1
    strategy.aggregate(0, _replies(strategy, 0))
    ids, feats, counts = wire.unpack_class_features(strategy.train_payload(2, 1)[wire.CLASS_FEATURES])
    assert ids.tolist() == [2, 3]
    assert np.array_equal(feats, strategy.gfr[[2, 3]]) and counts.tolist() == [20 + 32, 20 + 33]
    # a class the client holds a single training sample of is one of its classes too
    single = _strategy(num_clients=4)
    single.clients[0].train_label_counts[0] = 1
    single.aggregate(0, _replies(single, 0))
    ids, _, counts = wire.unpack_class_features(single.train_payload(0, 1)[wire.CLASS_FEATURES])
    assert ids.tolist() == [0, 1] and counts.tolist() == [1, 20 + 31]
    # a class of the client that nobody has reported yet has no row
    fresh = _strategy(num_clients=4)
    fresh.aggregate(0, _replies(fresh, 0)[:1])  # only client 0: classes 0 and 1
    ids, _, _ = wire.unpack_class_features(fresh.train_payload(1, 1)[wire.CLASS_FEATURES])
    assert ids.tolist() == [1]


def test_restoring_a_checkpoint_drops_the_packed_records_of_the_state_it_replaces():
    strategy = _strategy(num_clients=4)
    strategy.aggregate(0, _replies(strategy, 0))
    saved = copy.deepcopy(strategy.state_dict())
    saved_head = strategy.head.arrays()
    strategy.aggregate(1, _replies(strategy, 1))
    strategy.train_payload(0, 2)  # packs the round-1 head
    strategy.load_state_dict(saved)
    sent = wire.unpack_arrays(strategy.train_payload(0, 2)[GLOBAL_HEAD])
    assert np.array_equal(sent["weight"], saved_head["weight"])


def test_round_0_is_every_client_with_the_train_reply_schema_and_the_same_rule():
    strategy = _strategy(num_clients=4)
    assert list(strategy.prepare_targets()) == [0, 1, 2, 3]
    assert strategy.prepare_schema(2) == strategy.reply_schema(2) == {wire.CLASS_FEATURES: wire.CLASS_FEATURES_SCHEMA}
    twin = _strategy(num_clients=4)
    assert strategy.aggregate_prepare(_replies(strategy, 0)) == twin.aggregate(0, _replies(twin, 0))
    assert np.array_equal(strategy.gfr, twin.gfr)


# ====================================================================== the client's round: stage order and values
def test_local_update_runs_stage_a_then_stage_b_each_epoch_with_the_same_two_optimisers(tmp_path):
    """Two alternations, momentum 0.5 (so optimiser state carries over): equal to A, B, A, B by hand."""
    client = _client(tmp_path, **{"local-epochs": 2, "momentum": 0.5, "lr": 0.03})
    model = client.new_model()
    known = _known(client, model)
    manual = copy.deepcopy(model)
    opt_theta = torch.optim.SGD(manual.body.parameters(), lr=0.03, momentum=0.5)
    opt_phi = torch.optim.SGD(manual.head.parameters(), lr=0.03, momentum=0.5)
    losses = []
    for epoch in range(2):
        parts: list = []
        a = client.stage_a(manual, known, opt_theta, tag=2 * epoch, parts=parts, epochs=1)
        b = client.stage_b(manual, known, opt_phi, tag=2 * epoch + 1, epochs=1)
        losses.append((a, b, float(torch.stack(parts).mean())))
    metrics = client.local_update(model, known)
    assert _same(model, _snapshot(manual))
    assert metrics[wire.TRAIN_LOSS] == pytest.approx(losses[-1][0])
    assert metrics[wire.METHOD_METRIC_PREFIX + HEAD_LOSS] == pytest.approx(losses[-1][1])
    assert metrics[wire.METHOD_METRIC_PREFIX + ALIGNMENT_LOSS] == pytest.approx(losses[-1][2])


def test_stage_b_is_one_step_of_the_given_optimiser_on_ce_of_the_fused_logits_by_hand(tmp_path):
    from clients.training import minibatches

    client = _client(tmp_path)  # common lr 0.05: the step must use the optimiser it is given (lr 0.3)
    model = client.new_model()
    known = _known(client, model)
    head = copy.deepcopy(model.head)
    idx = next(minibatches(client.data.num_train, client.cfg["batch-size"], client.env.generator(1),
                           client.env.device))
    with torch.no_grad():
        z = copy.deepcopy(model).eval().body(client.data.x_train)[idx]
    loss = F.cross_entropy(z @ known.weight.T + known.bias + head(z), client.data.y_train[idx])
    gw, gb = torch.autograd.grad(loss, [head.weight, head.bias])
    client.stage_b(model, known, torch.optim.SGD(model.head.parameters(), lr=0.3), tag=1, steps=1)
    assert torch.allclose(model.head.weight, head.weight - 0.3 * gw, atol=1e-7)
    assert torch.allclose(model.head.bias, head.bias - 0.3 * gb, atol=1e-7)


def test_local_steps_give_one_alternation_of_that_many_steps_per_stage(tmp_path):
    client = _client(tmp_path, **{"local-steps": 3, "local-epochs": 4})
    assert client.budget() == (1, {"steps": 3})
    assert _client(tmp_path, **{"local-epochs": 4}).budget() == (4, {"epochs": 1})
    model = client.new_model()
    known = _known(client, model)
    manual = copy.deepcopy(model)
    client.stage_a(manual, known, torch.optim.SGD(manual.body.parameters(), lr=0.05), tag=0, steps=3)
    client.stage_b(manual, known, torch.optim.SGD(manual.head.parameters(), lr=0.05), tag=1, steps=3)
    client.local_update(model, known)
    assert _same(model, _snapshot(manual))


@pytest.mark.parametrize("budget", [{"local-steps": 2}, {"local-epochs": 2}])
@pytest.mark.parametrize("variant", [{"fedfcd.hierarchical": False}, {"fedfcd.alternation": "batch"}])
def test_one_pass_variants_spend_the_whole_budget_in_one_pass_and_report_its_mean_alignment_term(tmp_path, variant,
                                                                                                 budget):
    """w/o HO (joint steps) and per-batch alternation: one pass of local-steps steps or local-epochs epochs."""
    client = _client(tmp_path, **{**budget, **variant})
    model = client.new_model()
    known = _known(client, model)
    metrics = client.local_update(model, known)
    manual = client.new_model()
    parts: list = []
    joint = not client.hp["hierarchical"]
    opt = torch.optim.SGD(manual.parameters() if joint else manual.body.parameters(), lr=0.05)
    after = None if joint else client.per_batch_head_step(manual, known, torch.optim.SGD(manual.head.parameters(),
                                                                                         lr=0.05))
    whole = {"steps": 2} if "local-steps" in budget else {"epochs": 2}
    with client.frozen([] if joint else [manual.head]):
        loss = client.train(manual, optimizer=opt, loss_fn=client.objective(known, parts), tag=0, after_step=after,
                            **whole)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(model.parameters(), manual.parameters()))
    assert len(parts) == (2 if "local-steps" in budget else 2 * -(-client.data.num_train // 16))
    assert metrics[wire.METHOD_METRIC_PREFIX + ALIGNMENT_LOSS] == pytest.approx(float(torch.stack(parts).mean()))
    assert metrics[wire.TRAIN_LOSS] == pytest.approx(loss)
    assert wire.METHOD_METRIC_PREFIX + HEAD_LOSS not in metrics


# ====================================================================== the common learning rate (issue #29)
def test_both_client_stages_step_with_the_common_lr_unless_a_stage_lr_is_set(tmp_path):
    common = _client(tmp_path, **{"lr": 0.07})
    assert common.learning_rates() == (0.07, 0.07)
    assert _client(tmp_path, **{"lr": 0.07, "fedfcd.lr-feature": 0.02}).learning_rates() == (0.02, 0.07)
    assert _client(tmp_path, **{"lr": 0.07, "fedfcd.lr-personal-head": 0.03}).learning_rates() == (0.07, 0.03)
    # and the steps really use them: one step per stage at lr 0.07 against a hand-built pair of SGDs
    client = _client(tmp_path, **{"lr": 0.07, "local-steps": 1})
    model = client.new_model()
    known = _known(client, model)
    manual = copy.deepcopy(model)
    client.stage_a(manual, known, torch.optim.SGD(manual.body.parameters(), lr=0.07), tag=0, steps=1)
    client.stage_b(manual, known, torch.optim.SGD(manual.head.parameters(), lr=0.07), tag=1, steps=1)
    client.local_update(model, known)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(model.parameters(), manual.parameters()))


def test_the_server_head_uses_its_own_lr_not_the_common_one():
    slow, fast = _strategy(**{"lr-global-head": 0.01}), _strategy(**{"lr-global-head": 0.1})
    assert slow.head.optimizer.param_groups[0]["lr"] == 0.01 and fast.head.optimizer.param_groups[0]["lr"] == 0.1
    assert slow.head.optimizer.param_groups[0]["momentum"] == 0.0  # plain SGD, as proposed


# ====================================================================== what the client reads from a message
def test_global_knowledge_holds_the_sent_head_and_gfr_rows_with_their_mask(tmp_path):
    client = _client(tmp_path)
    d = client.new_model().feature_dim
    weight = np.arange(C * d, dtype=np.float32).reshape(C, d) / 100
    bias = np.arange(C, dtype=np.float32)
    feats = np.stack([np.full(d, 3.0, np.float32), np.full(d, -2.0, np.float32)])
    known = client.global_knowledge(_payload(weight, bias, [2, 7], feats))
    assert np.array_equal(wire.to_host(known.weight), weight) and np.array_equal(wire.to_host(known.bias), bias)
    assert known.has_gfr.tolist() == [0, 0, 1, 0, 0, 0, 0, 1, 0, 0]
    assert (known.gfr[2] == 3.0).all() and (known.gfr[7] == -2.0).all() and not known.gfr[[0, 1, 3]].any()
    evaluation = client.global_knowledge(RecordDict({GLOBAL_HEAD: wire.pack_arrays({"weight": weight, "bias": bias})}))
    assert not evaluation.has_gfr.any() and not evaluation.gfr.any()


def test_fit_trains_from_the_saved_state_saves_it_and_uploads_its_lfrs(tmp_path):
    client = _client(tmp_path)
    start = client.new_model()
    with torch.no_grad():  # a saved state that differs from the initial model
        for p in start.parameters():
            p.add_(0.05)
    client.save_model(start)
    known_payload = _payload(wire.to_host(start.head.weight), wire.to_host(start.head.bias), [],
                             np.zeros((0, start.feature_dim), np.float32))
    expected = copy.deepcopy(start)
    client.local_update(expected, client.global_knowledge(known_payload))
    records, metrics = client.fit(known_payload)
    assert _same(client.load_model(), _snapshot(expected))  # trained from the saved state, and saved
    ids, feats, counts = wire.unpack_class_features(records[wire.CLASS_FEATURES])
    again = wire.unpack_class_features(client.lfr_upload(expected)[wire.CLASS_FEATURES])
    assert np.array_equal(feats, again[1]) and np.array_equal(ids, again[0]) and np.array_equal(counts, again[2])
    assert set(metrics) == {wire.TRAIN_LOSS, wire.METHOD_METRIC_PREFIX + HEAD_LOSS,
                            wire.METHOD_METRIC_PREFIX + ALIGNMENT_LOSS}
    assert metrics[wire.METHOD_METRIC_PREFIX + ALIGNMENT_LOSS] == 0.0  # no GFR was sent: R_i adds 0


def test_round_0_uploads_the_lfrs_of_the_untrained_model(tmp_path):
    client = _client(tmp_path)
    records, metrics = client.prepare(RecordDict())
    initial = client.new_model()
    ids, feats, counts = wire.unpack_class_features(records[wire.CLASS_FEATURES])
    x, y = client.data.x_train, client.data.y_train
    with torch.no_grad():
        expected = torch.stack([initial.eval().body(x[y == j]).mean(0) for j in ids])
    assert np.allclose(feats, wire.to_host(expected), atol=1e-6) and metrics == {}
    assert counts.tolist() == [int((y == j).sum()) for j in ids]


# ====================================================================== each stage's own lr and shuffle, in every variant
def _deltas(tmp_path, variant: dict, **stage_lrs) -> tuple[torch.Tensor, torch.Tensor]:
    """(theta_i change, phi_i change) of one local_update of one step per stage, momentum 0, common lr 0.05."""
    client = _client(tmp_path, **{"local-steps": 1, "lr": 0.05, **variant,
                                  **{f"fedfcd.{k}": v for k, v in stage_lrs.items()}})
    model = client.new_model()
    known = _known(client, model)
    start = [p.detach().clone() for p in model.parameters()]
    client.local_update(model, known)
    change = [(p.detach() - s).flatten() for p, s in zip(model.parameters(), start)]
    n_body = len(list(model.body.parameters()))
    return torch.cat(change[:n_body]), torch.cat(change[n_body:])


@pytest.mark.parametrize("variant", [{}, {"fedfcd.alternation": "batch"}, {"fedfcd.hierarchical": False}],
                         ids=["epoch", "batch", "joint"])
def test_a_stage_lr_scales_that_stages_first_step_by_its_ratio_to_the_common_lr_in_every_variant(tmp_path, variant):
    """Both runs start from the same model and batch, so the first gradient of a stage is the same: at 3x the common
    lr its step is exactly 3x as long; the other stage's step (before it, or on the same loss) is unchanged."""
    theta, phi = _deltas(tmp_path, variant)
    assert theta.norm() > 1e-4 and phi.norm() > 1e-4  # both stages really moved
    theta_f, phi_f = _deltas(tmp_path, variant, **{"lr-feature": 0.15})
    assert (theta_f - 3 * theta).norm() <= 1e-3 * theta.norm()
    theta_h, phi_h = _deltas(tmp_path, variant, **{"lr-personal-head": 0.15})
    assert (phi_h - 3 * phi).norm() <= 1e-3 * phi.norm()
    assert (theta_h - theta).norm() <= 1e-6 * theta.norm()  # the head's lr leaves the extractor's step alone
    if variant.get("fedfcd.hierarchical") is False:  # joint step on one loss: the head's step keeps the common lr
        assert (phi_f - phi).norm() <= 1e-6 * phi.norm()


def test_stage_a_of_each_alternation_draws_its_batches_from_its_own_shuffle_stream(tmp_path):
    """local-epochs 2: stage A of alternation e sees the training samples in the order of generator(2e) (stage B has
    2e + 1), so the second alternation's extractor pass is not a replay of the first one's order."""
    from clients.training import minibatches

    client = _client(tmp_path, **{"local-epochs": 2})
    model = client.new_model()
    known = _known(client, model)
    seen: list = []
    objective = client.objective

    def recording(known, parts=None):
        loss_fn = objective(known, parts)

        def fn(model, xb, yb):
            seen.append(xb.detach().clone())
            return loss_fn(model, xb, yb)

        return fn

    client.objective = recording
    client.local_update(model, known)
    n, bs, x = client.data.num_train, client.cfg["batch-size"], client.data.x_train
    expected = [x[idx] for tag in (0, 2) for idx in minibatches(n, bs, client.env.generator(tag), client.env.device)]
    replay = [x[idx] for _ in (0, 2) for idx in minibatches(n, bs, client.env.generator(0), client.env.device)]
    assert len(seen) == len(expected) == 2 * -(-n // bs)
    assert all(torch.equal(a, b) for a, b in zip(seen, expected))
    assert not all(torch.equal(a, b) for a, b in zip(expected, replay))  # the two orders differ


def test_without_decision_fusion_stage_b_minimises_ce_of_the_personal_logits_alone(tmp_path):
    """w/o FD: the head's loss is CE(p, y), not CE(g + p, y); on a sample the two differ by the global logits."""
    client = _client(tmp_path, **{"fedfcd.decision-fusion": False})
    model = client.new_model()
    known = _known(client, model)
    y = client.data.y_train[:16]
    with torch.no_grad():
        z = model.features(client.data.x_train[:16])
        loss = float(client.head_objective(known)(model.head, z, y))
        fused = float(F.cross_entropy(known.logits(z) + model.head(z), y))
        assert loss == pytest.approx(float(F.cross_entropy(model.head(z), y)), rel=1e-6)
        assert abs(loss - fused) > 1e-3  # the case tells the two apart
        assert float(_client(tmp_path).head_objective(known)(model.head, z, y)) == pytest.approx(fused, rel=1e-6)


def test_global_knowledge_puts_the_head_gfrs_and_mask_on_the_clients_device(tmp_path):
    """The meta device stands in for a GPU: every tensor the client reads from a message lives on env.device."""
    client = _client(tmp_path)
    d = client.new_model().feature_dim
    client.env.device = torch.device("meta")
    weight, bias = np.ones((C, d), np.float32), np.zeros(C, np.float32)
    known = client.global_knowledge(_payload(weight, bias, [2, 7], np.ones((2, d), np.float32)))
    assert [t.device.type for t in (known.weight, known.bias, known.gfr, known.has_gfr)] == ["meta"] * 4
    evaluation = client.global_knowledge(RecordDict({GLOBAL_HEAD: wire.pack_arrays({"weight": weight, "bias": bias})}))
    assert [t.device.type for t in (evaluation.gfr, evaluation.has_gfr)] == ["meta"] * 2


# ====================================================================== the paper's setting (fedcore/paper_settings.py)
@pytest.mark.parametrize("dataset, model", [("fmnist", "dnn"), ("mnist5k", "dnn"), ("cifar10", "fedavgcnn"),
                                            ("cifar100", "resnet18")])
def test_method_fedfcd_alone_gives_the_papers_setting(dataset, model):
    """Spec sections 2 and 8: the MLP / CNN / ResNet-18 per dataset, SGD lr 0.01 without momentum, batch 10, E = 1,
    every client every round; and the client stages then step at 0.01, the paper's eta_f = eta_phi_i."""
    from fedcore.config import Config

    cfg = Config.from_run_config({"method": "fedfcd", "dataset": dataset})
    assert (cfg["model"], cfg["lr"], cfg["momentum"], cfg["weight-decay"], cfg["batch-size"], cfg["local-epochs"],
            cfg["local-steps"], cfg["fraction-train"]) == (model, 0.01, 0.0, 0.0, 10, 1, 0, 1.0)
    assert cfg.hparams()["lr-global-head"] == 0.01 and cfg.hparams()["lambda"] == 1.0


# ====================================================================== the sweep and bytes commands (issue #29)
def test_sweep_expands_every_lambda_lr_pair_into_a_fedfcd_variant_and_ranks_on_validation():
    """conf/fedfcd-mnist5k-sweep.toml's [sweep]: one fedfcd row per (lambda, lr), ranked in sweep.md on validation."""
    from runner.compare_presets import expand_sweep
    from runner.compare_table import render_sweep

    preset = {"compare": {"methods": ["local"], "seeds": [0]}, "run-config": {"dataset": "digits"},
              "sweep": {"method": "fedfcd", "label": "fedfcd-lam{fedfcd.lambda:g}-lr{lr:g}",
                        "fedfcd.lambda": [0.0, 5.0], "lr": [0.01, 0.05]}}
    expanded = expand_sweep(preset)
    assert expanded["compare"]["methods"] == ["local", "fedfcd-lam0-lr0.01", "fedfcd-lam0-lr0.05",
                                              "fedfcd-lam5-lr0.01", "fedfcd-lam5-lr0.05"]
    assert expanded["variants"]["fedfcd-lam5-lr0.01"] == {"method": "fedfcd", "fedfcd.lambda": 5.0, "lr": 0.01}
    results = {name: [{"seed": 0, "best_val_acc": val, "best_val_round": 3, "test_acc_at_best_val": test}]
               for name, val, test in (("fedfcd-lam0-lr0.01", 0.90, 0.99), ("fedfcd-lam5-lr0.05", 0.95, 0.50))}
    text = render_sweep({**expanded, "made": {"command": "cmd", "commit": "abc"}}, results)
    assert "Chosen on validation: fedfcd.lambda = 5, lr = 0.05" in text  # the higher validation accuracy, not test
    assert text.index("| 5 | 0.05 | 95.00") < text.index("| 0 | 0.01 | 90.00")
    with pytest.raises(SystemExit):
        expand_sweep({**preset, "sweep": {"method": "fedfcd", "fedfcd.lambda": 1.0}})


def test_traffic_reads_bytes_per_training_round_evaluation_and_round_0_from_rounds_csv(tmp_path):
    from benchmarks.studies.fedfcd_bytes import traffic

    path = tmp_path / "rounds.csv"
    path.write_text("round,bytes_up,bytes_down,eval_bytes_down\n0,100,10,\n1,20,200,50\n2,40,400,70\n")
    assert traffic(path) == {"up": 30.0, "down": 300.0, "eval_down": 60.0, "prepare": 110.0}


# ====================================================================== spec section 12: a fast test per invariant
# (docs/papers/fedfcd.md, "Spec invariants and their tests", maps every invariant to its tests)
def test_1_a_fit_reply_is_k_by_d_lfrs_their_labels_and_counts_and_no_parameter_shaped_tensor(tmp_path):
    client = _client(tmp_path)
    model = client.new_model()
    d = model.feature_dim
    known = _known(client, model)
    sent = known.has_gfr.nonzero().flatten()
    payload = _payload(wire.to_host(known.weight), wire.to_host(known.bias), wire.to_host(sent),
                       wire.to_host(known.gfr[sent]))
    records, _ = client.fit(payload)
    assert set(records.keys()) == {wire.CLASS_FEATURES}  # one record, nothing else
    arrays = wire.unpack_arrays(records[wire.CLASS_FEATURES])
    assert set(arrays) == {"class-ids", "features", "counts"}
    labels = sorted(set(client.data.y_train.tolist()))
    k = len(labels)
    assert 0 < k < C  # a client of a few classes: (K, d) cannot be mistaken for the head's (C, d)
    assert arrays["features"].shape == (k, d) and arrays["features"].dtype == np.float32
    assert arrays["class-ids"].tolist() == labels
    assert arrays["counts"].tolist() == [sum(1 for v in client.data.y_train.tolist() if v == j) for j in labels]
    assert sum(a.size for a in arrays.values() if a.dtype.kind == "f") == k * d  # the LFRs are the only floats
    parameter_shapes = {tuple(v.shape) for v in client.load_model().state_dict().values()}
    assert not {tuple(a.shape) for a in arrays.values()} & parameter_shapes  # no theta_i or phi_i tensor


def test_2_lfr_is_taken_in_eval_mode_without_grad_and_leaves_batchnorm_statistics_alone(tmp_path):
    """With BatchNorm, train-mode and eval-mode features differ: the LFR is the per-class mean of the eval-mode
    features, recomputed here class by class, and taking it neither moves the running statistics nor leaves a
    gradient on any parameter."""
    client = _client(tmp_path, model="resnet8")
    model = client.new_model().train()  # as stage A leaves it
    before = _snapshot(model)
    assert any("running_mean" in k for k in before)
    ids, feats, counts = wire.unpack_class_features(client.lfr_upload(model)[wire.CLASS_FEATURES])
    assert _same(model, before) and all(p.grad is None for p in model.parameters())
    x, y = client.data.x_train, client.data.y_train
    twin = copy.deepcopy(model).eval()
    labels = sorted(set(y.tolist()))
    with torch.no_grad():
        z_eval = twin.body(x)
        z_train = copy.deepcopy(model).train().body(x)
    expected, in_train_mode = [], []
    for j in labels:
        rows = [i for i in range(len(y)) if int(y[i]) == j]
        expected.append(sum(z_eval[i].double() for i in rows) / len(rows))
        in_train_mode.append(z_train[rows].mean(0))
    assert ids.tolist() == labels and counts.tolist() == [int((y == j).sum()) for j in labels]
    assert np.allclose(feats, wire.to_host(torch.stack(expected).float()), atol=1e-5)
    assert not np.allclose(feats, wire.to_host(torch.stack(in_train_mode)), atol=1e-3)  # the mode matters here


def _manual_head_epoch(weight, bias, x, y, lr, batch, generator):
    """One shuffled SGD epoch of mean CE on (x, y), softmax gradient written out by hand (float64)."""
    w, b = torch.tensor(weight, dtype=torch.float64), torch.tensor(bias, dtype=torch.float64)
    for idx in torch.randperm(len(y), generator=generator).split(batch):
        xb, yb = x[idx].double(), y[idx]
        err = torch.softmax(xb @ w.T + b, 1) - F.one_hot(yb, w.shape[0]).double()
        w, b = w - lr * err.T @ xb / len(idx), b - lr * err.mean(0)
    return wire.to_host(w), wire.to_host(b)


def test_8_after_round_0_every_class_present_has_a_gfr_and_phi_g_has_had_exactly_one_epoch():
    strategy = _strategy(num_clients=6)  # client pid holds classes pid, pid + 1: classes 0..6 present, 7..9 not
    assert list(strategy.prepare_targets()) == list(range(6))  # every client, no sampling
    replies = _replies(strategy, 0)
    x, y = _pairs(replies)
    assert len(y) == 12  # two batches of 10 and 2
    w0, b0 = strategy.initial_weights["head.weight"], strategy.initial_weights["head.bias"]
    generator = copy.deepcopy(strategy.torch_generator)
    strategy.aggregate_prepare(replies)
    assert strategy.gfr_mask.tolist() == [True] * 7 + [False] * 3
    assert all(np.abs(strategy.gfr[j]).sum() > 0 for j in range(7)) and not strategy.gfr[7:].any()
    w1, b1 = _manual_head_epoch(w0, b0, x, y, 0.01, 10, generator)
    got = strategy.head.arrays()
    assert np.allclose(got["weight"], w1, atol=1e-6) and np.allclose(got["bias"], b1, atol=1e-6)
    w2, _ = _manual_head_epoch(w1, b1, x, y, 0.01, 10, generator)  # a second epoch would be told apart
    assert not np.allclose(got["weight"], w2, atol=1e-6) and not np.allclose(got["weight"], w0, atol=1e-6)


@pytest.mark.parametrize("k", [4, 6, 8])
def test_9_pat_with_the_fig5_k_labels_per_client_disjoint_and_split_75_25(k):
    """Fig. 5's Pat (m = 20, K of 10 labels): exactly K labels per client, each class held by m K / C clients,
    samples disjoint across clients, each client's split 75/25 up to rounding."""
    from partitions import build_splits, load_dataset

    data = load_dataset("mnist5k", num_clients=20, seed=0)
    splits = build_splits(data, "pathological", 20, 0, {"classes-per-client": k, "train-fraction": 0.75})
    labels = [set(data.y[np.concatenate([s.train, s.test])].tolist()) for s in splits]
    assert [len(ls) for ls in labels] == [k] * 20
    assert [sum(1 for ls in labels if j in ls) for j in range(10)] == [20 * k // 10] * 10
    seen: set = set()
    for s in splits:
        mine = set(np.concatenate([s.train, s.test]).tolist())
        assert len(mine) == len(s.train) + len(s.test) and not mine & seen
        seen |= mine
        assert abs(len(s.train) - 0.75 * len(mine)) < 1
    assert len(seen) <= len(data.y)


def test_11_the_round_accuracy_is_sum_correct_over_sum_n_over_every_client():
    """All clients are asked to evaluate (with the new phi_g); the accuracy is sample-weighted, not the client mean."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # Message() needs them (as the grid's)
    strategy = _strategy(num_clients=3)
    messages = list(strategy.configure_evaluate(1, ArrayRecord(), ConfigRecord(), None))
    assert sorted(m.metadata.dst_node_id for m in messages) == [100, 101, 102]
    assert all(m.content.array_records[GLOBAL_HEAD] is strategy.evaluate_payload(0, 1)[GLOBAL_HEAD] for m in messages)
    scores = {100: (9, 10), 101: (1, 2), 102: (0, 1)}  # (correct, n)
    replies = [Message(RecordDict({wire.METRICS: MetricRecord({
        wire.PARTITION_ID: m.metadata.dst_node_id - 100, wire.NUM_EXAMPLES: scores[m.metadata.dst_node_id][1],
        wire.CORRECT: scores[m.metadata.dst_node_id][0], wire.EVAL_LOSS: 1.0})}), reply_to=m) for m in messages]
    out = strategy.aggregate_evaluate(1, replies)
    assert out["acc-weighted"] == pytest.approx((9 + 1 + 0) / (10 + 2 + 1))
    assert out["acc-client-mean"] == pytest.approx((0.9 + 0.5 + 0.0) / 3)
    assert out["eval-clients"] == 3


@pytest.mark.parametrize("dataset, model, shape, classes, floats", [
    ("fmnist", "dnn", (1, 28, 28), 10, 2_010), ("cifar10", "fedavgcnn", (3, 32, 32), 10, 10_250),
    ("cifar100", "resnet18", (3, 32, 32), 100, 102_500)])
def test_12_the_download_of_each_paper_model_is_the_specs_number_of_floats(dataset, model, shape, classes, floats):
    """Spec section 5's figures: 2Cd + C floats (W_g, b_g, the C x d GFR table) with every class reported."""
    from fedcore.config import Config
    from fedcore.models import model_facts
    from fedstrategies.base import ClientInfo
    from fedstrategies.fedfcd import FedFCDStrategy

    counts = np.full(classes, 3, np.int64)
    clients = {0: ClientInfo(0, 100, int(counts.sum()), 10, counts, counts)}
    cfg = Config.from_run_config({"method": "fedfcd", "dataset": dataset, "model": model,
                                  "fedfcd.gfr-download": "all"})
    strategy = FedFCDStrategy(cfg, clients, model_facts(model, shape, classes, 0))
    d = strategy.model.feature_dim
    strategy.aggregate(0, [_reply(strategy, 0, np.ones((classes, d), np.float32))])
    payload = strategy.train_payload(0, 1)
    sent = sum(a.size for r in payload.values() for a in wire.unpack_arrays(r).values() if a.dtype.kind == "f")
    assert sent == floats
