"""FedAvg + fine-tuning client: trains like FedAvg; evaluates the global model after fine-tuning it."""

from clients.base import EvalResult
from clients.fedavg import FedAvgClient
from clients.training import evaluate_model, train_epochs
from fedcore import wire

FINE_TUNE_TAG = 1  # a shuffle stream of its own, apart from training's


class FedAvgFTClient(FedAvgClient):
    def evaluate(self, content):
        model = self.model_from(content, wire.WEIGHTS)
        train_epochs(model, self.data.x_train, self.data.y_train, epochs=self.hp["epochs"],
                     batch_size=self.cfg["batch-size"], optimizer=self.env.optimizer(model.parameters()),
                     generator=self.env.generator(FINE_TUNE_TAG))
        return EvalResult(*evaluate_model(model, self.data.x_test, self.data.y_test))
