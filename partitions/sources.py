"""The user's own data as a pool: ``dataset = '<kind>:<location>'``.

* ``folder:<dir>``  an image folder, one sub-folder per class (PNG/JPEG); classes are the sorted
                    sub-folder names, samples go class by class, files in sorted name order.
* ``npz:<file>``    numpy arrays ``x`` (N, D) vectors, (N, H, W) or (N, C, H, W) images (N, H, W, C with
                    1, 3 or 4 last channels is transposed), ``y`` labels, optional ``groups`` (natural clients).
* ``csv:<file>``    a table: a label column, numeric feature columns (every other column unless
                    ``source.x-column`` lists them), optional group column; rows in file order.
* ``py:<package.module:function>``  data made in Python: ``function()`` returns ``(x, y)`` or ``(x, y, groups)``
                    arrays, read as an npz's (an app that holds its data in code, examples/).
* ``hf:<id|path>``  a Hugging Face dataset: a ``save_to_disk`` folder, a parquet file or a folder of
                    them (``train*``/``test*`` name the split), or a hub id. Its splits are merged in the
                    order train, validation, test, then the others by name (``source.splits`` picks some).

Labels: integers 0..K-1 are kept (K = the largest + 1), any other labels are numbered in sorted order.
Pixels (PNG/JPEG, uint8 arrays) are scaled by 1/255 and, with ``normalize = 'dataset'``, standardised
by the pool's own per-channel mean and std; other features are standardised per feature (vectors) or
channel. Every problem a run would meet later (a missing column, one class only, images of mixed sizes
without ``source.resize``) is a ``SourceError`` naming it, raised when the pool is loaded: before the
federation starts. We read the files with ``datasets`` (and PIL, pandas) rather than
``flwr_datasets.FederatedDataset`` because the partitioners need the whole pool as numpy arrays in a
fixed order; flwr-datasets' partitioners act on that pool (``partitions/flwr_partitioners.py``).
"""
from __future__ import annotations

import functools
import glob
import hashlib
import io
import os
import re

import numpy as np

from .datasets import Dataset, DatasetUnavailable, _hub_unavailable, _stats

KINDS = ("folder", "npz", "csv", "hf", "py")
#: run-config keys ``source.<option>`` and their defaults ("" = automatic)
OPTIONS = {"x-column": "", "label-column": "", "group-column": "", "resize": "", "splits": ""}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
LABEL_NAMES = ("label", "labels", "fine_label", "y", "target", "class", "character")  # tried in order
X_NAMES = ("image", "img", "pixel_values", "x", "features")
SPLIT_ORDER = ("train", "validation", "test")


class SourceError(ValueError):
    """The user's data cannot be used as given; the message names the problem and the key to change."""


def is_source(name: str) -> bool:
    kind, sep, location = str(name).partition(":")
    return bool(sep) and kind in KINDS and bool(location)


def parse(name: str) -> tuple[str, str]:
    """``'folder:/data/x'`` -> ("folder", "/data/x"); SourceError for anything else."""
    if not is_source(name):
        raise SourceError(f"dataset {name!r} is not a source; write one of "
                          + ", ".join(f"'{k}:<path>'" for k in KINDS))
    kind, _, location = name.partition(":")
    return kind, location


def _local(kind: str, location: str) -> str | None:
    """The absolute path of a local source, None for a hub id; a py source's module file."""
    if kind == "py":
        return _module_file(location)
    path = os.path.abspath(os.path.expanduser(location))
    if kind == "hf" and not os.path.exists(path):
        return None
    return path


def fingerprint(name: str) -> str:
    """Changes when the source's files change (names, sizes, times): the key of every cache of its pool
    and splits, so a user who edits the data never gets stale partitions."""
    kind, location = parse(name)
    path = _local(kind, location)
    if path is None or not os.path.exists(path):
        return location
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)
    digest = hashlib.sha256()
    for f in files:
        st = os.stat(f)
        digest.update(f"{os.path.relpath(f, path)}:{st.st_size}:{st.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


def _module_file(location: str) -> str | None:
    import importlib.util

    module = location.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    return spec.origin if spec is not None and spec.origin and os.path.exists(spec.origin) else None


def short_name(name: str) -> str:
    """A file-name-safe label of a source (``folder:/data/cats`` -> ``folder-cats``), for run names."""
    kind, location = parse(name)
    tail = os.path.basename(location.rstrip("/\\").split(":")[-1]) or location
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{kind}-{tail}")


def check_options(options: dict) -> dict:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise SourceError(f"unknown source options {unknown}; valid: {', '.join('source.' + k for k in OPTIONS)}")
    out = OPTIONS | {k: str(v) for k, v in options.items()}
    _resize(out["resize"])
    return out


def _resize(text: str) -> tuple[int, int] | None:
    if not text:
        return None
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise SourceError(f"'source.resize' = {text!r}: write HEIGHTxWIDTH in pixels, e.g. '28x28'")
    return int(parts[0]), int(parts[1])


def describe(name: str) -> str:
    """Where a source loads from (for the start-up line), or DatasetUnavailable / SourceError."""
    kind, location = parse(name)
    path = _local(kind, location)
    if kind == "py":
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*", location):
            raise SourceError(f"dataset {name!r}: write py:package.module:function")
        if path is None:
            raise SourceError(f"dataset {name!r}: module {location.partition(':')[0]!r} cannot be found; install it "
                              f"or put the folder that holds it on PYTHONPATH")
        return f"python {location}"
    if path is None:
        reason = _hub_unavailable()
        if reason and os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("1", "true", "yes", "on"):
            raise DatasetUnavailable(f"dataset {name!r}: {location!r} is no local path and {reason}; give a "
                                     f"save_to_disk folder or parquet files (hf:<path>) or run with network access")
        return f"the hub ({location})"
    if not os.path.exists(path):
        raise SourceError(f"dataset {name!r}: {path} does not exist")
    if kind in ("npz", "csv") and not os.path.isfile(path):
        raise SourceError(f"dataset {name!r}: {path} is not a file")
    if kind == "folder" and not os.path.isdir(path):
        raise SourceError(f"dataset {name!r}: {path} is not a folder")
    return f"{kind} {path}"


# ---------------------------------------------------------------- readers: raw x, labels, groups, pixels?

def _read_images(paths: list[str], where: str, resize: tuple[int, int] | None) -> np.ndarray:
    """Decode images to uint8 (N, C, H, W): grey when every one is grey, else RGB; one size or a resize."""
    from PIL import Image

    images = []
    for p in paths:
        with Image.open(p) if isinstance(p, str) else Image.open(io.BytesIO(p)) as im:
            im.load()
            images.append(im.copy())
    if not images:
        raise SourceError(f"{where}: no images")
    mode = "L" if all(im.mode in ("L", "1", "I;16", "I") for im in images) else "RGB"
    if resize is None:
        sizes = {im.size for im in images}
        if len(sizes) > 1:
            (w0, h0), (w1, h1) = sorted(sizes)[:2]
            raise SourceError(f"{where}: images of mixed sizes ({len(sizes)} sizes, e.g. {h0}x{w0} and {h1}x{w1} "
                              f"pixels); set 'source.resize' = 'HEIGHTxWIDTH' to resize them all")
    else:
        images = [im.resize((resize[1], resize[0])) for im in images]
    x = np.stack([np.asarray(im.convert(mode)) for im in images])
    return x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)


def _read_folder(path: str, opts: dict):
    classes = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)) and not d.startswith("."))
    files, labels = [], []
    for c in classes:
        found = sorted(f for f in os.listdir(os.path.join(path, c)) if f.lower().endswith(IMAGE_SUFFIXES))
        files += [os.path.join(path, c, f) for f in found]
        labels += [c] * len(found)
    if not files:
        raise SourceError(f"image folder {path}: no PNG/JPEG files in sub-folders (one sub-folder per class "
                          f"expected; found {len(classes)} sub-folders)")
    return _read_images(files, f"image folder {path}", _resize(opts["resize"])), np.asarray(labels), None, True


def _read_npz(path: str, opts: dict):
    with np.load(path, allow_pickle=False) as f:
        missing = [k for k in ("x", "y") if k not in f.files]
        if missing:
            raise SourceError(f"npz file {path}: missing array(s) {missing}; it has {f.files} (need x, y and "
                              f"optional groups)")
        x, y = f["x"], f["y"]
        groups = f["groups"] if "groups" in f.files else None
    if x.ndim == 4 and x.shape[1] not in (1, 3, 4) and x.shape[-1] in (1, 3, 4):
        x = x.transpose(0, 3, 1, 2)  # channels last -> first
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim not in (2, 4) or len(x) != len(y) or y.ndim != 1 or (groups is not None and groups.shape != y.shape):
        raise SourceError(f"npz file {path}: x {x.shape}, y {y.shape}, groups "
                          f"{None if groups is None else groups.shape}; need N vectors or images and N labels")
    return x, y, groups, x.dtype == np.uint8


def _read_py(location: str, opts: dict):
    import importlib

    module, _, attr = location.partition(":")
    made = getattr(importlib.import_module(module), attr, None)
    if not callable(made):
        raise SourceError(f"dataset 'py:{location}': {module} has no callable {attr!r}")
    out = made()
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise SourceError(f"dataset 'py:{location}': the function returned {type(out).__name__}; return (x, y) or "
                          f"(x, y, groups) arrays")
    x, y = np.asarray(out[0]), np.asarray(out[1])
    groups = np.asarray(out[2]) if len(out) == 3 else None
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim not in (2, 4) or y.ndim != 1 or len(x) != len(y) or (groups is not None and groups.shape != y.shape):
        raise SourceError(f"dataset 'py:{location}': x {x.shape}, y {y.shape}; need N vectors or images and N labels")
    return x, y, groups, x.dtype == np.uint8


def _column(names: list[str], chosen: str, auto: tuple[str, ...], what: str, where: str, key: str) -> str:
    if chosen:
        if chosen not in names:
            raise SourceError(f"{where}: {what} column {chosen!r} not found; columns are {names}")
        return chosen
    for n in auto:
        if n in names:
            return n
    raise SourceError(f"{where}: no {what} column (looked for {', '.join(auto)}); columns are {names}; "
                      f"set '{key}'")


def _read_csv(path: str, opts: dict):
    import pandas as pd

    table = pd.read_csv(path)
    names = [str(c) for c in table.columns]
    where = f"csv file {path}"
    label = _column(names, opts["label-column"], LABEL_NAMES, "label", where, "source.label-column")
    group = _column(names, opts["group-column"], (), "group", where, "source.group-column") \
        if opts["group-column"] else None
    features = [c.strip() for c in opts["x-column"].split(",") if c.strip()] or \
        [c for c in names if c not in (label, group)]
    missing = [c for c in features if c not in names]
    if missing or not features:
        raise SourceError(f"{where}: feature column(s) {missing or '(none)'} not found; columns are {names}")
    bad = [c for c in features if not pd.api.types.is_numeric_dtype(table[c])]
    if bad:
        raise SourceError(f"{where}: feature column(s) {bad} are not numeric; list the numeric ones in "
                          f"'source.x-column' or encode them")
    x = table[features].to_numpy(np.float32)
    if not np.isfinite(x).all():
        rows = np.flatnonzero(~np.isfinite(x).all(axis=1))
        raise SourceError(f"{where}: {len(rows)} row(s) have missing or infinite features (first: data row "
                          f"{rows[0] + 1}); fill or drop them")
    return x, table[label].to_numpy(), None if group is None else table[group].to_numpy(), False


def _hf_splits(path: str | None, location: str):
    """{split: datasets.Dataset} of a save_to_disk folder, parquet file(s) or a hub id."""
    import datasets

    if path is None:
        try:
            loaded = datasets.load_dataset(location)
        except (ConnectionError, FileNotFoundError) as err:  # offline without a cached copy, or no such dataset
            raise SourceError(f"hf source {location!r} is no local path and cannot be loaded from the hub: {err}; "
                              f"give a save_to_disk folder or parquet files (hf:<path>)") from None
    elif os.path.isdir(path) and any(os.path.exists(os.path.join(path, f)) for f in
                                     ("dataset_dict.json", "dataset_info.json", "state.json")):
        loaded = datasets.load_from_disk(path)
    else:
        files = [path] if os.path.isfile(path) else sorted(glob.glob(os.path.join(path, "**", "*.parquet"),
                                                                     recursive=True))
        if not files:
            raise SourceError(f"hf source {path}: neither a save_to_disk folder nor parquet files")
        by_split: dict[str, list[str]] = {}
        for f in files:
            base = os.path.basename(f)
            split = next((s for s in SPLIT_ORDER if base.startswith(s)), "train")
            by_split.setdefault(split, []).append(f)
        loaded = datasets.load_dataset("parquet", data_files=by_split)
    return {"train": loaded} if isinstance(loaded, datasets.Dataset) else dict(loaded)


def _read_hf(path: str | None, location: str, opts: dict):
    import datasets

    splits = _hf_splits(path, location)
    where = f"hf source {location}"
    wanted = [s.strip() for s in opts["splits"].split(",") if s.strip()]
    if wanted:
        unknown = [s for s in wanted if s not in splits]
        if unknown:
            raise SourceError(f"{where}: split(s) {unknown} not found; it has {sorted(splits)} ('source.splits')")
        order = wanted
    else:
        order = [s for s in SPLIT_ORDER if s in splits] + sorted(s for s in splits if s not in SPLIT_ORDER)
    names = list(splits[order[0]].column_names)
    label = _column(names, opts["label-column"], LABEL_NAMES, "label", where, "source.label-column")
    xcol = _column(names, opts["x-column"], X_NAMES, "image/feature", where, "source.x-column")
    group = _column(names, opts["group-column"], (), "group", where, "source.group-column") \
        if opts["group-column"] else None
    xs, ys, gs, pixels = [], [], [], False
    for s in order:
        ds = splits[s]
        missing = [c for c in (xcol, label, group) if c and c not in ds.column_names]
        if missing:
            raise SourceError(f"{where}: split {s!r} lacks column(s) {missing}; it has {ds.column_names}")
        if isinstance(ds.features[xcol], datasets.Image):
            cells = ds.cast_column(xcol, datasets.Image(decode=False))[xcol]
            raw = [c["bytes"] if c.get("bytes") is not None else c["path"] for c in cells]
            xs.append(_read_images(raw, f"{where} split {s!r}", _resize(opts["resize"])))
            pixels = True
        else:
            xs.append(np.asarray(ds.with_format("numpy")[xcol]))
        ys.append(np.asarray(ds[label]))
        gs.append(np.asarray(ds[group]) if group else None)
    if len({x.shape[1:] for x in xs}) > 1:
        raise SourceError(f"{where}: splits {order} have inputs of shapes {[x.shape[1:] for x in xs]}; "
                          f"set 'source.resize' or pick one split with 'source.splits'")
    x = np.concatenate(xs)
    if not pixels and x.ndim == 3:
        x = x[:, None]
    return x, np.concatenate(ys), np.concatenate(gs) if group else None, pixels or x.dtype == np.uint8


# ---------------------------------------------------------------- the pool

def _labels(raw: np.ndarray, where: str) -> tuple[np.ndarray, int]:
    """Integer labels 0..K-1 kept as they are; any others numbered in sorted order."""
    raw = np.asarray(raw)
    if raw.dtype.kind in "iub" and len(raw) and raw.min() >= 0:
        y, k = raw.astype(np.int64), int(raw.max()) + 1
    else:
        values, y = np.unique(raw.astype(str) if raw.dtype.kind == "O" else raw, return_inverse=True)
        y, k = y.reshape(-1).astype(np.int64), len(values)
    present = len(np.unique(y))
    if present < 2:
        raise SourceError(f"{where}: one class only ({present} distinct label in {len(y)} samples); "
                          f"classification needs at least two")
    return y, k


def _scale(x: np.ndarray, pixels: bool, normalize: str, where: str) -> np.ndarray:
    if pixels:
        x = x.astype(np.float32) / np.float32(255.0)
    elif normalize != "dataset":
        raise SourceError(f"{where}: its features are not pixels; normalize must be 'dataset' (standardised "
                          f"per feature), got {normalize!r}")
    else:
        x = x.astype(np.float32)
    axes = (0,) if x.ndim == 2 else (0, 2, 3)
    mean, std = x.mean(axis=axes, dtype=np.float64), x.std(axis=axes, dtype=np.float64)
    if pixels and normalize != "dataset":
        mean, std = (np.asarray(v, np.float64) for v in _stats(normalize, tuple(mean), tuple(std)))
    std = np.where(std > 0, std, 1.0)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return ((x - mean.reshape(shape).astype(np.float32)) / std.reshape(shape).astype(np.float32)).astype(np.float32)


@functools.lru_cache(maxsize=8)
def _load(name: str, stamp: str, options: tuple, normalize: str) -> Dataset:
    kind, location = parse(name)
    opts = dict(options)
    path = _local(kind, location)
    describe(name)
    if kind in ("folder", "npz", "py") and (opts["x-column"] or opts["label-column"] or opts["group-column"]):
        raise SourceError(f"dataset {name!r}: 'source.x-column', 'source.label-column' and 'source.group-column' are "
                          f"for csv and hf sources")
    if kind != "hf" and opts["splits"]:
        raise SourceError(f"dataset {name!r}: 'source.splits' is for hf sources")
    readers = {"folder": _read_folder, "npz": _read_npz, "csv": _read_csv,
               "py": lambda _, o: _read_py(location, o), "hf": lambda p, o: _read_hf(p, location, o)}
    x, raw_y, raw_groups, pixels = readers[kind](path, opts)
    where = f"dataset {name!r}"
    if x.dtype.kind not in "iufb":
        raise SourceError(f"{where}: inputs of type {x.dtype} are not numbers")
    y, k = _labels(raw_y, where)
    groups = None if raw_groups is None else np.unique(np.asarray(raw_groups).astype(str), return_inverse=True)[1]
    return Dataset(name, _scale(x, pixels, normalize, where), y, k,
                   None if groups is None else groups.reshape(-1).astype(np.int64))


def load_source(name: str, options: dict | None = None, normalize: str = "dataset") -> Dataset:
    """The pool of ``name`` (``'<kind>:<location>'``), loaded once per process and version of its files."""
    opts = check_options(dict(options or {}))
    return _load(name, fingerprint(name), tuple(sorted(opts.items())), normalize)
