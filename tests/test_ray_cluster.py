"""The simulation on a Ray cluster of several machines (``launch --ray-address``).

Fast: an address that cannot be reached is refused before anything starts, with the address and the
reason; a client outside Ray says where it runs without importing Ray.

Long (root, network namespaces standing in for machines, see runner/netns.py): a Ray head with no CPUs
in one namespace (the SuperLink and the launcher run there too), a one-CPU Ray worker in each of two
others. A 20-client run spreads its clients over both workers and ends with the one-node run's
accuracy; a worker killed (SIGKILL, every process of its namespace) during round 2 costs that round
the one reply it was computing, and the run finishes on the other worker.
"""

from __future__ import annotations

import csv
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from runner import flower_cli as fc
from runner import netns
from runner.launch import main, simulate
from runner.ray_head import HEAD_ENV, START_WITHOUT_CLIENT_SERVER, ClusterUnreachable, check_cluster

ROOT = Path(__file__).resolve().parents[1]
RUN = {"method": "fedavg", "dataset": "mnist5k", "num-server-rounds": 3, "seed": 0, "device": "cpu",
       "local-epochs": 1, "plots": False}
CLIENTS = 20
GCS_PORT = 6379  # each namespace has its own ports: Ray's defaults collide with nothing


# ---------------------------------------------------------------- fast
def test_an_unreachable_cluster_is_refused_at_start_with_address_and_reason(tmp_path, capsys):
    target = f"127.0.0.1:{fc.free_port()}"  # nobody listens there
    start = time.monotonic()
    code = main(["--ray-address", target, "--supernodes", "2",
                 "--run-config", f"dataset='digits' num-server-rounds=1 results-dir='{tmp_path}'"])
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == 2 and f"cannot reach the Ray cluster at {target}: connection refused" in err, err
    assert took < 5, took
    assert not list(tmp_path.iterdir())  # no run folder: nothing started


def test_a_port_where_no_ray_gcs_answers_is_refused_within_the_timeout():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def answer_like_a_web_server():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed at the end of the test
                return
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    threading.Thread(target=answer_like_a_web_server, daemon=True).start()
    target = f"127.0.0.1:{server.getsockname()[1]}"
    start = time.monotonic()
    with pytest.raises(ClusterUnreachable, match=f"at {target}: .*no Ray GCS answered within 1.5 s"):
        check_cluster(target, timeout=1.5)
    assert time.monotonic() - start < 4
    server.close()


def test_a_cluster_address_that_is_not_host_port_is_refused(capsys):
    assert main(["--ray-address", "ray-head", "--run-config", "dataset='digits'"]) == 2
    assert "'ray-head' is not HOST:PORT" in capsys.readouterr().err


def test_a_client_outside_ray_says_where_it_runs_without_importing_ray():
    code = ("import sys, json; from clients import placement; w = placement.where(); "
            "print(json.dumps([w, 'ray' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         text=True, capture_output=True, timeout=60)
    import json

    where, ray_imported = json.loads(out.stdout)
    assert where["pid"] > 0 and where["host"] and where["node-ip"] == "" and where["ray-node-id"] == ""
    assert not ray_imported


def test_every_reply_of_a_run_is_placed_in_placement_csv(inprocess):
    summary, _ = inprocess(num_clients=2, **{"num-server-rounds": 1})
    rows = _rows(Path(summary["results_dir"]) / "placement.csv")
    assert [(r["round"], r["phase"], r["partition_id"]) for r in rows] == [
        ("1", phase, str(pid)) for phase in ("train", "evaluate") for pid in range(2)]
    assert {r["pid"] for r in rows} == {str(os.getpid())} and all(r["host"] for r in rows)
    assert {r["node_ip"] for r in rows} == {""}  # not under Ray


# ---------------------------------------------------------------- long: a cluster of namespaces
class Cluster:
    """A Ray head (0 CPUs) in the link namespace, a 1-CPU worker in each node namespace."""

    def __init__(self, hosts: netns.NetworkHosts):
        self.hosts = hosts
        self.head_ip = hosts.link.address
        self.address = f"{self.head_ip}:{GCS_PORT}"
        self.tmp = Path(tempfile.mkdtemp(prefix="pflray-"))  # short: Ray's socket paths stay under 107 bytes
        self.procs: list[subprocess.Popen] = []
        self.worker_ips = [hosts.supernode(k)[0].address for k in range(len(hosts.node_ns))]

    def _ray_start(self, ns: str, name: str, *args: str) -> None:
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-c", START_WITHOUT_CLIENT_SERVER, "start", "--block",
               "--disable-usage-stats", "--temp-dir", str(self.tmp / name), *args]
        env = {**os.environ, **HEAD_ENV, **fc.FLWR_ENV, "PYTHONPATH": str(ROOT)}
        env.pop("RAY_ADDRESS", None)
        self.procs.append(fc.start(cmd, env, ROOT, self.tmp / f"{name}.log"))

    def __enter__(self) -> Cluster:
        self._ray_start(self.hosts.link_ns, "head", "--head", "--port", str(GCS_PORT), "--node-ip-address",
                        self.head_ip, "--num-cpus", "0", "--include-dashboard=false", "--no-monitor")
        for k, ip in enumerate(self.worker_ips):
            self._ray_start(self.hosts.node_ns[k], f"w{k}", "--address", self.address, "--node-ip-address", ip,
                            "--num-cpus", "1")
        self.wait_for_nodes()
        return self

    def wait_for_nodes(self, timeout: float = 180) -> None:
        """Until the head sees both workers' CPUs: the launch sizes its actor pool from them."""
        code = ("import time, ray; ray.init(address=%r, logging_level='ERROR'); t = time.time() + %d\n"
                "while sum(n['Resources'].get('CPU', 0) for n in ray.nodes() if n['Alive']) < %d and time.time() < t:"
                " time.sleep(0.5)\nprint(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))"
                % (self.address, timeout, len(self.worker_ips)))
        out = subprocess.run([*self.hosts.link.prefix, sys.executable, "-c", code], cwd=ROOT, text=True,
                             capture_output=True, timeout=timeout + 60, env={**os.environ, "PYTHONPATH": str(ROOT)})
        alive = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
        assert all(ip in alive for ip in [self.head_ip, *self.worker_ips]), f"cluster not up: {alive}\n{self.logs()}"

    def kill_worker(self, k: int) -> list[int]:
        """SIGKILL every process of worker ``k``'s namespace (its raylet, agents, actors, ``ray start``)."""
        pids = self.hosts.pids(self.hosts.node_ns[k])
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        return pids

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in self.tmp.glob("*.log"))

    def __exit__(self, *exc) -> None:
        for proc in reversed(self.procs):
            fc.stop(proc)
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    try:
        netns.check_available()
    except netns.NamespacesUnavailable as err:
        pytest.skip(str(err))
    with netns.NetworkHosts(2) as hosts:
        hosts.route_through_link()
        with Cluster(hosts) as ray_cluster:
            yield ray_cluster


def launch_on(cluster: Cluster, results: Path, run_name: str, while_running=None) -> tuple[int, str, Path]:
    """``python -m runner.launch --ray-address`` on the head's host; ``while_running(run_dir)`` is
    called every 0.2 s while it runs. Returns its exit status, output and run folder."""
    config = fc.toml_overrides({**RUN, "results-dir": str(results), "run-name": run_name})
    cmd = [*cluster.hosts.link.prefix, sys.executable, "-m", "runner.launch", "--ray-address", cluster.address,
           "--supernodes", str(CLIENTS), "--run-config", config]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = results / f"{run_name}.log"
    results.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline:
            if while_running is not None:
                while_running(results / run_name)
            time.sleep(0.2)
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
    return proc.returncode, log.read_text(errors="replace"), results / run_name


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.long
@pytest.mark.netns
def test_clients_spread_over_two_ray_workers_reach_the_one_node_accuracy(cluster, tmp_path):
    code, out, run_dir = launch_on(cluster, tmp_path / "results", "cluster")
    assert code == 0, out[-4000:] + cluster.logs()
    placed = _rows(run_dir / "placement.csv")
    train = [r for r in placed if r["phase"] == "train"]
    assert len(train) == CLIENTS * RUN["num-server-rounds"], train
    per_node = {ip: sum(r["node_ip"] == ip for r in train) for ip in cluster.worker_ips}
    print("train replies per worker node:", per_node)
    assert all(n > 0 for n in per_node.values()) and sum(per_node.values()) == len(train), per_node
    assert not [r for r in placed if r["node_ip"] == cluster.head_ip]  # the head has no CPU for clients
    cluster.wait_for_nodes(timeout=20)  # the launch left the cluster it joined running, all three nodes

    one_node = simulate({**RUN, "results-dir": str(tmp_path / "one-node"), "run-name": "one-node"},
                        supernodes=CLIENTS, app_dir=ROOT, stream=False, timeout=900)
    assert one_node["status"] == "finished:completed", one_node
    import json

    spread = json.loads((run_dir / "summary.json").read_text())
    print("final accuracy: cluster", spread["final_acc"], "one node", one_node["summary"]["final_acc"])
    assert spread["final_acc"] == pytest.approx(one_node["summary"]["final_acc"], abs=1e-9)
    assert spread["client_acc_mean"] == pytest.approx(one_node["summary"]["client_acc_mean"], abs=1e-9)


@pytest.mark.long
@pytest.mark.netns
def test_a_worker_killed_in_round_2_costs_only_the_reply_it_was_computing(cluster, tmp_path):
    killed: dict = {}

    def kill_in_round_2(run_dir: Path) -> None:
        rounds = run_dir / "rounds.csv"
        if killed or not rounds.exists():
            return
        if any(r["round"] == "1" for r in _rows(rounds)):  # round 1 is written: round 2 is training
            time.sleep(0.5)
            killed["pids"] = cluster.kill_worker(1)
            killed["at"] = time.monotonic()

    code, out, run_dir = launch_on(cluster, tmp_path / "results", "killed", kill_in_round_2)
    assert killed, "the run ended before round 2 could be reached\n" + out[-3000:]
    assert code == 0, out[-4000:] + cluster.logs()
    rounds = {int(r["round"]): r for r in _rows(run_dir / "rounds.csv")}
    print({k: (r["replies"], r["dropped"], r["eval_clients"], r["acc_weighted"]) for k, r in rounds.items()})
    assert int(rounds[1]["dropped"]) == 0
    assert int(rounds[2]["dropped"]) == 1 and int(rounds[2]["replies"]) == CLIENTS - 1  # the one it was computing
    assert int(rounds[3]["dropped"]) == 0 and int(rounds[3]["eval_clients"]) == CLIENTS
    placed = [r for r in _rows(run_dir / "placement.csv") if int(r["round"]) == 3]
    assert placed and {r["node_ip"] for r in placed} == {cluster.worker_ips[0]}  # the survivor took them all
