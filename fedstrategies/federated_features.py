"""Federated features by gradient matching: the one rule CReFF (Shang et al., IJCAI 2022) and MuPFL's PKCF
(mupfl.md section 4) share, on the server.

Clients upload per-class classifier gradients of their real features (``fedcore/class_gradients.py``); the
server averages them per class over the clients that report the class, and moves synthetic features H
(K*m x d, class-major) so that their own per-class classifier gradients point the same way.

The distance is CReFF's (its code's ``distance_wb``, "ours"): for each class, 1 - cos per output row of the
weight gradient plus 1 - cos of the bias gradient, K + 1 cosines a class. The optimiser steps on the sum over the
reported classes (CReFF's scale, which its SGD step size assumes); ``match-loss`` reports the mean, in [0, 2].
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedcore.class_gradients import synthetic_class_gradients

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8
COS_EPS = 1e-6  # CReFF's guard against a zero gradient row


def average_class_gradients(replies) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 17 (CReFF's aggregation): z_glo^k = mean of z_i^k over the clients that report class k (S^k), never
    over the others. ``replies`` yields (Z_i (K, G), present_i (K,)) pairs; they are summed one at a time (no
    stack of all clients). Returns (z_glo (K, G), reported (K,) bool)."""
    total, counts = None, None
    for z, present in replies:
        present = np.asarray(present, dtype=np.float64)
        if total is None:
            total, counts = np.zeros(np.shape(z)), np.zeros(len(present))
        total += present[:, None] * z
        counts += present
    if total is None:
        raise ValueError("no class gradients to average")
    z = np.divide(total, counts[:, None], out=np.zeros_like(total), where=counts[:, None] > 0)
    return z, counts > 0


def row_cosines(target: torch.Tensor, synthetic: torch.Tensor) -> torch.Tensor:
    """(K, K + 1) cosines of class gradients laid out as (K, K*d + K) rows: column j < K is the cosine of the
    weight gradient's output row j, column K that of the bias gradient."""
    K = target.shape[0]
    d = (target.shape[1] - K) // K
    weight = F.cosine_similarity(target[:, :K * d].reshape(K, K, d), synthetic[:, :K * d].reshape(K, K, d),
                                 dim=2, eps=COS_EPS)
    bias = F.cosine_similarity(target[:, K * d:], synthetic[:, K * d:], dim=1, eps=COS_EPS)
    return torch.cat([weight, bias[:, None]], dim=1)


def matching_distance(target: torch.Tensor, synthetic: torch.Tensor, reported: torch.Tensor) -> torch.Tensor:
    """Eq. 20 / CReFF's loss: sum over the reported classes k and the K + 1 cosines of 1 - cos(z_glo^k, zhat^k).
    Zero when no class is reported."""
    if not bool(reported.any()):
        return synthetic.sum() * 0.0
    return (1.0 - row_cosines(target, synthetic)[reported]).sum()


def mean_distance(target: torch.Tensor, synthetic: torch.Tensor, reported: torch.Tensor) -> float:
    """``matching_distance`` per cosine, the reported ``match-loss`` (in [0, 2]; 0 when nothing is reported)."""
    count = int(reported.sum()) * (target.shape[0] + 1)
    return float(matching_distance(target, synthetic, reported)) / count if count else 0.0


def match_features(features: torch.Tensor, target: torch.Tensor, reported: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor, steps: int, lr: float, optimizer: str = "adam") -> tuple[float, float]:
    """Move H (``features``, in place) for ``steps`` steps on ``matching_distance`` at the classifier (weight,
    bias) the clients' gradients were taken at. Returns the mean distance before and after.

    ``optimizer="sgd"``: CReFF's plain SGD (h <- h - lr * grad; it keeps no state). ``"adam"``: Adam, started
    afresh at every call: its step does not depend on the gradient's scale, which shrinks as d grows (at d = 3136
    SGD at CReFF's 0.1 moves the loss from 0.92 to 0.90 in 100 steps). Both are written out: a torch optimiser's
    first construction imports torch's compiler (seconds on a busy server). Each Adam step runs the element-wise
    operations of ``h -= lr * (m1 / (1 - b1^t)) / (sqrt(m2 / (1 - b2^t)) + eps)`` in the same order, in place, in
    one buffer allocated once and in the step's spent gradient: H is K*m x d (12.5 MB for the paper's CNN at
    m = 100), and a fresh tensor per operation cost more than the loss and its gradient. A test checks that the
    result is the same bit for bit.
    """
    weight, bias = weight.detach(), bias.detach()

    def loss_of(h):
        return matching_distance(target, synthetic_class_gradients(h, weight, bias), reported)

    def mean_of(h):
        return mean_distance(target, synthetic_class_gradients(h, weight, bias), reported)

    with torch.no_grad():
        before = mean_of(features)
    if steps == 0 or features.numel() == 0 or not bool(reported.any()):
        return before, before
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    h = features.detach().clone().requires_grad_(True)
    if optimizer == "adam":
        m1, m2, denom = torch.zeros_like(h), torch.zeros_like(h), torch.empty_like(h)
    (b1, b2) = ADAM_BETAS
    for t in range(1, steps + 1):
        (grad,) = torch.autograd.grad(loss_of(h), h)
        with torch.no_grad():
            if optimizer == "sgd":
                h -= grad.mul_(lr)  # h - lr * grad (grad is this step's own tensor)
                continue
            m1.mul_(b1).add_(grad, alpha=1 - b1)
            m2.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            torch.div(m2, 1 - b2 ** t, out=denom).sqrt_().add_(ADAM_EPS)
            h -= torch.div(m1, 1 - b1 ** t, out=grad).mul_(lr).div_(denom)  # grad is spent: its buffer takes the step
    with torch.no_grad():
        features.copy_(h)
        after = mean_of(features)
    return before, after


def fresh_linear(d: int, num_classes: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A newly initialised linear classifier, as ``torch.nn.Linear``'s default: weight and bias ~ U(-1/sqrt(d),
    1/sqrt(d)), drawn from ``generator``."""
    bound = 1.0 / d ** 0.5
    weight = (torch.rand((num_classes, d), generator=generator) * 2 - 1) * bound
    bias = (torch.rand((num_classes,), generator=generator) * 2 - 1) * bound
    return weight, bias


def retrain_classifier(features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                       epochs: int, lr: float, batch_size: int, generator: torch.Generator
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """CReFF's classifier re-training: ``epochs`` epochs of mini-batch SGD (reshuffled each epoch) on the mean
    cross-entropy of the linear classifier (weight, bias) over (features, labels); returns the new classifier."""
    weight, bias = weight.detach().clone().requires_grad_(True), bias.detach().clone().requires_grad_(True)
    features = features.detach()
    for _ in range(epochs):
        for batch in torch.randperm(len(labels), generator=generator).split(batch_size):
            loss = F.cross_entropy(features[batch] @ weight.T + bias, labels[batch])
            grad_w, grad_b = torch.autograd.grad(loss, (weight, bias))
            with torch.no_grad():
                weight -= lr * grad_w
                bias -= lr * grad_b
    return weight.detach(), bias.detach()
