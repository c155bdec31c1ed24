"""Majority client: predicts the label it saw most often in training (ties: the smallest label)."""

import numpy as np

from clients.base import ClientMethod, EvalResult
from fedcore import wire


class MajorityClient(ClientMethod):
    def fit(self, content):
        return {}, {}

    def evaluate(self, content):
        counts = self.data.train_label_counts
        label = int(np.argmax(counts))
        y = wire.to_host(self.data.y_test)
        # loss: cross-entropy of the training label frequencies (add-one smoothed), the predictor's own belief
        prior = (counts + 1.0) / (counts.sum() + len(counts))
        loss = float(-np.log(prior[y]).mean()) if len(y) else 0.0
        return EvalResult(loss, int((y == label).sum()), len(y))
