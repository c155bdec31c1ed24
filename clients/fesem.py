"""FeSEM client: start from the received centre of its cluster, train on the local data (with an optional
proximal pull lambda/2 ||w - w~_k||^2 towards the centre) and send the model back; evaluate the
received centre."""

from __future__ import annotations

from clients.fedavg import FedAvgClient


class FeSEMClient(FedAvgClient):
    def local_train(self, model, content) -> float:
        lam = self.hp["lambda"]
        if lam == 0:
            return self.train(model)
        anchor = [p.detach().clone() for p in model.parameters()]
        return self.train(model, proximal=(anchor, 0.5 * lam))  # CE + lambda/2 ||w - w~_k||^2
