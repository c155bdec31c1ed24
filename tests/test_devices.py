"""The device path: the session's device option, bad device input refused at start, a client out of
GPU memory, deterministic kernels and the start method of in-process worker pools. Where the real
thing needs a GPU (a machine with fewer GPUs than asked for), torch's own CUDA queries are patched."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from fedcore import determinism
from fedcore.config import Config, ConfigError
from fedcore.models import pick_device
from server_app.app import StartupError
from runner.inprocess import pool_context
from runner.launch import main, simulate
from tests.conftest import DEVICE_ENV, small_config

ROOT_DIR = Path(__file__).resolve().parents[1]

NO_CUDA = not torch.cuda.is_available()


def test_the_session_device_reaches_every_small_config_and_the_fixture(tmp_path, device):
    assert small_config(tmp_path)["device"] == os.environ[DEVICE_ENV] == device.type
    assert small_config(tmp_path)["deterministic"] is True


@pytest.mark.skipif(not NO_CUDA, reason="a machine with CUDA runs device='cuda'")
def test_device_cuda_without_cuda_stops_a_run_at_start(tmp_path, capsys):
    with pytest.raises(ConfigError, match="CUDA is not available"):
        simulate({"device": "cuda"}, supernodes=2, app_dir=ROOT_DIR, flwr_home=tmp_path / "home")
    assert not (tmp_path / "home").exists()  # nothing was started
    assert main(["--run-config", "device='cuda'"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    from tests.conftest import run_inprocess

    with pytest.raises(StartupError, match="CUDA is not available"):  # the clients say so at the handshake
        run_inprocess(tmp_path, 2, None, device="cuda")


@pytest.fixture
def one_gpu(monkeypatch):
    """torch reporting one CUDA device (the real one where there is one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_a_gpu_the_machine_lacks_is_refused_at_start(tmp_path, one_gpu, capsys):
    assert pick_device("cuda:0") == torch.device("cuda:0") and pick_device("cuda") == torch.device("cuda")
    with pytest.raises(RuntimeError, match=r"device 'cuda:7' requested but this machine has 1 GPU\(s\)"):
        pick_device("cuda:7")
    with pytest.raises(ConfigError, match="cuda:0 to cuda:0"):
        simulate({"device": "cuda:7"}, supernodes=2, app_dir=ROOT_DIR, flwr_home=tmp_path / "home")
    assert not (tmp_path / "home").exists()
    assert main(["--run-config", "device='cuda:7'"]) == 2
    assert "1 GPU(s)" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="needs a GPU share per client"):  # Ray would hide the GPU
        simulate({"device": "cuda"}, supernodes=2, app_dir=ROOT_DIR, gpus_per_client=0.0, flwr_home=tmp_path / "h")


@pytest.mark.parametrize("value", ["gpu", "cuda:", "cuda:x", "cuda7", "CUDA"])
def test_a_device_name_torch_would_not_take_is_a_config_error(value):
    with pytest.raises(ConfigError, match="'auto', 'cpu', 'cuda' or 'cuda:N'"):
        Config.from_run_config({"device": value})
    assert Config.from_run_config({"device": "cuda:3"})["device"] == "cuda:3"  # checked against the machine at start


def test_a_client_out_of_gpu_memory_drops_its_reply_with_the_reason_and_the_run_goes_on(tmp_path, monkeypatch):
    """Client 1's training raises torch's OutOfMemoryError in round 1: that reply is dropped with the reason,
    the other clients' replies are aggregated, and client 1 trains again in round 2."""
    from clients.base import ClientMethod
    from tests.conftest import run_inprocess

    original = ClientMethod.train

    def train(self, model, **kwargs):
        if self.env.pid == 1 and self.env.server_round == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (a test)")
        return original(self, model, **kwargs)

    monkeypatch.setattr(ClientMethod, "train", train)
    summary, _ = run_inprocess(tmp_path, 3, None, method="fedavg")
    assert summary["rounds"] == 2 and summary["final_acc"] is not None
    dropped = json.loads((tmp_path / "results" / "test-run" / "dropped.json").read_text())
    assert [(d["round"], d["phase"]) for d in dropped] == [(1, "train")]
    reason = dropped[0]["reason"]
    assert "client 1 ran out of memory" in reason and "round 1 (train)" in reason and "20.00 GiB" in reason


@pytest.fixture
def torch_flags():
    """Restore torch's process-wide kernel flags after a test that changes them."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32,
     torch.backends.cuda.matmul.allow_tf32) = saved[2:6]
    if saved[6] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[6]


def test_deterministic_sets_the_cuda_kernels_and_leaves_the_cpu_alone(torch_flags, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    determinism.apply(True, torch.device("cpu"))
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark) == before
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # set before any CUDA work, whatever the device
    determinism.apply(True, "cuda")
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    determinism.apply(False, "cuda:0")
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
    assert torch.backends.cudnn.benchmark and torch.backends.cudnn.allow_tf32
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    determinism.apply(True, "cuda")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # the user's own setting wins
    assert Config.from_run_config({})["deterministic"] is True  # the run default


def test_in_process_workers_spawn_when_a_run_is_on_cuda(monkeypatch):
    """A forked child cannot use CUDA its parent started: CUDA runs get spawned workers, CPU runs the
    platform's default (fork on Linux), as fast as before; once this process has started CUDA (an earlier
    test in the same worker, on a GPU machine), every pool spawns."""
    default = multiprocessing.get_start_method()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert pool_context("cpu").get_start_method() == default
    assert pool_context("cpu", "cuda:1").get_start_method() == "spawn"
    assert pool_context("auto").get_start_method() == ("spawn" if torch.cuda.is_available() else default)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pool_context("auto").get_start_method() == "spawn"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert pool_context("cpu").get_start_method() == "spawn"


def test_every_process_pool_of_the_project_takes_its_start_method_from_the_runs_devices():
    """A pool that forks after CUDA started fails every run in it ("Cannot re-initialize CUDA in forked
    subprocess"; benchmarks.tune did, found on an H200): each ProcessPoolExecutor of the project's code is
    given ``mp_context``, which ``pool_context`` decides from the runs' devices."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    packages = ("fedcore", "fedstrategies", "clients", "partitions", "server_app", "runner", "benchmarks", "tools")
    pools = [(path.relative_to(root).as_posix(), call.group(0))
             for package in packages for path in sorted((root / package).rglob("*.py"))
             for call in re.finditer(r"ProcessPoolExecutor\((?:[^()]|\([^()]*\))*\)", path.read_text())]
    assert len(pools) >= 2, pools  # runner.compare's comparison and benchmarks.tune's grid at least
    assert [p for p in pools if "mp_context=" not in p[1]] == []


@pytest.mark.long
def test_a_spawned_worker_runs_an_in_process_run(tmp_path):
    """What a CUDA comparison's workers do (spawn), shown on the CPU: the job travels by pickle and the
    worker imports everything itself."""
    from concurrent.futures import ProcessPoolExecutor

    from runner.compare_jobs import run_inprocess_job

    config = small_config(tmp_path, method="fedavg", **{"num-server-rounds": 1})
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        result = pool.submit(run_inprocess_job, config, 2).result()
    assert result["status"] == "finished:completed", result["details"]


def test_the_device_table_is_stamped_and_says_what_is_not_measured():
    from benchmarks.studies.device_rounds import NOT_MEASURED, stamp, table

    info = stamp()
    assert info["torch"] == torch.__version__ and info["commit"] and info["cpu"]
    rows = [{"method": "fedavg", "clients": 10, "cpu": 0.5, "cuda": 0.25},
            {"method": "mupfl", "clients": 100, "cpu": 2.0, "cuda": NOT_MEASURED}]
    text = table(rows, "a setting", info)
    assert f"Commit {info['commit']}, torch {torch.__version__}" in text
    assert "| fedavg | 10 | 0.500 | 0.250 | 0.50 |" in text
    assert f"| mupfl | 100 | 2.000 | {NOT_MEASURED} | - |" in text


@pytest.mark.long
def test_the_device_benchmark_runs_here(tmp_path):
    """The benchmark itself, tiny (digits, 2 clients, 2 rounds, in process): the CPU column is measured, the
    CUDA one only where CUDA is."""
    from benchmarks.studies.device_rounds import NOT_MEASURED, main as bench

    assert bench(["--methods", "fedavg", "--clients", "2", "--rounds", "2", "--engine", "inprocess", "--dataset",
                  "digits", "--out", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "results.json").read_text())["rows"][0]
    assert isinstance(row["cpu"], float) and row["cpu"] > 0
    assert (row["cuda"] == NOT_MEASURED) == NO_CUDA
    assert "| fedavg | 2 |" in (tmp_path / "table.md").read_text()
