"""FedProx client: FedAvg's local training plus the proximal term mu/2 * ||w - w_global||^2."""

from __future__ import annotations

import torch.nn.functional as F

from clients.fedavg import FedAvgClient
from clients.training import proximal_term


class FedProxClient(FedAvgClient):
    def local_train(self, model, content) -> float:
        anchor = [p.detach().clone() for p in model.parameters()]
        mu = self.hp["mu"]

        def loss_fn(m, xb, yb):
            return F.cross_entropy(m(xb), yb) + 0.5 * mu * proximal_term(m, anchor)

        return self.train(model, loss_fn=loss_fn)
