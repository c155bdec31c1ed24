"""pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020): personalisation by Moreau envelopes, server beta-mixing.

Every client trains every round (Algorithm 1: "for all i = 1..N in parallel"): it solves for a
personal model theta_i close to its local copy of the global model (clients/pfedme.py). The server then
samples S of them (``fraction-train`` of the clients, seeded), only those send their local model, and it
mixes their mean into the global one, w_{t+1} = (1 - beta) w_t + beta * 1/|S| sum_{i in S} w_{i,R}
(equal weights, as written there). The run's ``lr`` is eta, the step of the local models towards the
personal ones. Defaults: lambda 15, K 5, beta 1 (the paper's MNIST setting) with the personal lr 0.01 of
its Synthetic setting (lambda 20 there): the MNIST personal lr 0.1 makes the K steps diverge on mnist5k
here (one client's loss 4.8 after 20 local rounds with MLR, NaN with the CNN; 0.45 at 0.01).
"""

from __future__ import annotations

import numpy as np

from fedcore import wire
from fedcore.methods.pfedme import UPLOAD
from fedstrategies.aggregate import weighted_average
from fedstrategies.fedavg import FedAvgStrategy


def beta_mix(current: dict[str, np.ndarray], mean: dict[str, np.ndarray], beta: float) -> dict[str, np.ndarray]:
    """(1 - beta) * current + beta * mean for every float tensor; counters (integer tensors) take the mean's."""
    return {k: ((1.0 - beta) * current[k] + beta * v).astype(v.dtype) if v.dtype.kind == "f" else v
            for k, v in mean.items()}


class PFedMeStrategy(FedAvgStrategy):
    """The global model goes down to every client for training and for evaluation (pFedMe(GM), and
    clients that have not trained yet); the local models of the round's set S come up."""

    augments = False  # its personal and local steps draw their own batches (clients/pfedme.py)

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        self.senders: set[int] = set()  # S of the current round, drawn from (seed, round) in begin_round

    def sample_train(self, server_round):
        return list(self.clients)

    def begin_round(self, server_round, pids):
        self.senders = set(self.sample_clients(self.cfg["fraction-train"], server_round))

    def train_config(self, pid, server_round):
        return {UPLOAD: pid in self.senders}

    def reply_schema(self, pid):
        return super().reply_schema(pid) if pid in self.senders else {}

    def aggregate(self, server_round, replies):
        sent = [r for r in replies if r.pid in self.senders]
        if not sent:
            return {"senders": 0}
        mean = weighted_average((r.arrays[wire.WEIGHTS] for r in sent), [1.0] * len(sent))
        self.global_weights = beta_mix(self.global_weights, mean, self.hp["beta"])
        return {"senders": len(sent)}
