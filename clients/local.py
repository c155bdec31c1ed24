"""Local: the client keeps one model in its state and trains it on its own data only."""

from clients.base import ClientMethod, EvalResult
from clients.training import evaluate_model
from fedcore import wire


class LocalClient(ClientMethod):
    def fit(self, content):
        model = self.load_model()
        loss = self.train(model)
        self.save_model(model)
        return {}, {wire.TRAIN_LOSS: loss}

    def evaluate(self, content):
        return EvalResult(*evaluate_model(self.load_model(), self.data.x_test, self.data.y_test))
