"""FedProx client: FedAvg's local training plus the proximal term mu/2 * ||w - w_global||^2."""

from __future__ import annotations

from clients.fedavg import FedAvgClient


class FedProxClient(FedAvgClient):
    def local_train(self, model, content) -> float:
        anchor = [p.detach().clone() for p in model.parameters()]
        return self.train(model, proximal=(anchor, 0.5 * self.hp["mu"]))  # CE + mu/2 ||w - w_global||^2
