"""FedAMP's attentive message passing (Huang et al., AAAI 2021) as plain functions on numpy arrays.

Round k, over the models w_1..w_m of the round's clients (the server's latest copy of each):

- FedAMP (Eqs. 4-5 with A(x) = 1 - exp(-x / sigma)): xi_ij = alpha_k A'(||w_i - w_j||^2)
  = alpha_k exp(-||w_i - w_j||^2 / sigma) / sigma for j != i, and the self-weight
  xi_ii = 1 - sum_{j != i} xi_ij. Closer models get more weight; xi_ii is negative (the cloud model
  extrapolates away from the others) when alpha_k (m - 1) / sigma > 1 and the models are close.
- HeurFedAMP (the heuristic for deep networks): xi_ii is a fixed hyperparameter and the rest,
  1 - xi_ii, is shared by a softmax of sigma' cos(w_i, w_j) over j != i.

The cloud model of client i is u_i = sum_j xi_ij w_j (``pairwise.mix``); each row sums to 1.
"""

from __future__ import annotations

import numpy as np


def fedamp_weights(sq_dist: np.ndarray, alpha_k: float, sigma: float) -> np.ndarray:
    """xi from the squared distances: alpha_k A'(d_ij^2) off the diagonal, 1 - row sum on it."""
    d = np.asarray(sq_dist, dtype=np.float64)
    xi = alpha_k * np.exp(-d / sigma) / sigma
    np.fill_diagonal(xi, 0.0)
    np.fill_diagonal(xi, 1.0 - xi.sum(axis=1))
    return xi


def heurfedamp_weights(cos: np.ndarray, sigma: float, self_weight: float) -> np.ndarray:
    """xi with a fixed self-weight and the rest by a softmax of sigma cos(w_i, w_j) over j != i.

    A client alone in its round keeps all of its own model (xi = [[1]]).
    """
    c = np.asarray(cos, dtype=np.float64)
    m = len(c)
    if m == 1:
        return np.ones((1, 1))
    logits = sigma * c
    np.fill_diagonal(logits, -np.inf)
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    xi = (1.0 - self_weight) * e / e.sum(axis=1, keepdims=True)
    np.fill_diagonal(xi, self_weight)
    return xi
