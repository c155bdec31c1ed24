"""Pure aggregation math on numpy arrays, shared by the weight-exchanging strategies."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def weighted_average(states: Sequence[dict[str, np.ndarray]], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """Sample-weighted mean of model states, tensor by tensor (FedAvg's rule).

    Integer tensors (BatchNorm's ``num_batches_tracked``) are counters, not parameters: they take
    the maximum instead of a mean.
    """
    if not states:
        raise ValueError("weighted_average needs at least one state")
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(states),) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be {len(states)} non-negative numbers with a positive sum, got {weights}")
    w = w / w.sum()
    out = {}
    for key, first in states[0].items():
        stack = np.stack([s[key] for s in states])
        if first.dtype.kind == "f":
            out[key] = np.tensordot(w, stack.astype(np.float64), axes=1).astype(first.dtype)
        else:
            out[key] = stack.max(axis=0)
    return out
