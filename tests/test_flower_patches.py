"""The patches of Flower's internals (fedcore/flower_patches.py): written for the installed Flower, refused for
another, and applied only in a fast-runtime run.

``test_the_installed_flower_is_the_one_the_patches_were_written_for`` fails when an upgraded Flower changes its
version or the signature of anything a patch replaces: the fast runtime must then be re-checked, not trusted."""

from __future__ import annotations

import pytest

from fedcore import flower_patches
from fedcore.flower_patches import FlowerMismatch


def test_the_installed_flower_is_the_one_the_patches_were_written_for():
    flower_patches.check_all()


def test_another_flower_version_is_refused_with_the_way_out(monkeypatch):
    monkeypatch.setattr(flower_patches, "SUPPORTED_FLOWER", ("9.9.",))
    with pytest.raises(FlowerMismatch, match=r"installed Flower 1\.\d+.*9\.9\.x.*--runtime flower"):
        flower_patches.object_pulls(0.05)
    with pytest.raises(FlowerMismatch):
        flower_patches.check_all()


def test_a_changed_signature_is_refused_and_nothing_is_patched(monkeypatch):
    from flwr.supercore.superexec import run_superexec
    from flwr.supernode.runtime import run_clientapp

    install, get_executor, clock = run_clientapp.install_from_fab, run_superexec.get_executor, run_superexec.time
    for name in ("install_from_fab", "get_executor"):
        monkeypatch.setitem(flower_patches._SIGNATURES, name, ["something", "else"])
    with pytest.raises(FlowerMismatch, match="install_from_fab takes"):
        flower_patches.fab_install(lambda fn: fn)
    with pytest.raises(FlowerMismatch, match="get_executor takes"):
        flower_patches.superexec(lambda executor: executor, object())
    assert (run_clientapp.install_from_fab, run_superexec.get_executor, run_superexec.time) == \
        (install, get_executor, clock)


def test_pull_functions_without_the_expected_keyword_defaults_are_refused(monkeypatch):
    from flwr.supercore.inflatable import inflatable_utils

    monkeypatch.setattr(inflatable_utils.pull_objects, "__kwdefaults__", {"max_time": 7200})
    with pytest.raises(FlowerMismatch, match="pull_objects has no keyword defaults"):
        flower_patches.object_pulls(0.05)
    assert inflatable_utils.pull_objects.__kwdefaults__ == {"max_time": 7200}


def test_the_serverapp_patches_flower_only_in_a_fast_runtime_run(monkeypatch):
    """``tune_grid`` on a deployed grid shortens the object-pull back-off only where PFL_RUNTIME=fast."""
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.superlink.grid.http_grid import HttpGrid

    from server_app.nodes import PULL_INTERVALS_S, tune_grid

    for fn in (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree):
        monkeypatch.setattr(fn, "__kwdefaults__", dict(fn.__kwdefaults__))  # restored after the test
    stock = dict(inflatable_utils.pull_objects.__kwdefaults__)
    grid = HttpGrid.__new__(HttpGrid)  # no connection needed: tune_grid only looks at its type
    monkeypatch.delenv(flower_patches.RUNTIME_ENV, raising=False)
    tune_grid(grid)
    assert inflatable_utils.pull_objects.__kwdefaults__ == stock
    monkeypatch.setenv(flower_patches.RUNTIME_ENV, flower_patches.FAST)
    tune_grid(grid)
    assert inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"] == 0.01
    assert inflatable_utils.pull_objects.__kwdefaults__["backoff_cap"] == PULL_INTERVALS_S[1]
