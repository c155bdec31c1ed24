"""FedMCSA (Guo et al., Neurocomputing 2023): per-layer self-attention across clients on the server.

The server keeps the latest model of every client (by partition id). Each round t it samples S
clients (``clients-per-round``, seeded), runs the model-component self-attention of
``fedmcsa_math.mcsa`` over their models and sends each of them its own personalised model W_i^t.
Clients train R proximal SGD steps towards the W_i they last received (clients/fedmcsa.py).

Who trains (``train``):

- ``all`` (default, Algorithm 1 as printed and the authors' code): every client trains every
  round; only the sampled ones exchange models. Alg. 1 line 2 has the clients of S^t send their
  current model Theta^{t-1} before the attention of round t, i.e. the model they had at the end of
  round t-1. Sampling is seeded by the round, so the server knows S^{t+1} during round t: the
  clients of S^{t+1} upload their freshly trained model at the end of round t (config ``upload``),
  and round t+1's attention uses exactly Theta^t, with no extra message. (The authors' code does
  the same: all users train, then the selected ones are drawn and their fresh models mixed, and the
  mix is sent back before the next training.) Everyone else's reply carries no weights.
- ``sampled`` (the spec's Option B): only the sampled clients train; each uploads after training
  and the server copy is exact until it is next sampled.

Round 1 uses U^0, the common seeded initial model (all clients start from it), so its attention is
uniform and W_i^1 = Theta^0.
"""

from __future__ import annotations

import numpy as np

from fedcore import wire
from fedcore.methods.fedmcsa import RECEIVE, UPLOAD, resolve_options
from fedstrategies.base import PersonalizedStrategy, weights_schema
from fedstrategies.fedmcsa_math import mcsa


class FedMCSAStrategy(PersonalizedStrategy):
    """Per-client models on the server, attention over the sampled ones, personalised models down."""

    checkpoint_attrs = ("models",)

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        self.hp = resolve_options(cfg)
        if cfg["fraction-train"] != 1.0:
            raise ValueError("fedmcsa samples its own clients: set fedmcsa.clients-per-round (S) and "
                             "fedmcsa.train, and leave fraction-train at 1.0")
        self.num_sampled = min(self.hp["clients-per-round"], len(self.clients))
        # latest model uploaded by each client; a client that never uploaded still has U^0
        self.models: dict[int, dict[str, np.ndarray]] = {}
        self._outgoing: dict[int, object] = {}  # pid -> packed W_i of this round
        self._uploaders: set[int] = set()
        self._metrics: dict = {}

    # ------------------------------------------------------------ who does what
    def exchange_set(self, server_round: int) -> list[int]:
        """S^t: the clients whose models are mixed in round t and who receive W_i^t (seeded by the round)."""
        return self.sample_clients(self.num_sampled / len(self.clients), server_round)

    def sample_train(self, server_round):
        return list(self.clients) if self.hp["train"] == "all" else self.exchange_set(server_round)

    def model_of(self, pid: int) -> dict[str, np.ndarray]:
        return self.models.get(pid, self.initial_weights)

    def begin_round(self, server_round, pids):
        sampled = self.exchange_set(server_round)
        personalised, matrices = mcsa([self.model_of(pid) for pid in sampled], self.hp["sigma"],
                                      mode=self.hp["component"],
                                      sizes=[self.clients[pid].num_train for pid in sampled],
                                      aggregation=self.hp["aggregation"], size_weighting=self.hp["size-weighting"])
        self._outgoing = {pid: wire.pack_arrays(w) for pid, w in zip(sampled, personalised)}
        if self.hp["train"] == "sampled":
            self._uploaders = set(sampled)
        elif server_round < self.cfg["num-server-rounds"]:
            self._uploaders = set(self.exchange_set(server_round + 1))
        else:
            self._uploaders = set()  # nobody is mixed after the last round
        self._metrics = {"self-weight": float(np.mean([np.diag(p).mean() for p in matrices.values()]))}
        chosen = self.hp["attention-round"] or self.cfg["num-server-rounds"]
        if server_round == chosen:
            self.record_matrix("sampled-pids", np.array(sampled))
            for name, psi in matrices.items():
                self.record_matrix(f"attention/{name}", psi)

    # ------------------------------------------------------------ messages
    def train_payload(self, pid, server_round):
        return {wire.WEIGHTS: self._outgoing[pid]} if pid in self._outgoing else {}

    def train_config(self, pid, server_round):
        return {RECEIVE: pid in self._outgoing, UPLOAD: pid in self._uploaders}

    def reply_schema(self, pid):
        return {wire.WEIGHTS: weights_schema(self.initial_weights)} if pid in self._uploaders else {}

    def check_reply(self, reply):
        for key, value in reply.arrays.get(wire.WEIGHTS, {}).items():
            if value.dtype != self.initial_weights[key].dtype:
                return f"weights/{key} has dtype {value.dtype}, expected {self.initial_weights[key].dtype}"
        return None

    def aggregate(self, server_round, replies):
        for reply in replies:
            if wire.WEIGHTS in reply.arrays:
                self.models[reply.pid] = {k: np.array(v) for k, v in reply.arrays[wire.WEIGHTS].items()}
        return {**self._metrics, "uploads": sum(wire.WEIGHTS in r.arrays for r in replies)}
