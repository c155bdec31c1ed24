"""FedProto (Tan et al., AAAI 2022): clients exchange class prototypes only, never weights.

Server rule: the global prototype of class j is the mean of the clients' class-j prototypes
(``fedproto.aggregation``: sample-weighted by default, or uniform as in the authors' code).
"""

from __future__ import annotations

import numpy as np

from fedcore import wire
from fedcore.methods.fedproto import HAS_PROTOTYPES
from fedstrategies.base import PersonalizedStrategy
from fedstrategies.prototypes import aggregate_class_features, check_class_features, merge_class_features


class FedProtoStrategy(PersonalizedStrategy):
    checkpoint_attrs = ("class_ids", "protos", "counts")

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        self.class_ids = np.zeros(0, np.int64)
        self.protos: np.ndarray | None = None  # None until the first aggregation
        self.counts = np.zeros(0, np.int64)

    def _payload(self):
        if self.protos is None:  # round 1: no global prototypes yet (the config flag says so)
            return {}
        return {wire.CLASS_FEATURES: self.packed("prototypes", lambda: wire.pack_class_features(
            self.class_ids, self.protos, self.counts))}

    def _config(self):
        return {HAS_PROTOTYPES: self.protos is not None}

    def train_payload(self, pid, server_round):
        return self._payload()

    def train_config(self, pid, server_round):
        return self._config()

    def evaluate_payload(self, pid, server_round):
        return self._payload()

    def evaluate_config(self, pid, server_round):
        return self._config()

    def reply_schema(self, pid):
        return {wire.CLASS_FEATURES: dict(wire.CLASS_FEATURES_SCHEMA)}

    def check_reply(self, reply):
        width = self.model.feature_dim if self.protos is None else self.protos.shape[1]
        return check_class_features(reply.arrays[wire.CLASS_FEATURES], self.num_classes, width)

    def reference_norm(self, record):
        """Class features are bounded by the global prototypes' scale, row for row: a client's
        upload of K rows is expected near sqrt(K / K_global) times their norm; the round's median
        (the base's rule) covers the first round."""
        if self.protos is None or not len(self.protos):
            return None
        return float(np.linalg.norm(self.protos))

    def aggregate(self, server_round, replies):
        parts = [r.arrays[wire.CLASS_FEATURES] for r in replies]
        new = aggregate_class_features(
            [p[wire.CLASS_IDS] for p in parts], [p[wire.FEATURES] for p in parts], [p[wire.COUNTS] for p in parts],
            self.num_classes, self.hp["aggregation"])
        old = None if self.protos is None else (self.class_ids, self.protos, self.counts)
        self.class_ids, self.protos, self.counts = merge_class_features(new, old)
