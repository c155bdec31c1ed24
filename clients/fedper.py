"""FedPer client: received global body + personal head (kept in state), trained jointly; uploads the body."""

from clients.base import EvalResult
from clients.fedavg import FedAvgClient
from clients.training import evaluate_model
from fedcore import wire
from fedcore.models import BODY_PREFIX


class FedPerClient(FedAvgClient):
    def personal_model(self, content):
        """The client's model (personal head from earlier rounds) with the received global body."""
        model = self.load_model()
        self.load_weights(model, content, wire.WEIGHTS)
        return model

    def fit(self, content):
        model = self.personal_model(content)
        loss = self.local_train(model, content)
        self.save_model(model)
        body = {k: v for k, v in model.state_dict().items() if k.startswith(BODY_PREFIX)}
        return {wire.WEIGHTS: wire.pack_arrays(body)}, {wire.TRAIN_LOSS: loss}

    def evaluate(self, content):
        return EvalResult(*evaluate_model(self.personal_model(content), self.data.x_test, self.data.y_test))
