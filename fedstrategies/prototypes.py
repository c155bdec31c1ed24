"""Pure math on class-mean features ("prototypes"), shared by FedProto, pFedPM and FedFCD."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def aggregate_class_features(
    class_ids: Sequence[np.ndarray],
    features: Sequence[np.ndarray],
    counts: Sequence[np.ndarray],
    num_classes: int,
    mode: str = "weighted",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class mean of the clients' class-mean features, in one vectorised pass.

    ``weighted``: sum_i n_ij / N_j * C_i^(j) (weights sum to 1 per class);
    ``uniform``: the plain mean over the clients that hold class j (FedProto's and PFLlib's code).
    Returns (class ids present, (K, d) global features, (K,) total counts).
    """
    if mode not in ("weighted", "uniform"):
        raise ValueError(f"mode must be 'weighted' or 'uniform', got {mode!r}")
    ids = np.concatenate([np.asarray(c, dtype=np.int64) for c in class_ids])
    feats = np.concatenate([np.asarray(f, dtype=np.float64) for f in features])
    n = np.concatenate([np.asarray(c, dtype=np.float64) for c in counts])
    if len(ids) == 0:
        return ids, np.zeros((0, feats.shape[1] if feats.ndim == 2 else 0), np.float32), ids.copy()
    w = n if mode == "weighted" else np.ones_like(n)
    sums = np.zeros((num_classes, feats.shape[1]))
    np.add.at(sums, ids, feats * w[:, None])
    weight_sums = np.bincount(ids, weights=w, minlength=num_classes)
    total = np.bincount(ids, weights=n, minlength=num_classes)
    present = np.flatnonzero(weight_sums > 0)
    means = sums[present] / weight_sums[present, None]
    return present, means.astype(np.float32), total[present].astype(np.int64)
