"""FedProx's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

from fedcore.config import Key

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {"mu": Key(0.01, "weight of the proximal term mu/2 * ||w - w_global||^2", low=0.0)}
