"""FedAMP's attentive message passing (Huang et al., AAAI 2021) as plain functions on numpy arrays.

Round k, over the models w_1..w_m of the round's clients (the server's latest copy of each):

- FedAMP (Eqs. 4-5 with A(x) = 1 - exp(-x / sigma)): xi_ij = alpha_k A'(||w_i - w_j||^2)
  = alpha_k exp(-||w_i - w_j||^2 / sigma) / sigma for j != i, and the self-weight
  xi_ii = 1 - sum_{j != i} xi_ij. Closer models get more weight; xi_ii is negative (the cloud model
  extrapolates away from the others) when alpha_k (m - 1) / sigma > 1 and the models are close.
- HeurFedAMP (the heuristic for deep networks): xi_ii is a fixed hyperparameter and the rest,
  1 - xi_ii, is shared by a softmax of sigma' cos(w_i, w_j) over j != i.

The cloud model of client i is u_i = sum_j xi_ij w_j (``pairwise.mix``); each row sums to 1.

``median_scale`` fits FedAMP's sigma to the run (the round's median distance) and ``attention_spread``
measures how far a xi matrix is from a uniform mix (0: every other client weighs the same).
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


def median_scale(sq_dist: np.ndarray, alpha_k: float) -> tuple[float, float]:
    """(sigma, alpha_k) fitted to the round: sigma = the median of the non-zero squared distances between
    two clients (clients still at the shared initial model are at distance 0 from each other), and the step alpha_k (given as a fraction of the largest one) times sigma / (m - 1), the
    largest step that keeps every self-weight xi_ii >= 0 at any distance. The attention then tells
    near from far clients whatever the models' scale: xi_ij = alpha_k exp(-d_ij / sigma) / (m - 1).
    (0, alpha_k) when every distance is 0 (round 1: one model everywhere, any mix is that model)."""
    d = np.asarray(sq_dist, dtype=np.float64)
    m = len(d)
    if m < 2:
        return 0.0, alpha_k
    off = d[~np.eye(m, dtype=bool)]
    off = off[off > 0]
    if not off.size:
        return 0.0, alpha_k
    sigma = float(np.median(off))
    return sigma, alpha_k * sigma / (m - 1)


def attention_spread(xi: np.ndarray) -> float:
    """How far the weights on the other clients are from uniform: the coefficient of variation (std /
    mean) of each row's off-diagonal weights, averaged over the rows (0: a uniform mix; 0 for m <= 2)."""
    xi = np.asarray(xi, dtype=np.float64)
    m = len(xi)
    if m <= 2:
        return 0.0
    off = xi[~np.eye(m, dtype=bool)].reshape(m, m - 1)
    mean = off.mean(axis=1)
    cv = np.divide(off.std(axis=1), mean, out=np.zeros(m), where=mean > 0)
    return float(cv.mean())


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
