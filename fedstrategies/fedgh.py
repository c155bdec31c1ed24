"""FedGH (Yi et al., ACM MM 2023): a generalised global header trained on the server from the
clients' class prototypes, sent back to replace every client's header.

Each client keeps its own feature extractor; in a round it puts the received global header on it,
trains the whole model on its data with cross-entropy, and uploads one local averaged
representation (LAR) per class it holds. The server takes SGD steps on the header with
cross-entropy over the (LAR, class) pairs, theta <- theta - eta_theta * grad CE(H(LAR_k^s; theta), s)
(one step per LAR in the paper's rule, ``server-batch-size = 1``; PFLlib batches 10), and
broadcasts the new header. Evaluation: the client's extractor with the global header.

The server's head training is FedFCD's (``fedstrategies.fedfcd_math.GlobalHead``, Eq. 4 there is
this rule): one head and one SGD optimiser kept across rounds, shuffled passes over the pairs.
"""

from __future__ import annotations

from fedcore import wire
from fedcore.methods.fedgh import GLOBAL_HEAD
from fedstrategies.base import PersonalizedStrategy
from fedstrategies.fedfcd_math import GlobalHead, feature_pairs
from fedstrategies.prototypes import check_whole_class_features


class FedGHStrategy(PersonalizedStrategy):
    checkpoint_attrs = ("head",)

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        # theta(0) = the seeded initial model's head, so round 1's clients start from their own initial model
        self.head = GlobalHead(self.initial_weights["head.weight"], self.initial_weights["head.bias"],
                               lr=self.hp["server-lr"])

    def _head_record(self):
        return self.packed("head", lambda: wire.pack_arrays(self.head.arrays(), compact=True))

    def train_payload(self, pid, server_round):
        return {GLOBAL_HEAD: self._head_record()}

    def evaluate_payload(self, pid, server_round):
        return {GLOBAL_HEAD: self._head_record()}

    def reply_schema(self, pid):
        return {wire.CLASS_FEATURES: dict(wire.CLASS_FEATURES_SCHEMA)}

    def check_reply(self, reply):
        # one LAR per class the client holds: a client cannot add pairs for classes it does not have
        return check_whole_class_features(reply.arrays[wire.CLASS_FEATURES], self.num_classes,
                                          self.model.feature_dim, self.clients[reply.pid].train_label_counts)

    def aggregate(self, server_round, replies):
        """SGD on the header over this round's (LAR, class) pairs, one pair per (client, class), unweighted."""
        parts = [r.arrays[wire.CLASS_FEATURES] for r in replies]
        x, y = feature_pairs(parts)
        before = self.head.loss(x, y)
        batch_loss = self.head.train(x, y, batch_size=self.hp["server-batch-size"], epochs=self.hp["server-epochs"],
                                     generator=self.torch_generator)
        return {"head-loss-before": before, "head-loss-after": self.head.loss(x, y), "head-batch-loss": batch_loss,
                "head-pairs": len(y)}
