"""FedFCD (Li, Wang, Wang, CMC 2024): feature alignment, a server-trained global head, decision fusion.

Clients keep a personal extractor theta_i and a personal head phi_i that never leave them; they
upload one mean feature (LFR) per local class with its count. The server

1. trains the global head phi_g on this round's (LFR, label) pairs with cross-entropy (Eq. 4:
   one shuffled epoch, batch 10, SGD 0.01; phi_g and its optimiser persist across rounds), and
2. averages the LFRs per class into global features (GFRs, Eq. 5 with weights that sum to 1);
   classes nobody reported this round keep their previous GFR,

and sends phi_g and the GFRs down. Round 0 (the base's preparation phase) collects the LFRs of
the untrained extractors from every client and runs the same rule, so round 1 already has phi_g
and a GFR for every class present anywhere ("all clients upload their LFR before training
commences"). No model weights are averaged.

Wire: up ``class-features`` (class ids, LFRs, counts); down ``global-head`` (weight (C, d), bias
(C,)) and ``class-features`` (the GFRs: class ids, (K, d) features, counts), so 2Cd + C floats
when every class has a GFR with ``gfr-download = "all"``; the default ``"own"`` sends only the rows of
the client's classes, which are all its training uses). Evaluation needs only the global head.
"""

from __future__ import annotations

import numpy as np

from fedcore import wire
from fedcore.methods.fedfcd import GLOBAL_HEAD
from fedstrategies.base import PersonalizedStrategy
from fedstrategies.fedfcd_math import GlobalHead, feature_pairs
from fedstrategies.prototypes import aggregate_class_features, check_whole_class_features


class FedFCDStrategy(PersonalizedStrategy):
    checkpoint_attrs = ("head", "gfr", "gfr_mask", "gfr_counts")

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        c, d = self.num_classes, self.model.feature_dim
        # phi_g(0) = the seeded initial model's head, which is also every client's phi_i(0)
        self.head = GlobalHead(self.initial_weights["head.weight"], self.initial_weights["head.bias"],
                               lr=self.hp["lr-global-head"])
        self.gfr = np.zeros((c, d), np.float32)  # row j: GFR of class j (valid where gfr_mask)
        self.gfr_mask = np.zeros(c, bool)
        self.gfr_counts = np.zeros(c, np.int64)  # N_j of the round that set row j

    # ---------------------------------------------------------------- round 0: LFRs of the untrained extractors
    def prepare_targets(self):
        return list(self.clients)

    def prepare_schema(self, pid):
        return self.reply_schema(pid)

    def aggregate_prepare(self, replies):
        return self.aggregate(0, replies)

    # ---------------------------------------------------------------- payloads
    def _head_record(self):
        return self.packed("head", lambda: wire.pack_arrays(self.head.arrays(), compact=True))

    def _gfr_record(self, pid: int):
        """The GFRs a client gets: all classes that have one, or (``own``) those among its classes."""
        rows = self.gfr_mask.copy()
        if self.hp["gfr-download"] == "own":
            rows &= self.clients[pid].train_label_counts > 0
        ids = np.flatnonzero(rows)  # clients with the same rows share one record
        return self.packed(("gfr", rows.tobytes()),
                           lambda: wire.pack_class_features(ids, self.gfr[ids], self.gfr_counts[ids]))

    def train_payload(self, pid, server_round):
        return {GLOBAL_HEAD: self._head_record(), wire.CLASS_FEATURES: self._gfr_record(pid)}

    def evaluate_payload(self, pid, server_round):
        return {GLOBAL_HEAD: self._head_record()}

    # ---------------------------------------------------------------- replies
    def reply_schema(self, pid):
        return {wire.CLASS_FEATURES: dict(wire.CLASS_FEATURES_SCHEMA)}

    def check_reply(self, reply):
        # The counts weigh the GFRs: they must be the class sizes the client reported at the handshake.
        return check_whole_class_features(reply.arrays[wire.CLASS_FEATURES], self.num_classes,
                                          self.model.feature_dim, self.clients[reply.pid].train_label_counts)

    def aggregate(self, server_round, replies):
        """Train phi_g on this round's (LFR, label) pairs (Eq. 4), then update the GFRs (Eq. 5)."""
        parts = [r.arrays[wire.CLASS_FEATURES] for r in replies]
        ids = [p[wire.CLASS_IDS] for p in parts]
        feats = [p[wire.FEATURES] for p in parts]
        counts = [p[wire.COUNTS] for p in parts]
        x, y = feature_pairs(parts)
        before = self.head.loss(x, y)
        batch_loss = self.head.train(x, y, batch_size=self.hp["server-batch-size"], epochs=self.hp["server-epochs"],
                                     generator=self.torch_generator)
        after = self.head.loss(x, y)
        classes, means, totals = aggregate_class_features(ids, feats, counts, self.num_classes,
                                                          self.hp["gfr-weighting"])
        # Classes nobody reported this round keep their previous row (as merge_class_features does).
        self.gfr[classes], self.gfr_mask[classes], self.gfr_counts[classes] = means, True, totals
        return {"head-loss-before": before, "head-loss-after": after, "head-batch-loss": batch_loss,
                "head-pairs": len(y), "gfr-classes": int(self.gfr_mask.sum())}
