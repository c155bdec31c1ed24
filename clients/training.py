"""Shared training loops on in-memory tensors: mini-batches by index, no DataLoader, no per-sample loops."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(xb), yb)


def minibatches(n: int, batch_size: int, generator: torch.Generator, device: torch.device) -> Iterator[torch.Tensor]:
    """Index tensors of one shuffled epoch (the last batch may be smaller)."""
    order = torch.randperm(n, generator=generator).to(device)
    yield from torch.split(order, batch_size)


def train_epochs(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    loss_fn: LossFn = cross_entropy,
) -> float:
    """Plain mini-batch SGD for ``epochs`` epochs; returns the mean training loss over all steps."""
    model.train()
    total, steps = torch.zeros((), device=x.device), 0
    for _ in range(epochs):
        for idx in minibatches(len(y), batch_size, generator, x.device):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model, x[idx], y[idx])
            loss.backward()
            optimizer.step()
            total += loss.detach()
            steps += 1
    return float(total) / max(steps, 1)


@torch.no_grad()
def evaluate_model(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 2048) -> tuple[float, int, int]:
    """(mean cross-entropy, correct predictions, samples) of a classifier on (x, y)."""
    model.eval()
    loss, correct = 0.0, 0
    for start in range(0, len(y), batch_size):
        logits = model(x[start:start + batch_size])
        yb = y[start:start + batch_size]
        loss += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    return loss / max(len(y), 1), correct, len(y)


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
