"""Run configuration: one schema, validated once at start with errors that list the valid choices.

The run config is Flower's flat ``[tool.flwr.app.config]`` table (``--run-config`` overrides it).
Common keys live in ``_common_keys``; each method declares its own hyperparameters (``<method>.<key>``)
in its declaration (``fedcore/methods/<name>.py``), so a typo in any key stops the run before a single client
trains. Building the schema imports those plain modules only: no torch, no Flower, nothing to cache.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedcore.paper_settings import resolve_auto

AUGMENTATIONS = ("none", "crop-flip")  # clients/training.py: crop_flip
# fedcore/models.py: MODELS (tests/test_models.py checks they agree), named here so that checking a config needs no torch
USER_MODEL = r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*"  # package.module:factory (fedcore/user_models.py)
MODEL_NAMES = ("mlr", "dnn", "cnn", "fedavgcnn", "resnet8", "resnet18", "simplecnn", "protocnn", "protocnn-femnist",
               "resnet18-tv", "mupflcnn")


class ConfigError(ValueError):
    """A run-config key or value is wrong; the message says which and what is allowed."""


@dataclass(frozen=True)
class Key:
    """One run-config key: its default (which also fixes its type), help text and allowed values."""

    default: Any
    help: str
    choices: tuple | None = None
    low: float | None = None  # inclusive lower bound
    high: float | None = None  # inclusive upper bound
    low_open: bool = False  # the lower bound itself is not allowed
    high_open: bool = False  # the upper bound itself is not allowed
    kind: str = ""  # the value's type ("int", "float", "bool") where the default is "auto" and so cannot fix it
    pattern: str = ""  # a string value must match this regular expression in full
    pattern_help: str = ""  # what the pattern (or ``also``) allows, in words
    also: str = ""  # values matching this regular expression in full are allowed besides the choices

    def check(self, name: str, value: Any) -> Any:
        """Return ``value`` coerced to this key's type, or raise ``ConfigError``."""
        if self.kind and value == "auto":  # filled in from the method's paper setting (fedcore/paper_settings.py)
            return value
        kind = {"int": int, "float": float, "bool": bool}[self.kind] if self.kind else type(self.default)
        if kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"'{name}' must be true or false, got {value!r}")
        elif kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                else:
                    raise ConfigError(f"'{name}' must be an integer, got {value!r}")
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"'{name}' must be a number, got {value!r}")
            value = float(value)
            if not math.isfinite(value):
                raise ConfigError(f"'{name}' must be finite, got {value!r}")
        elif kind is str:
            if not isinstance(value, str):
                raise ConfigError(f"'{name}' must be a string, got {value!r}")
        if self.pattern and not re.fullmatch(self.pattern, value):
            raise ConfigError(f"'{name}' = {value!r} is not valid; use {self.pattern_help or self.pattern}")
        if self.choices is not None and value not in self.choices and not (self.also and re.fullmatch(self.also, value)):
            raise ConfigError(
                f"'{name}' = {value!r} is not valid; choose one of: {', '.join(map(str, self.choices))}"
                + (f"; or {self.pattern_help}" if self.also else "")
            )
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            op = ">" if self.low_open else ">="
            raise ConfigError(f"'{name}' = {value!r} is out of range; it must be {op} {self.low}")
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            op = "<" if self.high_open else "<="
            raise ConfigError(f"'{name}' = {value!r} is out of range; it must be {op} {self.high}")
        return value


AUTO_HELP = "; auto = the method's paper setting for the dataset, else the project default (fedcore/paper_settings.py)"


def _common_keys() -> dict[str, Key]:
    from partitions import DATASETS, PARTITIONS

    return {
        "method": Key("fedavg", "method to run (see the registry)"),  # choices filled in by schema()
        "dataset": Key("mnist5k", "dataset name, or your own data: folder:<dir> (one sub-folder of images per class), "
                       "npz:<file> (x, y, optional groups), csv:<file> (features and a label column), hf:<id, "
                       "save_to_disk folder or parquet>, py:<package.module:function> (partitions/sources.py)", choices=tuple(DATASETS),
                       also=r"(folder|npz|csv|hf|py):.+",
                       pattern_help="folder:<dir>, npz:<file>, csv:<file>, hf:<id or path> or py:<package.module:function>"),
        "normalize": Key("dataset", "input scaling: the dataset's own mean/std, (x-0.5)/0.5 ('half', as PFLlib and "
                         "Flower baselines), or [0, 1] ('unit')", choices=("dataset", "half", "unit")),
        "partition": Key("pathological", "how the data is split across clients; flwr:<Name> = a flwr-datasets "
                         "partitioner (partitions/flwr_partitioners.py)", choices=tuple(PARTITIONS),
                         also=r"flwr:[A-Za-z]+", pattern_help="flwr:<a flwr-datasets partitioner, e.g. DirichletPartitioner>"),
        "model": Key("auto", "model architecture; auto = the method's paper model for the dataset "
                     "(fedcore/paper_settings.py), else one picked for the input shape; package.module:factory = your own "
                     "(fedcore/user_models.py)", choices=("auto", *MODEL_NAMES), also=USER_MODEL,
                     pattern_help="package.module:factory (your own model)"),
        "num-server-rounds": Key(20, "federated rounds", low=1),
        "seed": Key(0, "one seed for partitioning, initialisation and sampling", low=0),
        "local-epochs": Key("auto", "local epochs per round" + AUTO_HELP, kind="int", low=1),
        "local-steps": Key("auto", "local SGD steps per round instead of epochs (reshuffled across epochs); 0 = use "
                           "epochs" + AUTO_HELP, kind="int", low=0),
        "batch-size": Key("auto", "local mini-batch size" + AUTO_HELP, kind="int", low=1),
        "lr": Key("auto", "local SGD learning rate" + AUTO_HELP, kind="float", low=0.0, low_open=True),
        "momentum": Key("auto", "local SGD momentum" + AUTO_HELP, kind="float", low=0.0, high=1.0),
        "weight-decay": Key("auto", "local SGD weight decay" + AUTO_HELP, kind="float", low=0.0),
        "fraction-train": Key("auto", "fraction of clients that train each round" + AUTO_HELP, kind="float", low=0.0,
                              high=1.0, low_open=True),
        "augmentation": Key("auto", "training-time image augmentation: crop-flip = a random crop of the image padded by "
                            "4 pixels and a horizontal flip with probability 1/2, drawn anew for every batch; none = off"
                            + AUTO_HELP, choices=("auto", *AUGMENTATIONS)),
        "min-replies": Key(1, "fewest valid replies a round needs to update the server state", low=1),
        "reply-norm-bound": Key(100.0, "drop a reply whose record norm exceeds this many times the round's median "
                                "norm (or the server state's); 0 = off", low=0.0),
        "eval-every": Key(1, "evaluate every client every this many rounds (and always after the last)", low=1),
        "fraction-evaluate": Key(1.0, "fraction of clients that evaluate in the rounds between the eval-every rounds "
                                 "(Flower's fraction_evaluate; seeded by the run seed like the training sample); "
                                 "1.0 = no evaluation between them. eval-every rounds and the last evaluate every "
                                 "client, and only those rounds choose a run's best round", low=0.0, high=1.0,
                                 low_open=True),
        "min-evaluate-clients": Key(2, "fewest clients a sampled evaluation asks (Flower's min_evaluate_nodes; at most "
                                    "all of them)", low=1),
        "results-dir": Key("results", "where runs write their results (an absolute path is safest)"),
        "run-name": Key("", "name of this run's results folder; empty = method-dataset-partition-seed-time"),
        "resume": Key(False, "continue the run in results-dir/run-name from its last checkpoint"),
        "overwrite": Key(False, "replace an existing results folder of the same run-name (else it is an error)"),
        "plots": Key(True, "draw the run's PNG plots at its end (accuracy, label counts, round matrices); "
                     "the CSV and JSON results are written either way"),
        "tracker": Key("none", "experiment tracking of the server's numbers: none, tensorboard (event files in the run "
                       "folder), wandb (offline run folder; the [wandb] extra), or both comma-separated "
                       "(server_app/tracking.py)"),
        "tracker-every": Key(10, "the tracker draws the recorded matrices (collaboration graph, attention) every this "
                             "many rounds and at the last", low=1),
        "tracker-group": Key("", "the tracker's group of runs (a comparison sets its preset); empty = none"),
        "checkpoint-keep": Key(2, "server checkpoints kept per run (one is written after every round)", low=1),
        "client-state-dir": Key("", "where clients keep their state between rounds on disk; "
                                "empty = results-dir/run-name/client-state (a node's state-dir node config wins)"),
        "data-dir": Key("", "cache for downloadable datasets; empty = ~/.cache/pfl-flower"),
        "device": Key("auto", "torch device for clients: auto (CUDA where present, else the CPU), cpu, cuda or cuda:N "
                      "(GPU N); a CUDA device the machine lacks stops the run at start", pattern=r"auto|cpu|cuda(:[0-9]+)?",
                      pattern_help="'auto', 'cpu', 'cuda' or 'cuda:N'"),
        "server-device": Key("auto", "torch device for the server's heavy maths (Gram matrices, pairwise distances and "
                             "mixings of the client models; fedstrategies/server_device.py): auto (CUDA where present, "
                             "else the CPU), cpu or cuda; cuda on a machine without CUDA stops the run at start",
                             choices=("auto", "cpu", "cuda")),
        "deterministic": Key(True, "deterministic kernels where the device has a choice (CUDA: "
                             "torch.use_deterministic_algorithms, cuDNN deterministic and not benchmarking, "
                             "CUBLAS_WORKSPACE_CONFIG), so that a run and its resume repeat bit for bit; false: the "
                             "fastest kernels, which may differ in the last digits between runs (docs/configuration.md)"),
        "client-threads": Key(0, "torch threads per client process; 0 = OMP_NUM_THREADS, else all cores", low=0),
        "round-timeout": Key(3600, "seconds to wait for one round's replies", low=1),
        "node-wait-s": Key(60, "seconds to wait for all SuperNodes to connect at start", low=0),
        "train-fraction": Key(0.75, "share of each client's data used for training (the rest is its test split)",
                              low=0.0, high=1.0, low_open=True, high_open=True),
        "val-fraction": Key(0.1, "share of each client's training split held out as its validation split, on which "
                            "the best round and tuned hyperparameters are chosen (never on test); 0 = none (the "
                            "report then gives the optimistic best-of-test)",
                            low=0.0, high=1.0, high_open=True),
        "max-train-samples": Key(0, "cap on each client's training samples: a seeded, label-stratified subset of its "
                                 "training split, taken after validation is carved (test and validation splits are "
                                 "the same at every cap); 0 = no cap", low=0),
        "faults.share": Key(0.0, "share of clients that misbehave on purpose in each training round (testing)",
                            low=0.0, high=1.0),
        "faults.kinds": Key("raise,hang,nan,shape,missing,wrong-pid,huge,overflow",
                            "comma-separated fault kinds to inject (see clients/faults.py)"),
        "dirichlet.alpha": Key(0.1, "Dirichlet concentration", low=0.0, low_open=True),
        "dirichlet.min-size": Key(0, "minimum samples per client; 0 = PFLlib's min(40, N/clients/2)", low=0),
        "pathological.classes-per-client": Key(2, "classes per client", low=1),
        "pathological.balance": Key(False, "equal shares within a class instead of random ones"),
        "pfedpm-nk.n": Key(4, "mean classes per client", low=1),
        "pfedpm-nk.k": Key(100, "mean samples per class per client, before the train/test split", low=1),
        "pfedpm-nk.stdev": Key(2, "noise of n and k", low=0),
        "pairs.mode": Key("disjoint", "label pairs (2u, 2u+1) or cyclic (u, u+1)", choices=("disjoint", "cyclic")),
        "longtail-dirichlet.alpha": Key(0.5, "Dirichlet concentration", low=0.0, low_open=True),
        "longtail-dirichlet.imbalance-factor": Key(10.0, "largest/smallest class size", low=1.0),
        "longtail-dirichlet.min-size": Key(0, "minimum samples per client; 0 = 10", low=0),
        "file.path": Key("", "JSON split file, see partitions/FILE_FORMAT.md"),
        "flwr-partitioner.args": Key("", "arguments of the flwr:<Name> partitioner, a TOML inline-table body, e.g. "
                                     "\"alpha = 0.3, self_balancing = true\""),
        "source.x-column": Key("", "hf: the image or feature column; csv: the feature columns, comma-separated; "
                               "empty = image/img/pixel_values/x/features (hf), every other column (csv)"),
        "source.label-column": Key("", "csv/hf: the label column; empty = label/labels/fine_label/y/target/class"),
        "source.group-column": Key("", "csv/hf: a column of natural owners (partition 'natural'); empty = none"),
        "source.resize": Key("", "resize every image to HEIGHTxWIDTH pixels (needed when their sizes differ)",
                             pattern=r"|[0-9]+x[0-9]+", pattern_help="'' or HEIGHTxWIDTH, e.g. '28x28'"),
        "source.splits": Key("", "hf: the splits to merge, comma-separated; empty = all (train, validation, test, others)"),
        "synthetic.alpha": Key(0.5, "Synthetic(alpha, beta): model heterogeneity", low=0.0),
        "synthetic.beta": Key(0.5, "Synthetic(alpha, beta): data heterogeneity", low=0.0),
    }


def pyproject_run_config(app_dir) -> dict[str, Any]:
    """The run-config defaults of a Flower App's pyproject.toml, flattened as Flower does (``a.b``)."""
    import tomllib
    from pathlib import Path

    table = tomllib.loads((Path(app_dir) / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: dict) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(f"{prefix}{key}.", value)
            else:
                flat[prefix + key] = value

    walk("", table)
    return flat


def schema() -> dict[str, Key]:
    """Every valid run-config key: the common ones plus each registered method's ``<method>.<key>``."""
    from fedcore.registry import REGISTRY

    keys = _common_keys()
    keys["method"] = Key(keys["method"].default, keys["method"].help, choices=tuple(REGISTRY))
    for name, method in REGISTRY.items():
        for key, spec in method.hparams.items():
            keys[f"{name}.{key}"] = spec
    return keys


def _refuse_unused_options(values: dict[str, Any], keys: dict[str, Key]) -> None:
    """A changed ``<section>.<option>`` of a method, partition or dataset that is not the selected
    one would be silently ignored: refuse it, naming the key and what is selected."""
    from fedcore.registry import REGISTRY
    from partitions import DATASETS, PARTITIONS

    from partitions.sources import is_source

    selected = {"method": values["method"], "partition": values["partition"], "dataset": values["dataset"]}
    sections = {**{m: "method" for m in REGISTRY}, **{p: "partition" for p in PARTITIONS},
                **{d: "dataset" for d in DATASETS}}
    # the options of the user's own data and of flwr-datasets' partitioners: refused when unused too
    for name, value in values.items():
        section = name.partition(".")[0]
        unused = {"source": not is_source(values["dataset"]),
                  "flwr-partitioner": not values["partition"].startswith("flwr:")}.get(section, False)
        if unused and value != keys[name].default:
            kind, needs = ("dataset", "folder:, npz:, csv:, hf: or py:") if section == "source" else ("partition", "flwr:<Name>")
            raise ConfigError(f"'{name}' = {value!r} is set, but {kind} is {selected[kind]!r}, so it would be ignored; "
                              f"remove it or set a {kind} {needs}")
    for name, value in values.items():
        section, dot, _ = name.partition(".")
        kind = sections.get(section)
        if dot and kind and selected[kind] != section and value != keys[name].default:
            raise ConfigError(f"'{name}' = {value!r} is set, but {kind} is {selected[kind]!r}, so it would be "
                              f"ignored; remove it or set {kind}='{section}'")


def _check_sampled_evaluation(values: dict[str, Any]) -> None:
    """A sampled evaluation runs in the rounds between the eval-every rounds; with eval-every = 1 there are none,
    so a ``fraction-evaluate`` below 1 would silently change nothing: refuse it."""
    if values["fraction-evaluate"] < 1.0 and values["eval-every"] == 1:
        raise ConfigError(f"'fraction-evaluate' = {values['fraction-evaluate']!r} samples the evaluation of the rounds "
                          "between the eval-every rounds, but 'eval-every' = 1 evaluates every client in every round; "
                          "set eval-every > 1 (e.g. eval-every = 10: a sample evaluates in rounds 1-9, everyone in "
                          "round 10 and the last) or fraction-evaluate = 1.0")


FAULT_KINDS = ("raise", "hang", "nan", "shape", "missing", "wrong-pid", "huge", "overflow")  # clients/faults.py


TRACKERS = ("none", "tensorboard", "wandb")  # server_app/tracking.py


def parse_trackers(text: str) -> tuple[str, ...]:
    """The ``tracker`` list without "none"; ConfigError for an unknown or empty name."""
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",")))
    if not names or not all(names) or set(names) - set(TRACKERS) or ("none" in names and len(names) > 1):
        raise ConfigError(f"'tracker' = {text!r} is not valid; choose one of: {', '.join(TRACKERS)}, or "
                          "tensorboard,wandb for both")
    return tuple(n for n in names if n != "none")


def parse_fault_kinds(text: str) -> tuple[str, ...]:
    """The ``faults.kinds`` list; ConfigError for an unknown or empty one."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown or not kinds:
        raise ConfigError(f"'faults.kinds' = {text!r}: unknown kind(s) {unknown}; choose from {', '.join(FAULT_KINDS)}")
    return kinds


def check_data(cfg: Mapping[str, Any]) -> str:
    """Where the run's dataset will load from on this machine, or ConfigError naming every way to get
    it. For runs whose clients share this machine (simulation, in process): a deployment's data lives
    on its SuperNodes, which refuse for themselves."""
    from partitions.datasets import DatasetUnavailable, check_available

    try:
        return check_available(cfg["dataset"], cfg["data-dir"])
    except DatasetUnavailable as err:
        raise ConfigError(str(err)) from None


def check_partition(cfg: Config, num_clients: int) -> str:
    """Build the run's partition here, as every client will, so a split that cannot be made (too many clients for
    the data, a class too small for the scheme) is refused before the federation starts instead of in each client.
    numpy only: the launcher imports no torch. For runs whose clients share this machine's data.
    Returns the run's data card (``partitions.data_card``), the line a launch prints at start."""
    from partitions import PartitionError, data_card, federated_data

    try:
        data, splits = federated_data(*cfg.data_key(num_clients))
        return data_card(data, splits, cfg["partition"])
    except (PartitionError, ValueError) as err:
        largest = largest_client_count(cfg, num_clients - 1) if cfg["partition"] != "file" else None
        if largest is not None:
            limit = (f" At most {largest} clients can be served with these settings (the largest count below "
                     f"{num_clients} that splits: {largest + 1} does not).")
        elif cfg["partition"] == "file":
            limit = ""  # the split file fixes the client count
        else:
            limit = " No client count can be served with these settings."
        raise ConfigError(f"{num_clients} clients on dataset {cfg['dataset']!r}, partition {cfg['partition']!r}: "
                          f"{err}{limit}") from None


def largest_client_count(cfg: Config, below: int) -> int | None:
    """The largest client count up to ``below`` whose split can be made (None: not even one client's), by
    bisection on "fewer clients split more easily": what the refusal of a count that cannot be served names.
    Each step builds a partition (numpy, milliseconds to a second for the retrying Dirichlet schemes)."""
    from partitions import PartitionError, federated_data

    def splits(n: int) -> bool:
        try:
            federated_data(*cfg.data_key(n))
            return True
        except (PartitionError, ValueError):
            return False

    if below < 1 or not splits(1):
        return None
    works, fails = 1, below + 1
    if splits(below):
        return below
    fails = below
    while fails - works > 1:
        mid = (works + fails) // 2
        works, fails = (mid, fails) if splits(mid) else (works, mid)
    return works


def check_model(cfg: Config, num_clients: int) -> str:
    """The user's own model (``package.module:factory``) built and tried on a batch of the run's data before the
    federation starts (torch is imported only then); ConfigError naming the problem. Returns its one-line card,
    or "" for our models, which the test suite checks."""
    if not re.fullmatch(USER_MODEL, cfg["model"]):
        return ""
    from fedcore.user_models import check_at_start

    return check_at_start(cfg, num_clients)


class Config(Mapping):
    """A validated run config: every key present, typed and in range."""

    def __init__(self, values: dict[str, Any], auto_sources: dict[str, str] | None = None):
        self._values = dict(values)
        # the keys left at "auto" and where their values came from (a method's paper setting or the project default)
        self.auto_sources = dict(auto_sources or {})

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], keys: dict[str, Key] | None = None) -> Config:
        """Validate a Flower run config (missing keys take their defaults) against ``keys`` (default:
        ``schema()``)."""
        keys = schema() if keys is None else keys
        unknown = sorted(set(run_config) - set(keys))
        if unknown:
            raise ConfigError(
                f"unknown run-config key(s): {', '.join(unknown)}. Valid keys: {', '.join(sorted(keys))}"
            )
        values = {name: key.check(name, run_config.get(name, key.default)) for name, key in keys.items()}
        _refuse_unused_options(values, keys)
        _check_sampled_evaluation(values)
        parse_fault_kinds(values["faults.kinds"])
        parse_trackers(values["tracker"])
        values, sources = resolve_auto(values)
        for name, source in sources.items():  # a paper's value is checked like a user's
            values[name] = keys[name].check(f"{name} ({source})", values[name])
        return cls(values, sources)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def section(self, prefix: str) -> dict[str, Any]:
        """The keys ``<prefix>.<name>`` as ``{name: value}`` (method hyperparameters, partition options)."""
        head = prefix + "."
        return {k[len(head):]: v for k, v in self._values.items() if k.startswith(head)}

    @property
    def method(self) -> str:
        return self._values["method"]

    def partition_params(self) -> dict[str, Any]:
        """Options of the selected partition scheme, as the partitioners name them."""
        renames = {"path": "file", "mode": "pairs-mode"}
        params = {renames.get(k, k): v for k, v in self.section(self["partition"]).items()}
        if self["partition"].startswith("flwr:"):
            params["flwr-args"] = self["flwr-partitioner.args"]
        params["train-fraction"] = self["train-fraction"]
        params["val-fraction"] = self["val-fraction"]
        params["max-train-samples"] = self["max-train-samples"]
        return params

    def data_key(self, num_clients: int) -> tuple:
        """What decides the clients' data (``partitions.federated_data``'s arguments), hashable: the key the
        clients cache their splits under."""
        from partitions.sources import is_source

        options = self.section("source" if is_source(self["dataset"]) else self["dataset"])
        return (self["dataset"], self["partition"], num_clients, self["seed"], self["data-dir"],
                tuple(sorted(options.items())), tuple(sorted(self.partition_params().items())), self["normalize"])

    def hparams(self) -> dict[str, Any]:
        """The selected method's hyperparameters."""
        return self.section(self.method)

    def to_dict(self) -> dict[str, Any]:
        return dict(self._values)
