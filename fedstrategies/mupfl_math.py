"""MuPFL's rules as plain functions on tensors and arrays (mupfl.md sections 3 and 4).

- BAVD (client, Eq. 6): the loss-weighted activation map of one layer and the mask it gives.
- ACMU (interface, Eqs. 7-15): the combined cosine similarity of weight updates and activation
  maps, k-means over candidate cluster counts chosen by the silhouette score, and the weights
  that turn the clustered updates into the global model.
- PKCF (server, Eqs. 16-20): closed-form per-class classifier gradients of a linear head and the
  gradient matching that optimises the synthetic federated features.

Nothing here knows about Flower; the strategy (``fedstrategies/mupfl.py``) and the client
(``clients/mupfl.py``) move records in and out and keep state.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

# ============================================================================ BAVD (client)


def bavd_mask(activation_map: torch.Tensor) -> torch.Tensor:
    """Positions of one BAVD layer that are kept: normalised map >= its mean (mupfl.md 3.3a, A2).

    Min-max normalisation, as the spec proposes; the mask is the same for any positive affine
    rescaling of the map (normalisation type is irrelevant), and the map's maximum is always kept.
    An all-zero or constant map (before the first update) keeps every position: BAVD is then the
    identity.

    Parameters
    ----------
    activation_map : Tensor (H, W)

    Returns
    -------
    Tensor (H, W), bool
    """
    lo, hi = activation_map.min(), activation_map.max()
    if not bool(hi > lo):
        return torch.ones_like(activation_map, dtype=torch.bool)
    norm = (activation_map - lo) / (hi - lo)
    return norm >= norm.mean()


def loss_change(previous_loss: float, loss: float, sign: str = "decrease") -> float:
    """psi of Eq. 6: the loss decrease l^(lambda-1) - l^(lambda) by default (the text: a positive
    psi "signifies contribution"); ``sign="literal"`` gives Eq. 6 as printed, l^(lambda) - l^(lambda-1)
    (mupfl.md A1)."""
    if sign == "decrease":
        return previous_loss - loss
    if sign == "literal":
        return loss - previous_loss
    raise ValueError(f"psi sign must be 'decrease' or 'literal', got {sign!r}")


def update_map(activation_map: torch.Tensor, batch_mean: torch.Tensor, step: int, psi: float) -> torch.Tensor:
    """Eq. 6 with one H x W map per layer: M <- r at the very first step (lambda = 0), else
    M <- M + psi * r, where r is the batch's pre-mask activation averaged over batch and channels."""
    if step == 0:
        return batch_mean.detach().clone()
    return activation_map + psi * batch_mean.detach()


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
    return vecs[:, keep] * np.sqrt(vals[keep])


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
                best = Clustering(labels, k, 0.0 if score is None else score)
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


# ============================================================================ PKCF (server + client)


def _gradients_of_blocks(h_blocks: torch.Tensor, r_blocks: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Row k = flattened (sum_j r_j h_j^T, sum_j r_j) / n_k over the samples j of class k, from
    class blocks h (K, w, d) and residuals r = softmax - onehot (K, w, K), zero-padded to width w."""
    K, _, d = h_blocks.shape
    scale = 1.0 / counts.clamp(min=1).to(h_blocks.dtype)
    grad_w = torch.bmm(r_blocks.transpose(1, 2), h_blocks) * scale[:, None, None]  # (K, K, d)
    grad_b = r_blocks.sum(1) * scale[:, None]  # (K, K)
    return torch.cat([grad_w.reshape(K, K * d), grad_b], dim=1)


def _residuals(features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               num_classes: int) -> torch.Tensor:
    """softmax(W h + b) - onehot(y): the CE gradient with respect to the logits."""
    return torch.softmax(features @ weight.T + bias, dim=1) - F.one_hot(labels, num_classes).to(features.dtype)


def class_gradients(features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean cross-entropy gradient of a linear head, in closed form (Eq. 16).

    For logits W h + b, grad_W CE(., k) = (softmax - onehot(k)) h^T and grad_b = softmax - onehot(k);
    z^k is their mean over the samples of class k. Samples are scattered into a (K, n_max, .) block
    by their rank within their class, so one batched matmul serves any label order.

    Returns
    -------
    Z : Tensor (K, K*d + K)
        Row k = flattened (dW, db) of z^k; zeros for classes without samples.
    present : Tensor (K,), bool
    """
    n, d = features.shape
    K = num_classes
    counts = torch.bincount(labels, minlength=K)
    present = counts > 0
    if n == 0:
        return features.new_zeros(K, K * d + K), present
    residual = _residuals(features, labels, weight, bias, K)
    order = torch.argsort(labels, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(labels)
    rank[order] = torch.arange(n, device=labels.device) - starts[labels[order]]
    width = int(counts.max())
    r_blocks = features.new_zeros(K, width, K).index_put((labels, rank), residual)
    h_blocks = features.new_zeros(K, width, d).index_put((labels, rank), features)
    return _gradients_of_blocks(h_blocks, r_blocks, counts), present


def synthetic_labels(num_classes: int, per_class: int, device=None) -> torch.Tensor:
    """Labels of the federated features: class-major, each class repeated ``per_class`` times."""
    return torch.arange(num_classes, device=device).repeat_interleave(per_class)


def synthetic_class_gradients(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """zhat of Eq. 19 for the class-major federated features H (K*m, d): ``class_gradients`` without
    the scatter (the rows already are the class blocks); differentiable in H, which the server's
    matching runs autograd through."""
    K = weight.shape[0]
    m, d = features.shape[0] // K, features.shape[1]
    residual = _residuals(features, synthetic_labels(K, m, features.device), weight, bias, K)
    counts = torch.full((K,), m, device=features.device)
    return _gradients_of_blocks(features.view(K, m, d), residual.view(K, m, K), counts)


def average_class_gradients(replies) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 17: z_glo^k = mean of z_i^k over the clients that report class k (S^k), never over the
    others. ``replies`` yields (Z_i (K, G), present_i (K,)) pairs; they are summed one at a time
    (no stack of all clients). Returns (z_glo (K, G), reported (K,) bool)."""
    total, counts = None, None
    for z, present in replies:
        present = np.asarray(present, dtype=np.float64)
        if total is None:
            total, counts = np.zeros(np.shape(z)), np.zeros(len(present))
        total += present[:, None] * z
        counts += present
    if total is None:
        raise ValueError("no class gradients to average")
    z = np.divide(total, counts[:, None], out=np.zeros_like(total), where=counts[:, None] > 0)
    return z, counts > 0


def matching_loss(target: torch.Tensor, synthetic: torch.Tensor, reported: torch.Tensor) -> torch.Tensor:
    """Eq. 20 as a loss (mupfl.md A5: minimise the cosine distance): mean over the reported classes
    of 1 - cos(z_glo^k, zhat^k); in [0, 2]. Zero when no class is reported."""
    if not bool(reported.any()):
        return synthetic.sum() * 0.0
    cos = F.cosine_similarity(target[reported], synthetic[reported], dim=1)
    return (1.0 - cos).mean()


def match_features(features: torch.Tensor, target: torch.Tensor, reported: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor, steps: int, lr: float) -> tuple[float, float]:
    """Optimise the federated features H in place for ``steps`` SGD steps on ``matching_loss``
    (mupfl.md 4, PKCF step 3), at the classifier (weight, bias) the clients' gradients were taken at.

    The step is written out (h <- h - lr * grad): plain SGD without momentum keeps no state, so it
    equals CReFF's persistent ``torch.optim.SGD`` and needs no optimiser object (whose first
    construction imports torch's compiler, seconds on a busy server). Returns the matching loss
    before and after.
    """
    weight, bias = weight.detach(), bias.detach()

    def loss_of(h):
        return matching_loss(target, synthetic_class_gradients(h, weight, bias), reported)

    with torch.no_grad():
        before = float(loss_of(features))
    if steps == 0 or features.numel() == 0 or not bool(reported.any()):
        return before, before
    h = features.detach().clone().requires_grad_(True)
    for _ in range(steps):
        (grad,) = torch.autograd.grad(loss_of(h), h)
        with torch.no_grad():
            h -= lr * grad
    with torch.no_grad():
        features.copy_(h)
        after = float(loss_of(features))
    return before, after
