"""The generic resolver of the common training keys left at ``"auto"``, so that ``method=X`` alone runs paper X's
experiment.

Each method's declaration (``fedcore/methods/<name>.py``) may hold ``PAPER_SETTINGS[dataset or "*"] = {key: value}``
(a dataset's entry laid over ``"*"``) and ``setting_options(hparams)``, the values its own options decide. A key left
at ``"auto"`` takes that value, else the project-wide fallback; a value given in the run config always wins. Both
sides resolve the same config, so this module and the declarations hold plain values only.
"""

from __future__ import annotations

from typing import Any

AUTO = "auto"
# the keys a paper setting may set, with the value each takes where none does; ``model`` has no fallback: "auto" is
# then resolved from the input shape (fedcore.models.default_model)
FALLBACK: dict[str, Any] = {"lr": 0.05, "momentum": 0.0, "weight-decay": 0.0, "local-epochs": 1, "local-steps": 0,
                            "batch-size": 10, "fraction-train": 1.0, "augmentation": "none"}
AUTO_KEYS: tuple[str, ...] = ("model", *FALLBACK)
GREY_28 = ("mnist5k", "mnist", "fmnist")  # the 28x28 grey-image sets, which share a paper's model


def same_model(name: str, *datasets: str) -> dict[str, dict[str, Any]]:
    """The same model for several datasets, as dataset entries of one method's ``PAPER_SETTINGS``."""
    return {dataset: {"model": name} for dataset in datasets}


def paper_setting(method: str, dataset: str, hparams: dict[str, Any] | None = None) -> dict[str, Any]:
    """The values ``method`` uses on ``dataset`` (with its options ``hparams``) for the keys left at ``"auto"``."""
    from fedcore.registry import get_method

    declaration = get_method(method).declaration
    entries = getattr(declaration, "PAPER_SETTINGS", {})
    setting = {**entries.get("*", {}), **entries.get(dataset, {})}
    if hparams is not None and hasattr(declaration, "setting_options"):
        setting.update(declaration.setting_options(hparams))
    return setting


def resolve_auto(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``values`` with every ``"auto"`` common key replaced, and where each replaced value came from."""
    method = values["method"]
    section = {k.partition(".")[2]: v for k, v in values.items() if k.startswith(method + ".")}
    setting = paper_setting(method, values["dataset"], section)
    # local-steps > 0 replaces epochs: a budget the user gives in one unit is not overridden by the paper's other one
    if values.get("local-epochs") != AUTO and values.get("local-steps") == AUTO:
        setting.pop("local-steps", None)
    if values.get("local-steps") != AUTO and values.get("local-epochs") == AUTO:
        setting.pop("local-epochs", None)
    resolved, sources = dict(values), {}
    for key in (k for k in AUTO_KEYS if resolved.get(k) == AUTO):
        if key in setting:
            resolved[key], sources[key] = setting[key], f"{method}'s paper setting"
        elif key in FALLBACK:
            resolved[key], sources[key] = FALLBACK[key], "the project default"
    return resolved, sources
