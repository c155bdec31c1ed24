"""Every baseline runs in-process (2 rounds, 3 clients) and obeys its method's rules."""

import numpy as np
import pytest
import torch

from fedcore import wire
from fedcore.registry import REGISTRY


def _spy():
    """A fault hook that records every (request, reply) pair and changes nothing."""
    log = []

    def hook(msg, reply):
        log.append((msg, reply))
        return reply

    return hook, log


def _array_keys(message) -> dict[str, list[str]]:
    return {name: list(wire.unpack_arrays(rec)) for name, rec in message.content.array_records.items()}


@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_every_method_runs_two_rounds_with_three_clients(inprocess, method):
    summary, _ = inprocess(method=method, **{"run-name": method})
    assert summary["rounds"] == 2 and summary["num_clients"] == 3 and summary["dropped_replies"] == 0
    assert 0.0 <= summary["final_acc"] <= 1.0


@pytest.mark.parametrize("method", ["fedper", "fedrep"])
def test_fedper_and_fedrep_never_send_the_head(inprocess, method):
    hook, log = _spy()
    inprocess(method=method, faults=hook)
    assert log
    for msg, reply in log:
        for keys in [*_array_keys(msg).values(), *_array_keys(reply).values()]:
            assert not any(k.startswith("head.") for k in keys), keys
    train_up = [_array_keys(r)[wire.WEIGHTS] for m, r in log if m.metadata.message_type == "train"]
    assert all(keys and all(k.startswith("body.") for k in keys) for keys in train_up)


def test_fedproto_sends_no_weights_only_class_features(inprocess):
    hook, log = _spy()
    summary, _ = inprocess(method="fedproto", faults=hook)
    for msg, reply in log:
        for message in (msg, reply):
            assert set(message.content.array_records) <= {wire.CLASS_FEATURES}
    up = [r.content.array_records[wire.CLASS_FEATURES] for m, r in log if m.metadata.message_type == "train"]
    ids, feats, counts = wire.unpack_class_features(up[0])
    assert feats.shape == (len(ids), 128) and (counts > 0).all()  # cnn features, one row per local class
    assert len(ids) == 2  # pathological: 2 classes per client
    fedavg, _ = inprocess(method="fedavg", **{"run-name": "fedavg"})
    assert summary["bytes_up"] < fedavg["bytes_up"] / 50


def _state_vector(record) -> np.ndarray:
    return np.concatenate([v.ravel() for k, v in wire.unpack_arrays(record).items() if v.dtype.kind == "f"])


def _ditto_distances(inprocess, lam):
    """Relative distance of each client's personal model to the global model it last received."""
    hook, log = _spy()
    _, grid = inprocess(method="ditto", faults=hook, **{"ditto.lambda": lam, "ditto.personal-epochs": 3,
                                                       "run-name": f"ditto-{lam}"})
    last_train = [m for m, _ in log if m.metadata.message_type == "train"][-3:]
    distances = []
    for msg in last_train:
        global_w = _state_vector(msg.content.array_records[wire.WEIGHTS])
        personal = _state_vector(grid.contexts[msg.metadata.dst_node_id].state.array_records["personal"])
        distances.append(np.linalg.norm(personal - global_w) / np.linalg.norm(global_w))
    return np.array(distances)


def test_ditto_personal_model_differs_from_global_when_lambda_is_small(inprocess):
    small, large = _ditto_distances(inprocess, 1e-3), _ditto_distances(inprocess, 5.0)
    assert small.min() > 0.05, small
    assert (large < small / 2).all(), (small, large)  # a larger lambda pulls it towards the global model


def test_fedavg_ft_evaluates_after_fine_tuning(inprocess):
    """Same training as FedAvg (same seed), but evaluation of the fine-tuned copy scores higher."""
    fedavg, _ = inprocess(method="fedavg", **{"run-name": "fedavg"})
    ft, _ = inprocess(method="fedavg-ft", **{"run-name": "ft", "fedavg-ft.epochs": 2})
    assert fedavg["bytes_up"] == ft["bytes_up"]
    assert ft["final_acc"] > fedavg["final_acc"] + 0.1


def test_fedprox_with_mu_zero_is_fedavg(inprocess):
    a, _ = inprocess(method="fedavg", **{"run-name": "a"})
    b, _ = inprocess(method="fedprox", **{"run-name": "b", "fedprox.mu": 0.0})
    assert a["final_acc"] == b["final_acc"] and a["client_acc_std"] == b["client_acc_std"]


def test_fedprox_pulls_local_models_towards_the_global_one(inprocess):
    moved = {}
    for mu in (0.0, 10.0):
        hook, log = _spy()
        inprocess(method="fedprox", faults=hook, **{"run-name": f"mu{mu}", "fedprox.mu": mu,
                                                    "local-epochs": 2, "num-server-rounds": 1})
        msg, reply = next((m, r) for m, r in log if m.metadata.message_type == "train")
        sent = _state_vector(msg.content.array_records[wire.WEIGHTS])
        back = _state_vector(reply.content.array_records[wire.WEIGHTS])
        moved[mu] = np.linalg.norm(back - sent)
    assert moved[10.0] < 0.7 * moved[0.0], moved


def _fedrep_client(tmp_path):
    from flwr.app import RecordDict

    from clients.base import ClientEnv
    from clients.fedrep import FedRepClient
    from fedcore.config import Config
    from tests.conftest import small_config

    cfg = Config.from_run_config(small_config(tmp_path, method="fedrep"))
    return FedRepClient(ClientEnv(cfg, pid=0, num_clients=3, state=RecordDict(), server_round=1))


def _snapshot(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_fedrep_head_phase_keeps_the_body_and_body_phase_keeps_the_head(tmp_path):
    client = _fedrep_client(tmp_path)
    model = client.new_model()
    body, head = _snapshot(model.body), _snapshot(model.head)
    client.train_head(model)
    assert all(torch.equal(v, model.body.state_dict()[k]) for k, v in body.items())
    assert not all(torch.equal(v, model.head.state_dict()[k]) for k, v in head.items())
    head = _snapshot(model.head)
    client.train_body(model)
    assert all(torch.equal(v, model.head.state_dict()[k]) for k, v in head.items())
    assert not all(torch.equal(v, model.body.state_dict()[k]) for k, v in body.items())
    assert all(p.requires_grad for p in model.parameters())


def test_fedproto_predicts_by_nearest_global_prototype(tmp_path):
    """With prototypes placed exactly at each test sample's class mean, accuracy follows the prototypes."""
    from flwr.app import RecordDict

    from clients.base import ClientEnv
    from clients.fedproto import FedProtoClient
    from clients.training import class_means, extract_features
    from fedcore.config import Config
    from tests.conftest import small_config

    cfg = Config.from_run_config(small_config(tmp_path, method="fedproto"))
    from fedcore.methods.fedproto import HAS_PROTOTYPES

    client = FedProtoClient(ClientEnv(cfg, pid=0, num_clients=3, state=RecordDict(), server_round=1,
                                      config={HAS_PROTOTYPES: True}))
    model = client.new_model()
    client.save_model(model)
    feats = extract_features(model, client.data.x_test)
    ids, means, counts = class_means(feats, client.data.y_test, client.data.num_classes)
    ids_, means_, counts_ = map(wire.to_host, (ids, means, counts))
    right = RecordDict({wire.CLASS_FEATURES: wire.pack_class_features(ids_, means_, counts_)})
    swapped = RecordDict({wire.CLASS_FEATURES: wire.pack_class_features(ids_[::-1].copy(), means_, counts_)})
    good, bad = client.evaluate(right), client.evaluate(swapped)
    dist = torch.cdist(feats, means)
    assert good.correct == int((ids[dist.argmin(1)] == client.data.y_test).sum())
    assert good.correct > bad.correct


@pytest.mark.parametrize("name", ["protocnn", "fedavgcnn", "dnn"])
def test_one_body_pass_gives_the_same_evaluation_and_features(name):
    """FedProto and pFedPM score the model and classify by features from one body pass
    (``evaluate_features``): loss and accuracy equal ``evaluate_model``'s, features
    ``extract_features``'; protocnn has dropout before its head, inactive in evaluation."""
    from clients.training import evaluate_features, evaluate_model, extract_features
    from fedcore.models import build_model

    torch.manual_seed(0)
    shape = (60,) if name == "dnn" else (1, 28, 28)
    model = build_model(name, shape, 10)
    model.train()  # evaluation must switch dropout off itself
    x, y = torch.randn(37, *shape), torch.randint(0, 10, (37,))
    loss, correct, n, feats = evaluate_features(model, x, y, batch_size=16)  # several batches
    assert (loss, correct, n) == evaluate_model(model, x, y, batch_size=16)
    assert torch.equal(feats, extract_features(model, x, batch_size=16))
