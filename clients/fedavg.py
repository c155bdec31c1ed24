"""FedAvg client: start from the received global model, train locally, send the whole model back."""

from clients.base import ClientMethod, EvalResult
from clients.training import evaluate_model
from fedcore import wire


class FedAvgClient(ClientMethod):
    def local_train(self, model, content) -> float:
        """One round of local training of the received model (FedProx adds its proximal term here)."""
        return self.train(model)

    def fit(self, content):
        model = self.model_from(content, wire.WEIGHTS)
        loss = self.local_train(model, content)
        return {wire.WEIGHTS: wire.pack_arrays(model.state_dict())}, {wire.TRAIN_LOSS: loss}

    def evaluate(self, content):
        model = self.model_from(content, wire.WEIGHTS)
        return EvalResult(*evaluate_model(model, self.data.x_test, self.data.y_test))
