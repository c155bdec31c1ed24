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
the estimate is 0.1-0.2 GB above every measured peak. A method whose server keeps one model per client
(FedAMP, FedMCSA, FedSaC, ...) adds that model's size per client on top: the estimate is a floor for those.
"""

from __future__ import annotations

import os

from fedcore.config import ConfigError

# measured, see the module docstring (bytes, PSS)
FIXED_BYTES = 1_200_000_000
PER_ACTOR_BYTES = 470_000_000
PER_CLIENT_BYTES = 270_000
# what the estimate must leave free: the page cache and whatever else runs on the machine meanwhile
HEADROOM = 1.10
SKIP_ENV = "PFL_SKIP_MEMORY_CHECK"  # "1": start the run whatever the estimate says


class NotEnoughMemory(ConfigError):
    """The run's estimated peak memory exceeds the memory available now."""


def estimate_bytes(supernodes: int, concurrent_clients: int) -> int:
    """Estimated peak PSS of a simulation with ``supernodes`` virtual clients, ``concurrent_clients`` of
    them training at once (one Ray actor each)."""
    if supernodes < 1 or concurrent_clients < 1:
        raise ValueError(f"supernodes and concurrent_clients must be at least 1, not {supernodes}, {concurrent_clients}")
    actors = min(supernodes, concurrent_clients)
    return FIXED_BYTES + actors * PER_ACTOR_BYTES + supernodes * PER_CLIENT_BYTES


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


def check_fits(supernodes: int, concurrent_clients: int, available: int | None) -> int:
    """Raise NotEnoughMemory if the estimate (with ``HEADROOM``) exceeds ``available`` bytes; returns the
    estimate. ``available`` None: unknown, nothing is refused."""
    need = estimate_bytes(supernodes, concurrent_clients)
    if available is not None and need * HEADROOM > available:
        raise NotEnoughMemory(
            f"{supernodes} simulated clients need about {need / 1e9:.1f} GB of memory at their peak (estimate: "
            f"{FIXED_BYTES / 1e9:.1f} GB fixed + {min(supernodes, concurrent_clients)} client actors x "
            f"{PER_ACTOR_BYTES / 1e9:.2f} GB + {PER_CLIENT_BYTES / 1e6:.2f} MB per client, plus "
            f"{HEADROOM - 1:.0%} headroom), but only {available / 1e9:.1f} GB is available now: use fewer "
            f"--supernodes, or set {SKIP_ENV}=1 to start it anyway")
    return need


def check_launch(supernodes: int, cpus_per_client: int) -> int:
    """The launcher's check: as many clients train at once as there are cores per ``cpus_per_client``."""
    if os.environ.get(SKIP_ENV) == "1":
        return estimate_bytes(supernodes, 1)
    concurrent = max(1, (os.cpu_count() or 1) // max(cpus_per_client, 1))
    return check_fits(supernodes, concurrent, available_bytes())
