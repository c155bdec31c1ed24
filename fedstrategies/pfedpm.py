"""pFedPM (Xing et al., "Personalized federated learning based on feature fusion"): the server side.

Clients never send weights: each uploads its per-class mean features C_i^(j) with the class counts
n_ij (Eq. 6). The server averages them per class into global features C̄^(j) (Eq. 7) and sends those
back to every client, which mixes them with its own (Eq. 8) and trains on its own. The server holds
only the global features: no model parameters and no architecture, so clients may run different
models as long as their features have the same width d (pFedPM-mh).

``pfedpm.agg`` picks the reading of Eq. 7 (``fedstrategies.prototypes.aggregate_class_features``):
``weighted`` (sum_i n_ij / N_j C_i^(j), weights summing to 1, the spec's default), ``paper_literal``
(Eq. 7 as printed, which also divides by the number of holders and so shrinks the result) or
``uniform`` (the plain mean over holders, as FedProto's code does). A class that nobody reported
this round keeps its previous global feature. The global set starts empty, not at zeros (zeros would
pull every feature towards 0); the clients' ``has-global-features`` flag says when it is.
"""

from __future__ import annotations

import numpy as np

from fedcore import wire
from fedcore.methods.pfedpm import GLOBAL_FEATURES, HAS_GLOBAL
from fedcore.models import heterogeneous_kwargs
from fedstrategies.base import PersonalizedStrategy
from fedstrategies.prototypes import aggregate_class_features, check_whole_class_features, merge_class_features


class PFedPMStrategy(PersonalizedStrategy):
    """Keeps the global class features G = (class ids, (K, d) features, (K,) total counts), nothing else."""

    checkpoint_attrs = ("class_ids", "features", "counts")

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        if self.hp["heterogeneous"]:
            heterogeneous_kwargs(model.name, 0, 1)  # stop at start on a model without variants
        self.class_ids = np.zeros(0, np.int64)
        self.features: np.ndarray | None = None  # None until the first aggregation: G is empty
        self.counts = np.zeros(0, np.int64)
        self._n_classes = {pid: int(np.count_nonzero(info.train_label_counts)) for pid, info in self.clients.items()}

    # ------------------------------------------------------------------ down
    def train_payload(self, pid, server_round):
        if self.features is None:  # round 1: nothing to send, the flag says so
            return {}
        # one record shared by every client: packed and counted once
        return {GLOBAL_FEATURES: self.packed("global-features", lambda: wire.pack_arrays(
            {wire.CLASS_IDS: self.class_ids, wire.FEATURES: self.features}, compact=True))}

    def train_config(self, pid, server_round):
        return {HAS_GLOBAL: self.features is not None}

    # evaluation needs nothing from the server: clients predict with the mixed features they trained on

    # ------------------------------------------------------------------ up
    def reply_schema(self, pid):
        n, d = self._n_classes[pid], self.model.feature_dim
        return {wire.CLASS_FEATURES: {wire.CLASS_IDS: (n,), wire.FEATURES: (n, d), wire.COUNTS: (n,)}}

    def check_reply(self, reply):
        # Eq. 6 averages the whole local set: n_ij is the class's size from the handshake
        return check_whole_class_features(reply.arrays[wire.CLASS_FEATURES], self.num_classes,
                                          self.model.feature_dim, self.clients[reply.pid].train_label_counts)

    # ------------------------------------------------------------------ rule
    def aggregate(self, server_round, replies):
        parts = [r.arrays[wire.CLASS_FEATURES] for r in replies]
        new = aggregate_class_features([p[wire.CLASS_IDS] for p in parts], [p[wire.FEATURES] for p in parts],
                                       [p[wire.COUNTS] for p in parts], self.num_classes, self.hp["agg"])
        reported = len(new[0])
        old = None if self.features is None else (self.class_ids, self.features, self.counts)
        self.class_ids, self.features, self.counts = merge_class_features(new, old)
        return {"classes-reported": reported, "global-classes": len(self.class_ids)}
