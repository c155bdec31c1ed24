"""MuPFL's rules (mupfl.md section 12 invariants): BAVD, ACMU, PKCF, shapes, partition, sampling.

Each test is named after the invariant it checks; the federation-level ones (module switches,
malformed replies, the real ``flwr run``) are in test_mupfl_federation.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.cluster import KMeans
from sklearn.metrics import silhouette_samples, silhouette_score

from clients import bavd as bavd_rules
from fedcore import class_gradients as cg
from fedcore.models import bavd_map_shapes, bavd_sites, build_model
from fedstrategies import federated_features as ff
from fedstrategies import mupfl_math as mm

# ============================================================================ BAVD


def _model_with_bavd(maps, shape=(1, 8, 8)):
    from clients.mupfl import BAVD

    torch.manual_seed(0)
    model = build_model("mupflcnn", shape, 10)
    return model, BAVD(model, maps, steps=0, previous_loss=0.0, psi_sign="decrease")


def test_bavd_with_a_zero_or_constant_map_is_the_identity_and_bavd_off_is_the_plain_forward():
    torch.manual_seed(1)
    x = torch.rand(5, 1, 8, 8)
    torch.manual_seed(0)
    plain = build_model("mupflcnn", (1, 8, 8), 10)
    expected = plain(x)
    for maps in ([torch.zeros(8, 8), torch.zeros(4, 4)], [torch.full((8, 8), 3.0), torch.full((4, 4), -1.0)]):
        model, bavd = _model_with_bavd(maps)
        assert all(bool(m.all()) for m in bavd.masks)
        assert torch.equal(model(x), expected)  # bitwise: the hooks return the output untouched
        bavd.remove()
        assert torch.equal(model(x), expected)


def test_bavd_output_is_h_or_zero_with_one_mask_for_every_batch_and_channel_and_no_grad_into_the_map():
    torch.manual_seed(2)
    maps = [torch.rand(8, 8), torch.rand(4, 4)]
    model, bavd = _model_with_bavd(maps)
    seen = {}
    site = bavd_sites(model)[0]

    def keep_input(_m, inputs):
        inputs[0].retain_grad()
        seen["h"] = inputs[0]

    site.register_forward_pre_hook(keep_input)
    site.register_forward_hook(lambda _m, _i, out: seen.__setitem__("out", out))
    x = torch.rand(4, 1, 8, 8)
    model(x).sum().backward()
    h, out = seen["h"].detach(), seen["out"].detach()
    mask = bavd.masks[0]
    assert ((out == h) | (out == 0)).all()
    assert torch.equal(out, h * mask)  # the same (H, W) mask broadcast over batch and channels
    assert bool(mask.any()) and bool(mask.flatten()[maps[0].argmax()])  # the maximum is always kept
    assert (seen["h"].grad[:, :, ~mask] == 0).all()  # dropped positions pass no gradient
    assert not any(m.requires_grad for m in bavd.maps) and all(m.grad is None for m in bavd.maps)
    bavd.remove()


def test_bavd_mask_is_invariant_to_positive_affine_rescaling_and_to_the_normalisation():
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        M = torch.randn(7, 9, generator=g)
        mask = bavd_rules.bavd_mask(M)
        assert torch.equal(mask, bavd_rules.bavd_mask(3.7 * M + 11.0))
        assert torch.equal(mask, bavd_rules.bavd_mask((M - M.mean()) / M.std()))  # z-score first
        assert torch.equal(mask, M >= M.mean())  # no normalisation at all
        assert torch.equal(mask, bavd_rules.bavd_mask((M - M.min()) / (M.max() - M.min())))  # min-max twice


def test_map_update_is_eq6_exactly_with_both_signs_and_the_counter_runs_on():
    from clients.mupfl import BAVD

    torch.manual_seed(4)
    for sign in ("decrease", "literal"):
        model = build_model("mupflcnn", (1, 8, 8), 10)
        bavd = BAVD(model, [torch.zeros(8, 8), torch.zeros(4, 4)], 0, 0.0, sign)
        bavd.recording = True
        losses = [float(torch.tensor(v)) for v in (2.0, 1.5, 1.7)]  # batch losses are float32
        for step, loss in enumerate(losses):
            model(torch.rand(6, 1, 8, 8))
            before = bavd.maps[1].clone()
            r = bavd._batch_means[1]
            bavd.after_step(step, torch.tensor(loss), None)
            if step == 0:
                assert torch.equal(bavd.maps[1], r)  # lambda = 0: M = mean_bc h
            else:
                psi = losses[step - 1] - loss if sign == "decrease" else loss - losses[step - 1]
                assert torch.equal(bavd.maps[1], before + psi * r)
            assert bavd.steps == step + 1 and bavd.previous_loss == loss
        bavd.remove()
    assert bavd_rules.loss_change(2.0, 1.5, "decrease") == 0.5 and bavd_rules.loss_change(2.0, 1.5, "literal") == -0.5


def test_bavd_map_is_recorded_before_the_mask():
    """r is the mean of the pre-mask activation, even where the mask zeroes positions."""
    maps = [torch.rand(8, 8), torch.rand(4, 4)]
    model, bavd = _model_with_bavd(maps)
    bavd.recording = True
    inputs = {}
    bavd_sites(model)[0].register_forward_pre_hook(lambda _m, i: inputs.__setitem__("h", i[0].detach()))
    model(torch.rand(3, 1, 8, 8))
    assert torch.equal(bavd._batch_means[0], inputs["h"].mean(dim=(0, 1)))
    bavd.remove()


# ============================================================================ ACMU


def _vectors(m=8, p=50, q=12, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, p)), rng.random((m, q))


def test_dist_symmetric_unit_diagonal_scale_invariant_and_alpha_extremes():
    x, a = _vectors()
    dist = mm.combined_similarity(x @ x.T, a @ a.T, 0.5)
    assert np.allclose(dist, dist.T) and np.allclose(np.diag(dist), 1.0)
    scale = np.array([0.1, 3, 7, 1, 2, 9, 0.5, 4])[:, None]
    assert np.allclose(dist, mm.combined_similarity((scale * x) @ (scale * x).T, (a / scale) @ (a / scale).T, 0.5))
    other_maps = np.random.default_rng(9).random(a.shape)
    only_w = mm.combined_similarity(x @ x.T, a @ a.T, 1.0)
    assert np.allclose(only_w, mm.combined_similarity(x @ x.T, other_maps @ other_maps.T, 1.0))
    assert np.allclose(only_w, mm.cosine_matrix(x @ x.T))
    only_m = mm.combined_similarity(x @ x.T, a @ a.T, 0.0)
    other_w = np.random.default_rng(8).standard_normal(x.shape)
    assert np.allclose(only_m, mm.combined_similarity(other_w @ other_w.T, a @ a.T, 0.0))
    cos = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (x / np.linalg.norm(x, axis=1, keepdims=True)).T
    assert np.allclose(only_w, cos)


def test_embedding_identity_and_the_row_space_embedding_keeps_every_distance():
    x, a = _vectors(m=10, p=400, q=30, seed=1)
    dist = mm.combined_similarity(x @ x.T, a @ a.T, 0.5)
    e = mm.spec_embedding(x, a, 0.5)
    sq = ((e[:, None] - e[None]) ** 2).sum(-1)
    assert np.allclose(sq, 2 * (1 - dist))
    y = mm.gram_embedding(dist)
    assert y.shape[1] <= 10
    assert np.allclose(((y[:, None] - y[None]) ** 2).sum(-1), sq, atol=1e-10)
    # k-means sees the same geometry: identical clusters on the spec's 430-d points and on y
    for k in (2, 3, 4):
        on_e = KMeans(k, init="k-means++", n_init=10, random_state=5).fit_predict(e)
        assert np.array_equal(on_e, mm.kmeans_labels(y, k, seed=5))


def test_chosen_count_maximises_the_silhouette_over_the_range_brute_force():
    rng = np.random.default_rng(2)
    centres = rng.standard_normal((4, 60)) * 3
    x = np.repeat(centres, [3, 4, 2, 3], axis=0) + rng.standard_normal((12, 60))
    a = rng.random((12, 16))
    dist = mm.combined_similarity(x @ x.T, a @ a.T, 0.5)
    got = mm.choose_clusters(dist, 2, 6, seed=7)
    e = mm.spec_embedding(x, a, 0.5)
    d = 1 - dist
    np.fill_diagonal(d, 0)
    brute = {}
    for k in range(2, 7):
        labels = KMeans(k, init="k-means++", n_init=10, random_state=7).fit_predict(e)
        brute[k] = silhouette_score(np.clip(d, 0, None), labels, metric="precomputed")
    best = max(brute.values())
    assert got.count == min(k for k, s in brute.items() if s == best)  # argmax, ties to the smaller
    assert got.silhouette == pytest.approx(best)
    assert got.scores == pytest.approx(brute)
    assert mm.candidate_counts(12) == [2, 3, 4, 5, 6] and mm.candidate_counts(4) == [2, 3]
    assert mm.candidate_counts(2) == [] and mm.choose_clusters(dist[:2, :2]).count == 1


def test_singletons_have_silhouette_zero():
    x, a = _vectors(m=6, seed=3)
    d = mm.dissimilarity(mm.combined_similarity(x @ x.T, a @ a.T, 0.5))
    labels = np.array([0, 0, 1, 1, 1, 2])  # client 5 alone
    assert silhouette_samples(d, labels, metric="precomputed")[5] == 0.0
    a_i = d[0, 1]
    b_i = min(d[0, 2:5].mean(), d[0, 5])
    expected_0 = (b_i - a_i) / max(a_i, b_i)
    assert silhouette_samples(d, labels, metric="precomputed")[0] == pytest.approx(expected_0)
    assert mm.silhouette(d, labels) == pytest.approx(silhouette_samples(d, labels, metric="precomputed").mean())


def test_two_well_separated_groups_are_recovered():
    rng = np.random.default_rng(4)
    base = rng.standard_normal((2, 300))
    x = np.vstack([base[0] + 0.05 * rng.standard_normal((5, 300)), base[1] + 0.05 * rng.standard_normal((4, 300))])
    maps = np.vstack([np.tile([1.0, 0.0], (5, 8)), np.tile([0.0, 1.0], (4, 8))]) + 0.01 * rng.random((9, 16))
    got = mm.choose_clusters(mm.combined_similarity(x @ x.T, maps @ maps.T, 0.5), seed=0)
    assert got.count == 2
    assert len(set(got.labels[:5])) == 1 and len(set(got.labels[5:])) == 1 and got.labels[0] != got.labels[5]


def test_fixed_cluster_count_is_used_as_given():
    x, a = _vectors(m=9, seed=5)
    dist = mm.combined_similarity(x @ x.T, a @ a.T, 0.5)
    for k in (2, 4, 6):
        assert mm.choose_clusters(dist, fixed=k).count == k
        assert len(np.unique(mm.choose_clusters(dist, fixed=k).labels)) == k
    assert mm.choose_clusters(dist, fixed=20).count == 9  # capped at the clients


def test_eq14_every_member_gets_the_same_mean_delta_and_a_singleton_keeps_its_own():
    rng = np.random.default_rng(6)
    starts, updates = rng.standard_normal((6, 20)), rng.standard_normal((6, 20))
    labels = np.array([1, 0, 1, 2, 0, 1])
    tilde = mm.cluster_models(starts, updates, labels)
    for c in (0, 1, 2):
        members = labels == c
        deltas = tilde[members] - starts[members]
        assert np.allclose(deltas, updates[members].mean(0))
    assert np.allclose(tilde[3], starts[3] + updates[3])  # client 3 is alone: w~ = w^(t)


def test_global_model_from_cluster_weights_equals_eq15_and_weights_sum_to_one():
    rng = np.random.default_rng(7)
    starts, updates = rng.standard_normal((7, 15)), rng.standard_normal((7, 15))
    n = np.array([10, 40, 25, 5, 60, 30, 20], dtype=float)
    labels = np.array([0, 1, 0, 2, 1, 1, 3])
    eq15 = (n[:, None] / n.sum() * mm.cluster_models(starts, updates, labels)).sum(0)
    omega = mm.cluster_weights(labels, n)
    assert omega.sum() == pytest.approx(n.sum()) and (n / n.sum()).sum() == pytest.approx(1.0)
    assert np.allclose(eq15, (n[:, None] * starts).sum(0) / n.sum() + (omega[:, None] * updates).sum(0) / n.sum())
    singletons = np.arange(7)
    assert np.array_equal(mm.cluster_weights(singletons, n), n)  # exactly FedAvg's weights
    same_start = np.tile(starts[0], (7, 1))
    fedavg = (n[:, None] * (same_start + updates)).sum(0) / n.sum()
    assert np.allclose((n[:, None] / n.sum() * mm.cluster_models(same_start, updates, singletons)).sum(0), fedavg)


def test_strategy_aggregate_equals_eq14_15_written_out(tmp_path):
    """The strategy's streaming rule (omega-weighted models + head correction) against the spec's
    w~_i = w_i^start + cluster mean update, w_glo = sum n_i/n w~_i, with PKCF start heads."""
    strategy, replies = _strategy_and_replies(pretrained=True)
    keys = strategy.param_keys
    start = np.stack([np.concatenate([(r.arrays["start-head"][k] if k.startswith("head.") else
                                       strategy.global_weights[k]).ravel() for k in keys]) for r in replies])
    final = np.stack([np.concatenate([r.arrays["weights"][k].ravel() for k in keys]) for r in replies])
    n = np.array([r.num_examples for r in replies], dtype=float)
    clustering = strategy.cluster(1, replies)
    assert clustering.count >= 2
    expected = (n[:, None] / n.sum() * mm.cluster_models(start, final - start, clustering.labels)).sum(0)
    metrics = strategy.aggregate(1, replies)
    got = np.concatenate([strategy.global_weights[k].ravel() for k in keys])
    assert np.allclose(got, expected, atol=1e-6)
    assert metrics["clusters"] == clustering.count and -1 <= metrics["silhouette"] <= 1


# ============================================================================ PKCF


def test_closed_form_class_gradients_equal_autograd():
    torch.manual_seed(5)
    K, d = 5, 7
    h, y = torch.randn(23, d), torch.tensor([0, 2, 2, 4, 0, 2, 4, 4, 4, 0, 2, 2, 0, 4, 4, 2, 0, 2, 4, 4, 2, 0, 0])
    head = torch.nn.Linear(d, K)
    z, present = cg.class_gradients(h, y, head.weight.detach(), head.bias.detach(), K)
    assert z.shape == (K, K * d + K) and present.tolist() == [True, False, True, False, True]
    for k in range(K):
        if not present[k]:
            assert (z[k] == 0).all()
            continue
        head.zero_grad()
        F.cross_entropy(head(h[y == k]), y[y == k]).backward()
        assert torch.allclose(z[k], torch.cat([head.weight.grad.flatten(), head.bias.grad]), atol=1e-6)
    H = torch.randn(K * 3, d)
    assert torch.allclose(cg.synthetic_class_gradients(H, head.weight.detach(), head.bias.detach()),
                          cg.class_gradients(H, cg.synthetic_labels(K, 3), head.weight.detach(),
                                             head.bias.detach(), K)[0], atol=1e-6)


def test_z_glo_averages_only_over_the_clients_reporting_each_class():
    z1, z2, z3 = (np.full((3, 4), v) for v in (1.0, 5.0, 9.0))
    p1, p2, p3 = np.array([1, 1, 0]), np.array([1, 0, 0]), np.array([0, 1, 0])
    z, reported = ff.average_class_gradients([(z1 * p1[:, None], p1), (z2 * p2[:, None], p2), (z3 * p3[:, None], p3)])
    assert np.allclose(z[0], 3.0) and np.allclose(z[1], 5.0) and np.allclose(z[2], 0.0)
    assert reported.tolist() == [True, True, False]


def _loop_distance(target, synthetic, reported):
    """CReFF's distance by explicit loops in numpy: per reported class, 1 - cos of each output row of the
    weight gradient and of the bias gradient."""
    t, s = np.asarray(target, dtype=np.float64), np.asarray(synthetic, dtype=np.float64)
    K = t.shape[0]
    d = (t.shape[1] - K) // K
    total = 0.0
    for k in range(K):
        if not reported[k]:
            continue
        parts = [(t[k, j * d:(j + 1) * d], s[k, j * d:(j + 1) * d]) for j in range(K)] + [(t[k, K * d:], s[k, K * d:])]
        for a, b in parts:
            total += 1 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-6)
    return total


def test_matching_distance_is_crefs_row_cosines_summed_over_reported_classes():
    torch.manual_seed(6)
    K, d, m = 4, 6, 5
    weight, bias = torch.randn(K, d), torch.randn(K)
    target = torch.randn(K, K * d + K)
    reported = torch.tensor([True, True, False, True])
    zhat = cg.synthetic_class_gradients(torch.randn(K * m, d), weight, bias)
    loss = ff.matching_distance(target, zhat, reported)
    assert float(loss) == pytest.approx(_loop_distance(target, zhat, reported.numpy()), rel=1e-5)
    assert ff.mean_distance(target, zhat, reported) == pytest.approx(float(loss) / (3 * (K + 1)))
    assert 0 <= ff.mean_distance(target, zhat, reported) <= 2
    changed = target.clone()
    changed[2] = torch.randn(K * d + K) * 100  # an unreported class does not count
    assert float(ff.matching_distance(changed, zhat, reported)) == float(loss)
    everything = torch.ones(K, dtype=torch.bool)
    assert ff.mean_distance(-zhat, zhat, everything) == pytest.approx(2.0, abs=1e-5)
    assert ff.mean_distance(3 * zhat, zhat, everything) == pytest.approx(0.0, abs=1e-5)
    # a row scaled alone changes nothing (row-wise cosines); the same change to one flat vector would
    scaled = zhat.clone()
    scaled[:, :d] *= 50
    assert ff.mean_distance(scaled, zhat, everything) == pytest.approx(0.0, abs=1e-5)
    assert ff.mean_distance(target, zhat, torch.zeros(K, dtype=torch.bool)) == 0.0
    assert float(ff.matching_distance(target, zhat, torch.zeros(K, dtype=torch.bool))) == 0.0


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_match_features_steps_equal_torchs_optimisers(optimizer):
    """The written-out Adam and SGD steps against torch.optim.Adam / SGD on the same loss."""
    torch.manual_seed(7)
    K, d, m = 3, 5, 4
    weight, bias = torch.randn(K, d), torch.randn(K)
    target = torch.randn(K, K * d + K)
    reported = torch.tensor([True, False, True])
    H = torch.randn(K * m, d)
    ref = H.clone().requires_grad_(True)
    opt = torch.optim.Adam([ref], lr=0.05) if optimizer == "adam" else torch.optim.SGD([ref], lr=0.05)
    for _ in range(7):
        opt.zero_grad()
        ff.matching_distance(target, cg.synthetic_class_gradients(ref, weight, bias), reported).backward()
        opt.step()
    before, after = ff.match_features(H, target, reported, weight, bias, steps=7, lr=0.05, optimizer=optimizer)
    assert torch.allclose(H, ref.detach(), atol=1e-5)
    assert after == pytest.approx(ff.mean_distance(target, cg.synthetic_class_gradients(H, weight, bias), reported))
    assert after < before
    with pytest.raises(ValueError, match="optimizer"):
        ff.match_features(H, target, reported, weight, bias, steps=1, lr=0.05, optimizer="rmsprop")
    same = H.clone()
    assert ff.match_features(same, target, reported, weight, bias, steps=0, lr=0.05) == (after, after)
    assert torch.equal(same, H)  # zero steps leave H alone


def test_the_default_matching_halves_the_loss_in_one_round_at_d_1024():
    """#27: at MuPFL's defaults (m, steps, step size, optimiser, N(0, 1) init) the matching loss falls at
    least by half in one server step sequence, on class gradients of real-looking (post-ReLU) features of
    the paper's CNN, d = 1024, 10 classes."""
    from fedcore.methods.mupfl import HPARAMS

    hp = {k: HPARAMS[k].default for k in ("features-per-class", "match-steps", "match-lr", "match-optimizer")}
    torch.manual_seed(8)
    model = build_model("mupflcnn", (1, 16, 16), 10)
    assert model.feature_dim == 1024
    x, y = torch.rand(400, 1, 16, 16), torch.arange(10).repeat(40)
    with torch.no_grad():
        h = model.features(x)
    W, b = model.head.weight.detach(), model.head.bias.detach()
    z, present = cg.class_gradients(h, y, W, b, 10)
    H = torch.randn(10 * hp["features-per-class"], 1024, generator=torch.Generator().manual_seed(0))
    before, after = ff.match_features(H, z, present, W, b, hp["match-steps"], hp["match-lr"], hp["match-optimizer"])
    assert before > 0.5 and after <= 0.5 * before


# ============================================================================ head pre-training


def _client(tmp_path, **hp):
    from clients.base import ClientEnv
    from clients.mupfl import MuPFLClient
    from fedcore.config import Config
    from flwr.app import RecordDict
    from tests.conftest import test_device

    cfg = Config.from_run_config({"method": "mupfl", "dataset": "digits", "partition": "iid", "model": "mupflcnn",
                                  "batch-size": 16, "lr": 0.05, "results-dir": str(tmp_path), "device": test_device(),
                                  **{f"mupfl.{k}": v for k, v in hp.items()}})
    env = ClientEnv(cfg, pid=0, num_clients=3, state=RecordDict(), server_round=2,
                    config={"server-round": 2, "phase": "train", "has-features": True, "lr": 0.05})
    return MuPFLClient(env)


def _features_content(K, m, d):
    from flwr.app import RecordDict

    from fedcore import wire
    from fedcore.methods.mupfl import FEATURES

    return RecordDict({FEATURES: wire.pack_arrays({"features": np.random.default_rng(0).standard_normal(
        (K * m, d)).astype(np.float32)})})


def test_head_pretraining_never_changes_the_extractor_and_m0_or_tau0_leave_the_head_unchanged(tmp_path):
    client = _client(tmp_path, **{"features-per-class": 4, "head-epochs": 2})
    model = client.new_model()
    body, head = ({k: v.clone() for k, v in part.state_dict().items()} for part in (model.body, model.head))
    client.pretrain_head(model, _features_content(10, 4, model.feature_dim), tag=1)
    assert all(torch.equal(v, model.body.state_dict()[k]) for k, v in body.items())  # bitwise
    assert not all(torch.equal(v, model.head.state_dict()[k]) for k, v in head.items())
    assert client.pkcf_active()
    for hp in ({"features-per-class": 0, "head-epochs": 2}, {"features-per-class": 4, "head-epochs": 0}):
        assert not _client(tmp_path, **hp).pkcf_active()
    assert not _client(tmp_path, pkcf=False).pkcf_active()
    # tau = 0 epochs of pre-training is no step at all
    client0 = _client(tmp_path, **{"features-per-class": 4, "head-epochs": 0})
    dev = client0.env.device
    client0.train(model.head, x=torch.randn(40, model.feature_dim, device=dev), y=cg.synthetic_labels(10, 4, dev),
                  epochs=0)
    after = {k: v.clone() for k, v in model.head.state_dict().items()}
    client0.train(model.head, x=torch.randn(40, model.feature_dim, device=dev), y=cg.synthetic_labels(10, 4, dev),
                  epochs=0)
    assert all(torch.equal(v, model.head.state_dict()[k]) for k, v in after.items())


def test_clients_sample_at_most_the_asked_number_per_class(tmp_path):
    client = _client(tmp_path, **{"samples-per-class": 3})
    x, y = client.sample_per_class()
    counts = torch.bincount(y, minlength=10)
    present = torch.bincount(client.data.y_train, minlength=10) > 0
    assert ((counts == 3) | (~present & (counts == 0))).all()
    assert len(x) == len(y)


# ============================================================================ shapes


def test_shapes_of_h_z_and_the_maps():
    assert cg.synthetic_labels(3, 2).tolist() == [0, 0, 1, 1, 2, 2]
    m28 = build_model("mupflcnn", (1, 28, 28), 10)
    assert m28.feature_dim == 3136
    assert sum(p.numel() for p in m28.body.parameters()) == 52096
    assert sum(p.numel() for p in m28.head.parameters()) == 31370
    assert bavd_map_shapes(m28, (1, 28, 28)) == [(28, 28), (14, 14)]
    assert bavd_map_shapes(build_model("resnet8", (3, 32, 32), 10), (3, 32, 32)) == [(32, 32), (16, 16), (8, 8)]
    assert bavd_map_shapes(build_model("cnn", (1, 8, 8), 10), (1, 8, 8)) == []  # no BAVD layers
    strategy, _ = _strategy_and_replies()
    K, d = 10, strategy.model.feature_dim
    schema = strategy.reply_schema(0)
    assert schema["class-gradients"] == {"z": (K, K * d + K), "present": (K,)}
    assert schema["bavd-maps"] == {"0": (8, 8), "1": (4, 4)}
    assert strategy.features.shape == (K * strategy.hp["features-per-class"], d)
    assert strategy.features.dtype == np.float32


# ============================================================================ partition, sampling, lr


def test_longtail_partition_repeats_with_its_seed_and_has_the_imbalance_factor():
    from partitions import build_splits, load_dataset

    data = load_dataset("mnist5k", num_clients=20, seed=0)
    params = {"alpha": 0.5, "imbalance-factor": 10.0}
    a = build_splits(data, "longtail-dirichlet", 20, 3, params)
    b = build_splits(data, "longtail-dirichlet", 20, 3, params)
    assert all(np.array_equal(x.train, y.train) and np.array_equal(x.test, y.test) for x, y in zip(a, b))
    idx = np.concatenate([np.concatenate([s.train, s.test]) for s in a])
    assert len(np.unique(idx)) == len(idx)  # each sample in exactly one client
    totals = np.bincount(data.y[idx], minlength=10)
    assert totals.tolist() == [int(np.floor(500 * 10.0 ** (-k / 9) + 1e-9)) for k in range(10)]
    assert totals[0] / totals[-1] == pytest.approx(10.0)
    assert min(len(s.train) + len(s.test) for s in a) >= 10


@pytest.mark.parametrize("n,expected", [(50, 10), (19, 4), (20, 4)])
def test_participation_is_round_0_2_n_distinct_clients(n, expected):
    from tests.fakes import fake_clients
    from fedcore.config import Config
    from fedcore.models import model_facts
    from fedstrategies.mupfl import MuPFLStrategy

    cfg = Config.from_run_config({"method": "mupfl", "dataset": "digits", "model": "mupflcnn", "fraction-train": 0.2})
    strategy = MuPFLStrategy(cfg, fake_clients(n), model_facts("mupflcnn", (1, 8, 8), 10, 0))
    for rnd in (1, 2, 3):
        pids = strategy.sample_train(rnd)
        assert len(pids) == len(set(pids)) == expected == round(0.2 * n)


def test_learning_rate_decays_by_the_factor_every_few_rounds():
    from fedstrategies.mupfl import round_lr

    assert [round_lr(0.01, 0.995, 3, r) for r in (1, 2, 3, 5, 6)] == pytest.approx(
        [0.01, 0.01, 0.00995, 0.00995, 0.01 * 0.995 ** 2])


# ============================================================================ helpers


def _strategy_and_replies(pretrained=False, m=6, seed=0, **hp):
    """A strategy on digits' mupflcnn and m realistic replies: trained-looking weights in two groups."""
    from tests.fakes import fake_clients
    from fedcore import wire
    from fedcore.config import Config
    from fedcore.models import model_facts
    from fedstrategies.base import ClientReply
    from fedstrategies.mupfl import MuPFLStrategy

    cfg = Config.from_run_config({"method": "mupfl", "dataset": "digits", "model": "mupflcnn",
                                  "mupfl.features-per-class": 5, "mupfl.match-steps": 3,
                                  **{f"mupfl.{k}": v for k, v in hp.items()}})
    strategy = MuPFLStrategy(cfg, fake_clients(m), model_facts("mupflcnn", (1, 8, 8), 10, seed))
    strategy.has_features = pretrained
    rng = np.random.default_rng(seed)
    direction = [{k: rng.standard_normal(v.shape).astype(np.float32) for k, v in strategy.global_weights.items()}
                 for _ in range(2)]
    replies = []
    for pid in range(m):
        group = pid % 2
        weights = {k: (v + 0.1 * direction[group][k] + 0.01 * rng.standard_normal(v.shape)).astype(np.float32)
                   for k, v in strategy.global_weights.items()}
        head = {k: (strategy.global_weights[k] + (0.05 * rng.standard_normal(v.shape) if pretrained else 0)).astype(
            np.float32) for k, v in strategy.global_weights.items() if k.startswith("head.")}
        present = (rng.random(10) < 0.7).astype(np.float32)
        arrays = {"weights": weights, "start-head": head,
                  "class-gradients": {"z": rng.standard_normal((10, 10 * 256 + 10)).astype(np.float32) * present[:, None],
                                      "present": present},
                  "bavd-maps": {"0": rng.random((8, 8)).astype(np.float32) + group,
                                "1": rng.random((4, 4)).astype(np.float32)}}
        replies.append(ClientReply(pid, 10_000 + pid, int(rng.integers(20, 80)), {wire.TRAIN_LOSS: 1.0}, arrays))
    return strategy, replies


# ============================================================================ settings (#27 item 3)


def test_auto_model_is_the_papers_cnn_with_bavd_sites_and_bavd_without_sites_is_a_config_error():
    from tests.fakes import fake_clients
    from fedcore.config import Config, ConfigError
    from fedcore.models import model_facts
    from fedstrategies.mupfl import MuPFLStrategy

    for dataset in ("mnist5k", "digits"):
        assert Config.from_run_config({"method": "mupfl", "dataset": dataset})["model"] == "mupflcnn"
    cfg = Config.from_run_config({"method": "mupfl", "dataset": "digits", "model": "cnn"})
    with pytest.raises(ConfigError, match="mupfl.bavd"):
        MuPFLStrategy(cfg, fake_clients(3), model_facts("cnn", (1, 8, 8), 10, 0))
    off = Config.from_run_config({"method": "mupfl", "dataset": "digits", "model": "cnn", "mupfl.bavd": False})
    assert MuPFLStrategy(off, fake_clients(3), model_facts("cnn", (1, 8, 8), 10, 0)).map_shapes == []


def test_the_cluster_count_is_the_number_of_distinct_clusters():
    """Four clients at two distinct points: k-means asked for 3 clusters finds 2, and 2 is reported."""
    x = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    got = mm.choose_clusters(x @ x.T, fixed=3)
    assert len(np.unique(got.labels)) == 2 and got.count == 2


# ============================================================================ the strategy's messages


def test_train_and_evaluate_messages_carry_the_model_features_flag_and_decayed_lr():
    from fedcore import wire

    strategy, replies = _strategy_and_replies(**{"lr-decay": 0.5, "lr-decay-every": 2})
    lr = strategy.cfg["lr"]
    for pid in (0, 3):  # before any features: the global model only, has-features false
        assert set(strategy.train_payload(pid, 1)) == {wire.WEIGHTS}
        assert strategy.train_config(pid, 1) == {wire.LR: lr, "has-features": False}
        assert set(strategy.evaluate_payload(pid, 1)) == {wire.WEIGHTS}
        assert strategy.evaluate_config(pid, 1) == {wire.LR: lr, "has-features": False}
    strategy.aggregate(1, replies[:4])  # clients 0-3 trained; H now exists
    down = strategy.train_payload(5, 2)
    assert strategy.train_config(5, 2) == {wire.LR: lr * 0.5, "has-features": True}
    assert strategy.train_config(5, 4) == {wire.LR: lr * 0.25, "has-features": True}
    assert np.array_equal(wire.unpack_arrays(down["federated-features"])["features"], strategy.features)
    weights = wire.unpack_arrays(down[wire.WEIGHTS])
    assert all(np.array_equal(weights[k], v) for k, v in strategy.global_weights.items())
    # evaluation: a client that trained evaluates its own model (no H); one that never trained gets H
    assert set(strategy.evaluate_payload(2, 2)) == {wire.WEIGHTS}
    assert strategy.evaluate_config(2, 2)["has-features"] is False
    assert set(strategy.evaluate_payload(5, 2)) == {wire.WEIGHTS, "federated-features"}
    assert strategy.evaluate_config(5, 2)["has-features"] is True
    # the packed records follow the state: a new H or model is sent after the next round
    old_h = strategy.features.copy()
    strategy.aggregate(2, replies)
    again = wire.unpack_arrays(strategy.train_payload(5, 3)["federated-features"])["features"]
    assert np.array_equal(again, strategy.features) and not np.array_equal(again, old_h)
    assert np.array_equal(wire.unpack_arrays(strategy.train_payload(5, 3)[wire.WEIGHTS])["head.bias"],
                          strategy.global_weights["head.bias"])


def test_reply_schema_and_checks_follow_the_modules():
    strategy, replies = _strategy_and_replies()
    schema = strategy.reply_schema(0)
    assert set(schema) == {"weights", "start-head", "class-gradients", "bavd-maps"}
    assert schema["start-head"] == {"head.weight": (10, 256), "head.bias": (10,)}
    assert set(schema["weights"]) == set(strategy.global_weights)
    assert strategy.check_reply(replies[0]) is None
    bad = replies[1]
    bad.arrays["class-gradients"]["present"] = bad.arrays["class-gradients"]["present"] + 0.5
    assert "present must hold only 0 and 1" in strategy.check_reply(bad)
    empty = replies[2]
    empty.num_examples = 0
    assert "no training samples" in strategy.check_reply(empty)
    empty.num_examples = 1  # one sample is enough to weigh a model
    assert strategy.check_reply(empty) is None
    no_pkcf, _ = _strategy_and_replies(pkcf=False, bavd=False)
    assert set(no_pkcf.reply_schema(0)) == {"weights"}
    no_pkcf_replies = _strategy_and_replies(pkcf=False)[1]
    no_pkcf_replies[0].arrays["class-gradients"]["present"][:] = 7  # not read with PKCF off
    assert no_pkcf.check_reply(no_pkcf_replies[0]) is None


def test_aggregate_reports_both_matching_losses_and_moves_h_at_the_received_head():
    from fedstrategies.federated_features import average_class_gradients, match_features

    strategy, replies = _strategy_and_replies(pretrained=True)
    head = {k: strategy.global_weights[k].copy() for k in strategy.head_keys}
    H0 = torch.from_numpy(strategy.features.copy())
    metrics = strategy.aggregate(1, replies)
    z, reported = average_class_gradients((r.arrays["class-gradients"]["z"], r.arrays["class-gradients"]["present"])
                                          for r in replies)
    before, after = match_features(H0, torch.from_numpy(z.astype(np.float32)), torch.from_numpy(reported),
                                   torch.from_numpy(head["head.weight"]), torch.from_numpy(head["head.bias"]),
                                   3, 0.01, "adam")
    assert np.allclose(strategy.features, H0.numpy(), atol=1e-6)
    assert metrics["match-loss-before"] == pytest.approx(before) and metrics["match-loss"] == pytest.approx(after)
    assert after < before and strategy.has_features
    assert set(metrics) == {"clusters", "silhouette", "match-loss-before", "match-loss"}
    none, _ = _strategy_and_replies(pkcf=False)
    assert set(none.aggregate(1, _strategy_and_replies()[1])) == {"clusters", "silhouette"}


def test_without_pretrained_heads_or_acmu_the_global_model_is_fedavg():
    from fedstrategies.aggregate import weighted_average

    strategy, replies = _strategy_and_replies(acmu=False)
    assert not strategy.heads_pretrained(replies)
    n = [r.num_examples for r in replies]
    metrics = strategy.aggregate(1, replies)
    fedavg = weighted_average([r.arrays["weights"] for r in replies], n)
    assert all(np.allclose(strategy.global_weights[k], v, atol=1e-6) for k, v in fedavg.items())
    assert metrics["clusters"] == len(replies) and metrics["silhouette"] == 0.0
    pretrained, replies = _strategy_and_replies(pretrained=True)
    assert pretrained.heads_pretrained(replies)
    assert not pretrained.heads_pretrained(replies[:0])


def test_checkpoint_state_restores_and_repacks():
    from fedcore import wire

    strategy, replies = _strategy_and_replies()
    strategy.train_payload(0, 1)  # packs the initial model
    strategy.aggregate(1, replies)
    other, _ = _strategy_and_replies()
    other.train_payload(0, 1)
    other.load_state_dict(strategy.state_dict())
    down = other.train_payload(0, 2)
    assert np.array_equal(wire.unpack_arrays(down["federated-features"])["features"], strategy.features)
    assert np.array_equal(wire.unpack_arrays(down[wire.WEIGHTS])["head.weight"], strategy.global_weights["head.weight"])
    assert other.trained == set(range(len(replies)))


@pytest.mark.parametrize("pretrained", [False, True])
def test_update_and_map_grams_are_the_inner_products_of_the_flattened_updates_and_maps(pretrained):
    """dw_i = w_i - w_i^start over the trainable tensors, the start head being the one the client sent when
    heads were pre-trained, else the global one; M_i = the concatenated maps. Written out with one big matrix."""
    strategy, replies = _strategy_and_replies(pretrained=pretrained)
    rows = []
    for r in replies:
        parts = []
        for k in strategy.param_keys:
            start = r.arrays["start-head"][k] if (pretrained and k.startswith("head.")) else strategy.global_weights[k]
            parts.append((r.arrays["weights"][k] - start).astype(np.float64).ravel())
        rows.append(np.concatenate(parts))
    dw = np.stack(rows)
    assert np.allclose(strategy._update_gram(replies), dw @ dw.T, rtol=1e-5)
    maps = np.stack([np.concatenate([r.arrays["bavd-maps"]["0"].ravel(), r.arrays["bavd-maps"]["1"].ravel()])
                     for r in replies]).astype(np.float64)
    assert np.allclose(strategy._map_gram(replies), maps @ maps.T)
    assert _strategy_and_replies(bavd=False)[0]._map_gram(replies) is None


def test_the_update_grams_upload_buffer_holds_its_largest_block_exactly(monkeypatch):
    """``row_gram``'s capacity is the most values a block holds (its upload buffers are sized once from it): the
    update Gram passes the clients times its largest tensor, as an integer, not a smaller or fractional size that
    would regrow the buffers tensor after tensor (and fail on CUDA)."""
    from fedstrategies import mupfl as strategy_module

    strategy, replies = _strategy_and_replies()
    seen = {}
    real = strategy_module.pairwise.row_gram

    def spy(blocks, n, capacity):
        blocks = list(blocks)
        seen.update(n=n, capacity=capacity, largest=max(len(rows) * np.asarray(rows[0]).size for rows, _ in blocks))
        return real(blocks, n, capacity=capacity)

    monkeypatch.setattr(strategy_module.pairwise, "row_gram", spy)
    strategy._update_gram(replies)
    assert seen["n"] == len(replies)
    assert isinstance(seen["capacity"], int) and seen["capacity"] == seen["largest"]


def test_cluster_runs_choose_clusters_on_the_combined_similarity_with_the_rounds_seed(monkeypatch):
    """The strategy's ACMU call: Eq. 8 on the update and map Grams, the configured count range and fixed
    count, and a k-means seed drawn from (run seed, round, stream 13), so that a rerun repeats it."""
    from fedstrategies import mupfl as strategy_module

    strategy, replies = _strategy_and_replies(**{"alpha-s": 0.3, "max-clusters": 4, "clusters": 2})
    calls = []
    real = mm.choose_clusters

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(strategy_module.mm, "choose_clusters", spy)
    got = strategy.cluster(5, replies)
    (similarity, low, high, seed), kwargs = calls[0]
    expected = mm.combined_similarity(strategy._update_gram(replies), strategy._map_gram(replies), 0.3)
    assert np.allclose(similarity, expected) and (low, high) == (2, 4) and kwargs == {"fixed": 2}
    assert seed == int(np.random.SeedSequence([strategy.cfg["seed"], 5, 13]).generate_state(1)[0])
    assert got.count == 2


def test_with_pkcf_off_no_start_head_is_read():
    strategy, replies = _strategy_and_replies(pkcf=False)
    for r in replies:
        del r.arrays["start-head"]
    assert not strategy.heads_pretrained(replies)
    strategy.aggregate(1, replies)  # reads no start head


def test_aggregate_records_the_cluster_labels_and_keeps_float32_weights():
    strategy, replies = _strategy_and_replies(pretrained=True)
    clustering = strategy.cluster(1, replies)
    strategy.aggregate(1, replies)
    matrix = strategy.round_matrices["clusters"]
    assert matrix.tolist() == [[r.pid for r in replies], clustering.labels.tolist()]
    assert all(strategy.global_weights[k].dtype == np.float32 for k in strategy.global_weights)


def test_batchnorm_statistics_are_the_sample_weighted_mean_not_the_cluster_weighted_one():
    from tests.fakes import fake_clients
    from fedcore import wire
    from fedcore.config import Config
    from fedcore.models import model_facts
    from fedstrategies.aggregate import weighted_average
    from fedstrategies.base import ClientReply
    from fedstrategies.mupfl import MuPFLStrategy

    cfg = Config.from_run_config({"method": "mupfl", "dataset": "digits", "model": "resnet8", "mupfl.bavd": False,
                                  "mupfl.pkcf": False, "mupfl.clusters": 2})
    strategy = MuPFLStrategy(cfg, fake_clients(4), model_facts("resnet8", (3, 8, 8), 10, 0))
    assert strategy.buffer_keys
    rng = np.random.default_rng(0)
    replies = [ClientReply(pid, pid, n, {wire.TRAIN_LOSS: 1.0}, {"weights": {
        k: (v + rng.standard_normal(v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v
        for k, v in strategy.global_weights.items()}}) for pid, n in enumerate((10, 30, 50, 70))]
    strategy.aggregate(1, replies)
    by_n = weighted_average([{k: r.arrays["weights"][k] for k in strategy.buffer_keys} for r in replies],
                            [10, 30, 50, 70])
    float_buffers = [k for k in strategy.buffer_keys if strategy.global_weights[k].dtype.kind == "f"]
    assert float_buffers and all(np.allclose(strategy.global_weights[k], by_n[k], atol=1e-6) for k in float_buffers)


def test_no_matching_without_features_or_without_reported_classes_and_one_feature_per_class_matches():
    strategy, replies = _strategy_and_replies(**{"features-per-class": 0})
    assert strategy.match(replies, {k: strategy.global_weights[k] for k in strategy.head_keys}) == \
        {"match-loss-before": 0.0, "match-loss": 0.0}
    assert not strategy.has_features
    strategy, replies = _strategy_and_replies()
    for r in replies:
        r.arrays["class-gradients"]["present"][:] = 0
    H = strategy.features.copy()
    assert strategy.match(replies, {k: strategy.global_weights[k] for k in strategy.head_keys}) == \
        {"match-loss-before": 0.0, "match-loss": 0.0}
    assert np.array_equal(strategy.features, H) and not strategy.has_features
    one, replies = _strategy_and_replies(**{"features-per-class": 1})
    H = one.features.copy()
    metrics = one.match(replies, {k: one.global_weights[k] for k in one.head_keys})
    assert metrics["match-loss"] < metrics["match-loss-before"] and not np.array_equal(one.features, H)


def test_a_class_reported_by_one_client_is_that_clients_gradient_and_the_default_optimiser_is_adam():
    z1, z2 = np.full((3, 4), 2.0), np.full((3, 4), 6.0)
    p1, p2 = np.array([1, 1, 0], dtype=np.float32), np.array([1, 0, 0], dtype=np.float32)
    z, reported = ff.average_class_gradients([(z1 * p1[:, None], p1), (z2 * p2[:, None], p2)])
    assert np.allclose(z[0], 4.0) and np.allclose(z[1], 2.0) and reported.tolist() == [True, True, False]
    torch.manual_seed(9)
    W, b, target = torch.randn(3, 4), torch.randn(3), torch.randn(3, 15)
    H = torch.randn(6, 4)
    H2 = H.clone()
    rep = torch.tensor([True, True, False])
    assert ff.match_features(H, target, rep, W, b, 3, 0.05) == ff.match_features(H2, target, rep, W, b, 3, 0.05, "adam")


# ============================================================================ small cases by hand (#26)


def test_bavd_mask_keeps_positions_tied_with_the_mean_and_the_keep_fraction_by_hand():
    # min-max: [0, 1, 2] -> [0, .5, 1], mean .5: the tie at 1 is kept (>=), the 0 dropped
    assert bavd_rules.bavd_mask(torch.tensor([[0.0, 1.0, 2.0]])).tolist() == [[False, True, True]]
    constant = bavd_rules.bavd_mask(torch.full((2, 3), 4.0))
    assert constant.dtype == torch.bool and constant.all()
    from clients.mupfl import BAVD

    # one hot position in 8x8 keeps 1/64; 0..15 in 4x4 keeps the 8 values >= 7.5; the mean over layers
    spike = torch.zeros(8, 8)
    spike[2, 5] = 3.0
    model = build_model("mupflcnn", (1, 8, 8), 10)
    bavd = BAVD(model, [spike, torch.arange(16.0).reshape(4, 4)], 0, 0.0, "decrease")
    assert bavd.masks[0].sum() == 1 and bool(bavd.masks[0][2, 5]) and bavd.masks[1].sum() == 8
    assert bavd.keep_fraction() == pytest.approx((1 / 64 + 8 / 16) / 2)
    bavd.remove()
    plain = BAVD(build_model("cnn", (1, 8, 8), 10), [], 0, 0.0, "decrease")  # a model without BAVD layers
    assert plain.keep_fraction() == 1.0


def test_psi_is_the_loss_decrease_by_default_and_bavd_records_only_while_told():
    assert bavd_rules.loss_change(2.0, 1.5) == 0.5 and bavd_rules.loss_change(1.0, 1.25) == -0.25
    maps = [torch.rand(8, 8), torch.rand(4, 4)]
    model, bavd = _model_with_bavd(maps)
    model(torch.rand(3, 1, 8, 8))
    assert bavd._batch_means == [None, None]  # not recording: a forward leaves r alone
    bavd.remove()


def _autograd_class_gradients(h, y, weight, bias, K):
    head = torch.nn.Linear(h.shape[1], K).to(h.dtype)
    head.weight.data, head.bias.data = weight.clone(), bias.clone()
    rows = []
    for k in range(K):
        head.zero_grad()
        if (y == k).any():
            F.cross_entropy(head(h[y == k]), y[y == k]).backward()
            rows.append(torch.cat([head.weight.grad.flatten(), head.bias.grad]))
        else:
            rows.append(torch.zeros(K * h.shape[1] + K, dtype=h.dtype))
    return torch.stack(rows)


def test_class_gradients_with_a_single_sample_class_a_missing_last_class_and_no_samples_in_float64():
    torch.manual_seed(11)
    K, d = 5, 4
    weight, bias = torch.randn(K, d, dtype=torch.float64), torch.randn(K, dtype=torch.float64)
    # class 1 has one sample, class 0 three (a 1/3 scale float32 would round), classes 3 and 4 none
    y = torch.tensor([0, 2, 1, 0, 2, 0])
    h = torch.randn(6, d, dtype=torch.float64)
    z, present = cg.class_gradients(h, y, weight, bias, K)
    assert present.tolist() == [True, True, True, False, False]
    assert z.shape == (K, K * d + K) and z.dtype == torch.float64
    assert torch.allclose(z, _autograd_class_gradients(h, y, weight, bias, K), rtol=0, atol=1e-13)
    # one sample in all: its own gradient
    z1, p1 = cg.class_gradients(h[:1], y[:1], weight, bias, K)
    assert p1.tolist() == [True, False, False, False, False]
    assert torch.allclose(z1, _autograd_class_gradients(h[:1], y[:1], weight, bias, K), rtol=0, atol=1e-13)
    assert bool(z1[0].abs().sum() > 0)
    # no samples: K zero rows of the full width, nothing present
    z0, p0 = cg.class_gradients(h[:0], y[:0], weight, bias, K)
    assert z0.shape == (K, K * d + K) and not z0.any() and p0.tolist() == [False] * K


def test_matching_distance_is_zero_with_no_class_reported_whatever_the_synthetic_rows():
    target, synthetic = torch.randn(3, 3 * 2 + 3), torch.ones(3, 3 * 2 + 3)
    assert float(ff.matching_distance(target, synthetic, torch.zeros(3, dtype=torch.bool))) == 0.0


def test_row_cosines_damp_rows_shorter_than_the_guard_by_hand():
    """CReFF's guard: each norm is clamped at 1e-6, so two equal rows of norm 1e-7 have cosine
    (1e-7 / 1e-6) ** 2 = 0.01 (not 1), in the weight rows and in the bias row alike."""
    K, d = 2, 3
    tiny = torch.zeros(K, K * d + K, dtype=torch.float64)
    tiny[:, 0] = tiny[:, d] = tiny[:, K * d] = 1e-7  # weight rows 0 and 1, bias
    cos = ff.row_cosines(tiny, tiny)
    assert torch.allclose(cos, torch.full((K, K + 1), 0.01, dtype=torch.float64), rtol=1e-9)


def test_adam_matching_equals_torch_adam_when_the_gradients_are_as_small_as_its_epsilon():
    """W = 0, b = 0: the loss is scale-free in H, so at |H| ~ 1e6 the gradients are ~1e-8 and Adam's
    epsilon (added to the root of the second moment) shapes every step."""
    torch.manual_seed(12)
    K, d, m = 3, 5, 4
    weight, bias = torch.zeros(K, d), torch.zeros(K)
    target, reported = torch.randn(K, K * d + K), torch.ones(K, dtype=torch.bool)
    H = torch.randn(K * m, d) * 1e6
    ref = H.clone().requires_grad_(True)
    opt = torch.optim.Adam([ref], lr=1e4)
    for _ in range(3):
        opt.zero_grad()
        ff.matching_distance(target, cg.synthetic_class_gradients(ref, weight, bias), reported).backward()
        opt.step()
    moved = H.clone()
    ff.match_features(moved, target, reported, weight, bias, steps=3, lr=1e4)
    step = float((ref.detach() - H).abs().max())
    assert step > 1e3  # the steps are not lost in float32 rounding
    assert float((moved - ref.detach()).abs().max()) <= 1e-3 * step


def test_an_unreported_class_averages_to_exact_zeros():
    import warnings

    rng = np.random.default_rng(13)
    K, G = 4, 40  # > 1 KiB of float64: fresh memory, not numpy's small-block cache
    present = np.array([0.0, 1.0, 1.0, 1.0])
    replies = [(rng.standard_normal((K, G)) + 5, present) for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        z, reported = ff.average_class_gradients(replies)
    assert reported.tolist() == [False, True, True, True]
    assert np.array_equal(z[0], np.zeros(G))
    assert np.allclose(z[1:], sum(r[0] for r in replies)[1:] / 3)


def test_cosine_matrix_of_a_zero_or_degenerate_vector_is_zero_without_an_invalid_operation():
    import warnings

    rng = np.random.default_rng(14)
    x = rng.standard_normal((4, 6))
    x[2] = 0.0
    gram = x @ x.T
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        cos = mm.cosine_matrix(gram)
        assert np.array_equal(cos[2], np.zeros(4)) and np.array_equal(cos[:, 2], np.zeros(4))
        unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300)
        assert np.allclose(cos, unit @ unit.T, atol=1e-12)
        # a reply whose Gram diagonal rounds below zero: cosine 0 with everything (130 clients: > 1 KiB)
        big = rng.standard_normal((130, 5))
        degenerate = big @ big.T
        degenerate[0, 0] = -1e-3
        cos = mm.cosine_matrix(degenerate)
        assert np.array_equal(cos[0], np.zeros(130)) and np.isfinite(cos).all()
    # computed in float64 whatever the input
    g32 = (x @ x.T).astype(np.float32) + np.eye(4, dtype=np.float32)
    assert mm.cosine_matrix(g32).dtype == np.float64
    assert np.array_equal(mm.cosine_matrix(g32), mm.cosine_matrix(g32.astype(np.float64)))


def test_spec_embedding_rows_are_unit_for_short_vectors_and_zero_for_zero_vectors():
    import warnings

    rng = np.random.default_rng(15)
    x, a = 1e-3 * rng.standard_normal((8, 300)), 1e-3 * rng.random((8, 20))
    x[-1] = 0.0
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        e = mm.spec_embedding(x, a, 0.25)
    assert np.allclose(np.linalg.norm(e[:-1, :300], axis=1), np.sqrt(0.25))
    assert np.allclose(np.linalg.norm(e[:, 300:], axis=1), np.sqrt(0.75))
    assert np.array_equal(e[-1, :300], np.zeros(300))
    for m, p, row in ((6, 40, 0), (6, 40, -1), (4, 64, 0), (20, 20, -1), (3, 1000, -1)):  # sizes in and out of caches
        u = rng.standard_normal((m, p))
        u[row] = 0.0
        assert np.array_equal(mm.spec_embedding(u, np.ones((m, 2)), 0.5)[row, :p], np.zeros(p))
    assert np.array_equal(mm.spec_embedding(x.astype(np.float32), a, 0.25),
                          mm.spec_embedding(x.astype(np.float32).astype(np.float64), a, 0.25))


def test_dissimilarity_has_no_negative_entries_when_a_similarity_rounds_above_one():
    sim = np.array([[1.0, 1.0 + 1e-12, 0.2], [1.0 + 1e-12, 1.0, 0.5], [0.2, 0.5, 1.0]])
    d = mm.dissimilarity(sim)
    assert d[0, 1] == 0.0 and d[1, 0] == 0.0 and d.min() == 0.0
    assert d[0, 2] == pytest.approx(0.8) and np.array_equal(np.diag(d), np.zeros(3))


def test_gram_embedding_reproduces_a_similarity_of_any_scale():
    rng = np.random.default_rng(16)
    x = rng.standard_normal((5, 3))
    for scale in (1.0, 1e-14):  # every eigenvalue below 1e-12: the cut is relative to the largest
        s = scale * (x @ x.T)
        y = mm.gram_embedding(s)
        assert y.shape[1] == 3
        assert np.allclose(y @ y.T, s, rtol=0, atol=1e-9 * scale)


def test_silhouette_is_defined_up_to_m_minus_one_clusters():
    x, a = _vectors(m=5, seed=17)
    d = mm.dissimilarity(mm.combined_similarity(x @ x.T, a @ a.T, 0.5))
    labels = np.array([0, 0, 1, 2, 3])  # 4 = m - 1 clusters
    assert mm.silhouette(d, labels) == pytest.approx(silhouette_score(d, labels, metric="precomputed"))
    assert mm.silhouette(d, np.arange(5)) is None and mm.silhouette(d, np.zeros(5, dtype=int)) is None


def test_one_cluster_results_and_an_empty_round():
    two = mm.choose_clusters(np.ones((2, 2)))
    assert two.labels.tolist() == [0, 0] and two.labels.dtype == np.int64
    assert (two.count, two.silhouette) == (1, 0.0)
    none = mm.choose_clusters(np.zeros((0, 0)))
    assert (none.count, none.silhouette, len(none.labels)) == (0, 0.0, 0)
    x, a = _vectors(m=9, seed=18)
    one = mm.choose_clusters(mm.combined_similarity(x @ x.T, a @ a.T, 0.5), fixed=1)  # kappa = 1: no k-means
    assert (one.count, one.silhouette, one.scores) == (1, 0.0, {}) and one.labels.tolist() == [0] * 9


def test_a_round_whose_similarities_are_all_zero_is_one_cluster_not_a_crash():
    """Every update and map zero (clients that did not move): the embedding has no dimension left, so every client
    sits at one point; adaptive or fixed, that is one cluster (k-means refuses 0 features)."""
    for fixed in (0, 3):
        same = mm.choose_clusters(np.zeros((5, 5)), fixed=fixed)
        assert (same.count, same.silhouette) == (1, 0.0) and same.labels.tolist() == [0] * 5


def test_choose_clusters_defaults_range_2_to_6_seed_0_and_the_high_end_is_used():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((12, 30))
    sim = mm.cosine_matrix(x @ x.T)
    default = mm.choose_clusters(sim)
    assert sorted(default.scores) == [2, 3, 4, 5, 6]
    assert default.scores == mm.choose_clusters(sim, 2, 6, seed=0).scores
    assert default.scores != mm.choose_clusters(sim, seed=1).scores  # the seed matters on these points
    assert sorted(mm.choose_clusters(sim, 2, 3).scores) == [2, 3]
    assert default.labels.dtype == np.int64


def test_a_fixed_count_whose_silhouette_is_undefined_reports_zero():
    x = np.eye(4)  # 4 orthogonal clients, 4 clusters: every client alone, silhouette undefined
    got = mm.choose_clusters(x @ x.T, fixed=4)
    assert got.count == 4 and got.silhouette == 0.0 and got.scores == {}


def test_a_silhouette_tie_goes_to_the_smaller_count():
    """Two groups of 3 identical clients: k = 2 and k = 3 (which k-means can only split into the same
    2 groups) both score 1; k = 2's labels are kept. Identical clients are one point of the embedding
    exactly, whatever LAPACK's eigenvectors round to (on another build k = 3 split a group: 0.5)."""
    x = np.array([[1.0, 0.0]] * 3 + [[0.0, 1.0]] * 3)
    got = mm.choose_clusters(x @ x.T, seed=0)
    assert got.scores[2] == got.scores[3] == 1.0 and got.count == 2
    points = mm.gram_embedding(x @ x.T)
    assert len(np.unique(points, axis=0)) == 2
    assert np.array_equal(got.labels, mm.kmeans_labels(points, 2, 0))


def test_kmeans_labels_are_ten_restart_kmeans_plus_plus():
    p = np.random.default_rng(8).standard_normal((20, 2))  # points where an 11th restart finds other labels
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.array_equal(mm.kmeans_labels(p, 6, 0), KMeans(6, init="k-means++", n_init=10,
                                                                random_state=0).fit_predict(p))
        assert not np.array_equal(mm.kmeans_labels(p, 6, 0), KMeans(6, init="k-means++", n_init=11,
                                                                    random_state=0).fit_predict(p))


def test_cluster_models_forms_no_empty_cluster():
    rng = np.random.default_rng(19)
    starts, updates = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    with np.errstate(all="raise"):
        tilde = mm.cluster_models(starts, updates, np.array([5, 2, 5, 2]))
    assert np.allclose(tilde[0] - starts[0], updates[[0, 2]].mean(0))


def test_the_cluster_range_is_checked_and_h_is_seeded_and_float32_or_empty_without_pkcf():
    from tests.fakes import fake_clients
    from fedcore import wire
    from fedcore.config import Config, ConfigError
    from fedcore.models import model_facts
    from fedstrategies.mupfl import MuPFLStrategy

    def make(**hp):
        cfg = Config.from_run_config({"method": "mupfl", "dataset": "digits", "model": "mupflcnn",
                                      "mupfl.features-per-class": 2, **{f"mupfl.{k}": v for k, v in hp.items()}})
        return MuPFLStrategy(cfg, fake_clients(4), model_facts("mupflcnn", (1, 8, 8), 10, 0))

    with pytest.raises(ConfigError, match=r"max-clusters \(2\) must be >= mupfl.min-clusters \(3\)"):
        make(**{"min-clusters": 3, "max-clusters": 2})
    assert make(**{"min-clusters": 3, "max-clusters": 3}).hp["max-clusters"] == 3  # a one-count range is fine
    torch.manual_seed(123)
    a = make()
    torch.manual_seed(456)  # H comes from the run's seed, not torch's global generator
    b = make()
    assert a.features.shape == (20, 256) and a.features.dtype == np.float32
    assert np.array_equal(a.features, b.features)
    off = make(pkcf=False)
    assert off.features.shape == (0, 256) and off.features.dtype == np.float32
    # a fresh strategy has no H yet and sends its initial model
    assert a.has_features is False and a.train_config(0, 1)["has-features"] is False
    down = wire.unpack_arrays(a.train_payload(0, 1)[wire.WEIGHTS])
    assert all(np.array_equal(down[k], v) for k, v in a.global_weights.items())


def test_the_matching_uses_the_configured_optimiser_and_the_float32_average():
    from fedcore.models import one_torch_thread
    from fedstrategies.federated_features import average_class_gradients, match_features

    for optimizer in ("sgd", "adam"):
        strategy, replies = _strategy_and_replies(**{"match-optimizer": optimizer, "match-lr": 0.5})
        head = {k: strategy.global_weights[k].copy() for k in strategy.head_keys}
        H = torch.from_numpy(strategy.features.copy())
        strategy.aggregate(1, replies)
        z, reported = average_class_gradients((r.arrays["class-gradients"]["z"], r.arrays["class-gradients"]["present"])
                                              for r in replies)
        with one_torch_thread():
            match_features(H, torch.from_numpy(z.astype(np.float32)), torch.from_numpy(reported),
                           torch.from_numpy(head["head.weight"]), torch.from_numpy(head["head.bias"]), 3, 0.5, optimizer)
        assert np.array_equal(strategy.features, H.numpy())  # bitwise: same optimiser, same float32 target


def test_sample_per_class_takes_the_first_of_each_class_in_the_shuffled_order():
    """Brute force: the generator's permutation, then per class its first ``per_class`` members in that order."""
    from types import SimpleNamespace

    from clients.mupfl import sample_per_class

    g = torch.Generator().manual_seed(20)
    y = torch.randint(0, 4, (60,), generator=g)
    y[y == 3] = 0  # class 3 absent
    data = SimpleNamespace(y_train=y, x_train=torch.arange(60.0)[:, None], num_classes=5)
    x, got_y = sample_per_class(data, 4, torch.Generator().manual_seed(21))
    perm = torch.randperm(60, generator=torch.Generator().manual_seed(21)).tolist()
    expected = [i for c in range(5) for i in [j for j in perm if int(y[j]) == c][:4]]
    assert x[:, 0].long().tolist() == expected and got_y.tolist() == [int(y[i]) for i in expected]


# ============================================================================ spec section 12, written out


def _cos(u, v):
    return float(np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)))


def test_dist_at_a_general_alpha_is_eq8_pair_by_pair_and_the_embedding_distance_is_2_1_minus_dist():
    """Invariant 5 by loops over pairs of raw vectors (not Grams): Dist(i, j) = a cos(dw_i, dw_j) + (1 - a)
    cos(M_i, M_j) at a = 0.3; the embedding built by hand, [sqrt(a) x/|x|, sqrt(1-a) m/|m|], has
    |e_i - e_j|^2 = 2 (1 - Dist(i, j)); and so does the k-means point set the code uses."""
    x, a = _vectors(m=7, p=40, q=9, seed=22)
    alpha = 0.3
    got = mm.combined_similarity(x @ x.T, a @ a.T, alpha)
    e = [np.concatenate([np.sqrt(alpha) * x[i] / np.linalg.norm(x[i]),
                         np.sqrt(1 - alpha) * a[i] / np.linalg.norm(a[i])]) for i in range(7)]
    y = mm.gram_embedding(got)
    for i in range(7):
        for j in range(7):
            dist = alpha * _cos(x[i], x[j]) + (1 - alpha) * _cos(a[i], a[j])
            assert got[i, j] == pytest.approx(dist, abs=1e-12)
            assert float(np.sum((e[i] - e[j]) ** 2)) == pytest.approx(2 * (1 - dist), abs=1e-12)
            assert float(np.sum((y[i] - y[j]) ** 2)) == pytest.approx(2 * (1 - dist), abs=1e-9)


def _loop_silhouette(d, labels):
    """Eqs. 9-12 on the dissimilarity d by explicit loops: a(i) = mean d to the own cluster without i,
    b(i) = min over the other clusters of the mean d, S(i) = (b - a) / max(a, b), 0 for a singleton."""
    s = []
    for i in range(len(labels)):
        own = [j for j in range(len(labels)) if labels[j] == labels[i] and j != i]
        if not own:
            s.append(0.0)
            continue
        a_i = sum(d[i][j] for j in own) / len(own)
        b_i = min(sum(d[i][j] for j in range(len(labels)) if labels[j] == c) / sum(1 for lab in labels if lab == c)
                  for c in set(labels) if c != labels[i])
        s.append((b_i - a_i) / max(a_i, b_i))
    return sum(s) / len(s)


def test_silhouette_is_eqs_9_12_by_loops_with_singletons_zero_and_the_chosen_count_maximises_it():
    """Invariant 6 computed without scikit-learn: the loop silhouette on 1 - Dist (Dist pair by pair), for
    labellings with and without singletons; and the adaptive choice equals the brute-force argmax of the loop
    silhouette over k = 2..6 of 10-restart k-means++ on the hand-built embedding, ties to the smaller k."""
    rng = np.random.default_rng(23)
    centres = 3 * rng.standard_normal((3, 30))
    x = np.repeat(centres, [4, 3, 3], axis=0) + rng.standard_normal((10, 30))
    a = rng.random((10, 8))
    dist = np.array([[0.5 * _cos(x[i], x[j]) + 0.5 * _cos(a[i], a[j]) for j in range(10)] for i in range(10)])
    d = 1 - dist
    for labels in ([0, 0, 0, 0, 1, 1, 1, 2, 2, 2], [0, 0, 1, 1, 1, 2, 2, 2, 3, 4], [5, 1, 1, 1, 1, 1, 7, 7, 7, 9]):
        assert mm.silhouette(mm.dissimilarity(dist), np.array(labels)) == pytest.approx(
            _loop_silhouette(d, labels), abs=1e-12)
    e = np.hstack([np.sqrt(0.5) * x / np.linalg.norm(x, axis=1, keepdims=True),
                   np.sqrt(0.5) * a / np.linalg.norm(a, axis=1, keepdims=True)])
    brute = {k: _loop_silhouette(d, KMeans(k, init="k-means++", n_init=10, random_state=4).fit_predict(e).tolist())
             for k in range(2, 7)}
    got = mm.choose_clusters(mm.combined_similarity(x @ x.T, a @ a.T, 0.5), 2, 6, seed=4)
    best = max(brute.values())
    assert got.count == min(k for k, s in brute.items() if s == best)
    assert got.silhouette == pytest.approx(best, abs=1e-9)
    assert got.silhouette == pytest.approx(_loop_silhouette(d, got.labels.tolist()), abs=1e-9)


@pytest.mark.parametrize("hp", [{"acmu": False}, {"clusters": 6}])
def test_singleton_clusters_keep_each_clients_own_model_so_the_global_is_fedavg_even_from_pretrained_heads(hp):
    """Invariant 7 at the strategy: every cluster a singleton (ACMU off, or a fixed count of m = 6) gives
    w~_i = w_i^(t), so w_glo = sum_i (n_i / n) w_i^(t) (an explicit sum) even when the PKCF start heads differ."""
    strategy, replies = _strategy_and_replies(pretrained=True, **hp)
    assert strategy.heads_pretrained(replies) and strategy.cluster(1, replies).count == 6
    n = [r.num_examples for r in replies]
    strategy.aggregate(1, replies)
    for k in strategy.param_keys:
        fedavg = np.zeros(strategy.global_weights[k].shape)
        for r, n_i in zip(replies, n):
            fedavg += n_i / sum(n) * r.arrays["weights"][k].astype(np.float64)
        assert np.allclose(strategy.global_weights[k], fedavg, atol=1e-6), k


def test_class_gradients_are_the_specs_closed_form_by_explicit_loops():
    """Invariant 8: z^k = mean over the samples of class k of ((softmax(W h + b) - onehot(k)) h^T, softmax - onehot(k)),
    one sample at a time in numpy float64; for the real samples and for the class-major federated features."""
    rng = np.random.default_rng(24)
    K, d = 4, 3
    W, b = rng.standard_normal((K, d)), rng.standard_normal(K)
    h, y = rng.standard_normal((9, d)), [2, 0, 2, 3, 0, 2, 3, 3, 2]  # class 1 absent

    def by_hand(h, y):
        z = np.zeros((K, K * d + K))
        for k in range(K):
            rows = [j for j in range(len(y)) if y[j] == k]
            for j in rows:
                logits = W @ h[j] + b
                r = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
                r[k] -= 1.0
                z[k] += np.concatenate([np.outer(r, h[j]).ravel(), r]) / len(rows)
        return z

    Wt, bt = torch.from_numpy(W), torch.from_numpy(b)
    z, present = cg.class_gradients(torch.from_numpy(h), torch.tensor(y), Wt, bt, K)
    assert present.tolist() == [True, False, True, True]
    assert np.allclose(z.numpy(), by_hand(h, y), rtol=0, atol=1e-12)
    H = rng.standard_normal((K * 2, d))
    zhat = cg.synthetic_class_gradients(torch.from_numpy(H), Wt, bt)
    assert np.allclose(zhat.numpy(), by_hand(H, [k for k in range(K) for _ in range(2)]), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- #27 item 5: the server round's speed-ups


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_match_features_in_place_steps_equal_the_written_out_update_bit_for_bit(optimizer):
    """#27: the in-place Adam / SGD steps of match_features (one buffer, the spent gradient reused) give the same
    H, bit for bit, as the step written as one expression with fresh tensors (the moments updated as before), over
    12 steps at float32."""
    gen = torch.Generator().manual_seed(31)
    K, m, d, steps, lr = 4, 6, 7, 12, 0.03
    weight, bias = torch.randn(K, d, generator=gen) * 0.3, torch.randn(K, generator=gen) * 0.1
    target = torch.randn(K, K * d + K, generator=gen)
    reported = torch.tensor([True, False, True, True])
    H = torch.randn(K * m, d, generator=gen)
    h = H.clone().requires_grad_(True)
    m1, m2 = torch.zeros_like(h), torch.zeros_like(h)
    b1, b2 = ff.ADAM_BETAS
    for t in range(1, steps + 1):
        (grad,) = torch.autograd.grad(
            ff.matching_distance(target, cg.synthetic_class_gradients(h, weight, bias), reported), h)
        with torch.no_grad():
            if optimizer == "sgd":
                h -= lr * grad
                continue
            m1.mul_(b1).add_(grad, alpha=1 - b1)
            m2.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            h -= lr * (m1 / (1 - b1 ** t)) / ((m2 / (1 - b2 ** t)).sqrt() + ff.ADAM_EPS)
    got = H.clone()
    before, after = ff.match_features(got, target, reported, weight, bias, steps, lr, optimizer)
    assert torch.equal(got, h.detach())
    assert after == ff.mean_distance(target, cg.synthetic_class_gradients(h.detach(), weight, bias), reported)
    assert before == ff.mean_distance(target, cg.synthetic_class_gradients(H, weight, bias), reported)
    assert after < before


@pytest.mark.parametrize("acmu", [True, False])
def test_the_strategy_loads_scikit_learn_when_built_with_acmu_on_only(monkeypatch, acmu):
    """#27: scikit-learn (k-means, silhouette; seconds to import) is imported when the strategy is built with
    ACMU on, not in its first clustered round; without ACMU nothing clusters and it is not loaded."""
    calls = []
    monkeypatch.setattr(mm, "load_clustering", lambda: calls.append(1))
    _strategy_and_replies(m=3, acmu=acmu)
    assert calls == ([1] if acmu else [])


def test_server_time_times_mupfls_cosine_matrix_on_the_rounds_stacked_updates_and_maps():
    """#27: the benchmark's "cosine matrix alone" row stacks every sampled client's update (all trainable tensors)
    and maps: its MB are those two float32 matrices, and the note under the table gives the round's ratio to it."""
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.supercore.task_identity import TaskIdentity

    from benchmarks import server_time
    from tests.fakes import fake_reply

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # Message() needs them
    strategy, _ = _strategy_and_replies(m=4)
    msgs = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), None))
    rng = np.random.default_rng(0)
    replies = [fake_reply(strategy, msg, "train", rng) for msg in msgs]
    got = server_time.mupfl_cosine_alone(strategy, replies, repeats=3)
    P = sum(strategy.global_weights[k].size for k in strategy.param_keys)
    maps = sum(int(np.prod(s)) for s in strategy.map_shapes)
    assert got["cosine_mb"] == pytest.approx(len(msgs) * (P + maps) * 4 / 2**20)
    assert got["cosine_s"] > 0 and got["cosine_cpu_s"] >= 0
    parts = server_time.mupfl_unavoidable(strategy, replies, 1)
    assert [p["what"] for p in parts] == ["cosine matrix", "cosine matrix + PKCF matching"]
    assert parts[1]["s"] > parts[0]["s"] > 0
    assert parts[1]["mb"] == pytest.approx(parts[0]["mb"] + strategy.features.nbytes / 2**20)
    rows = [{"method": "mupfl", "clients": n, "round": 1, "round_s": 2.0, "round_cpu_s": 1.0} for n in (1, 10)]
    rows += [{"method": "mupfl (cosine matrix alone)", "clients": 10, "round": 1, "round_s": 0.5, "round_cpu_s": 0.25},
             {"method": "mupfl (cosine matrix alone)", "clients": 1, "round": 1, "round_s": 1.0, "round_cpu_s": 1.0},
             {"method": "mupfl (cosine matrix + PKCF matching alone)", "clients": 10, "round": 1, "round_s": 1.6,
              "round_cpu_s": 0.8}]
    notes = server_time._alone_notes(rows, [1, 10])
    assert notes[-2:] == ["mupfl at 10 clients: round / cosine matrix alone = 4.0 (wall), 4.0 (CPU).",
                          "mupfl at 10 clients: round / cosine matrix + PKCF matching alone = 1.2 (wall), 1.2 (CPU)."]
    assert not any("at 1 clients" in line for line in notes)
