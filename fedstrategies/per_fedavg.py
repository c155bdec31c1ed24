"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020): FedAvg's server on a MAML objective.

Clients take meta-steps on F_i(w) = f_i(w - alpha * grad f_i(w)) (clients/per_fedavg.py): the first-order
variant drops the Hessian term, the Hessian-free one estimates the Hessian-vector product by a finite
difference of gradients. The server averages the sampled clients' models with equal weights,
w_{k+1} = 1/|A_k| sum_{i in A_k} w^i_{k+1,tau} (Algorithm 1, last line), and every client is evaluated
after one step of local adaptation w - alpha * grad f_i(w) from the global model.
"""

from __future__ import annotations

from fedcore import wire
from fedstrategies.aggregate import weighted_average
from fedstrategies.fedavg import FedAvgStrategy


class PerFedAvgStrategy(FedAvgStrategy):
    """FedAvg's messages (the global model each way); the average gives every replying client equal weight."""

    augments = False  # its meta-steps draw their own batches (clients/per_fedavg.py)

    def aggregate(self, server_round, replies):
        self.global_weights = weighted_average((r.arrays[wire.WEIGHTS] for r in replies), [1.0] * len(replies))
