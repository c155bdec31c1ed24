"""The launcher: config checked before anything starts, honest exit status, signals stop everything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedcore.config import Config, ConfigError
from runner import flower_cli as fc
from runner.launch import main, simulate

ROOT = Path(__file__).resolve().parents[1]


def test_a_bad_key_stops_the_launcher_before_any_process_starts(tmp_path, capsys):
    home = tmp_path / "home"
    with pytest.raises(ConfigError, match="num-rounds"):
        simulate({"num-rounds": 3}, supernodes=2, app_dir=ROOT, flwr_home=home)
    assert not home.exists()  # no SuperLink was started
    assert main(["--run-config", "dirichlet.alpha=0.3 partition='pathological'"]) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err and "'dirichlet.alpha'" in err


def test_a_used_run_folder_stops_the_launcher_before_any_process_starts(tmp_path):
    from server_app.results import RunFolderError

    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "summary.json").write_text("{}")
    with pytest.raises(RunFolderError, match="already holds a run"):
        simulate({"results-dir": str(tmp_path), "run-name": "taken"}, supernodes=2, app_dir=ROOT,
                 flwr_home=tmp_path / "home")
    assert not (tmp_path / "home").exists()


def test_a_split_the_clients_cannot_make_stops_the_launcher_before_any_process_starts(tmp_path):
    """mnist5k has 5,000 images: 3,000 clients cannot each get two. Refused here, with the limit, not in each
    client after the SuperLink and Ray have started."""
    home = tmp_path / "home"
    with pytest.raises(ConfigError, match=r"3000 clients on dataset 'mnist5k'.*At most \d+ clients can be served"):
        simulate({"dataset": "mnist5k", "partition": "iid", "results-dir": str(tmp_path)}, supernodes=3000,
                 app_dir=ROOT, flwr_home=home)
    assert not home.exists()  # no SuperLink was started


def test_the_in_process_engine_refuses_the_same_split_before_any_client_starts():
    from runner.inprocess import run_inprocess

    with pytest.raises(ConfigError, match="pathological.classes-per-client"):
        run_inprocess({"dataset": "digits", "partition": "pathological", "pathological.classes-per-client": 11}, 4)


@pytest.mark.parametrize("result,problem", [
    ({"status": "finished:failed", "summary": None}, "ended finished:failed"),
    ({"status": "finished:completed", "summary": None}, "no summary"),
    ({"status": "finished:completed", "summary": {"final_acc": None, "final_eval_clients": 0}}, "last round"),
    ({"status": "finished:completed", "summary": {"final_acc": 0.9, "final_eval_clients": 2}}, "fewer than min-replies=3"),
    ({"status": "finished:completed", "summary": {"final_acc": 0.9, "final_eval_clients": 3}}, None),
])
def test_only_a_truly_successful_run_counts_as_one(result, problem):
    got = fc.verdict(result, min_replies=3)
    assert (got is None) if problem is None else (problem in got)


@pytest.mark.parametrize("key,value,fragment", [
    ("train-fraction", 1.0, "< 1.0"),
    ("faults.share", 1.5, "<= 1.0"),
])
def test_values_that_fail_later_are_refused_at_start(key, value, fragment):
    with pytest.raises(ConfigError, match=fragment):
        Config.from_run_config({key: value})


def _flower_processes(marker: str) -> list[str]:
    """Processes whose environment or command line holds ``marker`` (the test's private TMPDIR)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in env or marker.encode() in cmd:
            found.append(pid + ": " + cmd.replace(bytes(1), b" ").decode(errors="replace")[:120])
    return found


@pytest.mark.long  # a real flwr run / SuperLink: make test-long
@pytest.mark.e2e
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 130), (signal.SIGINT, 130)])
def test_a_signal_stops_every_process_the_launcher_started(tmp_path, sig, code):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "runner.launch", "--supernodes", "2", "--run-config",
           f"dataset='digits' num-server-rounds=500 results-dir='{tmp_path / 'results'}' run-name='long'"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    deadline = time.monotonic() + 300
    for line in proc.stdout:  # wait until training is under way
        seen.append(line)
        if "[round 2/500]" in line or time.monotonic() > deadline:
            break
    assert any("[round 2/500]" in line for line in seen), "".join(seen[-30:])
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, rest
    assert "interrupted" in rest
    assert _gone(lambda: _flower_processes(str(tmp_path))) == []  # SuperLink, SuperExec and the simulation are gone
    assert not list(tmp_path.glob("flwr-home-*"))  # and so is the launcher's private Flower home
    assert not (tmp_path / "results" / "long" / "summary.json").exists()  # nothing pretends to be complete


@pytest.mark.long  # a real flwr run / SuperLink: make test-long
def test_launcher_output_has_no_line_about_defaults_and_one_summary(tmp_path):
    """Only lines true for the run the user started: none of Flower's generic notes about a default
    configuration or federation size, a progress line per round with an estimate, the summary once."""
    cmd = [sys.executable, "-m", "runner.launch", "--supernodes", "3", "--run-config",
           f"dataset='digits' num-server-rounds=2 results-dir='{tmp_path / 'results'}' run-name='clean'"]
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True,
                          text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    for untrue in ("Created default configuration", "configuration not found", "default simulated SuperNodes",
                   "flwr federation", "To change federation size", "warnings.warn("):
        assert untrue not in out, untrue
    assert "3 clients connected" in out
    assert all(f"[round {r}/2]" in out and "left ~" in out for r in (1, 2))
    assert out.count("| final acc (weighted) %") == 1  # the summary table, printed once


def _fab_contents(fab: bytes) -> dict[str, bytes]:
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(fab)) as z:
        return {n: z.read(n) for n in z.namelist() if not n.startswith(".info/")}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pathspec's, on the pattern style Flower uses
def test_the_staged_app_builds_the_fab_flower_builds_from_the_checkout(tmp_path):
    """flwr run builds its FAB from a staged copy (runner.staged_app) to skip walking .venv: the
    FAB's files must be exactly those Flower's own selection takes from the checkout, byte for byte,
    with a directory that .gitignore excludes never entered."""
    import shutil

    from flwr.cli.build import build_fab_from_files
    from flwr.cli.utils import collect_files

    from runner.staged_app import app_files, stage_app

    app = tmp_path / "app"
    shutil.copytree(ROOT, app, ignore=shutil.ignore_patterns(".venv", ".git", "results", "__pycache__", "docs"))
    (app / "ignored-dir").mkdir()
    (app / "ignored-dir" / "secret.py").write_text("x = 1\n")
    (app / ".gitignore").write_text((app / ".gitignore").read_text() + "\nignored-dir/\n")
    expected = _fab_contents(build_fab_from_files(collect_files(app))[0])
    staged = stage_app(app, tmp_path / "staged")
    assert _fab_contents(build_fab_from_files(collect_files(staged))[0]) == expected
    assert "pyproject.toml" in expected and not any(k.startswith("ignored-dir") for k in expected)
    assert not any(k.startswith("ignored-dir") for k in app_files(app))  # pruned, not walked and dropped


def test_waiting_for_a_run_asks_flwr_ls_only_when_the_simulation_process_is_gone(monkeypatch):
    """Each ``flwr ls`` is a new interpreter (about 1 s of CPU): while flwr-simulation runs it is
    asked every LS_EVERY_S seconds at most, and again as soon as the process has gone."""
    from runner import launch

    clock = [0.0]
    monkeypatch.setattr(fc.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(fc.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))

    class Link:
        asked = 0

        def simulation_running(self):
            return clock[0] < 100  # the run's process ends after 100 s

        def runs(self):
            self.asked += 1
            return [{"run-id": 1, "status": "finished:completed" if clock[0] >= 100 else "running"}]

    link = Link()
    assert launch._wait_finished(link, timeout=1000)[0]["status"] == "finished:completed"
    assert 100 <= clock[0] <= 101  # noticed within a poll of the process ending
    assert link.asked <= 100 / fc.LS_EVERY_S + 2


def test_flower_patches_kick_wakes_flowers_message_mover_and_keeps_its_stop():
    """kick() finds the thread running Flower's own ``vce_api.add_messages_to_queue``; after it, the
    loop's wait ends on a kick (tested with a wait far longer than Flower's 0.1 s) and on a stop."""
    import queue
    import threading

    from flwr.server.superlink.fleet.vce import vce_api

    from fedcore import flower_patches

    class State:  # the LinkState calls the loop makes: count them
        def __init__(self):
            self.calls = 0

        def get_message_ins(self, node_id, limit):
            self.calls += 1
            return []

    assert not flower_patches.kick()  # no engine in this process: nothing to do
    state, f_stop = State(), threading.Event()
    mover = threading.Thread(target=vce_api.add_messages_to_queue, args=(state, queue.Queue(), {7: 0}, f_stop),
                             daemon=True)
    mover.start()
    try:
        assert flower_patches.kick()
        waiter = threading.Thread(target=f_stop.wait, args=(600,), daemon=True)
        waiter.start()
        flower_patches.kick()
        waiter.join(10)
        assert not waiter.is_alive()  # woken by the kick, not after 600 s
        assert state.calls >= 1 and not f_stop.is_set()
    finally:
        f_stop.set()
    mover.join(10)
    assert not mover.is_alive() and f_stop.is_set()


def test_a_ray_head_gets_distinct_ports_that_avoid_the_superlinks(tmp_path):
    """Ports picked one at a time could repeat; ``ray start`` then refused to start ("trying to use a
    port number ... used by other components") and the simulation waited for a head that never came."""
    from runner.ray_head import PORT_FLAGS, RayHead

    ports = fc.free_ports(200, exclude=(1234,))
    assert len(set(ports)) == 200 and 1234 not in ports
    for _ in range(20):
        head = RayHead({}, ROOT, tmp_path / "ray.log", avoid_ports=(head_port := fc.free_port(),))
        cmd = head.command(str(tmp_path))
        chosen = [int(cmd[cmd.index(flag) + 1]) for flag in ("--port", *PORT_FLAGS)]
        assert len(set(chosen)) == len(chosen) == 1 + len(PORT_FLAGS) and head_port not in chosen
        assert head.address == f"127.0.0.1:{chosen[0]}"


def test_waiting_for_a_run_does_not_ask_flwr_ls_while_the_run_is_starting(monkeypatch):
    """Before the run's process appears (the start-up), ``flwr ls`` (1 s of CPU each) is asked at
    most every START_LS_EVERY_S seconds; a run that never gets a process is still found finished."""
    from runner import launch

    clock = [0.0]
    monkeypatch.setattr(fc.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(fc.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))

    class Link:
        def __init__(self, starts_at, ends_at):
            self.starts_at, self.ends_at, self.asked_at = starts_at, ends_at, []

        def simulation_running(self):
            return self.starts_at <= clock[0] < self.ends_at

        def runs(self):
            self.asked_at.append(clock[0])
            return [{"run-id": 1, "status": "finished:completed" if clock[0] >= self.ends_at else "starting"}]

    link = Link(starts_at=3.0, ends_at=20.0)
    assert launch._wait_finished(link, timeout=1000)[0]["status"] == "finished:completed"
    assert link.asked_at == [20.0]  # nothing while it started (3 s) or ran; at once when it ended
    clock[0] = 0.0
    never = Link(starts_at=float("inf"), ends_at=12.0)  # fails before any process appears
    assert launch._wait_finished(never, timeout=1000)[0]["status"] == "finished:completed"
    assert never.asked_at == [5.0, 10.0, 15.0]


def _gone(find, within: float = 60.0) -> list[str]:
    """What ``find()`` still lists once it lists nothing or ``within`` seconds have passed: a killed
    process stays a zombie for a moment. The wait only ends early; what is left decides the test."""
    deadline = time.monotonic() + within
    left = find()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)  # polling only: the verdict is what is left at the end, not how long it took
        left = find()
    return left


@pytest.mark.long  # a real flwr run / SuperLink: make test-long
@pytest.mark.parametrize("when", ["start-up", "under-the-run"])
def test_a_ray_head_that_dies_ends_the_launch_with_its_reason(tmp_path, monkeypatch, when):
    """``ray start`` that exits after its own start-up checks used to leave ``ray.init`` and the launch
    waiting for ever. Whether it dies before the launcher's check of the head (start-up) or after it
    (under the run, seen by the watch), the launch ends failed with the head's reason. Each order is
    forced, not left to timing: the fake head exits when a file appears, made at the chosen moment."""
    from runner import launch, ray_head

    go = tmp_path / "go"
    # the fake head polls for the file; when it exits is set by the file alone, not by a time
    code = (f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
            "print('head failed: bad option'); sys.exit(1)")
    monkeypatch.setattr(ray_head.RayHead, "command", lambda self, temp_dir: [sys.executable, "-c", code])
    if when == "start-up":
        check_alive = ray_head.RayHead.check_alive

        def dead_before_the_check(self):
            go.touch()
            self.proc.wait(timeout=60)
            check_alive(self)
        monkeypatch.setattr(ray_head.RayHead, "check_alive", dead_before_the_check)
    else:
        submit = launch._submit_and_wait

        def dies_once_submitted(*args, **kwargs):
            go.touch()  # the launcher's check has passed: the head is alive until now
            return submit(*args, **kwargs)
        monkeypatch.setattr(launch, "_submit_and_wait", dies_once_submitted)
    result = simulate({"method": "fedavg", "dataset": "digits", "num-server-rounds": 1,
                       "results-dir": str(tmp_path), "run-name": "no-ray"}, supernodes=2, app_dir=ROOT,
                      stream=False, timeout=300, flwr_home=tmp_path / "home")
    assert result["status"] == "finished:failed", result
    assert "ray start exited with 1" in result["details"] and "head failed: bad option" in result["details"]
    assert not _gone(lambda: [p for p in _flower_processes(str(tmp_path / "home")) if "flwr" in p or "flower" in p])


def test_stop_matching_needs_both_the_command_line_and_the_environment(tmp_path):
    """The sweep after a SuperLink's stop selects by its address and its FLWR_HOME together: a
    process of another launch that reuses the port number (other FLWR_HOME) is left alone."""
    code = "import time; time.sleep(600)"  # stand-ins that live until killed; no timing is checked
    ours = subprocess.Popen([sys.executable, "-c", code, "127.0.0.1:45678"],
                            env={**os.environ, "FLWR_HOME": str(tmp_path / "a")})
    other = subprocess.Popen([sys.executable, "-c", code, "127.0.0.1:45678"],
                             env={**os.environ, "FLWR_HOME": str(tmp_path / "a-other")})
    try:
        # Popen returns once exec has begun, before the kernel sets the new command line and environment
        # (both at once): /proc shows them empty for a moment, so wait until both stand-ins show the address.
        shown = lambda: {int(line.split(":")[0]) for line in _flower_processes("127.0.0.1:45678")}  # noqa: E731
        assert not _gone(lambda: {ours.pid, other.pid} - shown())
        assert fc.stop_matching("127.0.0.1:45678", f"FLWR_HOME={tmp_path / 'a'}") == [ours.pid]
        assert ours.wait(timeout=10) is not None and other.poll() is None
    finally:
        other.kill()
        ours.kill()
