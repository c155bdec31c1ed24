"""FedAvg + fine-tuning client: trains like FedAvg; evaluates the global model after fine-tuning it."""

from clients.base import EvalResult
from clients.fedavg import FedAvgClient
from clients.training import evaluate_model
from fedcore import wire

FINE_TUNE_TAG = 1  # a shuffle stream of its own, apart from training's


class FedAvgFTClient(FedAvgClient):
    def evaluate(self, content):
        model = self.model_from(content, wire.WEIGHTS)
        self.train(model, epochs=self.hp["epochs"], tag=FINE_TUNE_TAG)
        return EvalResult(*evaluate_model(model, self.data.x_test, self.data.y_test))
