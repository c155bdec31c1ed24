"""Ditto client: personal model v trained with CE + lambda/2 * ||v - w||^2 towards the received global
model w, then w trained as in FedAvg and sent back. Evaluation uses v."""

from clients.base import EvalResult
from clients.fedavg import FedAvgClient
from clients.training import evaluate_model

PERSONAL = "personal"
PERSONAL_TAG = 1


class DittoClient(FedAvgClient):
    def local_train(self, model, content) -> float:
        """``model`` is the received global model: first the personal step towards it, then FedAvg's."""
        personal = self.load_model(PERSONAL)
        anchor = [p.detach().clone() for p in model.parameters()]
        self.train(personal, epochs=self.hp["personal-epochs"], tag=PERSONAL_TAG,
                   proximal=(anchor, 0.5 * self.hp["lambda"]))  # CE + lambda/2 ||v - w||^2
        self.save_model(personal, PERSONAL)
        return super().local_train(model, content)

    def evaluate(self, content):
        return EvalResult(*evaluate_model(self.load_model(PERSONAL), self.data.x_test, self.data.y_test))
