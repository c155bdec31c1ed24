"""FedMCSA client (Alg. 1 lines 7-19, Eq. 9): proximal local SGD towards the last personalised model.

State: the current model Theta_i (``model``) and the centre W_local (``centre``), the personalised
model last received. A client that receives W_i^t starts from it and makes it the new centre; one
that does not goes on from its own model with its old centre (the common initial model U^0 until it
first receives one). Each round it takes R mini-batch SGD steps (``local-steps``, batch
``batch-size``, lr ``lr``; every batch exactly |D| samples from epochs reshuffled end to end) on

    F(Theta) = f_i(Theta; batch) + lambda/2 ||Theta - W_local||^2,

i.e. Theta <- Theta - lr (grad f_i + lambda (Theta - W_local)). The centre is a detached copy held
fixed for the whole round: the authors' code aliases it to the trained weights, so that its
lambda has no effect; here lambda acts as the formula says (tests/test_fedmcsa.py checks it). The options
(lambda, the weight decay) are ``fedmcsa.variant``'s where left at "auto" (``resolve_options``).
"""

from __future__ import annotations

import torch

from clients.base import ClientMethod, EvalResult
from clients.training import LossFn, cross_entropy, evaluate_model, proximal_term
from fedcore import wire
from fedcore.methods.fedmcsa import RECEIVE, UPLOAD
from fedcore.methods.fedmcsa import resolve_options

MODEL = "model"
CENTRE = "centre"


def proximal_objective(lam: float, centre: list[torch.Tensor], data_loss: LossFn = cross_entropy) -> LossFn:
    """Eq. 9's local objective f_i + lambda/2 ||Theta - centre||^2 on a batch (centre fixed)."""
    def loss_fn(model, xb, yb):
        return data_loss(model, xb, yb) + 0.5 * lam * proximal_term(model, centre)

    return loss_fn


class FedMCSAClient(ClientMethod):
    def __init__(self, env):
        super().__init__(env)
        self.hp = resolve_options(self.cfg)

    def fit(self, content):
        config = self.env.config
        if config[RECEIVE]:
            model = self.model_from(content, wire.WEIGHTS)  # Theta_i = W_i^t
            self.save_model(model, CENTRE)  # W_local = W_i^t
            centre = model
        else:
            model, centre = self.load_model(MODEL), self.load_model(CENTRE)
        anchor = [p.detach().clone() for p in centre.parameters()]  # fixed for the round, never aliased
        # R steps (local-steps) of exactly |D| samples each; an epoch budget when local-steps is 0. Plain SGD at
        # the run config's weight decay, which already holds the variant's when left at "auto" (resolve_options)
        loss = self.train(model, loss_fn=proximal_objective(self.hp["lambda"], anchor),
                          full_batches=self.cfg["local-steps"] > 0)
        self.save_model(model, MODEL)
        records = {wire.WEIGHTS: wire.pack_arrays(model.state_dict())} if config[UPLOAD] else {}
        return records, {wire.TRAIN_LOSS: loss}

    def evaluate(self, content):
        return EvalResult(*evaluate_model(self.load_model(MODEL), self.data.x_test, self.data.y_test))
