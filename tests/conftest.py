"""Shared fixtures: Flower env vars, the device the suite runs on, a small run config, and an in-process
federation runner.

The device: ``pytest --device cpu|cuda`` (default cpu), else the environment's ``PFL_DEVICE``. Every
run config from ``small_config`` carries it, and tests build their own tensors and models on it
through the ``device`` fixture, so the same suite checks the CPU path (``make test``) and the CUDA
path (``make test-gpu``). tests/test_device_discipline.py lists any test module that builds a
model or a client without going through one of these.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# one torch thread per test process: pytest-xdist runs two workers on two cores, and one thread gives
# the same float sums whatever the machine's core count
os.environ.setdefault("OMP_NUM_THREADS", "1")

DEVICE_ENV = "PFL_DEVICE"
DEVICES = ("cpu", "cuda")


def test_device() -> str:
    """The device this test session runs on ("cpu" or "cuda"; ``--device`` sets it for the session and
    its workers and subprocesses through ``PFL_DEVICE``)."""
    return os.environ.get(DEVICE_ENV, "cpu") or "cpu"


test_device.__test__ = False  # a helper, not a test


def pytest_addoption(parser):
    parser.addoption("--device", choices=DEVICES, default=None,
                     help=f"torch device of every test's run config, models and tensors (default: ${DEVICE_ENV}, "
                          "else cpu)")


@pytest.fixture(scope="session")
def device():
    """The session's torch device: build test tensors and models on it (``torch.zeros(..., device=device)``,
    ``model.to(device)``), as the clients under test hold theirs there."""
    import torch

    return torch.device(test_device())


# MuPFL's paper setting pre-trains the head for 50 epochs on 100 synthetic features per class (19,000
# steps a round at batch 16, 90% of a 3-client round here): tests that do not ask for more use a
# small PKCF that runs every stage of it
SMALL_MUPFL = {"mupfl.features-per-class": 8, "mupfl.head-epochs": 2, "mupfl.match-steps": 5}
# CReFF's server re-trains a classifier for 300 epochs on 100 features per class each round: the same, small
SMALL_CREFF = {"creff.features-per-class": 8, "creff.match-steps": 5, "creff.retrain-epochs": 2}


def long_but(values, fast) -> list:
    """``values`` as parameters of one test, each one not in ``fast`` marked ``long``: the fast suite runs the
    few that take each path of the rule (``make test`` stays fast), ``make test-long`` runs them all."""
    unknown = set(fast) - set(values)
    if unknown:
        raise ValueError(f"long_but: {sorted(unknown)} are not among the parameters")
    return [value if value in fast else pytest.param(value, marks=pytest.mark.long) for value in values]


def small_config(tmp_path, **overrides) -> dict:
    """A tiny but real setting: digits, 2 classes per client, 2 rounds, one torch thread, plain SGD."""
    config = {
        "dataset": "digits", "partition": "pathological", "num-server-rounds": 2, "local-epochs": 1,
        "batch-size": 16, "lr": 0.05, "results-dir": str(tmp_path / "results"), "run-name": "test-run",
        "node-wait-s": 0, "seed": 0, "client-threads": 1, "plots": False,  # plots were a third of a run
        # the tests' own budget, not each method's paper setting (tests/test_paper_settings.py checks those)
        "local-steps": 0, "momentum": 0.0, "weight-decay": 0.0, "fraction-train": 1.0,
        "val-fraction": 0.0,  # the tiny splits keep all their training data; validation tests set their own
        "device": test_device(), "server-device": test_device(), "deterministic": True,
    }
    config.update({"mupfl": SMALL_MUPFL, "creff": SMALL_CREFF}.get(overrides.get("method"), {}))
    config.update(overrides)
    return config


def run_inprocess(tmp_path, num_clients: int = 3, faults=None, **overrides):
    """Run the real ServerApp loop against the real ClientApp, in this process (messages and client
    state serialised between calls, as in the real runtimes)."""
    from runner import inprocess

    return inprocess.run_inprocess(small_config(tmp_path, **overrides), num_clients, faults=faults)


class CutOff(Exception):
    """Stands for the session ending in the middle of a run."""


def begin_and_cut_off(config: dict, code: dict, num_clients: int = 3, in_round: int = 2) -> None:
    """Begin ``config``'s run as a comparison or tuning job does (its start record under ``code``, then the run)
    and stop it in round ``in_round``, after the round before it wrote its checkpoint."""
    from clients.app import app as client_app
    from fedcore.config import Config
    from runner import provenance
    from runner.inprocess import InProcessGrid
    from server_app.app import run_experiment

    config = {**config, "overwrite": True}
    provenance.mark_started(Path(config["results-dir"]) / config["run-name"], code, config)

    def crash(msg, reply):
        if msg.metadata.group_id == str(in_round):
            raise CutOff()
        return reply

    with pytest.raises(CutOff):
        run_experiment(InProcessGrid(client_app, num_clients, config, faults=crash), Config.from_run_config(config))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models on a shared 2-core machine: one thread is faster and the numbers do not change
    (a module uses it with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def inprocess(tmp_path):
    def _run(num_clients: int = 3, faults=None, **overrides):
        return run_inprocess(tmp_path, num_clients, faults, **overrides)

    return _run


SMOKE_MARK = "smoke_deploy"


def pytest_configure(config):
    chosen = config.getoption("--device") or os.environ.get(DEVICE_ENV) or "cpu"
    if chosen not in DEVICES:
        raise pytest.UsageError(f"{DEVICE_ENV}={chosen!r}: use one of {', '.join(DEVICES)}")
    os.environ[DEVICE_ENV] = chosen  # xdist workers and the runs tests start in subprocesses read it
    if chosen == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError(f"--device cuda: CUDA is not available on this machine (torch {torch.__version__}); "
                                    "run the suite with --device cpu")
        from fedcore import determinism

        determinism.apply(True, "cuda")  # the tests' own computations too: deterministic kernels, no TF32
    config.addinivalue_line("markers", f"{SMOKE_MARK}: the deployment smoke of `make test-deploy-smoke` (root, "
                                       "docker, namespaces; minutes); runs only when -m names it")


def pytest_collection_modifyitems(config, items):
    """Leave the deployment smoke out of every run whose ``-m`` does not name it (``make test``,
    ``make test-long``): it needs root and starts daemons, and CI runs it on its own."""
    if SMOKE_MARK in (config.option.markexpr or ""):
        return
    kept = [item for item in items if item.get_closest_marker(SMOKE_MARK) is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker(SMOKE_MARK)])
        items[:] = kept


def git(repo: Path, *args: str) -> None:
    """git in ``repo`` with a throwaway identity (the tests' own repositories)."""
    import subprocess

    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git checkout with one committed source file, standing in for the repository (``provenance.ROOT``)."""
    from runner import provenance

    (tmp_path / "fedcore").mkdir()
    (tmp_path / "fedcore" / "x.py").write_text("A = 1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "init")
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    return tmp_path
