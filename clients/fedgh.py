"""FedGH client: its own extractor with the received global header in place of its own; trains the
whole model with cross-entropy, uploads its local averaged representations (LARs).

The LARs are the per-class mean features of the trained extractor over the whole training set,
in eval mode (PFLlib's ``collect_protos``). The extractor is the client's state across rounds;
the header it trained is discarded, since the next message's global header replaces it.
"""

from __future__ import annotations

from clients.base import ClientMethod, EvalResult
from clients.training import evaluate_model
from fedcore import wire
from fedcore.methods.fedgh import GLOBAL_HEAD


class FedGHClient(ClientMethod):
    def model_with_global_head(self, content):
        """The client's extractor (seeded initial one in its first round) under the received header."""
        model = self.load_model()
        head = wire.torch_arrays(content.array_records[GLOBAL_HEAD])
        model.head.load_state_dict({"weight": head["weight"], "bias": head["bias"]})
        return model

    def fit(self, content):
        model = self.model_with_global_head(content)
        loss = self.train(model)
        self.save_model(model)
        return self.class_feature_upload(model), {wire.TRAIN_LOSS: loss}

    def evaluate(self, content):
        model = self.model_with_global_head(content)
        return EvalResult(*evaluate_model(model, self.data.x_test, self.data.y_test))
