"""MuPFL's client, one message at a time on a hand-built content: the stage order of a round (PKCF
pre-training -> local training with BAVD -> class gradients), which head is pre-trained, what the reply
carries with its values, what the client keeps in state, and which model it evaluates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore import class_gradients as cg
from fedcore import wire
from fedcore.methods.mupfl import FEATURES, GRADIENTS, MAPS, START_HEAD
from tests.conftest import test_device

M, TAU = 3, 2  # features per class and pre-training epochs: small, every stage still runs


def _client(state=None, server_round=2, has_features=True, val_fraction=0.0, **hp):
    from flwr.app import RecordDict

    from clients.base import ClientEnv
    from clients.mupfl import MuPFLClient
    from fedcore.config import Config

    hp = {"features-per-class": M, "head-epochs": TAU, **hp}
    cfg = Config.from_run_config({"method": "mupfl", "dataset": "digits", "partition": "iid", "model": "mupflcnn",
                                  "batch-size": 32, "lr": 0.05, "local-epochs": 1, "client-threads": 1,
                                  "device": test_device(), "val-fraction": val_fraction,
                                  **{f"mupfl.{k}": v for k, v in hp.items()}})
    env = ClientEnv(cfg, pid=0, num_clients=3, state=RecordDict() if state is None else state,
                    server_round=server_round, config={"server-round": server_round, "phase": "train",
                                                       "has-features": has_features, "lr": 0.05})
    return MuPFLClient(env)


def _content(client, seed=0, with_features=True):
    from flwr.app import RecordDict

    torch.manual_seed(seed)
    model = client.new_model()
    for p in model.parameters():  # a global model unlike the seeded initial one
        p.data.add_(0.05 * torch.randn_like(p))
    content = {wire.WEIGHTS: wire.pack_arrays(model.state_dict())}
    if with_features:
        H = np.random.default_rng(seed).standard_normal((10 * M, model.feature_dim)).astype(np.float32)
        content[FEATURES] = wire.pack_arrays({"features": H})
    return RecordDict(content), model


def _head(state_dict):
    return {k: v for k, v in state_dict.items() if k.startswith("head.")}


def _expected_pretrained(client, start_model, content):
    """PKCF by hand: the same pre-training (same shuffle stream) from the given head."""
    from clients.mupfl import PKCF_TAG

    model = client.new_model()
    model.load_state_dict(start_model.state_dict())
    client.pretrain_head(model, content, PKCF_TAG)
    return {"head." + k: v for k, v in model.head.state_dict().items()}


def _stored_state(client_round=1):
    """Client state after one fit without features: a stored model whose head differs from any global one."""
    client = _client(server_round=client_round, has_features=False)
    content, _ = _content(client, seed=5, with_features=False)
    client.fit(content)
    return client.env.state


@pytest.mark.parametrize("choice", ["stored", "received", "fresh"])
def test_pkcf_pretrains_the_chosen_head_and_local_training_starts_from_it(choice):
    from clients.mupfl import MODEL

    state = _stored_state()
    stored = wire.torch_arrays(state.array_records[MODEL])
    client = _client(state=state, **{"pkcf-head": choice})
    content, received = _content(client)
    start = client.new_model()
    start.load_state_dict(received.state_dict())  # the received body always
    if choice == "stored":
        start.load_state_dict({**received.state_dict(), **_head(stored)})
    elif choice == "fresh":
        start.load_state_dict({**received.state_dict(), **_head(client.new_model().state_dict())})
    expected = _expected_pretrained(_client(state=state, **{"pkcf-head": choice}), start, content)
    upload, _ = client.fit(content)
    got = wire.unpack_arrays(upload[START_HEAD])
    assert set(got) == {"head.weight", "head.bias"}
    for k, v in expected.items():
        assert np.allclose(got[k], wire.to_host(v), atol=1e-6)
    assert not np.allclose(got["head.weight"], wire.to_host(_head(received.state_dict())["head.weight"]))


def test_a_client_without_a_stored_model_pretrains_the_received_head():
    client = _client()
    content, received = _content(client)
    expected = _expected_pretrained(_client(), received, content)
    upload, _ = client.fit(content)
    got = wire.unpack_arrays(upload[START_HEAD])
    assert all(np.allclose(got[k], wire.to_host(v), atol=1e-6) for k, v in expected.items())


def test_without_features_or_with_pkcf_off_the_start_head_is_the_received_one_and_no_pretraining():
    for kwargs in ({"has_features": False}, {"head-epochs": 0}, {"features-per-class": 0}):
        client = _client(**kwargs)
        content, received = _content(client, with_features=kwargs != {"features-per-class": 0})
        upload, _ = client.fit(content)
        got = wire.unpack_arrays(upload[START_HEAD])
        assert all(np.array_equal(got[k], wire.to_host(v)) for k, v in _head(received.state_dict()).items())


def test_the_reply_is_local_training_from_the_pretrained_start_with_bavd_and_the_gradients_at_the_received_head():
    """Stage order and values: weights = local training (with BAVD) of (received body, pre-trained head);
    z = closed-form class gradients of the trained extractor at the received head; the model and the
    maps are kept in state, and lambda counts the steps."""
    from clients.mupfl import BAVD, BAVD_COUNTERS, BAVD_MAPS, MODEL

    client = _client()
    content, received = _content(client)
    upload, metrics = client.fit(content)
    assert set(upload) == {wire.WEIGHTS, START_HEAD, GRADIENTS, MAPS}
    # redo the round by hand with a second, identical client
    twin = _client()
    model = twin.new_model()
    model.load_state_dict({**received.state_dict(), **wire.torch_arrays(upload[START_HEAD])})
    bavd = BAVD.from_state(twin.env, model, "decrease")
    bavd.recording = True
    loss = twin.train(model, after_step=bavd.after_step)
    weights = wire.unpack_arrays(upload[wire.WEIGHTS])
    assert all(np.allclose(weights[k], wire.to_host(v), atol=1e-6) for k, v in model.state_dict().items())
    assert metrics[wire.TRAIN_LOSS] == pytest.approx(loss, rel=1e-5)
    maps = wire.unpack_arrays(upload[MAPS])
    assert all(np.allclose(maps[str(i)], wire.to_host(m)) for i, m in enumerate(bavd.maps))
    assert metrics[wire.METHOD_METRIC_PREFIX + "bavd-keep"] == pytest.approx(bavd.keep_fraction())
    steps = int(np.ceil(twin.data.num_train / 32))
    assert client.env.state.config_records[BAVD_COUNTERS]["steps"] == steps == bavd.steps
    kept = wire.unpack_arrays(client.env.state.array_records[BAVD_MAPS])
    assert all(np.array_equal(kept[k], maps[k]) for k in maps)
    stored = wire.unpack_arrays(client.env.state.array_records[MODEL])
    assert all(np.array_equal(stored[k], weights[k]) for k in weights)  # the model it uploaded
    # z at the received head, from the trained extractor in eval mode (BAVD masks on, as evaluated)
    x, y = twin.sample_per_class()
    model.eval()
    with torch.no_grad():
        h = model.features(x)
    head = _head(received.state_dict())
    z, present = cg.class_gradients(h, y, head["head.weight"], head["head.bias"], 10)
    grads = wire.unpack_arrays(upload[GRADIENTS])
    assert np.allclose(grads["z"], wire.to_host(z), atol=1e-5) and np.array_equal(grads["present"], wire.to_host(present.float()))
    bavd.remove()


def test_z_ref_local_takes_the_gradients_at_the_trained_head():
    client = _client(**{"z-ref": "local"})
    content, _ = _content(client)
    upload, _ = client.fit(content)
    from clients.mupfl import MuPFLClient  # noqa: F401

    trained = wire.torch_arrays(upload[wire.WEIGHTS], client.env.device)
    model = client.new_model()
    model.load_state_dict(trained)
    from clients.mupfl import BAVD

    bavd = BAVD.from_state(client.env, model, "decrease")
    x, y = client.sample_per_class()
    model.eval()
    with torch.no_grad():
        h = model.features(x)
    bavd.remove()
    z, _ = cg.class_gradients(h, y, trained["head.weight"], trained["head.bias"], 10)
    assert np.allclose(wire.unpack_arrays(upload[GRADIENTS])["z"], wire.to_host(z), atol=1e-5)


def test_bavd_off_sends_no_maps_and_pkcf_off_sends_no_gradients():
    upload, metrics = _client(bavd=False).fit(_content(_client(bavd=False))[0])
    assert MAPS not in upload and wire.METHOD_METRIC_PREFIX + "bavd-keep" not in metrics
    upload, _ = _client(pkcf=False).fit(_content(_client(pkcf=False))[0])
    assert set(upload) == {wire.WEIGHTS, MAPS}


def test_evaluation_scores_the_stored_model_and_a_new_client_the_global_model_with_its_pkcf_head():
    from clients.mupfl import MODEL, EVAL_PKCF_TAG
    from clients.training import evaluate_model

    state = _stored_state()
    client = _client(state=state, bavd=False)
    content, received = _content(client)
    stored = client.new_model()
    stored.load_state_dict(wire.torch_arrays(state.array_records[MODEL]))
    got = client.evaluate(content)
    loss, correct, _ = evaluate_model(stored, client.data.x_test, client.data.y_test)
    assert (got.loss, got.correct) == (pytest.approx(loss), correct)
    fresh = _client(bavd=False)
    model = fresh.new_model()
    model.load_state_dict(received.state_dict())
    fresh.pretrain_head(model, content, EVAL_PKCF_TAG)
    loss, correct, _ = evaluate_model(model, fresh.data.x_test, fresh.data.y_test)
    got = _client(bavd=False).evaluate(content)
    assert (got.loss, got.correct) == (pytest.approx(loss), correct)
    # and the stored model is not the global one: the two evaluations differ
    assert client.evaluate(content).loss != pytest.approx(got.loss)


def test_validation_and_test_scores_come_from_one_pkcf_pretraining_and_equal_the_per_split_builds():
    """A client that never trained pre-trains the PKCF head once per evaluation, not once per split; the
    scores are those of the base's two builds (test, then validation from the same random state)."""
    from clients.base import ClientMethod
    from clients.mupfl import MuPFLClient

    client = _client(bavd=False, val_fraction=0.2)
    assert client.data.num_val > 0
    content, _ = _content(client)
    calls = []
    client.pretrain_head = lambda *a, _f=client.pretrain_head: calls.append(1) or _f(*a)
    test, val = client.evaluate_splits(content)
    assert len(calls) == 1
    base_test, base_val = ClientMethod.evaluate_splits(_client(bavd=False, val_fraction=0.2), content)
    assert (test.loss, test.correct, val.loss, val.correct) == (base_test.loss, base_test.correct, base_val.loss,
                                                                base_val.correct)
    assert isinstance(client, MuPFLClient) and _client(bavd=False).evaluate_splits(content)[1] is None


def test_evaluation_applies_the_stored_bavd_masks_only_with_bavd_at_eval():
    from clients.mupfl import BAVD, MODEL
    from clients.training import evaluate_model

    state = _stored_state()
    client = _client(state=state)
    content, _ = _content(client)
    model = client.new_model()
    model.load_state_dict(wire.torch_arrays(state.array_records[MODEL]))
    plain = evaluate_model(model, client.data.x_test, client.data.y_test)
    bavd = BAVD.from_state(client.env, model, "decrease")
    assert bavd.keep_fraction() < 1  # the stored maps drop positions
    masked = evaluate_model(model, client.data.x_test, client.data.y_test)
    bavd.remove()
    assert masked[0] != pytest.approx(plain[0])
    got = client.evaluate(content)
    assert (got.loss, got.correct) == (pytest.approx(masked[0]), masked[1])
    off = _client(state=state, **{"bavd-at-eval": False}).evaluate(content)
    assert (off.loss, off.correct) == (pytest.approx(plain[0]), plain[1])
    # the hooks are gone after evaluating: the model evaluates plainly again
    assert _client(state=state, bavd=False).evaluate(content).loss == pytest.approx(plain[0])


def test_bavd_counters_and_maps_are_restored_from_state_in_the_next_round():
    """lambda and l^(lambda-1) carry over: the next round's BAVD starts at the saved step count with the
    last batch loss of the previous round, and with its maps."""
    from clients.mupfl import BAVD, BAVD_COUNTERS, BAVD_MAPS

    state = _stored_state()
    saved = dict(state.config_records[BAVD_COUNTERS])
    maps = wire.unpack_arrays(state.array_records[BAVD_MAPS])
    assert saved["steps"] > 0 and saved["previous-loss"] > 0
    client = _client(state=state)
    bavd = BAVD.from_state(client.env, client.new_model(), "decrease")
    assert bavd.steps == saved["steps"] and bavd.previous_loss == saved["previous-loss"]
    assert all(np.array_equal(wire.to_host(m), maps[str(i)]) for i, m in enumerate(bavd.maps))
    bavd.remove()


def test_without_bavd_at_eval_the_gradients_are_taken_without_masks_and_present_is_float32():
    from clients.mupfl import BAVD_MAPS

    state = _stored_state()  # maps that drop positions
    client = _client(state=state, **{"bavd-at-eval": False})
    content, received = _content(client)
    upload, _ = client.fit(content)
    assert wire.unpack_arrays(client.env.state.array_records[BAVD_MAPS])  # BAVD ran during training
    model = client.new_model()
    model.load_state_dict(wire.torch_arrays(upload[wire.WEIGHTS]))
    x, y = client.sample_per_class()
    model.eval()
    with torch.no_grad():
        h = model.features(x)  # no hooks on this model: the plain extractor
    head = _head(received.state_dict())
    z, present = cg.class_gradients(h, y, head["head.weight"], head["head.bias"], 10)
    grads = wire.unpack_arrays(upload[GRADIENTS])
    assert np.allclose(grads["z"], wire.to_host(z), atol=1e-5)
    assert grads["present"].dtype == np.float32 and np.array_equal(grads["present"], wire.to_host(present.float()))


def test_one_feature_per_class_and_one_epoch_still_pretrain():
    client = _client(**{"features-per-class": 1, "head-epochs": 1})
    assert client.pkcf_active()
    content, received = _content(client)
    H = np.random.default_rng(0).standard_normal((10, received.feature_dim)).astype(np.float32)
    content[FEATURES] = wire.pack_arrays({"features": H})
    upload, _ = client.fit(content)
    got = wire.unpack_arrays(upload[START_HEAD])
    assert not np.allclose(got["head.weight"], wire.to_host(_head(received.state_dict())["head.weight"]))


def test_pretraining_is_tau_epochs_of_sgd_on_h_in_its_own_shuffle_stream():
    """Eq. 21 by hand: tau shuffled passes over (H, class-major labels) in batches of batch-size, with
    SGD on the head at the message's lr, the shuffles drawn from the client's PKCF stream (tag 1)."""
    from clients.mupfl import PKCF_TAG

    client = _client(**{"head-epochs": 3, "features-per-class": 8})  # 80 features: 3 batches of 32 an epoch
    content, received = _content(client)
    content[FEATURES] = wire.pack_arrays({"features": np.random.default_rng(1).standard_normal(
        (80, received.feature_dim)).astype(np.float32)})
    model = client.new_model()
    model.load_state_dict(received.state_dict())
    client.pretrain_head(model, content, PKCF_TAG)
    H = wire.to_device(wire.unpack_arrays(content[FEATURES])["features"], client.env.device)
    y = torch.arange(10, device=client.env.device).repeat_interleave(8)
    head = client.new_model().head
    head.load_state_dict({k[len("head."):]: v for k, v in _head(received.state_dict()).items()})
    opt = client.env.optimizer(head.parameters())
    g = client.env.generator(PKCF_TAG)
    for _ in range(3):
        for idx in torch.randperm(len(y), generator=g).to(client.env.device).split(32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(head(H[idx]), y[idx]).backward()
            opt.step()
    assert all(torch.allclose(v, model.head.state_dict()[k], atol=1e-6) for k, v in head.state_dict().items())


# ============================================================================ spec section 12, written out


@pytest.mark.parametrize("sign", ["decrease", "literal"])
def test_eq6_unrolled_over_sgd_steps_by_explicit_loops_and_each_mask_from_the_map_before_the_batch(sign):
    """Invariant 4 over 4 real SGD steps, every BAVD layer: M = r^(0) + sum_{l>=1} psi^(l) r^(l), with r^(l) the
    step's pre-mask activation summed by explicit loops over batch and channels (own hooks, not BAVD's record),
    psi^(l) = l^(l-1) - l^(l) ("decrease") or its negative ("literal"); and each step's output is h * 1[M >= mean M]
    of the map as it was before the batch (all kept while the map is zero)."""
    from clients.mupfl import BAVD
    from fedcore.models import bavd_sites, build_model

    torch.manual_seed(21)
    model = build_model("mupflcnn", (1, 8, 8), 10)
    bavd = BAVD(model, [torch.zeros(8, 8), torch.zeros(4, 4)], 0, 0.0, sign)
    bavd.recording = True
    pre, post = {}, {}
    for i, site in enumerate(bavd_sites(model)):  # gates are identities: the input is h before the mask
        site.register_forward_pre_hook(lambda _m, inp, i=i: pre.__setitem__(i, inp[0].detach().clone()))
        site.register_forward_hook(lambda _m, _i, out, i=i: post.__setitem__(i, out.detach().clone()))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    expected = [torch.zeros(8, 8, dtype=torch.float64), torch.zeros(4, 4, dtype=torch.float64)]
    losses = []
    for step in range(4):
        before = [m.clone() for m in bavd.maps]
        x, y = torch.rand(5, 1, 8, 8), torch.randint(0, 10, (5,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        bavd.after_step(step, loss.detach(), None)
        losses.append(float(loss.detach()))
        for i in range(2):
            h = pre[i]
            B, C, H, W = h.shape
            r = torch.zeros(H, W, dtype=torch.float64)
            for b in range(B):
                for c in range(C):
                    r += h[b, c].double()
            r /= B * C
            if step == 0:
                expected[i] = r
            else:
                psi = losses[-2] - losses[-1] if sign == "decrease" else losses[-1] - losses[-2]
                expected[i] = expected[i] + psi * r
            assert torch.allclose(bavd.maps[i].double(), expected[i], rtol=1e-5, atol=1e-6), (step, i)
            keep = torch.ones(H, W, dtype=torch.bool) if step == 0 else before[i] >= before[i].mean()
            assert torch.equal(post[i], h * keep), (step, i)
            if step > 0:
                assert not keep.all()  # the mask does drop positions: the check is not vacuous
    assert bavd.steps == 4 and bavd.previous_loss == losses[-1]
    bavd.remove()


def test_the_upload_has_the_specs_shapes_exactly():
    """Invariant 10 on a real reply: Z is (K, K*d + K) with a (K,) presence mask, one H x W map per BAVD layer,
    the start head is the classifier's shape, and the pre-training labels are arange(K).repeat_interleave(m)."""
    client = _client()
    content, received = _content(client)
    upload, _ = client.fit(content)
    K, d = 10, received.feature_dim
    grads = wire.unpack_arrays(upload[GRADIENTS])
    assert grads["z"].shape == (K, K * d + K) and grads["present"].shape == (K,)
    assert {k: v.shape for k, v in wire.unpack_arrays(upload[MAPS]).items()} == {"0": (8, 8), "1": (4, 4)}
    assert {k: v.shape for k, v in wire.unpack_arrays(upload[START_HEAD]).items()} == \
        {"head.weight": (K, d), "head.bias": (K,)}
    assert cg.synthetic_labels(K, M).tolist() == [k for k in range(K) for _ in range(M)]
