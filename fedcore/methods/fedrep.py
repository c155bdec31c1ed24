"""FedRep's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {"head-epochs": Key(10, "epochs of head training (body fixed) before the body epochs", low=1)}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FedRep (Collins et al. 2021): head epochs then body epochs, body shared"
STRATEGY = "fedstrategies.fedrep:FedRepStrategy"
CLIENT = "clients.fedrep:FedRepClient"
POSITION = 7  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(**{"head-epochs": [1, 5, 10]})
