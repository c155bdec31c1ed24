"""What a ClientApp process imports before its first message.

Flower's deployment runtime starts a ClientApp process per message, and every Ray actor of a
simulation imports the app once: a heavy import paid there is paid on every message or at every
start-up. Libraries that only the server of one method needs (scikit-learn for MuPFL's k-means,
scipy for FedMCSA's softmax and FedSaC's principal angles, cvxpy for FedSaC's reference solver)
are imported where they are used, so a client of any method never loads them.
"""

from __future__ import annotations

import json
import subprocess
import sys

from fedcore.registry import REGISTRY

SERVER_ONLY_LIBRARIES = ("sklearn", "scipy", "cvxpy", "pandas", "matplotlib")


def test_a_clientapp_of_any_method_does_not_import_server_only_libraries():
    code = (
        "import json, sys\n"
        "import clients.app\n"
        "from fedcore.config import Config\n"
        "from fedcore.registry import get_method\n"
        f"for name in {sorted(REGISTRY)!r}:\n"
        "    Config.from_run_config({'method': name, 'dataset': 'digits'})\n"
        "    get_method(name).client\n"
        f"print(json.dumps(sorted(m for m in {SERVER_ONLY_LIBRARIES!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
