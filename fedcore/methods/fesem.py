"""FeSEM's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

from fedcore.config import Key

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "clusters": Key(3, "K: number of centre models", low=1),
    "em-steps": Key(1, "E- and M-steps on each round's models (1: the paper's stochastic EM)", low=1),
    "weighting": Key("uniform", "weight of a member in its centre's mean: 1 (paper) or its training-set size",
                     choices=("uniform", "size")),
    "lambda": Key(0.0, "proximal weight lambda/2 ||w - w~_k||^2 of the client's local objective (0: plain "
                  "training from the centre, the authors' code)", low=0.0),
}
