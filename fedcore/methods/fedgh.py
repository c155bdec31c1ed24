"""FedGH's declaration (see ``fedcore.methods``): message contract and hyperparameters. No extractor weights cross the wire.

server -> client (train and evaluate):
    ``GLOBAL_HEAD``: the generalised global header theta, which replaces the client's header.
client -> server (train):
    ``wire.CLASS_FEATURES``: the client's local averaged representations (LARs: per-class mean
    features of its trained extractor over its whole training set) with the class counts.
"""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- server -> client
# record: the global header, arrays "weight" (C, d) and "bias" (C,) float32
GLOBAL_HEAD = "global-head"

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "server-lr": Key(0.01, "eta_theta: server SGD step size of the global header", low=0.0, low_open=True),
    "server-batch-size": Key(1, "LARs per server SGD step: 1 = one step per (client, class) LAR, the paper's "
                             "rule and authors' code; PFLlib uses 10", low=1),
    "server-epochs": Key(1, "passes over each round's LARs on the server", low=1),
}


# ---------------------------------------------------------------- paper settings (fedcore.paper_settings)
# FedGH (Yi et al., ACM MM 2023), the authors' code (LipingYi/FedGH, FedGH.py): SGD lr 0.01, momentum 0.9, weight
# decay 1e-3, batch 64, 10 local epochs; its CNN and its 10% of 100 clients are not set here
PAPER_SETTINGS = {
    "*": {"lr": 0.01, "momentum": 0.9, "weight-decay": 1e-3, "batch-size": 64, "local-epochs": 10},
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = ("FedGH (Yi et al. 2023): global header trained on the server from class prototypes, replaces each "
           "client's")
STRATEGY = "fedstrategies.fedgh:FedGHStrategy"
CLIENT = "clients.fedgh:FedGHClient"
POSITION = 21  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(**{"server-lr": [0.001, 0.01, 0.1]})
