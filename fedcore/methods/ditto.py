"""Ditto's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

from fedcore.config import Key

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "lambda": Key(0.1, "strength of the pull of the personal model towards the global one", low=0.0),
    "personal-epochs": Key(1, "epochs of personal-model training per round", low=1),
}
