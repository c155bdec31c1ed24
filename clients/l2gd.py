"""L2GD client: apply the round's averaging steps to its own model x_i, then its local gradient steps.

m averaging steps x_i <- x_i - pull (x_i - x_bar) with x_bar fixed contract x_i - x_bar by (1 - pull)^m, so
they are applied in one go; then k plain gradient steps at the run's lr (fedstrategies/l2gd.py). x_i is
the client's personalised model: kept in its state, sent up, and scored.
"""

from __future__ import annotations

import torch

from clients.base import ClientMethod, EvalResult
from clients.training import evaluate_model
from fedcore import wire
from fedcore.methods.l2gd import AVERAGING_STEPS, LOCAL_STEPS, PULL

LOCAL = "local"  # client state: x_i


def pull_towards(model: torch.nn.Module, mean: torch.nn.Module, pull: float, steps: int) -> None:
    """``steps`` averaging steps at once: x_i <- x_bar + (1 - pull)^steps (x_i - x_bar), float tensors only."""
    keep = (1.0 - pull) ** steps
    target = mean.state_dict()
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if value.dtype.is_floating_point:
                value.copy_(target[key] + keep * (value - target[key]))


class L2GDClient(ClientMethod):
    def own_model(self, mean: torch.nn.Module) -> torch.nn.Module:
        """x_i from the client's state; x_bar itself before its first round (every x_i starts at x_0)."""
        model = self.new_model()
        if not self.env.load_module(LOCAL, model):
            model.load_state_dict(mean.state_dict())
        return model

    def fit(self, content):
        mean = self.model_from(content, wire.WEIGHTS)
        model = self.own_model(mean)
        config = self.env.config
        pull_towards(model, mean, float(config[PULL]), int(config[AVERAGING_STEPS]))
        loss = self.train(model, steps=int(config[LOCAL_STEPS]))
        self.save_model(model, LOCAL)
        return {wire.WEIGHTS: wire.pack_arrays(model.state_dict())}, {wire.TRAIN_LOSS: loss}

    def evaluate(self, content):
        return EvalResult(*evaluate_model(self.load_model(LOCAL), self.data.x_test, self.data.y_test))
