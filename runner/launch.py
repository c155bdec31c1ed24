"""Run one experiment through the real ``flwr run`` simulation, safely, and print its results table.

Why a launcher: ``flwr run`` exits 0 even when the run failed, and its managed local SuperLink
outlives the command, keeping the cwd/env of whoever started it (foreign code can be imported by
Ray workers). This module starts a private simulation SuperLink (own FLWR_HOME and ports), runs
``flwr run . --stream``, judges the run by ``flwr ls --format json``, stops the SuperLink, and
prints the summary table. Exit status 0 only for ``finished:completed``.

    python -m runner.launch --supernodes 10 --run-config "method='fedavg' num-server-rounds=5"

``--ray-address HOST:PORT`` joins an existing Ray cluster instead (docs/scale.md): no private head
is started, and the cluster is left running.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from fedcore import flower_patches
from fedcore.config import check_model, check_partition
from runner import flower_cli as fc
from runner.fast_runtime import FAST_TASK_POLL_S, TASK_POLL_ENV
from runner.memory_budget import check_launch
from runner.ray_head import RayHead, RayHeadEnded, check_cluster
from runner.staged_app import stage_app

COMMAND_T0 = time.time()  # when this command started: start-up time is measured from here


class LocalSimulationLink:
    """A private ``flower-superlink --simulation`` that this process starts and stops."""

    def __init__(self, app_dir: Path, flwr_home: Path, started: float | None = None, runtime: str = "fast",
                 ray_address: str | None = None):
        self.app_dir = app_dir
        self.ray_address = ray_address  # an existing cluster to join (HOST:PORT), else a private head
        self.home = flwr_home
        self.port = fc.free_port()
        # PFL_LAUNCHER: the ServerApp leaves the summary table to the launcher (printed once)
        self.env = fc.flower_env(flwr_home, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(self.port), PFL_LAUNCHER="1",
                                 PFL_LAUNCH_T0=str(started or time.time()))
        # the SuperExec that the SuperLink starts polls for the run every second (Flower's own setting);
        # the simulation then started up to 1 s after it was submitted
        self.env.setdefault(TASK_POLL_ENV, FAST_TASK_POLL_S)
        if runtime not in (flower_patches.FAST, flower_patches.STOCK):
            raise ValueError(f"runtime must be 'fast' or 'flower', not {runtime!r}")
        # fast: the ServerApp wakes the simulation engine after each push (fedcore.flower_patches.kick)
        self.env[flower_patches.RUNTIME_ENV] = runtime
        self.proc = None
        self.app: Path | None = None  # the staged app that ``flwr run`` builds its FAB from
        self.ray: RayHead | None = None
        self.not_submitted = ""  # why ``flwr run`` started no run, when it did not

    def __enter__(self) -> LocalSimulationLink:
        self.home.mkdir(parents=True, exist_ok=True)
        # the SuperLink's own address, not Flower's ":local:": with ":local:" a ``flwr`` command that
        # finds this SuperLink stopped (its Ray head died) starts a managed SuperLink of its own, which
        # outlived the launch; with an address it fails with Flower's reason instead
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n')
        with ExitStack() as stack:  # stops what started so far if the start fails
            # Ray, the SuperLink and the staged app start side by side; flwr-simulation joins this Ray
            if self.ray_address:  # the user's cluster: joined, never started or stopped here
                ray = None
                self.env["RAY_ADDRESS"] = self.ray_address
            else:
                ray = stack.enter_context(RayHead(self.env, self.app_dir, self.home / "ray.log", avoid_ports=(self.port,)))
                self.env["RAY_ADDRESS"] = ray.address
            log_file = self.home / "superlink.log"
            cmd = [fc.bin_path("flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
                   "--host", "127.0.0.1", "--port", str(self.port), "--log-file", str(log_file),
                   "--disable-runtime-dependency-installation"]
            self.proc = fc.start(cmd, self.env, self.app_dir, self.home / "processes.log")  # its children's output
            # stopped before Ray (last in, first out), then whatever of its runs' processes outlived it
            stack.callback(fc.stop_matching, f"127.0.0.1:{self.port}", f"FLWR_HOME={self.env['FLWR_HOME']}")
            stack.callback(fc.stop, self.proc)
            self.app = stage_app(self.app_dir, self.home / "app")  # flwr run's FAB build skips .venv (2.9 s)
            fc.wait_healthy(self.port, self.proc, log_file)
            if ray is not None:
                ray.check_alive()
                ray.watch(self._ray_ended)
                self.ray = ray
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _ray_ended(self, reason: str) -> None:
        """The Ray head died under a run: stop the SuperLink (and the simulation below it), so that
        the launch ends with the reason instead of waiting for a cluster that is gone."""
        print(f"error: {reason}; stopping the run", file=sys.stderr, flush=True)
        fc.stop(self.proc, grace=5)

    def check_ray(self) -> None:
        """Raise ``RayHeadEnded`` if the Ray head died, whether its watch saw it first or not (the
        SuperLink was then stopped: nothing to ask)."""
        if self.ray is not None:
            if self.ray.failure is not None:
                raise RayHeadEnded(self.ray.failure)
            self.ray.check_alive()

    def runs(self) -> list[dict]:
        self.check_ray()
        return fc.list_runs(env=self.env, cwd=self.app_dir)

    def simulation_running(self) -> bool:
        """Whether a ``flwr-simulation`` process (the run's ServerApp and clients) is below the SuperLink."""
        return self.proc is not None and fc.running_below(self.proc.pid, "flwr-simulation")


def simulate(run_config: dict[str, object], *, supernodes: int, app_dir: Path = Path("."),
             cpus_per_client: int = 1, gpus_per_client: float | None = None, stream: bool = True,
             timeout: float = 7200, flwr_home: Path | None = None, started: float | None = None,
             runtime: str = "fast", ray_address: str | None = None) -> dict:
    """Run one simulation; returns {"status", "details", "summary" (or None), "results_dir", "run_id",
    "min_replies"}. A bad config raises ConfigError (or RunFolderError) before anything starts, a CUDA
    device this machine lacks included, and so is a run too big for this machine's memory (``runner.memory_budget``;
    not checked when the clients run on a Ray cluster). ``gpus_per_client`` None: the run's device decides
    (``gpu_share``). ``runtime``: "fast" (Flower internals patched, ``fedcore.flower_patches``) or "flower" (Flower
    as shipped). ``ray_address``: join that Ray cluster (``HOST:PORT`` of its head) instead of starting a private
    head; one this machine cannot reach raises ``ClusterUnreachable`` here, before anything starts."""
    app_dir = Path(app_dir).resolve()
    if str(app_dir) not in sys.path:  # the app's own modules (a py: dataset, a model factory), as flwr run has them
        sys.path.insert(0, str(app_dir))
    config = fc.resolve_config(run_config, app_dir, app_dir / "results")
    cfg = fc.check_config(config, app_dir)  # fails in about a second, before the SuperLink and Ray start
    if ray_address:
        check_cluster(ray_address)
    else:
        check_launch(supernodes, cpus_per_client, cfg)  # NotEnoughMemory (a ConfigError): a run that would not fit
    print(check_partition(cfg, supernodes), flush=True)  # a split the clients could not make is refused here
    model_card = check_model(cfg, supernodes)  # so is a user's model that cannot work
    if model_card:
        print(model_card, flush=True)
    if gpus_per_client is None:
        gpus_per_client = gpu_share(cfg["device"], supernodes, cpus_per_client)
    elif gpus_per_client <= 0 and str(cfg["device"]).startswith("cuda"):
        from fedcore.config import ConfigError

        raise ConfigError(f"'device' = {cfg['device']!r} needs a GPU share per client (--gpus-per-client > 0, or "
                          "leave it out): Ray hides the GPUs from a simulated client without one")
    federation = (f"num-supernodes={supernodes} client-resources-num-cpus={cpus_per_client} "
                  f"client-resources-num-gpus={gpus_per_client}")
    home = flwr_home or Path(tempfile.mkdtemp(prefix="flwr-home-"))
    runs, ray_failure, cli_failure = [], None, None
    try:
        with LocalSimulationLink(app_dir, home, started or time.time(), runtime, ray_address) as link:
            args = ["run", str(link.app), "--run-config", fc.toml_overrides(config), "--federation-config", federation]
            try:
                runs = _submit_and_wait(link, args, app_dir, stream, timeout)
            except fc.FlowerCliError as err:  # the SuperLink stopped answering: the run's end is unknown
                cli_failure = str(err)
            link.check_ray()  # a run that ended because its head died ends with the head's reason
            if runs is None:  # nothing to wait for
                return {"status": "not-submitted", "run_id": None, "summary": None, "min_replies": cfg["min-replies"],
                        "results_dir": str(Path(config["results-dir"]) / config["run-name"]),
                        "details": link.not_submitted}
    except RayHeadEnded as ended:  # the head died during the start-up or under the run: one verdict for both
        ray_failure = str(ended)
    finally:
        if flwr_home is None:
            shutil.rmtree(home, ignore_errors=True)
    result = {**fc.run_result(runs, config), "min_replies": cfg["min-replies"]}
    if ray_failure is not None:
        result.update(status="finished:failed", details=ray_failure)
    elif cli_failure is not None:
        result.update(status="unknown", details=cli_failure)
    return result


def _submit_and_wait(link: LocalSimulationLink, args: list[str], app_dir: Path, stream: bool,
                     timeout: float) -> list[dict] | None:
    """``flwr run`` on the link; the runs once finished, or None if no run was submitted (Flower's
    reason in ``link.not_submitted``)."""
    if stream:
        try:
            fc.flwr(*args, "--stream", env=link.env, cwd=app_dir, timeout=timeout, echo=True)
        except fc.FlowerCliError as err:  # refused, or the stream broke off: it counts if no run started
            link.not_submitted = str(err)
        runs = link.runs()
        return runs if runs or not link.not_submitted else None
    try:  # its JSON answer says whether a run started: no ``flwr ls`` in the middle of the start-up
        fc.flwr(*args, "--format", "json", env=link.env, cwd=app_dir, timeout=timeout)
    except fc.FlowerCliError as err:
        link.check_ray()
        link.not_submitted = str(err)
        return None
    return _wait_finished(link, timeout)


def _wait_finished(link: LocalSimulationLink, timeout: float) -> list[dict]:
    return fc.wait_for_run(link.runs, link.simulation_running, timeout)


# a GPU driver's device files (NVIDIA, AMD ROCm, WSL); torch can only find a GPU where one exists
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def auto_gpu_share(supernodes: int, cpus_per_client: int) -> float:
    """Each simulated client's GPU share: all GPUs split over the clients that run at once (one per
    ``cpus_per_client`` cores), so a GPU is used by every concurrent client; 0 without CUDA."""
    import os

    if not any(os.path.exists(dev) for dev in GPU_DEVICE_FILES):
        return 0.0  # no GPU driver: skip importing torch, about 1 s of every launch's start-up
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        return 0.0
    concurrent = max(1, min(supernodes, (os.cpu_count() or 1) // max(cpus_per_client, 1)))
    return min(1.0, gpus / concurrent)


def gpu_share(device: str, supernodes: int, cpus_per_client: int) -> float:
    """Each simulated client's GPU share for a run on ``device``: none on the CPU; else the GPUs shared by
    the clients that run at once (Ray hides the GPUs from a client with no share, so a CUDA run needs
    one). ``cuda``/``cuda:N`` on a machine without that GPU is a ConfigError here, at start."""
    if device == "cpu":
        return 0.0
    if device.startswith("cuda"):
        from fedcore.config import ConfigError
        from fedcore.models import pick_device

        try:
            pick_device(device)
        except RuntimeError as err:
            raise ConfigError(f"'device': {err}") from None
    return auto_gpu_share(supernodes, cpus_per_client)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--supernodes", type=int, default=10, help="number of simulated clients")
    parser.add_argument("--run-config", default="", help="run-config overrides, e.g. \"method='fedavg' seed=1\"")
    parser.add_argument("--cpus-per-client", type=int, default=1)
    parser.add_argument("--gpus-per-client", type=float, default=-1.0,
                        help="GPU share per simulated client; default: the GPUs shared by as many clients as run "
                             "at once (0 without a GPU or with device='cpu')")
    parser.add_argument("--app", default=".", help="the Flower App directory")
    parser.add_argument("--runtime", choices=(flower_patches.FAST, flower_patches.STOCK), default=flower_patches.FAST,
                        help="fast: the ServerApp wakes Flower's simulation engine after each push "
                             "(fedcore.flower_patches); flower: Flower as shipped")
    parser.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                        help="join this existing Ray cluster (its head's GCS address; this machine must be one of "
                             "its nodes) instead of starting a private Ray head; the cluster is left running")
    args = parser.parse_args(argv)
    from fedcore.config import ConfigError
    from runner.ray_head import ClusterUnreachable
    from server_app.results import RunFolderError

    fc.stop_on_signals()
    overrides = fc.parse_overrides(args.run_config)
    try:
        result = simulate(overrides, supernodes=args.supernodes, app_dir=Path(args.app),
                          cpus_per_client=args.cpus_per_client,
                          gpus_per_client=None if args.gpus_per_client < 0 else args.gpus_per_client,
                          started=COMMAND_T0, runtime=args.runtime, ray_address=args.ray_address)
    except (ConfigError, RunFolderError) as err:
        print(f"configuration error: {err}", file=sys.stderr)
        return 2
    except ClusterUnreachable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except fc.Interrupted as sig:
        print(f"\ninterrupted by {sig}: the SuperLink and the simulation were stopped; the run is not complete "
              "(continue it with resume=true and the same run-name)", file=sys.stderr)
        return 130
    return fc.report(result, "run", result["min_replies"])


if __name__ == "__main__":
    sys.exit(main())
