"""The one way the project calls the Flower CLI (``runner.flower_cli.flwr``): it must see a failure
that the CLI reports only in its JSON (exit status 0), and one that a text command reports by its
exit status, against a real ``flwr`` and an address where nothing listens."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner import flower_cli as fc

ROOT = Path(__file__).resolve().parents[1]
UNAVAILABLE = "Connection to the SuperLink is unavailable"


@pytest.fixture
def nowhere(tmp_path) -> dict:
    """A CLI environment whose connection ``nowhere`` points at a free loopback port."""
    home = tmp_path / "cli"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "nowhere"\n\n[superlink.nowhere]\n'
                                      f'address = "127.0.0.1:{fc.free_port()}"\ninsecure = true\n')
    return fc.flower_env(home)


def test_a_json_answer_without_success_raises_with_flowers_own_message(nowhere):
    """``flwr ls --format json`` exits 0 here; only its ``"success": false`` tells that it failed."""
    with pytest.raises(fc.FlowerCliError, match=UNAVAILABLE) as failed:
        fc.list_runs("nowhere", env=nowhere, cwd=ROOT)
    assert str(failed.value).startswith("flwr ls nowhere: ")


def test_a_text_command_that_fails_raises_with_its_output(nowhere):
    """``flwr log`` has no JSON answer: its exit status and output are what there is."""
    with pytest.raises(fc.FlowerCliError, match=UNAVAILABLE):
        fc.flwr("log", "1", "nowhere", "--show", env=nowhere, cwd=ROOT, timeout=60)
