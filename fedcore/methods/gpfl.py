"""GPFL's declaration (see ``fedcore.methods``): message contract and hyperparameters.

server -> client (train and evaluate):
    ``wire.WEIGHTS``: the global feature extractor (``body.*``), the GCE's (C, d) embedding table
    (``gce.weight``) and the CoV (``cov.*``), the keys of ``fedcore.conditional_valve.GPFLModules``.
client -> server (train):
    ``wire.WEIGHTS``: the same tensors after local training. The head never leaves the client.
"""

from __future__ import annotations

from fedcore.config import Key
from fedcore.paper_settings import same_model
from fedcore.tuning_grid import product

# the state-dict key prefixes of the two global modules in the weights record
GCE_PREFIX = "gce."
COV_PREFIX = "cov."
MODULE_PREFIXES = (GCE_PREFIX, COV_PREFIX)

# ---------------------------------------------------------------- client -> server (method metrics)
GCE_LOSS = "gce-loss"  # train: mean angle-level guidance loss (cosine softmax on the GCE table)
MAGNITUDE_LOSS = "magnitude-loss"  # train: mean lambda * ||f_G - GCE_frozen[y]||_2 per batch

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "lambda": Key(0.01, "weight of the magnitude-level guidance ||f_G - GCE(y)||_2 (authors: 0.01 for CNNs and "
                  "MLPs, 1e-4 for ResNet-18)", low=0.0),
    "mu": Key(0.1, "weight decay of the GCE and CoV parameters (authors: 0.1 for CNNs and MLPs, 0 for ResNet-18)",
              low=0.0),
}


# ---------------------------------------------------------------- paper settings (fedcore.paper_settings)
# GPFL (Zhang et al., ICCV 2023), the authors' code (TsingZ0/GPFL, main.py and run_me.sh): SGD lr 0.005, batch 10,
# 1 local epoch, all clients every round, the 4-layer CNN (PFLlib's FedAvgCNN) for 28x28 images
PAPER_SETTINGS = {
    "*": {"lr": 0.005, "momentum": 0.0, "weight-decay": 0.0, "batch-size": 10, "local-epochs": 1,
          "fraction-train": 1.0},
    **same_model("fedavgcnn", "mnist5k", "mnist", "fmnist", "cifar10", "cifar100"),
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "GPFL (Zhang et al. 2023): global extractor, CoV and GCE; personal head on the valve's personal route"
STRATEGY = "fedstrategies.gpfl:GPFLStrategy"
CLIENT = "clients.gpfl:GPFLClient"
POSITION = 23  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(**{"lambda": [0.001, 0.01, 0.1], "mu": [0.01, 0.1, 1.0]})
