"""Shared training loops on in-memory tensors: mini-batches by index, no DataLoader, no per-sample loops."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
# after_step(step, loss, batch_indices): called after every optimiser step (step counts from 0)
StepCallback = Callable[[int, torch.Tensor, torch.Tensor], None]


def cross_entropy(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(xb), yb)


def minibatches(n: int, batch_size: int, generator: torch.Generator, device: torch.device) -> Iterator[torch.Tensor]:
    """Index tensors of one shuffled epoch (the last batch may be smaller)."""
    order = torch.randperm(n, generator=generator).to(device)
    yield from torch.split(order, batch_size)


def batch_stream(n: int, batch_size: int, generator: torch.Generator, device: torch.device) -> Iterator[torch.Tensor]:
    """Endless mini-batch indices: epoch after epoch, reshuffled each time (step budgets run across
    epoch boundaries, as FedMCSA's R steps and FedSaC's iterations do)."""
    while True:
        yield from minibatches(n, batch_size, generator, device)


def full_batch_stream(n: int, batch_size: int, generator: torch.Generator,
                      device: torch.device) -> Iterator[torch.Tensor]:
    """Endless mini-batch indices of exactly ``batch_size`` samples (all n when n is smaller): the
    reshuffled epochs are laid end to end and cut into equal batches; a batch may span two epochs,
    each of which is still one pass over the data (Alg. 1 of FedMCSA: "a fresh mini-batch with size |D|")."""
    size = min(batch_size, n)
    carry = torch.empty(0, dtype=torch.long, device=device)
    while True:
        order = torch.cat([carry, torch.randperm(n, generator=generator).to(device)])
        cut = len(order) - len(order) % size
        yield from torch.split(order[:cut], size)
        carry = order[cut:]


def crop_flip(x: torch.Tensor, generator: torch.Generator, pad: int = 4) -> torch.Tensor:
    """A batch of images (B, C, H, W), each randomly cropped back to H x W from its zero-padded copy and
    flipped left-right with probability 1/2: torchvision's RandomCrop(padding=pad) + RandomHorizontalFlip
    for a whole batch at once (the offsets come from ``generator``, on the CPU, so runs repeat).

    The images are already normalised, so the padding is the data's 0 (the mean colour of a normalised
    set) rather than black."""
    b, _, h, w = x.shape
    offsets = torch.randint(0, 2 * pad + 1, (2, b), generator=generator).to(x.device)
    flip = (torch.rand(b, generator=generator) < 0.5).to(x.device)
    padded = F.pad(x, (pad, pad, pad, pad))
    rows = (offsets[0, :, None] + torch.arange(h, device=x.device))[:, :, None]  # (B, H, 1)
    cols = offsets[1, :, None] + torch.arange(w, device=x.device)  # (B, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols)[:, None, :]  # (B, 1, W)
    batch = torch.arange(b, device=x.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)  # (B, H, W, C) -> (B, C, H, W)


def fast_sgd(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` is a ``torch.optim.SGD`` whose step ``_sgd_step`` takes exactly (weight decay and heavy-ball
    momentum allowed; no nesterov, dampening, maximize, differentiable or fused step, no hooks). ``train_loop``
    takes such a step with foreach ops: torch.optim's per-step wrapper (profiler ranges, grad mode, hooks), its
    per-tensor loop and zero_grad cost a third of a step of a small model at batch 10 (cProfile, FedFCD's MLP on
    Fashion-MNIST) and half of one of the Synthetic DNN at batch 20 with weight decay."""
    if type(opt) is not torch.optim.SGD or opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks:
        return False
    for group in opt.param_groups:
        if group["nesterov"] or group["dampening"] or group["maximize"] or group.get("differentiable") \
                or group.get("fused") or not isinstance(group["lr"], float):
            return False
    return True


@torch.no_grad()
def _sgd_step(opt: torch.optim.SGD) -> None:
    """torch.optim.SGD's step for every parameter with a gradient, op for op: g = grad + weight_decay * p; with
    momentum, buf = g on the first step, else buf = momentum * buf + g (kept in ``opt.state`` as torch keeps it),
    and g = buf; then p -= lr * g and the gradient is dropped (zero_grad(set_to_none))."""
    for group in opt.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            continue
        grads = [p.grad for p in params]
        if group["weight_decay"]:
            grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
        if group["momentum"]:
            bufs = []
            for p, g in zip(params, grads):
                buf = opt.state[p].get("momentum_buffer")
                if buf is None:
                    buf = opt.state[p]["momentum_buffer"] = torch.clone(g).detach()
                else:
                    buf.mul_(group["momentum"]).add_(g)
                bufs.append(buf)
            grads = bufs
        torch._foreach_add_(params, grads, alpha=-group["lr"])
        for p in params:
            p.grad = None


def steps_per_epoch(n: int, batch_size: int) -> int:
    return math.ceil(n / batch_size)


def train_loop(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
    generator: torch.Generator,
    epochs: int | None = None,
    steps: int | None = None,
    loss_fn: LossFn = cross_entropy,
    after_step: StepCallback | None = None,
    full_batches: bool = False,
    augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
    proximal: tuple[Sequence[torch.Tensor], float] | None = None,
) -> float:
    """Mini-batch SGD for ``epochs`` epochs or for exactly ``steps`` steps; returns the mean loss.

    Exactly one budget is given. ``epochs`` runs ``epochs * ceil(n / batch_size)`` steps, one
    shuffled pass per epoch; ``steps`` takes that many batches from the same reshuffled stream.
    Several optimisers (disjoint parameter groups) all step on the same loss. ``after_step`` runs
    after each step with the step index, the batch loss and the batch indices (pFedPM's relation
    step, MuPFL's activation-map update). ``full_batches`` (step budgets only) makes every batch
    exactly ``batch_size`` samples (``full_batch_stream``) instead of a short last batch per epoch.
    ``augment`` transforms each batch of inputs before the loss (``crop_flip``). ``proximal = (anchor, c)`` adds
    c * ||w - anchor||^2 over ``model``'s parameters to every batch's loss (``add_proximal_pull`` on them).
    """
    if (epochs is None) == (steps is None):
        raise ValueError("give exactly one of epochs= and steps=")
    n = len(y)
    if n == 0:
        return 0.0
    total_steps = steps if steps is not None else epochs * steps_per_epoch(n, batch_size)
    optimizers = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
    model.train()
    total = torch.zeros((), device=x.device)
    if full_batches and steps is None:
        raise ValueError("full_batches needs a step budget (steps=)")
    batches = (full_batch_stream if full_batches else batch_stream)(n, batch_size, generator, x.device)
    fast = [fast_sgd(opt) for opt in optimizers]
    pulled = list(model.parameters()) if proximal is not None else []  # once, not on every step
    # _sgd_step drops the gradients it used, so a fast optimiser needs zero_grad only before the first step, or after
    # an after_step that may have left gradients of its own (zero_grad's profiler range is a tenth of a small step)
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    zeroed = [opt for opt, own in zip(optimizers, fast) if not own or after_step is not None]
    for step in range(total_steps):
        idx = next(batches)
        if step:
            for opt in zeroed:
                opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, x[idx] if augment is None else augment(x[idx]), y[idx])
        loss.backward()
        if proximal is not None:
            loss = add_proximal_pull(pulled, *proximal, loss)
        for opt, own in zip(optimizers, fast):
            if own:
                _sgd_step(opt)
            else:
                opt.step()
        total += loss.detach()
        if after_step is not None:
            after_step(step, loss.detach(), idx)
    return float(total) / max(total_steps, 1)


@torch.no_grad()
def evaluate_model(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 2048) -> tuple[float, int, int]:
    """(mean cross-entropy, correct predictions, samples) of a classifier on (x, y)."""
    return evaluate_logits(model.eval(), x, y, batch_size)


@torch.no_grad()
def evaluate_logits(logits_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                    batch_size: int = 2048) -> tuple[float, int, int]:
    """(mean cross-entropy, correct, samples) of any function from inputs to logits (a fused head)."""
    loss, correct = 0.0, 0
    for start in range(0, len(y), batch_size):
        logits = logits_fn(x[start:start + batch_size])
        yb = y[start:start + batch_size]
        loss += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    return loss / max(len(y), 1), correct, len(y)


@torch.no_grad()
def evaluate_features(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                      batch_size: int = 2048) -> tuple[float, int, int, torch.Tensor]:
    """``evaluate_model`` and the body's features of ``x`` from one pass through the body, for methods
    that also classify by features (FedProto's nearest prototype, pFedPM's relation module). The
    logits are the model's own decision module on those features (``classify`` where the model has
    dropout before its head, inactive here), so loss and accuracy equal ``evaluate_model``'s."""
    model.eval()
    feats = extract_features(model, x, batch_size)
    loss, correct, n = evaluate_logits(getattr(model, "classify", model.head), feats, y, batch_size)
    return loss, correct, n, feats


@torch.no_grad()
def extract_features(model: nn.Module, x: torch.Tensor, batch_size: int = 2048) -> torch.Tensor:
    """Body outputs for all of x, in eval mode."""
    model.eval()
    return torch.cat([model.features(x[s:s + batch_size]) for s in range(0, len(x), batch_size)])


def class_means(features: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-class mean feature of the classes present: (class ids, means (K, d), counts (K,))."""
    counts = torch.bincount(y, minlength=num_classes)
    sums = torch.zeros(num_classes, features.shape[1], dtype=features.dtype, device=features.device)
    sums.index_add_(0, y, features)
    present = counts > 0
    ids = present.nonzero().flatten()
    return ids, sums[present] / counts[present].unsqueeze(1).to(features.dtype), counts[present]


def proximal_term(model: nn.Module, anchor: list[torch.Tensor]) -> torch.Tensor:
    """||w - anchor||^2 over all parameters (FedProx's and Ditto's regulariser)."""
    return sum((p - a).pow(2).sum() for p, a in zip(model.parameters(), anchor))


@torch.no_grad()
def add_proximal_pull(params: list[torch.Tensor], anchor: Sequence[torch.Tensor], coef: float,
                      loss: torch.Tensor) -> torch.Tensor:
    """After ``loss.backward()``: add the gradient of ``coef * ||params - anchor||^2`` (2 coef (w - anchor)) to each
    parameter's and return ``loss + coef * proximal_term``, without the term in the autograd graph. The numbers are
    autograd's bit for bit (it computes coef * (2 (w - a)), which rounds as 2 coef * (w - a); each gradient is
    then the same single sum); a FedProx round of FedFCD's Fashion-MNIST MLP at batch 10 takes a quarter less time."""
    diffs = torch._foreach_sub(params, list(anchor))
    value = sum(d.pow(2).sum() for d in diffs)
    for p, pull in zip(params, torch._foreach_mul(diffs, 2.0 * coef)):
        if p.grad is None:
            p.grad = pull
        else:
            p.grad.add_(pull)
    return loss.detach() + coef * value
