"""``max-train-samples``: each client keeps a seeded, label-stratified subset of its training split.

The cap acts after validation is carved and leaves the test split alone, so runs at different caps score
the same test images and pick their best round on the same validation images; only the training data
shrinks. A client keeps every class it trains on (at least one sample each) and shares the rest of the
cap in proportion to its class counts (largest remainder), so a cap below the number of classes a
client trains on is refused, naming the smallest cap that works.
"""
from __future__ import annotations

import numpy as np


class TrainCapError(ValueError):
    """A cap cannot be applied as asked; the message names the smallest cap that would work."""


def stratified_quota(counts: np.ndarray, cap: int) -> np.ndarray:
    """Samples to keep per class: all when the client holds at most ``cap``; else each class's share
    ``cap * count / total`` rounded by largest remainder, with at least one sample of every present class
    (what that adds is taken back from the classes most over their share)."""
    counts = np.asarray(counts, np.int64)
    present = counts > 0
    if counts.sum() <= cap:
        return counts.copy()
    if cap < present.sum():
        raise TrainCapError(f"a cap of {cap} cannot keep one sample of each of {int(present.sum())} classes")
    share = cap * counts / counts.sum()
    quota = np.where(present, np.maximum(np.floor(share), 1), 0).astype(np.int64)
    while quota.sum() < cap:  # the largest fractional part first, ties to the lower class index
        room = np.where(quota < counts, share - quota, -np.inf)
        quota[int(np.argmax(room))] += 1
    while quota.sum() > cap:  # the class most over its share gives one back, never its last
        over = np.where(quota > 1, quota - share, -np.inf)
        quota[int(np.argmax(over))] -= 1
    return quota


def cap_train(train: np.ndarray, labels: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    """The sorted subset of ``train`` (indices into ``labels``) a client keeps under ``cap`` (0 = all)."""
    train = np.asarray(train, np.int64)
    if cap == 0 or len(train) <= cap:
        return train.copy()
    y = np.asarray(labels)[train]
    classes, counts = np.unique(y, return_counts=True)
    quota = stratified_quota(counts, cap)
    kept = [rng.permutation(train[y == c])[:q] for c, q in zip(classes, quota)]
    return np.sort(np.concatenate(kept)).astype(np.int64)


def smallest_cap(trains: list[np.ndarray], labels: np.ndarray) -> int:
    """The smallest cap every client can keep a stratified subset under: the most classes any client trains on."""
    return max((len(np.unique(np.asarray(labels)[t])) for t in trains), default=1)


def cap_clients(trains: list[np.ndarray], labels: np.ndarray, cap: int, seed_seq: np.random.SeedSequence,
                partition: str = "partition") -> list[np.ndarray]:
    """Every client's capped training split, client ``i`` drawn from child ``i`` of ``seed_seq`` (so a client's
    subset depends on the run seed and its own split only); a cap some client cannot meet is refused."""
    if cap < 0:
        raise TrainCapError(f"'max-train-samples' must be >= 0 (0 = no cap), got {cap}")
    if cap == 0:
        return [np.asarray(t, np.int64).copy() for t in trains]
    need = smallest_cap(trains, labels)
    if cap < need:
        worst = max(range(len(trains)), key=lambda i: len(np.unique(np.asarray(labels)[trains[i]])))
        raise TrainCapError(
            f"'max-train-samples' = {cap} is below the {need} classes client {worst} of partition {partition} trains "
            f"on: a label-stratified subset keeps at least one sample of each, so the smallest cap that works is "
            f"{need}")
    children = seed_seq.spawn(len(trains))
    return [cap_train(t, labels, cap, np.random.default_rng(s)) for t, s in zip(trains, children)]
