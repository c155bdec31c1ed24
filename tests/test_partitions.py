"""Partitioners: sizes, disjointness, the papers' label rules, errors, determinism, file format."""
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from partitions import (PARTITIONS, ClientSplit, Dataset, PartitionError, build_splits, label_counts,
                        load_dataset, plot_label_heatmap)
from partitions.partitioners import write_split_file


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", num_clients=10, seed=0)


def toy(counts, groups=None, name="toy"):
    """Dataset with counts[c] samples of class c."""
    y = np.repeat(np.arange(len(counts)), counts).astype(np.int64)
    x = np.zeros((len(y), 2), np.float32)
    return Dataset(name, x, y, len(counts), None if groups is None else np.asarray(groups))


def check_valid(ds, splits, n, exact_cover=False):
    assert len(splits) == n
    seen = []
    for s in splits:
        assert s.train.dtype == np.int64 and s.test.dtype == np.int64
        assert len(s.train) >= 1 and len(s.test) >= 1
        assert not np.intersect1d(s.train, s.test).size
        seen += [s.train, s.test]
    allidx = np.concatenate(seen)
    assert len(np.unique(allidx)) == len(allidx), "an index is in two clients"
    assert allidx.min() >= 0 and allidx.max() < len(ds.y)
    if exact_cover:
        assert len(allidx) == len(ds.y)


SCHEMES = {
    "iid": {}, "dirichlet": {"alpha": 0.5}, "pathological": {}, "pfedpm-nk": {"k": 20},
    "pairs": {}, "longtail-dirichlet": {"alpha": 1.0},
}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_schemes_disjoint_and_75_25(digits, scheme):
    splits = build_splits(digits, scheme, 10, seed=3, params=SCHEMES[scheme])
    check_valid(digits, splits, 10, exact_cover=scheme in ("iid", "dirichlet", "pathological", "pairs"))
    for s in splits:
        m = len(s.train) + len(s.test)
        assert len(s.train) == min(max(int(0.75 * m), 1), m - 1)


def test_iid_near_equal(digits):
    sizes = [len(s.train) + len(s.test) for s in build_splits(digits, "iid", 7, 0)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(digits.y)


def test_train_fraction_param(digits):
    s = build_splits(digits, "iid", 4, 0, {"train-fraction": 0.5})[0]
    assert abs(len(s.train) - len(s.test)) <= 1
    with pytest.raises(PartitionError, match="train-fraction"):
        build_splits(digits, "iid", 4, 0, {"train-fraction": 1.0})


@pytest.mark.parametrize("n,c", [(20, 2), (7, 3), (10, 1), (3, 5)])
def test_pathological_exact_classes(digits, n, c):
    splits = build_splits(digits, "pathological", n, 1, {"classes-per-client": c})
    counts = label_counts(digits.y, splits, 10)
    assert ((counts > 0).sum(axis=1) == c).all()
    holders = (counts > 0).sum(axis=0)
    used = holders[holders > 0]
    assert used.max() - used.min() <= 1 and used.max() == int(np.ceil(n * c / 10))
    check_valid(digits, splits, n)


def test_pathological_balance(digits):
    counts = label_counts(digits.y, build_splits(digits, "pathological", 20, 0, {"balance": True}), 10)
    for cls in range(10):
        shares = counts[counts[:, cls] > 0, cls]
        assert shares.max() - shares.min() <= len(shares)  # equal shares, the last takes the remainder


def test_pathological_errors():
    with pytest.raises(PartitionError, match="classes-per-client"):
        build_splits(toy([10] * 3), "pathological", 2, 0, {"classes-per-client": 4})
    with pytest.raises(PartitionError, match="class 0 has 3 samples for 4 clients"):
        build_splits(toy([3, 50]), "pathological", 4, 0, {"classes-per-client": 2})


@pytest.mark.parametrize("mode", ["disjoint", "cyclic"])
def test_pairs_label_formula(digits, mode):
    n = 20
    splits = build_splits(digits, "pairs", n, 0, {"pairs-mode": mode})
    counts = label_counts(digits.y, splits, 10)
    for u in range(n):
        base = 2 * u if mode == "disjoint" else u
        assert set(np.flatnonzero(counts[u])) == {base % 10, (base + 1) % 10}
    assert (counts.sum(axis=0) == np.bincount(digits.y)).all()  # every label fully dealt
    check_valid(digits, splits, n, exact_cover=True)


def test_pairs_shares_follow_remaining_rule():
    # one label with 1000 samples and 4 holders: shares drawn in [rem//5, rem//2] of what remains
    ds = toy([1000, 1000])
    splits = build_splits(ds, "pairs", 4, 5, {"pairs-mode": "cyclic"})  # holders of label 1: users 0..3
    col = label_counts(ds.y, splits, 2)[:, 1]
    rem = 1000
    for share in col[:3]:
        assert rem // 5 <= share <= rem // 2
        rem -= share
    assert col[3] == rem
    with pytest.raises(PartitionError, match="'pairs.mode'"):
        build_splits(ds, "pairs", 4, 0, {"pairs-mode": "zigzag"})


def test_pfedpm_nk_ranges(digits):
    n, k, s = 8, 12, 2
    splits = build_splits(digits, "pfedpm-nk", n, 4, {"n": 4, "k": k, "stdev": s})
    counts = label_counts(digits.y, splits, 10)
    for row in counts:
        held = row[row > 0]
        assert max(2, 4 - s) <= len(held) <= min(9, 4 + s)
        assert (held == held[0]).all() and k - s + 1 <= held[0] <= k + s
    check_valid(digits, splits, n)


def test_pfedpm_nk_runs_out_names_class():
    with pytest.raises(PartitionError, match=r"class \d+ needs \d+ samples, the dataset has 30"):
        build_splits(toy([30] * 10), "pfedpm-nk", 10, 0, {"k": 20, "n": 5})


def test_dirichlet_self_balancing_and_min_size(digits):
    n = 10
    splits = build_splits(digits, "dirichlet", n, 0, {"alpha": 0.1})
    sizes = np.array([len(s.train) + len(s.test) for s in splits])
    # a client stops receiving once it holds N/n, so it overshoots by at most one class's share
    assert sizes.max() < len(digits.y) / n + np.bincount(digits.y).max()
    assert sizes.min() >= min(40, len(digits.y) / n / 2)
    sizes = [len(s.train) + len(s.test) for s in build_splits(digits, "dirichlet", n, 0, {"min-size": 120})]
    assert min(sizes) >= 120


def test_dirichlet_impossible_fails_fast(digits):
    t = time.perf_counter()
    with pytest.raises(PartitionError, match=r"after \d+ attempts.*Raise 'dirichlet.alpha', lower 'dirichlet.min-size'"):
        build_splits(digits, "dirichlet", 10, 0, {"alpha": 0.1, "min-size": 190})
    assert time.perf_counter() - t < 5
    with pytest.raises(PartitionError, match="'dirichlet.alpha' must be > 0"):
        build_splits(digits, "dirichlet", 10, 0, {"alpha": 0})


def test_longtail_class_sizes():
    ds = toy([500] * 10)
    imb, K = 10.0, 10
    splits = build_splits(ds, "longtail-dirichlet", 10, 2, {"alpha": 1.0, "imbalance-factor": imb})
    totals = label_counts(ds.y, splits, K).sum(axis=0)
    expect = 500 * imb ** (-np.arange(K) / (K - 1))
    assert ((totals <= expect + 1e-6) & (totals > expect - 1)).all()
    assert totals[0] == 500 and totals[-1] == 50
    assert min(len(s.train) + len(s.test) for s in splits) >= 10
    check_valid(ds, splits, 10)


def test_natural_on_synthetic():
    ds = load_dataset("synthetic", num_clients=12, seed=1)
    splits = build_splits(ds, "natural", 12, 0)
    for s in splits:
        assert len(np.unique(ds.groups[np.concatenate([s.train, s.test])])) == 1
    check_valid(ds, splits, 12, exact_cover=True)
    splits = build_splits(ds, "natural", 5, 0)  # 12 users dealt round-robin to 5 clients
    owner = np.empty(len(ds.y), int)
    for i, s in enumerate(splits):
        owner[np.concatenate([s.train, s.test])] = i
    per_user = [np.unique(owner[ds.groups == g]) for g in range(12)]
    assert all(len(u) == 1 for u in per_user)  # a user is never split
    assert sorted(np.bincount([u[0] for u in per_user])) == [2, 2, 2, 3, 3]
    with pytest.raises(PartitionError, match="12 groups, fewer than 13 clients"):
        build_splits(ds, "natural", 13, 0)


def test_natural_needs_groups(digits):
    with pytest.raises(PartitionError, match="no natural groups"):
        build_splits(digits, "natural", 4, 0)


def test_too_few_samples_messages():
    with pytest.raises(PartitionError, match="too few samples: dataset 'toy' has 5 samples, fewer than 2 per client"):
        build_splits(toy([5]), "iid", 3, 0)
    ds = toy([10, 10], groups=[0] * 19 + [1])
    with pytest.raises(PartitionError, match=r"too few samples: partition natural gives client \d only 1 samples"):
        build_splits(ds, "natural", 2, 0)


def test_unknown_names_and_params(digits):
    with pytest.raises(PartitionError, match="unknown partition 'nope'.*iid.*dirichlet.*file"):
        build_splits(digits, "nope", 4, 0)
    with pytest.raises(PartitionError, match=r"unknown partition params \['beta'\].*alpha.*train-fraction"):
        build_splits(digits, "iid", 4, 0, {"beta": 1})
    with pytest.raises(PartitionError, match="'pathological.classes-per-client' must be a int"):
        build_splits(digits, "pathological", 4, 0, {"classes-per-client": 2.5})
    # run-config strings are coerced
    a = build_splits(digits, "pathological", 4, 0, {"classes-per-client": "3", "balance": "true"})
    b = build_splits(digits, "pathological", 4, 0, {"classes-per-client": 3, "balance": True})
    assert all(np.array_equal(x.train, y.train) for x, y in zip(a, b))
    assert set(PARTITIONS) == {"iid", "dirichlet", "pathological", "pfedpm-nk", "pairs",
                               "longtail-dirichlet", "natural", "file"}


def _same(a, b):
    return all(np.array_equal(x.train, y.train) and np.array_equal(x.test, y.test) for x, y in zip(a, b))


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_determinism(digits, scheme):
    p = SCHEMES[scheme]
    a = build_splits(digits, scheme, 10, 11, p)
    a[0].train[:] = -1  # callers get copies: mutating must not leak into the cache
    assert _same(build_splits(digits, scheme, 10, 11, p), build_splits(digits, scheme, 10, 11, dict(p)))
    assert build_splits(digits, scheme, 10, 11, p)[0].train.min() >= 0
    assert not _same(build_splits(digits, scheme, 10, 11, p), build_splits(digits, scheme, 10, 12, p))


def test_determinism_across_processes(digits):
    code = ("import hashlib, numpy as np; from partitions import load_dataset, build_splits;"
            "d = load_dataset('digits', num_clients=10, seed=0);"
            "s = build_splits(d, 'dirichlet', 10, 7, {'alpha': 0.3});"
            "print(hashlib.sha256(np.concatenate([np.r_[c.train, -1, c.test, -2] for c in s]).tobytes()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    import hashlib
    s = build_splits(digits, "dirichlet", 10, 7, {"alpha": 0.3})
    assert out == hashlib.sha256(np.concatenate([np.r_[c.train, -1, c.test, -2] for c in s]).tobytes()).hexdigest()


# ---------------------------------------------------------------- file format

def test_file_round_trip(digits, tmp_path):
    orig = build_splits(digits, "dirichlet", 6, 0, {"alpha": 0.5})
    path = tmp_path / "split.json"
    write_split_file(str(path), "digits", orig)
    loaded = build_splits(digits, "file", 6, 99, {"file": str(path)})
    assert _same(orig, loaded)
    doc = json.loads(path.read_text())
    doc["clients"][0] = {"train": [0, 1, 2], "test": [3]}  # rewritten file is not served from cache
    path.write_text(json.dumps(doc))
    assert build_splits(digits, "file", 6, 99, {"file": str(path)})[0].test.tolist() == [3]


def _doc(**over):
    doc = {"format": "pfl-split/v1", "dataset": "digits", "num_clients": 2,
           "clients": [{"train": [0, 1], "test": [2]}, {"train": [3], "test": [4, 5]}]}
    return doc | over


@pytest.mark.parametrize("doc,match", [
    (_doc(format="v0"), "format must be 'pfl-split/v1'"),
    (_doc(dataset="mnist"), "is for dataset 'mnist', not 'digits'"),
    (_doc(num_clients=3), "num_clients=3.*the run uses 2 clients"),
    (_doc(clients=[{"train": [0], "test": [1]}]), "1 client entries"),
    (_doc(clients=[{"train": [0, 5000], "test": [2]}, {"train": [3], "test": [4]}]),
     "client 0 train has index 5000 out of range"),
    (_doc(clients=[{"train": [0, -1], "test": [2]}, {"train": [3], "test": [4]}]), "out of range"),
    (_doc(clients=[{"train": [0, 1], "test": [1]}, {"train": [3], "test": [4]}]),
     "client 0 has index 1 in both train and test"),
    (_doc(clients=[{"train": [0.5], "test": [1]}, {"train": [3], "test": [4]}]), "list of integers"),
    (_doc(clients=[{"train": [0, True], "test": [2]}, {"train": [3], "test": [4]}]), "no booleans"),
    (_doc(clients=[{"train": [False], "test": [2]}, {"train": [3], "test": [4]}]), "no booleans"),
    (_doc(clients=[{"train": [0]}, {"train": [3], "test": [4]}]), "needs 'train' and 'test'"),
    (_doc(clients=[{"train": [0], "test": []}, {"train": [3], "test": [4]}]),
     "too few samples: partition file gives client 0 only 1 train and 0 test"),
    ([1, 2], "format must be"),
])
def test_file_validation(digits, tmp_path, doc, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PartitionError, match=match):
        build_splits(digits, "file", 2, 0, {"file": str(path)})


def test_file_missing(digits, tmp_path):
    with pytest.raises(PartitionError, match="set 'file.path'"):
        build_splits(digits, "file", 2, 0)
    with pytest.raises(PartitionError, match="cannot read split file"):
        build_splits(digits, "file", 2, 0, {"file": str(tmp_path / "none.json")})
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(PartitionError, match="cannot read split file"):
        build_splits(digits, "file", 2, 0, {"file": str(tmp_path / "x.json")})


# ---------------------------------------------------------------- counts and plots

def test_label_counts_and_heatmap(digits, tmp_path):
    splits = build_splits(digits, "pathological", 5, 0)
    counts = label_counts(digits.y, splits, 10)
    brute = np.array([[np.sum(digits.y[np.r_[s.train, s.test]] == c) for c in range(10)] for s in splits])
    assert counts.shape == (5, 10) and (counts == brute).all()
    assert label_counts(digits.y, [ClientSplit(np.array([0]), np.array([1]))], 10).sum() == 2
    for shape in [(5, 10), (100, 100)]:  # annotated and too-large-to-annotate grids
        path = tmp_path / "sub" / f"h{shape[0]}.png"
        plot_label_heatmap(np.arange(np.prod(shape)).reshape(shape) % 7, str(path), title="t")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
