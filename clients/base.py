"""Client side base: a client's data as tensors, its persistent state, and the method interface.

A method's client subclasses ``ClientMethod`` and implements ``fit`` (one round of local training,
returning the records to upload) and ``evaluate`` (its personalised model on its own test split).
State that must survive between rounds (personal heads, local models) goes through
``ClientEnv.save_model`` / ``load_model``, which store ArrayRecords in Flower's ``context.state``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict

from clients.models import SplitModel, build_model, default_model, pick_device
from clients.training import LossFn, cross_entropy, train_epochs
from fedcore.config import Config
from partitions import build_splits, load_dataset


@dataclass(frozen=True)
class ClientData:
    """One client's train and test split, already on its device."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    train_label_counts: np.ndarray
    test_label_counts: np.ndarray

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    @property
    def num_test(self) -> int:
        return len(self.y_test)


def _frozen(d: dict) -> tuple:
    return tuple(sorted(d.items()))


@lru_cache(maxsize=4)
def _federated_data(dataset: str, partition: str, num_clients: int, seed: int, data_dir: str,
                    dataset_params: tuple, partition_params: tuple):
    """The whole dataset and every client's split, computed once per process (deterministic)."""
    data = load_dataset(dataset, num_clients=num_clients, seed=seed, data_dir=data_dir, params=dict(dataset_params))
    splits = build_splits(data, partition, num_clients, seed, dict(partition_params))
    return data, splits


def dataset_params(cfg: Config) -> dict:
    """Run-config keys ``<dataset>.*`` (e.g. ``synthetic.alpha``) passed to the dataset loader."""
    return cfg.section(cfg["dataset"])


@lru_cache(maxsize=64)
def _client_data(key: tuple, pid: int, device: str) -> ClientData:
    data, splits = _federated_data(*key)
    if not 0 <= pid < len(splits):
        raise ValueError(f"partition-id {pid} is outside 0..{len(splits) - 1}")
    split = splits[pid]
    dev = torch.device(device)

    def tensors(idx):
        return (torch.as_tensor(data.x[idx], dtype=torch.float32, device=dev),
                torch.as_tensor(data.y[idx], dtype=torch.long, device=dev))

    x_train, y_train = tensors(split.train)
    x_test, y_test = tensors(split.test)
    return ClientData(
        x_train, y_train, x_test, y_test, data.num_classes, tuple(data.input_shape),
        np.bincount(data.y[split.train], minlength=data.num_classes),
        np.bincount(data.y[split.test], minlength=data.num_classes),
    )


def load_client_data(cfg: Config, pid: int, num_clients: int, device: torch.device) -> ClientData:
    key = (cfg["dataset"], cfg["partition"], num_clients, cfg["seed"], cfg["data-dir"],
           _frozen(dataset_params(cfg)), _frozen(cfg.partition_params()))
    return _client_data(key, pid, str(device))


def model_name(cfg: Config, input_shape: tuple[int, ...]) -> str:
    return default_model(input_shape) if cfg["model"] == "auto" else cfg["model"]


def make_model(cfg: Config, input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """The seeded initial model: identical on the server and on every client."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg["seed"])
        return build_model(model_name(cfg, input_shape), tuple(input_shape), num_classes)


_threads_set = False


def set_client_threads(cfg: Config) -> None:
    """Give torch this client's CPU share once per process.

    ``client-threads`` wins; else ``OMP_NUM_THREADS``, which Ray sets to each simulated client's CPU
    count (several actors share the cores); else torch's default, all cores (one SuperNode per machine).
    """
    global _threads_set
    if _threads_set:
        return
    threads = cfg["client-threads"] or int(os.environ.get("OMP_NUM_THREADS") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    _threads_set = True


class ClientEnv:
    """Everything a method's client needs for one message: config, data, device, state, seeds."""

    def __init__(self, cfg: Config, pid: int, num_clients: int, state: RecordDict, server_round: int = 0):
        self.cfg = cfg
        self.hp = cfg.hparams()
        self.pid = pid
        self.num_clients = num_clients
        self.state = state
        self.server_round = server_round
        self.device = pick_device(cfg["device"])
        self.data = load_client_data(cfg, pid, num_clients, self.device)

    def new_model(self) -> SplitModel:
        return make_model(self.cfg, self.data.input_shape, self.data.num_classes).to(self.device)

    def generator(self, tag: int = 0) -> torch.Generator:
        """A CPU generator seeded by (seed, client, round, tag): reproducible shuffles per client and round."""
        seed = int(np.random.SeedSequence([self.cfg["seed"], self.pid, self.server_round, tag]).generate_state(1)[0])
        return torch.Generator().manual_seed(seed)

    def optimizer(self, params, lr: float | None = None) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.cfg["lr"] if lr is None else lr,
                               momentum=self.cfg["momentum"], weight_decay=self.cfg["weight-decay"])

    # --- persistent state (Flower context.state)
    def load_model(self, name: str = "model") -> SplitModel:
        """The model saved under ``name`` in an earlier round; the seeded initial one in the first round."""
        model = self.new_model()
        record = self.state.array_records.get(name)
        if record is not None:
            model.load_state_dict(record.to_torch_state_dict())
        return model

    def save_model(self, model: torch.nn.Module, name: str = "model") -> None:
        self.state[name] = ArrayRecord(model.state_dict())


@dataclass
class EvalResult:
    loss: float
    correct: int
    num_examples: int


class ClientMethod:
    """One method's client: ``fit`` returns (records to upload, metrics); ``evaluate`` scores its model."""

    def __init__(self, env: ClientEnv):
        self.env = env
        self.cfg = env.cfg
        self.hp = env.hp
        self.data = env.data

    def fit(self, content: RecordDict) -> tuple[dict[str, ArrayRecord], dict]:
        raise NotImplementedError

    def evaluate(self, content: RecordDict) -> EvalResult:
        raise NotImplementedError

    def train(self, model: torch.nn.Module, *, epochs: int | None = None, params=None, tag: int = 0,
              loss_fn: LossFn = cross_entropy, x: torch.Tensor | None = None) -> float:
        """SGD on this client's training set: ``local-epochs`` epochs of all ``model`` parameters unless
        told otherwise; ``x`` replaces the inputs (e.g. features cached from a fixed body); ``tag``
        picks a shuffle stream of its own."""
        return train_epochs(model, self.data.x_train if x is None else x, self.data.y_train,
                            epochs=self.cfg["local-epochs"] if epochs is None else epochs,
                            batch_size=self.cfg["batch-size"],
                            optimizer=self.env.optimizer(model.parameters() if params is None else params),
                            generator=self.env.generator(tag), loss_fn=loss_fn)

    # --- helpers shared by the weight-exchanging methods
    def model_from(self, content: RecordDict, record: str) -> SplitModel:
        """A fresh model with the received tensors loaded (all or a subset, e.g. only the body)."""
        model = self.env.new_model()
        self.load_weights(model, content, record)
        return model

    @staticmethod
    def load_weights(model: torch.nn.Module, content: RecordDict, record: str) -> None:
        state = content.array_records[record].to_torch_state_dict()
        missing = set(state) - set(model.state_dict())
        if missing:
            raise ValueError(f"received tensors the model does not have: {sorted(missing)[:5]}")
        model.load_state_dict(state, strict=False)
