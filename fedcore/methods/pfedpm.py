"""pFedPM's declaration (see ``fedcore.methods``): message contract and hyperparameters. No weights cross the wire.

server -> client (train):
    ``GLOBAL_FEATURES`` once the server has global features (``HAS_GLOBAL``).
client -> server (train):
    ``wire.CLASS_FEATURES``: the local class-mean features C_i^(j) (Eq. 6) with the class counts n_ij.
"""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- server -> client
# config flag: the train message carries GLOBAL_FEATURES (false until the first aggregation)
HAS_GLOBAL = "has-global-features"
# record: the global class features C̄^(j) (Eq. 7), arrays "class-ids" (K,) int64 and "features" (K, d) float32
GLOBAL_FEATURES = "global-features"

# ---------------------------------------------------------------- client -> server (method metrics)
RELATION_LOSS = "relation-loss"  # train: mean MSE of the relation module's steps (Eq. 12)
FEATURE_REG = "feature-reg"  # train: mean feature regulariser L_R (Eq. 11; 0 while it is off)
RELATION_ACC = "relation-acc"  # evaluate: accuracy of the relation module's prediction (R-pFedPM)

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "a": Key(0.5, "weight of the client's own class features in the mixed features (Eq. 8); the paper "
                  "grid-searches it in [0, 1]", low=0.0, high=1.0),
    "lambda": Key(1.0, "weight of the feature regulariser L_R in the local loss (Eq. 9); the paper uses "
                       "1 on MNIST/FEMNIST, 0.1 on CIFAR-10", low=0.0),
    "reg": Key("l2", "L_R: 'l2' = unsquared L2 distance of the mixed feature to the batch's class mean, "
                     "averaged over the classes in the batch (Eq. 11); 'l2sq' = the same distance squared; "
                     "'fedproto' = per-sample MSE to the mixed feature of the sample's class (FedProto's code)",
               choices=("l2", "l2sq", "fedproto")),
    "agg": Key("weighted", "Eq. 7: 'weighted' (n_ij/N_j weights), 'paper_literal' (as printed, also / "
                           "number of holders) or 'uniform' (plain mean over holders)",
               choices=("weighted", "paper_literal", "uniform")),
    "heterogeneous": Key(False, "pFedPM-mh: client architectures differ by partition id (protocnn: conv2 "
                                "with 18/20/22 channels by thirds of the ids; resnet18-tv: stem strides "
                                "(1, 4) for the first half, (2, 2) for the rest)"),
}


# ---------------------------------------------------------------- paper settings (fedcore.paper_settings)
# SGD lr 0.01, momentum 0.5, batch 10, E = 1, all clients every round (spec section 8); the prototype CNN of FedProto
# for MNIST/FEMNIST, ResNet-18 (torchvision stem, d = 512) on CIFAR-10
PAPER_SETTINGS = {
    "*": {"lr": 0.01, "momentum": 0.5, "weight-decay": 0.0, "batch-size": 10, "local-epochs": 1, "fraction-train": 1.0},
    "mnist5k": {"model": "protocnn"},
    "mnist": {"model": "protocnn"},
    "femnist": {"model": "protocnn-femnist"},
    "cifar10": {"model": "resnet18-tv", "augmentation": "crop-flip"},  # FedProto's code: crop + flip on CIFAR-10
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "pFedPM (Xing et al.): class features mixed with global ones (a), relation module, no weights"
STRATEGY = "fedstrategies.pfedpm:PFedPMStrategy"
CLIENT = "clients.pfedpm:PFedPMClient"
POSITION = 11  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(a=[0.25, 0.5, 0.75], **{"lambda": [0.1, 1.0, 5.0]})


def example_reply(strategy, pid: int, phase: str, rng) -> dict:
    """A realistic reply for the server benchmark and the fuzz tests: one random d-vector per local class."""
    import numpy as np

    from fedcore import wire

    if phase == "evaluate":
        return {}
    counts = strategy.clients[pid].train_label_counts
    ids = np.flatnonzero(counts)
    feats = rng.standard_normal((len(ids), strategy.model.feature_dim)).astype(np.float32)
    return {wire.CLASS_FEATURES: wire.pack_class_features(ids, feats, counts[ids])}
