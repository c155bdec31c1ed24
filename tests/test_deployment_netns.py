"""SuperLink and SuperNodes on separate network hosts (network namespaces joined by veth pairs,
198.18.100.0/24), without and with TLS + SuperNode authentication (``long``).

Skipped with the reason where namespaces cannot be made (not root, no iproute2, kernel refuses).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runner import netns

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.long, pytest.mark.netns, pytest.mark.deploy]


@pytest.mark.parametrize("secure", [False, True], ids=["insecure", "tls"])
def test_supernodes_on_their_own_network_hosts_run_a_method(tmp_path, secure):
    try:
        netns.check_available()
    except netns.NamespacesUnavailable as err:
        pytest.skip(str(err))
    result = netns.deploy_on_namespaces({"method": "fedproto" if secure else "fedavg", "dataset": "digits",
                                         "num-server-rounds": 2, "node-wait-s": 60, "run-name": "netns",
                                         "results-dir": str(tmp_path / "results")},
                                        supernodes=2, app_dir=ROOT, workdir=tmp_path / "deploy", secure=secure,
                                        timeout=900)
    print(result["hosts"], result["bytes_over_veth"])
    assert result["status"] == "finished:completed", result
    assert result["summary"]["num_clients"] == 2 and result["summary"]["final_acc"] is not None
    assert all(received > 10_000 for received in result["bytes_over_veth"].values()), result["bytes_over_veth"]
    assert not [line for line in Path("/proc/net/dev").read_text().splitlines() if f"pf{netns.os.getpid() % 100000}" in line]
