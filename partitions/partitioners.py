"""Partitioners: the papers' heterogeneity schemes as index arrays into a ``Dataset``.

``build_splits(dataset, partition, num_clients, seed, params)`` gives one ``ClientSplit`` (train
and test index arrays) per client. Every scheme except ``file`` first assigns each client a pool
of samples, then the client shuffles its pool and keeps the first ``train-fraction`` (0.75) for
training, the rest for testing (PFLlib). With ``val-fraction`` > 0 every client then moves that
share of its training samples (at least one) to a validation split, drawn with a seed stream of its
own: the train/test split is the one a run without validation gets, less the validation samples.
With ``max-train-samples`` > 0 each client then keeps a seeded, label-stratified subset of at most that
many training samples (``train_cap``); its test and validation splits stay as they are.
Schemes:

* ``iid``            seeded shuffle, near-equal split.
* ``dirichlet``      PFLlib ``dir``: per class q ~ Dir(alpha), clients already holding >= N/num_clients
                     samples get no more (self-balancing); resampled until every client has
                     >= min-size samples (default min(40, N/num_clients/2)).
* ``pathological``   PFLlib ``pat``: exactly ``classes-per-client`` classes per client, each class held
                     by about ceil(num_clients*c/C) clients, random (or equal, ``balance``) shares.
* ``pfedpm-nk``      FedProto sampling: n_i ~ U{max(2,n-s)..min(C-1,n+s)} classes, k_i ~ U{k-s+1..k+s}
                     samples per class (s = stdev), disjoint. k counts samples *before* the 75/25
                     split: k=133 gives the paper's ~100 training samples per class.
* ``pairs``          FedMCSA/pFedMe: client u holds labels (2u+j) mod C ("disjoint") or (u+j) mod C
                     ("cyclic"), j in {0, 1}, with random shares per label.
* ``longtail-dirichlet`` MuPFL/CReFF: long-tailed pool n_k = floor(n_max * IF^(-k/(K-1))), then
                     Dir(alpha) per class (no self-balancing), every client >= min-size (default 10).
* ``natural``        one client per ``dataset.groups`` value (groups dealt round-robin when there are
                     more groups than clients).
* ``file``           a JSON split file, train and test given explicitly (see FILE_FORMAT.md)::

                       {"format": "pfl-split/v1", "dataset": "<name>", "num_clients": N,
                        "clients": [{"train": [int, ...], "test": [int, ...]}, ...]}

                     Indices refer to the dataset order documented in ``partitions.datasets``.

* ``flwr:<Name>``     any flwr-datasets partitioner on the pool (``partitions/flwr_partitioners.py``).

We write our schemes on numpy rather than with flwr-datasets' partitioners: those differ from PFLlib's
``dir``/``pat`` semantics we must reproduce; they stay available by name for users who split that way.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import flwr_partitioners
from .datasets import Dataset
from .train_cap import TrainCapError, cap_clients

MAX_ATTEMPTS = 1000  # Dirichlet resampling bound: an attempt costs ~0.5 ms on small pools, and
# small pools need many (digits, 20 clients, Dir(0.1), min 40: ~0.3% of attempts succeed)
SPLIT_FORMAT = "pfl-split/v1"


class PartitionError(ValueError):
    """A partition cannot be built as asked; the message says what to change."""


@dataclass(frozen=True, eq=False)  # arrays have no useful ==
class ClientSplit:
    train: np.ndarray  # int64 indices into the dataset
    test: np.ndarray
    val: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # carved from the training pool


DEFAULT_PARAMS: dict = {
    "alpha": 0.1, "min-size": 0, "classes-per-client": 2, "balance": False, "n": 4, "k": 100,
    "stdev": 2, "imbalance-factor": 10.0, "pairs-mode": "disjoint", "file": "", "train-fraction": 0.75,
    "val-fraction": 0.0, "flwr-args": "", "max-train-samples": 0,
}


def _run_config_key(partition: str, key: str) -> str:
    """The run-config key a user sets for a partitioner option (what error messages must name)."""
    return {"train-fraction": "train-fraction", "val-fraction": "val-fraction", "pairs-mode": "pairs.mode",
            "max-train-samples": "max-train-samples",
            "file": "file.path", "flwr-args": "flwr-partitioner.args"}.get(
        key, f"{partition}.{key}")


def _coerce(key: str, value, partition: str = "partition"):
    """Run-config values may arrive as strings; coerce to the default's type or fail clearly."""
    kind = type(DEFAULT_PARAMS[key])
    try:
        if kind is bool:
            if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.strip().lower() in ("true", "1", "yes")
            if isinstance(value, (bool, np.bool_, int, np.integer)) and value in (0, 1):
                return bool(value)
            raise ValueError
        if kind is int:
            as_float = float(value)
            if not as_float.is_integer():
                raise ValueError
            return int(as_float)
        return kind(value)
    except (TypeError, ValueError):
        raise PartitionError(f"{_run_config_key(partition, key)!r} must be a {kind.__name__}, got {value!r}") from None


def _parse_params(params: dict | None, partition: str = "partition") -> dict:
    params = dict(params or {})
    unknown = sorted(set(params) - set(DEFAULT_PARAMS))
    if unknown:
        raise PartitionError(f"unknown partition params {unknown}; valid: {', '.join(DEFAULT_PARAMS)}")
    return DEFAULT_PARAMS | {k: _coerce(k, v, partition) for k, v in params.items()}


def _group(indices: np.ndarray, owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Indices -> one array per client, from each index's owner."""
    order = np.argsort(owner, kind="stable")
    sizes = np.bincount(owner, minlength=num_clients)
    return np.split(indices[order].astype(np.int64), np.cumsum(sizes)[:-1])


def _by_class(y: np.ndarray, num_classes: int) -> list[np.ndarray]:
    """Sample indices of each class, ascending."""
    order = np.argsort(y, kind="stable")
    return np.split(order, np.cumsum(np.bincount(y, minlength=num_classes))[:-1])


# ---------------------------------------------------------------- schemes

def _iid(ds: Dataset, n: int, rng: np.random.Generator, p: dict) -> list[np.ndarray]:
    return np.array_split(rng.permutation(len(ds.y)).astype(np.int64), n)


def _dirichlet_split(indices, labels, n, alpha, min_size, self_balance, rng, scheme):
    """Per class q ~ Dir(alpha), split by cumsum; resample until every client has min_size."""
    if not alpha > 0:
        raise PartitionError(f"{scheme}: '{scheme}.alpha' must be > 0, got {alpha}")
    members = [indices[labels == c] for c in np.unique(labels)]
    cap = len(indices) / n  # self-balancing threshold of PFLlib
    best = 0
    for _ in range(MAX_ATTEMPTS):
        sizes = np.zeros(n, np.int64)
        parts, owners = [], []
        for m in members:
            q = rng.dirichlet(np.full(n, alpha))
            if self_balance:
                q = q * (sizes < cap)
            q = q / q.sum() if q.sum() > 0 else (sizes < cap) / np.count_nonzero(sizes < cap)
            cuts = np.minimum((np.cumsum(q)[:-1] * len(m)).astype(np.int64), len(m))
            counts = np.diff(np.concatenate(([0], cuts, [len(m)])))
            parts.append(rng.permutation(m))
            owners.append(np.repeat(np.arange(n), counts))
            sizes += counts
        best = max(best, int(sizes.min()))
        if sizes.min() >= min_size:
            return _group(np.concatenate(parts), np.concatenate(owners), n)
    raise PartitionError(
        f"{scheme}: after {MAX_ATTEMPTS} attempts no split gave every client >= {min_size:g} samples "
        f"(alpha={alpha:g}, {n} clients, {len(indices)} samples; the best attempt's smallest client had "
        f"{best}). Raise '{scheme}.alpha', lower '{scheme}.min-size', or use fewer clients.")


def _dirichlet(ds, n, rng, p):
    min_size = p["min-size"] or min(40.0, len(ds.y) / n / 2)
    idx = np.arange(len(ds.y), dtype=np.int64)
    return _dirichlet_split(idx, ds.y, n, p["alpha"], min_size, True, rng, "dirichlet")


def _longtail_dirichlet(ds, n, rng, p):
    """Class k keeps floor(n_max * IF^(-k/(K-1))) random samples (capped at what it has)."""
    imb = p["imbalance-factor"]
    if imb < 1:
        raise PartitionError(f"longtail-dirichlet: 'longtail-dirichlet.imbalance-factor' must be >= 1, got {imb}")
    K = ds.num_classes
    members = _by_class(ds.y, K)
    avail = np.array([len(m) for m in members])
    expo = np.arange(K) / (K - 1) if K > 1 else np.zeros(1)
    n_k = np.minimum(np.floor(avail.max() * imb ** -expo + 1e-9).astype(np.int64), avail)
    pool = np.concatenate([rng.permutation(m)[:c] for m, c in zip(members, n_k)]).astype(np.int64)
    return _dirichlet_split(pool, ds.y[pool], n, p["alpha"], p["min-size"] or 10, False, rng,
                            "longtail-dirichlet")


def _split_class(members, holders, counts, rng):
    """Shuffle one class's indices and deal counts[j] of them to holders[j]."""
    return rng.permutation(members)[: counts.sum()], np.repeat(holders, counts)


def _pathological(ds, n, rng, p):
    c = p["classes-per-client"]
    present = np.flatnonzero(np.bincount(ds.y, minlength=ds.num_classes))
    if not 1 <= c <= len(present):
        raise PartitionError(f"pathological: 'pathological.classes-per-client' must be in 1..{len(present)} "
                             f"(classes present), got {c}")
    # consecutive slots i*c+j over a seeded class order: distinct classes per client and each class
    # held by floor or ceil(n*c/C) clients
    client_classes = rng.permutation(present)[(np.arange(n)[:, None] * c + np.arange(c)) % len(present)]
    members = _by_class(ds.y, ds.num_classes)
    parts, owners = [], []
    for cls in present:
        holders = np.flatnonzero((client_classes == cls).any(axis=1))
        h, total = len(holders), len(members[cls])
        if h == 0:
            continue
        if total < h:
            raise PartitionError(f"pathological: class {cls} has {total} samples for {h} clients; "
                                 f"use fewer clients or fewer classes per client")
        per = total / h
        if p["balance"]:
            counts = np.full(h - 1, int(per))
        else:  # PFLlib: random shares in [per/10, per), the last holder takes the rest
            low = max(1, int(per / 10))
            counts = rng.integers(low, max(low + 1, int(per)), size=h - 1)
        counts = np.append(counts, total - counts.sum())
        part, owner = _split_class(members[cls], holders, counts, rng)
        parts.append(part)
        owners.append(owner)
    return _group(np.concatenate(parts), np.concatenate(owners), n)


def _pfedpm_nk(ds, n, rng, p):
    C, s = ds.num_classes, p["stdev"]
    if s < 0 or p["k"] < 1:
        raise PartitionError(f"pfedpm-nk: need 'pfedpm-nk.k' >= 1 and 'pfedpm-nk.stdev' >= 0, got "
                             f"k={p['k']}, stdev={s}")
    lo_n, hi_n = max(2, p["n"] - s), min(C - 1, p["n"] + s)
    lo_k, hi_k = max(1, min(p["k"] - s + 1, p["k"])), p["k"] + s  # stdev 0 means exactly n and k
    if lo_n > hi_n:
        raise PartitionError(f"pfedpm-nk: classes per client range [{lo_n}, {hi_n}] is empty for "
                             f"n={p['n']}, stdev={s}, {C} classes")
    n_i = rng.integers(lo_n, hi_n + 1, size=n)
    k_i = rng.integers(lo_k, hi_k + 1, size=n)
    # distinct random classes per client: rank random keys, keep the first n_i of each row
    order = np.argsort(rng.random((n, C)), axis=1)
    chosen = np.zeros((n, C), bool)
    rows, cols = np.nonzero(np.arange(C) < n_i[:, None])
    chosen[rows, order[rows, cols]] = True
    members = _by_class(ds.y, C)
    need = (chosen * k_i[:, None]).sum(axis=0)
    have = np.array([len(m) for m in members])
    short = np.flatnonzero(need > have)
    if len(short):
        detail = "; ".join(f"class {c} needs {need[c]} samples, the dataset has {have[c]}" for c in short)
        raise PartitionError(f"pfedpm-nk: not enough samples: {detail}. Lower 'pfedpm-nk.k' or "
                             f"'pfedpm-nk.n', or use fewer clients.")
    parts, owners = [], []
    for cls in range(C):
        holders = np.flatnonzero(chosen[:, cls])
        part, owner = _split_class(members[cls], holders, k_i[holders], rng)
        parts.append(part)
        owners.append(owner)
    return _group(np.concatenate(parts), np.concatenate(owners), n)


def _pairs(ds, n, rng, p):
    mode, C = p["pairs-mode"], ds.num_classes
    if mode not in ("disjoint", "cyclic"):
        raise PartitionError(f"pairs: 'pairs.mode' must be 'disjoint' or 'cyclic', got {mode!r}")
    users = np.arange(n)
    labels = ((2 * users if mode == "disjoint" else users)[:, None] + np.arange(2)) % C
    members = _by_class(ds.y, C)
    parts, owners = [], []
    for label in np.unique(labels):
        holders = np.flatnonzero((labels == label).any(axis=1))
        remaining = len(members[label])
        counts = []
        # Reading chosen: each draw's bounds come from the count still *remaining* (not the class
        # total), randint(rem//5, rem//2) inclusive; this always leaves samples for the last holder.
        for _ in holders[:-1]:
            low = max(1, remaining // 5)
            counts.append(int(rng.integers(low, max(low, remaining // 2) + 1)))
            remaining -= counts[-1]
        counts.append(remaining)
        if min(counts) < 1:
            raise PartitionError(f"pairs: label {label} has {len(members[label])} samples, too few for "
                                 f"its {len(holders)} clients; use fewer clients")
        part, owner = _split_class(members[label], holders, np.array(counts), rng)
        parts.append(part)
        owners.append(owner)
    return _group(np.concatenate(parts), np.concatenate(owners), n)


def _natural(ds, n, rng, p):
    if ds.groups is None:
        raise PartitionError(f"natural: dataset '{ds.name}' has no natural groups; "
                             f"use synthetic or femnist, or another partition")
    uniq, inverse = np.unique(ds.groups, return_inverse=True)
    if len(uniq) < n:
        raise PartitionError(f"natural: dataset '{ds.name}' has {len(uniq)} groups, fewer than "
                             f"{n} clients; use at most {len(uniq)} clients")
    client_of_group = np.empty(len(uniq), np.int64)
    client_of_group[rng.permutation(len(uniq))] = np.arange(len(uniq)) % n  # round-robin after shuffle
    return _group(np.arange(len(ds.y), dtype=np.int64), client_of_group[inverse.reshape(-1)], n)


def _as_indices(value, where: str, size: int) -> np.ndarray:
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise PartitionError(f"split file: {where} must be a list of integers (no booleans or floats)")
    arr = np.asarray(value)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise PartitionError(f"split file: {where} must be a list of integers")
    arr = arr.astype(np.int64)
    bad = arr[(arr < 0) | (arr >= size)]
    if bad.size:
        raise PartitionError(f"split file: {where} has index {bad[0]} out of range [0, {size})")
    return arr


def _file(ds, n, rng, p) -> list[ClientSplit]:
    path = p["file"]
    if not path:
        raise PartitionError("file: set 'file.path' to the JSON split file (see partitions/FILE_FORMAT.md)")
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise PartitionError(f"file: cannot read split file {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != SPLIT_FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise PartitionError(f"split file {path}: format must be '{SPLIT_FORMAT}', found {found!r}")
    if doc.get("dataset") != ds.name:
        raise PartitionError(f"split file {path} is for dataset {doc.get('dataset')!r}, not '{ds.name}'")
    clients = doc.get("clients")
    if doc.get("num_clients") != n or not isinstance(clients, list) or len(clients) != n:
        raise PartitionError(f"split file {path} has num_clients={doc.get('num_clients')!r} and "
                             f"{len(clients) if isinstance(clients, list) else 'no'} client entries; "
                             f"the run uses {n} clients")
    splits = []
    for i, c in enumerate(clients):
        if not isinstance(c, dict) or "train" not in c or "test" not in c:
            raise PartitionError(f"split file {path}: client {i} needs 'train' and 'test' lists")
        train = _as_indices(c["train"], f"client {i} train", len(ds.y))
        test = _as_indices(c["test"], f"client {i} test", len(ds.y))
        both = np.intersect1d(train, test)
        if both.size:
            raise PartitionError(f"split file {path}: client {i} has index {both[0]} in both train and "
                                 f"test ({both.size} shared)")
        splits.append(ClientSplit(train, test))
    return splits


PARTITIONS: dict[str, Callable] = {
    "iid": _iid, "dirichlet": _dirichlet, "pathological": _pathological, "pfedpm-nk": _pfedpm_nk,
    "pairs": _pairs, "longtail-dirichlet": _longtail_dirichlet, "natural": _natural, "file": _file,
}


# ---------------------------------------------------------------- entry points

def _train_test(pools, fraction, rng, partition) -> list[ClientSplit]:
    """Each client shuffles its pool: first `fraction` train, rest test (at least one of each)."""
    splits = []
    for i, pool in enumerate(pools):
        if len(pool) < 2:
            raise PartitionError(
                f"too few samples: partition {partition} gives client {i} only {len(pool)} samples; "
                f"each client needs >= 2 (one train, one test). Use fewer clients or change the "
                f"partition params")
        perm = rng.permutation(pool)
        cut = min(max(int(fraction * len(pool)), 1), len(pool) - 1)
        splits.append(ClientSplit(np.sort(perm[:cut]), np.sort(perm[cut:])))
    return splits


def _carve_validation(splits, fraction, rng, partition) -> list[ClientSplit]:
    """Each client moves a random ``fraction`` of its training samples (at least one) to validation;
    its test split is untouched."""
    out = []
    for i, s in enumerate(splits):
        size = max(1, int(fraction * len(s.train) + 1e-9))
        if len(s.train) - size < 1:
            raise PartitionError(
                f"'val-fraction' = {fraction:g} leaves client {i} of partition {partition} no training sample "
                f"(it has {len(s.train)} before validation is carved, and validation takes at least one); "
                f"lower 'val-fraction', raise 'train-fraction', or use fewer clients")
        perm = rng.permutation(s.train)
        out.append(ClientSplit(np.sort(perm[size:]), s.test, np.sort(perm[:size])))
    return out


@functools.lru_cache(maxsize=32)
def _build_cached(dataset: Dataset, partition: str, n: int, seed: int, items: tuple, stamp) -> tuple:
    p = dict(items)
    if not 0 <= p["val-fraction"] < 1:
        raise PartitionError(f"'val-fraction' must be in [0, 1), got {p['val-fraction']}")
    # the first streams are those of a run without validation or cap (spawn(4) begins as spawn(2) does)
    part_seq, split_seq, val_seq, cap_seq = np.random.SeedSequence(seed).spawn(4)
    rng = np.random.default_rng(part_seq)
    if flwr_partitioners.is_flwr(partition):
        out = flwr_partitioners.pools(dataset, partition, n, rng, p["flwr-args"])
    elif p["flwr-args"]:
        raise PartitionError(f"'flwr-partitioner.args' is set, but partition is {partition!r}, not 'flwr:<Name>'")
    else:
        out = PARTITIONS[partition](dataset, n, rng, p)
    if partition == "file":
        for i, s in enumerate(out):
            if len(s.train) < 1 or len(s.test) < 1:
                raise PartitionError(f"too few samples: partition file gives client {i} only "
                                     f"{len(s.train)} train and {len(s.test)} test samples; need >= 1 each")
    else:
        if not 0 < p["train-fraction"] < 1:
            raise PartitionError(f"'train-fraction' must be in (0, 1), got {p['train-fraction']}")
        out = _train_test(out, p["train-fraction"], np.random.default_rng(split_seq), partition)
    if p["val-fraction"] > 0:
        out = _carve_validation(out, p["val-fraction"], np.random.default_rng(val_seq), partition)
    if p["max-train-samples"]:  # after validation is carved: test and validation are the same at every cap
        try:
            trains = cap_clients([s.train for s in out], dataset.y, p["max-train-samples"], cap_seq, partition)
        except TrainCapError as err:
            raise PartitionError(str(err)) from None
        out = [ClientSplit(t, s.test, s.val) for t, s in zip(trains, out)]
    return tuple(out)


def build_splits(dataset: Dataset, partition: str, num_clients: int, seed: int,
                 params: dict | None = None) -> list[ClientSplit]:
    """Deterministic per-client train/test (and validation) indices; cached per process (every
    client calls it)."""
    if partition not in PARTITIONS and not flwr_partitioners.is_flwr(partition):
        raise PartitionError(f"unknown partition '{partition}'; valid: {', '.join(PARTITIONS)}, or "
                             f"flwr:<a flwr-datasets partitioner>")
    p = _parse_params(params, partition)
    n, total = int(num_clients), len(dataset.y)
    if n < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    if int(seed) < 0:
        raise PartitionError(f"seed must be a non-negative integer, got {seed}")
    if total < 2 * n:
        raise PartitionError(f"too few samples: dataset '{dataset.name}' has {total} samples, fewer than "
                             f"2 per client for {n} clients")
    stamp = None
    if partition == "file" and p["file"] and os.path.exists(p["file"]):
        st = os.stat(p["file"])  # a rewritten file must not hit a stale cache entry
        stamp = (os.path.abspath(p["file"]), st.st_mtime_ns, st.st_size)
    cached = _build_cached(dataset, partition, n, int(seed), tuple(sorted(p.items())), stamp)
    return [ClientSplit(s.train.copy(), s.test.copy(), s.val.copy()) for s in cached]


def federated_data(dataset: str, partition: str, num_clients: int, seed: int, data_dir: str,
                   dataset_params: tuple, partition_params: tuple, normalize: str = "dataset"):
    """The whole dataset and every client's split from a run's data key (``Config.data_key``): what every client
    builds, and what the launcher builds first to refuse a split that cannot be made."""
    from .datasets import load_dataset

    data = load_dataset(dataset, num_clients=num_clients, seed=seed, data_dir=data_dir, params=dict(dataset_params),
                        normalize=normalize)
    return data, build_splits(data, partition, num_clients, seed, dict(partition_params))


def write_split_file(path: str, dataset_name: str, splits: list[ClientSplit]) -> None:
    """Save splits in the ``file`` format, e.g. to freeze a partition or share it. A client's
    validation samples are written with its training ones (the format has no validation list):
    read back with the same seed and ``val-fraction``, the file gives the same three splits."""
    doc = {"format": SPLIT_FORMAT, "dataset": dataset_name, "num_clients": len(splits),
           "clients": [{"train": np.sort(np.concatenate([s.train, s.val])).tolist(), "test": s.test.tolist()}
                       for s in splits]}
    with open(path, "w") as f:
        json.dump(doc, f)


def data_card(dataset: Dataset, splits: list[ClientSplit], partition: str) -> str:
    """One line a run prints at start: the pool (samples, classes, input shape) and the clients' sizes."""
    sizes = np.array([len(s.train) + len(s.val) + len(s.test) for s in splits])
    present = int(np.count_nonzero(np.bincount(dataset.y, minlength=dataset.num_classes)))
    return (f"data card: {dataset.name}: {len(dataset)} samples, {dataset.num_classes} classes"
            + (f" ({present} present)" if present != dataset.num_classes else "")
            + f", input shape {tuple(dataset.input_shape)}; partition {partition}: {len(splits)} clients, "
            f"samples per client min {sizes.min()} / median {np.median(sizes):g} / max {sizes.max()}")


def label_counts(y: np.ndarray, splits: list[ClientSplit], num_classes: int) -> np.ndarray:
    """(num_clients, num_classes) sample counts of train + validation + test per client."""
    if not splits:
        return np.zeros((0, num_classes), np.int64)
    idx = np.concatenate([np.concatenate([s.train, s.val, s.test]) for s in splits]).astype(np.int64)
    owner = np.repeat(np.arange(len(splits)), [len(s.train) + len(s.val) + len(s.test) for s in splits])
    flat = np.bincount(owner * num_classes + np.asarray(y)[idx], minlength=len(splits) * num_classes)
    return flat.reshape(len(splits), num_classes)


def plot_label_heatmap(counts: np.ndarray, path: str, title: str = "") -> None:
    """Clients x classes heat-map of label counts, annotated when the grid is small enough to read."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    counts = np.asarray(counts)
    n, c = counts.shape
    fig = Figure(figsize=(min(2 + 0.45 * c, 24), min(1.5 + 0.32 * n, 30)))
    ax = fig.add_subplot()
    im = ax.imshow(counts, aspect="auto", cmap="Blues", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if c <= 40:
        ax.set_xticks(range(c))
    if n <= 60:
        ax.set_yticks(range(n))
    if n * c <= 600:
        dark = counts > counts.max() / 2
        for (i, j), v in np.ndenumerate(counts):
            if v:
                ax.text(j, i, str(v), ha="center", va="center", fontsize=7,
                        color="white" if dark[i, j] else "black")
    ax.set_title(title or f"label counts ({n} clients, {c} classes)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
