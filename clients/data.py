"""One client's data: its train, test and validation split as tensors on its device.

Loaded once per process from the partition cache on disk (``clients/partition_cache.py``), else from
the whole dataset and its splits (``partitions.federated_data``), which are then cached: a ClientApp
process per message does not load and split the dataset each time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from clients import partition_cache
from fedcore import wire
from fedcore.config import Config
from partitions import federated_data


@dataclass(frozen=True)
class ClientData:
    """One client's train, test and validation split (empty when ``val-fraction`` is 0), already on
    its device. Validation samples come out of the training pool: ``x_train`` never holds them."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    train_label_counts: np.ndarray
    test_label_counts: np.ndarray
    x_val: torch.Tensor
    y_val: torch.Tensor

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    @property
    def num_test(self) -> int:
        return len(self.y_test)

    @property
    def num_val(self) -> int:
        return len(self.y_val)

    def validation_as_test(self) -> ClientData:
        """The same client with its validation split in the place of its test split: what a method's
        ``evaluate``, which scores ``x_test``/``y_test``, sees when the base scores validation."""
        return dataclasses.replace(self, x_test=self.x_val, y_test=self.y_val, test_label_counts=np.bincount(
            wire.to_host(self.y_val), minlength=self.num_classes))


_federated_data = lru_cache(maxsize=4)(federated_data)  # the whole dataset and every split, once per process


@lru_cache(maxsize=4096)  # every client of an in-process run: one process may serve hundreds
def _client_data(key: tuple, pid: int, device: str) -> ClientData:
    """One client's split as tensors: from the partition cache on disk if there, else from the whole
    dataset (then cached), so a ClientApp process per message does not load and split it each time."""
    path = partition_cache.cache_path(key, pid)
    cached = partition_cache.load(path)
    if cached is None:
        data, splits = _federated_data(*key)
        if not 0 <= pid < len(splits):
            raise ValueError(f"partition-id {pid} is outside 0..{len(splits) - 1}")
        split = splits[pid]
        cached = {"x_train": data.x[split.train], "y_train": data.y[split.train],
                  "x_test": data.x[split.test], "y_test": data.y[split.test],
                  "x_val": data.x[split.val], "y_val": data.y[split.val],
                  "num_classes": data.num_classes, "input_shape": tuple(data.input_shape)}
        partition_cache.store(path, {k: cached[k] for k in partition_cache.FIELDS}, data.num_classes,
                              tuple(data.input_shape))
    dev = torch.device(device)

    def tensors(x, y):
        return (torch.as_tensor(x, dtype=torch.float32, device=dev), torch.as_tensor(y, dtype=torch.long, device=dev))

    x_train, y_train = tensors(cached["x_train"], cached["y_train"])
    x_test, y_test = tensors(cached["x_test"], cached["y_test"])
    x_val, y_val = tensors(cached["x_val"], cached["y_val"])
    num_classes = cached["num_classes"]
    return ClientData(
        x_train, y_train, x_test, y_test, num_classes, cached["input_shape"],
        np.bincount(cached["y_train"], minlength=num_classes), np.bincount(cached["y_test"], minlength=num_classes),
        x_val, y_val,
    )


def load_client_data(cfg: Config, pid: int, num_clients: int, device: torch.device) -> ClientData:
    return _client_data(cfg.data_key(num_clients), pid, str(device))
