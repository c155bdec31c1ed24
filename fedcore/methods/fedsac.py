"""FedSaC's declaration (see ``fedcore.methods``): message contract and hyperparameters.

server -> client:
    train: ``wire.WEIGHTS`` (the personalised model theta~_i, theta(0) before the client was first
    aggregated), ``REFERENCE`` (regulariser ``authors`` only, once it exists) and the ``REGULARISER``
    mode; evaluate: ``wire.WEIGHTS`` (theta~_i).
client -> server (train):
    ``wire.WEIGHTS`` (theta_i after local training) and ``SUBSPACE``.
pFedGraph (fedstrategies/pfedgraph.py) sends the same, without ``SUBSPACE``.
"""

from __future__ import annotations

from fedcore.config import Key
from fedcore.paper_settings import GREY_28, same_model
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- server -> client
# config key: the local pull of this message, "off" or one of REGULARISERS
REGULARISER = "fedsac-regulariser"
REGULARISER_OFF = "off"  # theta~_i is still theta(0): plain cross-entropy
REGULARISERS = ("paper", "authors")  # -lambda cos(theta, theta~_i) (Eq. 9) | +lambda <c_i, theta>/|theta| (code)
# record: the authors' regulariser reference c_i = sum_j W_ij theta_j/|theta_j|, arrays by state-dict key
REFERENCE = "fedsac-reference"

# ---------------------------------------------------------------- client -> server
SUBSPACE = "fedsac-subspace"  # record: the feature subspace U_i, array BASIS
BASIS = "basis"  # (d, k) float32, orthonormal columns: top-k singular vectors of the features (Eq. 5)
# method metrics
COS_TO_RECEIVED = "cos-to-received"  # train: cos(theta_i, theta~_i) after local training
LOCAL_ACC = "local-acc"  # evaluate: accuracy of theta_i, the client's own last trained model
AGGREGATED_ACC = "aggregated-acc"  # evaluate: accuracy of the received theta~_i

# choices of the hyperparameters below
ANGLES = ("standard", "greedy_columns")
SOLVERS = ("closed_form", "cvxpy")
ALPHA_BOUNDARIES = ("paper", "code")
SIM_VECTORS = ("delta_init", "params")
EVAL_MODELS = ("aggregated", "local")

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "lambda": Key(0.01, "weight of the local pull -lambda * cos(theta, theta~_i) (Eq. 9; Table 3 best, "
                  "authors' default; the text of App. B.1 says 1)", low=0.0),
    "alpha": Key(0.9, "complementarity weight (0.9 Homo/Dirichlet, 0.5 pathological)", low=0.0),
    "beta": Key(1.4, "similarity weight (1.4 Homo/Dirichlet, 1.6 pathological)", low=0.0),
    "k": Key(3, "rank of each client's feature subspace", low=1),
    "alpha-fraction": Key(0.7, "share of the rounds (from the first) in which alpha is on; 0 afterwards",
                          low=0.0, high=1.0),
    "alpha-boundary": Key("paper", "paper: alpha on while t < 0.7 T (t from 0); code: the authors' "
                          "t / T > 0.7 switches it off, one round later", choices=ALPHA_BOUNDARIES),
    "sim-vector": Key("delta_init", "similarity of the updates theta_j - theta(0) (authors' code) or of the "
                      "raw parameters (Eq. 4 as printed)", choices=SIM_VECTORS),
    "sim-clamp": Key(1.0, "similarities above this become 1 (authors' code: 0.9); 1 = off", low=-1.0, high=1.0),
    "angles": Key("standard", "standard principal angles (SVD) or the authors' greedy column matching",
                  choices=ANGLES),
    "center": Key(False, "centre the features before the SVD (the authors' PCA) instead of Eq. 5's plain SVD"),
    "regulariser": Key("paper", "paper: -lambda cos(theta, theta~_i) (Eq. 9); authors: +lambda <c_i, theta>/|theta| "
                       "with c_i = sum_j W_ij theta_j/|theta_j| (their code's sign)", choices=REGULARISERS),
    "solver": Key("closed_form", "the QP: exact simplex projection for all rows at once, or cvxpy (reference)",
                  choices=SOLVERS),
    "eval-model": Key("local", "headline accuracy of theta_i after the client's local training (the spec's output "
                      "theta_i(T), the authors' 'post' evaluation) or of the aggregated theta~_i ('pre'); both "
                      "are reported as eval_local_acc and eval_aggregated_acc", choices=EVAL_MODELS),
}


# ---------------------------------------------------------------- paper settings (fedcore.paper_settings)
# FedSaC (Yan et al., ICML 2024): SGD lr 0.01, momentum 0.9 and weight decay 1e-5 (authors' code), batch 64, 200 local
# iterations on CIFAR (400 on CIFAR-100), all clients every round, the simple CNN (d = 84)
PAPER_SETTINGS = {
    "*": {"lr": 0.01, "momentum": 0.9, "weight-decay": 1e-5, "batch-size": 64, "local-steps": 200,
          "fraction-train": 1.0},
    **same_model("simplecnn", *GREY_28),
    # the authors' code trains on RandomCrop(32, padding 4) + RandomHorizontalFlip batches (spec section 6)
    "cifar10": {"model": "simplecnn", "augmentation": "crop-flip"},
    "cifar100": {"model": "simplecnn", "local-steps": 400, "augmentation": "crop-flip"},
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FedSaC (Yan et al. 2024): per-client models mixed by a similarity/complementarity graph"
STRATEGY = "fedstrategies.fedsac:FedSaCStrategy"
CLIENT = "clients.fedsac:FedSaCClient"
POSITION = 15  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(alpha=[0.5, 0.7, 0.9], beta=[1.0, 1.4, 1.6])


def example_reply(strategy, pid: int, phase: str, rng) -> dict:
    """A train reply for the server benchmark and the fuzz tests: theta(0) plus noise and an orthonormal basis
    (random noise would fail the orthonormality check); pFedGraph's replies have no basis."""
    import numpy as np

    from fedcore import wire
    from fedcore.methods._replies import noisy_weights

    if phase != "train":
        return {}
    reply = {wire.WEIGHTS: wire.pack_arrays(noisy_weights(strategy.initial_weights, rng))}
    if SUBSPACE in strategy.reply_schema(pid):
        basis, _ = np.linalg.qr(rng.standard_normal((strategy.model.feature_dim, strategy.hp["k"])))
        reply[SUBSPACE] = wire.pack_arrays({BASIS: basis.astype(np.float32)})
    return reply
