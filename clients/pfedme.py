"""pFedMe client: R local rounds, each an approximate personal solve and a step of the local model.

For each mini-batch D (Dinh et al. 2020, Algorithm 1, lines 5-7):
    theta <- theta - personal_lr * (grad f(theta; D) + lambda * (theta - w))      K times, same D
    w     <- w - eta * lambda * (w - theta)
theta approximates argmin_theta f(theta; D) + lambda/2 ||theta - w||^2, the Moreau envelope's proximal
point; it starts at the received global model and is warm-started across the R rounds. The local model w
goes back to the server when the client is in the round's set S (the ``UPLOAD`` flag); theta is the
client's personalised model, kept for evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from clients.base import ClientMethod, EvalResult
from clients.per_fedavg import GradFn, gradient_fn, set_values
from clients.training import batch_stream, evaluate_model, steps_per_epoch
from fedcore import wire
from fedcore.methods.pfedme import UPLOAD

PERSONAL = "personal"  # client state: theta_i after the last round it trained in


def personal_solve(theta: Sequence[torch.Tensor], w: Sequence[torch.Tensor], grad_at: GradFn, batch, lam: float,
                   lr: float, k: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """K gradient steps on f(theta; batch) + lam/2 ||theta - w||^2 from ``theta``; returns theta and the
    data loss at its last step."""
    theta = list(theta)
    loss = torch.zeros((), device=theta[0].device if theta else None)
    for _ in range(k):
        g, loss = grad_at(theta, batch)
        theta = [t - lr * (gi + lam * (t - wi)) for t, gi, wi in zip(theta, g, w)]
    return theta, loss


def local_step(w: Sequence[torch.Tensor], theta: Sequence[torch.Tensor], lam: float, eta: float) -> list[torch.Tensor]:
    """w - eta * lam * (w - theta): a gradient step on the Moreau envelope, whose gradient is lam (w - theta)."""
    return [wi - eta * lam * (wi - t) for wi, t in zip(w, theta)]


class PFedMeClient(ClientMethod):
    def local_rounds(self) -> int:
        """R: ``local-steps`` if set, else one per batch of ``local-epochs`` passes."""
        if self.cfg["local-steps"] > 0:
            return self.cfg["local-steps"]
        return self.cfg["local-epochs"] * steps_per_epoch(self.data.num_train, self.cfg["batch-size"])

    def fit(self, content):
        model = self.model_from(content, wire.WEIGHTS)
        if self.data.num_train == 0:
            records = {wire.WEIGHTS: wire.pack_arrays(model.state_dict())} if self.env.config[UPLOAD] else {}
            return records, {wire.TRAIN_LOSS: 0.0}
        grad_at = gradient_fn(model, self.data.x_train, self.data.y_train)
        batches = batch_stream(self.data.num_train, self.cfg["batch-size"], self.env.generator(), self.env.device)
        lam, rounds = self.hp["lambda"], self.local_rounds()
        w = [p.detach().clone() for p in model.parameters()]
        theta = list(w)
        total = 0.0
        for _ in range(rounds):
            theta, loss = personal_solve(theta, w, grad_at, next(batches), lam, self.hp["personal-lr"], self.hp["k"])
            w = local_step(w, theta, lam, self.env.lr)
            total += float(loss)
        set_values(model, theta)
        self.save_model(model, PERSONAL)  # theta with the model's buffers
        set_values(model, w)
        records = {wire.WEIGHTS: wire.pack_arrays(model.state_dict())} if self.env.config[UPLOAD] else {}
        return records, {wire.TRAIN_LOSS: total / rounds}

    def evaluate(self, content):
        model = self.model_from(content, wire.WEIGHTS)  # the global model
        if self.hp["evaluate"] == "personal":
            self.env.load_module(PERSONAL, model)  # theta_i once the client has trained
        return EvalResult(*evaluate_model(model, self.data.x_test, self.data.y_test))
