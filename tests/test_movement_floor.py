"""The server benchmark's data-movement floor (benchmarks/server_time.py) and the zero-copy reading it assumes."""

import numpy as np
import pytest

from benchmarks import server_time
from fedcore import wire


def test_the_floor_row_decodes_and_encodes_every_reply_and_is_measured():
    row = server_time.movement_floor(6, repeats=1)
    assert row["method"] == server_time.MOVEMENT_FLOOR and row["clients"] == row["sampled"] == 6
    assert 0 < row["configure_s"] <= row["round_s"] and row["round_cpu_s"] > 0
    from fedcore.models import model_facts

    one = len(wire.pack_arrays(model_facts("cnn", (1, 28, 28), 10, 0).initial_weights)[wire.PACKED_KEY].data)
    assert row["peak_growth_mb"] == pytest.approx(6 * one / 2**20)


def test_decoding_a_reply_copies_nothing():
    weights = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(3, np.float32)}
    record = wire.pack_arrays(weights)
    data = record[wire.PACKED_KEY].data
    for key, view in wire.unpack_arrays(record).items():
        assert not view.flags.owndata and not view.flags.writeable
        assert np.shares_memory(view, np.frombuffer(data, np.uint8))
        np.testing.assert_array_equal(view, weights[key])


def _row(method, clients, s):
    return {"method": method, "clients": clients, "round": 1, "round_s": s, "round_cpu_s": s, "sampled": clients,
            "configure_s": 0.0, "aggregate_s": s, "evaluate_s": 0.0, "prepare_s": 0.0, "peak_growth_mb": 1.0}


def test_the_notes_compare_each_round_with_the_floor_plus_its_computations_alone():
    rows = [_row("fedavg", 10, 0.1), _row("fedavg", 1000, 3.0), _row("fedamp", 1000, 6.0),
            _row("fedamp (Gram + mixing products alone)", 1000, 1.0), _row(server_time.MOVEMENT_FLOOR, 1000, 2.0),
            _row("matrix-product floor", 1000, 0.5)]
    notes = server_time._movement_notes(rows, [10, 1000])
    assert "- fedavg: 1.5x (wall), 1.5x (CPU)" in notes
    assert "- fedamp: 2.0x (wall), 2.0x (CPU) (with its computations alone)" in notes
    assert not any(n.startswith(("- matrix", "- data", "- fedamp (")) for n in notes)
    assert server_time._movement_notes(rows[:3], [10, 1000]) == []  # no floor row: no notes


def test_a_record_written_piece_by_piece_is_the_packed_record_of_its_arrays():
    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "n": np.array(7, np.int64),
              "b": np.array([True, False]), "e": np.zeros((0, 2), np.float64), "big": np.arange(3, dtype=">i4")}
    buffer, views = wire.empty_packed({k: (v.dtype, v.shape) for k, v in arrays.items()})
    for key, value in arrays.items():
        assert views[key].flags.writeable and views[key].shape == value.shape
        views[key][...] = value
    assert wire.packed_record(buffer)[wire.PACKED_KEY].data == wire.pack_arrays(arrays)[wire.PACKED_KEY].data


@pytest.mark.parametrize("method, what", [("fedavg", "weighted sum"), ("fedrep", "weighted sum"),
                                          ("fednova", "weighted sum"), ("fedsac", "Gram + mixing products"),
                                          ("pfedgraph", "Gram + mixing products")])
def test_the_products_of_the_weighted_mean_methods_fedsac_and_pfedgraph_are_timed_alone_on_the_rounds_replies(method, what):
    row = server_time.measure(method, 3, {})
    (alone,) = row["alone"]
    assert alone["what"] == what and alone["s"] > 0 and alone["cpu_s"] >= 0
    from fedcore.models import model_facts
    from fedstrategies.pairwise import parameter_keys

    weights = model_facts("cnn", (1, 28, 28), 10, 0).initial_weights
    if method == "fedrep":  # FedRep's replies carry the body alone: the head never crosses the wire
        weights = {k: v for k, v in weights.items() if k.startswith("body.")}
    d = sum(np.asarray(weights[k]).size for k in parameter_keys(weights))
    assert alone["mb"] == pytest.approx(3 * d * 4 / 2**20)  # the three replies' models, stacked in float32


def test_fedghs_header_training_is_timed_alone_on_a_copy_of_the_header():
    """FedGH's rule is the server's SGD on the header over the round's (LAR, class) pairs: timed alone on a copy, it
    leaves the strategy's header as the round left it, and its MB are the pairs' features."""
    from fedcore.models import model_facts
    from tests.fakes import after_one_round

    facts = model_facts("cnn", (1, 28, 28), 10, 0)
    strategy, replies = after_one_round("fedgh", server_time._config("fedgh", {}), 4, facts)
    head = {k: v.copy() for k, v in strategy.head.arrays().items()}
    (alone,) = server_time.fedgh_training_alone(strategy, replies, 1, repeats=1)
    pairs = sum(len(wire.unpack_arrays(msg.content[wire.CLASS_FEATURES])[wire.CLASS_IDS]) for msg in replies)
    assert alone["what"] == "header training" and alone["s"] > 0 and pairs > 0
    assert alone["mb"] == pytest.approx(pairs * facts.feature_dim * 4 / 2**20)
    assert all(np.array_equal(strategy.head.arrays()[k], v) for k, v in head.items())
