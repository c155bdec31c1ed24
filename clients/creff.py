"""CReFF client: per-class classifier gradients of the real features at the global body and the server's
re-trained classifier (taken before local training, as the authors' code does), then FedAvg's local training."""

from __future__ import annotations

import torch

from clients.base import ClientMethod, EvalResult
from clients.mupfl import SAMPLE_TAG, sample_per_class
from clients.training import evaluate_model
from fedcore import class_gradients as cg
from fedcore import wire
from fedcore.methods.creff import GRADIENTS, RETRAINED_HEAD
from fedcore.models import HEAD_PREFIX


class CReFFClient(ClientMethod):
    def class_gradients(self, model, content) -> tuple[torch.Tensor, torch.Tensor]:
        """z_i^k at the received body (eval mode) and the re-trained classifier, in closed form."""
        head = wire.unpack_arrays(content[RETRAINED_HEAD])
        weight, bias = (wire.to_device(head[HEAD_PREFIX + k], self.env.device) for k in ("weight", "bias"))
        x, y = sample_per_class(self.data, self.hp["samples-per-class"], self.env.generator(SAMPLE_TAG))
        model.eval()
        with torch.no_grad():
            h = model.features(x)
        return cg.class_gradients(h, y, weight, bias, self.data.num_classes)

    def fit(self, content):
        model = self.model_from(content, wire.WEIGHTS)
        z, present = self.class_gradients(model, content)
        loss = self.train(model)
        return ({wire.WEIGHTS: wire.pack_arrays(model.state_dict()),
                 GRADIENTS: wire.pack_arrays({"z": z, "present": present.to(torch.float32)})},
                {wire.TRAIN_LOSS: loss})

    def evaluate(self, content):
        """The global body with the re-trained classifier, as the server sends it."""
        model = self.model_from(content, wire.WEIGHTS)
        return EvalResult(*evaluate_model(model, self.data.x_test, self.data.y_test))
