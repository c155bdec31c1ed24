"""The mutation report's arithmetic: excused survivors leave the ratio, mutants not yet judged count against it."""

from tools.mutation import parse_results, summarise, survivors_to_rerun


def test_results_listing_is_parsed_by_name_and_verdict():
    listing = "    a.x__mutmut_1: killed\n    a.x__mutmut_2: survived\n    b.y__mutmut_1: not checked\n"
    assert parse_results(listing) == {"a.x__mutmut_1": "killed", "a.x__mutmut_2": "survived",
                                      "b.y__mutmut_1": "not checked"}


def test_ratio_leaves_out_excused_survivors_and_counts_unjudged_mutants_as_not_killed():
    verdicts = {"k1": "killed", "k2": "timeout", "s1": "survived", "s2": "no tests", "e1": "survived",
                "n1": "not checked"}
    s = summarise(verdicts, {"e1": ("equivalent", "same behaviour")})
    assert s["killed"] == ["k1", "k2"] and s["survived"] == ["s1", "s2"] and list(s["excused"]) == ["e1"]
    assert s["other"] == ["n1"]
    assert s["ratio"] == 2 / 5
    assert summarise({"k1": "killed"}, {"gone": ("equivalent", "x")})["stale_notes"] == ["gone"]


def test_survivors_rerun_only_the_unexcused_survivors():
    verdicts = {"k1": "killed", "s1": "survived", "s2": "no tests", "e1": "survived", "n1": "not checked"}
    assert survivors_to_rerun(verdicts, {"e1": ("equivalent", "same behaviour")}) == ["s1", "s2"]
