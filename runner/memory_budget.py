"""Whether a simulation fits in this machine's memory, decided before anything starts.

Why: a simulation with too many virtual SuperNodes for the machine's memory does not fail at once; it
swaps or is killed by the kernel's OOM killer part-way through, often after minutes of start-up.
The launcher estimates the run's peak memory from the client count and refuses a run that would not
fit, with the estimate and the available memory in the message.

The constants are the proportional set size (PSS: a shared page counted once) of a whole launch, measured
by ``python -m benchmarks.scale_e2e`` (FedAvg, mnist5k, 10% participation, 100 / 300 / 1,000 / 2,000
clients on 2 cores; docs/results/scale-e2e/table.md, commit fe385b2): the least-squares line there is
1.98 GB + 0.27 MB per client, of which the two client actors held 0.78-0.92 GB. So: a fixed part
(SuperLink, Ray head, flwr-simulation, launcher: the line's 1.98 GB less two actors), one client actor's
largest share (one runs per ``cpus-per-client`` cores), and the slope per virtual client (mostly
flwr-simulation: the ServerApp's per-client records and Flower's per-node contexts and messages). Rounded up:
the estimate is 0.1-0.2 GB above every measured peak. A method whose server keeps models per client (FedAMP,
HeurFedAMP, FedMCSA, FedSaC, pFedGraph: ``SERVER_MODELS_PER_CLIENT``) adds those models for every client on top
(``server_state_bytes``): its state grows with the clients it has aggregated, so by the end of a long run with
all of them.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

from fedcore.config import ConfigError

# measured, see the module docstring (bytes, PSS)
FIXED_BYTES = 1_200_000_000
PER_ACTOR_BYTES = 470_000_000
PER_CLIENT_BYTES = 270_000
# what the estimate must leave free: the page cache and whatever else runs on the machine meanwhile
HEADROOM = 1.10
SKIP_ENV = "PFL_SKIP_MEMORY_CHECK"  # "1": start the run whatever the estimate says


#: whole model copies a method's server keeps for every client it has aggregated (in its ``checkpoint_attrs``):
#: FedAMP's and HeurFedAMP's w_i, FedMCSA's uploaded models, FedSaC's and pFedGraph's theta~_i (and their c_i with
#: ``regulariser = "authors"``, one more). tests/test_server_memory.py checks each against the strategy's state.
SERVER_MODELS_PER_CLIENT = {"fedamp": 1, "heurfedamp": 1, "fedmcsa": 1, "fedsac": 1, "pfedgraph": 1}


class NotEnoughMemory(ConfigError):
    """The run's estimated peak memory exceeds the memory available now."""


def estimate_bytes(supernodes: int, concurrent_clients: int, state_bytes: int = 0) -> int:
    """Estimated peak PSS of a simulation with ``supernodes`` virtual clients, ``concurrent_clients`` of
    them training at once (one Ray actor each), and ``state_bytes`` of the method's per-client server state."""
    if supernodes < 1 or concurrent_clients < 1:
        raise ValueError(f"supernodes and concurrent_clients must be at least 1, not {supernodes}, {concurrent_clients}")
    actors = min(supernodes, concurrent_clients)
    return FIXED_BYTES + actors * PER_ACTOR_BYTES + supernodes * PER_CLIENT_BYTES + state_bytes


def server_models_per_client(cfg) -> int:
    """Model copies the run's server keeps per client (0 for a method without per-client state)."""
    copies = SERVER_MODELS_PER_CLIENT.get(cfg["method"], 0)
    return copies + 1 if copies and cfg.hparams().get("regulariser") == "authors" else copies


@functools.lru_cache(maxsize=8)
def model_bytes(model: str, input_shape: tuple[int, ...], num_classes: int) -> int:
    """Bytes of one copy of the run's model (its state dict as the server holds it): counted here where torch is
    loaded already, else in a child process (``model_bytes_in_child``)."""
    if "torch" not in sys.modules:
        return model_bytes_in_child(model, input_shape, num_classes)
    from fedcore.models import model_facts

    return sum(v.nbytes for v in model_facts(model, tuple(input_shape), num_classes, 0).initial_weights.values())


def model_bytes_in_child(model: str, input_shape: tuple[int, ...], num_classes: int) -> int:
    """``model_bytes`` in a child process: the launcher imports no torch (seconds of start, and hundreds of MB it
    would hold through the run)."""
    code = ("import sys; from fedcore.models import model_facts; "
            "f = model_facts(sys.argv[1], tuple(map(int, sys.argv[2].split(','))), int(sys.argv[3]), 0); "
            "print(sum(v.nbytes for v in f.initial_weights.values()))")
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", code, model, ",".join(map(str, input_shape)), str(num_classes)],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise ConfigError(f"model {model!r} for inputs {tuple(input_shape)} and {num_classes} classes cannot be "
                          f"built: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return int(done.stdout.split()[-1])


def server_state_bytes(cfg, supernodes: int) -> int:
    """The method's per-client server state once every one of ``supernodes`` clients has been aggregated: its
    models per client (``server_models_per_client``) times the model's size; 0 without per-client state."""
    copies = server_models_per_client(cfg)
    if not copies:
        return 0
    from partitions.datasets import load_dataset

    dataset, _, n, seed, data_dir, dataset_params, _, normalize = cfg.data_key(supernodes)
    data = load_dataset(dataset, num_clients=n, seed=seed, data_dir=data_dir, params=dict(dataset_params),
                        normalize=normalize)
    return copies * supernodes * model_bytes(cfg["model"], tuple(data.input_shape), data.num_classes)


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo; None where there is none (then nothing is refused)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(supernodes: int, concurrent_clients: int, available: int | None, state_bytes: int = 0) -> int:
    """Raise NotEnoughMemory if the estimate (with ``HEADROOM``) exceeds ``available`` bytes; returns the
    estimate. ``available`` None: unknown, nothing is refused. ``state_bytes``: the method's server state."""
    need = estimate_bytes(supernodes, concurrent_clients, state_bytes)
    if available is not None and need * HEADROOM > available:
        state = f" + {state_bytes / 1e9:.2f} GB of the method's per-client server state" if state_bytes else ""
        raise NotEnoughMemory(
            f"{supernodes} simulated clients need about {need / 1e9:.1f} GB of memory at their peak (estimate: "
            f"{FIXED_BYTES / 1e9:.1f} GB fixed + {min(supernodes, concurrent_clients)} client actors x "
            f"{PER_ACTOR_BYTES / 1e9:.2f} GB + {PER_CLIENT_BYTES / 1e6:.2f} MB per client{state}, plus "
            f"{HEADROOM - 1:.0%} headroom), but only {available / 1e9:.1f} GB is available now: use fewer "
            f"--supernodes, or set {SKIP_ENV}=1 to start it anyway")
    return need


def check_launch(supernodes: int, cpus_per_client: int, cfg=None) -> int:
    """The launcher's check: as many clients train at once as there are cores per ``cpus_per_client``; with the
    run's ``cfg``, its method's per-client server state counts too (``server_state_bytes``)."""
    if os.environ.get(SKIP_ENV) == "1":
        return estimate_bytes(supernodes, 1)
    concurrent = max(1, (os.cpu_count() or 1) // max(cpus_per_client, 1))
    state = server_state_bytes(cfg, supernodes) if cfg is not None else 0
    return check_fits(supernodes, concurrent, available_bytes(), state)
