"""FedPer's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS: dict = {}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FedPer (Arivazhagan et al. 2019): shared body, private head"
STRATEGY = "fedstrategies.fedper:FedPerStrategy"
CLIENT = "clients.fedper:FedPerClient"
POSITION = 6  # its row in the registry's order (the README's and docs' method tables)
