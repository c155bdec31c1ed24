"""FedSaC end to end: the paper's partitions on mnist5k, in-process federations (what crosses the wire,
the regulariser's switch, dropped replies, every option) and a real ``flwr run``. Kept apart from the
unit tests so that mutation testing (tests/test_fedsac.py, tests/test_fedsac_units.py) stays fast."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Message, RecordDict

from fedcore import wire
from fedcore.methods.fedsac import BASIS, REGULARISER, SUBSPACE
from tests.test_baselines import _spy  # a fault hook that records every (request, reply) pair

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- partitions (14), on mnist5k
def test_partitions_pathological_dirichlet_and_homo_follow_the_spec():
    """The paper's four schemes with our partitioners on mnist5k, 10 clients: pathological
    (balanced, 2 classes) = 5 groups of 2 classes shared by 2 clients each, split evenly; Dirichlet
    with min-size 10; Homo sizes within 1; always disjoint and covering the pool."""
    from partitions import build_splits, load_dataset

    data = load_dataset("mnist5k", num_clients=10, seed=0)
    cases = {"pathological": {"classes-per-client": 2, "balance": True}, "dirichlet": {"alpha": 0.1, "min-size": 10},
             "iid": {}}
    for partition, params in cases.items():
        splits = build_splits(data, partition, 10, 0, params)
        pools = [np.concatenate([s.train, s.test]) for s in splits]
        everything = np.concatenate(pools)
        assert len(np.unique(everything)) == len(everything) == len(data.y)
        sizes = np.array([len(p) for p in pools])
        if partition == "iid":
            assert sizes.max() - sizes.min() <= 1
        if partition == "dirichlet":
            assert sizes.min() >= 10
        if partition == "pathological":
            classes = [tuple(np.unique(data.y[p])) for p in pools]
            assert all(len(c) == 2 for c in classes)
            assert len(set(classes)) == 5
            assert all(classes.count(c) == 2 for c in classes)
            for cls in range(10):
                held = [int((data.y[p] == cls).sum()) for p in pools if (data.y[p] == cls).any()]
                assert len(held) == 2 and abs(held[0] - held[1]) <= 1


# ---------------------------------------------------------------- whole runs
FAST = {"method": "fedsac", "model": "simplecnn", "local-steps": 4, "batch-size": 16, "lr": 0.01, "momentum": 0.9,
        "weight-decay": 1e-5, "client-threads": 1}


def test_inprocess_run_records_the_graph_draws_heatmaps_and_switches_the_regulariser_on_after_round_1(inprocess):
    hook, log = _spy()
    summary, grid = inprocess(num_clients=3, faults=hook, **FAST, **{"num-server-rounds": 3, "plots": True})
    assert summary["dropped_replies"] == 0 and summary["rounds"] == 3
    train = [(m, r) for m, r in log if m.metadata.message_type == "train"]
    modes = [dict(m.content.config_records[wire.CONFIG])[REGULARISER] for m, _ in train]
    assert modes == ["off"] * 3 + ["paper"] * 6
    msg, reply = train[-1]
    up = reply.content.array_records
    assert set(up) == {wire.WEIGHTS, SUBSPACE}  # theta_i (P), U_i (d x k) and n_i (a metric)
    assert dict(reply.content.metric_records[wire.METRICS])[wire.NUM_EXAMPLES] > 0
    basis = wire.unpack_arrays(up[SUBSPACE])[BASIS]
    assert basis.shape == (84, 3)
    np.testing.assert_allclose(basis.T @ basis, np.eye(3), atol=1e-5)
    assert sum(v.size for v in wire.unpack_arrays(up[wire.WEIGHTS]).values()) == \
        sum(v.size for v in wire.unpack_arrays(msg.content.array_records[wire.WEIGHTS]).values())
    folder = Path(summary["results_dir"]) / "round_matrices"
    recorded = json.loads((folder / "0002.json").read_text())
    w = np.array(recorded["graph"])
    assert w.shape == (3, 3) and np.allclose(w.sum(axis=1), 1.0) and recorded["pids"] == [0, 1, 2]
    assert (folder / "graph.png").exists() and (folder / "similarity.png").exists()
    assert (folder / "metrics.png").exists()  # the graph diagnostics over the rounds, beside the heatmaps
    rows = list(csv.DictReader(open(Path(summary["results_dir"]) / "rounds.csv")))
    for name in ("self_weight", "row_entropy", "dist_to_p", "similarity_std", "complementarity_std"):
        assert all(0 <= float(r[f"m_{name}"]) <= 2 for r in rows), name
    assert float(rows[1]["m_self_weight"]) == pytest.approx(np.diag(w).mean())
    assert not (folder / "pids.png").exists()  # not a square matrix
    # clients score both models: the aggregated theta~_i the server sent (the one round 3 trains from)
    # and their own trained theta_i, the headline by default
    evaluate = [m for m, _ in log if m.metadata.message_type == "evaluate" and m.metadata.group_id == "2"]
    assert len(evaluate) == 3 and all(wire.WEIGHTS in m.content.array_records for m in evaluate)
    assert summary["final_acc"] == pytest.approx(summary["final_eval_local_acc"])
    assert summary["final_eval_aggregated_acc"] != summary["final_eval_local_acc"]


def test_first_round_trains_without_the_regulariser(inprocess):
    """Round 1's training is the same whatever lambda (the regulariser is off); round 2's is not."""
    runs = {lam: inprocess(num_clients=2, **FAST, **{"num-server-rounds": 2, "fedsac.lambda": lam,
                                                      "run-name": f"lam{lam}"})[0] for lam in (0.0, 5.0)}
    rows = {lam: list(csv.DictReader(open(Path(s["results_dir"]) / "rounds.csv"))) for lam, s in runs.items()}
    assert rows[0.0][0]["train_loss"] == rows[5.0][0]["train_loss"]
    assert rows[0.0][1]["train_loss"] != rows[5.0][1]["train_loss"]


def test_a_malformed_reply_is_dropped_and_the_others_are_aggregated(inprocess):
    """Client 1 sends a basis that is not orthonormal in round 1: it is dropped, the round goes on
    with the other two, and client 1 keeps theta(0) (its regulariser stays off in round 2)."""
    hook, log = _spy()

    def faults(msg, reply):
        hook(msg, reply)
        if msg.metadata.message_type == "train" and msg.metadata.group_id == "1" and \
                dict(reply.content.metric_records[wire.METRICS])[wire.PARTITION_ID] == 1:
            content = RecordDict({**{k: v for k, v in reply.content.items()},
                                  SUBSPACE: wire.pack_arrays({BASIS: np.ones((84, 3), np.float32)})})
            return Message(content=content, reply_to=msg)
        return reply

    summary, _ = inprocess(num_clients=3, faults=faults, **FAST)
    assert summary["dropped_replies"] == 1
    dropped = json.loads((Path(summary["results_dir"]) / "dropped.json").read_text())
    assert dropped[0]["client"] == 1 and "not orthonormal" in dropped[0]["reason"]
    round2 = {dict(m.content.config_records[wire.CONFIG])[REGULARISER] for m, _ in log
              if m.metadata.message_type == "train" and m.metadata.group_id == "2" and m.metadata.dst_node_id == 1007}
    assert round2 == {"off"}
    recorded = json.loads((Path(summary["results_dir"]) / "round_matrices" / "0001.json").read_text())
    assert recorded["pids"] == [0, 2]


def test_options_run_end_to_end(inprocess):
    """The spec's variants (authors' regulariser, greedy columns, centred PCA, raw-parameter similarity
    with the clamp, code boundary, cvxpy, the aggregated model as the headline) all run and keep rows on
    the simplex."""
    hook, log = _spy()
    options = {"fedsac.regulariser": "authors", "fedsac.angles": "greedy_columns", "fedsac.center": True,
               "fedsac.sim-vector": "params", "fedsac.sim-clamp": 0.9, "fedsac.alpha-boundary": "code",
               "fedsac.solver": "cvxpy", "fedsac.eval-model": "aggregated"}
    summary, _ = inprocess(num_clients=3, faults=hook, **FAST, **options)
    assert summary["dropped_replies"] == 0 and 0 <= summary["final_acc"] <= 1
    round2 = [m for m, _ in log if m.metadata.message_type == "train" and m.metadata.group_id == "2"]
    assert all(set(m.content.array_records) == {wire.WEIGHTS, "fedsac-reference"} for m in round2)
    assert summary["final_acc"] == pytest.approx(summary["final_eval_aggregated_acc"])
    w = np.array(json.loads((Path(summary["results_dir"]) / "round_matrices" / "0002.json").read_text())["graph"])
    assert (w >= -1e-8).all() and np.allclose(w.sum(axis=1), 1.0, atol=1e-6)


@pytest.mark.long  # a real flwr run / SuperLink: make test-long
def test_flwr_run_smoke(tmp_path):
    """A real ``flwr run`` on the Ray simulation engine: 2 SuperNodes, 2 rounds, digits."""
    from runner.launch import simulate

    config = {**FAST, "dataset": "digits", "num-server-rounds": 2, "results-dir": str(tmp_path), "run-name": "fedsac"}
    result = simulate(config, supernodes=2, app_dir=ROOT, stream=False, timeout=600, flwr_home=tmp_path / "home")
    assert result["status"] == "finished:completed", result
    summary = json.loads((tmp_path / "fedsac" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["dropped_replies"] == 0 and summary["final_acc"] is not None
    assert (tmp_path / "fedsac" / "round_matrices" / "graph.png").exists()
