"""The tuning protocol of every comparison (issue #45): one place that names, per method, the (at most two)
hyperparameters of its own that matter most and the grid each is chosen from.

Every row of a comparison gets the same budget: at most ``MAX_SETTINGS`` settings, one seed, ``ROUNDS_FRACTION``
of the preset's rounds, the setting with the best validation accuracy (test accuracy is never read) unless the
method's default is within noise of it (``benchmarks.tune.choose``), once per method and data family (dataset and
partition scheme): ``python -m benchmarks.tune conf/<preset>.toml`` runs it and writes the choice to
``conf/tuned/<dataset>-<partition>.toml``, which presets of that family name in ``[compare] tuned``
(``load_tuned``). The common keys (``COMMON_KEYS``) are not tuned: they are the preset's, equal for every row
unless the preset says why not (``[compare] unequal``).

A method without an entry has no hyperparameter of its own that changes what it learns (FedAvg, local, FedPer,
majority, FedNova, FedRoD's default loss): it runs at the common keys alone.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path

MAX_SETTINGS = 9  # the same grid size for every method
MAX_KEYS = 2  # the two hyperparameters that matter most
ROUNDS_FRACTION = 0.5  # the tuning budget: this share of the preset's rounds (at least 1)
SELECT_ON = "best_val_acc"  # the summary's best weighted validation accuracy over the evaluated rounds
COMMON_KEYS = ("lr", "momentum", "weight-decay", "batch-size", "local-epochs", "local-steps", "fraction-train")


def product(**values: list) -> list[dict]:
    """Every combination of the given keys' values, in order (the first key varies slowest)."""
    keys = list(values)
    return [dict(zip(keys, combo)) for combo in itertools.product(*values.values())]


# method -> its settings (hyperparameter name without the "<method>." prefix -> value), at most MAX_SETTINGS,
# over at most MAX_KEYS names. The method's default is in every grid, so tuning can only move it where
# validation says so.
GRIDS: dict[str, list[dict]] = {
    "fedprox": product(mu=[0.001, 0.01, 0.1, 0.5, 1.0]),
    "fedproto": product(**{"lambda": [0.1, 1.0, 5.0]}),
    "ditto": product(**{"lambda": [0.01, 0.1, 0.5, 1.0, 2.0]}),
    "fedrep": product(**{"head-epochs": [1, 5, 10]}),
    "fedavg-ft": product(epochs=[1, 3, 5]),
    "fedmcsa": product(variant=["authors-code", "paper"], sigma=[10.0, 50.0, 100.0]),
    "pfedpm": product(a=[0.25, 0.5, 0.75], **{"lambda": [0.1, 1.0, 5.0]}),
    "fedfcd": product(**{"lambda": [0.0, 0.1, 1.0, 5.0]}),
    "mupfl": product(**{"head-epochs": [10, 30, 50]}),
    # the matching's step is on another scale for each optimiser: a list, not a product
    "creff": [{"match-optimizer": "adam", "match-lr": lr} for lr in (0.003, 0.01, 0.03)]
    + [{"match-optimizer": "sgd", "match-lr": lr} for lr in (0.1, 1.0, 10.0)],
    "fedsac": product(alpha=[0.5, 0.7, 0.9], beta=[1.0, 1.4, 1.6]),
    "pfedgraph": product(alpha=[0.6, 0.8, 0.9], **{"lambda": [0.001, 0.01, 0.1]}),
    "per-fedavg": product(alpha=[0.001, 0.003, 0.01, 0.03, 0.1]),
    "pfedme": product(**{"lambda": [1.0, 5.0, 15.0, 30.0], "personal-lr": [0.01, 0.05]}),
    "l2gd": product(p=[0.05, 0.1, 0.3], **{"lambda": [0.1, 1.0, 10.0]}),
    "fedgh": product(**{"server-lr": [0.001, 0.01, 0.1]}),
    "gpfl": product(**{"lambda": [0.001, 0.01, 0.1], "mu": [0.01, 0.1, 1.0]}),
    "fedamp": product(**{"alpha-k": [0.25, 0.5, 1.0], "lambda": [0.1, 1.0, 3.0]}),
    "heurfedamp": product(**{"self-weight": [0.1, 0.3, 0.5], "sigma": [1.0, 10.0, 30.0]}),
    "cfl": product(eps1=[0.1, 0.15, 0.25], eps2=[0.4, 0.6, 0.8]),
    "fesem": product(clusters=[2, 3, 4, 5]),
}


def settings(method: str) -> list[dict]:
    """The method's grid as run-config keys (``<method>.<name>``); [] for a method with nothing to tune."""
    return [{f"{method}.{k}": v for k, v in s.items()} for s in GRIDS.get(method, [])]


def tuned_keys(method: str) -> list[str]:
    """The run-config keys the protocol tunes for ``method``, in grid order."""
    keys: list[str] = []
    for s in settings(method):
        keys += [k for k in s if k not in keys]
    return keys


def family(run_config: dict) -> str:
    """The data family a choice is made for and shared within: ``<dataset>-<partition>``."""
    return f"{run_config.get('dataset', 'mnist5k')}-{run_config.get('partition', 'pathological')}"


def load_tuned(path: str | Path) -> dict[str, dict]:
    """``{method: {run-config key: chosen value}}`` from a file ``benchmarks.tune`` wrote ({} if it is missing:
    a family not tuned yet runs at the defaults)."""
    path = Path(path)
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text())
    return {m: dict(v) for m, v in data.get("method-config", {}).items()}
