"""FeSEM's declaration (see ``fedcore.methods``): its hyperparameters; only ``fedcore.wire`` names
cross the wire."""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "clusters": Key(3, "K: number of centre models", low=1),
    "em-steps": Key(1, "E- and M-steps on each round's models (1: the paper's stochastic EM)", low=1),
    "weighting": Key("uniform", "weight of a member in its centre's mean: 1 (paper) or its training-set size",
                     choices=("uniform", "size")),
    "lambda": Key(0.0, "proximal weight lambda/2 ||w - w~_k||^2 of the client's local objective (0: plain "
                  "training from the centre, the authors' code)", low=0.0),
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FeSEM (Long et al. 2023): K centre models, clients assigned by stochastic EM on model distance"
STRATEGY = "fedstrategies.fesem:FeSEMStrategy"
CLIENT = "clients.fesem:FeSEMClient"
POSITION = 27  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(clusters=[2, 3, 4, 5])
