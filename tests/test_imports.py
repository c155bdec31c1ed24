"""What a ClientApp process imports before its first message, and what client code may import.

Flower's deployment runtime starts a ClientApp process per message, and every Ray actor of a
simulation imports the app once: a heavy import paid there is paid on every message or at every
start-up. Libraries that only the server of one method needs (scikit-learn for MuPFL's k-means,
scipy for FedMCSA's softmax and FedSaC's graph entropy, cvxpy for FedSaC's reference solver)
are imported by server code alone (a strategy's module, or the strategy when it is built), so a client of
any method never loads them and no round pays their import. No client module
imports server strategy code (``fedstrategies``): message names come from the method's declaration in ``fedcore/methods/``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from fedcore.registry import REGISTRY
from tests.conftest import SMALL_CREFF, SMALL_MUPFL

ROOT = Path(__file__).resolve().parents[1]

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


CLIENTS = ROOT / "clients"
SERVER_PACKAGE = "fedstrategies"


def _imported_modules(path: Path) -> list[str]:
    """Every module an ``import`` or ``from ... import`` statement of a source file names, anywhere in it
    (inside functions too); ``from fedstrategies import x`` gives ``fedstrategies.x``."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_the_tests_take_their_fakes_from_tests_not_from_a_benchmark():
    """fake_clients / fake_reply live in tests/fakes.py (the server benchmark imports them from there): a test that
    took them from benchmarks/ would tie the suite to a benchmark's module."""
    found, attribute = [], "server_time" + ".fake_"  # as a module's attribute (split: this file is searched too)
    for path in sorted((ROOT / "tests").glob("*.py")):
        if any(m.startswith("benchmarks.") and m.rsplit(".", 1)[-1] in ("fake_clients", "fake_reply")
               for m in _imported_modules(path)) or attribute in path.read_text():
            found.append(path.name)
    assert found == []
    assert (ROOT / "tests" / "fakes.py").exists()


def test_no_client_module_imports_server_strategy_code():
    """A method's message names are in fedcore/methods/, its shared maths in fedcore/: clients/ never
    imports fedstrategies/ (a ClientApp would load server code, and the two sides would grow together)."""
    files = sorted(CLIENTS.glob("*.py"))
    assert len(files) > 10
    offending = {f"{path.name}: {name}" for path in files for name in _imported_modules(path)
                 if name == SERVER_PACKAGE or name.startswith(SERVER_PACKAGE + ".")}
    assert not offending, sorted(offending)


def test_importing_the_clientapp_and_every_client_module_loads_no_strategy_module():
    modules = sorted({method.client_path.split(":")[0] for method in REGISTRY.values()})
    code = (
        "import importlib, json, sys\n"
        "import clients.app\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m == {SERVER_PACKAGE!r} "
        f"or m.startswith({SERVER_PACKAGE + '.'!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_server_app_is_the_serverapp_alone_and_the_tools_answer_to_runner_only():
    """server_app/ holds the ServerApp (round loop, nodes, checkpoints, results); the tools live in runner/ and
    answer to ``runner.<tool>`` alone: no import hook keeps an old ``server_app.<tool>`` name alive."""
    import importlib.util

    import server_app

    assert sorted(p.stem for p in (ROOT / "server_app").glob("*.py")) == ["__init__", "app", "checkpoints", "nodes",
                                                                        "results", "tracking"]
    assert not any(type(f).__module__.startswith("server_app") for f in sys.meta_path)
    for tool in ("launch", "compare", "flower_cli", "deploy_local", "docker_stack", "netns", "certs"):
        assert importlib.util.find_spec(f"runner.{tool}") is not None, tool
        assert importlib.util.find_spec(f"server_app.{tool}") is None, tool
    assert server_app.__doc__ and "runner" in server_app.__doc__


def test_a_strategy_imports_its_server_libraries_when_built_not_inside_a_round():
    """A server-only library (scipy for FedMCSA's softmax and FedSaC's graph entropy, scikit-learn for MuPFL's
    k-means, cvxpy for FedSaC's reference solver) costs 0.1 to 3 s to import: the strategy imports it when it
    is built, so that no round's time (and no round-1 timing of benchmarks.server_time) pays it."""
    code = (
        "import json, sys\n"
        "import numpy as np\n"
        "from flwr.app import ArrayRecord, ConfigRecord\n"
        "from fedcore.config import Config\n"
        "from fedcore.models import model_facts\n"
        "from fedcore.registry import REGISTRY, get_method\n"
        "from fedstrategies import server_device\n"
        "from tests.fakes import fake_clients, fake_reply\n"
        "from flwr.supercore.task_identity import TaskIdentity\n"
        "TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # as benchmarks.server_time\n"
        "late = {}\n"
        "small = %r  # the libraries a round uses do not depend on the size of MuPFL's and CReFF's matching\n"
        "for name in sorted(REGISTRY):\n"
        "    model = 'mupflcnn' if name == 'mupfl' else 'cnn'  # as benchmarks.server_time builds each method\n"
        "    cfg = Config.from_run_config({'method': name, 'dataset': 'mnist5k', 'model': model, "
        "'server-device': 'cpu', **small.get(name, {})})\n"
        "    server_device.start('cpu')\n"
        "    facts = model_facts(cfg['model'], (1, 28, 28), 10, 0)\n"
        "    s = get_method(name).strategy(cfg, fake_clients(6), facts)\n"
        "    rng = np.random.default_rng(0)\n"
        "    msgs = s.configure_prepare(None)\n"
        "    replies = [fake_reply(s, m, 'prepare', rng) for m in msgs or []]\n"
        "    before = set(sys.modules)\n"
        "    if msgs:\n"
        "        s.aggregate_prepare_replies(replies)\n"
        "    for rnd in (1, 2):\n"
        "        msgs = list(s.configure_train(rnd, ArrayRecord(), ConfigRecord(), None))\n"
        "        replies = [fake_reply(s, m, 'train', rng) for m in msgs]\n"
        "        s.aggregate_train(rnd, replies)\n"
        "    new = sorted({m.split('.')[0] for m in set(sys.modules) - before} & set(%r))\n"
        "    if new:\n"
        "        late[name] = new\n"
        "print(json.dumps(late))\n"
    ) % ({"mupfl": SMALL_MUPFL, "creff": SMALL_CREFF}, SERVER_ONLY_LIBRARIES)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}
