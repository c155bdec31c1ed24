"""Separate network hosts on one machine: the SuperLink and each SuperNode in a network namespace of
its own, joined by veth pairs with addresses from 198.18.0.0/15, so that every message crosses a
network interface as it would between machines (root and iproute2 needed).

Layout (``k`` = 1..N for the SuperNodes, ``0`` for this machine, where the ``flwr`` CLI runs)::

    this machine 198.18.100.2 ─veth─ 198.18.100.1   ┐
    supernode-k  198.18.100.{4k+2} ─veth─ 198.18.100.{4k+1} ├ superlink namespace
                                                      ┘

Each link is its own /30, so no bridge, no forwarding and no firewall rule is involved, and only
addresses created here are ever used.

    python -m runner.netns --supernodes 2 [--secure] --run-config "num-server-rounds=2 dataset='digits'"
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runner import flower_cli as fc
from runner.deploy_local import Host, LocalDeployment

PREFIX = "198.18.100."


class NamespacesUnavailable(RuntimeError):
    """Not root, no iproute2, or the kernel refuses network namespaces here."""


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], text=True, capture_output=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def check_available() -> None:
    """Raise ``NamespacesUnavailable`` with the reason when namespaces cannot be made here."""
    if os.geteuid() != 0:
        raise NamespacesUnavailable("network namespaces need root")
    if shutil.which("ip") is None:
        raise NamespacesUnavailable("iproute2 (`ip`) is not installed")
    probe = f"pflprobe{os.getpid()}"
    out = subprocess.run(["ip", "netns", "add", probe], text=True, capture_output=True, timeout=30)
    if out.returncode != 0:
        raise NamespacesUnavailable(f"`ip netns add` fails here: {out.stderr.strip()}")
    _ip("netns", "del", probe)


class NetworkHosts:
    """A SuperLink namespace and ``supernodes`` SuperNode namespaces, removed again on exit."""

    def __init__(self, supernodes: int):
        if not 1 <= supernodes <= 60:
            raise ValueError("between 1 and 60 SuperNodes (one /30 each in 198.18.100.0/24)")
        self.tag = f"{os.getpid() % 100000}"
        self.link_ns = f"pfl{self.tag}-link"
        self.node_ns = [f"pfl{self.tag}-sn{k}" for k in range(1, supernodes + 1)]
        self.created: list[str] = []

    def _pair(self, k: int, outer_ns: str | None, inner_ns: str) -> None:
        """veth ``k``: link side 198.18.100.{4k+1} in the SuperLink namespace, peer {4k+2} in ``outer_ns``
        (None = this machine)."""
        link_end, peer_end = f"pf{self.tag}l{k}", f"pf{self.tag}p{k}"
        _ip("link", "add", link_end, "type", "veth", "peer", "name", peer_end)
        _ip("link", "set", link_end, "netns", inner_ns)
        _ip("-n", inner_ns, "addr", "add", f"{PREFIX}{4 * k + 1}/30", "dev", link_end)
        _ip("-n", inner_ns, "link", "set", link_end, "up")
        where = [] if outer_ns is None else ["-n", outer_ns]
        if outer_ns is not None:
            _ip("link", "set", peer_end, "netns", outer_ns)
        _ip(*where, "addr", "add", f"{PREFIX}{4 * k + 2}/30", "dev", peer_end)
        _ip(*where, "link", "set", peer_end, "up")

    def __enter__(self) -> NetworkHosts:
        try:
            for ns in (self.link_ns, *self.node_ns):
                _ip("netns", "add", ns)
                self.created.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            self._pair(0, None, self.link_ns)
            for k, ns in enumerate(self.node_ns, start=1):
                self._pair(k, ns, self.link_ns)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in reversed(self.created):  # deleting a namespace deletes its veth ends and their peers
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.created.clear()
        deadline = time.monotonic() + 30  # the kernel tears namespaces down asynchronously: wait for it
        while Path(f"/sys/class/net/pf{self.tag}p0").exists() and time.monotonic() < deadline:
            time.sleep(0.2)

    def route_through_link(self) -> None:
        """Let every host reach every other (a Ray cluster's nodes talk to the head's address and to each
        other): each SuperNode namespace sends everything to its link peer, and the link namespace, whose
        own addresses all answer, forwards between its veths (``ip_forward`` of that namespace only)."""
        for k, ns in enumerate(self.node_ns, start=1):
            _ip("-n", ns, "route", "add", "default", "via", f"{PREFIX}{4 * k + 1}")
        out = subprocess.run(["ip", "netns", "exec", self.link_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                             text=True, capture_output=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"forwarding in {self.link_ns}: {out.stderr.strip()}")

    def pids(self, ns: str) -> list[int]:
        """Every process in namespace ``ns`` (``ip netns pids``)."""
        out = subprocess.run(["ip", "netns", "pids", ns], text=True, capture_output=True, timeout=30)
        return [int(p) for p in out.stdout.split()]

    @property
    def link(self) -> Host:
        """The SuperLink, as this machine reaches it."""
        return Host(f"{PREFIX}1", ("ip", "netns", "exec", self.link_ns))

    def supernode(self, k: int) -> tuple[Host, str]:
        """SuperNode ``k`` (0-based) and the SuperLink address it uses."""
        return Host(f"{PREFIX}{4 * (k + 1) + 2}", ("ip", "netns", "exec", self.node_ns[k])), f"{PREFIX}{4 * (k + 1) + 1}"

    def link_names(self) -> list[str]:
        """Every address of the SuperLink (the SANs its certificate needs)."""
        return [f"{PREFIX}{4 * k + 1}" for k in range(len(self.node_ns) + 1)]

    def bytes_received_by_link(self) -> dict[str, int]:
        """Bytes the SuperLink namespace received on each SuperNode's veth: proof of real traffic."""
        out = {}
        for k in range(1, len(self.node_ns) + 1):
            stats = Path(f"/sys/class/net/pf{self.tag}l{k}/statistics/rx_bytes")
            res = subprocess.run(["ip", "netns", "exec", self.link_ns, "cat", str(stats)], text=True,
                                 capture_output=True, timeout=30)
            out[self.node_ns[k - 1]] = int(res.stdout.strip() or 0)
        return out


def deploy_on_namespaces(run_config: dict, *, supernodes: int, app_dir: Path, workdir: Path, secure: bool = False,
                         runtime: str = "fast", timeout: float = 1800) -> dict:
    """SuperLink and SuperNodes on separate network hosts; returns the run result and the bytes
    each SuperNode sent across its interface."""
    check_available()
    config = fc.resolve_config(run_config, Path(app_dir).resolve(), Path(workdir).resolve() / "results")
    with NetworkHosts(supernodes) as hosts:
        with LocalDeployment(app_dir, workdir, secure=secure, runtime=runtime, link_host=hosts.link,
                             link_names=hosts.link_names()) as dep:
            dep.start_superlink()
            for k in range(supernodes):
                host, link_address = hosts.supernode(k)
                dep.add_supernode(k, supernodes, host=host, link_address=link_address)
            result = dep.run(config, timeout)
        result["bytes_over_veth"] = hosts.bytes_received_by_link()
        result["hosts"] = {"superlink": hosts.link_names(),
                           **{ns: hosts.supernode(k)[0].address for k, ns in enumerate(hosts.node_ns)}}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--supernodes", type=int, default=2)
    parser.add_argument("--secure", action="store_true", help="TLS + SuperNode authentication")
    parser.add_argument("--runtime", choices=("fast", "flower"), default="fast")
    parser.add_argument("--run-config", default="method='fedavg' dataset='digits' num-server-rounds=2")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    fc.exit_on_sigterm()
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="pfl-netns-"))).resolve()
    result = deploy_on_namespaces(fc.parse_overrides(args.run_config), supernodes=args.supernodes, app_dir=Path("."),
                                  workdir=workdir, secure=args.secure, runtime=args.runtime)
    print(f"hosts: {result['hosts']}")
    print(f"bytes the SuperLink received over each SuperNode's veth: {result['bytes_over_veth']}")
    print(f"(logs in {workdir})")
    return fc.report(result, "network-namespace deployment run")


if __name__ == "__main__":
    sys.exit(main())
