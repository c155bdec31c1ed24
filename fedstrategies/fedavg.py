"""FedAvg (McMahan et al., 2017): one global model, the sample-weighted mean of the clients' models."""

from __future__ import annotations

import numpy as np

from fedcore import wire
from fedstrategies.aggregate import weighted_average
from fedstrategies.base import PersonalizedStrategy, weights_schema


class FedAvgStrategy(PersonalizedStrategy):
    """Sends the global model to every sampled client and averages what comes back.

    ``is_shared`` selects which tensors are global; subclasses that share only the body
    (FedPer, FedRep) narrow it, and everything else in this class stays the same.
    """

    checkpoint_attrs = ("global_weights",)

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        self.global_weights = {k: v.copy() for k, v in model.initial_weights.items() if self.is_shared(k)}

    def is_shared(self, key: str) -> bool:
        return True

    def packed_global(self):
        """The global model as one record, packed once per version and sent to every client."""
        return self.packed("global", lambda: wire.pack_arrays(self.global_weights))

    def train_payload(self, pid, server_round):
        return {wire.WEIGHTS: self.packed_global()}

    def reply_schema(self, pid):
        return {wire.WEIGHTS: weights_schema(self.global_weights)}

    def reference_norm(self, record):
        if record != wire.WEIGHTS:
            return None
        return float(np.sqrt(sum(float(np.vdot(v, v)) for v in self.global_weights.values() if v.dtype.kind == "f")))

    def aggregate(self, server_round, replies):
        self.global_weights = weighted_average((r.arrays[wire.WEIGHTS] for r in replies),
                                               [r.num_examples for r in replies])

    def evaluate_payload(self, pid, server_round):
        return {wire.WEIGHTS: self.packed_global()}
