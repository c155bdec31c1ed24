"""FedProto (Tan et al., AAAI 2022): clients exchange class prototypes only, never weights.

Server rule: the global prototype of class j is the mean of the clients' class-j prototypes
(``fedproto.aggregation``: sample-weighted by default, or uniform as in the authors' code).
"""

from __future__ import annotations

import numpy as np

from fedcore import wire
from fedcore.config import Key
from fedstrategies.base import PersonalizedStrategy
from fedstrategies.prototypes import aggregate_class_features

HPARAMS = {
    "lambda": Key(1.0, "weight of the prototype-distance regulariser", low=0.0),
    "aggregation": Key("weighted", "per-class mean of prototypes", choices=("weighted", "uniform")),
}


class FedProtoStrategy(PersonalizedStrategy):
    def __init__(self, cfg, clients, initial_weights):
        super().__init__(cfg, clients, initial_weights)
        self.num_classes = len(next(iter(self.clients.values())).train_label_counts)
        self.class_ids = np.zeros(0, np.int64)
        self.protos: np.ndarray | None = None
        self.counts = np.zeros(0, np.int64)

    def _payload(self):
        if self.protos is None:  # round 1: no global prototypes yet
            return {}
        return {wire.CLASS_FEATURES: wire.pack_class_features(self.class_ids, self.protos, self.counts)}

    def train_payload(self, pid, server_round):
        return self._payload()

    def evaluate_payload(self, pid):
        return self._payload()

    def reply_schema(self, pid):
        return {wire.CLASS_FEATURES: {"class-ids": None, "features": None, "counts": None}}

    def check_reply(self, reply):
        ids, feats, counts = (reply.arrays[wire.CLASS_FEATURES][k] for k in ("class-ids", "features", "counts"))
        if ids.ndim != 1 or feats.ndim != 2 or counts.shape != ids.shape or len(feats) != len(ids):
            return f"class-features shapes do not agree: ids {ids.shape}, features {feats.shape}, counts {counts.shape}"
        if len(ids) and (ids.min() < 0 or ids.max() >= self.num_classes or len(np.unique(ids)) != len(ids)):
            return f"class ids must be distinct and in 0..{self.num_classes - 1}"
        if (counts <= 0).any():
            return "class counts must be positive"
        if self.protos is not None and len(self.protos) and feats.shape[1] != self.protos.shape[1]:
            return f"feature dimension {feats.shape[1]} differs from {self.protos.shape[1]}"
        return None

    def aggregate(self, server_round, replies):
        parts = [r.arrays[wire.CLASS_FEATURES] for r in replies]
        ids, protos, counts = aggregate_class_features(
            [p["class-ids"] for p in parts], [p["features"] for p in parts], [p["counts"] for p in parts],
            self.num_classes, self.hp["aggregation"])
        if self.protos is not None:  # a class nobody reported this round keeps its previous prototype
            keep = ~np.isin(self.class_ids, ids)
            ids = np.concatenate([ids, self.class_ids[keep]])
            protos = np.concatenate([protos, self.protos[keep]])
            counts = np.concatenate([counts, self.counts[keep]])
            order = np.argsort(ids)
            ids, protos, counts = ids[order], protos[order], counts[order]
        self.class_ids, self.protos, self.counts = ids, protos, counts
