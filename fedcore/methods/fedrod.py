"""FedRoD's message contract (see ``fedcore.contracts``).

server -> client (train and evaluate): ``wire.WEIGHTS``, the generic model (body and generic head).
client -> server (train): ``wire.WEIGHTS``, the client's generic model after local training.
The personal head never leaves the client.
"""

# ---------------------------------------------------------------- client -> server (method metrics)
PERSONAL_LOSS = "personal-loss"  # train: mean CE of the summed logits, the personal head's objective
GENERIC_ACC = "generic-acc"  # evaluate: accuracy of the generic model alone (the paper's G-FL number)
