"""Ditto's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "lambda": Key(0.1, "strength of the pull of the personal model towards the global one", low=0.0),
    "personal-epochs": Key(1, "epochs of personal-model training per round", low=1),
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "Ditto (Li et al. 2021): personal model with a proximal pull to the global one"
STRATEGY = "fedstrategies.ditto:DittoStrategy"
CLIENT = "clients.ditto:DittoClient"
POSITION = 8  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(**{"lambda": [0.01, 0.1, 0.5, 1.0, 2.0]})
