"""Ditto (Li et al., ICML 2021): FedAvg trains a global model; each client also keeps a personal
model pulled towards the global one by lambda/2 * ||v - w_global||^2 (clients/ditto.py)."""

from fedcore.config import Key
from fedstrategies.fedavg import FedAvgStrategy

HPARAMS = {
    "lambda": Key(0.1, "strength of the pull of the personal model towards the global one", low=0.0),
    "personal-epochs": Key(1, "epochs of personal-model training per round", low=1),
}


class DittoStrategy(FedAvgStrategy):
    """FedAvg on the server; clients evaluate their personal models (no eval payload needed)."""

    def evaluate_payload(self, pid, server_round):
        return {}
