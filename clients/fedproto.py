"""FedProto client: personal model trained with CE + lambda * ||f(x) - global prototype of y||^2;
uploads its class-mean features; predicts by the nearest global prototype."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clients.base import ClientMethod, EvalResult
from clients.training import cross_entropy, evaluate_features
from fedcore import wire
from fedcore.methods.fedproto import HAS_PROTOTYPES


class FedProtoClient(ClientMethod):
    def _global_protos(self, content) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Global prototypes as (class ids, (K, d) features), or None before the first aggregation
        (the server's ``has-global-prototypes`` flag says which)."""
        if not self.env.config[HAS_PROTOTYPES]:
            return None
        ids, feats, _ = wire.unpack_class_features(content.array_records[wire.CLASS_FEATURES])
        if len(ids) == 0:
            return None
        dev = self.env.device
        return wire.to_device(ids, dev), wire.to_device(feats, dev)  # copies of read-only views

    def fit(self, content):
        model = self.load_model()
        protos = self._global_protos(content)
        lam = self.hp["lambda"]
        loss_fn = cross_entropy
        if protos is not None and lam > 0:
            ids, feats = protos
            table = torch.zeros(self.data.num_classes, feats.shape[1], device=feats.device)
            table[ids] = feats
            known = torch.zeros(self.data.num_classes, dtype=torch.bool, device=feats.device)
            known[ids] = True

            def loss_fn(model, xb, yb):
                h = model.features(xb)
                # the model's whole decision module (protocnn: Dropout + Linear), as in round 1 and in pFedPM
                loss = F.cross_entropy(getattr(model, "classify", model.head)(h), yb)
                has = known[yb]
                if bool(has.any()):  # classes without a global prototype add no pull
                    loss = loss + lam * F.mse_loss(h[has], table[yb[has]])
                return loss

        loss = self.train(model, loss_fn=loss_fn)
        self.save_model(model)
        return self.class_feature_upload(model), {wire.TRAIN_LOSS: loss}

    def evaluate(self, content):
        model = self.load_model()
        protos = self._global_protos(content)
        loss, correct, n, test_feats = evaluate_features(model, self.data.x_test, self.data.y_test)
        if protos is not None:  # FedProto's inference: the class of the nearest global prototype
            ids, feats = protos
            dist = torch.cdist(test_feats, feats)
            correct = int((ids[dist.argmin(1)] == self.data.y_test).sum())
        return EvalResult(loss, correct, n)
