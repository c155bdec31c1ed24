"""FedFCD's declaration (see ``fedcore.methods``): message contract and hyperparameters. No weights cross the wire.

server -> client:
    prepare (round 0): nothing; train: ``GLOBAL_HEAD`` and ``wire.CLASS_FEATURES`` (the GFRs:
    class ids, (K, d) global features, counts; with ``gfr-download = "own"`` only the client's
    classes); evaluate: ``GLOBAL_HEAD`` only.
client -> server (prepare and train):
    ``wire.CLASS_FEATURES``: the client's LFRs (per-class mean features of its extractor, Eq. 3)
    with the class counts.
"""

from __future__ import annotations

from fedcore.config import Key
from fedcore.paper_settings import GREY_28, same_model
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- server -> client
# record: the global head phi_g, arrays "weight" (C, d) and "bias" (C,) float32
GLOBAL_HEAD = "global-head"

# ---------------------------------------------------------------- client -> server (method metrics)
HEAD_LOSS = "head-loss"  # train: stage B's loss (personal head), alternation "epoch" only
ALIGNMENT_LOSS = "alignment-loss"  # train: mean feature-alignment term R_i (Eq. 6), when it is on

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "lambda": Key(1.0, "weight of the feature-alignment term R_i (Eq. 6); paper: 1 for FMNIST, 5 for CIFAR",
                  low=0.0),
    # 0: the common `lr` (the paper's 0.01 for both through fedcore.paper_settings), so that a comparison that sets
    # one lr gives every method the same step size (issue #29); a positive value overrides it for this stage only
    "lr-feature": Key(0.0, "eta_f: client SGD learning rate of the extractor (stage A); 0 = the common lr", low=0.0),
    "lr-personal-head": Key(0.0, "eta_phi_i: client SGD learning rate of the personal head (stage B); "
                            "0 = the common lr", low=0.0),
    "lr-global-head": Key(0.01, "eta_phi_g: server SGD learning rate of the global head", low=0.0, low_open=True),
    "server-batch-size": Key(10, "mini-batch size of the server's head training", low=1),
    "server-epochs": Key(1, "epochs of head training over each round's (LFR, label) pairs", low=1),
    "gfr-weighting": Key("weighted", "GFR = per-class mean of LFRs: count-weighted (Eq. 5 corrected), uniform "
                         "(FedProto/PFLlib code) or paper_literal (Eq. 5 as printed, shrunk by 1/|m_j|)",
                         choices=("weighted", "uniform", "paper_literal")),
    # "own" by default: a client's training reads only the GFRs of its own labels (Eq. 7), so the run is
    # identical (tests/test_fedfcd.py) and the paper's MLP round stays under 1% of FedAvg's bytes;
    # "all" sends the spec's 2Cd + C floats.
    "gfr-download": Key("own", "GFR rows sent down: only the client's own classes, or every class (spec)",
                        choices=("all", "own")),
    "alternation": Key("epoch", "hierarchical optimisation: a full extractor pass then a full head pass per "
                       "epoch, or one extractor step then one head step per mini-batch", choices=("epoch", "batch")),
    "feature-alignment": Key(True, "false = ablation 'w/o FA': no lambda term"),
    "decision-fusion": Key(True, "false = ablation 'w/o FD': logits = personal head only (training and inference)"),
    "hierarchical": Key(True, "false = ablation 'w/o HO': one joint SGD step on extractor and personal head per batch"),
}


# ---------------------------------------------------------------- paper settings (fedcore.paper_settings)
# Client lrs eta_f = eta_phi_i = 0.01, plain SGD (spec sections 2 and 8); batch 10 and E = 1 are the spec's PROPOSED
# values; rho = 1; the paper's MLP (784-100-ReLU) for Fashion-MNIST (and the other 28x28 grey sets), its 2-conv CNN
# (fedavgcnn) for CIFAR-10, ResNet-18 for CIFAR-100
PAPER_SETTINGS = {
    "*": {"lr": 0.01, "momentum": 0.0, "weight-decay": 0.0, "batch-size": 10, "local-epochs": 1, "fraction-train": 1.0},
    **same_model("dnn", *GREY_28),
    "cifar10": {"model": "fedavgcnn"},
    "cifar100": {"model": "resnet18"},
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FedFCD (Li et al. 2024): feature alignment, server-trained global head, decision fusion"
STRATEGY = "fedstrategies.fedfcd:FedFCDStrategy"
CLIENT = "clients.fedfcd:FedFCDClient"
POSITION = 12  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(**{"lambda": [0.0, 0.1, 1.0, 5.0]})
