"""FedRoD client: the generic model (received) and a personal head (kept), trained together per batch.

Per mini-batch, with z = body(x) and g = generic_head(z):

- generic model (body and generic head): balanced softmax, CE(g + log n, y) with n the client's
  training class counts (Ren et al. 2020; a class the client lacks gets log 0 = -inf, probability 0);
- personal head p: CE(g + p(z), y) with z and g held constant (no gradient reaches the generic model).

Both gradients come from one backward pass of their sum (the detached terms keep them apart), so this
equals PFLlib's two steps in a row. Prediction is argmax(g + p); the generic model alone is reported
as ``generic-acc``. The personal head starts as the seeded initial head (PFLlib) and is client state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clients.base import ClientMethod, EvalResult
from clients.batch_metrics import mean_loss
from clients.training import evaluate_logits, extract_features
from fedcore import wire
from fedcore.methods.fedrod import GENERIC_ACC, PERSONAL_LOSS

PERSONAL_HEAD = "personal-head"  # client state: the personal head's parameters


def balanced_softmax_loss(logits: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of -log( n_y e^{g_y} / sum_c n_c e^{g_c} ): cross-entropy on g + log n."""
    return F.cross_entropy(logits + torch.log(counts.to(logits.dtype)), y)


def generic_logits(model, z: torch.Tensor) -> torch.Tensor:
    """g: the generic model's decision module on features z (``classify`` where the model has dropout
    before its head)."""
    return getattr(model, "classify", model.head)(z)


class FedRoDClient(ClientMethod):
    def personal_head(self) -> torch.nn.Module:
        head = self.new_model().head  # the seeded initial head in the client's first round
        self.env.load_module(PERSONAL_HEAD, head)
        return head

    def fit(self, content):
        model = self.model_from(content, wire.WEIGHTS)
        personal = self.personal_head()
        counts = torch.as_tensor(self.data.train_label_counts, device=self.env.device)
        bsm = self.hp["generic-loss"] == "bsm"
        generic_losses, personal_losses = [], []

        def loss_fn(m, xb, yb):
            z = m.features(xb)
            g = generic_logits(m, z)
            generic = balanced_softmax_loss(g, yb, counts) if bsm else F.cross_entropy(g, yb)
            own = F.cross_entropy(g.detach() + personal(z.detach()), yb)
            generic_losses.append(generic.detach())
            personal_losses.append(own.detach())
            return generic + own

        optimizers = [self.env.optimizer(model.parameters()), self.env.optimizer(personal.parameters())]
        self.train(model, optimizer=optimizers, loss_fn=loss_fn)
        self.env.save_module(PERSONAL_HEAD, personal)
        metrics = {wire.TRAIN_LOSS: mean_loss(generic_losses),
                   wire.METHOD_METRIC_PREFIX + PERSONAL_LOSS: mean_loss(personal_losses)}
        return {wire.WEIGHTS: wire.pack_arrays(model.state_dict())}, metrics

    def evaluate(self, content):
        model = self.model_from(content, wire.WEIGHTS)
        personal = self.personal_head()
        z, y = extract_features(model, self.data.x_test), self.data.y_test  # eval mode, one body pass
        loss, correct, n = evaluate_logits(lambda zb: generic_logits(model, zb) + personal(zb), z, y)
        _, generic_correct, _ = evaluate_logits(lambda zb: generic_logits(model, zb), z, y)
        return EvalResult(loss, correct, n, metrics={GENERIC_ACC: generic_correct / max(n, 1)})
