"""FedRoD's declaration (see ``fedcore.methods``): message contract and hyperparameters.

server -> client (train and evaluate): ``wire.WEIGHTS``, the generic model (body and generic head).
client -> server (train): ``wire.WEIGHTS``, the client's generic model after local training.
The personal head never leaves the client.
"""

from __future__ import annotations

from fedcore.config import Key

# ---------------------------------------------------------------- client -> server (method metrics)
PERSONAL_LOSS = "personal-loss"  # train: mean CE of the summed logits, the personal head's objective
GENERIC_ACC = "generic-acc"  # evaluate: accuracy of the generic model alone (the paper's G-FL number)

# ---------------------------------------------------------------- hyperparameters (run-config keys <method>.<key>)
HPARAMS = {
    "generic-loss": Key("bsm", "loss of the generic model: balanced softmax (the paper's) or plain cross-entropy "
                        "(ablation)", choices=("bsm", "ce")),
}


# ---------------------------------------------------------------- its record (fedcore.registry, fedcore.tuning_grid)
SUMMARY = "FedRoD (Chen & Chao 2022): balanced-softmax generic model plus a personal head, logits summed"
STRATEGY = "fedstrategies.fedrod:FedRoDStrategy"
CLIENT = "clients.fedrod:FedRoDClient"
POSITION = 22  # its row in the registry's order (the README's and docs' method tables)
