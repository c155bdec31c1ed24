"""Fashion-MNIST offline: the IDX reader, Debian's package as a source, and the refusal at start of a
dataset this machine cannot load (with every way to get it named at once)."""
import gzip
import struct
import time

import numpy as np
import pytest

from fedcore.config import ConfigError, check_data
from partitions import DatasetUnavailable, check_available, load_dataset
from partitions import datasets as pd

IDX_CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D, np.float64: 0x0E}


def write_idx(path, array: np.ndarray) -> None:
    """The IDX format by its spec: 0, 0, type code, ndim, each dim as big-endian uint32, big-endian values."""
    header = bytes([0, 0, IDX_CODES[array.dtype.type], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    body = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    with (gzip.open if str(path).endswith(".gz") else open)(path, "wb") as f:
        f.write(body)


@pytest.fixture(autouse=True)
def fresh_loader_cache():
    pd._load_cached.cache_clear()
    yield
    pd._load_cached.cache_clear()


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_reader_reads_every_type_and_shape(tmp_path, dtype, suffix):
    rng = np.random.default_rng(0)
    array = (rng.normal(0, 50, (3, 4, 5)) if dtype in (np.float32, np.float64)
             else rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (3, 4, 5), endpoint=True)).astype(dtype)
    path = str(tmp_path / f"a.idx{suffix}")
    write_idx(path, array)
    back = pd.read_idx(path)
    assert back.shape == (3, 4, 5) and back.dtype == np.dtype(dtype) and back.dtype.isnative
    np.testing.assert_array_equal(back, array)
    write_idx(path, array[0, 0])  # one dimension: a label file
    np.testing.assert_array_equal(pd.read_idx(path), array[0, 0])


def test_idx_reader_refuses_a_wrong_magic_or_length(tmp_path):
    path = tmp_path / "bad.idx"
    path.write_bytes(b"\x00\x00\x07\x01" + struct.pack(">I", 2) + b"\x01\x02")  # type code 7 does not exist
    with pytest.raises(ValueError, match="not an IDX file"):
        pd.read_idx(str(path))
    path.write_bytes(b"\x00\x00\x08\x02" + struct.pack(">2I", 2, 3) + bytes(5))  # 2 x 3 needs 6 values
    with pytest.raises(ValueError, match=r"IDX shape \(2, 3\) .* needs 18 bytes, the file has 17"):
        pd.read_idx(str(path))


def _fake_package(root, n_train=4, n_test=2, side=28):
    """A Debian-style fashion-mnist folder of tiny IDX files; returns the raw images and labels in order."""
    folder = root / "fashion-mnist"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    raw = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        raw[split] = (rng.integers(0, 256, (n, side, side)).astype(np.uint8), rng.integers(0, 10, n).astype(np.uint8))
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", raw[split][0])
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", raw[split][1])
    return (np.concatenate([raw["train"][0], raw["t10k"][0]]), np.concatenate([raw["train"][1], raw["t10k"][1]]))


def test_fmnist_reads_the_debian_files_train_then_test_without_a_cache_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv(pd.DEBIAN_ROOT_ENV, str(tmp_path / "debian"))
    images, labels = _fake_package(tmp_path / "debian")
    cache = tmp_path / "cache"
    assert check_available("fmnist", str(cache)).startswith("Debian package files in")
    ds = load_dataset("fmnist", num_clients=2, seed=0, data_dir=str(cache))
    assert ds.x.shape == (6, 1, 28, 28) and ds.x.dtype == np.float32 and ds.y.dtype == np.int64
    np.testing.assert_array_equal(ds.y, labels)
    np.testing.assert_allclose(ds.x[:, 0] * 0.3530 + 0.2860, images / 255, atol=1e-5)
    assert not cache.exists()  # read in place: no 55 MB copy in the cache


def test_an_incomplete_package_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv(pd.DEBIAN_ROOT_ENV, str(tmp_path))
    _fake_package(tmp_path)
    (tmp_path / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz").unlink()
    assert pd.debian_dir("fmnist") is None


def test_without_the_package_or_hub_the_error_names_both_ways_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv(pd.DEBIAN_ROOT_ENV, str(tmp_path / "empty"))
    for attempt in (lambda: check_available("fmnist", str(tmp_path)),
                    lambda: load_dataset("fmnist", num_clients=2, seed=0, data_dir=str(tmp_path))):
        with pytest.raises(DatasetUnavailable) as err:
            attempt()
        msg = str(err.value)
        assert "apt-get install dataset-fashion-mnist" in msg and "make data" in msg
        assert "Hugging Face hub" in msg and "zalando-datasets/fashion_mnist" in msg and "parquet" in msg
    with pytest.raises(DatasetUnavailable) as err:  # datasets without a Debian package name no apt-get
        check_available("cifar10", str(tmp_path))
    assert "apt-get" not in str(err.value) and "uoft-cs/cifar10" in str(err.value)


def test_embedded_and_cached_datasets_are_available(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert check_available("digits") == "embedded" and check_available("synthetic") == "synthetic"
    np.savez(tmp_path / "cifar10.npz", x=np.zeros((1, 3, 32, 32), np.uint8), y=np.zeros(1, np.int64))
    assert check_available("cifar10", str(tmp_path)).startswith("cache ")


def test_a_run_that_cannot_load_its_data_is_refused_in_seconds_before_any_client(tmp_path, monkeypatch, capsys):
    """Before: dataset='cifar10' offline failed inside every ClientApp after about 90 s."""
    from runner.inprocess import run_inprocess
    from runner.launch import main
    from tests.conftest import test_device

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv(pd.DEBIAN_ROOT_ENV, str(tmp_path / "empty"))
    cfg = {"dataset": "fmnist", "data-dir": str(tmp_path / "data"), "results-dir": str(tmp_path / "results")}
    t = time.perf_counter()
    assert main(["--supernodes", "3", "--run-config",
                 " ".join(f"{k}='{v}'" for k, v in cfg.items())]) == 2  # the launcher: before SuperLink and Ray
    err = capsys.readouterr().err
    assert "configuration error" in err and "apt-get install dataset-fashion-mnist" in err and "hub" in err
    with pytest.raises(ConfigError, match="apt-get install dataset-fashion-mnist"):
        run_inprocess({**cfg, "num-server-rounds": 1, "device": test_device()}, 3)  # in process: before a client handshakes
    assert time.perf_counter() - t < 10
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_check_data_passes_a_loadable_dataset():
    assert check_data({"dataset": "digits", "data-dir": ""}) == "embedded"


@pytest.mark.skipif(pd.debian_dir("fmnist") is None,
                    reason="Debian's dataset-fashion-mnist is not installed (make data, as root with apt-get)")
def test_the_real_debian_package(monkeypatch):
    monkeypatch.delenv(pd.DEBIAN_ROOT_ENV, raising=False)
    ds = load_dataset("fmnist", num_clients=2, seed=0, data_dir="/nonexistent-cache")
    assert ds.x.shape == (70_000, 1, 28, 28) and (np.bincount(ds.y) == 7_000).all()
    assert ds.y[:4].tolist() == [9, 0, 0, 3]  # the first training labels, as on the hub
    assert abs(float(ds.x.mean())) < 0.01 and abs(float(ds.x.std()) - 1) < 0.01  # its own mean/std


# ---------------------------------------------------------------- the papers' Fashion-MNIST presets
FMNIST_PRESETS = ("fedmcsa-fmnist-mlr", "fedmcsa-fmnist-dnn", "fedfcd-fmnist-pathological", "fedfcd-fmnist-dirichlet",
                  "mupfl-paper/fmnist-if10-a0.5", "mupfl-paper/fmnist-if100-a0.5", "mupfl-paper/fmnist-if10-a1.0",
                  "mupfl-paper/fmnist-if100-a1.0", "mupfl-paper/fmnist-if10-a0.5-ablation", "pfedpm-fmnist-n4",
                  "fedsac-fmnist-dir-high")


@pytest.mark.parametrize("name", FMNIST_PRESETS)
def test_fmnist_presets_are_valid_and_state_their_cost(name):
    from pathlib import Path

    from fedcore.config import Config
    from runner.compare_presets import entries, load_preset

    path = Path(__file__).resolve().parents[1] / "conf" / f"{name}.toml"
    preset = load_preset(path)
    run = preset["run-config"]
    assert run["dataset"] == "fmnist" and preset["compare"]["output"].startswith("docs/results/")
    assert len(preset["compare"]["seeds"]) >= 3 and run["val-fraction"] > 0
    for entry in entries(preset):
        cfg = Config.from_run_config({**run, **entry.config, "method": entry.method})
        assert cfg["dataset"] == "fmnist" and cfg["model"] == run["model"]  # one model for every row
    assert "COST" in path.read_text().split("[compare]")[0]  # the header names its measured cost


def test_fmnist_presets_are_the_papers_settings():
    """The settings the papers state for their Fashion-MNIST tables (FedMCSA Sec. 5.1, FedFCD Sec. 4.1, MuPFL
    Sec. 4.1), and every method of each table."""
    import tomllib
    from pathlib import Path

    load = lambda n: tomllib.loads((Path(__file__).resolve().parents[1] / "conf" / f"{n}.toml").read_text())  # noqa
    for model in ("mlr", "dnn"):
        p = load(f"fedmcsa-fmnist-{model}")
        r = p["run-config"]
        assert (p["compare"]["supernodes"], r["partition"], r["local-steps"], r["batch-size"], r["lr"],
                r["num-server-rounds"], r["model"]) == (20, "pairs", 20, 20, 0.02, 800, model)
        # every row trains all 20 clients, as the default fedmcsa variant does (equal participation, #45)
        assert p["run-config"]["fraction-train"] == 1.0 and "fedmcsa" not in p.get("method-config", {})
        assert all("fraction-train" not in c for c in p.get("method-config", {}).values())
        assert set(p["paper"]["values"]) <= set(p["compare"]["methods"]) and {"local", "fedavg+mcsa"} <= set(
            p["compare"]["methods"]) and len(p["paper"]["values"]) == 8
    for part in ("pathological", "dirichlet"):
        p = load(f"fedfcd-fmnist-{part}")
        assert set(p["paper"]["values"]) | {"local", "fedper", "fedrep", "fedrod"} == set(p["compare"]["methods"])
        assert (p["compare"]["supernodes"], p["run-config"]["fraction-train"], p["run-config"]["model"],
                p["method-config"]["fedfcd"]["fedfcd.lambda"]) == (20, 1.0, "dnn", 1.0)
    for imb, alpha in ((10, 0.5), (100, 0.5), (10, 1.0), (100, 1.0)):
        p = load(f"mupfl-paper/fmnist-if{imb}-a{alpha}")
        r = p["run-config"]
        assert (p["compare"]["supernodes"], r["fraction-train"], r["model"], r["longtail-dirichlet.alpha"],
                r["longtail-dirichlet.imbalance-factor"], r["num-server-rounds"]) == (50, 0.2, "mupflcnn", alpha, imb, 40)
        assert p["paper"]["source"] == [f"mupfl/table2-fmnist-if{imb}-a{alpha}"]
        assert set(p["paper"]["values"]) == {"fedavg", "fedprox", "fednova", "ditto", "fedrep", "creff", "mupfl"}
        assert set(p["paper"]["values"]) <= set(p["compare"]["methods"])
    # Table VI's ablation: MuPFL and its six one-module-on / one-module-off variants, on Table II's IF = 10 settings
    table2, table6 = load("mupfl-paper/fmnist-if10-a0.5"), load("mupfl-paper/fmnist-if10-a0.5-ablation")
    assert table6["run-config"] == table2["run-config"] and table6["compare"]["seeds"] == table2["compare"]["seeds"]
    assert table6["compare"]["tuned"] == table2["compare"]["tuned"]
    modules = {"bavd", "acmu", "pkcf"}
    switched_off = {label: {k.removeprefix("mupfl.") for k, v in table6["variants"][label].items() if v is False}
                    for label in table6["compare"]["methods"][1:]}
    assert table6["compare"]["methods"][0] == "mupfl" and all(
        table6["variants"][label]["method"] == "mupfl" for label in switched_off)
    assert sorted(map(sorted, switched_off.values())) == sorted(
        [sorted(modules - {m}) for m in modules] + [[m] for m in modules])  # each module alone, and each one left out
    assert table6["paper"]["source"] == ["mupfl/table6-fmnist-if10-a0.5"]
    assert load("pfedpm-fmnist-n4")["run-config"]["pfedpm-nk.n"] == 4
    assert load("fedsac-fmnist-dir-high")["run-config"]["dirichlet.alpha"] == 0.1
