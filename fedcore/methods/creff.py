"""CReFF's message contract (see ``fedcore.contracts``).

server -> client (train): ``wire.WEIGHTS`` (the FedAvg global model) and ``RETRAINED_HEAD``, the classifier
    re-trained on the federated features, at which the client takes its class gradients.
server -> client (evaluate): ``wire.WEIGHTS``, the global body with the re-trained classifier.
client -> server (train): ``wire.WEIGHTS`` (the trained model) and ``GRADIENTS`` (as MuPFL's: "z" (K, K*d + K),
    "present" (K,)), taken at the global body and the re-trained classifier before local training.
"""

from fedcore.methods.mupfl import GRADIENTS  # noqa: F401  (the same record as MuPFL's PKCF)

# record: "head.weight" (K, d), "head.bias" (K,): the classifier re-trained on the federated features
RETRAINED_HEAD = "retrained-head"
