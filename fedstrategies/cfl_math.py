"""Clustered FL's split rule (Sattler, Mueller and Samek, IEEE TNNLS 2020, Algorithm 3) on numpy arrays.

A cluster c of clients with weight updates dtheta_i (their model after local training minus the
cluster model they started from) is split in two when FL has reached a stationary point of the
cluster's joint objective while some clients are still far from their own:

    ||sum_i p_i dtheta_i|| < eps1   and   max_i ||dtheta_i|| > eps2          (p_i = |D_i| / |D_c|)

The two parts minimise the largest cosine similarity across them,
c1, c2 = argmin_{c1 u c2 = c} max_{i in c1, j in c2} alpha_ij, alpha_ij = cos(dtheta_i, dtheta_j).
That argmin is exactly the two-cluster cut of single-linkage clustering on 1 - alpha (the cut of
the maximum spanning tree's weakest edge); the authors' code uses complete linkage instead
(``linkage = complete``). gamma_max = sqrt((1 - alpha_max_cross) / 2) measures how well the two
parts are separated.
"""

from __future__ import annotations

import numpy as np

from fedcore.methods.cfl import LINKAGES


def should_split(mean_norm: float, max_norm: float, size: int, eps1: float, eps2: float, min_size: int) -> bool:
    """Algorithm 3's criterion: near-stationary on average, far from stationary for some client."""
    return size >= min_size and mean_norm < eps1 and max_norm > eps2


def bipartition(similarity: np.ndarray, linkage: str = "single") -> np.ndarray:
    """Labels 0/1 of the two-part split of clients with cosine matrix ``similarity``.

    Hierarchical clustering on the distance 1 - alpha, cut into two clusters; part 0 holds the
    first client. Needs at least two clients.
    """
    from scipy.cluster.hierarchy import fcluster
    from scipy.cluster.hierarchy import linkage as build
    from scipy.spatial.distance import squareform

    if linkage not in LINKAGES:
        raise ValueError(f"linkage {linkage!r} is not one of {LINKAGES}")
    s = np.asarray(similarity, dtype=np.float64)
    dist = np.clip(1.0 - (s + s.T) / 2, 0.0, 2.0)
    np.fill_diagonal(dist, 0.0)
    labels = fcluster(build(squareform(dist, checks=False), method=linkage), t=2, criterion="maxclust") - 1
    if len(set(labels.tolist())) < 2:  # all distances equal: no structure, cut off the last client
        labels = np.zeros(len(s), dtype=int)
        labels[-1] = 1
    return (labels != labels[0]).astype(int)


def max_cross_similarity(similarity: np.ndarray, labels: np.ndarray) -> float:
    """alpha_max_cross: the largest similarity between a client of part 0 and one of part 1."""
    labels = np.asarray(labels)
    return float(np.asarray(similarity)[np.ix_(labels == 0, labels == 1)].max())


def gamma_max(alpha_cross: float) -> float:
    """The separation gap sqrt((1 - alpha_max_cross) / 2) of a split."""
    return float(np.sqrt(max(1.0 - alpha_cross, 0.0) / 2.0))
