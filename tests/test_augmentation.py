"""`augmentation = "crop-flip"`: each training batch randomly cropped from its padded copy and flipped, as
torchvision's RandomCrop(padding=4) + RandomHorizontalFlip do one image at a time; on by default where a
paper trained so (FedSaC, pFedPM, MuPFL on CIFAR), refused where it cannot apply."""

import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from clients.base import AUGMENT_TAG, ClientEnv
from clients.local import LocalClient
from clients.training import crop_flip
from fedcore.config import Config, ConfigError
from fedcore.models import model_facts
from fedcore.registry import REGISTRY
from tests.conftest import small_config


def _one_at_a_time(x, generator, pad=4):
    """The same draws as crop_flip, applied image by image with slicing and torch.flip."""
    b, _, h, w = x.shape
    offsets = torch.randint(0, 2 * pad + 1, (2, b), generator=generator)
    flip = torch.rand(b, generator=generator) < 0.5
    out = []
    for i in range(b):
        padded = F.pad(x[i], (pad, pad, pad, pad))
        top, left = int(offsets[0, i]), int(offsets[1, i])
        crop = padded[:, top:top + h, left:left + w]
        out.append(crop.flip(-1) if flip[i] else crop)
    return torch.stack(out), offsets, flip


def test_crop_flip_equals_cropping_and_flipping_each_image_by_hand():
    x = torch.randn(32, 3, 6, 5)
    got = crop_flip(x, torch.Generator().manual_seed(3))
    expected, offsets, flip = _one_at_a_time(x, torch.Generator().manual_seed(3))
    assert torch.equal(got, expected)
    # the draws cover crops off the centre and both flip outcomes, so the check above is not of a no-op
    assert (offsets != 4).any() and flip.any() and (~flip).any()
    assert not torch.equal(got, x)


def test_a_centred_crop_without_flip_is_the_image_and_a_corner_crop_shifts_in_zeros():
    x = torch.arange(1.0, 17.0).reshape(1, 1, 4, 4)
    gen = torch.Generator().manual_seed(0)
    # find a seed whose single draw is the centre and no flip, and one that is the top-left corner
    for seed in range(500):
        gen.manual_seed(seed)
        offsets = torch.randint(0, 9, (2, 1), generator=gen)
        flip = torch.rand(1, generator=gen) < 0.5
        if offsets.tolist() == [[4], [4]] and not flip:
            assert torch.equal(crop_flip(x, torch.Generator().manual_seed(seed)), x)
            break
    else:
        pytest.fail("no seed drew the centre")
    for seed in range(500):
        gen.manual_seed(seed)
        offsets = torch.randint(0, 9, (2, 1), generator=gen)
        flip = torch.rand(1, generator=gen) < 0.5
        if offsets.tolist() == [[0], [0]] and not flip:
            out = crop_flip(x, torch.Generator().manual_seed(seed))
            assert torch.equal(out, torch.zeros_like(x))  # 4 rows and columns of padding fill a 4x4 window
            break
    else:
        pytest.fail("no seed drew the corner")


def test_training_sees_augmented_batches_drawn_from_their_own_stream(tmp_path):
    seen = []

    def capture(model, xb, yb):
        seen.append(xb.clone())
        return F.cross_entropy(model(xb), yb)

    def batches(augmentation):
        seen.clear()
        cfg = Config.from_run_config(small_config(tmp_path, method="local", augmentation=augmentation))
        client = LocalClient(ClientEnv(cfg, pid=0, num_clients=3, state=RecordDict(), server_round=1))
        indices = []
        client.train(client.new_model(), steps=3, loss_fn=capture,
                     after_step=lambda step, loss, idx: indices.append(idx.clone()))
        return list(seen), indices, client

    plain, idx_plain, client = batches("none")
    augmented, idx_aug, _ = batches("crop-flip")
    x = client.data.x_train
    crops = client.env.generator(AUGMENT_TAG)  # tag 0 (training's) + the augmentation offset
    for a, b in zip(idx_plain, idx_aug):
        assert torch.equal(a, b)  # the shuffle stream is the same with and without augmentation
    for batch, idx, raw in zip(augmented, idx_aug, plain):
        assert torch.equal(raw, x[idx])
        assert torch.equal(batch, crop_flip(x[idx], crops))
        assert not torch.equal(batch, raw)


def test_features_cached_from_a_body_are_not_augmented(tmp_path):
    cfg = Config.from_run_config(small_config(tmp_path, method="local", augmentation="crop-flip"))
    client = LocalClient(ClientEnv(cfg, pid=0, num_clients=3, state=RecordDict(), server_round=1))
    feats = torch.randn(client.data.num_train, 5).to(client.env.device)
    head = torch.nn.Linear(5, 10).to(client.env.device)
    seen = []
    client.train(head, x=feats, steps=2, loss_fn=lambda m, xb, yb: (seen.append(xb), F.cross_entropy(m(xb), yb))[1],
                 after_step=lambda step, loss, idx: seen.append(feats[idx]))
    assert torch.equal(seen[0], seen[1]) and torch.equal(seen[2], seen[3])


def test_the_paper_settings_turn_it_on_for_cifar_only():
    for method in ("fedsac", "pfedpm", "mupfl"):
        assert Config.from_run_config({"method": method, "dataset": "cifar10"})["augmentation"] == "crop-flip"
        assert Config.from_run_config({"method": method, "dataset": "mnist5k"})["augmentation"] == "none"
    assert Config.from_run_config({"method": "fedsac", "dataset": "cifar100"})["augmentation"] == "crop-flip"
    assert Config.from_run_config({"method": "fedavg", "dataset": "cifar10"})["augmentation"] == "none"
    assert Config.from_run_config({"method": "fedsac", "dataset": "cifar10",
                                   "augmentation": "none"})["augmentation"] == "none"


def test_an_unknown_value_is_refused_with_the_valid_ones():
    with pytest.raises(ConfigError, match="crop-flip") as err:
        Config.from_run_config({"method": "fedavg", "augmentation": "flip"})
    assert "none" in str(err.value)


@pytest.mark.parametrize("method", ["per-fedavg", "pfedme"])
def test_methods_that_draw_their_own_batches_refuse_it(tmp_path, method):
    cfg = Config.from_run_config(small_config(tmp_path, method=method, augmentation="crop-flip"))
    with pytest.raises(ConfigError, match="augmentation"):
        REGISTRY[method].strategy(cfg, {}, model_facts("cnn", (1, 8, 8), 10, 0))


def test_inputs_that_are_not_images_refuse_it(tmp_path):
    cfg = Config.from_run_config(small_config(tmp_path, method="fedavg", augmentation="crop-flip"))
    with pytest.raises(ConfigError, match="image inputs"):
        REGISTRY["fedavg"].strategy(cfg, {}, model_facts("mlr", (60,), 10, 0))
    REGISTRY["fedavg"].strategy(cfg, {}, model_facts("cnn", (1, 8, 8), 10, 0))  # images: accepted
