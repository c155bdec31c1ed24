"""Client side base: a client's environment (config, data from ``clients/data.py``, device, persistent
state) and the method interface.

A method's client subclasses ``ClientMethod`` and implements ``fit`` (one round of local training,
returning the records to upload) and ``evaluate`` (its personalised model on its own test split,
which the base repeats on the client's validation split when it has one: ``evaluate_splits``);
``prepare`` answers the preparation phase (round 0) of methods that have one, and ``build_model``
picks the client's architecture. State that must survive between rounds (personal heads, local
models, relation modules, activation maps, counters) goes through the ``ClientEnv.save_*`` /
``load_*`` helpers, which store records in Flower's ``context.state``.
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from clients.data import load_client_data
from clients.training import (LossFn, StepCallback, class_means, crop_flip, cross_entropy, extract_features,
                              train_loop)
from fedcore import determinism, wire
from fedcore.config import Config
from fedcore.models import SplitModel, pick_device, seeded_model

META = "meta"  # context.state ConfigRecord: {"state-round": round in which the state was last written}

AUGMENT_TAG = 10_000  # crop/flip offsets: a stream apart from every shuffle stream (tag + this)


def set_client_threads(cfg: Config) -> None:
    """Give torch this client's CPU share.

    ``client-threads`` wins; else ``OMP_NUM_THREADS``, which Ray sets to each simulated client's CPU
    count (several actors share the cores); else torch's default, all cores (one SuperNode per machine).
    """
    threads = cfg["client-threads"] or int(os.environ.get("OMP_NUM_THREADS") or 0)
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def message_seed(seed: int, pid: int, server_round: int, phase: str) -> int:
    """One 63-bit seed per (run seed, client, round, phase): what every message's randomness
    (dropout, augmentation, sampling inside a method) starts from, under Ray and in deployment alike."""
    return int(np.random.SeedSequence([seed, pid, server_round, wire.PHASES.index(phase)]).generate_state(
        2, np.uint64)[0] >> np.uint64(1))


class ClientEnv:
    """Everything a method's client needs for one message: config, data, device, state, seeds.

    ``config`` is the message's config record as a dict: the base keys (``server-round``,
    ``phase``) plus whatever the strategy added (``train_config``); methods read their modes and
    flags from it, never from the presence of a record.
    """

    def __init__(self, cfg: Config, pid: int, num_clients: int, state: RecordDict, server_round: int = 0,
                 config: dict | None = None):
        self.cfg = cfg
        self.hp = cfg.hparams()
        self.pid = pid
        self.num_clients = num_clients
        self.state = state
        self.server_round = server_round
        self.config = dict(config or {wire.SERVER_ROUND: server_round})
        self.device = pick_device(cfg["device"])
        determinism.apply(cfg["deterministic"], self.device)  # before this process's first CUDA work
        self.data = load_client_data(cfg, pid, num_clients, self.device)
        meta = state.config_records.get(META)
        self.state_round = int(meta[wire.STATE_ROUND]) if meta is not None and wire.STATE_ROUND in meta else 0
        self.state_saved = False
        self.state_folder = None  # where clients/app.py keeps this client's state on disk

    @property
    def lr(self) -> float:
        """This message's learning rate: the strategy's ``lr`` config value if it sent one (a decay
        schedule), else the run config's ``lr``."""
        return float(self.config.get(wire.LR, self.cfg["lr"]))

    def generator(self, tag: int = 0) -> torch.Generator:
        """A CPU generator seeded by (seed, client, round, tag): reproducible shuffles per client and round."""
        seed = int(np.random.SeedSequence([self.cfg["seed"], self.pid, self.server_round, tag]).generate_state(1)[0])
        return torch.Generator().manual_seed(seed)

    def optimizer(self, params, lr: float | None = None, momentum: float | None = None,
                  weight_decay: float | None = None) -> torch.optim.Optimizer:
        """Plain SGD with the run config's momentum and weight decay unless told otherwise."""
        return torch.optim.SGD(params, lr=self.lr if lr is None else lr,
                               momentum=self.cfg["momentum"] if momentum is None else momentum,
                               weight_decay=self.cfg["weight-decay"] if weight_decay is None else weight_decay)

    # --- persistent state (Flower context.state); every save marks the state as written this round
    def _mark_saved(self) -> None:
        self.state_saved = True
        self.state[META] = ConfigRecord({wire.STATE_ROUND: self.server_round})

    def save_module(self, name: str, module: torch.nn.Module) -> None:
        """Keep a module's parameters and buffers until the next message."""
        self.state[name] = wire.pack_arrays(module.state_dict())
        self._mark_saved()

    def load_module(self, name: str, module: torch.nn.Module) -> bool:
        """Load what ``save_module`` kept into ``module``; False (module untouched) if nothing was kept."""
        record = self.state.array_records.get(name)
        if record is None:
            return False
        module.load_state_dict(wire.torch_arrays(record))
        return True

    def save_arrays(self, name: str, arrays: dict) -> None:
        """Keep named numpy arrays or tensors (maps, previous features, ...)."""
        self.state[name] = wire.pack_arrays(arrays)
        self._mark_saved()

    def load_arrays(self, name: str) -> dict[str, np.ndarray] | None:
        """Writable copies of what ``save_arrays`` kept, or None."""
        record = self.state.array_records.get(name)
        return None if record is None else {k: np.array(v) for k, v in wire.unpack_arrays(record).items()}

    def save_scalars(self, name: str, values: dict) -> None:
        """Keep numbers, strings or bools (counters, the previous batch loss, ...)."""
        self.state[name] = ConfigRecord(dict(values))
        self._mark_saved()

    def load_scalars(self, name: str) -> dict | None:
        record = self.state.config_records.get(name)
        return None if record is None else dict(record)

    def save_optimizer(self, name: str, optimizer: torch.optim.Optimizer) -> None:
        """Keep an optimiser's per-parameter state (momentum buffers, Adam moments, step counts);
        its hyperparameters come from the code that builds it again."""
        arrays = {f"{idx}/{key}": torch.as_tensor(value)
                  for idx, slots in optimizer.state_dict()["state"].items() for key, value in slots.items()}
        self.state[name] = wire.pack_arrays(arrays)
        self._mark_saved()

    def load_optimizer(self, name: str, optimizer: torch.optim.Optimizer) -> bool:
        arrays = self.load_arrays(name)
        if arrays is None:
            return False
        state: dict[int, dict] = {}
        for key, value in arrays.items():
            idx, slot = key.split("/", 1)
            state.setdefault(int(idx), {})[slot] = torch.as_tensor(value)
        # torch places each slot by its own rule: beside its parameter (on the client's GPU), except
        # Adam-like step counts, which stay on the CPU unless the optimiser is capturable or fused
        optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
        return True


@dataclass
class EvalResult:
    """A client's evaluation; ``metrics`` are method-specific numbers averaged over clients by the
    server (e.g. ``{"relation-acc": 0.97}``), each appearing in rounds.csv as ``eval_<name>``."""

    loss: float
    correct: int
    num_examples: int
    metrics: dict = field(default_factory=dict)


class ClientMethod:
    """One method's client.

    Parameters
    ----------
    env : ClientEnv
        Config, data, device, this message's config record and the client's persistent state.
    """

    def __init__(self, env: ClientEnv):
        self.env = env
        self.cfg = env.cfg
        self.hp = env.hp
        self.data = env.data

    # --- the interface
    def fit(self, content: RecordDict) -> tuple[dict[str, ArrayRecord], dict]:
        """One round of local training.

        Parameters
        ----------
        content : RecordDict
            The train message: the strategy's ``train_payload`` records (its ``config`` record is
            already in ``self.env.config``).

        Returns
        -------
        tuple[dict[str, ArrayRecord], dict]
            Records to upload (matching the strategy's ``reply_schema``) and metrics
            (``train-loss`` and any ``m.<name>`` method metrics; the base adds identity and size).
        """
        raise NotImplementedError

    def evaluate(self, content: RecordDict) -> EvalResult:
        """Score the client's personalised model on its own test split (every client, every
        evaluation round, sampled or not). Read the split from ``self.data.x_test``/``y_test``:
        ``evaluate_splits`` runs this again with the validation split in their place."""
        raise NotImplementedError

    def evaluate_splits(self, content: RecordDict) -> tuple[EvalResult, EvalResult | None]:
        """``evaluate`` on the test split and, when the client holds a validation split, on that too.

        The validation score comes from a second ``evaluate`` call, by a copy of this client whose
        test split is its validation split, started from the same global random state (torch,
        numpy, Python) as the first: both calls build the same personalised model (an evaluation
        that fine-tunes draws the same batches and dropout masks), so the two scores are of one
        model, and every method gets validation from this one place. The test call runs first, from
        the state the message started with, so its numbers are those of a run without validation.
        """
        states = _random_states() if self.data.num_val else None
        test = self.evaluate(content)
        if states is None:
            return test, None
        _set_random_states(states)
        env = copy.copy(self.env)  # shares the client's state records; only its data differs
        env.data = self.data.validation_as_test()
        val = type(self)(env).evaluate(content)
        self.env.state_saved |= env.state_saved
        return test, val

    def prepare(self, content: RecordDict) -> tuple[dict[str, ArrayRecord], dict]:
        """Answer the preparation phase (round 0) of a method whose strategy has one (same return
        as ``fit``). Methods without one never get this call."""
        raise NotImplementedError(f"{type(self).__name__} has no preparation phase")

    def build_model(self) -> SplitModel:
        """This client's architecture, seeded: the run's model by default, identical on every client
        and on the server. Override for per-client architectures (pFedPM-mh's widths by partition id)."""
        return seeded_model(self.cfg["model"], self.data.input_shape, self.data.num_classes, self.cfg["seed"])

    # --- models in state
    def new_model(self) -> SplitModel:
        return self.build_model().to(self.env.device)

    def load_model(self, name: str = "model") -> SplitModel:
        """The model saved under ``name`` in an earlier round; the seeded initial one in the first round."""
        model = self.new_model()
        self.env.load_module(name, model)
        return model

    def save_model(self, model: torch.nn.Module, name: str = "model") -> None:
        self.env.save_module(name, model)

    # --- training
    def train(self, model: torch.nn.Module, *, epochs: int | None = None, steps: int | None = None, params=None,
              optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
              lr: float | None = None, tag: int = 0, loss_fn: LossFn = cross_entropy, x: torch.Tensor | None = None,
              y: torch.Tensor | None = None, batch_size: int | None = None,
              after_step: StepCallback | None = None, full_batches: bool = False,
              proximal: tuple[Sequence[torch.Tensor], float] | None = None) -> float:
        """Mini-batch training on this client's training set; returns the mean batch loss.

        Defaults: ``local-steps`` steps if set, else ``local-epochs`` epochs; ``batch-size``; SGD
        over all of ``model``'s parameters at the message's learning rate. ``steps`` replaces epochs with a step budget (reshuffled
        across epochs); ``params``/``lr`` narrow the default optimiser and ``optimizer`` replaces it
        (one or several, all stepped on the same loss); ``x``/``y`` replace the data (features cached
        from a fixed body); ``tag`` picks a shuffle stream of its own; ``after_step`` runs after
        every step; ``full_batches`` makes every batch of a step budget exactly ``batch_size`` long;
        ``proximal = (anchor, c)`` adds c * ||w - anchor||^2 to the loss (``training.add_proximal_pull``).
        """
        if epochs is None and steps is None:
            if self.cfg["local-steps"] > 0:
                steps = self.cfg["local-steps"]
            else:
                epochs = self.cfg["local-epochs"]
        if optimizer is None:
            optimizer = self.env.optimizer(model.parameters() if params is None else params, lr=lr)
        augment = None
        if x is None and self.cfg["augmentation"] == "crop-flip":  # raw images, not features cached from a body
            crops = self.env.generator(tag + AUGMENT_TAG)
            augment = lambda batch: crop_flip(batch, crops)  # noqa: E731
        return train_loop(model, self.data.x_train if x is None else x, self.data.y_train if y is None else y,
                          epochs=epochs, steps=steps, batch_size=batch_size or self.cfg["batch-size"],
                          optimizer=optimizer, generator=self.env.generator(tag), loss_fn=loss_fn,
                          after_step=after_step, full_batches=full_batches, augment=augment, proximal=proximal)

    # --- the upload of the feature-exchanging methods (FedProto, FedGH)
    def class_feature_upload(self, model: SplitModel) -> dict:
        """The per-class mean body features of the whole training set (eval mode), with their class ids and
        counts, as the ``wire.CLASS_FEATURES`` record."""
        ids, means, counts = class_means(extract_features(model, self.data.x_train), self.data.y_train,
                                         self.data.num_classes)
        return {wire.CLASS_FEATURES: wire.pack_class_features(*map(wire.to_host, (ids, means, counts)))}

    # --- helpers shared by the weight-exchanging methods
    def model_from(self, content: RecordDict, record: str) -> SplitModel:
        """A fresh model with the received tensors loaded (all or a subset, e.g. only the body)."""
        model = self.new_model()
        self.load_weights(model, content, record)
        return model

    @staticmethod
    def load_weights(model: torch.nn.Module, content: RecordDict, record: str) -> None:
        state = wire.torch_arrays(content.array_records[record])
        missing = set(state) - set(model.state_dict())
        if missing:
            raise ValueError(f"received tensors the model does not have: {sorted(missing)[:5]}")
        model.load_state_dict(state, strict=False)

    @staticmethod
    def frozen(modules: Iterable[torch.nn.Module]):
        """Context manager: ``requires_grad=False`` on these modules inside, restored after."""
        return _Frozen(list(modules))


def _random_states() -> tuple:
    """The global generators' states (torch's CPU and CUDA ones, numpy's, Python's)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda, np.random.get_state(), random.getstate()


def _set_random_states(states: tuple) -> None:
    cpu, cuda, numpy_state, python_state = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
    np.random.set_state(numpy_state)
    random.setstate(python_state)


class _Frozen:
    def __init__(self, modules: list[torch.nn.Module]):
        self.params = [p for m in modules for p in m.parameters()]

    def __enter__(self):
        self.flags = [p.requires_grad for p in self.params]
        for p in self.params:
            p.requires_grad_(False)

    def __exit__(self, *exc):
        for p, flag in zip(self.params, self.flags):
            p.requires_grad_(flag)
