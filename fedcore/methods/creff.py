"""CReFF's declaration (see ``fedcore.methods``): message contract and hyperparameters.

server -> client (train): ``wire.WEIGHTS`` (the FedAvg global model) and ``RETRAINED_HEAD``, the classifier
    re-trained on the federated features, at which the client takes its class gradients.
server -> client (evaluate): ``wire.WEIGHTS``, the global body with the re-trained classifier.
client -> server (train): ``wire.WEIGHTS`` (the trained model) and ``GRADIENTS`` (as MuPFL's: "z" (K, K*d + K),
    "present" (K,)), taken at the global body and the re-trained classifier before local training.
"""

from __future__ import annotations

from fedcore.config import Key
from fedcore.methods.mupfl import GRADIENTS  # noqa: F401  (the same record as MuPFL's PKCF)
from fedcore.paper_settings import GREY_28, same_model

# record: "head.weight" (K, d), "head.bias" (K,): the classifier re-trained on the federated features
RETRAINED_HEAD = "retrained-head"

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "features-per-class": Key(100, "federated features per class (CReFF's num_of_feature)", low=1),
    "match-steps": Key(100, "gradient-matching steps per round (match_epoch)", low=0),
    "match-lr": Key(0.01, "step size of the gradient matching (CReFF's lr_feature: 0.1 with SGD)", low=0.0,
                    low_open=True),
    "match-optimizer": Key("adam", "optimiser of the gradient matching: Adam restarted each round (MuPFL's PKCF) "
                           "or CReFF's SGD", choices=("adam", "sgd")),
    "retrain-epochs": Key(300, "epochs of classifier re-training on the federated features (crt_epoch)", low=0),
    "retrain-lr": Key(0.01, "SGD step size of the classifier re-training (lr_net)", low=0.0, low_open=True),
    "retrain-batch": Key(32, "batch size of the classifier re-training", low=1),
    "samples-per-class": Key(32, "real samples per class for the clients' class gradients (batch_real)", low=1),
}


# ---------------------------------------------------------------- paper settings (fedcore.paper_settings)
# CReFF (Shang et al. 2022), authors' code: SGD lr 0.1 (lr_local_training), batch 32, 10 local epochs, 8 of 20 clients
# a round; ResNet-8 on CIFAR, MuPFL's CNN where MuPFL compares against it on 28x28 images
PAPER_SETTINGS = {
    "*": {"lr": 0.1, "momentum": 0.0, "weight-decay": 0.0, "batch-size": 32, "local-epochs": 10,
          "fraction-train": 0.4},
    **same_model("mupflcnn", *GREY_28),
    **same_model("resnet8", "cifar10", "cifar100"),
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "CReFF (Shang et al. 2022): FedAvg, classifier re-trained on gradient-matched federated features"
STRATEGY = "fedstrategies.creff:CReFFStrategy"
CLIENT = "clients.creff:CReFFClient"
POSITION = 14  # its row in the registry's order (the README's and docs' method tables)
# the matching's step is on another scale for each optimiser: a list, not a product
TUNING_GRID = ([{"match-optimizer": "adam", "match-lr": lr} for lr in (0.003, 0.01, 0.03)]
               + [{"match-optimizer": "sgd", "match-lr": lr} for lr in (0.1, 1.0, 10.0)])


def example_reply(strategy, pid: int, phase: str, rng) -> dict:
    """A train reply for the server benchmark and the fuzz tests: noisy weights and class gradients with 0/1
    present-class flags."""
    from fedcore import wire
    from fedcore.methods._replies import noisy_weights, present_class_gradients

    if phase != "train":
        return {}
    weights = noisy_weights(strategy.global_weights, rng)
    z, present = present_class_gradients(strategy, pid, rng)
    return {wire.WEIGHTS: wire.pack_arrays(weights), GRADIENTS: wire.pack_arrays({"z": z, "present": present})}
