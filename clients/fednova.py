"""FedNova client: FedAvg's local SGD for the epochs the server drew, reporting its effective step count."""

from __future__ import annotations

import numpy as np

from clients.fedavg import FedAvgClient
from fedcore import wire
from fedcore.methods.fednova import A_NORM, EPOCHS, LOCAL_STEPS, NORMALIZER, effective_steps


class FedNovaClient(FedAvgClient):
    def fit(self, content):
        model = self.model_from(content, wire.WEIGHTS)
        steps: list[int] = []
        # a step budget (local-steps) is the train loop's default; else the epochs the server drew
        epochs = None if self.cfg["local-steps"] else int(self.env.config[EPOCHS])
        loss = self.train(model, epochs=epochs, after_step=lambda step, batch_loss, idx: steps.append(step))
        a_norm = effective_steps(len(steps), self.cfg["momentum"])
        return ({wire.WEIGHTS: wire.pack_arrays(model.state_dict()),
                 NORMALIZER: wire.pack_arrays({A_NORM: np.array([a_norm])})},  # float64
                {wire.TRAIN_LOSS: loss, wire.METHOD_METRIC_PREFIX + LOCAL_STEPS: len(steps)})
