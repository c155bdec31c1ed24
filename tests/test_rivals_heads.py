"""FedGH, FedRoD and GPFL: each defining rule against a second route (closed-form gradients, the
balanced-softmax formula, the conditional valve written out), what each message carries, which model
is evaluated and what the clients keep between rounds. Pure rules and single clients are tested
directly (fast); the wire through one in-process federation per method (digits, 3 clients)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from clients.base import ClientEnv
from clients.batch_metrics import mean_loss
from clients.fedgh import FedGHClient
from clients.fedrod import PERSONAL_HEAD, FedRoDClient, balanced_softmax_loss, generic_logits
from clients.gpfl import (GPFLClient, angle_guidance_loss, conditional_inputs, magnitude_guidance_loss)
from clients.training import evaluate_model
from fedcore import wire
from fedcore.config import Config, ConfigError
from fedcore.methods.fedgh import GLOBAL_HEAD
from fedcore.methods.fedrod import GENERIC_ACC, PERSONAL_LOSS
from fedcore.methods.gpfl import GCE_LOSS, MAGNITUDE_LOSS
from fedcore.conditional_valve import CoV, GPFLModules, initial_module_weights
from fedcore.models import model_facts, seeded_model
from fedstrategies.base import ClientInfo, ClientReply
from fedstrategies.fedgh import FedGHStrategy
from fedstrategies.fedrod import FedRoDStrategy
from fedstrategies.gpfl import GPFLStrategy
from tests.conftest import small_config

C = 10


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# ====================================================================== helpers
def _cfg(tmp_path, method, **overrides) -> Config:
    return Config.from_run_config(small_config(tmp_path, method=method, **overrides))


def _client(cls, tmp_path, method, state=None, server_round=1, **overrides):
    env = ClientEnv(_cfg(tmp_path, method, **overrides), pid=0, num_clients=3,
                    state=RecordDict() if state is None else state, server_round=server_round)
    return cls(env)


def _clients(num_clients=4) -> dict[int, ClientInfo]:
    """Client pid holds classes pid and pid + 1 (30 + pid and 20 samples)."""
    out = {}
    for pid in range(num_clients):
        counts = np.zeros(C, np.int64)
        counts[[pid % C, (pid + 1) % C]] = [30 + pid, 20]
        out[pid] = ClientInfo(pid, 100 + pid, int(counts.sum()), 10, counts, counts // 3)
    return out


def _strategy(cls, method, num_clients=4, **hp):
    run = {"method": method, "dataset": "mnist5k", "model": "dnn", **{f"{method}.{k}": v for k, v in hp.items()}}
    return cls(Config.from_run_config(run), _clients(num_clients), model_facts("dnn", (1, 28, 28), C, 0))


def _lar_reply(strategy, pid, feats, ids=None) -> ClientReply:
    counts = strategy.clients[pid].train_label_counts
    ids = np.flatnonzero(counts) if ids is None else np.asarray(ids)
    arrays = {"class-ids": ids, "features": np.asarray(feats, np.float32), "counts": np.maximum(counts[ids], 5)}
    return ClientReply(pid, 100 + pid, int(counts.sum()), {}, {wire.CLASS_FEATURES: arrays})


def _keys(record) -> set[str]:
    return set(wire.unpack_arrays(record))


def _softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


# ====================================================================== FedGH
def test_fedgh_server_steps_equal_closed_form_cross_entropy_gradients_one_lar_per_step():
    """theta <- theta - eta (softmax(W r + b) - e_s) [r; 1]^T for each LAR r of class s in the shuffled order."""
    strategy = _strategy(FedGHStrategy, "fedgh", num_clients=4, **{"server-lr": 0.5})
    rng = np.random.default_rng(0)
    replies = [_lar_reply(strategy, pid, rng.standard_normal((2, 100))) for pid in strategy.clients]
    x = np.concatenate([r.arrays[wire.CLASS_FEATURES]["features"] for r in replies]).astype(np.float64)
    y = np.concatenate([r.arrays[wire.CLASS_FEATURES]["class-ids"] for r in replies])
    w = strategy.initial_weights["head.weight"].astype(np.float64)
    b = strategy.initial_weights["head.bias"].astype(np.float64)
    g = torch.Generator()
    g.set_state(strategy.torch_generator.get_state())
    order = torch.randperm(len(y), generator=g).tolist()
    metrics = strategy.aggregate(1, replies)
    for i in order:  # batch 1: one step per (client, class) LAR
        err = _softmax((x[i] @ w.T + b)[None])[0]
        err[y[i]] -= 1.0
        w, b = w - 0.5 * np.outer(err, x[i]), b - 0.5 * err
    got = strategy.head.arrays()
    assert np.allclose(got["weight"], w, atol=1e-5) and np.allclose(got["bias"], b, atol=1e-5)
    assert metrics["head-pairs"] == 8 and metrics["head-loss-after"] < metrics["head-loss-before"]


def test_fedgh_batched_server_step_is_the_mean_gradient_and_the_head_persists_across_rounds():
    strategy = _strategy(FedGHStrategy, "fedgh", num_clients=3, **{"server-lr": 0.1, "server-batch-size": 6})
    rng = np.random.default_rng(1)
    replies = [_lar_reply(strategy, pid, rng.standard_normal((2, 100))) for pid in strategy.clients]
    x = np.concatenate([r.arrays[wire.CLASS_FEATURES]["features"] for r in replies]).astype(np.float64)
    y = np.concatenate([r.arrays[wire.CLASS_FEATURES]["class-ids"] for r in replies])
    metrics = strategy.aggregate(1, replies)  # 6 pairs, batch 6: one step on the mean gradient
    assert metrics["head-batch-loss"] == pytest.approx(metrics["head-loss-before"], rel=1e-6)  # its only batch
    w0 = strategy.initial_weights["head.weight"].astype(np.float64)
    b0 = strategy.initial_weights["head.bias"].astype(np.float64)
    err = _softmax(x @ w0.T + b0)
    err[np.arange(6), y] -= 1.0
    w1, b1 = w0 - 0.1 * err.T @ x / 6, b0 - 0.1 * err.mean(0)
    assert np.allclose(strategy.head.arrays()["weight"], w1, atol=1e-6)
    assert np.allclose(strategy.head.arrays()["bias"], b1, atol=1e-6)
    # round 2 starts from round 1's head (not the initial one), and a checkpoint brings it back exactly
    saved, round_1 = strategy.state_dict(), strategy.head.arrays()
    strategy.aggregate(2, replies)
    err = _softmax(x @ w1.T + b1)
    err[np.arange(6), y] -= 1.0
    assert np.allclose(strategy.head.arrays()["weight"], w1 - 0.1 * err.T @ x / 6, atol=1e-5)
    other = _strategy(FedGHStrategy, "fedgh", num_clients=3, **{"server-lr": 0.1, "server-batch-size": 6})
    other.train_payload(0, 1)  # packs the initial head; loading a state must drop that record
    other.load_state_dict(saved)
    assert np.array_equal(other.head.arrays()["weight"], round_1["weight"])
    assert np.array_equal(wire.unpack_arrays(other.train_payload(0, 3)[GLOBAL_HEAD])["weight"], round_1["weight"])


def test_fedgh_payloads_schema_and_checks():
    strategy = _strategy(FedGHStrategy, "fedgh", num_clients=3)
    for payload in (strategy.train_payload(0, 1), strategy.evaluate_payload(1, 1)):
        assert list(payload) == [GLOBAL_HEAD]
        head = wire.unpack_arrays(payload[GLOBAL_HEAD])
        assert np.array_equal(head["weight"], strategy.initial_weights["head.weight"])
        assert np.array_equal(head["bias"], strategy.initial_weights["head.bias"])
    assert strategy.train_payload(0, 1)[GLOBAL_HEAD] is strategy.train_payload(2, 1)[GLOBAL_HEAD]  # packed once
    assert set(strategy.train_payload(0, 1)[GLOBAL_HEAD]) == {"weight", "bias"}  # compact: one raw Array each
    assert strategy.reply_schema(0) == {wire.CLASS_FEATURES: dict(wire.CLASS_FEATURES_SCHEMA)}
    good = _lar_reply(strategy, 1, np.ones((2, 100)))
    assert strategy.check_reply(good) is None
    assert "not the client's classes" in strategy.check_reply(_lar_reply(strategy, 1, np.ones((2, 100)), ids=[1, 5]))
    assert "feature dimension" in strategy.check_reply(_lar_reply(strategy, 1, np.ones((2, 7))))
    strategy.aggregate(1, [good])
    assert not np.array_equal(wire.unpack_arrays(strategy.train_payload(0, 2)[GLOBAL_HEAD])["weight"],
                              strategy.initial_weights["head.weight"])  # the new head goes down


def test_fedgh_client_trains_under_the_global_head_uploads_lars_and_keeps_only_its_extractor(tmp_path):
    client = _client(FedGHClient, tmp_path, "fedgh")
    initial = client.new_model()
    rng = np.random.default_rng(0)
    head = {"weight": rng.standard_normal((C, initial.feature_dim)).astype(np.float32),
            "bias": rng.standard_normal(C).astype(np.float32)}
    content = RecordDict({GLOBAL_HEAD: wire.pack_arrays(head)})
    assert torch.equal(client.model_with_global_head(content).head.weight,
                       wire.to_device(head["weight"], client.env.device))
    # one SGD step on the whole batch from (initial extractor, received head) = what fit does
    n = client.data.num_train
    client.cfg = client.env.cfg = _cfg(tmp_path, "fedgh", **{"local-steps": 1, "batch-size": 10 * n})
    manual = client.model_with_global_head(content)
    manual.train()
    loss = F.cross_entropy(manual(client.data.x_train), client.data.y_train)
    grads = torch.autograd.grad(loss, list(manual.parameters()))
    records, metrics = client.fit(content)
    assert metrics[wire.TRAIN_LOSS] == pytest.approx(float(loss), rel=1e-5)
    trained = client.load_model()
    for (name, p), gr in zip(manual.named_parameters(), grads):
        assert torch.allclose(trained.state_dict()[name], p.detach() - 0.05 * gr, atol=1e-6), name
    # the LARs: per-class means of the trained extractor over the whole training set, in eval mode
    ids, feats, counts = wire.unpack_class_features(records[wire.CLASS_FEATURES])
    x, y = client.data.x_train, client.data.y_train
    with torch.no_grad():
        expected = torch.stack([trained.eval().body(x[y == j]).mean(0) for j in ids])
    assert np.allclose(feats, wire.to_host(expected), atol=1e-6) and counts.tolist() == [int((y == j).sum()) for j in ids]
    assert list(records) == [wire.CLASS_FEATURES]
    # next round: the kept extractor, under the new global head (its own trained head is discarded)
    later = _client(FedGHClient, tmp_path, "fedgh", state=client.env.state, server_round=2)
    zero = {"weight": np.zeros_like(head["weight"]), "bias": np.eye(C, dtype=np.float32)[3]}
    model = later.model_with_global_head(RecordDict({GLOBAL_HEAD: wire.pack_arrays(zero)}))
    assert all(torch.equal(a, b) for a, b in zip(model.body.state_dict().values(), trained.body.state_dict().values()))
    result = later.evaluate(RecordDict({GLOBAL_HEAD: wire.pack_arrays(zero)}))
    assert result.correct == int((later.data.y_test == 3).sum())  # the global head decides, bias on class 3


# ====================================================================== FedRoD
def test_fedrod_balanced_softmax_equals_its_formula_on_three_classes():
    """L = -log( n_y e^{g_y} / sum_c n_c e^{g_c} ), counts (6, 2, 1); and a class with n_c = 0 gets
    probability 0 and no gradient, while the loss stays finite."""
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.3, -1.0, 2.0], [0.0, 0.0, 0.0]], dtype=torch.float64,
                          requires_grad=True)
    y = torch.tensor([0, 1, 2])
    counts = torch.tensor([6, 2, 1])
    n = np.array([6.0, 2.0, 1.0])
    z = wire.to_host(logits).astype(np.float64)
    by_hand = np.mean([-math.log(n[t] * math.exp(z[i, t]) / sum(n[c] * math.exp(z[i, c]) for c in range(3)))
                       for i, t in enumerate(y.tolist())])
    loss = balanced_softmax_loss(logits, y, counts)
    assert float(loss) == pytest.approx(by_hand, rel=1e-12)  # log n in the logits' own precision
    # the gradient: (q - e_y) / B with q_c proportional to n_c e^{g_c}
    q = n * np.exp(z)
    q /= q.sum(1, keepdims=True)
    q[np.arange(3), wire.to_host(y)] -= 1
    (grad,) = torch.autograd.grad(loss, logits)
    assert np.allclose(wire.to_host(grad), q / 3, atol=1e-6)
    # equal counts: plain cross-entropy; a missing class: finite loss, zero gradient on its logit
    assert float(balanced_softmax_loss(logits, y, torch.tensor([4, 4, 4]))) == pytest.approx(
        float(F.cross_entropy(logits, y)), rel=1e-6)
    zero = balanced_softmax_loss(logits[:2], y[:2], torch.tensor([3, 1, 0]))
    (grad,) = torch.autograd.grad(zero, logits)
    assert math.isfinite(float(zero)) and torch.all(grad[:, 2] == 0) and torch.isfinite(grad).all()
    assert float(zero) < float(F.cross_entropy(logits[:2, :2], y[:2]) + 1.0)


@pytest.mark.parametrize("generic_loss", ["bsm", "ce"])
def test_fedrod_one_step_is_bsm_on_the_generic_model_and_ce_of_summed_logits_on_the_personal_head(tmp_path,
                                                                                                  generic_loss):
    client = _client(FedRoDClient, tmp_path, "fedrod", **{"fedrod.generic-loss": generic_loss})
    n = client.data.num_train
    client.cfg = client.env.cfg = _cfg(tmp_path, "fedrod", **{"local-steps": 1, "batch-size": 10 * n,
                                                              "fedrod.generic-loss": generic_loss})
    generic = client.new_model()
    with torch.no_grad():  # a generic model and personal head unlike the initial ones
        for p in generic.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())).to(p.device))
    personal = client.new_model().head
    with torch.no_grad():
        personal.bias.copy_(torch.arange(C, dtype=torch.float32) / 10)
    client.env.save_module(PERSONAL_HEAD, personal)
    content = RecordDict({wire.WEIGHTS: wire.pack_arrays(generic.state_dict())})
    x, y = client.data.x_train, client.data.y_train
    generic.train()
    z = generic.features(x)
    g = generic.head(z)
    counts = torch.as_tensor(client.data.train_label_counts, device=client.env.device)
    gen_loss = F.cross_entropy(g + counts.float().log(), y) if generic_loss == "bsm" else F.cross_entropy(g, y)
    gen_grads = torch.autograd.grad(gen_loss, list(generic.parameters()))
    own = F.cross_entropy(g.detach() + personal(z.detach()), y)
    own_grads = torch.autograd.grad(own, list(personal.parameters()))
    records, metrics = client.fit(content)
    up = wire.unpack_arrays(records[wire.WEIGHTS])
    assert set(up) == set(generic.state_dict())  # the whole generic model goes up, no personal head
    for (name, p), gr in zip(generic.named_parameters(), gen_grads):
        assert np.allclose(up[name], wire.to_host((p.detach() - 0.05 * gr)), atol=1e-6), name
    kept = client.personal_head()
    for (name, p), gr in zip(personal.named_parameters(), own_grads):
        assert torch.allclose(kept.state_dict()[name], p.detach() - 0.05 * gr, atol=1e-6), name
    assert metrics[wire.TRAIN_LOSS] == pytest.approx(float(gen_loss), rel=1e-5)
    assert metrics[wire.METHOD_METRIC_PREFIX + PERSONAL_LOSS] == pytest.approx(float(own), rel=1e-5)


def test_fedrod_evaluates_the_summed_logits_and_reports_the_generic_model_alone(tmp_path):
    client = _client(FedRoDClient, tmp_path, "fedrod")
    generic = client.new_model()
    assert torch.equal(client.personal_head().weight, generic.head.weight)  # first round: the seeded initial head
    personal = client.new_model().head
    y0 = int(client.data.y_test[0])
    with torch.no_grad():
        personal.weight.zero_()
        personal.bias.copy_(torch.eye(C)[4] * 1e4)  # a personal head that always says 4
        generic.head.bias.copy_(torch.eye(C)[y0] * 1e3)  # a generic model that says y0, outvoted in the sum
    client.env.save_module(PERSONAL_HEAD, personal)
    content = RecordDict({wire.WEIGHTS: wire.pack_arrays(generic.state_dict())})
    result = client.evaluate(content)
    y = client.data.y_test
    assert result.correct == int((y == 4).sum()) and result.num_examples == len(y)
    _, generic_correct, _ = evaluate_model(generic, client.data.x_test, y)
    assert generic_correct > 0 and result.metrics[GENERIC_ACC] == pytest.approx(generic_correct / len(y))
    with torch.no_grad():
        s = generic.eval().head(generic.body(client.data.x_test)) + personal(generic.body(client.data.x_test))
    assert result.loss == pytest.approx(float(F.cross_entropy(s, y)), rel=1e-5)
    ones = torch.ones(2, generic.feature_dim, device=client.env.device)
    assert torch.equal(generic_logits(generic, ones), generic.head(ones))
    # a client with one test sample: its generic accuracy is 0 or 1
    one = dataclasses.replace(client.data, x_test=client.data.x_test[:1], y_test=client.data.y_test[:1])
    client.data = client.env.data = one
    assert client.evaluate(content).metrics[GENERIC_ACC] == 1.0


def test_fedrod_generic_logits_use_the_models_own_decision_module():
    """On a model with dropout before its head (protocnn), g is ``classify`` (dropout in training)."""
    model = seeded_model("protocnn", (1, 28, 28), C, 0).train()
    z = torch.ones(4, model.feature_dim)
    torch.manual_seed(5)
    g = generic_logits(model, z)
    torch.manual_seed(5)
    assert torch.equal(g, model.classify(z)) and not torch.equal(g, model.head(z))


def test_batch_losses_are_reported_as_their_mean():
    assert mean_loss([torch.tensor(1.0), torch.tensor(4.0)]) == 2.5
    assert mean_loss([torch.tensor(3.0)]) == 3.0 and mean_loss([]) == 0.0


# ====================================================================== GPFL
def test_gpfl_conditional_inputs_are_the_plain_and_the_class_share_weighted_embedding_means():
    w = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.0, 4.0]])
    g, p = conditional_inputs(w, torch.tensor([2, 0, 1]))
    assert torch.allclose(g, torch.tensor([4 / 3, 5 / 3]))
    assert torch.allclose(p, (2 * w[0] + w[2]) / 3)
    g64, p64 = conditional_inputs(w.double(), torch.tensor([2, 0, 1]))  # the shares take the embeddings' dtype
    assert p64.dtype == torch.float64 and torch.allclose(p64, (2 * w[0] + w[2]).double() / 3)


def test_gpfl_conditional_valve_written_out_in_numpy():
    """CoV(f, c) = ReLU(f * (LN(ReLU(A c + a)) + 1) + LN(ReLU(B c + b'))), LayerNorm with its affine terms."""
    torch.manual_seed(0)
    cov = CoV(4)
    with torch.no_grad():
        for ln in (cov.gamma[2], cov.beta[2]):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.2, 0.2)
    f = torch.randn(3, 4)
    c = torch.randn(4)
    out = wire.to_host(cov(f, c)).astype(np.float64)

    def branch(seq):
        lin, ln = seq[0], seq[2]
        h = np.maximum(wire.to_host(lin.weight) @ wire.to_host(c) + wire.to_host(lin.bias), 0.0).astype(np.float64)
        h = (h - h.mean()) / np.sqrt(h.var() + ln.eps)
        return h * wire.to_host(ln.weight) + wire.to_host(ln.bias)

    expected = np.maximum(wire.to_host(f) * (branch(cov.gamma) + 1) + branch(cov.beta), 0.0)
    assert np.allclose(out, expected, atol=1e-5)
    # the personalised and the global routes differ only by their conditional input
    assert not np.allclose(wire.to_host(cov(f, c)), wire.to_host(cov(f, -c)))


def test_gpfl_angle_and_magnitude_guidance_equal_their_formulas():
    rng = np.random.default_rng(0)
    f = rng.standard_normal((4, 3))
    w = rng.standard_normal((5, 3))
    y = np.array([0, 3, 3, 1])
    cos = (f / np.linalg.norm(f, axis=1, keepdims=True)) @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
    by_hand = np.mean([-(cos[i, y[i]] - np.log(np.exp(cos[i]).sum())) for i in range(4)])
    tf, tw, ty = torch.tensor(f), torch.tensor(w), torch.tensor(y)
    assert float(angle_guidance_loss(tf, tw, ty)) == pytest.approx(by_hand, rel=1e-9)
    assert float(magnitude_guidance_loss(tf, tw[ty], 0.3)) == pytest.approx(
        0.3 * math.sqrt(((f - w[y]) ** 2).sum()), rel=1e-9)


def _gpfl_content(client, seed=0):
    """A received global model: the seeded initial body and GCE/CoV seeded by ``seed``."""
    model = client.new_model()
    weights = {k: wire.to_host(v) for k, v in model.state_dict().items() if k.startswith("body.")}
    modules = initial_module_weights(model.feature_dim, C, seed)
    return RecordDict({wire.WEIGHTS: wire.pack_arrays({**weights, **modules})}), weights, modules


def test_gpfl_one_step_is_sgd_on_the_three_losses_with_weight_decay_mu_on_gce_and_cov(tmp_path):
    client = _client(GPFLClient, tmp_path, "gpfl")
    n = client.data.num_train
    hp = {"gpfl.lambda": 0.5, "gpfl.mu": 0.2}
    client.cfg = client.env.cfg = _cfg(tmp_path, "gpfl", **{"local-steps": 1, "batch-size": 10 * n, **hp})
    client.hp = client.env.hp = client.cfg.hparams()
    content, body, mods = _gpfl_content(client)
    model = client.new_model()
    modules = GPFLModules(model.feature_dim, C).to(client.env.device)
    modules.load_state_dict({k: torch.from_numpy(v) for k, v in mods.items()})
    x, y = client.data.x_train, client.data.y_train
    w0 = modules.gce.weight.detach().clone()
    counts = torch.as_tensor(client.data.train_label_counts, device=client.env.device).float()
    g, p = w0.mean(0), (counts / counts.sum()) @ w0
    model.train()
    f = model.features(x)
    ce = F.cross_entropy(model.head(modules.cov(f, p)), y)
    fg = modules.cov(f, g)
    angle = F.cross_entropy(F.normalize(fg) @ F.normalize(modules.gce.weight).T, y)
    magnitude = 0.5 * torch.sqrt(((fg - w0[y]) ** 2).sum())
    params = list(model.named_parameters()) + list(modules.named_parameters())
    grads = torch.autograd.grad(ce + angle + magnitude, [q for _, q in params])
    records, metrics = client.fit(content)
    up = wire.unpack_arrays(records[wire.WEIGHTS])
    assert set(up) == set(body) | set(mods)  # body, GCE and CoV go up; never the head
    kept = client.load_model()
    for (name, q), gr in zip(params, grads):
        decay = 0.2 * q.detach() if name.startswith(("gce.", "cov.")) else 0.0
        expected = q.detach() - 0.05 * (gr + decay)
        got = wire.to_device(up[name], client.env.device) if name in up else kept.state_dict()[name]
        assert torch.allclose(got, expected, atol=1e-5), name
    assert not torch.equal(kept.head.weight, model.head.weight)  # the personal head trained and was kept
    assert metrics[wire.TRAIN_LOSS] == pytest.approx(float(ce + angle + magnitude), rel=1e-5)
    assert metrics[wire.METHOD_METRIC_PREFIX + GCE_LOSS] == pytest.approx(float(angle), rel=1e-5)
    assert metrics[wire.METHOD_METRIC_PREFIX + MAGNITUDE_LOSS] == pytest.approx(float(magnitude), rel=1e-5)


def test_gpfl_evaluates_its_personal_head_on_the_personalised_route(tmp_path):
    client = _client(GPFLClient, tmp_path, "gpfl")
    content, body, mods = _gpfl_content(client, seed=3)
    personal = client.new_model()
    with torch.no_grad():
        personal.head.weight.copy_(torch.randn(personal.head.weight.shape,
                                               generator=torch.Generator().manual_seed(1)))
        for q in personal.body.parameters():  # a stale body in state: the received global one must be used
            q.zero_()
    client.save_model(personal)
    result = client.evaluate(content)
    model = client.new_model()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in body.items()}, strict=False)
    modules = GPFLModules(model.feature_dim, C).to(client.env.device)
    modules.load_state_dict({k: torch.from_numpy(v) for k, v in mods.items()})
    counts = torch.as_tensor(client.data.train_label_counts, device=client.env.device).float()
    p = (counts / counts.sum()) @ modules.gce.weight
    with torch.no_grad():
        logits = personal.head(modules.cov(model.eval().body(client.data.x_test), p))
    y = client.data.y_test
    assert result.correct == int((logits.argmax(1) == y).sum())
    assert result.loss == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-5)


def test_gpfl_frozen_embeddings_and_conditional_inputs_do_not_follow_the_gce_being_trained(tmp_path):
    client = _client(GPFLClient, tmp_path, "gpfl")
    content, _, mods = _gpfl_content(client)
    _, modules = client.received(content)
    frozen, g, p = client.conditions(modules)
    w = wire.to_device(mods["gce.weight"], client.env.device)
    counts = torch.as_tensor(client.data.train_label_counts, device=client.env.device).float()
    assert torch.equal(frozen, w) and torch.allclose(g, w.mean(0)) and torch.allclose(p, counts @ w / counts.sum())
    with torch.no_grad():
        modules.gce.weight.add_(1.0)  # a training step on the GCE
    assert torch.equal(frozen, w) and torch.allclose(g, w.mean(0))


def test_gpfl_client_refuses_tensors_it_does_not_have_and_modules_do_not_touch_the_global_rng(tmp_path):
    client = _client(GPFLClient, tmp_path, "gpfl")
    content, body, mods = _gpfl_content(client)
    head = {k: wire.to_host(v) for k, v in client.new_model().state_dict().items() if k.startswith("head.")}
    with pytest.raises(ValueError, match="head.weight"):
        client.received(RecordDict({wire.WEIGHTS: wire.pack_arrays({**body, **mods, **head})}))
    state = torch.get_rng_state()
    initial_module_weights(8, 3, 0)
    assert torch.equal(state, torch.get_rng_state())


def test_gpfl_server_averages_body_gce_and_cov_by_size_and_never_holds_a_head():
    strategy = _strategy(GPFLStrategy, "gpfl", num_clients=2)
    keys = set(strategy.global_weights)
    assert {k for k in keys if not k.startswith("body.")} == set(initial_module_weights(100, C, 0))
    assert not any(k.startswith("head.") for k in keys)
    assert "gce.weight" in keys and strategy.global_weights["gce.weight"].shape == (C, 100)
    assert np.array_equal(initial_module_weights(100, C, 0)["gce.weight"], strategy.global_weights["gce.weight"])
    assert not np.array_equal(initial_module_weights(100, C, 1)["gce.weight"], strategy.global_weights["gce.weight"])
    ups = [{k: np.full_like(v, float(pid + 1)) for k, v in strategy.global_weights.items()} for pid in range(2)]
    replies = [ClientReply(pid, 100 + pid, n, {}, {wire.WEIGHTS: ups[pid]}) for pid, n in ((0, 30), (1, 10))]
    strategy.aggregate(1, replies)
    for key, value in strategy.global_weights.items():
        assert np.allclose(value, (30 * 1 + 10 * 2) / 40), key
    assert _keys(strategy.train_payload(0, 2)[wire.WEIGHTS]) == keys
    assert _keys(strategy.evaluate_payload(1, 2)[wire.WEIGHTS]) == keys


# ====================================================================== options
@pytest.mark.parametrize("key, value", [("fedgh.server-lr", 0.0), ("fedgh.server-batch-size", 0),
                                        ("fedgh.server-epochs", 0), ("fedrod.generic-loss", "focal"),
                                        ("gpfl.lambda", -1.0), ("gpfl.mu", -0.1)])
def test_bad_options_are_config_errors_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key.split(".")[1]):
        Config.from_run_config({"method": key.split(".")[0], key: value})


def test_defaults_are_the_sources():
    assert _strategy(FedGHStrategy, "fedgh").hp == {"server-lr": 0.01, "server-batch-size": 1, "server-epochs": 1}
    assert _strategy(FedRoDStrategy, "fedrod").hp == {"generic-loss": "bsm"}
    assert _strategy(GPFLStrategy, "gpfl").hp == {"lambda": 0.01, "mu": 0.1}
