"""The comparison figures' pieces: every method a look of its own, sample-std bands, t-intervals."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from scipy import stats

from runner.figures import mean_std, paper_method, style, t_interval


@pytest.mark.parametrize("n", [13, 20, 26])
def test_each_method_has_its_own_colour_and_line_style(n):
    looks = [style(i) for i in range(n)]
    pairs = {(lk["color"], lk["linestyle"]) for lk in looks}
    assert len(pairs) == n
    assert len({lk["color"] for lk in looks[:20]}) == min(n, 20)  # tab20: 20 colours before any repeats
    assert all(a["linestyle"] != b["linestyle"] for a, b in zip(looks, looks[1:]))  # neighbours differ twice


def test_band_is_the_sample_std_over_seeds_on_the_rounds_all_seeds_have():
    curves = [{1: 0.5, 2: 0.6, 3: 0.7}, {1: 0.4, 2: 0.8}, {1: 0.6, 2: 0.7, 3: 0.9}]
    rounds, mean, std = mean_std(curves)
    assert rounds.tolist() == [1, 2]
    assert mean.tolist() == pytest.approx([statistics.mean([0.5, 0.4, 0.6]), statistics.mean([0.6, 0.8, 0.7])])
    assert std.tolist() == pytest.approx([statistics.stdev([0.5, 0.4, 0.6]), statistics.stdev([0.6, 0.8, 0.7])])
    assert mean_std([{1: 0.5}])[2].tolist() == [0.0]


def test_interval_is_scipys_t_interval_of_the_mean():
    values = np.array([0.91, 0.93, 0.96])
    mean, low, high = t_interval(values)
    expected = stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=stats.sem(values))
    assert (low, high) == pytest.approx(expected) and mean == pytest.approx(values.mean())
    assert np.isnan(t_interval(np.array([0.9]))[1])


def test_paper_method_comes_from_the_preset():
    labels = ["local", "fedsac", "fedsac-aggregated"]
    assert paper_method({"compare": {"output": "docs/results/fedsac-mnist5k-iid"}}, labels) == "fedsac"
    assert paper_method({"compare": {"output": "x/fedsac-aggregated-demo"}}, labels) == "fedsac-aggregated"
    assert paper_method({"compare": {"output": "x/mnist5k", "highlight": "local"}}, labels) == "local"
    assert paper_method({"compare": {"output": "x/mnist5k"}}, labels) is None
