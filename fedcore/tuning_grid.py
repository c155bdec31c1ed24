"""The tuning protocol of every comparison (issue #45). Each method's declaration (``fedcore/methods/<m>.py``)
names, as its ``TUNING_GRID``, the (at most two) hyperparameters of its own that matter most and the grid each is
chosen from (``product`` below builds one): at most ``MAX_SETTINGS`` settings over at most ``MAX_KEYS`` names, the
method's default in every grid, so tuning can only move it where validation says so.

Every row of a comparison gets the same budget: at most ``MAX_SETTINGS`` settings, one seed, ``ROUNDS_FRACTION``
of the preset's rounds, the setting with the best validation accuracy (test accuracy is never read) unless the
method's default is within noise of it (``benchmarks.tune.choose``), once per method and data family (dataset and
partition scheme): ``python -m benchmarks.tune conf/<preset>.toml`` runs it and writes the choice to
``conf/tuned/<dataset>-<partition>.toml``, which presets of that family name in ``[compare] tuned``
(``load_tuned``). The common keys (``COMMON_KEYS``) are not tuned: they are the preset's, equal for every row
unless the preset says why not (``[compare] unequal``).

A method without a grid has no hyperparameter of its own that changes what it learns (FedAvg, local, FedPer,
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


def settings(method: str) -> list[dict]:
    """The method's grid (its declaration's ``TUNING_GRID``) as run-config keys (``<method>.<name>``); [] for a
    method with nothing to tune."""
    from fedcore.registry import get_method

    return [{f"{method}.{k}": v for k, v in s.items()} for s in get_method(method).tuning_grid]


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
