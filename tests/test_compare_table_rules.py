"""The rules of a comparison table's numbers and files (runner/compare_rows.py, runner/compare_table.py), each
checked on a few hand-made runs whose expected cells are computed here another way (statistics, scipy):
mean ± sample std over seeds, the paper method's paired difference and its t-interval ("tie" where it covers 0),
the headline at the best-validation round (never best-of-test), rounds to target, the footer of runs not run or
failed, the "Made by" line, the exact population -> sample std conversion of ``--rerender``, and sweep.md's
ranking on validation."""

import csv
import json
import math
import statistics
import warnings

import pytest
from scipy import stats as scipy_stats

from runner import provenance
from runner.compare_presets import Entry
from runner.compare_rows import (COLUMNS, PAIRED_COLUMNS, TARGET_COLUMNS, aggregate_row, headline_by_seed,
                                 rounds_to_target, table_rows, target_row)
from runner.compare_table import (footer_failures, made_line, paired_cell, paired_header, pct_cell, read_table_csv,
                                  render_sweep, render_table, rerender, write_table)

NAN = float("nan")


def _keys(accuracy=None):
    """The summary keys of a row's accuracy, as a run writes them: the personalised model's or a method column's."""
    if accuracy is None:
        return ("final_acc", "client_acc_mean", "best_acc", "last10_acc", "best_client_acc_mean",
                "test_acc_at_best_val", "test_client_acc_mean_at_best_val")
    return (f"final_{accuracy}", f"final_{accuracy}_client_mean", f"best_{accuracy}", f"last10_{accuracy}",
            f"best_{accuracy}_client_mean", f"{accuracy}_at_best_val", f"{accuracy}_client_mean_at_best_val")


def _run(seed, acc, val=None, *, accuracy=None, extra=0.0, rounds=None, **more):
    """A run's summary: accuracies derived from ``acc`` so that every column differs from every other."""
    final, client, best, last10, best_client, at_val, at_val_client = _keys(accuracy)
    summary = {"seed": seed, final: acc, client: acc - 0.01, best: acc + 0.02 + extra, last10: acc - 0.005,
               best_client: acc + 0.015 + extra,
               "bytes_up_per_round": 2_000_000 + 1_000_000 * seed, "bytes_down_per_round": 5_000_000 + 3_000 * seed,
               "wall_s_per_round": 1.5 + seed, "client_acc_std": 0.03 + 0.01 * seed, **more}
    if val is not None:
        summary[at_val], summary[at_val_client] = val, val - 0.02
    if rounds is not None:
        summary["_rounds"] = rounds
    return summary


def _mean_sd(values):
    return statistics.fmean(values), statistics.stdev(values)


# ------------------------------------------------------------------------------------------------ compare_rows
@pytest.mark.parametrize("accuracy", [None, "eval_global"])
def test_a_row_is_the_mean_and_sample_std_over_seeds_of_every_column(accuracy):
    runs = [_run(0, 0.80, 0.78, accuracy=accuracy), _run(1, 0.84, 0.83, accuracy=accuracy),
            _run(2, 0.89, 0.85, accuracy=accuracy)]
    row = aggregate_row("m", runs, accuracy)
    acc, val = [0.80, 0.84, 0.89], [0.78, 0.83, 0.85]
    expected = {"final_acc": acc, "client_acc_mean": [a - 0.01 for a in acc], "best_acc": [a + 0.02 for a in acc],
                "last10_acc": [a - 0.005 for a in acc], "best_client_acc_mean": [a + 0.015 for a in acc],
                "test_acc_at_best_val": val, "test_client_acc_mean_at_best_val": [v - 0.02 for v in val]}
    assert row["method"] == "m" and row["seeds"] == 3
    for key, values in expected.items():
        mean, sd = _mean_sd(values)
        assert (row[key], row[f"{key}_std"]) == (pytest.approx(mean, abs=1e-12), pytest.approx(sd, abs=1e-12)), key
    assert row["mb_up_per_round"] == pytest.approx(3.0, abs=1e-12)  # bytes over seeds, mean, in MB (1e6 bytes)
    assert row["mb_down_per_round"] == pytest.approx(5.003, abs=1e-12)
    assert row["wall_s_per_round"] == pytest.approx(2.5, abs=1e-12)
    assert row["client_acc_std_within"] == pytest.approx(0.04, abs=1e-12)  # the mean of the runs' client spreads
    assert set(row) == set(COLUMNS) | {"client_acc_std_within"}


def test_a_missing_or_empty_value_is_nan_and_one_seed_has_no_std():
    row = aggregate_row("m", [{**_run(0, 0.5), "final_acc": None}])
    assert math.isnan(row["final_acc"]) and math.isnan(row["final_acc_std"]) and row["seeds"] == 1
    assert row["best_acc"] == 0.52 and math.isnan(row["best_acc_std"])  # one seed: no spread
    assert math.isnan(row["test_acc_at_best_val"])  # no validation split


def test_rounds_to_target_is_the_first_logged_full_evaluation_at_or_above_it(tmp_path):
    rows = [{"round": "1", "acc_weighted": "0.5", "sampled_eval": ""},
            {"round": "2", "acc_weighted": "", "sampled_eval": ""},
            {"round": "3", "acc_weighted": "0.95", "sampled_eval": "4"},  # a lucky sample of clients: not counted
            {"round": "5", "acc_weighted": "0.9", "sampled_eval": ""},  # exactly the target counts
            {"round": "6", "acc_weighted": "0.97", "sampled_eval": ""}]
    assert rounds_to_target(rows, "acc_weighted", 0.9) == 5
    assert rounds_to_target(rows, "acc_weighted", 0.96) == 6
    assert rounds_to_target(rows, "acc_weighted", 0.98) is None
    path = tmp_path / "rounds.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ["round", "acc_weighted", "sampled_eval"])
        w.writeheader()
        w.writerows(rows)
    assert rounds_to_target(path, "acc_weighted", 0.9) == 5  # the same read from a rounds.csv
    assert rounds_to_target([{"round": "4", "x": "0.7"}], "x", 0.7) == 4  # no sampled_eval column: every round counts


def test_target_row_is_mean_and_sample_std_over_the_runs_that_reached_it():
    mean, sd = _mean_sd([10, 14])
    got = target_row([10, None, 14])
    assert got == {"rounds_to_target": pytest.approx(mean), "rounds_to_target_std": pytest.approx(sd),
                   "runs_reaching_target": "2/3"}
    none = target_row([None, None])
    assert math.isnan(none["rounds_to_target"]) and math.isnan(none["rounds_to_target_std"])
    assert none["runs_reaching_target"] == "0/2"
    assert math.isnan(target_row([7])["rounds_to_target_std"]) and target_row([7])["rounds_to_target"] == 7


def _paired(ours, theirs):
    """mean and 95% t-interval of ours - theirs over common seeds, by hand (statistics + scipy's t quantile)."""
    d = [ours[s] - theirs[s] for s in sorted(set(ours) & set(theirs))]
    mean, sd = _mean_sd(d)
    half = scipy_stats.t.ppf(0.975, len(d) - 1) * sd / math.sqrt(len(d))
    return mean, mean - half, mean + half, len(d)


def _curve(*accs):
    return [{"round": str(i + 1), "acc_weighted": str(a), "eval_global": str(a - 0.2)} for i, a in enumerate(accs)]


def _study():
    """Three seeds of pfedpm (the paper method) and fedavg, a global-model row read from pfedpm's runs, a row
    without runs and rounds curves for a 90% target."""
    vals = {"pfedpm": (0.90, 0.92, 0.95), "fedavg": (0.86, 0.91, 0.90)}
    runs = {m: [_run(s, v + 0.01, v, extra=0.05, rounds=_curve(0.5, v, v + 0.02, v + 0.05),
                     eval_global_at_best_val=v - 0.1, eval_global_client_mean_at_best_val=v - 0.12,
                     final_eval_global=v - 0.09) for s, v in enumerate(vs)]
            for m, vs in vals.items()}
    rows_of = [Entry("fedavg", "fedavg"), Entry("pfedpm", "pfedpm"),
               Entry("pfedpm-global", "pfedpm", runs_of="pfedpm", accuracy="eval_global"), Entry("ditto", "ditto")]
    preset = {"compare": {"methods": ["fedavg", "pfedpm"], "seeds": [0, 1, 2], "target-acc": 0.9},
              "run-config": {"dataset": "digits"}}
    return rows_of, runs, preset, vals


def test_table_rows_hold_each_rows_statistics_rounds_to_target_and_the_paired_difference_to_the_paper_method():
    rows_of, runs, preset, vals = _study()
    rows = table_rows(rows_of, runs, preset)
    assert [r["method"] for r in rows] == ["fedavg", "pfedpm", "pfedpm-global"]  # ditto has no runs: no row
    by = {r["method"]: r for r in rows}
    assert by["fedavg"]["test_acc_at_best_val"] == pytest.approx(statistics.fmean(vals["fedavg"]))
    # the runs-of row reads pfedpm's runs, in its own accuracy column
    assert by["pfedpm-global"]["test_acc_at_best_val"] == pytest.approx(statistics.fmean(vals["pfedpm"]) - 0.1)
    assert by["pfedpm-global"]["seeds"] == 3
    # rounds to 90% (accuracy curve 0.5, v, v + 0.02, v + 0.05): round 2 where v >= 0.9, else the first above
    assert (by["pfedpm"]["rounds_to_target"], by["pfedpm"]["runs_reaching_target"]) == (2.0, "3/3")
    assert by["fedavg"]["rounds_to_target"] == pytest.approx(statistics.fmean([4, 2, 2]))
    assert by["fedavg"]["rounds_to_target_std"] == pytest.approx(statistics.stdev([4, 2, 2]))
    # the global row counts rounds in its own column: eval_global = acc - 0.2 never reaches 90%
    assert by["pfedpm-global"]["runs_reaching_target"] == "0/3"
    # every row against the paper method, on the test accuracy at the best-validation round, seed by seed
    ours = dict(enumerate(vals["pfedpm"]))
    for label, theirs in (("fedavg", dict(enumerate(vals["fedavg"]))),
                          ("pfedpm-global", {s: v - 0.1 for s, v in ours.items()})):
        mean, lo, hi, n = _paired(ours, theirs)
        row = by[label]
        assert (row["paired_vs"], row["paired_metric"], row["diff_n"]) == ("pfedpm", "test_acc_at_best_val", n)
        assert (row["diff_mean"], row["diff_lo"], row["diff_hi"]) == (pytest.approx(mean), pytest.approx(lo),
                                                                      pytest.approx(hi))
    assert by["pfedpm"]["diff_n"] == 0 and by["pfedpm"]["diff_mean"] == 0  # the paper method against itself


def test_the_headline_is_the_papers_metric_at_the_best_val_round_and_the_final_round_without_validation():
    rows_of, runs, preset, vals = _study()
    rows = table_rows(rows_of, runs, {**preset, "paper": {"metric": "client mean", "values": {}}})
    by = {r["method"]: r for r in rows}
    mean, lo, hi, _ = _paired({s: v - 0.02 for s, v in enumerate(vals["pfedpm"])},
                              {s: v - 0.02 for s, v in enumerate(vals["fedavg"])})
    assert by["fedavg"]["paired_metric"] == "test_client_acc_mean_at_best_val"
    assert (by["fedavg"]["diff_mean"], by["fedavg"]["diff_lo"]) == (pytest.approx(mean), pytest.approx(lo))
    # one row without a validation split: every row is compared on the final round (never best-of-test)
    for run in runs["fedavg"]:
        del run["test_acc_at_best_val"]
    rows = table_rows(rows_of, runs, preset)
    by = {r["method"]: r for r in rows}
    mean, lo, hi, _ = _paired({s: v + 0.01 for s, v in enumerate(vals["pfedpm"])},
                              {s: v + 0.01 for s, v in enumerate(vals["fedavg"])})
    assert by["fedavg"]["paired_metric"] == "final_acc"
    assert (by["fedavg"]["diff_mean"], by["fedavg"]["diff_hi"]) == (pytest.approx(mean), pytest.approx(hi))
    assert by["pfedpm-global"]["diff_mean"] == pytest.approx(0.1)  # final_acc = v + 0.01, final_eval_global = v - 0.09


def test_the_focus_is_the_presets_else_the_first_paper_method_and_none_without_one():
    rows_of, runs, preset, _ = _study()
    rows = table_rows(rows_of, runs, {**preset, "compare": {**preset["compare"], "focus": "fedavg"}})
    assert {r["paired_vs"] for r in rows} == {"fedavg"}
    assert {r["method"]: r["diff_n"] for r in rows} == {"fedavg": 0, "pfedpm": 3, "pfedpm-global": 3}
    plain = table_rows(rows_of[:1], runs, {**preset, "compare": {"methods": ["fedavg"]}})  # no paper method
    assert "paired_vs" not in plain[0] and "rounds_to_target" not in plain[0]  # nor a target
    gone = table_rows(rows_of, runs, {**preset, "compare": {**preset["compare"], "focus": "ditto"}})  # no row
    assert all("paired_vs" not in r for r in gone)


def test_headline_by_seed_is_each_rows_headline_per_seed_in_its_own_accuracy():
    rows_of, runs, _, vals = _study()
    got = headline_by_seed(rows_of, runs, "test_acc_at_best_val")
    assert got["fedavg"] == dict(enumerate(vals["fedavg"])) and got["ditto"] == {}
    assert got["pfedpm-global"] == pytest.approx({s: v - 0.1 for s, v in enumerate(vals["pfedpm"])})
    client = headline_by_seed(rows_of, runs, "test_client_acc_mean_at_best_val")
    assert client["pfedpm-global"] == pytest.approx({s: v - 0.12 for s, v in enumerate(vals["pfedpm"])})
    assert client["pfedpm"] == pytest.approx({s: v - 0.02 for s, v in enumerate(vals["pfedpm"])})
    final = headline_by_seed(rows_of, runs, "final_acc")
    assert final["fedavg"] == pytest.approx({s: v + 0.01 for s, v in enumerate(vals["fedavg"])})
    del runs["fedavg"][1]["final_acc"]
    assert math.isnan(headline_by_seed(rows_of, runs, "final_acc")["fedavg"][1])  # a missing value is nan


# ------------------------------------------------------------------------------------------------ compare_table
def test_cells_mean_and_std_in_percent_and_the_rounds_to_target():
    assert pct_cell(0.98754, 0.00104) == "98.75 ± 0.10"
    assert pct_cell(0.98754, 0.00004) == "98.75 ± <0.01"  # never a "± 0.00" that reads as one seed
    assert pct_cell(0.98754, 0.002, one_seed=True) == "98.75" == pct_cell(0.98754, NAN)
    assert pct_cell(NAN, 0.1) == "-"


def test_the_paired_cell_and_its_header():
    row = {"method": "fedavg", "diff_mean": 0.02, "diff_lo": 0.0, "diff_hi": 0.04, "diff_n": 3.0}
    assert paired_cell(row, "pfedpm") == "+2.00 [+0.00, +4.00] tie"  # an interval touching 0 covers it
    assert paired_cell({**row, "diff_lo": -0.04, "diff_hi": 0.0}, "pfedpm") == "+2.00 [-4.00, +0.00] tie"
    assert paired_cell({**row, "diff_lo": 0.001}, "pfedpm") == "+2.00 [+0.10, +4.00]"
    assert paired_cell({**row, "diff_lo": -0.04, "diff_hi": -0.001}, "pfedpm") == "+2.00 [-4.00, -0.10]"
    one = {"method": "fedavg", "diff_mean": 0.02, "diff_n": 1.0}
    assert paired_cell(one, "pfedpm") == "+2.00 (1 seed: no interval)"
    assert paired_cell({**row, "diff_n": NAN}, "pfedpm") == "not available until rebuilt"  # an older table.csv
    assert paired_cell({**row, "method": "pfedpm"}, "pfedpm") == "-"
    rows = [{"method": "fedavg", "test_acc_at_best_val": 0.9}, {"method": "pfedpm", "test_acc_at_best_val": 0.9}]
    assert paired_header({"compare": {}}, rows) == \
        "pfedpm minus row (at best-val round, weighted; points, paired 95% t-interval over seeds)"
    assert paired_header({"compare": {}, "paper": {"metric": "client mean"}}, rows) == \
        "pfedpm minus row (at best-val round, client mean; points, paired 95% t-interval over seeds)"
    assert paired_header({"compare": {}}, [*rows, {"method": "x"}]) == \
        "pfedpm minus row (final acc, weighted; points, paired 95% t-interval over seeds)"
    assert paired_header({"compare": {}}, rows[:1]) is None


def test_the_made_line_names_the_command_commits_source_hash_and_a_dirty_tree():
    made = {"command": "python -m runner.compare conf/x.toml", "commit": "abc1234"}
    assert made_line({"made": made}) == ("Made by `python -m runner.compare conf/x.toml` at commit `abc1234`. The "
                                         "runs' own commits were not recorded (run folders did not record them then).")
    assert made_line({}) == ("Made by `python -m runner.compare` on runs from before commits were recorded; the table "
                             "was re-rendered from its table.csv by the current code.")
    full = {**made, "rerendered": "def5678", "commits": {"abc1234": ["a-s0", "a-s1"]}, "source_hash": "0123"}
    assert made_line({"made": full}) == (
        "Made by `python -m runner.compare conf/x.toml` at commit `abc1234`; re-rendered from table.csv at `def5678`. "
        "Runs from commit `abc1234` (2 runs). Every run has source hash `0123` (sha256 of the source packages).")
    assert made_line({"made": {**full, "table_source_hash": "4567"}}).endswith(
        "Every run has source hash `0123` (sha256 of the source packages); the table's own code has `4567` "
        "(tabled with --runs-source).")
    assert made_line({"made": {**made, "commits": {}, "dirty": True}}) == (
        "Made by `python -m runner.compare conf/x.toml` at commit `abc1234`. \n\n**Made from a tree with uncommitted "
        "changes (`--allow-dirty`): for trying things, not a result.**\n")
    assert "uncommitted" not in made_line({"made": {**made, "dirty": False}})


def _table_rows():
    """Rows as table_rows makes them: two validated rows, one without validation (best-of-test), one of 1 seed."""
    rows_of, runs, preset, _ = _study()
    runs["local"] = [_run(0, 0.7, rounds=_curve(0.7, 0.95)), _run(1, 0.72, rounds=_curve(0.72))]
    runs["solo"] = [_run(0, 0.6, 0.61, rounds=_curve(0.6))]
    return table_rows([*rows_of, Entry("local", "local"), Entry("solo", "solo")], runs, preset), preset


def test_a_rendered_table_shows_each_rows_cells_its_columns_and_its_footer():
    rows, preset = _table_rows()
    preset = {**preset, "made": {"command": "cmd", "commit": "abc1234"}, "std": "sample"}
    preset["paper"] = {"metric": "weighted", "data": "CIFAR-10", "values": {"pfedpm": 91.5}}
    failures = ["ditto seed 0: not run", "ditto seed 1: not run", "solo seed 1: exit code 1", "solo seed 2: killed"]
    lines = render_table(rows, preset, failures).splitlines()
    assert lines[0] == "Setting: dataset=digits; 10 clients; engine flwr."
    assert lines[1] == made_line(preset)
    assert "± is the sample std over seeds (ddof = 1). Client spread" in lines[2]
    assert "Best-val round: the evaluated round" in lines[2] and "Paired difference: the table's headline " \
        "accuracy of pfedpm minus the row's" in lines[2]
    header = [h.strip() for h in lines[4].strip("|").split("|")]
    assert header == ["method", "paper (CIFAR-10, weighted)", "ours (weighted, best-of-test, optimistic)",
                      "final acc (weighted)", "final acc (client mean)", "test acc at best-val round (weighted)",
                      "test acc at best-val round (client mean)", "best-of-test acc (weighted, optimistic)",
                      "best-of-test acc (client mean, optimistic)", "last-10 mean (weighted)",
                      "client spread (std over clients)", "MB up / round", "MB down / round", "s / round",
                      "rounds to 90%",
                      "pfedpm minus row (final acc, weighted; points, paired 95% t-interval over seeds)"]
    assert lines[5] == "|---" * len(header) + "|"
    cells = {line.split(" | ")[0].removeprefix("| "): [c.strip() for c in line.strip("|").split("|")][1:]
             for line in lines[6:6 + len(rows)]}
    assert list(cells) == ["fedavg", "pfedpm", "pfedpm-global", "local (2 seeds)", "solo (1 seed)"]
    by = {r["method"]: r for r in rows}
    pf = by["pfedpm"]
    assert cells["pfedpm"] == [
        "91.50", pct_cell(pf["best_acc"], pf["best_acc_std"]), pct_cell(pf["final_acc"], pf["final_acc_std"]),
        pct_cell(pf["client_acc_mean"], pf["client_acc_mean_std"]),
        pct_cell(pf["test_acc_at_best_val"], pf["test_acc_at_best_val_std"]),
        pct_cell(pf["test_client_acc_mean_at_best_val"], pf["test_client_acc_mean_at_best_val_std"]),
        pct_cell(pf["best_acc"], pf["best_acc_std"]),
        pct_cell(pf["best_client_acc_mean"], pf["best_client_acc_mean_std"]),
        pct_cell(pf["last10_acc"], pf["last10_acc_std"]), "4.00", "3.000", "5.003", "2.50", "2.0 ± 0.0", "-"]
    # fedavg: best-val accuracies 0.86, 0.91, 0.90 -> 89.00 ± 2.65; its rounds 4, 2, 2 -> 2.7 ± 1.2
    assert cells["fedavg"][0] == "-" and cells["fedavg"][4] == "89.00 ± 2.65" and cells["fedavg"][-2] == "2.7 ± 1.2"
    mean, lo, hi, _ = _paired({0: 0.91, 1: 0.93, 2: 0.96}, {0: 0.87, 1: 0.92, 2: 0.91})  # on the final round
    assert cells["fedavg"][-1] == f"{100 * mean:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}] tie"
    assert cells["pfedpm-global"][-2] == "not reached"
    assert cells["local (2 seeds)"][4:6] == ["-", "-"]  # no validation split: no best-val cells
    assert cells["local (2 seeds)"][-2] == "2.0 (1 of 2 runs)"  # one run reached it: no ±
    assert cells["solo (1 seed)"][2] == "60.00" and cells["solo (1 seed)"][4] == "61.00"  # one seed: no ±
    assert lines[6 + len(rows):] == ["", "Not run (2): ditto seed 0; ditto seed 1", "",
                                     "Failed runs: solo seed 1: exit code 1; solo seed 2: killed"]


def test_the_footer_of_runs_not_run_and_failed_is_read_back_from_the_rendered_table(tmp_path):
    rows, preset = _table_rows()
    failures = ["m (a): b seed 0: not run", "c seed 1: not run", "d seed 2: exit 1", "e seed 0: timeout"]
    (tmp_path / "table.md").write_text(render_table(rows, preset, failures))
    assert footer_failures(tmp_path / "table.md") == failures
    (tmp_path / "table.md").write_text(render_table(rows, preset, failures[2:]))
    assert footer_failures(tmp_path / "table.md") == failures[2:]
    (tmp_path / "table.md").write_text(render_table(rows, preset, failures[:1]))
    assert footer_failures(tmp_path / "table.md") == failures[:1]
    assert footer_failures(tmp_path / "missing.md") == []


def test_a_table_without_a_paper_method_target_or_validation_has_only_its_columns():
    rows = [aggregate_row("a", [_run(0, 0.5), _run(1, 0.6)]), aggregate_row("b", [_run(0, 0.7), _run(1, 0.7)])]
    rows[1]["client_acc_std_within"] = NAN
    text = render_table(rows, {"compare": {"supernodes": 4, "engine": "inprocess"}}, [])
    lines = text.splitlines()
    assert lines[0] == "Setting: ; 4 clients; engine inprocess." and text.endswith("|\n")
    assert "Best-val round" not in lines[2] and "Paired difference" not in lines[2]
    assert lines[4] == ("| method | final acc (weighted) | final acc (client mean) | best-of-test acc (weighted, "
                        "optimistic) | best-of-test acc (client mean, optimistic) | last-10 mean (weighted) | client "
                        "spread (std over clients) | MB up / round | MB down / round | s / round |")
    assert lines[6].startswith(f"| a | {pct_cell(0.55, statistics.stdev([0.5, 0.6]))} |")
    assert lines[7].startswith("| b | 70.00 ± <0.01 |")
    assert lines[7].endswith("| 71.50 ± <0.01 | 69.50 ± <0.01 | - | 2.500 | 5.002 | 2.00 |")
    one = render_table([aggregate_row("a", [_run(0, 0.5)])], {"compare": {}}, [])
    assert "1 seed, so no ± (no spread over seeds)." in one and "± is" not in one
    assert "| a | 50.00 |" in one  # the only row has all the seeds there are: no "(1 seed)" label
    assert "| a (1 seed) | 50.00 |" in render_table([aggregate_row("a", [_run(0, 0.5)])],
                                                     {"compare": {"seeds": [0, 1]}}, [])


def test_write_table_writes_the_csv_that_reads_back_as_its_rows_and_the_rendered_markdown(tmp_path):
    rows, preset = _table_rows()
    write_table(rows, tmp_path, preset, ["x seed 0: not run"])
    with open(tmp_path / "table.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header == COLUMNS + ["client_acc_std_within"] + TARGET_COLUMNS + PAIRED_COLUMNS
    back = read_table_csv(tmp_path / "table.csv")
    assert [r["method"] for r in back] == [r["method"] for r in rows]
    for row, read in zip(rows, back):
        assert set(read) == set(header)
        assert type(read["seeds"]) is int and read["runs_reaching_target"] == row["runs_reaching_target"]
        assert (read["paired_vs"], read["paired_metric"]) == ("pfedpm", "final_acc")  # "local" has no validation
        for key in set(header) - {"method", "seeds", "runs_reaching_target", "paired_vs", "paired_metric"}:
            assert read[key] == pytest.approx(row[key], nan_ok=True, rel=1e-12), key
    assert (tmp_path / "table.md").read_text() == render_table(rows, preset, ["x seed 0: not run"])
    plain = [aggregate_row("a", [_run(0, 0.5), _run(1, 0.6)])]
    write_table(plain, tmp_path, {"compare": {}}, [])
    with open(tmp_path / "table.csv", newline="") as f:
        assert next(csv.reader(f)) == COLUMNS + ["client_acc_std_within"]  # no target, no paper method
    # a table.csv of older code lacks some columns: they read as nan, shown as "-"
    (tmp_path / "old.csv").write_text("method,final_acc,seeds\nfedavg,0.5,2\n")
    old = read_table_csv(tmp_path / "old.csv")[0]
    assert old["method"] == "fedavg" and old["seeds"] == 2 and old["final_acc"] == 0.5
    assert all(math.isnan(old[k]) for k in COLUMNS if k not in ("method", "final_acc", "seeds"))


def _old_table(folder, preset):
    """A table of older code: population stds (ddof = 0) in its table.csv, a footer in its table.md."""
    runs = {"a": [0.80, 0.86, 0.83], "b": [0.7, 0.75], "c": [0.6]}
    rows = []
    for label, accs in runs.items():
        row = aggregate_row(label, [_run(s, v, v - 0.01) for s, v in enumerate(accs)])
        for key in [k for k in row if k.endswith("_std")]:
            values = {"final_acc_std": accs, "test_acc_at_best_val_std": [v - 0.01 for v in accs]}.get(key)
            row[key] = statistics.pstdev(values) if values and len(values) > 1 else NAN
        rows.append(row)
    write_table(rows, folder, {"compare": {}}, ["d seed 0: not run", "a seed 3: exit 1"])
    (folder / "preset.json").write_text(json.dumps(preset))
    return runs


def test_rerender_converts_population_stds_to_sample_stds_exactly_once_and_keeps_the_footer(tmp_path):
    runs = _old_table(tmp_path, {"compare": {"seeds": [0, 1, 2]}})
    assert rerender(tmp_path) == tmp_path / "table.md"
    back = {r["method"]: r for r in read_table_csv(tmp_path / "table.csv")}
    for label, accs in runs.items():
        if len(accs) > 1:  # sqrt(n / (n - 1)) times the population std is the sample std of the same values
            assert back[label]["final_acc_std"] == pytest.approx(statistics.stdev(accs), rel=1e-12)
            assert back[label]["test_acc_at_best_val_std"] == pytest.approx(
                statistics.stdev([v - 0.01 for v in accs]), rel=1e-12)
        else:
            assert math.isnan(back[label]["final_acc_std"])
        assert back[label]["final_acc"] == pytest.approx(statistics.fmean(accs))
    with open(tmp_path / "table.csv", newline="") as f:
        header = next(csv.reader(f))
        assert ",c,0.6," in f.read().replace("\r\n", "\n").replace("\n", ",")  # nan written as empty, 1 seed: no std
    assert header == COLUMNS + ["client_acc_std_within"]  # the file keeps its columns
    preset = json.loads((tmp_path / "preset.json").read_text())
    assert preset["std"] == "sample-converted" and "made" not in preset
    table = (tmp_path / "table.md").read_text()
    assert table == render_table(list(back.values()), preset, ["d seed 0: not run", "a seed 3: exit 1"])
    assert "converted exactly from the population std that these runs' table.csv held: × sqrt(n / (n - 1))" in table
    assert "re-rendered from its table.csv by the current code" in table
    rerender(tmp_path)  # once: a converted table is not converted again
    again = {r["method"]: r for r in read_table_csv(tmp_path / "table.csv")}
    assert again["a"]["final_acc_std"] == pytest.approx(statistics.stdev(runs["a"]), rel=1e-12)


@pytest.mark.parametrize("dirty", [False, True])
def test_rerender_records_its_commit_and_keeps_a_sample_std_table_as_it_is(repo, dirty):
    folder = repo / "docs" / "results" / "x"
    folder.mkdir(parents=True)
    made = {"command": "cmd", "commit": "abc1234", **({"dirty": True} if dirty else {})}
    runs = _old_table(folder, {"compare": {}, "std": "sample", "made": made})
    before = read_table_csv(folder / "table.csv")
    rerender(folder)  # a clean tree (docs/ is the builders' own output)
    after = read_table_csv(folder / "table.csv")
    assert after[0]["final_acc_std"] == before[0]["final_acc_std"] == pytest.approx(statistics.pstdev(runs["a"]))
    preset = json.loads((folder / "preset.json").read_text())
    head = provenance.commit(repo)
    assert preset["std"] == "sample" and preset["made"]["rerendered"] == head and preset["made"]["dirty"] is dirty
    table = (folder / "table.md").read_text()
    assert f"; re-rendered from table.csv at `{head}`." in table and "(ddof = 1). Client spread" in table
    assert ("**Made from a tree with uncommitted changes" in table) is dirty  # a dirty table stays marked


def test_rerender_refuses_a_docs_table_from_a_dirty_tree_unless_allowed_and_then_says_so(repo):
    folder = repo / "docs" / "results" / "x"
    folder.mkdir(parents=True)
    _old_table(folder, {"compare": {}, "std": "sample", "made": {"command": "cmd", "commit": "abc1234"}})
    (repo / "fedcore" / "x.py").write_text("A = 2\n")  # a source edit
    with pytest.raises(provenance.DirtyTree, match="fedcore/x.py"):
        rerender(folder)
    rerender(folder, allow_dirty=True)
    preset = json.loads((folder / "preset.json").read_text())
    assert preset["made"]["dirty"] is True and preset["made"]["rerendered"] == provenance.tree_commit(repo)
    assert "**Made from a tree with uncommitted changes" in (folder / "table.md").read_text()


def test_rerender_keeps_the_columns_of_an_older_table_csv(tmp_path):
    """A table.csv of older code lacks columns: they are shown as "-" and not added to the file."""
    (tmp_path / "table.csv").write_text("method,final_acc,final_acc_std,seeds\na,0.5,0.01,2\nb,0.6,0.02,1\n")
    (tmp_path / "preset.json").write_text(json.dumps({"compare": {}}))
    rerender(tmp_path)
    with open(tmp_path / "table.csv", newline="") as f:
        got = list(csv.reader(f))
    assert got[0] == ["method", "final_acc", "final_acc_std", "seeds"] and got[2] == ["b", "0.6", "", "1"]
    assert float(got[1][2]) == pytest.approx(0.01 * math.sqrt(2))
    assert f"| a | 50.00 ± {100 * 0.01 * math.sqrt(2):.2f} | - | - | - | - | - | - | - | - |" in \
        (tmp_path / "table.md").read_text()


# ------------------------------------------------------------------------------------------------ sweep.md
def _sweep():
    preset = {"compare": {"methods": [], "seeds": [0, 1], "supernodes": 4}, "run-config": {"dataset": "digits"},
              "made": {"command": "cmd", "commit": "abc1234"},
              "sweep": {"method": "m", "label": "m-{lr:g}-{mode}", "lr": [0.01, 0.1], "mode": ["a", "b"],
                        "also": ["eval_global"]}}
    runs = {  # validation and test disagree on purpose: the row best on validation is chosen
        "m-0.01-a": [{"seed": 0, "best_val_acc": 0.80, "best_val_round": 3, "test_acc_at_best_val": 0.95,
                      "eval_global_at_best_val": 0.5},
                     {"seed": 1, "best_val_acc": 0.84, "best_val_round": 4, "test_acc_at_best_val": 0.97,
                      "eval_global_at_best_val": 0.6}],
        "m-0.01-b": [{"seed": 0, "best_val_acc": 0.86, "best_val_round": 2, "test_acc_at_best_val": 0.70}],
        "m-0.1-b": [{"seed": 0, "best_val_acc": 0.82, "best_val_round": 5, "test_acc_at_best_val": 0.72},
                    {"seed": 1, "best_val_acc": None, "best_val_round": None}],
    }
    return preset, runs


def test_sweep_md_ranks_the_grid_on_validation_and_shows_test_for_information_only():
    preset, runs = _sweep()
    lines = render_sweep(preset, runs).splitlines()
    assert lines[0] == made_line(preset)
    assert lines[1] == "Setting: dataset=digits; 4 clients; seeds [0, 1]."
    assert lines[2].startswith("Ranked by the best validation accuracy (weighted") and "chose nothing" in lines[2]
    assert lines[4] == "**Chosen on validation: lr = 0.01, mode = b**."
    assert lines[6] == ("| lr | mode | best val acc (weighted) | best-val round(s) | test acc at best-val round "
                        "(weighted) | eval_global test acc at best-val round | runs |")
    assert lines[7] == "|---|---|---|---|---|---|---|"
    assert lines[8:] == [
        "| 0.01 | b | 86.00 | [2] | 70.00 | - | 1 |",
        (f"| 0.01 | a | {pct_cell(0.82, statistics.stdev([0.80, 0.84]))} | [3, 4] | "
         f"{pct_cell(0.96, statistics.stdev([0.95, 0.97]))} | {pct_cell(0.55, statistics.stdev([0.5, 0.6]))} | 2 |"),
        "| 0.1 | b | 82.00 | [5, None] | 72.00 | - | 2 |",  # a seed without validation: the others' mean
        "| 0.1 | a | - | [] | - | - | 0 |",  # not run: last
    ]


def test_sweep_md_keeps_the_grids_order_among_equals_and_chooses_nothing_without_runs():
    preset, _ = _sweep()
    preset = {"compare": {"methods": []}, "sweep": {"method": "m", "lr": [0.5, 0.25, 2]}}
    same = {f"m-{lr:g}": [{"seed": 0, "best_val_acc": 0.9, "best_val_round": 1, "test_acc_at_best_val": t}]
            for lr, t in ((0.5, 0.1), (0.25, 0.9), (2, 0.5))}
    lines = render_sweep(preset, same).splitlines()
    assert lines[1] == "Setting: ; 10 clients; seeds [0]."
    assert lines[4] == "**Chosen on validation: lr = 0.5**."
    assert [line.split(" | ")[0] for line in lines[8:]] == ["| 0.5", "| 0.25", "| 2"]
    assert lines[6] == ("| lr | best val acc (weighted) | best-val round(s) | test acc at best-val round (weighted) | "
                        "runs |") and lines[7] == "|---|---|---|---|---|"
    empty = render_sweep(preset, {}).splitlines()
    assert empty[4] == "**Nothing chosen: no run of the grid has finished.**"
    assert [line.split(" | ")[-1] for line in empty[8:]] == ["0 |"] * 3


def test_rows_read_rounds_to_target_from_each_runs_rounds_csv_when_not_given(tmp_path):
    runs = []
    for seed, curve in enumerate([(0.5, 0.8), (0.85, 0.5, 0.9)]):
        folder = tmp_path / f"m-s{seed}"
        folder.mkdir()
        rows = "".join(f"{i + 1},{a}\n" for i, a in enumerate(curve))
        (folder / "rounds.csv").write_text("round,acc_weighted\n" + rows)
        runs.append({**_run(seed, 0.8), "results_dir": str(folder)})
    rows = table_rows([Entry("m", "m")], {"m": runs}, {"compare": {"target-acc": 0.8}})
    assert (rows[0]["rounds_to_target"], rows[0]["runs_reaching_target"]) == (1.5, "2/2")  # rounds 2 and 1
    rows = table_rows([Entry("m", "m")], {"m": runs}, {"compare": {"target-acc": 0.9}})
    assert (rows[0]["rounds_to_target"], rows[0]["runs_reaching_target"]) == (3.0, "1/2")


def test_the_target_is_reached_within_float_rounding_and_not_reaching_it_warns_of_nothing():
    just_below = 0.9 - 1e-12  # what a sum of per-client fractions may give for an exact 90%
    assert rounds_to_target([{"round": "7", "acc": repr(just_below)}], "acc", 0.9) == 7
    assert rounds_to_target([{"round": "7", "acc": repr(0.9 - 1e-9)}], "acc", 0.9) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "mean of empty slice" where no run reached it
        assert math.isnan(target_row([None])["rounds_to_target"])


def test_rows_by_hand_without_the_optional_columns_render_as_dashes():
    """Rows of older code or made by hand (only the required keys): every missing cell is "-", a 1-seed row has no
    ± whatever its std, the paper method's own paired cell is "-" and the others' are not available."""
    base = {"final_acc": 0.9, "final_acc_std": 0.0, "client_acc_mean": 0.8, "client_acc_mean_std": 0.0,
            "last10_acc": 0.85, "last10_acc_std": 0.0, "mb_up_per_round": NAN, "mb_down_per_round": 1.0,
            "wall_s_per_round": NAN, "seeds": 1}
    rows = [{**base, "method": "pfedpm", "best_acc": 0.95}, {**base, "method": "fedavg"}]
    text = render_table(rows, {"compare": {}, "paper": {"metric": "weighted"}}, [])
    lines = text.splitlines()
    assert lines[2].endswith("1 seed, so no ± (no spread over seeds). Client spread: the std of the clients' final "
                             "accuracies within a run, mean over seeds. Paired difference: the table's headline "
                             "accuracy of pfedpm minus the row's, seed by seed (same seed = same split), mean and 95% "
                             "t-interval (Student's t, n - 1 degrees of freedom, scipy.stats.t); \"tie\" where the "
                             "interval covers 0.")
    assert lines[4].startswith("| method | paper (weighted) | ours (weighted, best-of-test, optimistic) | final acc")
    assert lines[6] == ("| pfedpm | - | 95.00 | 90.00 | 80.00 | 95.00 | - | 85.00 | - | - | 1.000 | - | - |")
    assert lines[7] == ("| fedavg | - | - | 90.00 | 80.00 | - | - | 85.00 | - | - | 1.000 | - | "
                        "not available until rebuilt |")
    two = render_table([{**base, "method": "x", "seeds": 2, "best_acc": 0.95}],
                       {"compare": {}, "paper": {"metric": "weighted"}}, [])
    assert "| x | - | 95.00 | 90.00 ± <0.01 | 80.00 ± <0.01 | 95.00 | - |" in two  # a std not recorded: no ±
    assert render_table([], {"compare": {}}, ["a seed 0: not run"]).endswith(  # no run finished: the footer says why
        "| s / round |\n|---|---|---|---|---|---|---|---|\n\nNot run (1): a seed 0\n")


def test_write_table_leaves_out_the_columns_the_preset_does_not_ask_for(tmp_path):
    rows = [{**aggregate_row("a", [_run(0, 0.5), _run(1, 0.6)]), **target_row([3, 4])}]
    write_table(rows, tmp_path, {"compare": {}}, [])  # rounds to target computed, but no target now
    with open(tmp_path / "table.csv", newline="") as f:
        assert next(csv.reader(f)) == COLUMNS + ["client_acc_std_within"]
    assert "rounds to" not in (tmp_path / "table.md").read_text()


def test_sweep_md_of_one_grid_point_and_of_float_values_and_several_columns():
    preset = {"compare": {"seeds": [0]}, "run-config": {"dataset": "digits", "val-fraction": 0.1},
              "sweep": {"method": "m", "lr": [2.0], "also": ["g", "h"]}}
    run = {"seed": 0, "best_val_acc": 0.5, "best_val_round": 1, "test_acc_at_best_val": 0.4, "g_at_best_val": 0.3,
           "h_at_best_val": 0.2}
    lines = render_sweep(preset, {"m-2": [run]}).splitlines()
    assert lines[1] == "Setting: dataset=digits, val-fraction=0.1; 10 clients; seeds [0]."
    assert lines[3] == lines[5] == "" and lines[4] == "**Chosen on validation: lr = 2**."
    assert lines[6] == ("| lr | best val acc (weighted) | best-val round(s) | test acc at best-val round (weighted) | "
                        "g test acc at best-val round | h test acc at best-val round | runs |")
    assert lines[7:] == ["|---|---|---|---|---|---|---|", "| 2 | 50.00 | [1] | 40.00 | 30.00 | 20.00 | 1 |"]
    assert render_sweep(preset, {}).splitlines()[4] == "**Nothing chosen: no run of the grid has finished.**"
