"""The memory budget that refuses a simulation too big for this machine, the process-tree memory sampler and
the end-to-end scale benchmark (one real ``flwr run`` at a small client count, ``make test-long``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import scale_e2e
from benchmarks.proc_memory import TreeSampler, descendants, process_memory, tree_memory
from runner import memory_budget as mb
from tests.conftest import test_device

ROOT = Path(__file__).resolve().parents[1]


def test_the_estimate_grows_with_clients_and_counts_only_the_actors_that_can_run():
    one, many = mb.estimate_bytes(10, 2), mb.estimate_bytes(10_000, 2)
    assert many - one == (10_000 - 10) * mb.PER_CLIENT_BYTES
    # two cores, one CPU per client: two actors, however many clients; one client: one actor
    assert mb.estimate_bytes(10, 2) - mb.estimate_bytes(10, 1) == mb.PER_ACTOR_BYTES
    assert mb.estimate_bytes(1, 8) == mb.FIXED_BYTES + mb.PER_ACTOR_BYTES + mb.PER_CLIENT_BYTES
    with pytest.raises(ValueError, match="at least 1"):
        mb.estimate_bytes(0, 2)


def test_a_run_that_does_not_fit_the_available_memory_is_refused_with_both_numbers():
    need = mb.estimate_bytes(1000, 2)
    assert mb.check_fits(1000, 2, available=int(need * mb.HEADROOM) + 1) == need
    assert mb.check_fits(1000, 2, available=None) == need  # unknown memory: nothing refused
    with pytest.raises(mb.NotEnoughMemory) as refused:
        mb.check_fits(1000, 2, available=2_000_000_000)
    message = str(refused.value)
    assert f"about {need / 1e9:.1f} GB" in message and "only 2.0 GB is available" in message
    assert mb.SKIP_ENV in message


def test_the_launcher_refuses_a_huge_federation_before_anything_starts():
    """A client count no machine holds: exit 2 with the estimate and the available memory, in about the
    time of the config check (no SuperLink, no Ray: their start alone takes seconds)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(mb.SKIP_ENV, None)
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "runner.launch", "--supernodes", "100000000", "--app", str(ROOT),
                           "--run-config", f"method='fedavg' device='{test_device()}'"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "100000000 simulated clients need about" in done.stderr and "is available now" in done.stderr
    assert "flower-superlink" not in done.stdout + done.stderr and time.time() - t0 < 30


def test_the_skip_switch_lets_a_run_start_whatever_the_estimate(monkeypatch):
    monkeypatch.setenv(mb.SKIP_ENV, "1")
    assert mb.check_launch(100_000_000, 1) > 0
    monkeypatch.delenv(mb.SKIP_ENV)
    with pytest.raises(mb.NotEnoughMemory):
        mb.check_launch(100_000_000, 1)


def test_the_sampler_sees_a_child_process_and_its_memory():
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(200_000_000); time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30  # polling only, on a loaded machine the child's start takes a while
        while (process_memory(child.pid) or (0,))[0] <= 200_000_000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert child.pid in descendants(os.getpid())
        with TreeSampler(os.getpid(), interval=0.1) as sampler:
            time.sleep(0.5)
        sample = tree_memory(os.getpid())
        assert sample["processes"] >= 2 and sample["rss"] > 200_000_000
        assert sampler.samples >= 2 and sampler.peak_rss > 200_000_000
        assert sampler.peak_pss is None or 0 < sampler.peak_pss <= sampler.peak_rss
    finally:
        child.kill()
        child.wait()


def _row(clients, pss, status="finished:completed"):
    return {"clients": clients, "status": status, "peak_pss_gb": pss, **{f"pss_gb {k}": pss / 4 for k in
                                                                       scale_e2e.KIND_NAMES}}


def test_the_fit_is_a_line_through_the_completed_points_and_the_table_calls_its_limit_an_extrapolation():
    rows = [_row(100, 2.1), _row(300, 2.3), _row(1000, 3.0), _row(3000, 99.0, "finished:failed")]
    a, b = scale_e2e.fit(rows)
    assert a == pytest.approx(2.0) and b == pytest.approx(0.001)
    assert scale_e2e.fit(rows[:1]) is None
    for r in rows:
        r.update(rounds=5, fraction=0.1, method="fedavg", cpus=2, mem_total_gb=25.0, peak_rss_sum_gb=1.0,
                 processes=14, startup_s=10.0, first_round_s=2.0, round_s=1.0, run_s=30.0, load_at_start=2.0)
    text = scale_e2e.table(rows, "python -m benchmarks.scale_e2e", "abc1234")
    assert "2.00 GB + 1.00 MB x clients" in text and "extrapolation" in text and "about 22,000 clients" in text


@pytest.mark.long  # a real flwr run with 50 simulated clients: make test-long
def test_the_scale_benchmark_completes_a_small_federation_and_reads_its_memory(tmp_path):
    row = scale_e2e.measure(50, 2, 0.1, "fedavg", tmp_path, timeout=600, device=test_device())
    assert row["status"] == "finished:completed", row["log_tail"]
    assert row["rounds_done"] == 2 and row["round_s"] > 0
    assert row["peak_pss_gb"] > 0.1 and row["peak_rss_sum_gb"] >= row["peak_pss_gb"]
    assert row["pss_gb client actors"] > 0 and row["pss_gb flwr-simulation"] > 0


def test_rebuild_writes_the_same_table_from_table_csv(tmp_path):
    rows = [_row(100, 2.1), _row(300, 2.3)]
    for r in rows:
        r.update(rounds=5, fraction=0.1, method="fedavg", cpus=2, mem_total_gb=25.0, peak_rss_sum_gb=1.0,
                 processes=14, startup_s=None, first_round_s=2.0, round_s=1.0, run_s=30.0, load_at_start=2.0)
    made = scale_e2e.write(rows, tmp_path, "python -m benchmarks.scale_e2e --clients 100,300", "abc1234")
    (tmp_path / "table.md").unlink()
    assert scale_e2e.main(["--rebuild", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "table.md").read_text() == made


def test_the_budget_constants_cover_every_measured_peak_of_the_committed_table():
    """The estimate is the benchmark's measurement, rounded up: at or above each completed run's peak PSS in
    docs/results/scale-e2e/table.csv, and not so far above that it refuses runs that fit (within 0.5 GB)."""
    rows = [r for r in scale_e2e.read_csv(ROOT / "docs/results/scale-e2e/table.csv")
            if r["status"] == "finished:completed"]
    assert len(rows) >= 3
    for r in rows:
        need = mb.estimate_bytes(r["clients"], r["cpus"]) / 1e9
        assert r["peak_pss_gb"] <= need <= r["peak_pss_gb"] + 0.5, r["clients"]
