"""Per-FedAvg, pFedMe, L2GD and FedNova: each defining rule against a second route (an explicit
second-order step, the closed-form proximal point, the expectation over L2GD's coin, FedNova's formula
written out), what each message carries, which model is evaluated and what clients keep between rounds.
Pure rules and single clients are tested directly (fast); the wire through one in-process federation
per method (digits, 3 clients) is in tests/test_rivals_optim_wire.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict
from torch.func import functional_call

from clients.base import ClientEnv
from clients.fednova import FedNovaClient
from clients.l2gd import LOCAL, L2GDClient, pull_towards
from clients.per_fedavg import ADAPT_TAG, PerFedAvgClient, gradient_fn, hessian_vector, meta_step
from clients.pfedme import PERSONAL, PFedMeClient, local_step, personal_solve
from clients.training import batch_stream, evaluate_model
from fedcore import wire
from fedcore.config import Config, ConfigError
from fedcore.methods.fednova import A_NORM, EPOCHS, LOCAL_STEPS, NORMALIZER, example_reply
from fedcore.methods.l2gd import AVERAGING_STEPS, LOCAL_STEPS as L2GD_LOCAL_STEPS, PULL
from fedcore.methods.pfedme import UPLOAD
from fedcore.methods.fednova import effective_steps
from fedcore.models import model_facts
from fedstrategies.base import ArraySpec, ClientInfo, ClientReply
from fedstrategies.fednova import FedNovaStrategy, normalized_average
from fedstrategies.l2gd import L2GDStrategy, averaging_pull, round_schedule
from fedstrategies.per_fedavg import PerFedAvgStrategy
from fedstrategies.pfedme import PFedMeStrategy, beta_mix
from tests.conftest import small_config, test_device

C = 10


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# ====================================================================== helpers
def _cfg(tmp_path, method, **overrides) -> Config:
    return Config.from_run_config(small_config(tmp_path, method=method, model="mlr", **overrides))


def _env(tmp_path, method, state=None, server_round=1, config=None, **overrides) -> ClientEnv:
    return ClientEnv(_cfg(tmp_path, method, **overrides), pid=0, num_clients=3,
                     state=RecordDict() if state is None else state, server_round=server_round,
                     config={wire.SERVER_ROUND: server_round, wire.PHASE: "train", **(config or {})})


def _clients(sizes=(100, 100, 100, 100)) -> dict[int, ClientInfo]:
    infos = {}
    for pid, n in enumerate(sizes):
        counts = np.zeros(C, np.int64)
        counts[[pid % C, (pid + 1) % C]] = [n - n // 2, n // 2]
        infos[pid] = ClientInfo(pid, 100 + pid, n, 30, counts, counts // 3)
    return infos


def _strategy(cls, tmp_path, method, sizes=(100, 100, 100, 100), **overrides):
    cfg = _cfg(tmp_path, method, **overrides)
    return cls(cfg, _clients(sizes), model_facts("mlr", (1, 8, 8), C, 0))


def _reply(pid, n, weights, **records) -> ClientReply:
    return ClientReply(pid, 100 + pid, n, {}, {wire.WEIGHTS: weights, **records})


def _shift(weights, by: float) -> dict[str, np.ndarray]:
    return {k: (v + by).astype(v.dtype) if v.dtype.kind == "f" else v for k, v in weights.items()}


def _weights_content(model) -> RecordDict:
    return RecordDict({wire.WEIGHTS: wire.pack_arrays(model.state_dict())})


def _vector(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _received(weights) -> dict[str, torch.Tensor]:
    """The uploaded tensors on the session's device, beside the client's own."""
    return {k: wire.to_device(v, test_device()) for k, v in wire.unpack_arrays(weights).items()}


# quadratics f_b(w) = 1/2 w'A_b w - b_b'w, one per batch index: a second route with explicit Hessians
def _quadratics(dim=4, count=3, seed=0):
    rng = np.random.default_rng(seed)
    mats, vecs = [], []
    for _ in range(count):
        m = rng.standard_normal((dim, dim))
        mats.append(torch.as_tensor(m @ m.T + dim * np.eye(dim)))
        vecs.append(torch.as_tensor(rng.standard_normal(dim)))
    return mats, vecs


def _quadratic_grad(mats, vecs):
    def grad_at(values, batch):
        (w,) = values
        return [mats[batch] @ w - vecs[batch]], 0.5 * w @ mats[batch] @ w - vecs[batch] @ w

    return grad_at


# ====================================================================== Per-FedAvg
def test_hessian_free_meta_step_equals_the_explicit_second_order_step_on_a_quadratic():
    """w - beta (I - alpha H(D'')) grad f(w - alpha grad f(w; D); D'), with H = A'' written out."""
    (a1, a2, a3), (b1, b2, _) = mats, vecs = _quadratics()
    w = torch.as_tensor(np.arange(4.0) - 1.5)
    alpha, beta = 0.05, 0.1
    w_tilde = w - alpha * (a1 @ w - b1)
    outer = a2 @ w_tilde - b2
    exact = w - beta * (torch.eye(4, dtype=torch.float64) - alpha * a3) @ outer
    first_order = w - beta * outer
    hf, loss = meta_step([w], _quadratic_grad(mats, vecs), [0, 1, 2], alpha, beta, "hf", 1e-3)
    fo, _ = meta_step([w], _quadratic_grad(mats, vecs), [0, 1, 2], alpha, beta, "fo", 1e-3)
    assert torch.allclose(hf[0], exact, atol=1e-10)
    assert torch.allclose(fo[0], first_order, atol=1e-12)
    assert not torch.allclose(hf[0], fo[0], atol=1e-3)  # the Hessian term matters here
    assert float(loss) == pytest.approx(float(0.5 * w_tilde @ a2 @ w_tilde - b2 @ w_tilde))
    with pytest.raises(ValueError, match="variant"):
        meta_step([w], _quadratic_grad(mats, vecs), [0, 1, 2], alpha, beta, "so", 1e-3)


def test_gradient_fn_is_the_models_own_gradient_at_other_values_and_leaves_it_untouched():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    x, y = torch.randn(12, 5), torch.randint(0, 3, (12,))
    before = [p.detach().clone() for p in model.parameters()]
    values = [p.detach() + 0.1 * torch.randn_like(p) for p in model.parameters()]
    idx = torch.tensor([0, 3, 5, 7])
    grads, loss = gradient_fn(model, x, y)(values, idx)
    twin = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    with torch.no_grad():
        for p, v in zip(twin.parameters(), values):
            p.copy_(v)
    ref = F.cross_entropy(twin(x[idx]), y[idx])
    ref.backward()
    assert float(loss) == pytest.approx(float(ref.detach()))
    assert all(torch.allclose(g, p.grad, atol=1e-6) for g, p in zip(grads, twin.parameters()))
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def _exact_maml_step(model, x, y, batches, alpha, beta):
    """The second-order MAML step by double backpropagation (no finite difference)."""
    names = [n for n, _ in model.named_parameters()]
    w = [p.detach().clone().requires_grad_(True) for p in model.parameters()]

    def loss(values, idx):
        return F.cross_entropy(functional_call(model, dict(zip(names, values)), (x[idx],)), y[idx])

    g = torch.autograd.grad(loss(w, batches[0]), w)
    w_tilde = [(wi - alpha * gi).detach().requires_grad_(True) for wi, gi in zip(w, g)]
    outer = [o.detach() for o in torch.autograd.grad(loss(w_tilde, batches[1]), w_tilde)]
    inner = torch.autograd.grad(loss(w, batches[2]), w, create_graph=True)
    hvp = torch.autograd.grad(sum((gi * o).sum() for gi, o in zip(inner, outer)), w)
    return [wi.detach() - beta * (o - alpha * h) for wi, o, h in zip(w, outer, hvp)]


@pytest.mark.parametrize("variant", ["hf", "fo"])
def test_per_fedavg_client_takes_the_meta_step_on_three_fresh_batches(tmp_path, variant):
    """One meta-step (local-steps=1) from the received model: 'hf' equals the exact second-order step up to
    the finite difference's error; 'fo' is the same without the Hessian term."""
    alpha, beta = 0.5, 0.1
    client = PerFedAvgClient(_env(tmp_path, "per-fedavg", **{"local-steps": 1, "lr": beta, "per-fedavg.alpha": alpha,
                                                              "per-fedavg.variant": variant, "per-fedavg.delta": 0.01}))
    model = client.new_model()
    records, metrics = client.fit(_weights_content(model))
    got = _received(records[wire.WEIGHTS])
    data = client.data
    stream = batch_stream(data.num_train, 16, client.env.generator(), client.env.device)
    batches = [next(stream) for _ in range(3)]
    assert len({tuple(b.tolist()) for b in batches}) == 3  # D, D', D'' are different batches
    exact = _exact_maml_step(model, data.x_train, data.y_train, batches, alpha, beta)
    names = [n for n, _ in model.named_parameters()]
    if variant == "hf":
        for n, e in zip(names, exact):
            assert torch.allclose(got[n], e, atol=2e-6), n  # the Hessian term itself is about 8e-3 here
    else:
        assert not all(torch.allclose(got[n], e, atol=1e-5) for n, e in zip(names, exact))
        w = [p.detach() for p in model.parameters()]
        g = gradient_fn(model, data.x_train, data.y_train)
        fo, _ = meta_step(w, g, batches, alpha, beta, "fo", 1.0)
        assert all(torch.allclose(got[n], v, atol=1e-6) for n, v in zip(names, fo))
    assert metrics[wire.TRAIN_LOSS] > 0


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_per_fedavg_takes_tau_steps_on_fresh_batches_and_reports_their_mean_loss(tmp_path, variant):
    alpha, beta, per_step = 0.3, 0.2, 3 if variant == "hf" else 2  # D, D' (and D'') of each step
    client = PerFedAvgClient(_env(tmp_path, "per-fedavg", **{"local-steps": 2, "lr": beta, "per-fedavg.alpha": alpha,
                                                              "per-fedavg.variant": variant}))
    model = client.new_model()
    records, metrics = client.fit(_weights_content(model))
    data = client.data
    stream = batch_stream(data.num_train, 16, client.env.generator(), client.env.device)
    grad_at = gradient_fn(model, data.x_train, data.y_train)
    w, losses = [p.detach() for p in model.parameters()], []
    for _ in range(2):
        w, loss = meta_step(w, grad_at, [next(stream) for _ in range(per_step)], alpha, beta, variant, 0.001)
        losses.append(float(loss))
    got = _received(records[wire.WEIGHTS])
    assert all(torch.allclose(got[n], v, atol=1e-6) for (n, _), v in zip(model.named_parameters(), w))
    assert metrics[wire.TRAIN_LOSS] == pytest.approx(np.mean(losses), rel=1e-5)


def test_hessian_free_estimate_equals_the_exact_hessian_vector_product_on_a_model_with_dropout():
    """Per-FedAvg-HF's finite difference on a model with dropout (in training mode, as the meta-step runs it)
    equals the exact Hessian-vector product of the loss with the mask of that draw (double backpropagation
    from the same generator state), to float64 finite-difference error; with two masks it would be off by
    hundreds of times H v."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(16, 3)).double()
    x, y = torch.randn(20, 6, dtype=torch.float64), torch.randint(0, 3, (20,))
    idx = torch.arange(20)
    w = [p.detach().clone() for p in model.parameters()]
    v = [torch.randn_like(p) for p in w]
    grad_at = gradient_fn(model, x, y)
    torch.manual_seed(11)
    estimate = hessian_vector(grad_at, w, v, idx, 1e-4)
    names = [n for n, _ in model.named_parameters()]
    torch.manual_seed(11)  # the same draw: the same mask
    params = [wi.clone().requires_grad_(True) for wi in w]
    loss = F.cross_entropy(functional_call(model, dict(zip(names, params)), (x,)), y)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    exact = torch.autograd.grad(sum((g * vi).sum() for g, vi in zip(grads, v)), params)
    scale = max(float(e.abs().max()) for e in exact)
    assert scale > 1e-2
    assert all(torch.allclose(e, h, atol=1e-6 * scale, rtol=1e-5) for e, h in zip(exact, estimate))
    plus, _ = grad_at([wi + 1e-4 * vi for wi, vi in zip(w, v)], idx)  # two draws: two masks
    minus, _ = grad_at([wi - 1e-4 * vi for wi, vi in zip(w, v)], idx)
    noisy = [(a - b) / 2e-4 for a, b in zip(plus, minus)]
    assert max(float((n - e).abs().max()) for n, e in zip(noisy, exact)) > 10 * scale


def test_per_fedavg_adaptation_before_evaluation_leaves_batchnorm_statistics_as_received(tmp_path):
    cfg = Config.from_run_config(small_config(tmp_path, method="per-fedavg", model="resnet8",
                                              **{"per-fedavg.alpha": 0.1}))
    client = PerFedAvgClient(ClientEnv(cfg, pid=0, num_clients=3, state=RecordDict(), server_round=1,
                                       config={wire.SERVER_ROUND: 1, wire.PHASE: "evaluate"}))
    model = client.new_model()
    with torch.no_grad():
        for name, b in model.named_buffers():
            if b.dtype.is_floating_point:
                b.add_(0.5)  # received statistics that a training batch would move
    received = {k: v.clone() for k, v in model.state_dict().items()}
    assert any("running_mean" in k for k in received)
    adapted = client.adapted(_weights_content(model)).state_dict()
    buffers = {name for name, _ in model.named_buffers()}
    assert all(torch.equal(adapted[k], received[k]) for k in buffers)
    assert not all(torch.equal(adapted[k], received[k]) for k in received if k not in buffers)  # the step was taken


def _without_training_data(env: ClientEnv) -> ClientEnv:
    import dataclasses

    data = env.data
    env.data = dataclasses.replace(data, x_train=data.x_train[:0], y_train=data.y_train[:0])
    return env


@pytest.mark.parametrize("method", ["per-fedavg", "pfedme"])
def test_a_client_without_training_data_sends_the_received_model_back(tmp_path, method):
    cls = PerFedAvgClient if method == "per-fedavg" else PFedMeClient
    client = cls(_without_training_data(_env(tmp_path, method, config={UPLOAD: True})))
    model = client.new_model()
    records, metrics = client.fit(_weights_content(model))
    assert metrics == {wire.TRAIN_LOSS: 0.0}
    got = _received(records[wire.WEIGHTS])
    assert all(torch.equal(got[k], v) for k, v in model.state_dict().items())
    if method == "per-fedavg":
        assert torch.equal(_vector(client.adapted(_weights_content(model))), _vector(model))
    else:
        silent = cls(_without_training_data(_env(tmp_path, method, config={UPLOAD: False})))
        assert silent.fit(_weights_content(model))[0] == {}


def test_per_fedavg_meta_step_count_follows_the_budget(tmp_path):
    client = PerFedAvgClient(_env(tmp_path, "per-fedavg", **{"local-epochs": 2}))
    assert client.meta_steps() == 2 * math.ceil(client.data.num_train / 16)
    client = PerFedAvgClient(_env(tmp_path, "per-fedavg", **{"local-steps": 7}))
    assert client.meta_steps() == 7


def test_per_fedavg_evaluates_the_global_model_after_one_adaptation_step(tmp_path):
    alpha = 0.5
    client = PerFedAvgClient(_env(tmp_path, "per-fedavg", **{"per-fedavg.alpha": alpha}))
    model = client.new_model()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    content = _weights_content(model)
    result = client.evaluate(content)
    data = client.data
    idx = next(batch_stream(data.num_train, 16, client.env.generator(ADAPT_TAG), client.env.device))
    twin = client.model_from(content, wire.WEIGHTS)
    F.cross_entropy(twin(data.x_train[idx]), data.y_train[idx]).backward()
    with torch.no_grad():
        for p in twin.parameters():
            p.sub_(alpha * p.grad)
    loss, correct, n = evaluate_model(twin, data.x_test, data.y_test)
    assert (result.correct, result.num_examples) == (correct, n) and result.loss == pytest.approx(loss, rel=1e-5)
    global_loss, _, _ = evaluate_model(model, data.x_test, data.y_test)
    assert abs(result.loss - global_loss) > 1e-3  # the adapted model, not the global one


def test_per_fedavg_server_averages_with_equal_weights(tmp_path):
    strategy = _strategy(PerFedAvgStrategy, tmp_path, "per-fedavg")
    w0 = strategy.global_weights
    strategy.aggregate(1, [_reply(0, 10, _shift(w0, 1.0)), _reply(1, 90, _shift(w0, 3.0))])
    for k, v in strategy.global_weights.items():
        assert np.allclose(v, w0[k] + 2.0, atol=1e-6), k  # (1 + 3) / 2, not (10 + 270) / 100
    _assert_sent(strategy)


def _assert_sent(strategy) -> None:
    """The next message carries the model the server holds now (its packed record was renewed)."""
    sent = wire.unpack_arrays(strategy.packed_global())
    assert sent.keys() == strategy.global_weights.keys()
    assert all(np.array_equal(sent[k], v) for k, v in strategy.global_weights.items())


# ====================================================================== pFedMe
def test_personal_solve_reaches_the_closed_form_proximal_point_of_a_quadratic():
    """argmin f(theta) + lam/2 ||theta - w||^2 = (A + lam I)^-1 (b + lam w); K steps follow the linear recurrence."""
    (a,), (b,) = mats, vecs = _quadratics(count=1)
    w = torch.as_tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    lam, lr = 3.0, 0.02
    closed = torch.linalg.solve(a + lam * torch.eye(4, dtype=torch.float64), b + lam * w)
    theta, _ = personal_solve([w], [w], _quadratic_grad(mats, vecs), 0, lam, lr, 2000)
    assert torch.allclose(theta[0], closed, atol=1e-10)
    k = 7
    theta, _ = personal_solve([w], [w], _quadratic_grad(mats, vecs), 0, lam, lr, k)
    contraction = torch.eye(4, dtype=torch.float64) - lr * (a + lam * torch.eye(4, dtype=torch.float64))
    assert torch.allclose(theta[0], closed + torch.linalg.matrix_power(contraction, k) @ (w - closed), atol=1e-12)


def test_pfedme_client_reports_the_mean_data_loss_of_its_local_rounds(tmp_path):
    run = {"local-steps": 3, "pfedme.k": 2, "pfedme.personal-lr": 0.05, "pfedme.lambda": 4.0, "lr": 0.1}
    client = PFedMeClient(_env(tmp_path, "pfedme", config={UPLOAD: True}, **run))
    model = client.new_model()
    records, metrics = client.fit(_weights_content(model))
    data = client.data
    stream = batch_stream(data.num_train, 16, client.env.generator(), client.env.device)
    grad_at = gradient_fn(model, data.x_train, data.y_train)
    w = [p.detach() for p in model.parameters()]
    theta, losses = list(w), []
    for _ in range(3):  # one fresh batch per local round, theta warm-started
        theta, loss = personal_solve(theta, w, grad_at, next(stream), 4.0, 0.05, 2)
        w = local_step(w, theta, 4.0, 0.1)
        losses.append(float(loss))
    got = _received(records[wire.WEIGHTS])
    assert all(torch.allclose(got[n], v, atol=1e-6) for (n, _), v in zip(model.named_parameters(), w))
    assert metrics[wire.TRAIN_LOSS] == pytest.approx(np.mean(losses), rel=1e-5)


def test_pfedme_local_rounds_follow_the_budget(tmp_path):
    client = PFedMeClient(_env(tmp_path, "pfedme", **{"local-epochs": 2}))
    assert client.local_rounds() == 2 * math.ceil(client.data.num_train / 16)
    assert PFedMeClient(_env(tmp_path, "pfedme", **{"local-steps": 3})).local_rounds() == 3


def test_local_step_moves_w_towards_theta_by_eta_lambda():
    w, theta = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0])
    (out,) = local_step([w], [theta], lam=15.0, eta=0.005)
    assert torch.allclose(out, torch.tensor([1.0 - 0.075, 2.0 + 0.15]))


def test_beta_mix_and_the_pfedme_server_rule(tmp_path):
    current = {"w": np.array([1.0, 2.0], np.float32), "n": np.array(3, np.int64)}
    mean = {"w": np.array([3.0, 0.0], np.float32), "n": np.array(5, np.int64)}
    out = beta_mix(current, mean, 0.25)
    assert np.allclose(out["w"], [1.5, 1.5]) and out["w"].dtype == np.float32 and out["n"] == 5
    strategy = _strategy(PFedMeStrategy, tmp_path, "pfedme", **{"pfedme.beta": 2.0, "fraction-train": 0.5})
    assert strategy.sample_train(1) == [0, 1, 2, 3]  # every client trains (Algorithm 1)
    strategy.begin_round(1, [0, 1, 2, 3])
    senders = sorted(strategy.senders)
    assert senders == strategy.sample_clients(0.5, 1) and len(senders) == 2
    others = sorted(set(range(4)) - set(senders))
    assert [strategy.train_config(pid, 1)[UPLOAD] for pid in senders + others] == [True, True, False, False]
    assert strategy.reply_schema(senders[0]) and strategy.reply_schema(others[0]) == {}
    w0 = strategy.global_weights
    replies = [_reply(senders[0], 10, _shift(w0, 1.0)), _reply(senders[1], 90, _shift(w0, 2.0)),
               ClientReply(others[0], 100 + others[0], 50, {}, {})]
    assert strategy.aggregate(1, sorted(replies, key=lambda r: r.pid)) == {"senders": 2}
    for k, v in strategy.global_weights.items():  # w + 2 * (mean - w), mean = w + 1.5 (equal weights)
        assert np.allclose(v, w0[k] + 3.0, atol=1e-5), k
    _assert_sent(strategy)
    assert strategy.aggregate(2, [ClientReply(others[0], 100 + others[0], 50, {}, {})]) == {"senders": 0}
    assert all(np.array_equal(v, strategy.global_weights[k]) for k, v in strategy.state_dict()["method"]
               ["global_weights"].items())


def test_pfedme_client_sends_w_keeps_theta_and_scores_the_model_asked_for(tmp_path):
    """R = 1, K = 1 by hand: theta = w0 - plr grad f(w0; D); w = w0 - eta lam (w0 - theta)."""
    plr, lam, eta = 0.3, 2.0, 0.1
    run = {"local-steps": 1, "lr": eta, "pfedme.personal-lr": plr, "pfedme.lambda": lam, "pfedme.k": 1}
    client = PFedMeClient(_env(tmp_path, "pfedme", config={UPLOAD: True}, **run))
    model = client.new_model()
    content = _weights_content(model)
    records, _ = client.fit(content)
    data = client.data
    idx = next(batch_stream(data.num_train, 16, client.env.generator(), client.env.device))
    F.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
    got = _received(records[wire.WEIGHTS])
    kept = client.load_model(PERSONAL)
    for (name, p), q in zip(model.named_parameters(), kept.parameters()):
        theta = p.detach() - plr * p.grad
        assert torch.allclose(q.detach(), theta, atol=1e-6), name
        assert torch.allclose(got[name], p.detach() - eta * lam * (p.detach() - theta), atol=1e-6), name
    personal = client.evaluate(content)
    assert personal.loss == pytest.approx(evaluate_model(kept, data.x_test, data.y_test)[0], rel=1e-5)
    glob = PFedMeClient(ClientEnv(_cfg(tmp_path, "pfedme", **{**run, "pfedme.evaluate": "global"}), 0, 3,
                                  client.env.state, 1)).evaluate(content)
    assert glob.loss == pytest.approx(evaluate_model(model, data.x_test, data.y_test)[0], rel=1e-5)
    assert abs(glob.loss - personal.loss) > 1e-4
    fresh = PFedMeClient(_env(tmp_path, "pfedme", **run)).evaluate(content)  # never trained: the global model
    assert fresh.loss == pytest.approx(glob.loss, rel=1e-6)
    silent = PFedMeClient(_env(tmp_path, "pfedme", config={UPLOAD: False}, **run))
    records, metrics = silent.fit(content)  # outside S: trains, keeps theta, sends nothing
    assert records == {} and metrics[wire.TRAIN_LOSS] > 0
    assert torch.equal(_vector(silent.load_model(PERSONAL)), _vector(kept))


# ====================================================================== L2GD
def _params(values):
    model = torch.nn.Linear(len(values), 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.as_tensor(values, dtype=torch.float64).view(1, -1))
    return model


def test_l2gd_expected_step_is_a_gradient_step_on_the_mixture_objective():
    """E[x+] = (1 - p) (local step) + p (averaging step) = x - alpha (grad f(x) + lam grad psi(x)) with
    f = 1/n sum f_i, psi = 1/(2n) sum ||x_i - x_bar||^2 and alpha = lr n (1 - p)."""
    mats, vecs = _quadratics(dim=3, count=3, seed=2)
    n, lr, lam, p = 3, 0.05, 2.0, 0.3
    xs = [torch.as_tensor(v, dtype=torch.float64) for v in ([1.0, 0.0, 2.0], [-1.0, 1.0, 0.5], [0.0, 3.0, -2.0])]
    mean = sum(xs) / n
    pull = averaging_pull(lr, lam, p)
    alpha = lr * n * (1 - p)
    assert pull == pytest.approx(alpha * lam / (n * p))
    for i, x in enumerate(xs):
        grad = mats[i] @ x - vecs[i]
        local = x - lr * grad
        averaged = _params(x)
        pull_towards(averaged, _params(mean), pull, 1)
        expected = (1 - p) * local + p * averaged.weight.detach().view(-1)
        paper = x - alpha * (grad / n + lam * (x - mean) / n)
        assert torch.allclose(expected, paper, atol=1e-12), i


def test_m_averaging_steps_at_once_equal_m_single_steps():
    x, mean = _params([1.0, -2.0, 4.0]), _params([0.5, 0.5, 0.5])
    stepwise = _params([1.0, -2.0, 4.0])
    for _ in range(3):
        pull_towards(stepwise, mean, 0.4, 1)
    pull_towards(x, mean, 0.4, 3)
    assert torch.allclose(x.weight, stepwise.weight, atol=1e-12)
    assert torch.allclose(x.weight, mean.weight + 0.6 ** 3 * torch.tensor([[0.5, -2.5, 3.5]], dtype=torch.float64))
    pull_towards(x, mean, 0.4, 0)
    assert torch.allclose(x.weight, stepwise.weight, atol=1e-12)  # no averaging step: unchanged


def test_round_schedule_is_the_coin_chain():
    p = 0.25
    draws = [round_schedule(7, r, p) for r in range(1, 4001)]
    assert draws[0][0] == 0 and all(m >= 1 for m, _ in draws[1:]) and all(k >= 1 for _, k in draws)
    assert np.mean([k for _, k in draws]) == pytest.approx(1 / p, rel=0.05)  # runs of local steps
    assert np.mean([m for m, _ in draws[1:]]) == pytest.approx(1 / (1 - p), rel=0.05)  # runs of averaging steps
    assert [round_schedule(7, r, p) for r in range(1, 50)] == draws[:49]  # seeded by (seed, round) alone
    assert [round_schedule(8, r, p) for r in range(1, 50)] != draws[:49]


def test_l2gd_strategy_sends_the_schedule_and_averages_equally(tmp_path):
    strategy = _strategy(L2GDStrategy, tmp_path, "l2gd", **{"lr": 0.05, "l2gd.p": 0.2, "l2gd.lambda": 2.0})
    config = strategy.train_config(0, 3)
    m, k = round_schedule(0, 3, 0.2)
    assert config == {AVERAGING_STEPS: m, L2GD_LOCAL_STEPS: k, PULL: pytest.approx(0.05 * 2.0 * 0.8 / 0.2)}
    w0 = strategy.global_weights
    metrics = strategy.aggregate(3, [_reply(0, 10, _shift(w0, 1.0)), _reply(1, 90, _shift(w0, 3.0))])
    assert metrics == {"averaging-steps": m, "local-steps": k}
    assert all(np.allclose(v, w0[key] + 2.0, atol=1e-6) for key, v in strategy.global_weights.items())
    _assert_sent(strategy)
    assert strategy.evaluate_payload(0, 3) == {}
    with pytest.raises(ConfigError, match="l2gd.lambda"):
        _strategy(L2GDStrategy, tmp_path, "l2gd", **{"lr": 0.5, "l2gd.p": 0.1, "l2gd.lambda": 1.0})
    full = _strategy(L2GDStrategy, tmp_path, "l2gd", **{"lr": 0.5, "l2gd.p": 0.5, "l2gd.lambda": 2.0})
    assert full.pull == 1.0  # a full step onto the mean is the largest allowed
    with pytest.raises(ConfigError, match="1.2"):  # just past the mean
        _strategy(L2GDStrategy, tmp_path, "l2gd", **{"lr": 0.6, "l2gd.p": 0.5, "l2gd.lambda": 2.0})


def test_l2gd_client_pulls_its_own_model_then_steps_and_keeps_it(tmp_path):
    lr, pull = 0.1, 0.25
    first = L2GDClient(_env(tmp_path, "l2gd", config={AVERAGING_STEPS: 0, L2GD_LOCAL_STEPS: 2, PULL: pull},
                            lr=lr))
    mean = first.new_model()
    records, _ = first.fit(_weights_content(mean))
    mine = _received(records[wire.WEIGHTS])
    assert torch.equal(_vector(first.load_model(LOCAL)), _vector(_load(first, mine)))
    # round 2: a new mean; x_i <- mean + (1 - pull)^2 (x_i - mean), then 3 steps
    state = first.env.state
    second = L2GDClient(_env(tmp_path, "l2gd", state=state, server_round=2, lr=lr,
                             config={AVERAGING_STEPS: 2, L2GD_LOCAL_STEPS: 3, PULL: pull}))
    new_mean = second.new_model()
    with torch.no_grad():
        for p in new_mean.parameters():
            p.add_(0.2)
    records, _ = second.fit(_weights_content(new_mean))
    start = {k: new_mean.state_dict()[k] + 0.75 ** 2 * (mine[k] - new_mean.state_dict()[k]) for k in mine}
    twin = _load(second, start)
    second.train(twin, steps=3)
    assert torch.allclose(_vector(_load(second, _received(records[wire.WEIGHTS]))), _vector(twin), atol=1e-6)
    result = second.evaluate(RecordDict())
    assert result.loss == pytest.approx(evaluate_model(twin, second.data.x_test, second.data.y_test)[0], rel=1e-5)


def _load(client, state) -> torch.nn.Module:
    model = client.new_model()
    model.load_state_dict(state)
    return model


# ====================================================================== FedNova
@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_effective_steps_are_what_torch_sgd_with_momentum_moves_under_a_constant_gradient(momentum):
    """Under a constant gradient g, tau steps of torch SGD move x by lr * ||a||_1 * g."""
    tau, lr = 7, 0.1
    x = torch.zeros(3, requires_grad=True)
    g = torch.tensor([1.0, -2.0, 0.5])
    opt = torch.optim.SGD([x], lr=lr, momentum=momentum)
    for _ in range(tau):
        opt.zero_grad()
        (x * g).sum().backward()
        opt.step()
    a = effective_steps(tau, momentum)
    assert torch.allclose(-x.detach(), lr * a * g, atol=1e-5)
    closed = sum((1 - momentum ** k) / (1 - momentum) for k in range(1, tau + 1))
    assert a == pytest.approx(closed)
    assert effective_steps(0, momentum) == 0.0


def test_normalized_average_on_clients_with_unequal_steps():
    """x - tau_eff sum_i p_i (x - y_i) / a_i written out: p = (1/4, 3/4), a = (2, 6), tau_eff = 5."""
    x = {"w": np.array([1.0, 2.0], np.float32), "n": np.array(4, np.int64)}
    ys = [{"w": np.array([0.0, 2.0], np.float32), "n": np.array(6, np.int64)},
          {"w": np.array([1.0, -4.0], np.float32), "n": np.array(5, np.int64)}]
    out = normalized_average(x, ys, [10, 30], [2.0, 6.0])
    step = 0.25 * (np.array([1.0, 0.0]) / 2) + 0.75 * (np.array([0.0, 6.0]) / 6)
    assert np.allclose(out["w"], np.array([1.0, 2.0]) - 5.0 * step)
    assert np.allclose(out["w"], [0.375, -1.75]) and out["w"].dtype == np.float32 and out["n"] == 6
    fedavg = normalized_average(x, ys, [10, 30], [3.0, 3.0])  # equal steps: FedAvg's weighted mean
    assert np.allclose(fedavg["w"], 0.25 * ys[0]["w"] + 0.75 * ys[1]["w"])
    counters = {"c": np.array([1, 5], np.int32), "w": np.array([0.0], np.float32)}  # an integer tensor first
    out = normalized_average(counters, [{"c": np.array([3, 2], np.int32), "w": np.array([1.0], np.float32)},
                                        {"c": np.array([0, 4], np.int32), "w": np.array([1.0], np.float32)}],
                             [1, 1], [1.0, 1.0])
    assert out["c"].tolist() == [3, 4] and out["c"].dtype == np.int32 and np.allclose(out["w"], [1.0])



def test_normalized_average_of_many_clients_is_the_formula_written_out_in_float64():
    """37 clients (more than one of weighted_average's blocks), unequal sizes and step counts: the streamed
    x - c (x - S) form equals x - tau_eff sum_i p_i (x - y_i) / a_i summed client by client in float64."""
    rng = np.random.default_rng(5)
    x = {"w": rng.normal(scale=0.1, size=(20, 9)).astype(np.float32)}
    ys = [{"w": (x["w"] + 0.01 * rng.normal(size=(20, 9))).astype(np.float32)} for _ in range(37)]
    sizes, a = rng.integers(10, 500, size=37), rng.uniform(1.0, 40.0, size=37)
    p = sizes / sizes.sum()
    step = sum(pi / ai * (x["w"].astype(np.float64) - y["w"]) for pi, ai, y in zip(p, a, ys))
    expected = x["w"] - float(np.sum(p * a)) * step
    np.testing.assert_allclose(normalized_average(x, ys, sizes, a)["w"], expected, rtol=2e-6, atol=1e-7)



def test_normalized_average_keeps_the_mean_in_float64_where_c_amplifies_its_rounding():
    """Step counts 1 and 100 make c = tau_eff sum_i q_i = 50.5 * 0.505 = 25.5: x - c (x - S) multiplies any
    rounding of S by 25.5, so S stays float64 until the end and the result is the float64 formula rounded once."""
    rng = np.random.default_rng(6)
    x = {"w": rng.normal(size=500).astype(np.float32)}
    ys = [{"w": (x["w"] + rng.normal(scale=0.3, size=500)).astype(np.float32)} for _ in range(2)]
    step = sum(0.5 / ai * (x["w"].astype(np.float64) - y["w"]) for ai, y in zip((1.0, 100.0), ys))
    expected = (x["w"] - 50.5 * step).astype(np.float32)
    got = normalized_average(x, ys, [7, 7], [1.0, 100.0])["w"]
    assert np.abs(got.view(np.int32).astype(np.int64) - expected.view(np.int32)).max() <= 1  # within one ulp


def test_fednova_strategy_checks_a_norm_and_aggregates_by_the_formula(tmp_path):
    strategy = _strategy(FedNovaStrategy, tmp_path, "fednova", sizes=(40, 160, 100, 100), momentum=0.5,
                         **{"local-epochs": 1, "batch-size": 16})
    assert strategy.most_steps(0) == pytest.approx(effective_steps(3, 0.5))
    assert strategy.most_steps(1) == pytest.approx(effective_steps(10, 0.5))
    w0 = strategy.global_weights

    def reply(pid, n, a, by):
        return _reply(pid, n, _shift(w0, by), **{NORMALIZER: {A_NORM: np.array([a])}})

    assert strategy.check_reply(reply(0, 40, effective_steps(3, 0.5), 0.0)) is None
    assert strategy.check_reply(reply(0, 40, 1.0, 0.0)) is None  # one step
    assert strategy.check_reply(reply(0, 40, strategy.most_steps(0), 0.0)) is None  # the full budget
    assert "outside" in strategy.check_reply(reply(0, 40, 0.999, 0.0))
    assert "outside" in strategy.check_reply(reply(0, 40, effective_steps(3, 0.5) + 0.01, 0.0))
    assert "outside" in strategy.check_reply(reply(1, 160, 0.5, 0.0))
    replies = [reply(0, 40, 2.0, -1.0), reply(1, 160, 8.0, -2.0)]
    strategy.aggregate(1, replies)
    tau_eff = 0.2 * 2.0 + 0.8 * 8.0
    for k, v in strategy.global_weights.items():  # x - y_i = 1 and 2: x - tau_eff (0.2 * 1/2 + 0.8 * 2/8)
        assert np.allclose(v, w0[k] - tau_eff * (0.2 * 1.0 / 2.0 + 0.8 * 2.0 / 8.0), atol=1e-5), k
    assert strategy.reply_schema(0)[NORMALIZER][A_NORM] == ArraySpec((1,), "f")
    assert set(strategy.reply_schema(0)[wire.WEIGHTS]) == set(w0)
    _assert_sent(strategy)
    budget = _strategy(FedNovaStrategy, tmp_path, "fednova", momentum=0.5, **{"local-steps": 5})
    assert budget.most_steps(0) == pytest.approx(effective_steps(5, 0.5))


def test_fednova_example_reply_is_a_valid_reply(tmp_path):
    strategy = _strategy(FedNovaStrategy, tmp_path, "fednova", **{"local-epochs": 2})
    rng = np.random.default_rng(0)
    assert example_reply(strategy, 0, "evaluate", rng) == {}
    records = example_reply(strategy, 1, "train", rng)
    arrays = {name: wire.unpack_arrays(record) for name, record in records.items()}
    schema = strategy.reply_schema(1)
    assert set(arrays) == set(schema)
    for name, keys in schema.items():
        for key, spec in keys.items():
            assert arrays[name][key].shape == spec.shape and arrays[name][key].dtype.kind == spec.kind, key
    weights = arrays[wire.WEIGHTS]
    assert all(0 < np.abs(weights[k] - v).max() < 0.1 for k, v in strategy.global_weights.items())
    assert strategy.check_reply(ClientReply(1, 101, 100, {}, arrays)) is None
    assert arrays[NORMALIZER][A_NORM][0] > 1.0
    most = strategy.most_steps(1)
    drawn = [float(wire.unpack_arrays(example_reply(strategy, 1, "train", rng)[NORMALIZER])[A_NORM][0])
             for _ in range(200)]
    assert 1.0 <= min(drawn) < 1.5 and most - 1.0 < max(drawn) <= most  # spread over 1..most


def test_fednova_epoch_draws_and_their_config_checks(tmp_path):
    strategy = _strategy(FedNovaStrategy, tmp_path, "fednova", **{"local-epochs": 2, "fednova.max-epochs": 5})
    draws = [strategy.train_config(pid, r)[EPOCHS] for r in range(1, 40) for pid in range(4)]
    assert set(draws) == {2, 3, 4, 5}
    assert draws == [strategy.train_config(pid, r)[EPOCHS] for r in range(1, 40) for pid in range(4)]
    assert strategy.most_steps(0) == pytest.approx(effective_steps(5 * math.ceil(100 / 16), 0.0))
    fixed = _strategy(FedNovaStrategy, tmp_path, "fednova", **{"local-epochs": 2})
    assert {fixed.train_config(pid, 3)[EPOCHS] for pid in range(4)} == {2}
    with pytest.raises(ConfigError, match="fednova.max-epochs"):
        _strategy(FedNovaStrategy, tmp_path, "fednova", **{"local-epochs": 3, "fednova.max-epochs": 2})
    with pytest.raises(ConfigError, match="local-steps"):
        _strategy(FedNovaStrategy, tmp_path, "fednova", **{"local-steps": 1, "fednova.max-epochs": 4})
    same = _strategy(FedNovaStrategy, tmp_path, "fednova", **{"local-epochs": 3, "fednova.max-epochs": 3})
    assert same.train_config(0, 1)[EPOCHS] == 3


def test_fednova_client_runs_the_drawn_epochs_and_reports_its_effective_steps(tmp_path):
    client = FedNovaClient(_env(tmp_path, "fednova", config={EPOCHS: 3}, momentum=0.9))
    model = client.new_model()
    records, metrics = client.fit(_weights_content(model))
    tau = 3 * math.ceil(client.data.num_train / 16)
    assert metrics[wire.METHOD_METRIC_PREFIX + LOCAL_STEPS] == tau
    a = wire.unpack_arrays(records[NORMALIZER])[A_NORM]
    assert a.shape == (1,) and a.dtype == np.float64 and a[0] == pytest.approx(effective_steps(tau, 0.9))
    twin = client.new_model()
    client.train(twin, epochs=3)
    assert torch.allclose(_vector(_load(client, _received(records[wire.WEIGHTS]))), _vector(twin), atol=1e-6)
    for budget in (1, 4):  # a step budget wins over the epochs in the message
        steps = FedNovaClient(_env(tmp_path, "fednova", config={EPOCHS: 3}, **{"local-steps": budget}))
        _, metrics = steps.fit(_weights_content(model))
        assert metrics[wire.METHOD_METRIC_PREFIX + LOCAL_STEPS] == budget
