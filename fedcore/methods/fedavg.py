"""FedAvg's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS: dict = {}
