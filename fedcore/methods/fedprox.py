"""FedProx's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {"mu": Key(0.01, "weight of the proximal term mu/2 * ||w - w_global||^2", low=0.0)}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FedProx (Li et al. 2020): FedAvg with a proximal term in local training"
STRATEGY = "fedstrategies.fedprox:FedProxStrategy"
CLIENT = "clients.fedprox:FedProxClient"
POSITION = 4  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(mu=[0.001, 0.01, 0.1, 0.5, 1.0])
