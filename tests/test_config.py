"""Run-config validation: wrong keys and values stop the run at start with the valid choices listed."""

from pathlib import Path

import pytest

from fedcore.config import Config, ConfigError, pyproject_run_config, schema
from fedcore.registry import REGISTRY, get_method

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_defaults_match_schema():
    """Every schema key is in pyproject (so --run-config can override it) with the same default; the method keys
    are written there from the declarations by `make sync-config` (tests/test_sync_config.py)."""
    flat = pyproject_run_config(ROOT)
    keys = schema()
    stale = "pyproject.toml differs from the schema (the method tables: run `make sync-config`)"
    assert set(flat) == set(keys), f"{stale}: {sorted(set(flat) ^ set(keys))}"
    for name, key in keys.items():
        assert flat[name] == key.default, f"{stale}: {name}"
    Config.from_run_config(flat)  # the shipped defaults are valid


def test_required_keys_exist():
    keys = schema()
    for name in ["method", "dataset", "partition", "num-server-rounds", "seed", "local-epochs", "batch-size",
                 "lr", "fraction-train", "eval-every", "results-dir"]:
        assert name in keys


def test_missing_keys_take_defaults():
    cfg = Config.from_run_config({"method": "local"})
    assert cfg["num-server-rounds"] == schema()["num-server-rounds"].default
    assert cfg["lr"] == 0.05 and cfg.auto_sources["lr"] == "the project default"  # local has no paper setting
    assert cfg.method == "local"


@pytest.mark.parametrize("key,value,fragment", [
    ("method", "fedfoo", "choose one of: local, fedavg"),
    ("dataset", "imagenet", "choose one of:"),
    ("partition", "weird", "dirichlet"),
    ("model", "vgg", "resnet18"),
    ("num-server-rounds", 0, ">= 1"),
    ("lr", 0.0, "> 0.0"),
    ("lr", -1, "> 0.0"),
    ("fraction-train", 1.5, "<= 1.0"),
    ("batch-size", 2.5, "integer"),
    ("batch-size", True, "integer"),
    ("lr", "fast", "number"),
    ("pathological.balance", 1, "true or false"),
    ("dirichlet.alpha", float("nan"), "finite"),
])
def test_bad_values_are_refused_with_a_clear_message(key, value, fragment):
    with pytest.raises(ConfigError) as err:
        Config.from_run_config({key: value})
    assert key in str(err.value) and fragment in str(err.value)


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError, match="unknown run-config key.*num-rounds.*Valid keys:.*num-server-rounds"):
        Config.from_run_config({"num-rounds": 3})


def test_integer_valued_float_is_accepted_for_int_and_int_for_float():
    cfg = Config.from_run_config({"num-server-rounds": 3.0, "lr": 1})
    assert cfg["num-server-rounds"] == 3 and isinstance(cfg["num-server-rounds"], int)
    assert cfg["lr"] == 1.0 and isinstance(cfg["lr"], float)


def test_partition_params_are_those_of_the_selected_scheme():
    cfg = Config.from_run_config({"partition": "dirichlet", "dirichlet.alpha": 0.3})
    assert cfg.partition_params() == {"alpha": 0.3, "min-size": 0, "train-fraction": 0.75, "val-fraction": 0.1,
                                      "max-train-samples": 0}
    cfg = Config.from_run_config({"partition": "file", "file.path": "/x.json"})
    assert cfg.partition_params()["file"] == "/x.json"


def test_every_way_of_running_holds_out_a_validation_split_by_default():
    """``flwr run .`` reads pyproject.toml, ``make run`` and the in-process runs the schema: one default, > 0, so no
    way of running reports the optimistic best-of-test number unless asked to."""
    assert pyproject_run_config(ROOT)["val-fraction"] == schema()["val-fraction"].default == 0.1
    run_target = (ROOT / "Makefile").read_text().split("\nrun:")[1].split("\n\n")[0]
    assert "val-fraction" not in run_target  # no second default on top of the schema's


def test_registry_entries_resolve():
    for name, method in REGISTRY.items():
        assert method.strategy.__name__ and method.client.__name__, name
    with pytest.raises(ValueError, match="choose one of"):
        get_method("nope")


def test_the_schema_and_the_launchers_check_import_neither_torch_nor_flower():
    """Every method's keys come from its plain declaration (fedcore/methods/), so checking a config costs no torch
    or Flower import: the launcher checks before it starts anything, and nothing needs a cache."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from runner import flower_cli as fc;"
            "cfg = fc.check_config({'method': 'fedsac', 'fedsac.solver': 'cvxpy'}, Path('.'));"
            "from fedcore.registry import REGISTRY; [m.declaration for m in REGISTRY.values()];"
            "print(cfg['fedsac.solver'], sorted(m for m in ('torch', 'flwr', 'fedstrategies', 'clients') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["cvxpy", "[]"]


def test_every_registered_method_has_a_declaration_with_its_hyperparameters():
    for name, method in REGISTRY.items():
        assert method.declaration.__name__.startswith("fedcore.methods."), name
        assert method.hparams is method.declaration.HPARAMS, name
        assert all(key.startswith(f"{name}.") for key in schema() if key.split(".")[0] == name)
