"""HeurFedAMP's declaration (see ``fedcore.methods``): its hyperparameters; its messages are FedAMP's
(``fedcore.methods.fedamp``)."""

from __future__ import annotations

from fedcore.config import Key
from fedcore.methods.fedamp import HPARAMS as FEDAMP_HPARAMS
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "self-weight": Key(0.3, "xi_ii: the share of the client's own model in its cloud model (pFedGraph's code: 0.3)",
                       low=0.0, high=1.0),
    "sigma": Key(10.0, "scale of the cosine similarity in the softmax over the other clients (pFedGraph's code: 10)",
                 low=0.0),
    "similarity": Key("update", "cosine of the updates from the initial model, w_i - w_0 (pFedGraph's code), or of "
                      "the raw parameters w_i (the paper)", choices=("update", "weights")),
    "alpha-k": FEDAMP_HPARAMS["alpha-k"],
    "lambda": FEDAMP_HPARAMS["lambda"],
    "start": FEDAMP_HPARAMS["start"],
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "HeurFedAMP (Huang et al. 2021): FedAMP with a fixed self-weight and cosine attention"
STRATEGY = "fedstrategies.heurfedamp:HeurFedAMPStrategy"
CLIENT = "clients.fedamp:HeurFedAMPClient"
POSITION = 25  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(**{"self-weight": [0.1, 0.3, 0.5], "sigma": [1.0, 10.0, 30.0]})
