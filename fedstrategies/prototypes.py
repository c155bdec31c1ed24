"""Pure math on class-mean features ("prototypes"), shared by FedProto, pFedPM and FedFCD."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedcore.wire import CLASS_IDS, COUNTS, FEATURES


def aggregate_class_features(
    class_ids: Sequence[np.ndarray],
    features: Sequence[np.ndarray],
    counts: Sequence[np.ndarray],
    num_classes: int,
    mode: str = "weighted",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class mean of the clients' class-mean features, in one vectorised pass.

    ``weighted``: sum_i n_ij / N_j * C_i^(j) (weights sum to 1 per class);
    ``uniform``: the plain mean over the clients that hold class j (FedProto's and PFLlib's code);
    ``paper_literal``: the weighted form times 1/|clients holding j|, as Eq. 7 of pFedPM and Eq. 5
    of FedFCD print it (it shrinks the result; kept only to reproduce that reading).
    Returns (class ids present, (K, d) global features, (K,) total counts).
    """
    if mode not in ("weighted", "uniform", "paper_literal"):
        raise ValueError(f"mode must be 'weighted', 'uniform' or 'paper_literal', got {mode!r}")
    ids = np.concatenate([np.asarray(c, dtype=np.int64) for c in class_ids])
    feats = np.concatenate([np.asarray(f, dtype=np.float64) for f in features])
    n = np.concatenate([np.asarray(c, dtype=np.float64) for c in counts])
    if len(ids) == 0:
        return ids, np.zeros((0, feats.shape[1] if feats.ndim == 2 else 0), np.float32), ids.copy()
    w = np.ones_like(n) if mode == "uniform" else n
    sums = np.zeros((num_classes, feats.shape[1]))
    np.add.at(sums, ids, feats * w[:, None])
    weight_sums = np.bincount(ids, weights=w, minlength=num_classes)
    total = np.bincount(ids, weights=n, minlength=num_classes)
    present = np.flatnonzero(weight_sums > 0)
    means = sums[present] / weight_sums[present, None]
    if mode == "paper_literal":
        holders = np.bincount(ids, minlength=num_classes)[present]
        means = means / holders[:, None]
    return present, means.astype(np.float32), total[present].astype(np.int64)


def merge_class_features(new, old):
    """This round's per-class features, plus the previous ones of classes nobody reported this round.

    ``new`` and ``old`` are (class ids, (K, d) features, (K,) counts); ``old`` may be None.
    """
    if old is None:
        return new
    ids, feats, counts = new
    old_ids, old_feats, old_counts = old
    keep = ~np.isin(old_ids, ids)
    ids = np.concatenate([ids, old_ids[keep]])
    feats = np.concatenate([feats, old_feats[keep]])
    counts = np.concatenate([counts, old_counts[keep]])
    order = np.argsort(ids, kind="stable")
    return ids[order], feats[order], counts[order]


def check_class_features(arrays: dict[str, np.ndarray], num_classes: int, width: int) -> str | None:
    """Why a class-features upload is malformed, or None: shapes must agree, ids be distinct and in
    range, counts positive, and the feature width equal ``width`` (from round 1 on)."""
    ids, feats, counts = arrays[CLASS_IDS], arrays[FEATURES], arrays[COUNTS]
    if ids.ndim != 1 or feats.ndim != 2 or counts.shape != ids.shape or len(feats) != len(ids):
        return f"class-features shapes do not agree: ids {ids.shape}, features {feats.shape}, counts {counts.shape}"
    if ids.dtype.kind not in "iu" or counts.dtype.kind not in "iu":
        return f"class ids and counts must be integers, got {ids.dtype} and {counts.dtype}"
    if len(ids) and (ids.min() < 0 or ids.max() >= num_classes or len(np.unique(ids)) != len(ids)):
        return f"class ids must be distinct and in 0..{num_classes - 1}"
    if (counts <= 0).any():
        return "class counts must be positive"
    if feats.shape[1] != width:
        return f"feature dimension {feats.shape[1]} differs from {width}"
    return None


def check_whole_class_features(arrays: dict[str, np.ndarray], num_classes: int, width: int,
                               own_counts: np.ndarray) -> str | None:
    """``check_class_features``, and the upload must cover exactly the client's classes with their full
    sizes from the handshake (``own_counts``): methods whose server weights by these counts (pFedPM's
    Eq. 6-7, FedFCD's Eq. 5) must not let a client inflate its weight."""
    problem = check_class_features(arrays, num_classes, width)
    if problem:
        return problem
    ids, counts = arrays[CLASS_IDS], arrays[COUNTS]
    if not np.array_equal(np.sort(ids), np.flatnonzero(own_counts)):
        return (f"class ids {sorted(ids.tolist())} are not the client's classes "
                f"{np.flatnonzero(own_counts).tolist()}")
    if (counts != own_counts[ids]).any():
        return "class counts differ from the client's training label counts"
    return None
