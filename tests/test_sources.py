"""The user's own data (partitions/sources.py) and flwr-datasets' partitioners (partitions/flwr_partitioners.py),
on small files each test makes: PNG folders, an npz, a CSV, a ``save_to_disk`` folder, parquet with renamed columns."""
from __future__ import annotations

import numpy as np
import pytest

from fedcore.config import Config, ConfigError, check_data, check_partition
from partitions import PartitionError, build_splits, data_card, load_dataset
from partitions.sources import SourceError, fingerprint

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def png_folder(root, classes=3, per_class=10, size=(8, 8), seed=0, mode="L"):
    """One sub-folder of PNGs per class; class c is brighter than c - 1."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            shape = size if mode == "L" else (*size, 3)
            pixels = (rng.random(shape) * 60 + 60 * c).astype(np.uint8)
            Image.fromarray(pixels, mode).save(root / f"class{c}" / f"{i:03d}.png")
    return root


def table(n=60, classes=3, dim=5, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    x = rng.normal(size=(n, dim)) + y[:, None]
    return x.astype(np.float32), y


def write_csv(path, n=60, classes=3, label="label"):
    import pandas as pd

    x, y = table(n, classes)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])])
    frame[label] = np.array(["cat", "dog", "eel"])[y] if classes == 3 else y
    frame.to_csv(path, index=False)
    return path


def hf_images(n=24, classes=3, label="label", image="image"):
    import datasets
    from PIL import Image

    rng = np.random.default_rng(1)
    y = np.arange(n) % classes
    images = [Image.fromarray((rng.random((6, 6)) * 50 + 60 * c).astype(np.uint8), "L") for c in y]
    features = datasets.Features({image: datasets.Image(), label: datasets.ClassLabel(num_classes=classes)})
    return datasets.Dataset.from_dict({image: images, label: y.tolist()}, features=features)


def load(name, n=3, **options):
    return load_dataset(name, num_clients=n, seed=0, params=options)


# ---------------------------------------------------------------- each source loads what its files hold

def test_image_folder_is_read_class_by_class_in_file_order(tmp_path):
    root = png_folder(tmp_path / "imgs")
    ds = load(f"folder:{root}")
    assert ds.x.shape == (30, 1, 8, 8) and ds.num_classes == 3
    assert ds.y.tolist() == [0] * 10 + [1] * 10 + [2] * 10
    assert abs(float(ds.x.mean())) < 1e-5 and abs(float(ds.x.std()) - 1) < 1e-3  # standardised by its own stats
    from PIL import Image

    first = np.asarray(Image.open(root / "class0" / "000.png"), np.float32) / 255
    # the first sample is that file, pixel for pixel (standardising is affine: correlation 1)
    assert np.corrcoef(first.ravel(), ds.x[0, 0].ravel())[0, 1] > 0.9999


def test_rgb_images_give_three_channels_and_unit_scaling_keeps_pixels(tmp_path):
    root = png_folder(tmp_path / "rgb", mode="RGB")
    ds = load_dataset(f"folder:{root}", num_clients=3, seed=0, normalize="unit")
    assert ds.x.shape == (30, 3, 8, 8) and 0 <= ds.x.min() and ds.x.max() <= 1


def test_npz_with_groups_gives_natural_clients(tmp_path):
    x, y = table(40)
    groups = np.repeat(np.array([7, 3, 9, 5]), 10)
    np.savez(tmp_path / "d.npz", x=x, y=y, groups=groups)
    ds = load(f"npz:{tmp_path / 'd.npz'}", n=4)
    assert ds.x.shape == (40, 5) and ds.num_classes == 3 and len(np.unique(ds.groups)) == 4
    splits = build_splits(ds, "natural", 4, 0)
    for s in splits:  # each client holds exactly one group's samples
        rows = np.concatenate([s.train, s.test])
        assert len(np.unique(ds.groups[rows])) == 1 and len(rows) == 10


def test_npz_channels_last_images_are_transposed(tmp_path):
    x = np.random.default_rng(0).integers(0, 255, (12, 6, 5, 3), dtype=np.uint8)
    np.savez(tmp_path / "img.npz", x=x, y=np.arange(12) % 2)
    assert load(f"npz:{tmp_path / 'img.npz'}").x.shape == (12, 3, 6, 5)


def test_csv_string_labels_are_numbered_in_sorted_order(tmp_path):
    ds = load(f"csv:{write_csv(tmp_path / 't.csv')}")
    x, y = table()
    assert ds.x.shape == (60, 5) and ds.num_classes == 3 and ds.y.tolist() == y.tolist()
    np.testing.assert_allclose(ds.x, (x - x.mean(0)) / x.std(0), atol=1e-4)  # standardised per feature


def test_csv_feature_columns_can_be_chosen(tmp_path):
    ds = load(f"csv:{write_csv(tmp_path / 't.csv')}", **{"x-column": "f1,f3"})
    assert ds.x.shape == (60, 2)


def test_save_to_disk_folder_merges_its_splits_train_first(tmp_path):
    import datasets

    whole = hf_images(24)
    datasets.DatasetDict({"test": whole.select(range(18, 24)), "train": whole.select(range(18))}).save_to_disk(
        str(tmp_path / "saved"))
    ds = load(f"hf:{tmp_path / 'saved'}")
    assert ds.x.shape == (24, 1, 6, 6) and ds.y.tolist() == (np.arange(24) % 3).tolist()
    only_test = load(f"hf:{tmp_path / 'saved'}", splits="test")
    assert len(only_test) == 6


def test_parquet_with_renamed_columns_needs_them_named(tmp_path):
    hf_images(24, label="kind", image="picture").to_parquet(str(tmp_path / "train-0.parquet"))
    with pytest.raises(SourceError, match=r"no label column .*'picture', 'kind'.*source.label-column"):
        load(f"hf:{tmp_path}")
    with pytest.raises(SourceError, match="no image/feature column .*source.x-column"):
        load(f"hf:{tmp_path}", **{"label-column": "kind"})
    ds = load(f"hf:{tmp_path}", **{"label-column": "kind", "x-column": "picture"})
    assert ds.x.shape == (24, 1, 6, 6) and ds.num_classes == 3


def test_hf_vector_columns_load_as_features(tmp_path):
    import datasets

    x, y = table(30)
    datasets.Dataset.from_dict({"features": x.tolist(), "target": y.tolist()}).to_parquet(str(tmp_path / "v.parquet"))
    ds = load(f"hf:{tmp_path / 'v.parquet'}")
    assert ds.x.shape == (30, 5) and ds.y.tolist() == y.tolist()


# ---------------------------------------------------------------- refusals, each naming the problem

def test_missing_csv_label_column_is_named(tmp_path):
    path = write_csv(tmp_path / "t.csv", label="species")
    with pytest.raises(SourceError, match=r"no label column .*species"):
        load(f"csv:{path}")
    with pytest.raises(SourceError, match="label column 'kind' not found"):
        load(f"csv:{path}", **{"label-column": "kind"})
    assert load(f"csv:{path}", **{"label-column": "species"}).num_classes == 3


def test_one_class_only_is_refused(tmp_path):
    png_folder(tmp_path / "one", classes=1)
    with pytest.raises(SourceError, match="one class only"):
        load(f"folder:{tmp_path / 'one'}")


def test_mixed_image_sizes_need_a_resize(tmp_path):
    root = png_folder(tmp_path / "mixed", size=(8, 8))
    png_folder(tmp_path / "mixed", classes=1, per_class=2, size=(10, 12), seed=3)  # over two of class0
    with pytest.raises(SourceError, match=r"mixed sizes .*8x8 and 10x12.*source.resize"):
        load(f"folder:{root}")
    assert load(f"folder:{root}", resize="7x9").x.shape == (30, 1, 7, 9)


def test_npz_without_labels_is_refused(tmp_path):
    np.savez(tmp_path / "x.npz", x=np.zeros((4, 3)), labels=np.arange(4))
    with pytest.raises(SourceError, match=r"missing array\(s\) \['y'\]"):
        load(f"npz:{tmp_path / 'x.npz'}")


def test_non_numeric_or_missing_features_are_refused(tmp_path):
    (tmp_path / "a.csv").write_text("f0,colour,label\n1,red,0\n2,blue,1\n")
    with pytest.raises(SourceError, match=r"\['colour'\] are not numeric"):
        load(f"csv:{tmp_path / 'a.csv'}")
    (tmp_path / "b.csv").write_text("f0,f1,label\n1,,0\n2,3,1\n")
    with pytest.raises(SourceError, match="missing or infinite features .*data row 1"):
        load(f"csv:{tmp_path / 'b.csv'}")


def test_fewer_samples_than_clients_is_refused_before_the_federation(tmp_path):
    path = write_csv(tmp_path / "t.csv", n=9)
    cfg = Config.from_run_config({"dataset": f"csv:{path}", "partition": "iid", "model": "dnn"})
    with pytest.raises(ConfigError, match="has 9 samples, fewer than 2 per client for 5 clients"):
        check_partition(cfg, 5)


def test_a_missing_path_is_refused_by_the_start_check(tmp_path):
    cfg = Config.from_run_config({"dataset": f"folder:{tmp_path / 'nowhere'}"})
    with pytest.raises(ConfigError, match="does not exist"):
        check_data(cfg)


def test_a_hub_id_that_cannot_be_loaded_is_refused_before_the_federation(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as in every test: no download, whatever the machine
    cfg = Config.from_run_config({"dataset": "hf:nobody-pfl/no-such-dataset", "partition": "iid"})
    assert check_data(cfg) == "the hub (nobody-pfl/no-such-dataset)"
    with pytest.raises(ConfigError, match="'nobody-pfl/no-such-dataset' is no local path and cannot be loaded from "
                                          "the hub: .*save_to_disk folder or parquet files"):
        check_partition(cfg, 3)


def test_source_options_without_a_source_are_refused():
    with pytest.raises(ConfigError, match="'source.label-column' = 'kind' is set, but dataset is 'digits'"):
        Config.from_run_config({"dataset": "digits", "source.label-column": "kind"})
    with pytest.raises(ConfigError, match="'source.resize' = '28' is not valid"):
        Config.from_run_config({"dataset": "folder:x", "source.resize": "28"})
    with pytest.raises(ConfigError, match="choose one of: .*digits.*; or folder:<dir>"):
        Config.from_run_config({"dataset": "imagenet"})


# ---------------------------------------------------------------- splits: same seed, same samples; files change

def test_same_seed_same_split_and_a_changed_file_is_reloaded(tmp_path):
    path = write_csv(tmp_path / "t.csv")
    key = dict(dataset=f"csv:{path}", partition="dirichlet", model="dnn")
    cfg = Config.from_run_config(key)
    first = [s.train.tolist() for s in build_splits(load_dataset(key["dataset"], num_clients=3, seed=0), "dirichlet",
                                                     3, 0, cfg.partition_params())]
    again = [s.train.tolist() for s in build_splits(load_dataset(key["dataset"], num_clients=3, seed=0), "dirichlet",
                                                     3, 0, cfg.partition_params())]
    assert first == again
    before = fingerprint(key["dataset"])
    write_csv(path, n=90)
    assert fingerprint(key["dataset"]) != before and len(load_dataset(key["dataset"], num_clients=3, seed=0)) == 90


def test_partition_cache_file_names_hold_no_path(tmp_path, monkeypatch):
    from clients import partition_cache

    monkeypatch.setenv(partition_cache.CACHE_ENV, str(tmp_path / "cache"))
    path = write_csv(tmp_path / "t.csv")
    cfg = Config.from_run_config({"dataset": f"csv:{path}", "partition": "iid", "model": "dnn"})
    file = partition_cache.cache_path(cfg.data_key(3), 0)
    assert file.parent == tmp_path / "cache" and "/" not in file.name
    assert file.name.endswith("t.csv-0-" + file.name[-28:])  # the file's name, the client, a 24-digit hash
    write_csv(path, n=90)
    assert partition_cache.cache_path(cfg.data_key(3), 0) != file  # new files, new cache entry


def test_data_card_states_pool_and_client_sizes(tmp_path):
    path = write_csv(tmp_path / "t.csv")
    cfg = Config.from_run_config({"dataset": f"csv:{path}", "partition": "iid", "model": "dnn"})
    card = check_partition(cfg, 4)
    assert card == (f"data card: csv:{path}: 60 samples, 3 classes, input shape (5,); partition iid: 4 clients, "
                    "samples per client min 15 / median 15 / max 15")


# ---------------------------------------------------------------- flwr-datasets partitioners by name

def test_flwr_partitioner_deals_as_flwr_datasets_does(tmp_path):
    import datasets
    from flwr_datasets.partitioner import DirichletPartitioner

    path = write_csv(tmp_path / "t.csv", n=90)
    ds = load(f"csv:{path}")
    args = "alpha = 0.5, self_balancing = true, min_partition_size = 5, seed = 11"
    splits = build_splits(ds, "flwr:DirichletPartitioner", 3, 0, {"flwr-args": args})
    theirs = DirichletPartitioner(num_partitions=3, partition_by="label", alpha=0.5, self_balancing=True,
                                  min_partition_size=5, seed=11)
    theirs.dataset = datasets.Dataset.from_dict({"label": ds.y, "index": np.arange(len(ds.y))})
    for i, s in enumerate(splits):
        ours = np.sort(np.concatenate([s.train, s.test]))
        assert ours.tolist() == sorted(theirs.load_partition(i)["index"])
        assert abs(len(s.train) - int(0.75 * len(ours))) <= 1  # our train/test split runs on its pools


def test_flwr_partitioner_through_the_run_config(tmp_path):
    path = write_csv(tmp_path / "t.csv")
    cfg = Config.from_run_config({"dataset": f"csv:{path}", "partition": "flwr:IidPartitioner", "model": "dnn"})
    assert "partition flwr:IidPartitioner: 4 clients, samples per client min 15" in check_partition(cfg, 4)
    with pytest.raises(ConfigError, match="'flwr-partitioner.args' = 'alpha = 1' is set, but partition is 'iid'"):
        Config.from_run_config({"partition": "iid", "flwr-partitioner.args": "alpha = 1"})


def test_flwr_partitioner_refusals(tmp_path):
    ds = load(f"csv:{write_csv(tmp_path / 't.csv')}")
    with pytest.raises(PartitionError, match="unknown flwr-datasets partitioner 'Nope'.*flwr:DirichletPartitioner"):
        build_splits(ds, "flwr:Nope", 3, 0)
    with pytest.raises(PartitionError, match="not a TOML inline-table body"):
        build_splits(ds, "flwr:DirichletPartitioner", 3, 0, {"flwr-args": "alpha 0.3"})
    with pytest.raises(PartitionError, match="flwr:DirichletPartitioner with arguments .*flwr-partitioner.args"):
        build_splits(ds, "flwr:DirichletPartitioner", 3, 0, {"flwr-args": "beta = 1"})
    with pytest.raises(PartitionError, match="no natural groups"):
        build_splits(ds, "flwr:NaturalIdPartitioner", 3, 0)


def test_data_card_counts_every_split(tmp_path):
    ds = load(f"csv:{write_csv(tmp_path / 't.csv')}")
    splits = build_splits(ds, "iid", 3, 0, {"val-fraction": 0.2})
    assert data_card(ds, splits, "iid").endswith("3 clients, samples per client min 20 / median 20 / max 20")


def test_data_made_in_python(tmp_path, monkeypatch):
    (tmp_path / "mydata_py_source.py").write_text(
        "import numpy as np\n"
        "def make():\n"
        "    return np.arange(40, dtype=np.float32).reshape(20, 2), np.arange(20) % 2, np.arange(20) // 5\n"
        "def wrong():\n    return [1, 2]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ds = load("py:mydata_py_source:make")
    assert ds.x.shape == (20, 2) and ds.num_classes == 2 and len(np.unique(ds.groups)) == 4
    with pytest.raises(SourceError, match=r"returned list; return \(x, y\) or \(x, y, groups\)"):
        load("py:mydata_py_source:wrong")
    with pytest.raises(SourceError, match="has no callable 'absent'"):
        load("py:mydata_py_source:absent")
    with pytest.raises(ConfigError, match="module 'no_such_module_x' cannot be found"):
        check_data(Config.from_run_config({"dataset": "py:no_such_module_x:make"}))


def test_column_options_of_another_kind_are_refused(tmp_path):
    root = png_folder(tmp_path / "imgs", classes=2, per_class=3)
    with pytest.raises(SourceError, match="are for csv and hf sources"):
        load(f"folder:{root}", **{"label-column": "kind"})
    with pytest.raises(SourceError, match="'source.splits' is for hf sources"):
        load(f"folder:{root}", splits="train")
