"""FedProx (Li et al., MLSys 2020): FedAvg's server; clients add a proximal term (clients/fedprox.py)."""

from fedcore.config import Key
from fedstrategies.fedavg import FedAvgStrategy

HPARAMS = {"mu": Key(0.01, "weight of the proximal term mu/2 * ||w - w_global||^2", low=0.0)}


class FedProxStrategy(FedAvgStrategy):
    """Server side identical to FedAvg; the method lives in the client's objective."""
