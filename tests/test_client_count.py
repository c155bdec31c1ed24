"""A client count the dataset cannot serve is refused at start, by the launcher and by an in-process run, with
the largest count that can be served named in the message."""

from pathlib import Path

import pytest

from fedcore.config import Config, ConfigError, check_partition, largest_client_count

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {"dataset": "mnist5k", "partition": "pairs"}  # 500 images a label: a label pair serves a bounded count


def test_the_largest_count_named_is_served_and_one_more_is_not():
    cfg = Config.from_run_config(PAIRS)
    largest = largest_client_count(cfg, 300)
    assert largest is not None and 10 < largest < 300
    check_partition(cfg, largest)  # it is served
    with pytest.raises(ConfigError, match=rf"At most {largest} clients can be served.*{largest + 1} does not"):
        check_partition(cfg, largest + 1)
    assert largest_client_count(cfg, largest - 3) == largest - 3  # a count below it is its own answer


def test_the_launcher_refuses_with_the_largest_count_before_anything_starts(tmp_path):
    from runner.launch import simulate

    home = tmp_path / "home"
    largest = largest_client_count(Config.from_run_config(PAIRS), 300)
    with pytest.raises(ConfigError, match=rf"300 clients on dataset 'mnist5k', partition 'pairs'.*At most {largest} "):
        simulate({**PAIRS, "results-dir": str(tmp_path)}, supernodes=300, app_dir=ROOT, flwr_home=home)
    assert not home.exists()  # no SuperLink was started


def test_an_in_process_run_refuses_with_the_largest_count_before_any_client_starts(tmp_path):
    from runner.inprocess import run_inprocess

    run_config = {"dataset": "digits", "partition": "iid", "results-dir": str(tmp_path)}
    largest = largest_client_count(Config.from_run_config(run_config), 999)
    assert largest is not None and largest < 1797 // 2  # the validation split makes it fewer than 2 a client allows
    with pytest.raises(ConfigError, match=rf"too few samples.*1797 samples.*At most {largest} clients can be served"):
        run_inprocess(run_config, 1000)
    assert not any(tmp_path.iterdir())  # no run folder was made


def test_settings_no_count_can_serve_say_so():
    cfg = Config.from_run_config({"dataset": "digits", "partition": "pathological",
                                  "pathological.classes-per-client": 11})
    assert largest_client_count(cfg, 50) is None
    with pytest.raises(ConfigError, match="No client count can be served with these settings"):
        check_partition(cfg, 4)
