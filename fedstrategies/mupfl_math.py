"""MuPFL's server rules as plain functions on tensors and arrays (mupfl.md section 4).

- ACMU (interface, Eqs. 7-15): the combined cosine similarity of weight updates and activation
  maps, k-means over candidate cluster counts chosen by the silhouette score, and the weights
  that turn the clustered updates into the global model.
- PKCF's server side (Eqs. 17-20, the gradient matching of the federated features) is CReFF's rule and
  lives below both methods, in ``fedstrategies/federated_features.py``.

BAVD (Eq. 6, client only) is in ``clients/bavd.py``; the closed-form per-class classifier gradients
(Eqs. 16 and 19), which both sides take, are in ``fedcore/class_gradients.py``.
Nothing here knows about Flower; the strategy (``fedstrategies/mupfl.py``) moves records in and out
and keeps state.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

# ============================================================================ ACMU (interface)


def cosine_matrix(gram: np.ndarray) -> np.ndarray:
    """Pairwise cosines from a Gram matrix <x_i, x_j>; a zero vector has cosine 0 with everything
    (itself included), so a degenerate reply cannot produce NaN."""
    gram = np.asarray(gram, dtype=np.float64)
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    inv = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return gram * inv[:, None] * inv[None, :]


def combined_similarity(update_gram: np.ndarray, map_gram: np.ndarray | None, alpha_s: float) -> np.ndarray:
    """Eq. 8: Dist = alpha_s * cos(dw_i, dw_j) + (1 - alpha_s) * cos(M_i, M_j).

    ``map_gram`` None (BAVD off, or a model without BAVD layers): there are no maps to compare,
    and the similarity is the cosine of the updates alone (alpha_s = 1).
    """
    if map_gram is None:
        return cosine_matrix(update_gram)
    return alpha_s * cosine_matrix(update_gram) + (1.0 - alpha_s) * cosine_matrix(map_gram)


def spec_embedding(updates: np.ndarray, maps: np.ndarray, alpha_s: float) -> np.ndarray:
    """The embedding of mupfl.md 4.3, e_i = [sqrt(a) x_i/||x_i||, sqrt(1-a) a_i/||a_i||], for which
    ||e_i - e_j||^2 = 2 (1 - Dist(i, j)); the reference ``gram_embedding`` is checked against."""
    def unit(x):
        x = np.asarray(x, dtype=np.float64)
        n = np.linalg.norm(x, axis=1, keepdims=True)
        return np.divide(x, n, out=np.zeros_like(x), where=n > 0)

    return np.hstack([np.sqrt(alpha_s) * unit(updates), np.sqrt(1.0 - alpha_s) * unit(maps)])


def gram_embedding(similarity: np.ndarray) -> np.ndarray:
    """Coordinates Y (m x r, r <= m) with Y Y^T = Dist, so that the squared distances of Y equal
    those of the spec's embedding (2 (1 - Dist) for unit rows).

    Dist is the Gram matrix of that embedding, whose rows have dimension ~P (every model
    parameter); its eigendecomposition gives the same points in their m-dimensional row space,
    exactly up to rounding, so k-means costs O(m^2) per iteration instead of O(m P). Eigenvalues
    that rounding makes slightly negative are zeroed.
    """
    sym = 0.5 * (similarity + similarity.T)
    vals, vecs = np.linalg.eigh(sym)
    keep = vals > vals.max(initial=0.0) * 1e-12
    points = vecs[:, keep] * np.sqrt(vals[keep])
    # clients with identical rows are one point: LAPACK builds may round their coordinates apart in the
    # last bit, and k-means would then split identical clients on one machine and not on another
    _, first, inverse = np.unique(sym, axis=0, return_index=True, return_inverse=True)
    return points[first][inverse.reshape(-1)]


def dissimilarity(similarity: np.ndarray) -> np.ndarray:
    """D = 1 - Dist for the silhouette (mupfl.md A3: Eq. 8 is a similarity that Eqs. 9-11 use as a
    distance), with an exact zero diagonal and no negative rounding noise, as scikit-learn needs."""
    d = np.clip(1.0 - similarity, 0.0, None)
    np.fill_diagonal(d, 0.0)
    return d


def candidate_counts(m: int, low: int = 2, high: int = 6) -> list[int]:
    """Eq. 13's range, [low, min(high, m - 1)] (mupfl.md A4); empty when m < 3 (one cluster)."""
    return list(range(low, min(high, m - 1) + 1))


@dataclass
class Clustering:
    """Cluster labels of the round's clients, the count used and its silhouette (0 when undefined),
    and the silhouette of every count tried."""

    labels: np.ndarray
    count: int
    silhouette: float
    scores: dict[int, float] = field(default_factory=dict)


def load_clustering() -> None:
    """Import scikit-learn's k-means and silhouette now (the strategy calls this when it is built, with ACMU
    on): the import costs 1.5 to 3 s of CPU, which the first clustered round would pay otherwise. Clients
    never call it (they build no strategy), so a ClientApp still does not import scikit-learn."""
    import sklearn.cluster  # noqa: F401
    import sklearn.metrics  # noqa: F401


def kmeans_labels(points: np.ndarray, k: int, seed: int, n_init: int = 10) -> np.ndarray:
    """scikit-learn k-means (k-means++ init, ``n_init`` restarts, fixed seed)."""
    from sklearn.cluster import KMeans  # here, not at the top: sklearn costs ~1.5 s to import

    with warnings.catch_warnings():  # fewer distinct points than k: sklearn warns and merges them
        warnings.simplefilter("ignore")
        return KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed).fit_predict(points)


def silhouette(distance: np.ndarray, labels: np.ndarray) -> float | None:
    """Mean silhouette (Eqs. 9-12) on a precomputed distance (scikit-learn: S(i) = 0 for singletons);
    None when it is undefined (fewer than 2 or more than m - 1 distinct clusters)."""
    from sklearn.metrics import silhouette_score  # imported on use (see kmeans_labels)

    k = len(np.unique(labels))
    if not 2 <= k <= len(labels) - 1:
        return None
    return float(silhouette_score(distance, labels, metric="precomputed"))


def choose_clusters(similarity: np.ndarray, low: int = 2, high: int = 6, seed: int = 0,
                    fixed: int = 0) -> Clustering:
    """ACMU's clustering of one round (mupfl.md 4.3-4.4).

    Adaptive (``fixed=0``): k-means for every count in ``candidate_counts`` on the embedding of
    ``gram_embedding``; the count with the largest silhouette on 1 - Dist wins, ties to the smaller.
    ``fixed > 0``: that many clusters (capped at m), as "FedAvg with clustering" (Table I) and
    Table V's fixed kappa. Fewer than 3 clients (adaptive) or fewer than 2: one cluster.
    """
    m = len(similarity)
    one = Clustering(np.zeros(m, dtype=np.int64), 1 if m else 0, 0.0)
    counts = [min(fixed, m)] if fixed > 0 else candidate_counts(m, low, high)
    counts = [k for k in counts if k >= 2]
    if not counts:
        return one
    points = gram_embedding(similarity)
    if points.shape[1] == 0:  # all similarities 0 (unchanged models, empty maps): every client at one point
        return one
    distance = dissimilarity(similarity)
    best: Clustering | None = None
    scores: dict[int, float] = {}
    # at most a few hundred points: one thread (OpenMP workers spin-wait on a busy machine); the
    # limit is set once for the round, not per k-means call
    with threadpool_limits(1):
        for k in counts:
            labels = kmeans_labels(points, k, seed).astype(np.int64)
            score = silhouette(distance, labels)
            if score is not None:
                scores[k] = score
            if fixed > 0 or (score is not None and (best is None or score > best.silhouette)):
                # the distinct clusters: k-means merges clusters when there are fewer distinct points than k
                best = Clustering(labels, len(np.unique(labels)), 0.0 if score is None else score)
    if best is None:
        return one
    best.scores = scores
    return best


def cluster_weights(labels: np.ndarray, num_examples: np.ndarray) -> np.ndarray:
    """Weight omega_i of client i's model in the global model after Eqs. 14-15.

    With w~_i = w_i^start + mean_{j in C_l} dw_j and w_glo = sum_i (n_i/n) w~_i,
    w_glo = sum_i (n_i/n) w_i^start + sum_i (omega_i/n) dw_i with omega_i = N_l / |C_l| (N_l the
    samples of i's cluster): every member of a cluster carries its cluster's samples equally. The
    omegas sum to n, and a client alone in its cluster has omega_i = n_i (FedAvg's weight, exactly).
    """
    labels = np.asarray(labels)
    n = np.asarray(num_examples, dtype=np.float64)
    _, inverse = np.unique(labels, return_inverse=True)
    size = np.bincount(inverse).astype(np.float64)
    samples = np.bincount(inverse, weights=n)
    return samples[inverse] / size[inverse]


def cluster_models(starts: np.ndarray, updates: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Eq. 14 written out: w~_i = w_i^start + (1/|C_l|) sum_{j in C_l} dw_j (rows are clients).
    The strategy never forms these (``cluster_weights`` gives the global model directly); the
    tests check that both agree."""
    labels = np.asarray(labels)
    _, inverse = np.unique(labels, return_inverse=True)
    one_hot = np.eye(inverse.max() + 1)[inverse]  # (m, kappa)
    means = (one_hot.T @ updates) / one_hot.sum(0)[:, None]
    return starts + means[inverse]
