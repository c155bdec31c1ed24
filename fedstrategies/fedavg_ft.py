"""FedAvg + fine-tuning: FedAvg training; before evaluation each client fine-tunes the global model
on its own training data for ``fedavg-ft.epochs`` epochs (the copy is discarded afterwards)."""

from fedstrategies.fedavg import FedAvgStrategy


class FedAvgFTStrategy(FedAvgStrategy):
    """Server side identical to FedAvg; fine-tuning happens in the client's evaluate."""
