"""Local: the client keeps one model in its state and trains it on its own data only."""

from clients.base import ClientMethod, EvalResult
from clients.training import evaluate_model, train_epochs


class LocalClient(ClientMethod):
    def _model(self):
        model = self.env.load_model()
        return self.env.new_model() if model is None else model

    def fit(self, content):
        model = self._model()
        loss = train_epochs(model, self.data.x_train, self.data.y_train, epochs=self.cfg["local-epochs"],
                            batch_size=self.cfg["batch-size"], optimizer=self.env.optimizer(model.parameters()),
                            generator=self.env.generator())
        self.env.save_model(model)
        return {}, {"train-loss": loss}

    def evaluate(self, content):
        return EvalResult(*evaluate_model(self._model(), self.data.x_test, self.data.y_test))
