"""Majority's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS: dict = {}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "each client predicts its most frequent training label (no training, no communication)"
STRATEGY = "fedstrategies.majority:MajorityStrategy"
CLIENT = "clients.majority:MajorityClient"
POSITION = 10  # its row in the registry's order (the README's and docs' method tables)
