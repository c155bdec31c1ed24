"""The rules partitions/partitioners.py implements, beyond tests/test_partitions.py: the helpers' grouping,
the schemes' guaranteed sizes and bounds, the refusals, the data card, the label counts and federated_data."""
from __future__ import annotations

import json

import numpy as np
import pytest

from partitions import partitioners as P
from partitions.datasets import Dataset, load_dataset
from partitions.partitioners import ClientSplit, PartitionError, build_splits


def _tiny(y, num_classes=None, groups=None, name="tiny") -> Dataset:
    y = np.asarray(y, np.int64)
    return Dataset(name, np.zeros((len(y), 2), np.float32), y, int(num_classes or y.max() + 1), groups)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", num_clients=4, seed=0)


# ------------------------------------------------------------ helpers

def test_grouping_keeps_input_order_and_gives_every_client_an_array():
    rng = np.random.default_rng(0)
    owner = rng.integers(0, 3, 5000)  # client 3 owns nothing
    groups = P._group(np.arange(5000), owner, 4)
    assert len(groups) == 4 and len(groups[3]) == 0
    for c in range(3):
        assert np.array_equal(groups[c], np.flatnonzero(owner == c))  # ascending: the input order kept
        assert groups[c].dtype == np.int64


def test_by_class_lists_each_class_ascending_and_gives_absent_last_classes_an_empty_list():
    y = np.random.default_rng(1).integers(0, 3, 5000)
    members = P._by_class(y, 5)
    assert len(members) == 5 and len(members[3]) == 0 and len(members[4]) == 0
    for c in range(3):
        assert np.array_equal(members[c], np.flatnonzero(y == c))


# ------------------------------------------------------------ params

@pytest.mark.parametrize("text, value", [("true", True), ("1", True), (" YES ", True), ("yes", True),
                                         ("false", False), ("FALSE", False), ("0", False), ("no", False),
                                         ("No", False)])
def test_boolean_options_read_the_usual_spellings(text, value):
    assert P._coerce("balance", text) is value


@pytest.mark.parametrize("bad", [2, -1, 0.5, "maybe", None])
def test_boolean_options_refuse_other_values(bad):
    with pytest.raises(PartitionError):
        P._coerce("balance", bad)


def test_boolean_options_take_0_and_1():
    assert P._coerce("balance", 0) is False and P._coerce("balance", 1) is True
    assert P._coerce("balance", np.int64(0)) is False


# ------------------------------------------------------------ schemes

def _pools(ds, scheme, n, seed, **params):
    """The scheme's per-client pools (before the train/test split), as (clients, classes) label counts."""
    pools = P.PARTITIONS[scheme](ds, n, np.random.default_rng(seed), P.DEFAULT_PARAMS | params)
    return np.array([np.bincount(ds.y[pool], minlength=ds.num_classes) for pool in pools])


def _label_skew(ds, splits):
    counts = P.label_counts(ds.y, splits, ds.num_classes)
    return float(np.mean(counts.max(axis=1) / counts.sum(axis=1)))


def test_dirichlet_with_small_alpha_skews_the_labels(digits):
    skewed = build_splits(digits, "dirichlet", 10, 0, {"alpha": 0.1})
    even = build_splits(digits, "dirichlet", 10, 0, {"alpha": 100.0})
    assert _label_skew(digits, skewed) > 0.35 > _label_skew(digits, even)


@pytest.mark.parametrize("n, explicit", [(30, 30), (20, 40)])
def test_dirichlet_default_min_size_is_min_of_40_and_half_a_fair_share(digits, n, explicit):
    # 1797 samples: 30 clients -> 29.95 (the same as 30 for whole counts), 20 clients -> 40
    for seed in range(3):
        a = build_splits(digits, "dirichlet", n, seed, {"alpha": 0.5})
        b = build_splits(digits, "dirichlet", n, seed, {"alpha": 0.5, "min-size": explicit})
        assert all(np.array_equal(s.train, t.train) and np.array_equal(s.test, t.test) for s, t in zip(a, b))


def test_longtail_imbalance_factor_1_is_allowed_and_below_1_refused(digits):
    build_splits(digits, "longtail-dirichlet", 4, 0, {"imbalance-factor": 1.0, "alpha": 1.0})
    build_splits(digits, "longtail-dirichlet", 4, 0, {"imbalance-factor": 1.5, "alpha": 1.0})
    with pytest.raises(PartitionError):
        build_splits(digits, "longtail-dirichlet", 4, 0, {"imbalance-factor": 0.9})


def test_longtail_keeps_every_class_at_imbalance_1_and_a_single_class_whole():
    ds = _tiny(np.repeat(np.arange(3), 40))
    splits = build_splits(ds, "longtail-dirichlet", 2, 0, {"imbalance-factor": 1.0, "alpha": 1.0, "min-size": 1})
    assert sum(len(s.train) + len(s.test) for s in splits) == 120
    one = _tiny(np.zeros(40, np.int64), 1)
    splits = build_splits(one, "longtail-dirichlet", 2, 0, {"alpha": 1.0, "min-size": 1})
    assert sum(len(s.train) + len(s.test) for s in splits) == 40


def test_longtail_default_min_size_is_10(digits):
    for seed in range(3):
        a = build_splits(digits, "longtail-dirichlet", 10, seed, {"alpha": 0.3})
        b = build_splits(digits, "longtail-dirichlet", 10, seed, {"alpha": 0.3, "min-size": 10})
        assert all(np.array_equal(s.train, t.train) for s, t in zip(a, b))
        assert min(len(s.train) + len(s.test) for s in a) >= 10


def test_pathological_classes_per_client_are_distinct_and_classes_evenly_held(digits):
    for n, c in [(10, 3), (7, 2), (5, 4)]:
        counts = P.label_counts(digits.y, build_splits(digits, "pathological", n, 0, {"classes-per-client": c}), 10)
        assert ((counts > 0).sum(axis=1) == c).all()
        holders = (counts > 0).sum(axis=0)
        assert holders.max() - holders.min() <= 1


def test_pathological_shares_are_at_least_a_tenth_of_a_fair_share_and_at_least_one():
    # 4 clients x 1 class, 2 holders per class: a share is drawn in [max(1, per/10), per), the other takes the rest
    ds = _tiny(np.concatenate([np.zeros(8, np.int64), np.ones(40, np.int64)]))  # per = 4 and 20
    small, large = [], []
    for seed in range(40):
        counts = _pools(ds, "pathological", 4, seed, **{"classes-per-client": 1})
        small += counts[:, 0][counts[:, 0] > 0].tolist()
        large += counts[:, 1][counts[:, 1] > 0].tolist()
    assert min(small) == 1 and max(small) == 7
    assert min(large) == 2 and max(large) == 38


def test_pathological_needs_a_sample_per_holder_and_takes_exactly_one():
    ds = _tiny(np.concatenate([np.zeros(2, np.int64), np.ones(40, np.int64)]))
    counts = _pools(ds, "pathological", 4, 0, **{"classes-per-client": 1})
    assert (counts[:, 0] > 0).sum() == 2 and counts[:, 0].sum() == 2
    small = _tiny(np.concatenate([np.zeros(1, np.int64), np.ones(40, np.int64)]))
    with pytest.raises(PartitionError):
        _pools(small, "pathological", 4, 0, **{"classes-per-client": 1})


def _nk(ds, clients, seed, **p):
    counts = P.label_counts(ds.y, build_splits(ds, "pfedpm-nk", clients, seed, p), ds.num_classes)
    return counts


def test_pfedpm_nk_classes_and_samples_stay_in_their_ranges():
    ds = _tiny(np.repeat(np.arange(10), 400))
    seen_n, seen_k = set(), set()
    for seed in range(6):
        counts = _nk(ds, 8, seed, n=4, k=20, stdev=2)
        for row in counts:
            held = row[row > 0]
            seen_n.add(len(held))
            seen_k.update(held.tolist())
    assert seen_n <= set(range(2, 7)) and {2, 6} <= seen_n
    assert seen_k <= set(range(19, 23)) and {19, 22} <= seen_k


def test_pfedpm_nk_stdev_0_means_exactly_n_and_k_and_k_1_is_allowed():
    ds = _tiny(np.repeat(np.arange(6), 30))
    counts = _nk(ds, 4, 0, n=3, k=5, stdev=0)
    assert ((counts > 0).sum(axis=1) == 3).all() and set(counts[counts > 0].tolist()) == {5}
    counts = _nk(ds, 4, 0, n=3, k=1, stdev=0)  # one sample per class: 3 per client, 2 train and 1 test
    assert set(counts[counts > 0].tolist()) == {1}
    counts = _nk(ds, 4, 1, n=3, k=2, stdev=1)  # k in 2..3
    assert set(counts[counts > 0].tolist()) <= {2, 3}


def test_pfedpm_nk_classes_per_client_stop_below_the_class_count():
    ds = _tiny(np.repeat(np.arange(4), 200))
    counts = _nk(ds, 6, 0, n=3, k=10, stdev=1)  # n in max(2, 2)..min(3, 4)
    assert set((counts > 0).sum(axis=1).tolist()) <= {2, 3}
    with pytest.raises(PartitionError):
        _nk(_tiny(np.repeat(np.arange(2), 50)), 2, 0, n=4, k=5, stdev=0)  # range [4, 1] is empty
    counts = _nk(_tiny(np.repeat(np.arange(3), 50)), 2, 0, n=2, k=5, stdev=0)  # range [2, 2] has one value
    assert ((counts > 0).sum(axis=1) == 2).all()


def test_pfedpm_nk_refuses_negative_stdev_and_k_below_1_but_takes_stdev_0():
    ds = _tiny(np.repeat(np.arange(5), 40))
    _nk(ds, 2, 0, n=2, k=3, stdev=0)
    for bad in ({"stdev": -1}, {"k": 0}):
        with pytest.raises(PartitionError):
            _nk(ds, 2, 0, **({"n": 2, "k": 3, "stdev": 0} | bad))


def test_pfedpm_nk_uses_a_class_to_its_last_sample_and_refuses_one_more():
    ds = _tiny(np.repeat(np.arange(3), 10))
    counts = _nk(ds, 3, 0, n=2, k=5, stdev=0)  # 3 clients x 2 of 3 classes x 5 = 30: every sample used
    assert counts.sum() == 30
    with pytest.raises(PartitionError):
        _nk(ds, 3, 0, n=2, k=6, stdev=0)


def test_pairs_shares_follow_the_remaining_count_rule():
    ds = _tiny(np.repeat(np.arange(4), 100))
    for seed in range(20):
        counts = P.label_counts(ds.y, build_splits(ds, "pairs", 4, seed, {"pairs-mode": "cyclic"}), 4)
        for label in range(4):
            held = counts[:, label][counts[:, label] > 0]
            assert len(held) == 2 and held.sum() == 100
            first = counts[np.flatnonzero(counts[:, label])[0], label]  # the lower client id draws from all 100
            assert 20 <= first <= 50  # randint(100 // 5, 100 // 2) inclusive


def test_pairs_gives_the_last_holder_the_rest_even_when_few_are_left():
    ds = _tiny(np.concatenate([np.zeros(2, np.int64), np.ones(40, np.int64), np.full(40, 2)]))
    counts = P.label_counts(ds.y, build_splits(ds, "pairs", 3, 0, {"pairs-mode": "cyclic"}), 3)
    assert counts[:, 0].sum() == 2 and (counts[:, 0] > 0).sum() == 2


def test_natural_deals_groups_to_clients():
    ds = _tiny(np.arange(40) % 2, 2, groups=np.repeat(np.arange(5), 8))
    splits = build_splits(ds, "natural", 2, 0)
    for s in splits:
        idx = np.concatenate([s.train, s.test])
        assert idx.dtype == np.int64
        assert set(np.unique(ds.groups[idx])) and len(idx) % 8 == 0


# ------------------------------------------------------------ split file

def _write(path, doc):
    path.write_text(json.dumps(doc))
    return str(path)


def test_split_file_refuses_a_missing_client_list_and_a_client_without_test(tmp_path):
    ds = _tiny(np.arange(10) % 2, 2)
    base = {"format": P.SPLIT_FORMAT, "dataset": "tiny", "num_clients": 1}
    with pytest.raises(PartitionError):
        build_splits(ds, "file", 1, 0, {"file": _write(tmp_path / "a.json", base)})
    with pytest.raises(PartitionError):
        build_splits(ds, "file", 1, 0, {"file": _write(tmp_path / "b.json", base | {"clients": [{"train": [0, 1]}]})})


def test_split_file_index_range_and_shape(tmp_path):
    ds = _tiny(np.arange(10) % 2, 2)
    base = {"format": P.SPLIT_FORMAT, "dataset": "tiny", "num_clients": 1}
    ok = build_splits(ds, "file", 1, 0, {"file": _write(tmp_path / "ok.json", base | {
        "clients": [{"train": [0, 9], "test": [1]}]})})
    assert ok[0].train.tolist() == [0, 9]
    with pytest.raises(PartitionError):
        build_splits(ds, "file", 1, 0, {"file": _write(tmp_path / "r.json", base | {
            "clients": [{"train": [0, 10], "test": [1]}]})})
    with pytest.raises(PartitionError):
        P._as_indices([[1, 2]], "x", 10)  # nested lists are refused by the first check
    assert P._as_indices([3, 1], "x", 10).tolist() == [3, 1]


# ------------------------------------------------------------ train/test, validation, checks

def test_a_client_of_exactly_two_samples_gets_one_train_and_one_test():
    ds = _tiny(np.arange(4) % 2, 2)
    for frac in (0.1, 0.75, 0.9):
        splits = build_splits(ds, "iid", 2, 0, {"train-fraction": frac})
        assert [(len(s.train), len(s.test)) for s in splits] == [(1, 1), (1, 1)]
    ds = _tiny(np.arange(6) % 2, 2)
    assert [(len(s.train), len(s.test)) for s in build_splits(ds, "iid", 2, 0, {"train-fraction": 0.1})] == \
        [(1, 2), (1, 2)]


def test_validation_takes_the_fraction_down_to_one_and_leaves_one_training_sample():
    ds = _tiny(np.arange(8) % 2, 2)  # 2 clients of 4: 3 train, 1 test
    s = build_splits(ds, "iid", 2, 0, {"val-fraction": 0.2})
    assert [(len(c.train), len(c.val)) for c in s] == [(2, 1), (2, 1)]
    s = build_splits(ds, "iid", 2, 0, {"val-fraction": 0.67})  # int(0.67 * 3) = 2: one left to train
    assert [(len(c.train), len(c.val)) for c in s] == [(1, 2), (1, 2)]


def test_one_client_and_exactly_two_samples_per_client_are_allowed():
    ds = _tiny(np.arange(6) % 2, 2)
    assert len(build_splits(ds, "iid", 1, 0)) == 1
    assert len(build_splits(ds, "iid", 3, 0)) == 3
    with pytest.raises(PartitionError):
        build_splits(ds, "iid", 4, 0)
    with pytest.raises(PartitionError):
        build_splits(ds, "iid", 0, 0)


def test_flwr_partitions_are_recognised_by_name():
    with pytest.raises(PartitionError):
        build_splits(_tiny(np.arange(6) % 2, 2), "nonsense", 2, 0)


# ------------------------------------------------------------ data card, label counts, federated_data

def test_data_card_counts_every_split_and_names_absent_classes():
    ds = _tiny(np.array([0, 0, 1, 1, 0, 1, 0, 1]), 3)
    splits = [ClientSplit(np.array([0, 1]), np.array([2]), np.array([3])),
              ClientSplit(np.array([4, 5, 6]), np.array([7]))]
    card = P.data_card(ds, splits, "iid")
    assert card == ("data card: tiny: 8 samples, 3 classes (2 present), input shape (2,); partition iid: "
                    "2 clients, samples per client min 4 / median 4 / max 4")
    full = _tiny(np.array([0, 1, 2, 0, 1, 2]), 3)
    card = P.data_card(full, [ClientSplit(np.array([0, 1, 2]), np.array([3, 4]), np.array([5]))], "x")
    assert card == ("data card: tiny: 6 samples, 3 classes, input shape (2,); partition x: 1 clients, "
                    "samples per client min 6 / median 6 / max 6")


def test_label_counts_count_train_validation_and_test():
    y = np.array([0, 1, 2, 0, 1, 2])
    splits = [ClientSplit(np.array([0]), np.array([1]), np.array([2, 3])), ClientSplit(np.array([4]), np.array([5]))]
    assert P.label_counts(y, splits, 3).tolist() == [[2, 1, 1], [0, 1, 1]]
    empty = P.label_counts(y, [], 3)
    assert empty.shape == (0, 3) and empty.dtype == np.int64


def test_federated_data_is_the_loaded_pool_and_its_splits():
    params = (("alpha", 1.0), ("beta", 0.0))
    data, splits = P.federated_data("synthetic", "natural", 3, 5, "", params, (("val-fraction", 0.2),))
    ref = load_dataset("synthetic", num_clients=3, seed=5, params=dict(params))
    assert np.array_equal(data.x, ref.x) and np.array_equal(data.y, ref.y) and data.name == "synthetic"
    want = build_splits(ref, "natural", 3, 5, {"val-fraction": 0.2})
    assert len(splits) == 3
    for s, w in zip(splits, want):
        assert np.array_equal(s.train, w.train) and np.array_equal(s.val, w.val) and len(s.val)
    other = P.federated_data("digits", "iid", 2, 0, "", (), (), normalize="unit")[0]
    assert not np.allclose(other.x, load_dataset("digits", num_clients=2, seed=0).x)


def test_a_flwr_partitioner_is_accepted_by_name():
    pytest.importorskip("flwr_datasets")
    ds = _tiny(np.arange(40) % 2, 2)
    splits = build_splits(ds, "flwr:IidPartitioner", 2, 0)
    assert sum(len(s.train) + len(s.test) for s in splits) == 40


def test_a_split_file_client_entry_that_is_not_an_object_is_refused(tmp_path):
    ds = _tiny(np.arange(10) % 2, 2)
    base = {"format": P.SPLIT_FORMAT, "dataset": "tiny", "num_clients": 1}
    for entry in (5, ["train", "test"]):
        with pytest.raises(PartitionError):
            build_splits(ds, "file", 1, 0, {"file": _write(tmp_path / "e.json", base | {"clients": [entry]})})


def test_longtail_with_two_classes_cuts_the_second_by_the_imbalance_factor():
    ds = _tiny(np.repeat(np.arange(2), 80))
    pools = P.PARTITIONS["longtail-dirichlet"](ds, 2, np.random.default_rng(0),
                                               P.DEFAULT_PARAMS | {"imbalance-factor": 4.0, "alpha": 1.0, "min-size": 1})
    assert np.bincount(ds.y[np.concatenate(pools)], minlength=2).tolist() == [80, 20]


# ------------------------------------------------------------ the rules the mutation run found untested

def _before_each_class(counts):
    """(clients, classes) label counts -> what each client held before each class was dealt (ascending)."""
    return np.cumsum(counts, axis=1) - counts


def test_dirichlet_gives_a_full_client_nothing_more_and_a_class_drawn_for_full_clients_to_the_others_evenly():
    # alpha ~ 0 makes every draw (nearly exactly) one-hot: a class goes whole to one client, unless that client
    # already holds >= N/n (the self-balancing cap), when the class is shared evenly by the clients below it
    ds = _tiny(np.repeat(np.arange(6), 10))  # 3 clients: cap 20, reached exactly by two whole classes
    cap, exactly_full, shared = 20, 0, 0
    for seed in range(20):
        counts = _pools(ds, "dirichlet", 3, seed, alpha=1e-6, **{"min-size": 1})
        assert (counts.sum(axis=0) == 10).all()  # every sample of every class dealt once
        held = _before_each_class(counts)
        for cls in range(6):
            full, got = held[:, cls] >= cap, counts[:, cls]
            assert not got[full].any()  # a client at the cap (or above) gets no more
            exactly_full += int((held[:, cls] == cap).any())
            if np.count_nonzero(got) > 1:  # the draw fell on a full client: the others share the class evenly
                assert np.array_equal(got > 0, ~full) and got[~full].max() - got[~full].min() <= 1
                shared += 1
    assert exactly_full > 10 and shared > 5  # both cases occur, often


def test_dirichlet_default_min_size_is_40_inclusive_when_half_a_fair_share_is_more():
    # 164 samples, 2 clients: half a fair share is 41, so the default is 40; alpha ~ 0 deals whole classes, and
    # a client holding the one class of 40 is exactly at the bound
    ds = _tiny(np.repeat(np.arange(4), [40, 40, 40, 44]))
    smallest = []
    for seed in range(8):
        default = _pools(ds, "dirichlet", 2, seed, alpha=1e-6)
        assert np.array_equal(default, _pools(ds, "dirichlet", 2, seed, alpha=1e-6, **{"min-size": 40}))
        smallest.append(int(default.sum(axis=1).min()))
    assert min(smallest) == 40  # a client of exactly 40 samples is kept


def test_longtail_default_min_size_is_10_inclusive_and_an_explicit_one_replaces_it():
    ds = _tiny(np.repeat(np.arange(3), 40))
    params = {"imbalance-factor": 1.0, "alpha": 0.5}
    default, explicit_1 = [], []
    for seed in range(12):
        a = _pools(ds, "longtail-dirichlet", 4, seed, **params)
        assert np.array_equal(a, _pools(ds, "longtail-dirichlet", 4, seed, **params, **{"min-size": 10}))
        default.append(int(a.sum(axis=1).min()))
        explicit_1.append(int(_pools(ds, "longtail-dirichlet", 4, seed, **params, **{"min-size": 1}).sum(axis=1).min()))
    assert min(default) == 10  # a client of exactly 10 samples is kept
    assert min(explicit_1) < 10 and min(explicit_1) >= 1  # min-size 1 keeps smaller clients


def test_longtail_does_not_self_balance():
    # alpha ~ 0: each class goes whole to one client, even to a client that already holds more than N/n
    ds = _tiny(np.repeat(np.arange(6), 10))
    over_cap = 0
    for seed in range(20):
        counts = _pools(ds, "longtail-dirichlet", 3, seed, alpha=1e-6, **{"imbalance-factor": 1.0, "min-size": 1})
        assert ((counts > 0).sum(axis=0) == 1).all() and (counts.sum(axis=0) == 10).all()
        over_cap += int(((_before_each_class(counts) >= 20) & (counts > 0)).any())
    assert over_cap > 3


def test_pairs_first_share_takes_every_value_from_a_fifth_to_a_half():
    # randint(rem // 5, rem // 2) inclusive over what remains: 100 samples -> every value in 20..50 occurs
    ds = _tiny(np.repeat(np.arange(10), 100))
    first = set()
    for seed in range(60):
        counts = _pools(ds, "pairs", 10, seed, **{"pairs-mode": "cyclic"})
        for label in range(10):
            first.add(int(counts[np.flatnonzero(counts[:, label])[0], label]))
    assert first == set(range(20, 51))


@pytest.mark.parametrize("n, c", [(5, 3), (4, 2), (3, 1)])
def test_pathological_client_i_holds_the_slots_i_c_to_i_c_plus_c_of_the_seeded_class_order(n, c):
    # the scheme's first draw is the class order; client i takes the c consecutive slots from i*c on, wrapping
    ds = _tiny(np.repeat(np.arange(7), 30), 8)  # class 7 absent: the order runs over the 7 present classes
    for seed in range(3):
        order = np.random.default_rng(seed).permutation(7)
        counts = _pools(ds, "pathological", n, seed, **{"classes-per-client": c})
        for i in range(n):
            assert set(np.flatnonzero(counts[i])) == {int(order[(i * c + j) % 7]) for j in range(c)}


def test_federated_data_reads_the_given_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing but the folder given may supply the pool
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (12, 3, 32, 32), dtype=np.uint8), np.arange(12) % 10
    np.savez(tmp_path / "cifar10.npz", x=x, y=y)
    data, splits = P.federated_data("cifar10", "iid", 2, 0, str(tmp_path), (), ())
    assert np.array_equal(data.y, y) and data.x.shape == (12, 3, 32, 32)
    assert sorted(np.concatenate([np.r_[s.train, s.test] for s in splits]).tolist()) == list(range(12))
