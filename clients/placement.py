"""Where this client process runs: sent with every reply (``wire.PLACEMENT``) so that the server can log
which machine computed which client's update (``placement.csv`` in the run folder).

Under Flower's Ray simulation a client runs in a Ray actor somewhere in the cluster; the node it landed
on is only known inside that process. Ray is read only where this process already runs under it (an
actor has imported and initialised it): a client in a deployment never imports Ray for this.
"""

from __future__ import annotations

import functools
import importlib
import os
import socket
import sys


@functools.cache
def _ray_node() -> tuple[str, str]:
    """(node IP, node id) of the Ray node this actor runs on; a process never moves between nodes."""
    ray = sys.modules["ray"]
    return importlib.import_module("ray.util").get_node_ip_address(), ray.get_runtime_context().get_node_id()


def where() -> dict[str, str | int]:
    """Host name, process id and, under Ray, the node's IP and id (else empty strings)."""
    ray = sys.modules.get("ray")
    node_ip, node_id = _ray_node() if ray is not None and ray.is_initialized() else ("", "")
    return {"host": socket.gethostname(), "pid": os.getpid(), "node-ip": node_ip, "ray-node-id": node_id}
