"""CReFF in a federation: two in-process rounds through the real ServerApp and ClientApp, with the matching
losses in rounds.csv and the evaluated model being the global body with the re-trained classifier."""

from __future__ import annotations

import csv


def test_two_rounds_in_process(tmp_path, inprocess):
    summary, _ = inprocess(method="creff", model="mupflcnn", **{"num-server-rounds": 2})
    assert summary["status"] == "completed" and summary["dropped_replies"] == 0
    with open(tmp_path / "results" / "test-run" / "rounds.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for r in rows:
        assert 0 <= float(r["m_match_loss"]) <= 2 and 0 <= float(r["m_match_loss_before"]) <= 2
    # each round's matching lowers the distance it starts from
    assert all(float(r["m_match_loss"]) <= float(r["m_match_loss_before"]) for r in rows)
