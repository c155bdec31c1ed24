"""FedAMP (Huang et al., AAAI 2021): personalised models that collaborate through attentive message passing.

Every client keeps its own model w_i. Each round the server takes the latest copy of the models of
the round's clients (the seeded ``fraction-train`` sample; a client that never uploaded counts with
the common initial model), weights every pair by the attention function of their distance
(``fedamp_math.fedamp_weights``: xi_ij = alpha_k exp(-||w_i - w_j||^2 / sigma) / sigma, xi_ii = 1 - the
rest) and sends client i its cloud model u_i = sum_j xi_ij w_j. The client then minimises
F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2 (clients/fedamp.py) and uploads w_i, which the server keeps.
Clients evaluate their own w_i.

As in PFLlib's FedAMP (the public implementation), the message passing runs over the round's sampled
clients, so a round costs O(m^2 d) for m sampled clients of d parameters; the paper has every client
take part in every round (fraction-train 1). alpha_k = lambda = 1 are PFLlib's defaults.

sigma fits the run by default (``sigma = 0``, ``fedamp_math.median_scale``): sigma_k is the round's
median squared distance and the server's step is alpha_k sigma_k / (m - 1), alpha_k then being a fraction
of the largest step that keeps every self-weight >= 0. A fixed sigma cannot do both at these scales: the
squared distances between models trained from one start are below about 2, so PFLlib's sigma = 1 makes
the self-weight negative (20 clients on mnist5k: xi_ii = -18 in round 1), and sigma = 100 (our earlier
default) made the attention flat (off-diagonal weights 0.0098-0.0100, xi_ii = 0.81 for every client: 81%
own model plus a uniform mix). The client's proximal weight stays lambda / (2 alpha_k) with the configured
alpha_k: coupled to the fitted step it would be (m - 1) / (2 sigma_k), about 20-40 here, beyond plain
SGD's stability bound 1 / lr. ``m_attention-spread`` in rounds.csv is the weights' spread
(``fedamp_math.attention_spread``: 0 for a uniform mix). heurfedamp (fedstrategies/heurfedamp.py) is the
paper's heuristic.
"""

from __future__ import annotations

import numpy as np

from fedcore import wire
from fedcore.methods.fedamp import CLOUD
from fedstrategies import pairwise
from fedstrategies.base import PersonalizedStrategy, weights_schema
from fedstrategies.fedamp_math import attention_spread, fedamp_weights, median_scale


class FedAMPStrategy(PersonalizedStrategy):
    """Latest model of every client on the server, one cloud model per sampled client each round."""

    checkpoint_attrs = ("models",)

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        self.models: dict[int, dict[str, np.ndarray]] = {}  # pid -> w_i as last uploaded
        self._outgoing: dict[int, object] = {}
        self._metrics: dict = {}

    def model_of(self, pid: int) -> dict[str, np.ndarray]:
        return self.models.get(pid, self.initial_weights)

    def attention(self, states: list[dict[str, np.ndarray]]) -> np.ndarray:
        """The xi matrix of the round's clients (rows: receiver, columns: sender)."""
        d = pairwise.squared_distances(states)
        if self.hp["sigma"] > 0:
            return fedamp_weights(d, self.hp["alpha-k"], self.hp["sigma"])
        sigma, step = median_scale(d, self.hp["alpha-k"])
        if sigma == 0.0:  # every model the same: any mix is that model
            return np.eye(len(d))
        return fedamp_weights(d, step, sigma)

    def begin_round(self, server_round, pids):
        states = [self.model_of(pid) for pid in pids]
        xi = self.attention(states)
        clouds = pairwise.mix(xi, states)  # equal clouds (round 1: every client's) are one dict, packed once
        packed: dict[int, object] = {}
        for u in clouds:
            if id(u) not in packed:
                packed[id(u)] = wire.pack_arrays(u)
        self._outgoing = {pid: packed[id(u)] for pid, u in zip(pids, clouds)}
        self._metrics = {"self-weight": float(np.diag(xi).mean()), "self-weight-min": float(np.diag(xi).min()),
                         "attention-spread": attention_spread(xi)}
        if server_round == self.cfg["num-server-rounds"]:
            self.record_matrix("attention", xi)
            self.record_matrix("attention-pids", np.array(pids))

    def train_payload(self, pid, server_round):
        return {CLOUD: self._outgoing[pid]}

    def reply_schema(self, pid):
        return {wire.WEIGHTS: weights_schema(self.initial_weights)}

    def aggregate(self, server_round, replies):
        for reply in replies:  # the reply's read-only views, kept as they are: they hold its weights record's bytes
            self.models[reply.pid] = dict(reply.arrays[wire.WEIGHTS])  # alive, which a copy would only duplicate
        return dict(self._metrics)
