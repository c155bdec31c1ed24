"""``max-train-samples``: a seeded, label-stratified cap on each client's training split, taken after
validation is carved, so the test and validation splits are the same at every cap."""

import csv
from pathlib import Path

import numpy as np
import pytest

from fedcore.config import Config, ConfigError, check_partition
from partitions import PartitionError, build_splits, load_dataset
from partitions.partitioners import write_split_file
from partitions.train_cap import TrainCapError, cap_clients, cap_train, stratified_quota


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", num_clients=4, seed=0)


# ------------------------------------------------------------------ the pure function
@pytest.mark.parametrize("counts,cap,expected", [
    ([50, 30, 20], 10, [5, 3, 2]),        # proportional when the shares are whole
    ([90, 9, 1, 0], 10, [8, 1, 1, 0]),     # every present class keeps one (taken from the largest), absent none
    ([3, 3, 3], 20, [3, 3, 3]),            # at most what the client holds
    ([7, 7, 7], 4, [2, 1, 1]),             # the remainder to the largest fraction, ties to the lower class
])
def test_the_quota_keeps_every_class_and_the_proportions(counts, cap, expected):
    assert stratified_quota(np.array(counts), cap).tolist() == expected


def test_a_capped_split_is_stratified_seeded_and_inside_the_training_split():
    labels = np.repeat(np.arange(4), [400, 200, 100, 40])
    train = np.arange(len(labels))[::2]  # 370 training samples: 200/100/50/20
    kept = cap_train(train, labels, 37, np.random.default_rng(1))
    assert len(kept) == 37 and np.isin(kept, train).all() and len(np.unique(kept)) == 37
    assert np.bincount(labels[kept], minlength=4).tolist() == [20, 10, 5, 2]
    assert np.array_equal(kept, cap_train(train, labels, 37, np.random.default_rng(1)))
    assert not np.array_equal(kept, cap_train(train, labels, 37, np.random.default_rng(2)))
    assert np.array_equal(cap_train(train, labels, 0, np.random.default_rng(1)), train)  # 0 = no cap


def test_a_cap_below_a_clients_classes_is_refused_naming_the_smallest_that_works():
    labels = np.array([0, 1, 2, 0, 1, 2, 3])
    trains = [np.array([0, 1]), np.array([2, 3, 4, 5, 6])]  # client 1 trains on 4 classes
    with pytest.raises(TrainCapError, match="below the 4 classes client 1 .* smallest cap that works is 4"):
        cap_clients(trains, labels, 3, np.random.SeedSequence(0))
    assert [len(t) for t in cap_clients(trains, labels, 4, np.random.SeedSequence(0))] == [2, 4]
    with pytest.raises(TrainCapError, match=">= 0"):
        cap_clients(trains, labels, -1, np.random.SeedSequence(0))


# ------------------------------------------------------------------ the splits
@pytest.mark.parametrize("partition,params", [
    ("dirichlet", {"alpha": 0.5}), ("pathological", {}), ("iid", {}), ("pairs", {}),
    ("longtail-dirichlet", {}), ("pfedpm-nk", {"k": 40}),
])
def test_test_and_validation_are_the_same_at_every_cap(digits, partition, params):
    base = {**params, "val-fraction": 0.1}
    full = build_splits(digits, partition, 4, 3, base)
    for cap in (10, 25, 100):
        capped = build_splits(digits, partition, 4, 3, {**base, "max-train-samples": cap})
        for f, c in zip(full, capped):
            assert np.array_equal(f.test, c.test) and np.array_equal(f.val, c.val)
            assert np.isin(c.train, f.train).all() and len(c.train) == min(cap, len(f.train))
            counts_f = np.bincount(digits.y[f.train], minlength=10)
            counts_c = np.bincount(digits.y[c.train], minlength=10)
            assert ((counts_c > 0) == (counts_f > 0)).all()  # every class the client trains on stays
            if len(f.train) > cap:  # within one sample of the stratified share (plus the one kept per class)
                assert (np.abs(counts_c - cap * counts_f / len(f.train)) <= 1 + (counts_f > 0)).all()


def test_the_cap_repeats_for_a_seed_and_differs_for_another(digits):
    first = build_splits(digits, "iid", 4, 0, {"max-train-samples": 30})
    again = build_splits(digits, "iid", 4, 0, {"max-train-samples": 30})
    other = build_splits(digits, "iid", 4, 1, {"max-train-samples": 30})
    assert all(np.array_equal(a.train, b.train) for a, b in zip(first, again))
    assert not any(np.array_equal(a.train, b.train) for a, b in zip(first, other))


def test_a_split_file_is_capped_like_any_partition(digits, tmp_path):
    split = build_splits(digits, "iid", 4, 0, {"val-fraction": 0.1})
    write_split_file(str(tmp_path / "s.json"), "digits", split)
    capped = build_splits(digits, "file", 4, 0, {"file": str(tmp_path / "s.json"), "val-fraction": 0.1,
                                                 "max-train-samples": 20})
    for s, c in zip(split, capped):
        assert np.array_equal(s.test, c.test) and np.array_equal(s.val, c.val)
        assert len(c.train) == 20 and np.isin(c.train, s.train).all()


def test_an_impossible_cap_is_refused_before_the_federation_starts(tmp_path):
    cfg = Config.from_run_config({"dataset": "digits", "partition": "iid", "max-train-samples": 5})
    with pytest.raises(ConfigError, match="'max-train-samples' = 5 is below the 10 classes .* smallest cap that "
                                          "works is 10"):
        check_partition(cfg, 4)
    with pytest.raises(ConfigError, match="'max-train-samples'"):
        Config.from_run_config({"max-train-samples": -1})
    with pytest.raises(PartitionError, match="'max-train-samples' must be a int"):
        build_splits(load_dataset("digits", num_clients=2, seed=0), "iid", 2, 0, {"max-train-samples": "many"})


def test_a_capped_run_trains_on_the_cap_and_tests_on_the_uncapped_test_split(inprocess, tmp_path):
    full = build_splits(load_dataset("digits", num_clients=2, seed=0), "pathological", 2, 0, {"val-fraction": 0.1})
    summary, _ = inprocess(num_clients=2, method="fedavg", **{"max-train-samples": 40, "val-fraction": 0.1,
                                                          "num-server-rounds": 1})
    with open(Path(summary["results_dir"]) / "label_counts.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["num_train"]) for r in rows] == [40, 40]
    assert [int(r["num_test"]) for r in rows] == [len(s.test) for s in full]
    assert all(len(s.train) > 40 for s in full)  # so the cap did cut
