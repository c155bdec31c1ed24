"""MuPFL's declaration (see ``fedcore.methods``): message contract and hyperparameters.

server -> client (train and evaluate):
    ``wire.WEIGHTS`` (the global model), ``FEATURES`` when ``HAS_FEATURES`` says so, and the round's
    learning rate under ``wire.LR``.
client -> server (train):
    ``wire.WEIGHTS`` (the trained model), ``START_HEAD`` and ``GRADIENTS`` (PKCF on), ``MAPS`` (BAVD
    on and the model has BAVD layers).
K classes, d feature width, m = ``features-per-class``.
"""

from __future__ import annotations

from fedcore.config import Key
from fedcore.paper_settings import GREY_28, same_model
from fedcore.tuning_grid import product

# ---------------------------------------------------------------- server -> client
HAS_FEATURES = "has-features"  # config flag: the message carries the federated features
FEATURES = "federated-features"  # record: "features" (K*m, d) float32, the federated features H, class-major

# ---------------------------------------------------------------- client -> server
START_HEAD = "start-head"  # record: the classifier local training started from (after PKCF), by state-dict key
MAPS = "bavd-maps"  # record: one float32 H x W activation map per BAVD layer, keys "0", "1", ...
# record: "z" (K, K*d + K) float32, row k the flattened (dW, db) mean CE gradient of class k at the
# received head (fedcore.class_gradients; zeros for absent classes), "present" (K,) float32 0/1
GRADIENTS = "class-gradients"
BAVD_KEEP = "bavd-keep"  # method metric (train): share of activation positions BAVD keeps

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "bavd": Key(True, "BAVD: biased activation value dropout on the clients (Table VI ablation)"),
    "acmu": Key(True, "ACMU: clustered model update before aggregation (off: FedAvg's sample-weighted mean)"),
    "pkcf": Key(True, "PKCF: classifier pre-training on server-made federated features"),
    "psi-sign": Key("decrease", "BAVD map weight psi: the loss decrease (default, text) or Eq. 6 as printed",
                    choices=("decrease", "literal")),
    "bavd-at-eval": Key(True, "apply the BAVD mask when the client evaluates its model"),
    "alpha-s": Key(0.5, "weight of the update cosine against the activation-map cosine (Eq. 8)", low=0.0, high=1.0),
    "min-clusters": Key(2, "smallest cluster count tried (Eq. 13)", low=2),
    "max-clusters": Key(6, "largest cluster count tried, capped at sampled clients - 1", low=2),
    "clusters": Key(0, "fixed cluster count (Tables I, V); 0 = chosen by the silhouette score", low=0),
    "features-per-class": Key(100, "m: federated features per class", low=0),
    "head-epochs": Key(50, "tau: epochs of classifier pre-training on the federated features", low=0),
    "match-steps": Key(100, "gradient-matching steps on the federated features per round", low=0),
    "match-lr": Key(0.01, "step size of the gradient matching (the paper's global lr)", low=0.0, low_open=True),
    "match-optimizer": Key("adam", "optimiser of the gradient matching: Adam, restarted each round (its step does not "
                                   "shrink with d), or CReFF's plain SGD", choices=("adam", "sgd")),
    "pkcf-head": Key("stored", "head the client pre-trains on the federated features: its own head from its last "
                               "round (v_i, mupfl.md 3.2), the received global one, or a freshly initialised one",
                     choices=("stored", "received", "fresh")),
    "samples-per-class": Key(32, "real samples per class for the clients' classifier gradients", low=1),
    "z-ref": Key("global", "classifier the clients' gradients are taken at: the received global one "
                           "(the server matches there) or the client's own", choices=("global", "local")),
    "lr-decay": Key(0.995, "learning-rate factor every lr-decay-every rounds", low=0.0, high=1.0, low_open=True),
    "lr-decay-every": Key(3, "rounds between learning-rate decays", low=1),
}


# ---------------------------------------------------------------- paper settings (fedcore.paper_settings)
# SGD lr 0.01, no momentum, batch 64, phi = 10 local epochs, 20% participation; the paper's CNN with its BAVD sites for
# 28x28 images
PAPER_SETTINGS = {
    "*": {"lr": 0.01, "momentum": 0.0, "weight-decay": 0.0, "batch-size": 64, "local-epochs": 10,
          "fraction-train": 0.2},
    **same_model("mupflcnn", *GREY_28),
    # the spec's resolution of the unstated augmentation: crop + flip on CIFAR
    **{name: {"model": "mupflcnn", "augmentation": "crop-flip"} for name in ("cifar10", "cifar100")},
    "digits": {"model": "mupflcnn"},  # padding 2 keeps 8x8 inputs whole: BAVD has its sites here too
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "MuPFL (Zhang et al. 2023): activation dropout, clustered updates, classifier tuning on federated features"
STRATEGY = "fedstrategies.mupfl:MuPFLStrategy"
CLIENT = "clients.mupfl:MuPFLClient"
POSITION = 13  # its row in the registry's order (the README's and docs' method tables)
TUNING_GRID = product(**{"head-epochs": [10, 30, 50]})


def example_reply(strategy, pid: int, phase: str, rng) -> dict:
    """A train reply for the server benchmark and the fuzz tests: noisy weights, 0/1 present-class flags with
    matching class gradients, the start head, and maps."""
    import numpy as np

    from fedcore import wire
    from fedcore.methods._replies import noisy_weights, present_class_gradients

    records = {}
    if phase != "train":
        return records
    records[wire.WEIGHTS] = wire.pack_arrays(noisy_weights(strategy.global_weights, rng))
    if strategy.hp["pkcf"]:
        z, present = present_class_gradients(strategy, pid, rng)
        records[START_HEAD] = wire.pack_arrays({k: strategy.global_weights[k] for k in strategy.head_keys})
        records[GRADIENTS] = wire.pack_arrays({"z": z, "present": present})
    if strategy.map_shapes:
        records[MAPS] = wire.pack_arrays({str(i): rng.random(s).astype(np.float32)
                                          for i, s in enumerate(strategy.map_shapes)})
    return records
