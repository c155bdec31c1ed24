"""FedAvg+FT's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {"epochs": Key(1, "local fine-tuning epochs before each evaluation", low=1)}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FedAvg, then each client fine-tunes the global model before evaluating"
STRATEGY = "fedstrategies.fedavg_ft:FedAvgFTStrategy"
CLIENT = "clients.fedavg_ft:FedAvgFTClient"
POSITION = 3  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(epochs=[1, 3, 5])
