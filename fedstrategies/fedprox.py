"""FedProx (Li et al., MLSys 2020): FedAvg's server; clients add a proximal term (clients/fedprox.py)."""

from fedstrategies.fedavg import FedAvgStrategy


class FedProxStrategy(FedAvgStrategy):
    """Server side identical to FedAvg; the method lives in the client's objective."""
