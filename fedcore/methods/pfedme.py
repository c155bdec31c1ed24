"""pFedMe's declaration (see ``fedcore.methods``): message contract and hyperparameters.

server -> client:
    train (every client, every round): ``wire.WEIGHTS`` (the global model w_t) and ``UPLOAD``;
    evaluate: ``wire.WEIGHTS`` (for pFedMe(GM), and for clients that have not trained yet).
client -> server (train):
    ``wire.WEIGHTS`` (the local model w_{i,R}) when ``UPLOAD`` is true, else no record.
"""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- server -> client (config key)
UPLOAD = "pfedme-upload"  # bool: this client is in the round's sampled set S and sends its local model

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "lambda": Key(15.0, "lambda: weight of ||theta_i - w||^2 / 2 that ties the personal model to the local one",
                  low=0.0, low_open=True),
    "k": Key(5, "K: gradient steps that solve the personal problem approximately, per local round", low=1),
    "personal-lr": Key(0.01, "step size of those K steps", low=0.0, low_open=True),
    "beta": Key(1.0, "beta: server mixing, w <- (1 - beta) w + beta * mean of the local models "
                "(1 = plain averaging)", low=0.0, low_open=True),
    "evaluate": Key("personal", "model each client is scored with: its personal theta_i (pFedMe(PM)) or the "
                    "global w (pFedMe(GM))", choices=("personal", "global")),
}


# ---------------------------------------------------------------- paper settings (fedcore.paper_settings)
# pFedMe (Dinh et al., NeurIPS 2020) and its authors' code (CharlieDinh/pFedMe): eta = 0.005, |D| = 20, R = 20 local
# rounds, plain SGD; S = 5 of the 20 MNIST clients and 10 of the 100 Synthetic ones (every client trains, only S
# send: fedstrategies/pfedme.py). lambda, K and the personal lr are pfedme.* keys (conf/ presets)
PAPER_SETTINGS = {
    "*": {"lr": 0.005, "momentum": 0.0, "weight-decay": 0.0, "batch-size": 20, "local-steps": 20,
          "fraction-train": 0.25},
    "synthetic": {"fraction-train": 0.1},
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "pFedMe (Dinh et al. 2020): Moreau-envelope personal models, server beta-mixing"
STRATEGY = "fedstrategies.pfedme:PFedMeStrategy"
CLIENT = "clients.pfedme:PFedMeClient"
POSITION = 18  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(**{"lambda": [1.0, 5.0, 15.0, 30.0], "personal-lr": [0.01, 0.05]})
