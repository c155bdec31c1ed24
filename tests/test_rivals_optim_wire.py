"""Per-FedAvg, pFedMe, L2GD and FedNova on the wire: one in-process federation per method (digits, 3 clients,
2 rounds) whose messages are spied on; each way carries exactly its contract's records and config keys.
The rules themselves are tested directly in tests/test_rivals_optim.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedcore import wire
from fedcore.methods.fednova import EPOCHS, NORMALIZER
from fedcore.methods.l2gd import AVERAGING_STEPS, LOCAL_STEPS, PULL
from fedcore.methods.pfedme import UPLOAD
from tests.test_baselines import _spy

ROOT = Path(__file__).resolve().parents[1]

WIRE = {
    # method: (train down, train up, evaluate down, train config keys)
    "per-fedavg": ({wire.WEIGHTS}, {wire.WEIGHTS}, {wire.WEIGHTS}, set()),
    "pfedme": ({wire.WEIGHTS}, {wire.WEIGHTS}, {wire.WEIGHTS}, {UPLOAD}),
    "l2gd": ({wire.WEIGHTS}, {wire.WEIGHTS}, set(), {AVERAGING_STEPS, LOCAL_STEPS, PULL}),
    "fednova": ({wire.WEIGHTS}, {wire.WEIGHTS, NORMALIZER}, {wire.WEIGHTS}, {EPOCHS}),
}


@pytest.mark.parametrize("method", sorted(WIRE))
def test_each_way_carries_exactly_the_contracts_records(inprocess, method):
    hook, log = _spy()
    overrides = {"fraction-train": 0.6} if method == "pfedme" else {}  # pFedMe: S = 2 of the 3 that train
    summary, _ = inprocess(method=method, faults=hook, **overrides)
    assert summary["dropped_replies"] == 0
    down, up, evaluate, config = WIRE[method]
    train = [(m, r) for m, r in log if m.metadata.message_type == "train"]
    assert len(train) == 6  # 3 clients, 2 rounds
    for msg, reply in train:
        sends = method != "pfedme" or msg.content[wire.CONFIG][UPLOAD]
        assert set(msg.content.array_records) == down
        assert set(reply.content.array_records) == (up if sends else set())
        assert config <= set(msg.content[wire.CONFIG])
    if method == "pfedme":
        assert sum(bool(m.content[wire.CONFIG][UPLOAD]) for m, _ in train) == 4
    for msg, _ in [(m, r) for m, r in log if m.metadata.message_type == "evaluate"]:
        assert set(msg.content.array_records) == evaluate


@pytest.mark.long  # a real flwr run: make test-long
@pytest.mark.parametrize("method", sorted(WIRE))
def test_flwr_run_smoke(tmp_path, method):
    from runner.launch import simulate

    config = {"method": method, "dataset": "digits", "num-server-rounds": 2, "results-dir": str(tmp_path),
              "run-name": "smoke"}
    result = simulate(config, supernodes=2, app_dir=ROOT, stream=False, timeout=600, flwr_home=tmp_path / "home")
    assert result["status"] == "finished:completed", result
    summary = json.loads((tmp_path / "smoke" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["dropped_replies"] == 0
