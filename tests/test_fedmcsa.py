"""FedMCSA: the attention rule's invariants (spec section 12), the strategy's exchange rules, the
client's proximal step (real federations: tests/test_fedmcsa_federation.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedcore import wire
from fedcore.config import Config
from fedcore.methods.fedmcsa import RECEIVE, UPLOAD
from fedcore.models import model_facts
from fedstrategies.fedmcsa import FedMCSAStrategy
from fedstrategies.fedmcsa_math import attention, components, mcsa, mean_weights, size_weighted
from tests.conftest import test_device

RNG = np.random.default_rng(0)


def _models(s: int, rng=RNG, shapes=None) -> list[dict[str, np.ndarray]]:
    """S random DNN-shaped models (two layers, weight and bias each)."""
    shapes = shapes or {"body.1.weight": (5, 6), "body.1.bias": (5,), "head.weight": (3, 5), "head.bias": (3,)}
    return [{k: rng.standard_normal(shape).astype(np.float32) for k, shape in shapes.items()} for _ in range(s)]


def _flat(model: dict, keys) -> np.ndarray:
    return np.concatenate([model[k].ravel() for k in keys])


# ------------------------------------------------------------------ the attention rule (spec 12)
@pytest.mark.parametrize("sigma", [0.0, 1.0, 50.0, 1000.0])
def test_rows_sum_to_one_are_non_negative_and_the_diagonal_is_each_rows_maximum(sigma):
    x = RNG.standard_normal((7, 40))
    psi = attention(x, sigma)
    assert psi.shape == (7, 7) and (psi >= 0).all()
    np.testing.assert_allclose(psi.sum(1), 1.0, atol=1e-6)
    assert (np.diag(psi)[:, None] >= psi - 1e-12).all()
    assert np.isfinite(psi).all()  # sigma = 1000: exp(1000) would overflow without max-subtraction


def test_a_zero_norm_component_gets_uniform_weights_instead_of_nan():
    x = RNG.standard_normal((4, 10))
    x[2] = 0.0
    psi = attention(x, 50.0)
    assert np.isfinite(psi).all()
    np.testing.assert_allclose(psi[2], 0.25)  # cos = 0 with everyone, itself included (spec 11.13)


def test_attention_need_not_be_symmetric():
    x = RNG.standard_normal((5, 8))
    psi = attention(x, 3.0)
    assert not np.allclose(psi, psi.T)  # each row is normalised on its own


def test_convexity_every_coordinate_lies_between_the_clients_minimum_and_maximum():
    models = _models(6)
    out, _ = mcsa(models, sigma=5.0)
    for key in models[0]:
        stack = np.stack([m[key] for m in models])
        for w in out:
            assert (w[key] >= stack.min(0) - 1e-6).all() and (w[key] <= stack.max(0) + 1e-6).all()


def test_identical_clients_get_that_model_back():
    model = _models(1)[0]
    out, matrices = mcsa([model] * 5, sigma=50.0)
    for w in out:
        for key in model:
            np.testing.assert_allclose(w[key], model[key], rtol=1e-6, atol=1e-7)
    for psi in matrices.values():
        np.testing.assert_allclose(psi, 0.2)


def test_one_sampled_client_keeps_its_own_model():
    model = _models(1)[0]
    out, matrices = mcsa([model], sigma=50.0)
    assert all(np.array_equal(out[0][k], model[k]) for k in model)
    assert all(psi.shape == (1, 1) and psi[0, 0] == 1.0 for psi in matrices.values())


def test_sigma_zero_gives_every_client_the_plain_mean():
    models = _models(4)
    out, matrices = mcsa(models, sigma=0.0)
    for key in models[0]:
        mean = np.mean([m[key] for m in models], axis=0)
        for w in out:
            np.testing.assert_allclose(w[key], mean, rtol=1e-5, atol=1e-6)
    for psi in matrices.values():
        np.testing.assert_allclose(psi, 0.25)


def test_large_sigma_gives_each_client_itself():
    models = _models(4)  # random directions: cosines well below 1
    out, matrices = mcsa(models, sigma=1e4)
    for psi in matrices.values():
        np.testing.assert_allclose(psi, np.eye(4), atol=1e-9)
    for w, m in zip(out, models):
        for key in m:
            np.testing.assert_allclose(w[key], m[key], rtol=1e-6, atol=1e-7)


def test_layer_independence_perturbing_one_layer_changes_no_other_layer():
    models = _models(5)
    out, matrices = mcsa(models, sigma=5.0)
    changed = [dict(m) for m in models]
    changed[3] = {**changed[3], "head.weight": changed[3]["head.weight"] * -2.0 + 1.0}
    out2, matrices2 = mcsa(changed, sigma=5.0)
    np.testing.assert_array_equal(matrices["body.1"], matrices2["body.1"])
    assert not np.allclose(matrices["head"], matrices2["head"])
    for a, b in zip(out, out2):
        np.testing.assert_array_equal(a["body.1.weight"], b["body.1.weight"])
        np.testing.assert_array_equal(a["body.1.bias"], b["body.1.bias"])


def test_permutation_equivariance():
    models = _models(6)
    perm = np.array([3, 0, 5, 1, 4, 2])
    out, matrices = mcsa(models, sigma=20.0)
    out_p, matrices_p = mcsa([models[i] for i in perm], sigma=20.0)
    for name in matrices:
        np.testing.assert_allclose(matrices_p[name], matrices[name][np.ix_(perm, perm)], rtol=1e-6, atol=1e-9)
    for j, i in enumerate(perm):
        for key in models[0]:
            np.testing.assert_allclose(out_p[j][key], out[i][key], rtol=1e-5, atol=1e-6)


def test_cosine_scale_invariance():
    models = _models(5)
    scaled = [dict(m) for m in models]
    scaled[1] = {k: v * 7.5 for k, v in scaled[1].items()}
    scaled[4] = {k: v * 0.01 for k, v in scaled[4].items()}
    _, matrices = mcsa(models, sigma=50.0)
    _, matrices_s = mcsa(scaled, sigma=50.0)
    for name in matrices:
        np.testing.assert_allclose(matrices_s[name], matrices[name], rtol=1e-4, atol=1e-8)


def test_vectorised_rule_equals_a_naive_double_loop():
    models = _models(5)
    sigma = 8.0
    out, matrices = mcsa(models, sigma=sigma)
    for name, keys in components(models[0]).items():
        thetas = [_flat(m, keys).astype(np.float64) for m in models]
        cos = lambda a, b: a @ b / (np.linalg.norm(a) * np.linalg.norm(b))  # noqa: E731
        for i in range(5):
            scores = [np.exp(sigma * cos(thetas[i], thetas[k])) for k in range(5)]  # Eq. 7, row-normalised
            psi_row = np.array(scores) / sum(scores)
            np.testing.assert_allclose(matrices[name][i], psi_row, rtol=1e-5)
            w = sum(psi_row[k] * thetas[k] for k in range(5))  # Eq. 6
            np.testing.assert_allclose(_flat(out[i], keys), w, rtol=1e-4, atol=1e-5)


def test_shapes_dtypes_and_key_order_are_kept_and_counters_stay_each_clients_own():
    models = _models(3)
    for i, m in enumerate(models):
        m["bn.num_batches_tracked"] = np.array(10 + i, dtype=np.int64)
    out, matrices = mcsa(models, sigma=50.0)
    assert "bn" not in matrices
    for i, (w, m) in enumerate(zip(out, models)):
        assert list(w) == list(m)
        assert all(w[k].shape == m[k].shape and w[k].dtype == m[k].dtype for k in m)
        assert int(w["bn.num_batches_tracked"]) == 10 + i


def test_components_are_layers_by_default_or_tensors_and_a_conv_kernel_is_one_component():
    facts = model_facts("cnn", (1, 8, 8), 10, 0)
    layers = components(facts.initial_weights)
    assert layers["body.0"] == ["body.0.weight", "body.0.bias"]
    assert facts.initial_weights["body.0.weight"].ndim == 4
    assert list(layers) == ["body.0", "body.3", "body.7", "head"]
    tensors = components(facts.initial_weights, "tensor")
    assert len(tensors) == 8 and all(v == [k] for k, v in tensors.items())
    dnn = components(model_facts("dnn", (60,), 10, 0).initial_weights)
    assert list(dnn) == ["body.1", "head"]  # L = 2 for the paper's DNN, L = 1 for its MLR
    assert list(components(model_facts("mlr", (60,), 10, 0).initial_weights)) == ["head"]
    models = [{k: RNG.standard_normal(v.shape).astype(np.float32) for k, v in facts.initial_weights.items()}
              for _ in range(3)]
    out, matrices = mcsa(models, 50.0)  # 4-D kernels go through like any other tensor
    assert out[0]["body.0.weight"].shape == facts.initial_weights["body.0.weight"].shape
    _, by_tensor = mcsa(models, 50.0, mode="tensor")
    assert set(by_tensor) == set(facts.initial_weights)


def test_size_weighting_follows_the_authors_formula():
    psi = attention(RNG.standard_normal((4, 6)), 2.0)
    n = np.array([10.0, 200.0, 30.0, 5.0])
    got = size_weighted(psi, n)
    for i in range(4):
        np.testing.assert_allclose(got[i], psi[i] * n / (psi[i] * n).sum())
    np.testing.assert_allclose(got.sum(1), 1.0)


def test_fedmcsa_without_mcsa_with_equal_sizes_equals_sigma_zero():
    models = _models(5)
    mean_out, mean_psi = mcsa(models, sigma=50.0, sizes=[7] * 5, aggregation="mean")
    zero_out, zero_psi = mcsa(models, sigma=0.0)
    for a, b in zip(mean_out, zero_out):
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(mean_weights([1, 3])[0], [0.25, 0.75])  # otherwise the n_k-weighted mean
    with pytest.raises(ValueError, match="size"):
        mcsa(models, sigma=1.0, aggregation="mean")


# ------------------------------------------------------------------ the strategy
def _strategy(n: int = 10, **hp) -> FedMCSAStrategy:
    from tests.fakes import fake_clients

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    cfg = Config.from_run_config({"method": "fedmcsa", "dataset": "synthetic", "model": "dnn",
                                  "num-server-rounds": 5, **{f"fedmcsa.{k}": v for k, v in hp.items()}})
    return FedMCSAStrategy(cfg, fake_clients(n), model_facts("dnn", (60,), 10, 0))


def _round(strategy, rnd: int, faults=None):
    """One train round with realistic replies (benchmark helper); returns (messages, replies)."""
    from tests.fakes import fake_reply

    msgs = list(strategy.configure_train(rnd, ArrayRecord(), ConfigRecord(), None))
    rng = np.random.default_rng(rnd)
    replies = [fake_reply(strategy, m, "train", rng) for m in msgs]
    if faults:
        replies = [faults(strategy.pid_of[m.metadata.dst_node_id], r) for m, r in zip(msgs, replies)]
    strategy.aggregate_train(rnd, replies)
    return msgs, replies


def _config(msg) -> dict:
    return dict(msg.content.config_records[wire.CONFIG])


def test_only_sampled_clients_receive_a_personalised_model_of_the_right_shapes():
    strategy = _strategy(10, **{"clients-per-round": 4})
    msgs, _ = _round(strategy, 1)
    assert len(msgs) == 10  # by default every client trains (Alg. 1 lines 7-19)
    sampled = strategy.exchange_set(1)
    assert len(sampled) == 4
    for msg in msgs:
        pid = strategy.pid_of[msg.metadata.dst_node_id]
        has_model = wire.WEIGHTS in msg.content.array_records
        assert _config(msg)[RECEIVE] is (pid in sampled) and has_model is (pid in sampled)
        if has_model:
            w = wire.unpack_arrays(msg.content.array_records[wire.WEIGHTS])
            assert {k: (v.shape, v.dtype) for k, v in w.items()} == {
                k: (v.shape, v.dtype) for k, v in strategy.initial_weights.items()}


def test_the_next_rounds_sample_uploads_fresh_models_and_nobody_after_the_last_round():
    """Alg. 1 line 2: S^t sends Theta^{t-1}, the model it has at the end of round t-1."""
    strategy = _strategy(10, **{"clients-per-round": 4})
    for rnd in range(1, 6):
        msgs, replies = _round(strategy, rnd)
        uploaders = {strategy.pid_of[m.metadata.dst_node_id] for m in msgs if _config(m)[UPLOAD]}
        assert uploaders == (set(strategy.exchange_set(rnd + 1)) if rnd < 5 else set())
        with_weights = {strategy.pid_of[r.metadata.src_node_id] for r in replies
                        if wire.WEIGHTS in r.content.array_records}
        assert with_weights == uploaders
        assert strategy.dropped == []
    assert len(strategy.models) <= 10  # at most one model per client


def test_the_attention_of_a_round_runs_over_exactly_the_models_uploaded_for_it():
    strategy = _strategy(8, **{"clients-per-round": 3, "sigma": 50.0, "variant": "paper"})
    _, replies = _round(strategy, 1)
    uploaded = {strategy.pid_of[r.metadata.src_node_id]: wire.unpack_arrays(r.content.array_records[wire.WEIGHTS])
                for r in replies if wire.WEIGHTS in r.content.array_records}
    msgs = list(strategy.configure_train(2, ArrayRecord(), ConfigRecord(), None))
    sampled = strategy.exchange_set(2)
    expected, _ = mcsa([uploaded[pid] for pid in sampled], 50.0)
    got = {strategy.pid_of[m.metadata.dst_node_id]: wire.unpack_arrays(m.content.array_records[wire.WEIGHTS])
           for m in msgs if wire.WEIGHTS in m.content.array_records}
    for pid, w in zip(sampled, expected):
        assert all(np.array_equal(got[pid][k], w[k]) for k in w)


def test_option_sampled_trains_only_the_sample_and_unsampled_clients_keep_their_server_model():
    strategy = _strategy(10, **{"clients-per-round": 3, "train": "sampled"})
    _round(strategy, 1)
    before = {pid: {k: v.copy() for k, v in m.items()} for pid, m in strategy.models.items()}
    msgs, _ = _round(strategy, 2)
    sampled = set(strategy.exchange_set(2))
    assert {strategy.pid_of[m.metadata.dst_node_id] for m in msgs} == sampled
    assert all(_config(m)[RECEIVE] and _config(m)[UPLOAD] for m in msgs)
    for pid, model in before.items():
        if pid not in sampled:
            assert all(np.array_equal(strategy.models[pid][k], model[k]) for k in model)
    changed = {pid for pid in strategy.models if pid not in before or
               any(not np.array_equal(strategy.models[pid][k], before[pid][k]) for k in before[pid])}
    assert changed == sampled  # only the |S^t| entries change


def test_malformed_replies_are_dropped_and_leave_the_server_state_unchanged():
    strategy = _strategy(6, **{"clients-per-round": 3})
    uploaders = set(strategy.exchange_set(2))
    bad = sorted(uploaders)

    def faults(pid, reply):
        if pid not in bad:
            return reply
        arrays = wire.unpack_arrays(reply.content.array_records[wire.WEIGHTS])
        if pid == bad[0]:  # wrong shape
            arrays["head.weight"] = np.zeros((3, 3), np.float32)
        elif pid == bad[1]:  # wrong dtype
            arrays = {k: v.astype(np.float64) for k, v in arrays.items()}
        else:  # an uploader that sends no weights
            return Message(content=RecordDict({wire.METRICS: reply.content.metric_records[wire.METRICS]}),
                           reply_to=_request[pid])
        return Message(content=RecordDict({wire.WEIGHTS: wire.pack_arrays(arrays),
                                           wire.METRICS: reply.content.metric_records[wire.METRICS]}),
                       reply_to=_request[pid])

    from tests.fakes import fake_reply

    msgs = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), None))
    _request = {strategy.pid_of[m.metadata.dst_node_id]: m for m in msgs}
    rng = np.random.default_rng(0)
    replies = [faults(strategy.pid_of[m.metadata.dst_node_id], fake_reply(strategy, m, "train", rng)) for m in msgs]
    strategy.aggregate_train(1, replies)
    reasons = sorted(d["reason"] for d in strategy.dropped)
    assert len(reasons) == 3, reasons
    assert any("shape" in r for r in reasons) and any("dtype" in r for r in reasons)
    assert any("missing array record" in r for r in reasons)
    assert strategy.models == {}  # nothing was stored from the bad replies


def test_fraction_train_is_refused_in_favour_of_clients_per_round():
    from tests.fakes import fake_clients

    cfg = Config.from_run_config({"method": "fedmcsa", "dataset": "synthetic", "fraction-train": 0.2})
    with pytest.raises(ValueError, match="clients-per-round"):
        FedMCSAStrategy(cfg, fake_clients(5), model_facts("mlr", (60,), 10, 0))


def test_server_state_round_trips_through_a_checkpoint():
    strategy = _strategy(6, **{"clients-per-round": 3})
    _round(strategy, 1)
    state = strategy.state_dict()
    fresh = _strategy(6, **{"clients-per-round": 3})
    fresh.load_state_dict(state)
    assert set(fresh.models) == set(strategy.models)
    a = list(strategy.configure_train(2, ArrayRecord(), ConfigRecord(), None))
    b = list(fresh.configure_train(2, ArrayRecord(), ConfigRecord(), None))
    for x, y in zip(a, b):
        assert set(x.content.array_records) == set(y.content.array_records)
        for name in x.content.array_records:
            wx, wy = (wire.unpack_arrays(m.content.array_records[name]) for m in (x, y))
            assert all(np.array_equal(wx[k], wy[k]) for k in wx)


# ------------------------------------------------------------------ the client
def _env(tmp_path, state=None, server_round=1, config=None, **run):
    from clients.base import ClientEnv

    cfg = Config.from_run_config({"method": "fedmcsa", "dataset": "digits", "partition": "pathological",
                                  "model": "mlr", "results-dir": str(tmp_path), "device": test_device(), **run})
    return ClientEnv(cfg, 0, 3, RecordDict() if state is None else state, server_round,
                     {wire.SERVER_ROUND: server_round, wire.PHASE: "train", **(config or {})})


def test_proximal_step_with_zero_loss_contracts_towards_the_centre_by_one_minus_eta_lambda():
    from clients.fedmcsa import proximal_objective
    from clients.training import train_loop

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    centre = [torch.randn_like(p) for p in model.parameters()]
    dist0 = torch.sqrt(sum(((p - c) ** 2).sum() for p, c in zip(model.parameters(), centre)))
    eta, lam, steps = 0.02, 5.0, 20
    zero = lambda m, xb, yb: 0.0 * m(xb).sum()  # noqa: E731  f = 0: only the proximal term acts
    train_loop(model, torch.randn(30, 4), torch.zeros(30, dtype=torch.long), batch_size=20, steps=steps,
               optimizer=torch.optim.SGD(model.parameters(), lr=eta), generator=torch.Generator().manual_seed(0),
               loss_fn=proximal_objective(lam, centre, data_loss=zero), full_batches=True)
    dist = torch.sqrt(sum(((p - c) ** 2).sum() for p, c in zip(model.parameters(), centre)))
    assert float(dist) == pytest.approx(float(dist0) * (1 - eta * lam) ** steps, rel=1e-5)
    # lambda = 0 is plain SGD on f: with f = 0 nothing moves
    before = [p.detach().clone() for p in model.parameters()]
    train_loop(model, torch.randn(30, 4), torch.zeros(30, dtype=torch.long), batch_size=20, steps=3,
               optimizer=torch.optim.SGD(model.parameters(), lr=eta), generator=torch.Generator().manual_seed(0),
               loss_fn=proximal_objective(0.0, centre, data_loss=zero))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _received(env, seed: int = 0) -> RecordDict:
    """A train message carrying a personalised model W (random, so that it differs from U^0)."""
    from clients.fedmcsa import FedMCSAClient

    model = FedMCSAClient(env).new_model()
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return RecordDict({wire.WEIGHTS: wire.pack_arrays(model.state_dict())})


def test_the_client_update_equals_the_proximal_formula_with_a_fixed_centre(tmp_path):
    """Theta <- Theta - eta (grad f(Theta) + lambda (Theta - W)), with W the model received earlier
    (not the weights being trained: the authors' code aliases them, which cancels lambda)."""
    from clients.fedmcsa import CENTRE, MODEL, FedMCSAClient

    lam, eta = 5.0, 0.02
    run = {"local-steps": 3, "batch-size": 8, "lr": eta, "fedmcsa.lambda": lam, "fedmcsa.variant": "paper"}
    state = RecordDict()
    env = _env(tmp_path, state, 1, {RECEIVE: True, UPLOAD: False}, **run)
    content = _received(env)
    FedMCSAClient(env).fit(content)  # round 1: receives W, trains 3 steps from it
    client = FedMCSAClient(env)
    centre, theta = client.load_model(CENTRE), client.load_model(MODEL)
    w = client.model_from(content, wire.WEIGHTS)
    assert all(torch.equal(a, b) for a, b in zip(centre.parameters(), w.parameters()))  # W_local = W, frozen
    assert not all(torch.equal(a, b) for a, b in zip(theta.parameters(), w.parameters()))

    # round 2 without a new model: one full-batch step from Theta towards the old centre W
    n = client.data.num_train
    env2 = _env(tmp_path, state, 2, {RECEIVE: False, UPLOAD: True}, **{**run, "local-steps": 1, "batch-size": n})
    records, _ = FedMCSAClient(env2).fit(RecordDict())
    got = wire.unpack_arrays(records[wire.WEIGHTS])
    theta.zero_grad()
    F.cross_entropy(theta(client.data.x_train), client.data.y_train).backward()
    for (name, p), c in zip(theta.named_parameters(), centre.parameters()):
        expected = p.detach() - eta * (p.grad + lam * (p.detach() - c.detach()))
        np.testing.assert_allclose(got[name], wire.to_host(expected), rtol=1e-5, atol=1e-6)
    # the centre is still W after a round without a new model
    centre2 = FedMCSAClient(env2).load_model(CENTRE)
    assert all(torch.equal(a, b) for a, b in zip(centre2.parameters(), w.parameters()))


def test_lambda_changes_the_update_and_the_first_step_from_the_centre_has_no_proximal_pull(tmp_path):
    from clients.fedmcsa import FedMCSAClient

    outs = {}
    for lam in (0.0, 5.0):
        run = {"local-steps": 1, "batch-size": 8, "lr": 0.02, "fedmcsa.lambda": lam}
        env = _env(tmp_path, None, 1, {RECEIVE: True, UPLOAD: True}, **run)
        outs[("one", lam)] = wire.unpack_arrays(FedMCSAClient(env).fit(_received(env))[0][wire.WEIGHTS])
        env = _env(tmp_path, None, 1, {RECEIVE: True, UPLOAD: True}, **{**run, "local-steps": 5})
        outs[("five", lam)] = wire.unpack_arrays(FedMCSAClient(env).fit(_received(env))[0][wire.WEIGHTS])
    for k in outs[("one", 0.0)]:  # Theta = W at the first step: the proximal gradient is zero
        np.testing.assert_array_equal(outs[("one", 0.0)][k], outs[("one", 5.0)][k])
    assert any(not np.allclose(outs[("five", 0.0)][k], outs[("five", 5.0)][k]) for k in outs[("five", 0.0)])


def test_exactly_r_batches_of_size_d_per_round(tmp_path):
    from clients.fedmcsa import FedMCSAClient

    class Counting(FedMCSAClient):
        def train(self, model, **kwargs):
            kwargs["after_step"] = lambda step, loss, idx: self.sizes.append(len(idx))
            return super().train(model, **kwargs)

    env = _env(tmp_path, None, 1, {RECEIVE: False, UPLOAD: False}, **{"local-steps": 37, "batch-size": 20})
    client = Counting(env)
    client.sizes = []
    records, metrics = client.fit(RecordDict())
    assert client.data.num_train % 20 != 0  # epochs end mid-batch, yet every batch is full
    assert client.sizes == [20] * 37 and records == {} and metrics[wire.TRAIN_LOSS] > 0


def test_a_client_that_never_received_a_model_trains_its_own_towards_the_initial_model(tmp_path):
    from clients.fedmcsa import CENTRE, FedMCSAClient

    state = RecordDict()
    env = _env(tmp_path, state, 1, {RECEIVE: False, UPLOAD: False}, **{"local-steps": 2})
    FedMCSAClient(env).fit(RecordDict())
    assert CENTRE not in state.array_records  # the centre is still U^0, which load_model rebuilds
    client = FedMCSAClient(env)
    assert all(torch.equal(a, b) for a, b in zip(client.load_model(CENTRE).parameters(),
                                                 client.new_model().parameters()))


# ------------------------------------------------------------------ base additions this method needed
def test_full_batch_stream_gives_equal_batches_and_each_epoch_is_one_permutation():
    from clients.training import full_batch_stream

    stream = full_batch_stream(23, 5, torch.Generator().manual_seed(0), torch.device("cpu"))
    batches = [next(stream) for _ in range(23)]  # 115 indices = 5 epochs
    assert all(len(b) == 5 for b in batches)
    order = torch.cat(batches).tolist()
    assert all(sorted(order[e * 23:(e + 1) * 23]) == list(range(23)) for e in range(5))
    small = full_batch_stream(3, 20, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert sorted(next(small).tolist()) == [0, 1, 2]  # fewer samples than |D|: the whole set


def test_comparison_table_reports_the_best_client_mean_accuracy():
    from runner.compare_rows import aggregate_row

    row = aggregate_row("x", [{"final_acc": 0.5, "best_client_acc_mean": 0.9}, {"final_acc": 0.5,
                                                                                 "best_client_acc_mean": 0.7}])
    assert row["best_client_acc_mean"] == pytest.approx(0.8) and row["best_client_acc_mean_std"] == pytest.approx(0.02 ** 0.5)  # sample std


def test_comparison_reuses_only_completed_runs_with_the_same_config(tmp_path):
    from runner.compare_jobs import finished_run

    config = {"method": "fedmcsa", "seed": 0, "results-dir": str(tmp_path), "run-name": "fedmcsa-s0"}
    folder = tmp_path / "fedmcsa-s0"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**config, "results-dir": "/elsewhere", "lr": 0.02}))
    code = {"commit": "abc1234", "source_hash": "0123", "dirty": False}
    assert finished_run(config, code) == (None, "not finished")  # cut off: no summary
    (folder / "summary.json").write_text(json.dumps({"status": "completed", "final_acc": 0.5}))
    assert finished_run(config, code) == (None, "no provenance record")  # a run from before runs recorded their code
    from runner.provenance import record

    record(folder, code, config)
    assert finished_run(config, code)[0]["final_acc"] == 0.5  # the folder may have moved; every other key matches
    assert finished_run({**config, "seed": 1}, code) == (None, "config changed")
    assert finished_run(config, {**code, "source_hash": "4567"}) == (None, "source changed")
