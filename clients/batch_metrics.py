"""Per-batch numbers a client reports as one metric (FedRoD's and GPFL's loss terms)."""

from __future__ import annotations

import torch


def mean_loss(values: list[torch.Tensor]) -> float:
    """Mean of per-batch losses; 0 for a client that took no step (no training data)."""
    return float(sum(values)) / max(len(values), 1)
