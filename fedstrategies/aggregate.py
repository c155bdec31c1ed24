"""Pure aggregation math on numpy arrays, shared by the weight-exchanging strategies."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def weighted_average(states: Iterable[dict[str, np.ndarray]], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """Sample-weighted mean of model states, tensor by tensor (FedAvg's rule).

    Streams over the states: one float64 accumulator per tensor, never a stack of all clients, so
    memory stays at one model whatever the number of clients. Integer tensors (BatchNorm's
    ``num_batches_tracked``) are counters, not parameters: they take the maximum instead of a mean.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0 or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be non-negative numbers with a positive sum, got {list(weights)}")
    w = w / w.sum()
    acc: dict[str, np.ndarray] = {}
    dtypes: dict[str, np.dtype] = {}
    count = 0
    for state in states:
        if count >= len(w):
            raise ValueError(f"more states than the {len(w)} weights")
        wi = w[count]
        count += 1
        for key, value in state.items():
            if key not in acc:
                dtypes[key] = value.dtype
                acc[key] = np.zeros(value.shape, np.float64) if value.dtype.kind == "f" else np.array(value)
            if value.dtype.kind == "f":
                acc[key] += wi * value
            else:
                np.maximum(acc[key], value, out=acc[key])
    if count != len(w):
        raise ValueError(f"{count} states for {len(w)} weights")
    return {key: value.astype(dtypes[key], copy=False) for key, value in acc.items()}
