"""FeSEM, multi-center federated learning by stochastic EM (Long et al., World Wide Web 2023).

The server keeps K centre models and each client's assignment. Round t: every sampled client gets
the centre of its cluster (before the first centres exist: the common initial model; a client not
yet assigned: the centre nearest the initial model), trains it on its data (clients/fesem.py, with an
optional proximal pull ``lambda`` towards the centre) and uploads its model w_i. The server then
runs ``em-steps`` rounds of stochastic EM on this round's models (``fesem_math``): the E-step
assigns each model to its nearest centre by squared L2 distance, the M-step makes each centre the
mean of its members' models (a centre without members this round keeps its value). The first
centres are K of the first round's models, drawn at random (Forgy), as the paper initialises the
centres at random and the authors' code clusters the clients' first local models; K is at most the
number of clients. Clients evaluate their cluster's centre (the authors' code tests the cluster
model on each client).

Distances to K centres cost O(n K d) (``pairwise``, one pass over the models) and the M-step O(n d): each
centre is FedAvg's streamed weighted mean of its members (``aggregate.weighted_average``).
"""

from __future__ import annotations

import numpy as np

from fedcore import wire
from fedstrategies import pairwise
from fedstrategies.aggregate import weighted_average
from fedstrategies.base import PersonalizedStrategy, weights_schema
from fedstrategies.fesem_math import assign, centre_weights, initial_centres


class FeSEMStrategy(PersonalizedStrategy):
    """K centre models and an assignment of clients to them, updated by stochastic EM."""

    checkpoint_attrs = ("centres", "assignment")

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        self.centres: list[dict[str, np.ndarray]] | None = None  # None until the first EM round
        self.assignment: dict[int, int] = {}  # pid -> its centre
        self._reset()

    def _reset(self) -> None:
        self._default: int | None = None  # the centre nearest the initial model, once computed

    def centre_of(self, pid: int) -> int | None:
        """The centre client ``pid`` gets: its own, or the one nearest the initial model; None before
        any centre exists."""
        if self.centres is None:
            return None
        if pid in self.assignment:
            return self.assignment[pid]
        if self._default is None:
            self._default = int(assign(pairwise.squared_distances([self.initial_weights], self.centres))[0])
        return self._default

    def model_record(self, pid: int):
        k = self.centre_of(pid)  # None: the initial model, before the first centres
        return self.packed(("centre", k), lambda: wire.pack_arrays(self.initial_weights if k is None
                                                                   else self.centres[k]))

    def train_payload(self, pid, server_round):
        return {wire.WEIGHTS: self.model_record(pid)}

    def evaluate_payload(self, pid, server_round):
        return {wire.WEIGHTS: self.model_record(pid)}

    def reply_schema(self, pid):
        return {wire.WEIGHTS: weights_schema(self.initial_weights)}

    def reference_norm(self, record):
        if record != wire.WEIGHTS:
            return None
        models = self.centres or [self.initial_weights]
        return max(float(np.sqrt(pairwise.squared_norms([m])[0])) for m in models)

    @property
    def k(self) -> int:
        """The number of centres: ``clusters``, but no more than there are clients (a federation of 2
        clients with K = 3 would otherwise wait for 3 models forever and never train)."""
        return min(self.hp["clusters"], len(self.clients))

    def aggregate(self, server_round, replies):
        k = self.k
        if self.centres is None and len(replies) < k:
            return {"clusters-used": 0}  # the first centres need K models
        states = [r.arrays[wire.WEIGHTS] for r in replies]
        if self.centres is None:
            rng = np.random.default_rng([self.cfg["seed"], server_round, 23])
            self.centres = [{key: np.array(v) for key, v in states[i].items()} for i in initial_centres(len(states), k, rng)]
        p = (np.array([r.num_examples for r in replies], dtype=np.float64) if self.hp["weighting"] == "size"
             else np.ones(len(replies)))
        before = [self.assignment.get(r.pid) for r in replies]
        for _ in range(self.hp["em-steps"]):
            dist = pairwise.squared_distances(states, self.centres)
            labels = assign(dist)
            r = centre_weights(labels, k, p if p.sum() > 0 else None)
            members = [np.flatnonzero(row) for row in r]  # each model is read once, by its centre's mean
            self.centres = [weighted_average([states[i] for i in m], r[c, m]) if len(m) else self.centres[c]
                            for c, m in enumerate(members)]
        for reply, label in zip(replies, labels):
            self.assignment[reply.pid] = int(label)
        self._reset()
        return {"clusters-used": len(set(self.assignment.values())),
                "moved": sum(b is not None and b != int(a) for b, a in zip(before, labels)),
                "dist-to-centre": float(dist[np.arange(len(labels)), labels].mean())}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.assignment = {int(pid): int(c) for pid, c in self.assignment.items()}
        self._reset()
