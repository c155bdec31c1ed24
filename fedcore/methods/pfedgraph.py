"""pFedGraph's declaration (see ``fedcore.methods``): its hyperparameters; its messages are FedSaC's
(``fedcore.methods.fedsac``)."""

from __future__ import annotations

from fedcore.config import Key
from fedcore.methods.fedsac import EVAL_MODELS, REGULARISERS, SIM_VECTORS, SOLVERS
from fedcore.methods.fedsac import example_reply  # noqa: F401  (FedSaC's, without the subspace pFedGraph lacks)
from fedcore.paper_settings import GREY_28, same_model
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "lambda": Key(0.01, "weight of the local pull -lambda * cos(theta, theta~_i) (authors' default lam)", low=0.0),
    "alpha": Key(0.8, "weight of ||a_i - p||^2 against the similarity in the graph objective (the paper's alpha; "
                 "large: FedAvg's weights p, small: the most similar clients)", low=0.0, low_open=True),
    "sim-vector": Key("delta_init", "similarity of the updates theta_j - theta(0) (authors' code) or of the raw "
                      "parameters", choices=SIM_VECTORS),
    "sim-clamp": Key(0.9, "similarities above this become 1 (authors' code: 0.9); 1 = off", low=-1.0, high=1.0),
    "regulariser": Key("paper", "paper: -lambda cos(theta, theta~_i); authors: +lambda <c_i, theta>/|theta| with "
                       "c_i = sum_j W_ij theta_j/|theta_j| (their code's sign)", choices=REGULARISERS),
    "solver": Key("closed_form", "the QP: exact simplex projection for all rows at once, or cvxpy (reference)",
                  choices=SOLVERS),
    "eval-model": Key("local", "headline accuracy of theta_i after local training or of the aggregated theta~_i; "
                      "both are reported", choices=EVAL_MODELS),
}


# ---------------------------------------------------------------- paper settings (fedcore.paper_settings)
# pFedGraph (Ye et al., ICML 2023), authors' code (MediaBrain-SJTU/pFedGraph): SGD lr 0.01, momentum 0.9, weight decay
# 1e-5, batch 64, 200 local iterations (run_cifar10.sh), all 10 clients every round, the simple CNN
PAPER_SETTINGS = {
    "*": {"lr": 0.01, "momentum": 0.9, "weight-decay": 1e-5, "batch-size": 64, "local-steps": 200,
          "fraction-train": 1.0},
    **same_model("simplecnn", *GREY_28),
    "cifar10": {"model": "simplecnn"},
    "cifar100": {"model": "simplecnn"},
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "pFedGraph (Ye et al. 2023): per-client models mixed by a graph inferred from model similarity"
STRATEGY = "fedstrategies.pfedgraph:PFedGraphStrategy"
CLIENT = "clients.pfedgraph:PFedGraphClient"
POSITION = 16  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(alpha=[0.6, 0.8, 0.9], **{"lambda": [0.001, 0.01, 0.1]})
