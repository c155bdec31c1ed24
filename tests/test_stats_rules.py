"""The rules of a table's statistics (runner/stats.py), each checked on its own: the sample std keeps only finite
values and needs two, the paired interval needs two common seeds, identical rows are a tie, and a difference cell
says why it has no number or no interval."""

import math

import pytest

from runner import stats

NAN = float("nan")


def test_the_sample_std_is_over_the_finite_values_only_and_needs_two_of_them():
    assert stats.sample_std([0.8, None, 0.9, NAN]) == pytest.approx(stats.sample_std([0.8, 0.9]))
    assert stats.sample_std([0.8, 0.9]) == pytest.approx(math.sqrt(0.005))  # two values: ddof = 1 over 2
    for too_few in ([], [0.7], [0.7, None], [NAN, 0.7]):
        assert math.isnan(stats.sample_std(too_few)), too_few


def test_a_population_std_converts_from_two_values_on_and_is_nan_below():
    assert stats.sample_from_population(0.5, 2) == pytest.approx(0.5 * math.sqrt(2))
    assert math.isnan(stats.sample_from_population(0.5, 1))
    assert math.isnan(stats.sample_from_population(0.0, 0))


def _same(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(
        (math.isnan(got[k]) and math.isnan(want[k])) if isinstance(want[k], float) and math.isnan(want[k])
        else got[k] == want[k] for k in want)


def test_without_common_seeds_there_is_no_difference_and_no_tie():
    got = stats.paired_difference({0: 0.9, 1: 0.8}, {2: 0.7})
    assert _same(got, {"n": 0, "mean": NAN, "lo": NAN, "hi": NAN, "tie": False}), got
    assert stats.difference_cell(got) == "-"


def test_one_common_seed_gives_the_difference_but_no_interval_and_no_tie():
    got = stats.paired_difference({0: 0.9, 1: 0.8}, {0: 0.7, 2: 0.1})
    assert _same(got, {"n": 1, "mean": pytest.approx(0.2), "lo": NAN, "hi": NAN, "tie": False}), got


def test_a_seed_whose_difference_is_nan_is_left_out_of_the_pairs():
    got = stats.paired_difference({0: 0.9, 1: NAN, 2: 0.8}, {0: 0.8, 1: 0.5, 2: 0.8})
    assert got["n"] == 2 and got["mean"] == pytest.approx(0.05)


def test_two_common_seeds_give_an_interval():
    got = stats.paired_difference({0: 0.90, 1: 0.94}, {0: 0.88, 1: 0.90})
    half = 12.706204736174707 * math.sqrt(0.0002) / math.sqrt(2)  # t(0.975, 1) * s / sqrt(2)
    assert got["n"] == 2 and got["lo"] == pytest.approx(0.03 - half) and got["hi"] == pytest.approx(0.03 + half)
    assert got["tie"]
    assert stats.difference_cell(got) == f"+3.00 [{100 * (0.03 - half):+.2f}, {100 * (0.03 + half):+.2f}] tie"


def test_identical_rows_are_a_tie_though_their_interval_is_the_single_point_zero():
    got = stats.paired_difference({0: 0.9, 1: 0.8, 2: 0.7}, {0: 0.9, 1: 0.8, 2: 0.7})
    assert got["lo"] == got["hi"] == 0.0 and got["tie"]


def test_a_difference_cell_says_why_it_has_no_number():
    assert stats.difference_cell(None) == stats.NOT_AVAILABLE
    assert stats.difference_cell({"mean": 0.1}) == stats.NOT_AVAILABLE  # a table from before per-seed values
    assert stats.difference_cell({"n": NAN, "mean": NAN}) == stats.NOT_AVAILABLE  # n read back from an empty cell
    assert stats.difference_cell({"n": 0, "mean": NAN, "lo": NAN, "hi": NAN, "tie": False}) == "-"
    assert stats.difference_cell({"n": 3, "mean": NAN, "lo": NAN, "hi": NAN, "tie": False}) == "-"


def test_a_difference_cell_shows_an_interval_from_two_seeds_on_and_none_for_one():
    one = {"n": 1, "mean": 0.1, "lo": 0.0, "hi": 0.2, "tie": True}
    assert stats.difference_cell(one) == "+10.00 (1 seed: no interval)"
    two = {"n": 2, "mean": 0.1, "lo": 0.05, "hi": 0.15, "tie": False}
    assert stats.difference_cell(two) == "+10.00 [+5.00, +15.00]"
    read_back = {"n": 3.0, "mean": -0.1, "lo": -0.15, "hi": -0.05, "tie": False}  # n read back as a float
    assert stats.difference_cell(read_back) == "-10.00 [-15.00, -5.00]"
    assert stats.difference_cell({**read_back, "tie": True}, scale=1.0) == "-0.10 [-0.15, -0.05] tie"


def test_a_paired_question_names_its_pairs_and_renders_one_row_each(tmp_path):
    from runner import table

    assert table.parse_pair("fedavg:ditto") == ("fedavg", "ditto")
    assert table.parse_pair("a:b:c") == ("a", "b:c")  # the first colon separates the two labels
    for bad in ("fedavg", "fedavg:", ":ditto", ":"):
        with pytest.raises(SystemExit, match="write it as A:B"):
            table.parse_pair(bad)
    rows = [{"a": "x", "b": "y", "metric": "final_acc", **stats.paired_difference({0: 0.9, 1: 0.8}, {0: 0.8, 1: 0.7})},
            {"a": "x", "b": "z", "metric": "final_acc", **stats.paired_difference({0: 0.9}, {0: 0.8})}]
    assert table.render_paired(rows) == "\n".join([
        "Metric `final_acc`; paired over the seeds both rows have, mean and 95% t-interval in points; tie where it "
        "covers 0.", "", "| difference | seeds | a minus b |", "|---|---|---|",
        f"| x minus y | 2 | {stats.difference_cell(rows[0])} |", "| x minus z | 1 | +10.00 (1 seed: no interval) |"])
    (tmp_path / "headline.csv").write_text("label,metric\nx,final_acc\ny,test_acc_at_best_val\n")
    with pytest.raises(SystemExit) as refused:
        table.headline_metric(tmp_path)
    assert "expected one headline metric, found ['final_acc', 'test_acc_at_best_val']" in str(refused.value.code)
