"""FedRoD (Chen & Chao, ICLR 2022): a generic model trained with the balanced-softmax loss and
averaged as in FedAvg, plus a personal head on each client; prediction by their summed logits.

The server is FedAvg over the whole generic model (body and generic head); the personal head stays
on the client (clients/fedrod.py). ``generic-loss = "ce"`` trains the generic model with plain
cross-entropy instead (the paper's ablation of its balanced risk).
"""

from fedstrategies.fedavg import FedAvgStrategy


class FedRoDStrategy(FedAvgStrategy):
    """Same server side as FedAvg: the generic model is the sample-weighted mean of the clients'."""
