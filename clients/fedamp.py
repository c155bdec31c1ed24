"""FedAMP / HeurFedAMP client: proximal local training towards the received cloud model u_i.

State: the client's personalised model w_i (``model``; the seeded initial model before its first
round). Each round it minimises F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2 over its training set
(mini-batch SGD with the run's budget), starting from w_i (``start = own``, PFLlib) or from u_i
(``start = cloud``), keeps the result as w_i and uploads it. Evaluation scores w_i.
"""

from __future__ import annotations

import torch

from clients.base import ClientMethod, EvalResult
from clients.training import evaluate_model, proximal_term
from fedcore import wire
from fedcore.methods.fedamp import CLOUD, DIST_TO_CLOUD

MODEL = "model"


def proximal_weight(lam: float, alpha_k: float) -> float:
    """The coefficient of ||w - u_i||^2 in the local objective: lambda / (2 alpha_k)."""
    return lam / (2.0 * alpha_k)


class FedAMPClient(ClientMethod):
    def fit(self, content):
        cloud = self.model_from(content, CLOUD)
        anchor = [p.detach().clone() for p in cloud.parameters()]
        model = cloud if self.hp["start"] == "cloud" else self.load_model(MODEL)
        weight = proximal_weight(self.hp["lambda"], self.hp["alpha-k"])
        loss = self.train(model, proximal=(anchor, weight))  # CE + lambda / (2 alpha_k) ||w - u_i||^2
        self.save_model(model, MODEL)
        with torch.no_grad():
            dist = float(proximal_term(model, anchor))
        return ({wire.WEIGHTS: wire.pack_arrays(model.state_dict())},
                {wire.TRAIN_LOSS: loss, wire.METHOD_METRIC_PREFIX + DIST_TO_CLOUD: dist})

    def evaluate(self, content):
        return EvalResult(*evaluate_model(self.load_model(MODEL), self.data.x_test, self.data.y_test))


class HeurFedAMPClient(FedAMPClient):
    """The same client: HeurFedAMP differs from FedAMP only in the server's attention."""
