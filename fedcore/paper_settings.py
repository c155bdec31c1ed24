"""Each paper method's own training setting, so that ``method=X`` alone runs paper X's experiment.

The common training keys below default to ``"auto"``. A key left at ``"auto"`` takes the selected method's value
for the selected dataset (its ``"*"`` entry covers every dataset), else the project-wide fallback. A key given a
value in the run config always wins, so a comparison preset that sets ``lr`` (the same learning-rate rule for every
method) is not changed by this table. The values come from each paper's hyperparameter table as our implementation
specs read them; which source each value has is in docs/papers/<method>.md.

Both sides import this module (the ServerApp and every ClientApp resolve the same config), so it holds plain
values only.
"""

from __future__ import annotations

from typing import Any

from fedcore.fedmcsa_variants import DEFAULT_VARIANT as FEDMCSA_DEFAULT_VARIANT
from fedcore.fedmcsa_variants import VARIANTS as FEDMCSA_VARIANTS

AUTO = "auto"

# The keys this table may set, with the value each takes where no method entry says otherwise. ``model`` has no
# fallback here: "auto" is then resolved from the input shape (fedcore.models.default_model).
FALLBACK: dict[str, Any] = {
    "lr": 0.05,
    "momentum": 0.0,
    "weight-decay": 0.0,
    "local-epochs": 1,
    "local-steps": 0,
    "batch-size": 10,
    "fraction-train": 1.0,
    "augmentation": "none",
}
AUTO_KEYS: tuple[str, ...] = ("model", *FALLBACK)

GREY_28 = ("mnist5k", "mnist", "fmnist")  # the 28x28 grey-image sets, which share a paper's model


def _model(name: str, *datasets: str) -> dict[str, dict[str, Any]]:
    """The same model for several datasets, as dataset entries of one method."""
    return {dataset: {"model": name} for dataset in datasets}


# PAPER_SETTINGS[method][dataset or "*"] = {key: value}; a dataset's entry is laid over the method's "*" entry.
# A model is named only for datasets whose input the paper's model fits (the embedded 8x8 ``digits`` keeps the
# shape-based default).
PAPER_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    # pFedPM (Xing et al.), spec section 8: SGD lr 0.01, momentum 0.5, batch 10, E = 1, all clients every round;
    # the prototype CNN of FedProto for MNIST/FEMNIST, ResNet-18 (torchvision stem, d = 512) on CIFAR-10
    "pfedpm": {
        "*": {"lr": 0.01, "momentum": 0.5, "weight-decay": 0.0, "batch-size": 10, "local-epochs": 1,
              "fraction-train": 1.0},
        "mnist5k": {"model": "protocnn"},
        "mnist": {"model": "protocnn"},
        "femnist": {"model": "protocnn-femnist"},
        "cifar10": {"model": "resnet18-tv", "augmentation": "crop-flip"},  # FedProto's code: crop + flip on CIFAR-10
    },
    # FedMCSA (Guo et al. 2023), Table of hyperparameters: eta 0.02, batch 20, R = 20 local steps, no momentum,
    # MLR on Synthetic. fraction-train stays 1.0: FedMCSA samples its S clients itself (fedmcsa.clients-per-round)
    # and every client trains each round (Alg. 1); weight decay comes from fedmcsa.variant (fedcore/fedmcsa_variants.py)
    "fedmcsa": {
        "*": {"lr": 0.02, "momentum": 0.0, "batch-size": 20, "local-steps": 20, "fraction-train": 1.0,
              "weight-decay": FEDMCSA_VARIANTS[FEDMCSA_DEFAULT_VARIANT]["weight-decay"]},  # another variant: its own
        **_model("mlr", "synthetic", "mnist5k", "mnist", "fmnist", "cifar10"),
    },
    # FedFCD (Li, Wang, Wang 2024), spec sections 2 and 8: client lrs eta_f = eta_phi_i = 0.01, plain SGD; batch 10
    # and E = 1 are the spec's PROPOSED values; rho = 1; the paper's MLP (784-100-ReLU) for Fashion-MNIST (and the
    # other 28x28 grey sets), its 2-conv CNN (fedavgcnn) for CIFAR-10, ResNet-18 for CIFAR-100
    "fedfcd": {
        "*": {"lr": 0.01, "momentum": 0.0, "weight-decay": 0.0, "batch-size": 10, "local-epochs": 1,
              "fraction-train": 1.0},
        **_model("dnn", *GREY_28),
        "cifar10": {"model": "fedavgcnn"},
        "cifar100": {"model": "resnet18"},
    },
    # MuPFL (Zhang et al.): SGD lr 0.01, no momentum, batch 64, phi = 10 local epochs, 20% participation; the
    # paper's CNN with its BAVD sites for 28x28 images
    "mupfl": {
        "*": {"lr": 0.01, "momentum": 0.0, "weight-decay": 0.0, "batch-size": 64, "local-epochs": 10,
              "fraction-train": 0.2},
        **_model("mupflcnn", *GREY_28),
        # the spec's resolution of the unstated augmentation: crop + flip on CIFAR
        **{name: {"model": "mupflcnn", "augmentation": "crop-flip"} for name in ("cifar10", "cifar100")},
        "digits": {"model": "mupflcnn"},  # padding 2 keeps 8x8 inputs whole: BAVD has its sites here too
    },
    # CReFF (Shang et al. 2022), authors' code: SGD lr 0.1 (lr_local_training), batch 32, 10 local epochs, 8 of
    # 20 clients a round; ResNet-8 on CIFAR, MuPFL's CNN where MuPFL compares against it on 28x28 images
    "creff": {
        "*": {"lr": 0.1, "momentum": 0.0, "weight-decay": 0.0, "batch-size": 32, "local-epochs": 10,
              "fraction-train": 0.4},
        **_model("mupflcnn", *GREY_28),
        **_model("resnet8", "cifar10", "cifar100"),
    },
    # FedSaC (Yan et al., ICML 2024): SGD lr 0.01, momentum 0.9 and weight decay 1e-5 (authors' code), batch 64,
    # 200 local iterations on CIFAR (400 on CIFAR-100), all clients every round, the simple CNN (d = 84)
    "fedsac": {
        "*": {"lr": 0.01, "momentum": 0.9, "weight-decay": 1e-5, "batch-size": 64, "local-steps": 200,
              "fraction-train": 1.0},
        **_model("simplecnn", *GREY_28),
        # the authors' code trains on RandomCrop(32, padding 4) + RandomHorizontalFlip batches (spec section 6)
        "cifar10": {"model": "simplecnn", "augmentation": "crop-flip"},
        "cifar100": {"model": "simplecnn", "local-steps": 400, "augmentation": "crop-flip"},
    },
    # pFedGraph (Ye et al., ICML 2023), authors' code (MediaBrain-SJTU/pFedGraph): SGD lr 0.01, momentum 0.9, weight
    # decay 1e-5, batch 64, 200 local iterations (run_cifar10.sh), all 10 clients every round, the simple CNN
    "pfedgraph": {
        "*": {"lr": 0.01, "momentum": 0.9, "weight-decay": 1e-5, "batch-size": 64, "local-steps": 200,
              "fraction-train": 1.0},
        **_model("simplecnn", *GREY_28),
        "cifar10": {"model": "simplecnn"},
        "cifar100": {"model": "simplecnn"},
    },
    # FedGH (Yi et al., ACM MM 2023), the authors' code (LipingYi/FedGH, FedGH.py): SGD lr 0.01, momentum 0.9,
    # weight decay 1e-3, batch 64, 10 local epochs; its CNN and its 10% of 100 clients are not set here
    "fedgh": {
        "*": {"lr": 0.01, "momentum": 0.9, "weight-decay": 1e-3, "batch-size": 64, "local-epochs": 10},
    },
    # GPFL (Zhang et al., ICCV 2023), the authors' code (TsingZ0/GPFL, main.py and run_me.sh): SGD lr 0.005, batch 10,
    # 1 local epoch, all clients every round, the 4-layer CNN (PFLlib's FedAvgCNN) for 28x28 images
    "gpfl": {
        "*": {"lr": 0.005, "momentum": 0.0, "weight-decay": 0.0, "batch-size": 10, "local-epochs": 1,
              "fraction-train": 1.0},
        "mnist5k": {"model": "fedavgcnn"},
        "mnist": {"model": "fedavgcnn"},
        "fmnist": {"model": "fedavgcnn"},
        "cifar10": {"model": "fedavgcnn"},
        "cifar100": {"model": "fedavgcnn"},
    },
    # pFedMe (Dinh et al., NeurIPS 2020) and its authors' code (CharlieDinh/pFedMe): eta = 0.005, |D| = 20, R = 20
    # local rounds, plain SGD; S = 5 of the 20 MNIST clients and 10 of the 100 Synthetic ones (every client trains,
    # only S send: fedstrategies/pfedme.py). lambda, K and the personal lr are pfedme.* keys (conf/ presets)
    "pfedme": {
        "*": {"lr": 0.005, "momentum": 0.0, "weight-decay": 0.0, "batch-size": 20, "local-steps": 20,
              "fraction-train": 0.25},
        "synthetic": {"fraction-train": 0.1},
    },
}


def paper_setting(method: str, dataset: str) -> dict[str, Any]:
    """The values ``method`` uses on ``dataset`` for the keys left at ``"auto"`` (empty for a method without one)."""
    entries = PAPER_SETTINGS.get(method, {})
    return {**entries.get("*", {}), **entries.get(dataset, {})}


def resolve_auto(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``values`` with every ``"auto"`` common key replaced, and where each replaced value came from.

    ``model`` stays ``"auto"`` when the method names no model for the dataset (resolved later from the input shape).
    """
    setting = paper_setting(values["method"], values["dataset"])
    if values["method"] == "fedmcsa":  # its weight decay is one of the options its variant names
        variant = values.get("fedmcsa.variant", FEDMCSA_DEFAULT_VARIANT)
        setting["weight-decay"] = FEDMCSA_VARIANTS[variant]["weight-decay"]
    # local-steps > 0 replaces epochs: a budget the user gives in one unit is not overridden by the paper's other one
    if values.get("local-epochs") != AUTO and values.get("local-steps") == AUTO:
        setting.pop("local-steps", None)
    if values.get("local-steps") != AUTO and values.get("local-epochs") == AUTO:
        setting.pop("local-epochs", None)
    resolved, sources = dict(values), {}
    for key in AUTO_KEYS:
        if resolved.get(key) != AUTO:
            continue
        if key in setting:
            resolved[key], sources[key] = setting[key], f"{values['method']}'s paper setting"
        elif key in FALLBACK:
            resolved[key], sources[key] = FALLBACK[key], "the project default"
    return resolved, sources
