"""Tests for fedcore/models.py: body/head split contract, shapes, spec parameter counts."""

import pytest
import torch
from torch import nn

from fedcore.config import MODEL_NAMES
from fedcore.models import MODELS, SplitModel, bavd_map_shapes, bavd_sites, build_model, default_model, pick_device

SHAPES = [(60,), (1, 8, 8), (1, 28, 28), (3, 32, 32)]
FLAT = {"mlr", "dnn"}
# (name, shape) pairs that make sense: flat models take anything, conv models need images.
CASES = [(n, s) for n in sorted(MODELS) for s in SHAPES if n in FLAT or len(s) == 3]


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name,shape", CASES)
def test_split_contract(name, shape, device):
    """On the session's device: a model moved there after it is built (as clients do) runs there, its dummy
    forwards (BAVD map shapes) included."""
    torch.manual_seed(0)
    model = build_model(name, shape, num_classes=7).to(device)
    assert isinstance(model, SplitModel)
    assert len(bavd_map_shapes(model, shape)) == len(bavd_sites(model))
    model.eval()
    batch = 2 if name == "resnet18" else 4
    x = torch.randn(batch, *shape).to(device)
    with torch.no_grad():
        logits, feats = model(x), model.features(x)
        assert logits.shape == (batch, 7)
        assert feats.shape == (batch, model.feature_dim)
        assert torch.allclose(logits, model.head(feats))
    assert isinstance(model.head, nn.Linear)
    assert (model.head.in_features, model.head.out_features) == (model.feature_dim, 7)
    assert all(k.startswith(("body.", "head.")) for k in model.state_dict())
    assert set(model.head.state_dict()) == {"weight", "bias"}


def test_feature_dims():
    expected = {"cnn": 128, "fedavgcnn": 512, "simplecnn": 84, "resnet8": 256, "resnet18": 512}
    for name, d in expected.items():
        assert build_model(name, (3, 32, 32), 10).feature_dim == d
    assert build_model("mlr", (1, 28, 28), 10).feature_dim == 784


def test_flat_model_param_counts():
    assert n_params(build_model("mlr", (60,), 10)) == 610
    assert n_params(build_model("dnn", (60,), 10)) == 1430          # 60-20-10 (Synthetic)
    assert n_params(build_model("dnn", (784,), 10)) == 79510        # 784-100-10 (MNIST)
    assert n_params(build_model("dnn", (1, 28, 28), 10)) == 79510   # images are flattened
    assert build_model("dnn", (60,), 10, hidden=32).feature_dim == 32


def test_fedavgcnn_param_counts():
    m = build_model("fedavgcnn", (1, 28, 28), 10)
    convs = [l for l in m.body if isinstance(l, nn.Conv2d)]
    fc1 = [l for l in m.body if isinstance(l, nn.Linear)]
    assert [n_params(c) for c in convs] == [832, 51264]
    assert fc1[0].in_features == 1024 and n_params(fc1[0]) == 1024 * 512 + 512
    assert n_params(m.head) == 5130
    assert all(c.padding == (0, 0) for c in convs)
    m32 = build_model("fedavgcnn", (3, 32, 32), 10)
    assert n_params(m32.body) == 873408 and n_params(m32.head) == 5130   # fedfcd.md, dim 1600


def test_simplecnn_param_count():
    assert n_params(build_model("simplecnn", (3, 32, 32), 10)) == 62006
    assert n_params(build_model("simplecnn", (3, 32, 32), 100)) == 69656


def test_resnet_param_counts_and_stages():
    m = build_model("resnet8", (3, 32, 32), 10)
    assert n_params(m.body) == 1225024 and n_params(m.head) == 2570    # mupfl.md
    assert isinstance(m.body.stages, nn.ModuleList) and len(m.body.stages) == 3
    seen = []
    hooks = [s.register_forward_hook(lambda _m, _i, o: seen.append(tuple(o.shape[1:]))) for s in m.body.stages]
    m.eval()
    with torch.no_grad():
        m(torch.randn(1, 3, 32, 32))
    for h in hooks:
        h.remove()
    assert seen == [(64, 32, 32), (128, 16, 16), (256, 8, 8)]
    assert any(isinstance(x, nn.BatchNorm2d) for x in m.body.modules())
    r18 = build_model("resnet18", (3, 32, 32), 100)
    assert n_params(r18.body) == 11168832 and n_params(r18.head) == 51300  # CIFAR stem
    assert len(r18.body.stages) == 4


def test_conv_models_reject_vectors():
    with pytest.raises(ValueError):
        build_model("cnn", (60,), 10)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as err:
        build_model("vgg", (3, 32, 32), 10)
    for name in MODELS:
        assert name in str(err.value)


def test_default_model():
    assert default_model((60,)) == "dnn"
    assert default_model((1, 28, 28)) == "cnn"
    assert default_model((1, 8, 8)) == "cnn"
    assert default_model((3, 32, 32)) == "fedavgcnn"
    assert {"mlr", "dnn", "cnn", "fedavgcnn", "resnet8", "resnet18", "simplecnn"} <= set(MODELS)  # methods add theirs


def test_pick_device():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError):
        pick_device("tpu")


@pytest.mark.parametrize("name", ["dnn", "cnn", "resnet8"])
def test_same_seed_same_init(name):
    shape = (60,) if name == "dnn" else (3, 32, 32)
    states = []
    for _ in range(2):
        torch.manual_seed(123)
        states.append(build_model(name, shape, 10).state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    torch.manual_seed(124)
    other = build_model(name, shape, 10).state_dict()
    assert not all(torch.equal(states[0][k], other[k]) for k in states[0])


def _with_torch_pools(model: nn.Module) -> nn.Module:
    """The same model (same weights) with every FastMaxPool2d swapped for PyTorch's own MaxPool2d."""
    import copy

    from fedcore.models import FastMaxPool2d

    twin = copy.deepcopy(model)
    for module in list(twin.modules()):
        for name, child in module.named_children():
            if isinstance(child, FastMaxPool2d):
                setattr(module, name, nn.MaxPool2d(child.kernel_size, child.stride, child.padding))
    return twin


@pytest.mark.parametrize("name,shape", [(n, s) for n, s in CASES if n not in FLAT])
def test_fast_max_pool_gives_pytorchs_values_bit_for_bit(name, shape):
    from fedcore.models import FastMaxPool2d

    torch.manual_seed(1)
    model = build_model(name, shape, num_classes=7).eval()
    twin = _with_torch_pools(model)
    x = torch.randn(2, *shape)  # two samples: a batch, at a ResNet-18 forward and backward each
    with torch.no_grad():  # the fast path
        assert torch.equal(model(x), twin(x)) and torch.equal(model.features(x), twin.features(x))
    x.requires_grad_(True)  # with gradients: PyTorch's own pool, the same gradients
    model(x).sum().backward()
    grad, x.grad = x.grad.clone(), None
    twin(x).sum().backward()
    assert torch.equal(grad, x.grad)
    pool = FastMaxPool2d(2)
    odd = torch.randn(3, 4, 7, 9)
    odd[0, 0, 0, 0] = float("nan")
    with torch.no_grad():  # an odd last row and column are dropped; NaN propagates (NaN != NaN: compared apart)
        fast, ref = pool(odd), nn.MaxPool2d(2)(odd)
    assert fast.shape == ref.shape == (3, 4, 3, 4)
    assert torch.equal(fast.isnan(), ref.isnan()) and torch.equal(fast.nan_to_num(), ref.nan_to_num())


def test_the_schemas_model_names_are_the_registered_models():
    """The run-config schema names the models without importing torch: the two lists must agree."""
    assert tuple(MODELS) == MODEL_NAMES
