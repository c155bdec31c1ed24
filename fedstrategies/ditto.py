"""Ditto (Li et al., ICML 2021): FedAvg trains a global model; each client also keeps a personal
model pulled towards the global one by lambda/2 * ||v - w_global||^2 (clients/ditto.py)."""

from fedstrategies.fedavg import FedAvgStrategy


class DittoStrategy(FedAvgStrategy):
    """FedAvg on the server; clients evaluate their personal models (no eval payload needed)."""

    def evaluate_payload(self, pid, server_round):
        return {}
