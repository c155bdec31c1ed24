"""`method=X` alone is paper X's setting: common keys left at "auto" take the method's paper values."""

import pytest

from fedcore.config import Config, ConfigError, schema
from fedcore.models import build_model
from fedcore.paper_settings import AUTO_KEYS, FALLBACK, paper_setting
from fedcore.registry import REGISTRY
from partitions import DATASETS

# each method's own table, from its declaration (fedcore/methods/<name>.py)
PAPER_SETTINGS = {name: m.declaration.PAPER_SETTINGS for name, m in REGISTRY.items()
                  if hasattr(m.declaration, "PAPER_SETTINGS")}


def test_the_five_papers_and_five_rivals_declare_their_settings():
    assert set(PAPER_SETTINGS) == {"pfedpm", "fedmcsa", "fedfcd", "mupfl", "fedsac", "creff", "pfedgraph", "fedgh",
                                   "gpfl", "pfedme"}


def test_every_entry_names_a_registered_method_a_known_dataset_and_an_auto_key():
    for method, entries in PAPER_SETTINGS.items():
        assert method in REGISTRY, method
        for dataset, values in entries.items():
            assert dataset == "*" or dataset in DATASETS, (method, dataset)
            assert set(values) <= set(AUTO_KEYS), (method, dataset, set(values) - set(AUTO_KEYS))


@pytest.mark.parametrize("method", sorted(PAPER_SETTINGS))
def test_method_alone_gets_its_paper_values_on_each_dataset(method):
    for dataset in DATASETS:
        expected = paper_setting(method, dataset, {})
        cfg = Config.from_run_config({"method": method, "dataset": dataset})
        for key in AUTO_KEYS:
            if key in expected:
                assert cfg[key] == expected[key], (method, dataset, key)
                assert cfg.auto_sources[key] == f"{method}'s paper setting"
            elif key in FALLBACK:
                assert cfg[key] == FALLBACK[key], (method, dataset, key)
                assert cfg.auto_sources[key] == "the project default"
            else:  # a model the paper does not name for this input: picked from the input shape later
                assert cfg[key] == "auto"


@pytest.mark.parametrize("method", sorted(PAPER_SETTINGS))
def test_each_paper_model_builds_for_the_dataset_it_is_named_for(method):
    for dataset, values in PAPER_SETTINGS[method].items():
        if "model" in values:
            spec = DATASETS[dataset]
            model = build_model(values["model"], spec.input_shape, spec.num_classes)
            assert model.feature_dim > 0


def test_the_spec_values_of_two_papers():
    """Spot values read off the specs' hyperparameter tables, written out here on purpose."""
    sac = Config.from_run_config({"method": "fedsac", "dataset": "mnist5k"})
    assert (sac["lr"], sac["momentum"], sac["weight-decay"], sac["batch-size"], sac["local-steps"], sac["model"]) == \
        (0.01, 0.9, 1e-5, 64, 200, "simplecnn")
    mcsa = Config.from_run_config({"method": "fedmcsa", "dataset": "synthetic"})
    assert (mcsa["lr"], mcsa["batch-size"], mcsa["local-steps"], mcsa["fraction-train"], mcsa["model"]) == \
        (0.02, 20, 20, 1.0, "mlr")  # FedMCSA samples S itself (fedmcsa.clients-per-round); 0.2 is refused


def test_a_value_given_in_the_run_config_wins_over_the_paper_setting():
    cfg = Config.from_run_config({"method": "fedsac", "dataset": "mnist5k", "lr": 0.05, "model": "cnn",
                                  "fraction-train": 0.5})
    assert (cfg["lr"], cfg["model"], cfg["fraction-train"]) == (0.05, "cnn", 0.5)
    assert not {"lr", "model", "fraction-train"} & set(cfg.auto_sources)
    assert cfg["momentum"] == 0.9  # the keys not given still follow the paper


def test_a_budget_given_in_epochs_is_not_overridden_by_the_papers_steps():
    cfg = Config.from_run_config({"method": "fedsac", "dataset": "mnist5k", "local-epochs": 2})
    assert (cfg["local-epochs"], cfg["local-steps"]) == (2, 0)
    cfg = Config.from_run_config({"method": "mupfl", "dataset": "mnist5k", "local-steps": 7})
    assert (cfg["local-steps"], cfg["local-epochs"]) == (7, FALLBACK["local-epochs"])


def test_a_method_without_a_paper_setting_gets_the_project_defaults():
    cfg = Config.from_run_config({"method": "fedavg", "dataset": "mnist5k"})
    assert {k: cfg[k] for k in FALLBACK} == FALLBACK
    assert cfg["model"] == "auto"


def test_auto_is_refused_where_a_key_has_no_paper_value_and_bad_values_still_are():
    with pytest.raises(ConfigError, match="num-server-rounds"):
        Config.from_run_config({"num-server-rounds": "auto"})
    with pytest.raises(ConfigError, match="'lr' = 'fast'|'lr' must be a number"):
        Config.from_run_config({"lr": "fast"})
    assert all(schema()[k].default == "auto" for k in AUTO_KEYS)
