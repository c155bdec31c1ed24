"""Dataset loaders: embedded shapes and normalisation, Synthetic(alpha, beta), local parquet, offline errors."""
import time

import numpy as np
import pytest

from partitions import DATASETS, Dataset, DatasetUnavailable, load_dataset
from partitions import datasets as pd


def test_registry_and_unknown_name():
    assert set(DATASETS) == {"digits", "mnist5k", "synthetic", "mnist", "fmnist", "cifar10", "cifar100",
                             "femnist"}
    with pytest.raises(ValueError, match="unknown dataset 'svhn'; valid names: digits, mnist5k, synthetic"):
        load_dataset("svhn", num_clients=2, seed=0)
    with pytest.raises(ValueError, match=r"does not take params \['alpha'\]"):
        load_dataset("digits", num_clients=2, seed=0, params={"alpha": 1})
    with pytest.raises(ValueError, match=r"valid: \['alpha', 'beta', 'classes', 'dim'\]"):
        load_dataset("synthetic", num_clients=2, seed=0, params={"gamma": 1})


def test_digits():
    ds = load_dataset("digits", num_clients=20, seed=0)
    assert isinstance(ds, Dataset) and ds.x.shape == (1797, 1, 8, 8) and ds.input_shape == (1, 8, 8)
    assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64 and ds.num_classes == 10 and ds.groups is None
    assert abs(ds.x.mean()) < 1e-3 and abs(ds.x.std() - 1) < 1e-3
    assert load_dataset("digits", num_clients=5, seed=9) is ds  # cached per process


def test_mnist5k():
    ds = load_dataset("mnist5k", num_clients=20, seed=0)
    assert ds.x.shape == (5000, 1, 28, 28) and ds.x.dtype == np.float32 and ds.y.dtype == np.int64
    assert (np.bincount(ds.y) == 500).all() and ds.input_shape == DATASETS["mnist5k"].input_shape
    raw = ds.x * 0.3081 + 0.1307  # undo the MNIST normalisation: back to [0, 1]
    assert raw.min() > -1e-5 and raw.max() < 1 + 1e-5 and abs(raw.mean() - 0.1313) < 1e-3


def test_synthetic_shapes_and_sizes():
    ds = load_dataset("synthetic", num_clients=30, seed=0)
    assert ds.x.shape[1:] == (60,) and ds.x.dtype == np.float32 and ds.num_classes == 10
    sizes = np.bincount(ds.groups)
    assert len(sizes) == 30 and (sizes % 5 == 0).all() and sizes.min() >= 250  # (int(LogNormal)+50)*5
    assert (np.diff(ds.groups) >= 0).all() and ds.y.min() >= 0 and ds.y.max() < 10
    small = load_dataset("synthetic", num_clients=4, seed=0, params={"dim": 5, "classes": 3})
    assert small.x.shape[1] == 5 and small.num_classes == 3 and small.y.max() <= 2
    again = load_dataset("synthetic", num_clients=4, seed=0, params={"dim": 5, "classes": 3, "alpha": 0.5})
    assert again is small  # defaults filled in before caching
    other = load_dataset("synthetic", num_clients=4, seed=1, params={"dim": 5, "classes": 3})
    assert not np.array_equal(np.bincount(other.groups), np.bincount(small.groups))


def test_synthetic_per_user_distribution():
    from sklearn.linear_model import LogisticRegression

    ds = load_dataset("synthetic", num_clients=30, seed=0)
    u = np.argmax(np.bincount(ds.groups))
    x, y = ds.x[ds.groups == u], ds.y[ds.groups == u]
    var = x.var(axis=0)  # Sigma = diag(j^-1.2)
    assert np.allclose(var, np.arange(1, 61) ** -1.2, rtol=0.25)
    # labels are the argmax of one linear model per user: (almost) linearly separable within a user
    acc = LogisticRegression(C=1e4, max_iter=2000).fit(x, y).score(x, y) if len(np.unique(y)) > 1 else 1.0
    assert acc > 0.95
    # users differ: their input means are drawn around different B_i
    means = np.stack([ds.x[ds.groups == g].mean(axis=0) for g in range(30)])
    assert means.std(axis=0).mean() > 0.5


# ---------------------------------------------------------------- downloadable loaders on local parquet

def _images(n, mode, size, seed):
    from PIL import Image

    rng = np.random.default_rng(seed)
    shape = (size, size) if mode == "L" else (size, size, 3)
    arrays = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    return arrays, [Image.fromarray(a, mode) for a in arrays]


def _write_parquet(root, name, image_col, label_col, mode, size, extra=None):
    """HF-layout parquet: <root>/<name>/{train,test}-0.parquet; returns the raw images in dataset order."""
    import datasets

    out, labels = [], []
    for split, n, seed in (("train", 3, 0), ("test", 2, 1)):
        arrays, imgs = _images(n, mode, size, seed)
        y = list(range(seed * 10, seed * 10 + n))
        cols = {image_col: imgs, label_col: y} | {k: v[split] for k, v in (extra or {}).items()}
        ds = datasets.Dataset.from_dict(cols).cast_column(image_col, datasets.Image())
        (root / name).mkdir(parents=True, exist_ok=True)
        ds.to_parquet(str(root / name / f"{split}-0.parquet"))
        out.append(arrays)
        labels += y
    return np.concatenate(out), np.array(labels)


def test_mnist_from_parquet_then_npz(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the local files must be enough
    raw, labels = _write_parquet(tmp_path, "mnist", "image", "label", "L", 28)
    ds = load_dataset("mnist", num_clients=2, seed=0, data_dir=str(tmp_path))
    assert ds.x.shape == (5, 1, 28, 28) and ds.x.dtype == np.float32 and ds.num_classes == 10
    assert (ds.y == labels).all()  # train rows, then test rows
    assert np.allclose(ds.x[:, 0] * 0.3081 + 0.1307, raw / 255, atol=1e-5)
    with np.load(tmp_path / "mnist.npz") as f:
        assert f["x"].dtype == np.uint8 and f["x"].shape == (5, 1, 28, 28) and (f["y"] == labels).all()
    # next process: the npz alone is enough
    for sub in (tmp_path / "mnist").iterdir():
        sub.unlink()
    pd._load_cached.cache_clear()
    again = load_dataset("mnist", num_clients=2, seed=0, data_dir=str(tmp_path))
    assert np.array_equal(again.x, ds.x) and np.array_equal(again.y, ds.y)


def test_cifar10_from_parquet_channels(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    raw, labels = _write_parquet(tmp_path, "cifar10", "img", "label", "RGB", 32)
    ds = load_dataset("cifar10", num_clients=2, seed=0, data_dir=str(tmp_path))
    assert ds.x.shape == (5, 3, 32, 32) and ds.input_shape == (3, 32, 32) and (ds.y == labels).all()
    mean, std = np.array([0.4914, 0.4822, 0.4465]), np.array([0.2470, 0.2435, 0.2616])
    back = ds.x * std[None, :, None, None] + mean[None, :, None, None]
    assert np.allclose(back, raw.transpose(0, 3, 1, 2) / 255, atol=1e-5)
    assert (tmp_path / "cifar10.npz").exists()


def test_femnist_writers_become_groups(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    writers = {"train": ["f9_1", "f2_0", "f9_1"], "test": ["f5_3", "f2_0"]}
    _write_parquet(tmp_path, "femnist", "image", "character", "L", 28, {"writer_id": writers})
    ds = load_dataset("femnist", num_clients=2, seed=0, data_dir=str(tmp_path))
    assert ds.num_classes == 62 and ds.x.shape == (5, 1, 28, 28)
    assert ds.groups.tolist() == [2, 0, 2, 1, 0]  # rank of writer_id in sorted order


def test_offline_without_files_fails_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t = time.perf_counter()
    with pytest.raises(DatasetUnavailable) as err:
        load_dataset("cifar100", num_clients=2, seed=0, data_dir=str(tmp_path))
    assert time.perf_counter() - t < 1
    msg = str(err.value)
    assert "not cached" in msg and str(tmp_path / "cifar100.npz") in msg and "parquet" in msg
    assert "network" in msg and isinstance(err.value, RuntimeError)


def test_mnist5k_npz_cache_is_written_and_gives_the_same_data(tmp_path):
    from partitions.datasets import _mnist5k_raw

    first = load_dataset("mnist5k", num_clients=2, seed=0, data_dir=str(tmp_path))
    assert (tmp_path / "mnist5k.npz").exists()
    _mnist5k_raw.cache_clear()
    again = _mnist5k_raw(str(tmp_path))  # now read from the npz
    np.testing.assert_array_equal(again[1], first.y)
    assert again[0].dtype == np.uint8 and again[0].shape == (5000, 1, 28, 28)


@pytest.mark.parametrize("name", ["digits", "mnist5k"])
def test_normalisation_is_an_option(name, tmp_path):
    """Replaying another library's split needs its input scaling too: (x - 0.5) / 0.5, or [0, 1]."""
    from partitions import load_dataset

    base = load_dataset(name, num_clients=2, seed=0, data_dir=str(tmp_path))
    half = load_dataset(name, num_clients=2, seed=0, data_dir=str(tmp_path), normalize="half")
    unit = load_dataset(name, num_clients=2, seed=0, data_dir=str(tmp_path), normalize="unit")
    assert unit.x.min() == 0.0 and unit.x.max() == 1.0
    np.testing.assert_allclose(half.x, (unit.x - 0.5) / 0.5, atol=1e-6)
    assert abs(base.x.mean()) < 0.1 and abs(base.x.std() - 1) < 0.1  # the dataset's own statistics


def test_synthetic_refuses_pixel_scaling():
    from partitions import load_dataset

    with pytest.raises(ValueError, match="normalize must be 'dataset'"):
        load_dataset("synthetic", num_clients=2, seed=0, normalize="half")
