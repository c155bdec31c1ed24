"""FedProto's declaration (see ``fedcore.methods``): message contract and hyperparameters.

server -> client (train and evaluate):
    ``wire.CLASS_FEATURES``: the global prototypes, once there are any (``HAS_PROTOTYPES``).
client -> server (train):
    ``wire.CLASS_FEATURES``: the client's class prototypes (class-mean features) with class counts.
"""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

# config flag: the message carries global prototypes (false in round 1, before any aggregation)
HAS_PROTOTYPES = "has-global-prototypes"

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "lambda": Key(1.0, "weight of the prototype-distance regulariser", low=0.0),
    "aggregation": Key("weighted", "per-class mean of prototypes", choices=("weighted", "uniform")),
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FedProto (Tan et al. 2022): class prototypes exchanged, no weights"
STRATEGY = "fedstrategies.fedproto:FedProtoStrategy"
CLIENT = "clients.fedproto:FedProtoClient"
POSITION = 5  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(**{"lambda": [0.1, 1.0, 5.0]})
