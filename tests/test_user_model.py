"""The user's own model, ``model = 'package.module:factory'`` (fedcore/user_models.py): the body/head split,
the checks at start, and a two-round federation with it."""
from __future__ import annotations

import re
import textwrap

import pytest
import torch

from fedcore.config import USER_MODEL, Config, ConfigError, check_model
from fedcore.models import SplitModel, build_model, seeded_model
from fedcore.registry import REGISTRY
from fedcore.user_models import SPEC, ModelError, check_on_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FACTORIES = '''
import torch
from torch import nn


def pair(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.ReLU()), nn.Linear(12, num_classes)


def whole(input_shape, num_classes):
    c, h, w = input_shape
    return nn.Sequential(nn.Conv2d(c, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * h * w, 10), nn.ReLU(),
                         nn.Linear(10, num_classes))


class Softmaxed(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

    def forward(self, x):
        return self.net(x).softmax(dim=1)


def softmaxed(input_shape, num_classes):
    return Softmaxed(num_classes)


def no_linear(input_shape, num_classes):
    return nn.Sequential(nn.Flatten())


def wide_head(input_shape, num_classes):
    return nn.Flatten(), nn.Linear(10, num_classes)


def mlp_head(input_shape, num_classes):
    return nn.Flatten(), nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, num_classes))


def too_many_outputs(input_shape, num_classes):
    return nn.Flatten(), nn.Linear(64, num_classes + 1)


def image_features(input_shape, num_classes):
    return nn.Conv2d(1, 2, 3), nn.Linear(2, num_classes)


def exploding(input_shape, num_classes):
    body, head = nn.Flatten(), nn.Linear(64, num_classes)
    with torch.no_grad():
        head.weight.fill_(float("inf"))
    return body, head


def not_a_model(input_shape, num_classes):
    return 3

NOT_CALLABLE = 1
'''


@pytest.fixture
def factories(tmp_path, monkeypatch, request):
    """A module of factories under a name of this test's own (models are cached by name)."""
    name = "usermodels_" + re.sub(r"\W", "_", request.node.name)
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_the_config_pattern_and_the_parser_agree():
    for good in ("mypkg.models:tiny", "m:f", "a_b.c1:_f2"):
        assert re.fullmatch(USER_MODEL, good) and SPEC.fullmatch(good)
    for bad in ("mypkg.models:", ":f", "a/b:f", "a:f.g", "a-b:f"):
        assert not re.fullmatch(USER_MODEL, bad) and not SPEC.fullmatch(bad)
    assert Config.from_run_config({"model": "mypkg.models:tiny"})["model"] == "mypkg.models:tiny"
    with pytest.raises(ConfigError, match="; or package.module:factory"):
        Config.from_run_config({"model": "mypkg/models:tiny"})


def test_body_and_head_from_a_pair(factories):
    model = build_model(f"{factories}:pair", (1, 8, 8), 10)
    assert isinstance(model, SplitModel) and model.feature_dim == 12
    assert {k.split(".")[0] for k in model.state_dict()} == {"body", "head"}
    x = torch.randn(4, 1, 8, 8)
    assert torch.equal(model(x), model.head(model.body(x))) and model.features(x).shape == (4, 12)


def test_one_module_splits_at_its_last_linear_and_computes_the_same(factories):
    import importlib

    x = torch.randn(5, 1, 8, 8)
    torch.manual_seed(3)
    original = importlib.import_module(factories).whole((1, 8, 8), 10).eval()
    torch.manual_seed(3)
    model = build_model(f"{factories}:whole", (1, 8, 8), 10).eval()
    assert model.feature_dim == 10 and model.head.in_features == 10 and model.head.out_features == 10
    assert torch.allclose(model(x), original(x))
    assert "head.weight" in model.state_dict() and "body.5.weight" not in model.state_dict()


def test_seeded_user_models_are_identical(factories):
    a, b = (seeded_model(f"{factories}:whole", (1, 8, 8), 10, seed=4) for _ in range(2))
    c = seeded_model(f"{factories}:whole", (1, 8, 8), 10, seed=5)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert not torch.equal(a.state_dict()["head.weight"], c.state_dict()["head.weight"])


@pytest.mark.parametrize("factory,message", [
    ("softmaxed", "its last nn.Linear is not the last step of its forward"),
    ("no_linear", "no nn.Linear to take as its head"),
    ("wide_head", "the head takes 10 features but the body gives 64"),
    ("mlp_head", "the head is a Sequential; it must be one nn.Linear"),
    ("too_many_outputs", r"outputs of shape \(2, 11\) .*expected \(2, 10\)"),
    ("image_features", r"features of shape \(2, 2, 6, 6\) .*end the body with nn.Flatten"),
    ("not_a_model", "the factory returned int"),
    ("NOT_CALLABLE", "has no callable 'NOT_CALLABLE'"),
])
def test_models_that_cannot_work_are_refused_with_the_reason(factories, factory, message):
    with pytest.raises(ModelError, match=message):
        build_model(f"{factories}:{factory}", (1, 8, 8), 10)


def test_a_module_that_is_not_there_names_the_fix():
    with pytest.raises(ModelError, match=r"cannot import 'no_such_pkg_x.models' .*PYTHONPATH"):
        build_model("no_such_pkg_x.models:tiny", (1, 8, 8), 10)


def test_a_non_finite_loss_is_refused_at_start(factories, tmp_path):
    model = build_model(f"{factories}:exploding", (1, 8, 8), 10)
    with pytest.raises(ModelError, match="the loss on a batch of the run's data is .*not finite"):
        check_on_batch(model, torch.randn(4, 1, 8, 8), torch.arange(4), "x")
    cfg = Config.from_run_config({"dataset": "digits", "model": f"{factories}:exploding", "partition": "iid"})
    with pytest.raises(ConfigError, match="not finite"):
        check_model(cfg, 3)


def test_start_check_builds_on_the_run_data_and_knows_mupfl_needs_feature_maps(factories):
    cfg = Config.from_run_config({"dataset": "digits", "model": f"{factories}:whole", "partition": "iid"})
    assert check_model(cfg, 3).startswith(f"model card: {factories}:whole: ")
    with pytest.raises(ConfigError, match="mupfl.bavd = true masks conv feature maps"):
        check_model(Config.from_run_config({"dataset": "digits", "method": "mupfl", "model": f"{factories}:whole",
                                            "partition": "iid"}), 3)
    assert check_model(Config.from_run_config({"dataset": "digits", "model": "cnn"}), 3) == ""


@pytest.mark.long
def test_two_rounds_with_a_user_model(factories, inprocess):
    summary, grid = inprocess(3, method="fedrep", model=f"{factories}:pair", partition="iid")
    assert summary["rounds"] == 2 and summary["model"] == f"{factories}:pair"
    from fedcore import wire

    head = {wire.unpack_arrays(ctx.state.array_records["model"])["head.weight"].shape for ctx in grid.contexts.values()}
    assert head == {(10, 12)}  # each client's personal head is the factory's


@pytest.mark.long
@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_every_method_trains_a_user_model(factories, inprocess, method):
    """One module, its last Linear the head: every method runs two rounds with it (MuPFL without BAVD, which
    needs conv feature maps the model does not mark)."""
    extra = {"mupfl.bavd": False} if method == "mupfl" else {}
    summary, _ = inprocess(3, method=method, model=f"{factories}:whole", partition="iid", **extra)
    assert summary["rounds"] == 2 and summary["dropped_replies"] == 0 and 0 <= summary["final_acc"] <= 1
