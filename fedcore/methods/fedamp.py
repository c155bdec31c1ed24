"""FedAMP's and HeurFedAMP's declaration (see ``fedcore.methods``): message contract and hyperparameters.

server -> client (train):
    ``CLOUD``: the client's cloud model u_i = sum_j xi_ij w_j, the centre of its proximal term.
client -> server (train):
    ``wire.WEIGHTS``: the client's personalised model w_i after local training.
Evaluation sends nothing: each client scores its own w_i, kept in its state.
"""

from __future__ import annotations

from fedcore.config import Key
from fedcore.tuning_grid import product

# record: the cloud model u_i, arrays by state-dict key (the model's shapes and dtypes)
CLOUD = "fedamp-cloud"
# method metric (train): ||w_i - u_i||^2 after local training
DIST_TO_CLOUD = "dist-to-cloud"

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "alpha-k": Key(1.0, "alpha_k: step of the message passing (xi_ij = alpha_k A'(d_ij^2); with sigma = 0 the "
                   "fraction of the largest step keeping xi_ii >= 0) and 1/alpha_k in the client's proximal weight",
                   low=0.0, low_open=True),
    "sigma": Key(0.0, "sigma of the attention function A(x) = 1 - exp(-x / sigma) on squared model distances; "
                 "0: the round's median distance, the step scaled to match (fedamp_math.median_scale); a fixed "
                 "sigma keeps xi_ii >= 0 for every distance while alpha_k (m - 1) / sigma <= 1", low=0.0),
    "lambda": Key(1.0, "lambda: the client minimises F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2", low=0.0),
    "start": Key("own", "where local training starts: the client's own model w_i (PFLlib) or its cloud model u_i",
                 choices=("own", "cloud")),
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FedAMP (Huang et al. 2021): cloud models by attentive message passing over model distances"
STRATEGY = "fedstrategies.fedamp:FedAMPStrategy"
CLIENT = "clients.fedamp:FedAMPClient"
POSITION = 24  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(**{"alpha-k": [0.25, 0.5, 1.0], "lambda": [0.1, 1.0, 3.0]})
