"""CReFF (Shang et al., IJCAI 2022): classifier re-training with federated features; the rival MuPFL's PKCF
builds on (mupfl.md section 9).

One round, as the authors' code (shangxinyi/CReFF-FL) runs it:

- down: the FedAvg global model and the classifier re-trained in the last round (a fresh one at first);
- the client takes its per-class classifier gradients of its real features at the global body and the
  re-trained classifier (before training), then trains the global model as FedAvg does;
- the server averages the models (FedAvg), moves the federated features H so that their classifier gradients
  match the averaged real ones (``fedstrategies/federated_features.py``, the rule MuPFL's PKCF shares), and
  re-trains a freshly initialised classifier on H;
- evaluation: the global body with the re-trained classifier, on each client's own test split.

The FedAvg model keeps its own classifier for training; only evaluation and the gradients use the re-trained one.

The matching defaults to Adam at 0.01, restarted each round (MuPFL's PKCF, the rule the comparison is about),
not the authors' SGD at 0.1 (``match-optimizer = sgd``, ``match-lr = 0.1``): that step was set for d = 256,
and the gradient on H shrinks as d grows, so at d = 3,136 (the 28 x 28 MuPFL CNN) 100 SGD steps move the
round-1 matching loss from 0.916 to 0.893 and the classifier is re-trained on near-random features; Adam's
step does not depend on the gradient's scale and takes it to below 0.001. SGD with its step scaled by
d / 256 only restores the authors' own d = 256 reduction (0.70 of the loss).
"""

from __future__ import annotations

import numpy as np
import torch

from fedcore import wire
from fedcore.class_gradients import synthetic_labels
from fedcore.methods.creff import GRADIENTS, RETRAINED_HEAD
from fedcore.models import HEAD_PREFIX, one_torch_thread
from fedstrategies.fedavg import FedAvgStrategy
from fedstrategies.federated_features import (average_class_gradients, fresh_linear, match_features,
                                              retrain_classifier)

WEIGHT, BIAS = HEAD_PREFIX + "weight", HEAD_PREFIX + "bias"


class CReFFStrategy(FedAvgStrategy):
    """FedAvg plus the federated features H and the classifier re-trained on them (the state across rounds)."""

    checkpoint_attrs = ("global_weights", "features", "retrained")

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        K, d = model.num_classes, model.feature_dim
        self.features = torch.randn((K * self.hp["features-per-class"], d), generator=self.torch_generator).numpy()
        self.retrained = self._fresh_head()

    def _fresh_head(self) -> dict[str, np.ndarray]:
        weight, bias = fresh_linear(self.model.feature_dim, self.num_classes, self.torch_generator)
        return {WEIGHT: weight.numpy(), BIAS: bias.numpy()}

    # ------------------------------------------------------------------ down
    def train_payload(self, pid, server_round):
        return {wire.WEIGHTS: self.packed_global(),
                RETRAINED_HEAD: self.packed("retrained", lambda: wire.pack_arrays(self.retrained))}

    def evaluate_payload(self, pid, server_round):
        """The global body with the re-trained classifier (CReFF's evaluated model)."""
        return {wire.WEIGHTS: self.packed("evaluated", lambda: wire.pack_arrays({**self.global_weights,
                                                                                **self.retrained}))}

    # ------------------------------------------------------------------ up
    def reply_schema(self, pid):
        K, d = self.num_classes, self.model.feature_dim
        return {**super().reply_schema(pid), GRADIENTS: {"z": (K, K * d + K), "present": (K,)}}

    def check_reply(self, reply):
        if reply.num_examples <= 0:
            return "no training samples (num-examples must be positive to weigh a model)"
        if not np.isin(reply.arrays[GRADIENTS]["present"], (0, 1)).all():
            return "class-gradients/present must hold only 0 and 1"
        return None

    # ------------------------------------------------------------------ rule
    def aggregate(self, server_round, replies):
        super().aggregate(server_round, replies)  # FedAvg
        z, reported = average_class_gradients((r.arrays[GRADIENTS]["z"], r.arrays[GRADIENTS]["present"])
                                              for r in replies)
        features = torch.from_numpy(self.features.copy())
        weight, bias = torch.from_numpy(self.retrained[WEIGHT]), torch.from_numpy(self.retrained[BIAS])
        hp = self.hp
        with one_torch_thread():
            before, after = match_features(features, torch.from_numpy(z.astype(np.float32)),
                                           torch.from_numpy(reported), weight, bias, hp["match-steps"],
                                           hp["match-lr"], hp["match-optimizer"])
            fresh = self._fresh_head()
            weight, bias = retrain_classifier(features, synthetic_labels(self.num_classes, hp["features-per-class"]),
                                              torch.from_numpy(fresh[WEIGHT]), torch.from_numpy(fresh[BIAS]),
                                              hp["retrain-epochs"], hp["retrain-lr"], hp["retrain-batch"],
                                              self.torch_generator)
        self.features = features.numpy()
        self.retrained = {WEIGHT: weight.numpy(), BIAS: bias.numpy()}
        return {"match-loss-before": before, "match-loss": after}
