"""FedRep's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

from fedcore.config import Key

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {"head-epochs": Key(10, "epochs of head training (body fixed) before the body epochs", low=1)}
