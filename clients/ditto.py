"""Ditto client: personal model v trained with CE + lambda/2 * ||v - w||^2 towards the received global
model w, then w trained as in FedAvg and sent back. Evaluation uses v."""

import torch.nn.functional as F

from clients.base import EvalResult
from clients.fedavg import FedAvgClient
from clients.training import evaluate_model, proximal_term, train_epochs
from fedcore import wire

PERSONAL = "personal"
PERSONAL_TAG = 1


class DittoClient(FedAvgClient):
    def _personal(self):
        model = self.env.load_model(PERSONAL)
        return self.env.new_model() if model is None else model

    def fit(self, content):
        personal = self._personal()
        anchor = [p.detach() for p in self.model_from(content, wire.WEIGHTS).parameters()]
        lam = self.hp["lambda"]

        def loss_fn(m, xb, yb):
            return F.cross_entropy(m(xb), yb) + 0.5 * lam * proximal_term(m, anchor)

        train_epochs(personal, self.data.x_train, self.data.y_train, epochs=self.hp["personal-epochs"],
                     batch_size=self.cfg["batch-size"], optimizer=self.env.optimizer(personal.parameters()),
                     generator=self.env.generator(PERSONAL_TAG), loss_fn=loss_fn)
        self.env.save_model(personal, PERSONAL)
        return super().fit(content)

    def evaluate(self, content):
        return EvalResult(*evaluate_model(self._personal(), self.data.x_test, self.data.y_test))
