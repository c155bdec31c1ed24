"""Local's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS: dict = {}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "each client trains alone, no communication"
STRATEGY = "fedstrategies.local:LocalStrategy"
CLIENT = "clients.local:LocalClient"
POSITION = 1  # its row in the registry's order (the README's and docs' method tables)
