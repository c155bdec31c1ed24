"""What the declarations' ``example_reply`` functions share: realistic replies for the server benchmark
(``benchmarks/server_time.py``) and the fuzz and reliability tests, for methods whose reply schema alone makes no
valid reply. Numpy only; no strategy or client imports it."""

from __future__ import annotations

import numpy as np


def noisy_weights(weights: dict[str, np.ndarray], rng) -> dict[str, np.ndarray]:
    """``weights`` plus N(0, 0.01^2) noise on every float array (integer buffers unchanged), so that similarities
    and norms on the server are realistic."""
    return {k: (v + 0.01 * rng.standard_normal(v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v
            for k, v in weights.items()}


def present_class_gradients(strategy, pid: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Random class gradients ``z`` (K, K*d + K) with zero rows for the classes client ``pid`` lacks, and the
    0/1 ``present`` flags (the MuPFL/CReFF ``GRADIENTS`` record)."""
    K, d = strategy.num_classes, strategy.model.feature_dim
    present = (strategy.clients[pid].train_label_counts > 0).astype(np.float32)
    z = rng.standard_normal((K, K * d + K)).astype(np.float32) * present[:, None]
    return z, present
