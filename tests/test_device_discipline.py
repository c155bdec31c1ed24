"""The suite's device discipline (``--device`` / ``PFL_DEVICE``, tests/conftest.py): every test module
that builds a model, a client or a run gets its device from the session, so ``make test-gpu`` runs
the same tests on CUDA. A static check (the modules' syntax trees), so a new test module that builds
its own CPU model or run config for a client fails here on a CPU machine, before a GPU ever sees it."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
# calls that build a model, a client's environment or data, or a whole run; a module that makes one of the
# DIRECT ones itself must carry the device itself, one that only calls a client's helpers (new_model, ...) may
# get its clients from another test module's helpers that carry it
DIRECT = {"build_model", "seeded_model", "default_model", "ClientEnv", "load_client_data", "run_experiment",
          "simulate", "run_all"}
BUILDERS = DIRECT | {"run_inprocess", "new_model", "model_from", "load_model"}
# what carries the session's device: the fixture, the conftest helpers that put it into run configs
CARRIERS = {"device", "small_config", "inprocess", "test_device", "run_inprocess"}
# modules that build on the CPU on purpose, and why (a new entry needs as good a reason)
CPU_ON_PURPOSE = {
    "test_launch.py": "its configs are refused before any process starts",
    "test_client_count.py": "its client counts are refused before any process starts",
    "test_deploy_smoke.py": "the deployment smoke (root, docker, namespaces) runs CPU SuperNodes",
    "test_deployment_units.py": "partition loading for deployed nodes: data splits, no model",
    "test_paper_settings.py": "parameter counts of the papers' models",
}


def _names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(names called, what carries the device: fixture parameters, imports from tests.conftest, and
    ``tests.<module>`` for helpers imported from another test module, which must carry it itself)."""
    called, carried = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            carried |= {a.arg for a in node.args.args if a.arg in {"device", "inprocess"}}
        elif isinstance(node, ast.ImportFrom) and node.module in ("tests.conftest", "conftest"):
            carried |= {alias.asname or alias.name for alias in node.names} & CARRIERS
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.test_"):
            carried.add(node.module)
        elif isinstance(node, ast.Name) and node.id == "test_device":
            carried.add(node.id)
    return called, carried


CLIENT_BUILDERS = {"ClientEnv", "load_client_data"}  # a client picks its device from the run config it is given


def clients_without_the_device(tree: ast.AST) -> list[str]:
    """Functions that build a client (``ClientEnv``, ``load_client_data``) from a config or device of their
    own: each must name the session's device in its body (``small_config``, ``test_device``, ``device``)."""
    out = []
    for node in tree.body:  # nested functions are part of the function around them
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = {(n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", ""))
                 for n in ast.walk(node) if isinstance(n, ast.Call)}
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {a.arg for a in node.args.args}
        if calls & CLIENT_BUILDERS and not names & {"small_config", "test_device", "device", "_cfg"}:
            out.append(node.name)
    return out


def modules_without_the_device() -> dict[str, list[str]]:
    """``{module: [builders it calls]}`` for every test module that builds without the session's device
    (directly, or only through helpers of a test module that lacks it)."""
    found = {path.name: _names(ast.parse(path.read_text(), str(path))) for path in sorted(TESTS.glob("test_*.py"))}

    def carries(name: str, seen: frozenset = frozenset()) -> bool:
        called, carried = found[name]
        if carried & CARRIERS:
            return True
        if called & DIRECT:
            return False
        helpers = {m.split(".", 1)[1] + ".py" for m in carried if m.startswith("tests.")} - seen
        return any(h in found and carries(h, seen | {name}) for h in helpers)

    out = {}
    for name, (called, _) in found.items():
        built = sorted(called & BUILDERS)
        if built and name not in CPU_ON_PURPOSE and not carries(name):
            out[name] = built
        elif name not in CPU_ON_PURPOSE:
            own = clients_without_the_device(ast.parse((TESTS / name).read_text(), name))
            if own:
                out[name] = [f"{f}() builds a client without it" for f in own]
    return out


def test_every_module_that_builds_a_model_or_run_takes_the_sessions_device():
    missing = modules_without_the_device()
    assert not missing, ("these test modules build a model, client or run without the session's device "
                         "(take the `device` fixture or build run configs with tests.conftest.small_config): "
                         + "; ".join(f"{name}: {', '.join(calls)}" for name, calls in missing.items()))


def test_the_check_sees_a_module_that_builds_on_its_own(tmp_path):
    own = ast.parse("from fedcore.models import build_model\n\ndef test_x():\n    build_model('dnn', (1, 8, 8), 10)\n")
    called, carried = _names(own)
    assert "build_model" in called and not carried
    fixed = ast.parse("def test_x(device):\n    build_model('dnn', (1, 8, 8), 10).to(device)\n")
    assert _names(fixed)[1] == {"device"}
    helper = ast.parse("from tests.test_fedfcd import _client\n")
    assert _names(helper)[1] == {"tests.test_fedfcd"}  # carries the device if tests/test_fedfcd.py does
    assert all(name in {p.name for p in TESTS.glob("test_*.py")} for name in CPU_ON_PURPOSE)  # no stale entry
