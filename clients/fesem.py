"""FeSEM client: start from the received centre of its cluster, train on the local data (with an optional
proximal pull lambda/2 ||w - w~_k||^2 towards the centre) and send the model back; evaluate the
received centre."""

from __future__ import annotations

from clients.fedavg import FedAvgClient
from clients.training import cross_entropy, proximal_term


class FeSEMClient(FedAvgClient):
    def local_train(self, model, content) -> float:
        lam = self.hp["lambda"]
        if lam == 0:
            return self.train(model)
        anchor = [p.detach().clone() for p in model.parameters()]

        def loss_fn(m, xb, yb):
            return cross_entropy(m, xb, yb) + 0.5 * lam * proximal_term(m, anchor)

        return self.train(model, loss_fn=loss_fn)
