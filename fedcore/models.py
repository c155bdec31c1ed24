"""Model zoo for the PFL methods, all split into body (feature extractor) + head (linear classifier).

Shared by both sides: the server builds the seeded initial model (and learns its feature
dimension) from here, clients build theirs, and the ``body.``/``head.`` key prefixes are defined
once. It lives in ``fedcore`` so that the server never imports the client package.

Every PFL method here needs that split (FedPer/FedRep share parts, FedFCD fuses two heads,
FedSaC builds subspaces from features, MuPFL hooks stage activations), so each builder returns
a `SplitModel` whose state_dict keys start with "body." or "head.".

Written from the project specs (no torchvision). Init = PyTorch defaults; the
caller seeds with torch.manual_seed so that every client can start from the same model.
"""

from __future__ import annotations

import copy
import functools
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import numpy as np

import torch
from torch import nn

from fedcore import wire

BODY_PREFIX = "body."  # state-dict keys of the feature extractor
HEAD_PREFIX = "head."  # state-dict keys of the linear classifier


class FastMaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d``; a 2x2, stride-2 pool that no gradient flows through (evaluation, feature
    extraction) is the element-wise maximum of the four strided views instead.

    PyTorch's CPU max pool over NCHW tensors took 5.9 ms of a 14 ms FedAvgCNN forward over 63 MNIST
    images (one thread); the four-view maximum takes 0.6 ms and gives the same values bit for bit
    (a maximum is exact; NaN propagates in both). Where a gradient is needed (training) it is
    PyTorch's own pool, so training is unchanged.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if ((torch.is_grad_enabled() and x.requires_grad) or self.return_indices or self.ceil_mode
                or self.kernel_size not in (2, (2, 2)) or self.stride not in (2, (2, 2))
                or self.padding not in (0, (0, 0)) or self.dilation not in (1, (1, 1)) or x.dim() != 4):
            return super().forward(x)
        h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2  # floor mode drops an odd last row/column
        return torch.maximum(torch.maximum(x[..., 0:h:2, 0:w:2], x[..., 0:h:2, 1:w:2]),
                             torch.maximum(x[..., 1:h:2, 0:w:2], x[..., 1:h:2, 1:w:2]))


class SplitModel(nn.Module):
    """Body (feature extractor) + head (linear classifier): the split every PFL method needs."""

    def __init__(self, body: nn.Module, head: nn.Module, feature_dim: int):
        super().__init__()
        self.body = body
        self.head = head
        self.feature_dim = int(feature_dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, feature_dim) representation, the input of the head."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


# ---------------------------------------------------------------- helpers

def _image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """Conv models need (C, H, W); fail early with a readable message otherwise."""
    if len(input_shape) != 3:
        raise ValueError(f"model '{name}' needs an image input shape (C, H, W), got {tuple(input_shape)}")
    return tuple(int(s) for s in input_shape)  # type: ignore[return-value]


def _flat_dim(module: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Output size of `module` for one sample, found by a dummy forward (any input size works)."""
    was_training = module.training
    module.eval()  # BatchNorm must not update running stats on the dummy batch
    device = next((p.device for p in module.parameters()), torch.device("cpu"))  # a model already on its GPU
    with torch.no_grad():
        out = module(torch.zeros(1, *input_shape, device=device))
    module.train(was_training)
    return int(out.reshape(1, -1).shape[1])


def _five_by_five_padding(h: int, w: int) -> int:
    """Padding for the two-5x5-conv nets: 0 as in the papers, 2 when the input is too small.

    Two unpadded 5x5 convs with 2x2 pools need a side of at least 14 (14->10->5->1); for
    smaller inputs such as 8x8 digits we pad by 2 so the convs keep the spatial size.
    """
    return 0 if min(h, w) >= 14 else 2


def _split(body: nn.Module, input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    d = _flat_dim(body, input_shape)
    return SplitModel(body, nn.Linear(d, num_classes), d)


# ---------------------------------------------------------------- flat models (pFedMe / FedMCSA)

def mlr(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """Multinomial logistic regression: the feature is the flattened input itself."""
    d = 1
    for s in input_shape:
        d *= int(s)
    return SplitModel(nn.Flatten(), nn.Linear(d, num_classes), d)


def dnn(input_shape: tuple[int, ...], num_classes: int, hidden: int | None = None) -> SplitModel:
    """One-hidden-layer MLP; hidden = 20 for small inputs (Synthetic, 60-d) else 100, as in pFedMe."""
    d_in = 1
    for s in input_shape:
        d_in *= int(s)
    hidden = int(hidden) if hidden is not None else (20 if d_in <= 100 else 100)
    body = nn.Sequential(nn.Flatten(), nn.Linear(d_in, hidden), nn.ReLU())
    return SplitModel(body, nn.Linear(hidden, num_classes), hidden)


# ---------------------------------------------------------------- small CNNs

def cnn(input_shape: tuple[int, ...], num_classes: int, hidden: int = 128) -> SplitModel:
    """Small 3x3 CNN that fits both 28x28 and 8x8 inputs (8x8 pools down to 2x2)."""
    c, h, w = _image_shape("cnn", input_shape)
    convs = nn.Sequential(
        nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(), FastMaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), FastMaxPool2d(2),
        nn.Flatten(),
    )
    body = nn.Sequential(*convs, nn.Linear(_flat_dim(convs, (c, h, w)), hidden), nn.ReLU())
    return SplitModel(body, nn.Linear(hidden, num_classes), hidden)


def fedavgcnn(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """PFLlib FedAvgCNN (anchors.md); fc1 input 1024 for 28x28, 1600 for 32x32, computed here."""
    c, h, w = _image_shape("fedavgcnn", input_shape)
    pad = _five_by_five_padding(h, w)  # 2 only for inputs too small for two unpadded 5x5 convs
    convs = nn.Sequential(
        nn.Conv2d(c, 32, 5, padding=pad), nn.ReLU(), FastMaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=pad), nn.ReLU(), FastMaxPool2d(2),
        nn.Flatten(),
    )
    body = nn.Sequential(*convs, nn.Linear(_flat_dim(convs, (c, h, w)), 512), nn.ReLU())
    return SplitModel(body, nn.Linear(512, num_classes), 512)


def simplecnn(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """FedSaC SimpleCNN (LeNet-style, no BN); the feature is fc2's ReLU output, d = 84."""
    c, h, w = _image_shape("simplecnn", input_shape)
    pad = _five_by_five_padding(h, w)  # same small-input rule as fedavgcnn
    convs = nn.Sequential(
        nn.Conv2d(c, 6, 5, padding=pad), nn.ReLU(), FastMaxPool2d(2),
        nn.Conv2d(6, 16, 5, padding=pad), nn.ReLU(), FastMaxPool2d(2),
        nn.Flatten(),
    )
    body = nn.Sequential(
        *convs,
        nn.Linear(_flat_dim(convs, (c, h, w)), 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
    )
    return SplitModel(body, nn.Linear(84, num_classes), 84)


class ActivationGate(nn.Identity):
    """Marks a post-activation output that MuPFL's BAVD may mask; the identity everywhere else.

    It has no parameters, so a model with gates has the same state_dict as one without, and
    baselines that run on the same model are unaffected. ``bavd_sites`` finds the gates.
    """


def mupflcnn(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """MuPFL's Fashion-MNIST CNN (mupfl.md section 2): two 5x5 conv layers and one linear layer.

    Conv(C,32,5,pad 2)-ReLU-gate-MaxPool2 -> Conv(32,64,5,pad 2)-ReLU-gate-MaxPool2 -> flatten;
    the head is Linear(d, K) with d = 64 * (H/4) * (W/4) = 3136 on 28x28 (52,096 body and
    31,370 head parameters for K = 10). Padding 2 keeps the spatial size, so 8x8 digits work too
    (d = 256). The gates are where BAVD masks activations (after each ReLU, before pooling).
    """
    c, h, w = _image_shape("mupflcnn", input_shape)
    body = nn.Sequential(
        nn.Conv2d(c, 32, 5, padding=2), nn.ReLU(), ActivationGate(), FastMaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), ActivationGate(), FastMaxPool2d(2),
        nn.Flatten(),
    )
    return _split(body, (c, h, w), num_classes)


def bavd_sites(model: nn.Module) -> list[nn.Module]:
    """Modules whose outputs MuPFL's BAVD masks, in forward order.

    The model's ``ActivationGate`` modules if it has any; else, for the ResNets, each stage's
    output (the ReLU after the last block's sum: BAVD "after the output ReLU of each stage",
    mupfl.md section 2); else none (BAVD then has nothing to mask).
    """
    gates = [m for m in model.modules() if isinstance(m, ActivationGate)]
    if gates:
        return gates
    body = getattr(model, "body", None)
    if isinstance(body, ResNetBody):
        return list(body.stages)
    return []


def bavd_map_shapes(model: nn.Module, input_shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """(H, W) of each BAVD site's output for one input of ``input_shape`` (a dummy forward)."""
    shapes: list[tuple[int, int]] = []
    hooks = [site.register_forward_hook(lambda _m, _i, out: shapes.append(tuple(out.shape[-2:])))
             for site in bavd_sites(model)]
    try:
        _flat_dim(model, input_shape)
    finally:
        for hook in hooks:
            hook.remove()
    return shapes


# ---------------------------------------------------------------- ResNets (CIFAR stem)

class GlobalAvgPool(nn.Module):
    """(B, C, H, W) -> (B, C), the mean over each map: AdaptiveAvgPool2d(1) + Flatten, bit for bit on
    the CPU, but a plain reduction, whose CUDA backward is deterministic (adaptive pooling's adds atomically)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv-BN, identity or 1x1 conv-BN shortcut, ReLU after the sum."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNetBody(nn.Module):
    """CIFAR-stem ResNet feature extractor: stem -> stages -> global avg pool -> (B, width[-1]).

    `stages` is an nn.ModuleList (one nn.Sequential of BasicBlocks per stage) so that methods can
    hook each stage's output activation (MuPFL applies its activation dropout BAVD there).
    Global average pooling equals the spec's AvgPool(8) on 32x32 and works for any input size.
    BatchNorm lives here, so it is part of the body's state_dict.
    """

    def __init__(self, cin: int, widths: tuple[int, ...], blocks: tuple[int, ...], strides: tuple[int, ...]):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(cin, widths[0], 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        stages, prev = [], widths[0]
        for width, n, stride in zip(widths, blocks, strides):
            layers = [BasicBlock(prev, width, stride)] + [BasicBlock(width, width) for _ in range(n - 1)]
            stages.append(nn.Sequential(*layers))
            prev = width
        self.stages = nn.ModuleList(stages)
        self.pool = GlobalAvgPool()
        self.out_dim = prev

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.pool(x)


def resnet8(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """CReFF ResNet-8 used by MuPFL: one block per stage, widths 64/128/256, d = 256."""
    c, _, _ = _image_shape("resnet8", input_shape)
    body = ResNetBody(c, widths=(64, 128, 256), blocks=(1, 1, 1), strides=(1, 2, 2))
    return SplitModel(body, nn.Linear(body.out_dim, num_classes), body.out_dim)


def resnet18(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """ResNet-18 with the CIFAR stem (3x3 conv1, no maxpool), d = 512.

    Documented variant allowed by fedfcd.md: the torchvision stem (7x7 conv1 + maxpool) has
    7,680 more body parameters for RGB (11,176,512 vs 11,168,832 here).
    """
    c, _, _ = _image_shape("resnet18", input_shape)
    body = ResNetBody(c, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2), strides=(1, 2, 2, 2))
    return SplitModel(body, nn.Linear(body.out_dim, num_classes), body.out_dim)


# ---------------------------------------------------------------- pFedPM / FedProto models

class HeadDropoutModel(SplitModel):
    """A ``SplitModel`` whose decision module is Dropout + Linear (FedProto's CNNMnist/CNNFemnist).

    The dropout sits between body and head so that the body's output (the feature the prototype
    methods average and regularise) is the clean pre-dropout ReLU output, and ``head`` stays a bare
    ``nn.Linear`` as every method expects; ``classify`` is the whole decision module.
    """

    def __init__(self, body: nn.Module, head: nn.Linear, feature_dim: int, p: float = 0.5):
        super().__init__(body, head, feature_dim)
        self.head_dropout = nn.Dropout(p)

    def classify(self, h: torch.Tensor) -> torch.Tensor:
        """Logits from features: dropout (active in train mode only), then the linear head."""
        return self.head(self.head_dropout(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.body(x))


def protocnn(input_shape: tuple[int, ...], num_classes: int, channels: int = 20, conv1_kernel: int = 5,
             feature_dim: int = 50) -> SplitModel:
    """FedProto's CNNMnist, pFedPM's MNIST/FEMNIST model: body to fc1 + ReLU (d = 50), head Dropout + Linear.

    conv1(k) -> maxpool -> ReLU -> conv2(5x5, ``channels``) -> Dropout2d -> maxpool -> ReLU -> fc1 -> ReLU.
    ``channels`` is pFedPM-mh's per-client width (18/20/22); fc1's input (16 * channels on 28x28) is
    computed from the input, so every width gives the same ``feature_dim``. Inputs smaller than 14
    pixels (8x8 digits) are padded so that the convs keep their size.
    """
    c, h, w = _image_shape("protocnn", input_shape)
    small = _five_by_five_padding(h, w) > 0
    convs = nn.Sequential(
        nn.Conv2d(c, 10, conv1_kernel, padding=conv1_kernel // 2 if small else 0), FastMaxPool2d(2), nn.ReLU(),
        nn.Conv2d(10, int(channels), 5, padding=2 if small else 0), nn.Dropout2d(), FastMaxPool2d(2), nn.ReLU(),
        nn.Flatten(),
    )
    body = nn.Sequential(*convs, nn.Linear(_flat_dim(convs, (c, h, w)), feature_dim), nn.ReLU())
    return HeadDropoutModel(body, nn.Linear(feature_dim, num_classes), feature_dim)


def protocnn_femnist(input_shape: tuple[int, ...], num_classes: int, channels: int = 20) -> SplitModel:
    """FedProto's CNNFemnist: ``protocnn`` with a 3x3 first conv."""
    return protocnn(input_shape, num_classes, channels=channels, conv1_kernel=3)


def resnet18_tv(input_shape: tuple[int, ...], num_classes: int, stem_strides: tuple[int, int] = (2, 2)) -> SplitModel:
    """ResNet-18 with the torchvision (ImageNet) stem, as FedProto and pFedPM use on CIFAR-10; d = 512.

    Stem: 7x7 conv (stride ``stem_strides[0]``) -> BN -> ReLU -> 3x3 maxpool (stride
    ``stem_strides[1]``). (2, 2) is torchvision's; pFedPM-mh's CIFAR-10 clients differ in these
    strides ((1, 4) for half of them): both downsample by 4 before the first stage, and global
    average pooling keeps d = 512 whatever the strides.
    """
    c, _, _ = _image_shape("resnet18-tv", input_shape)
    s1, s2 = (int(s) for s in stem_strides)
    body = ResNetBody(c, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2), strides=(1, 2, 2, 2))
    body.stem = nn.Sequential(nn.Conv2d(c, 64, 7, stride=s1, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                              nn.MaxPool2d(3, stride=s2, padding=1))
    return SplitModel(body, nn.Linear(body.out_dim, num_classes), body.out_dim)



# pFedPM-mh: which builder keyword differs between clients, and its values by group of partition ids
# (the server checks the model has variants at start, each client builds its own)
HETEROGENEOUS = {
    "protocnn": ("channels", (18, 20, 22)),
    "protocnn-femnist": ("channels", (18, 20, 22)),
    "resnet18-tv": ("stem_strides", ((1, 4), (2, 2))),
}


def heterogeneous_kwargs(model: str, pid: int, num_clients: int) -> dict:
    """Builder keywords of client ``pid`` in pFedPM-mh: consecutive, near-equal groups of partition ids
    get the variants in order (20 clients, three widths: ids 0-6, 7-13, 14-19, as FedProto's code)."""
    if model not in HETEROGENEOUS:
        raise ValueError(f"pfedpm.heterogeneous needs model one of {', '.join(HETEROGENEOUS)}, got {model!r}")
    key, variants = HETEROGENEOUS[model]
    return {key: variants[pid * len(variants) // num_clients]}


# ---------------------------------------------------------------- registry

MODELS: dict[str, Callable[..., SplitModel]] = {
    "mlr": mlr,
    "dnn": dnn,
    "cnn": cnn,
    "fedavgcnn": fedavgcnn,
    "resnet8": resnet8,
    "resnet18": resnet18,
    "simplecnn": simplecnn,
    "protocnn": protocnn,
    "protocnn-femnist": protocnn_femnist,
    "resnet18-tv": resnet18_tv,
    "mupflcnn": mupflcnn,
}


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **kwargs) -> SplitModel:
    """Build a registered model by name, or the user's ``package.module:factory`` (``fedcore/user_models.py``);
    extra kwargs go to the builder (e.g. dnn's `hidden`)."""
    from fedcore.user_models import build_user_model, is_user_model

    if is_user_model(name):
        if kwargs:
            raise ValueError(f"model {name!r} is the user's own; it takes no builder options {sorted(kwargs)}")
        return build_user_model(name, tuple(int(s) for s in input_shape), int(num_classes))
    key = name.lower()
    if key not in MODELS:
        raise ValueError(f"unknown model '{name}'; valid names: {', '.join(sorted(MODELS))}, or your own as "
                         f"package.module:factory")
    return MODELS[key](tuple(int(s) for s in input_shape), int(num_classes), **kwargs)


def default_model(input_shape: tuple[int, ...]) -> str:
    """Reasonable default per input kind: vectors -> dnn, grey images -> cnn, colour -> fedavgcnn."""
    if len(input_shape) == 1:
        return "dnn"
    if len(input_shape) == 3:
        return "cnn" if int(input_shape[0]) == 1 else "fedavgcnn"
    raise ValueError(f"input shape must be (D,) or (C, H, W), got {tuple(input_shape)}")


def pick_device(preference: str = "auto", key: str = "device") -> torch.device:
    """"auto": cuda when available else cpu; "cpu"; "cuda"/"cuda:N" (error if CUDA is missing or
    the machine has no GPU N: a clear message at start, not a failure inside the first round). ``key``:
    the run-config key the messages name (the clients' ``device`` or the server's ``server-device``)."""
    pref = (preference or "auto").lower()
    if pref == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if pref == "cpu":
        return torch.device("cpu")
    if re.fullmatch(r"cuda(:[0-9]+)?", pref):
        if not torch.cuda.is_available():
            raise RuntimeError(f"{key} '{preference}' requested but CUDA is not available on this machine "
                               f"(torch {torch.__version__}); use {key}='cpu' or 'auto'")
        index = int(pref.split(":")[1]) if ":" in pref else 0
        count = torch.cuda.device_count()
        if index >= count:
            raise RuntimeError(f"{key} '{preference}' requested but this machine has {count} GPU(s) "
                               f"(cuda:0 to cuda:{count - 1}); use {key}='cuda' or one of those")
        return torch.device(pref)
    raise ValueError(f"unknown device preference '{preference}'; use 'auto', 'cpu', 'cuda' or 'cuda:N'")


# ---------------------------------------------------------------- what both sides agree on

@dataclass(frozen=True)
class ModelFacts:
    """What a strategy knows about the model: shapes, classes, feature width and initial tensors.

    The server builds it once from the seeded initial model (``model_facts``), so strategies never
    derive the number of classes from label counts or guess the feature width.
    """

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    feature_dim: int
    initial_weights: dict[str, np.ndarray]

    @property
    def num_parameters(self) -> int:
        return int(sum(v.size for v in self.initial_weights.values()))


def resolve_model_name(name: str, input_shape: tuple[int, ...]) -> str:
    """The run config's ``model`` key, with ``auto`` resolved for this input."""
    return default_model(input_shape) if name == "auto" else name


def seed_torch(seed: int) -> None:
    """Seed torch's global generators. ``torch.manual_seed`` also queues a lazy CUDA seeding that
    captures a stack trace (about 6 ms a call, seconds per round at 100 clients) even where no GPU
    exists; CUDA is seeded here only where it is available."""
    torch.default_generator.manual_seed(int(seed))
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(int(seed))


@functools.lru_cache(maxsize=32)
def _initial_model(name: str, input_shape: tuple[int, ...], num_classes: int, seed: int, kwargs: tuple) -> SplitModel:
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(int(seed))
        return build_model(name, input_shape, num_classes, **dict(kwargs))


def seeded_model(name: str, input_shape: tuple[int, ...], num_classes: int, seed: int, **kwargs) -> SplitModel:
    """The initial model for ``seed``: identical on the server and on every client, whatever the
    state of torch's global generator (it is forked, not consumed). Built once per process and
    copied, since clients ask for it with every message."""
    key = (resolve_model_name(name, input_shape), tuple(int(s) for s in input_shape), int(num_classes), int(seed),
           tuple(sorted(kwargs.items())))
    return copy.deepcopy(_initial_model(*key))


def model_facts(name: str, input_shape: tuple[int, ...], num_classes: int, seed: int) -> ModelFacts:
    model = seeded_model(name, input_shape, num_classes, seed)
    weights = {k: wire.to_host(v) for k, v in model.state_dict().items()}
    return ModelFacts(resolve_model_name(name, input_shape), tuple(int(s) for s in input_shape), int(num_classes),
                      model.feature_dim, weights)


@contextmanager
def one_torch_thread():
    """Run small server-side tensor work on one thread. On matrices of a few thousand entries, thread
    hand-offs and OpenMP spin-waits cost more than the arithmetic: on a busy 2-core machine FedFCD's
    head training took 30-60x and MuPFL's feature matching 12x the CPU time with 2 threads. Restores
    the previous setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
