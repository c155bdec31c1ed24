"""Per-class classifier gradients of a linear head in closed form (MuPFL's PKCF, mupfl.md Eqs. 16 and 19).

Both sides use them: a MuPFL client takes ``class_gradients`` of its features at the received head
and uploads them (``fedcore.methods.mupfl.GRADIENTS``: row k is the flattened (dW, db) of class k);
the server matches the ``synthetic_class_gradients`` of its federated features to their average
(``fedstrategies/mupfl_math.py``). ``synthetic_labels`` gives the class-major labels of those features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _gradients_of_blocks(h_blocks: torch.Tensor, r_blocks: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Row k = flattened (sum_j r_j h_j^T, sum_j r_j) / n_k over the samples j of class k, from
    class blocks h (K, w, d) and residuals r = softmax - onehot (K, w, K), zero-padded to width w."""
    K, _, d = h_blocks.shape
    scale = 1.0 / counts.clamp(min=1).to(h_blocks.dtype)
    grad_w = torch.bmm(r_blocks.transpose(1, 2), h_blocks) * scale[:, None, None]  # (K, K, d)
    grad_b = r_blocks.sum(1) * scale[:, None]  # (K, K)
    return torch.cat([grad_w.reshape(K, K * d), grad_b], dim=1)


def _residuals(features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               num_classes: int) -> torch.Tensor:
    """softmax(W h + b) - onehot(y): the CE gradient with respect to the logits."""
    return torch.softmax(features @ weight.T + bias, dim=1) - F.one_hot(labels, num_classes).to(features.dtype)


def class_gradients(features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean cross-entropy gradient of a linear head, in closed form (Eq. 16).

    For logits W h + b, grad_W CE(., k) = (softmax - onehot(k)) h^T and grad_b = softmax - onehot(k);
    z^k is their mean over the samples of class k. Samples are scattered into a (K, n_max, .) block
    by their rank within their class, so one batched matmul serves any label order.

    Returns
    -------
    Z : Tensor (K, K*d + K)
        Row k = flattened (dW, db) of z^k; zeros for classes without samples.
    present : Tensor (K,), bool
    """
    n, d = features.shape
    K = num_classes
    counts = torch.bincount(labels, minlength=K)
    present = counts > 0
    if n == 0:
        return features.new_zeros(K, K * d + K), present
    residual = _residuals(features, labels, weight, bias, K)
    order = torch.argsort(labels, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(labels)
    rank[order] = torch.arange(n, device=labels.device) - starts[labels[order]]
    width = int(counts.max())
    r_blocks = features.new_zeros(K, width, K).index_put((labels, rank), residual)
    h_blocks = features.new_zeros(K, width, d).index_put((labels, rank), features)
    return _gradients_of_blocks(h_blocks, r_blocks, counts), present


def synthetic_labels(num_classes: int, per_class: int, device=None) -> torch.Tensor:
    """Labels of the federated features: class-major, each class repeated ``per_class`` times."""
    return torch.arange(num_classes, device=device).repeat_interleave(per_class)


def synthetic_class_gradients(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """zhat of Eq. 19 for the class-major federated features H (K*m, d): ``class_gradients`` without
    the scatter (the rows already are the class blocks); differentiable in H, which the server's
    matching runs autograd through."""
    K = weight.shape[0]
    m, d = features.shape[0] // K, features.shape[1]
    residual = _residuals(features, synthetic_labels(K, m, features.device), weight, bias, K)
    counts = torch.full((K,), m, device=features.device)
    return _gradients_of_blocks(features.view(K, m, d), residual.view(K, m, K), counts)
