"""FedAvg + fine-tuning: FedAvg training; before evaluation each client fine-tunes the global model
on its own training data for ``fedavg-ft.epochs`` epochs (the copy is discarded afterwards)."""

from fedcore.config import Key
from fedstrategies.fedavg import FedAvgStrategy

HPARAMS = {"epochs": Key(1, "local fine-tuning epochs before each evaluation", low=1)}


class FedAvgFTStrategy(FedAvgStrategy):
    """Server side identical to FedAvg; fine-tuning happens in the client's evaluate."""
