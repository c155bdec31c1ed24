"""FedAvg's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS: dict = {}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FedAvg (McMahan et al. 2017): one global model"
STRATEGY = "fedstrategies.fedavg:FedAvgStrategy"
CLIENT = "clients.fedavg:FedAvgClient"
POSITION = 2  # its row in the registry's order (the README's and docs' method tables)
