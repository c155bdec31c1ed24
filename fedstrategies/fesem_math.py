"""FeSEM's stochastic EM over client models (Long et al., "Multi-center federated learning: clients
clustering for better personalization", World Wide Web 2023) as plain functions on numpy arrays.

The objective is sum_i sum_k r_ik Dist(w_i, w~_k) with one-hot assignments r and K centres w~,
Dist the squared L2 distance of the flattened parameters. Each round runs on the models the
clients uploaded:

- E-step (``assign``): r_i = argmin_k ||w_i - w~_k||^2 (ties to the lower k);
- M-step (``centre_weights``, then each centre's weighted mean): w~_k = sum_{i: r_i = k} p_i w_i / sum p_i, the mean
  of the members (p_i = 1, the paper; or |D_i|); a centre without members keeps its value.
"""

from __future__ import annotations

import numpy as np


def assign(sq_dist: np.ndarray) -> np.ndarray:
    """E-step: the nearest centre of every model (rows: models, columns: centres)."""
    return np.argmin(np.asarray(sq_dist), axis=1)


def centre_weights(labels: np.ndarray, k: int, p: np.ndarray | None = None) -> np.ndarray:
    """M-step as a (k, n) matrix: row k holds p_i / sum_{members} p_j for the members of centre k, else 0
    (an all-zero row: centre k has no member this round)."""
    labels = np.asarray(labels)
    p = np.ones(len(labels)) if p is None else np.asarray(p)
    r = (labels[None, :] == np.arange(k)[:, None]) * p[None, :]
    total = r.sum(axis=1, keepdims=True)
    return r / np.where(total > 0, total, 1)  # an empty centre's row stays 0


def initial_centres(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Forgy initialisation: k distinct models, drawn uniformly, become the first centres."""
    return np.sort(rng.choice(n, size=k, replace=False))
