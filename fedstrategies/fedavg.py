"""FedAvg (McMahan et al., 2017): one global model, the sample-weighted mean of the clients' models."""

from __future__ import annotations

from fedcore import wire
from fedstrategies.aggregate import weighted_average
from fedstrategies.base import PersonalizedStrategy, weights_schema

HPARAMS: dict = {}


class FedAvgStrategy(PersonalizedStrategy):
    """Sends the global model to every sampled client and averages what comes back.

    ``shared_keys`` selects which tensors are global; subclasses that share only the body
    (FedPer, FedRep) narrow it, and everything else in this class stays the same.
    """

    def __init__(self, cfg, clients, initial_weights):
        super().__init__(cfg, clients, initial_weights)
        self.shared_keys = [k for k in initial_weights if self.is_shared(k)]
        self.global_weights = {k: initial_weights[k].copy() for k in self.shared_keys}

    def is_shared(self, key: str) -> bool:
        return True

    def train_payload(self, pid, server_round):
        return {wire.WEIGHTS: wire.pack_arrays(self.global_weights)}

    def reply_schema(self, pid):
        return {wire.WEIGHTS: weights_schema(self.global_weights)}

    def aggregate(self, server_round, replies):
        states = [r.arrays[wire.WEIGHTS] for r in replies]
        self.global_weights = weighted_average(states, [r.num_examples for r in replies])

    def evaluate_payload(self, pid):
        return {wire.WEIGHTS: wire.pack_arrays(self.global_weights)}
