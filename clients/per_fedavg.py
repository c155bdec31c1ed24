"""Per-FedAvg client: meta-steps on the MAML objective, evaluation after one adaptation step.

One meta-step at w (Fallah et al. 2020, Eq. 8-10) on three independent batches D, D', D'':
    w~    = w - alpha * grad f(w; D)
    w_new = w - beta * (I - alpha * H(w; D'')) grad f(w~; D')
'fo' drops the Hessian H; 'hf' replaces H(w; D'') g by (grad f(w + delta g; D'') - grad f(w - delta g; D''))
/ (2 delta) with g = grad f(w~; D'). beta is the run's (message's) learning rate.

The two gradients of the finite difference are taken under the same draw of the random generators
(``hessian_vector``): on a model with dropout they would otherwise see two different masks, and the
difference of two masks' gradients, divided by 2 delta, swamps H g (about 500 times its size at delta
= 0.001). The adaptation before evaluation (``adapted``) leaves the BatchNorm statistics as received.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call

from clients.base import ClientMethod, EvalResult
from clients.training import batch_stream, evaluate_model, steps_per_epoch
from fedcore import wire

Tensors = list[torch.Tensor]
# grad_at(values, batch) -> (gradient of the batch loss at the parameter values, that loss)
GradFn = Callable[[Sequence[torch.Tensor], torch.Tensor], tuple[Tensors, torch.Tensor]]
ADAPT_TAG = 5  # the shuffle stream of the evaluation's adaptation batch


def gradient_fn(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> GradFn:
    """Cross-entropy gradients of ``model`` at any parameter values, on a batch of (x, y) by index,
    without touching the model's own parameters."""
    names = [name for name, _ in model.named_parameters()]
    model.train()

    def grad_at(values, idx):
        params = {n: v.detach().requires_grad_(True) for n, v in zip(names, values)}
        loss = F.cross_entropy(functional_call(model, params, (x[idx],)), y[idx])
        return list(torch.autograd.grad(loss, list(params.values()))), loss.detach()

    return grad_at


def _rng_state(device: torch.device) -> tuple:
    """The generators a forward pass may draw from on ``device`` (dropout masks): the CPU one, and CUDA's."""
    return (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(device: torch.device, state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def hessian_vector(grad_at: GradFn, w: Sequence[torch.Tensor], v: Sequence[torch.Tensor], batch,
                   delta: float) -> Tensors:
    """H(w; batch) v ~ (grad f(w + delta v) - grad f(w - delta v)) / (2 delta), both gradients under the
    same random draws (one dropout mask): the Hessian of the loss with that mask, not mask noise."""
    state = _rng_state(w[0].device)
    plus, _ = grad_at([wi + delta * vi for wi, vi in zip(w, v)], batch)
    _set_rng_state(w[0].device, state)
    minus, _ = grad_at([wi - delta * vi for wi, vi in zip(w, v)], batch)
    return [(gp - gm) / (2 * delta) for gp, gm in zip(plus, minus)]


def meta_step(w: Sequence[torch.Tensor], grad_at: GradFn, batches: Sequence, alpha: float, beta: float,
              variant: str, delta: float) -> tuple[Tensors, torch.Tensor]:
    """One Per-FedAvg meta-step from ``w`` on ``batches`` = (D, D', D''); returns the new values and the
    loss at w~ on D' (the meta-objective's batch loss)."""
    g, _ = grad_at(w, batches[0])
    w_tilde = [wi - alpha * gi for wi, gi in zip(w, g)]
    g_out, loss = grad_at(w_tilde, batches[1])
    if variant == "hf":
        hv = hessian_vector(grad_at, w, g_out, batches[2], delta)
        g_out = [go - alpha * h for go, h in zip(g_out, hv)]
    elif variant != "fo":
        raise ValueError(f"unknown Per-FedAvg variant {variant!r}")
    return [wi - beta * gi for wi, gi in zip(w, g_out)], loss


def set_values(model: torch.nn.Module, values: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, v in zip(model.parameters(), values):
            p.copy_(v)


class PerFedAvgClient(ClientMethod):
    def meta_steps(self) -> int:
        """tau: ``local-steps`` meta-steps if set, else one per batch of ``local-epochs`` passes."""
        if self.cfg["local-steps"] > 0:
            return self.cfg["local-steps"]
        return self.cfg["local-epochs"] * steps_per_epoch(self.data.num_train, self.cfg["batch-size"])

    def fit(self, content):
        model = self.model_from(content, wire.WEIGHTS)
        n = self.data.num_train
        if n == 0:
            return {wire.WEIGHTS: wire.pack_arrays(model.state_dict())}, {wire.TRAIN_LOSS: 0.0}
        grad_at = gradient_fn(model, self.data.x_train, self.data.y_train)
        batches = batch_stream(n, self.cfg["batch-size"], self.env.generator(), self.env.device)
        per_step = 3 if self.hp["variant"] == "hf" else 2
        w = [p.detach().clone() for p in model.parameters()]
        total, steps = 0.0, self.meta_steps()
        for _ in range(steps):
            w, loss = meta_step(w, grad_at, [next(batches) for _ in range(per_step)], self.hp["alpha"],
                                self.env.lr, self.hp["variant"], self.hp["delta"])
            total += float(loss)
        set_values(model, w)
        return {wire.WEIGHTS: wire.pack_arrays(model.state_dict())}, {wire.TRAIN_LOSS: total / steps}

    def adapted(self, content) -> torch.nn.Module:
        """The personalised model: the received global model after one gradient step of size alpha on
        one training batch (the evaluation of the paper). The step's forward pass runs in training mode,
        as the meta-steps' do; the BatchNorm statistics it would fold in are put back as received, so the
        evaluation does not absorb one training batch's statistics."""
        model = self.model_from(content, wire.WEIGHTS)
        if self.data.num_train == 0:
            return model
        idx = next(batch_stream(self.data.num_train, self.cfg["batch-size"], self.env.generator(ADAPT_TAG),
                                self.env.device))
        buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
        w = [p.detach() for p in model.parameters()]
        g, _ = gradient_fn(model, self.data.x_train, self.data.y_train)(w, idx)
        set_values(model, [wi - self.hp["alpha"] * gi for wi, gi in zip(w, g)])
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        return model

    def evaluate(self, content):
        return EvalResult(*evaluate_model(self.adapted(content), self.data.x_test, self.data.y_test))
