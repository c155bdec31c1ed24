"""MuPFL's BAVD rule (client only; mupfl.md section 3, Eq. 6) as plain functions on tensors: the
loss-weighted activation map of one layer and the mask it gives. ``clients/mupfl.py`` applies them
to a model through forward hooks (its ``BAVD`` class) and keeps the maps in client state.
"""

from __future__ import annotations

import torch


def bavd_mask(activation_map: torch.Tensor) -> torch.Tensor:
    """Positions of one BAVD layer that are kept: normalised map >= its mean (mupfl.md 3.3a, A2).

    Min-max normalisation, as the spec proposes; the mask is the same for any positive affine
    rescaling of the map (normalisation type is irrelevant), and the map's maximum is always kept.
    An all-zero or constant map (before the first update) keeps every position: BAVD is then the
    identity.

    Parameters
    ----------
    activation_map : Tensor (H, W)

    Returns
    -------
    Tensor (H, W), bool
    """
    lo, hi = activation_map.min(), activation_map.max()
    if not bool(hi > lo):
        return torch.ones_like(activation_map, dtype=torch.bool)
    norm = (activation_map - lo) / (hi - lo)
    return norm >= norm.mean()


def loss_change(previous_loss: float, loss: float, sign: str = "decrease") -> float:
    """psi of Eq. 6: the loss decrease l^(lambda-1) - l^(lambda) by default (the text: a positive
    psi "signifies contribution"); ``sign="literal"`` gives Eq. 6 as printed, l^(lambda) - l^(lambda-1)
    (mupfl.md A1)."""
    if sign == "decrease":
        return previous_loss - loss
    if sign == "literal":
        return loss - previous_loss
    raise ValueError(f"psi sign must be 'decrease' or 'literal', got {sign!r}")


def update_map(activation_map: torch.Tensor, batch_mean: torch.Tensor, step: int, psi: float) -> torch.Tensor:
    """Eq. 6 with one H x W map per layer: M <- r at the very first step (lambda = 0), else
    M <- M + psi * r, where r is the batch's pre-mask activation averaged over batch and channels."""
    if step == 0:
        return batch_mean.detach().clone()
    return activation_map + psi * batch_mean.detach()
