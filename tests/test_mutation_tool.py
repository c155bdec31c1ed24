"""The mutation report's arithmetic: excused survivors leave the ratio, mutants not yet judged count against it."""

import subprocess

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


def _one_target_tree(tmp_path, monkeypatch):
    """A project of one module and one target, with the tool's paths pointed at it."""
    from tools import mutation

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "rule.py").write_text("def rule(x):\n    return x > 0\n")
    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    monkeypatch.setattr(mutation, "REPORTS", tmp_path / "reports")
    monkeypatch.setattr(mutation, "ANNOTATIONS", tmp_path / "annotations")
    monkeypatch.setattr(mutation, "TARGETS", {"rule": mutation.Target(("pkg/rule.py",), ("tests/t.py",))})
    monkeypatch.setattr(mutation.subprocess, "run", _fake_git_head(mutation.subprocess.run))
    return mutation


def _fake_git_head(run):
    """``git rev-parse`` answers a fixed commit (the temporary tree is no git checkout); other commands run."""
    def fake(args, **kwargs):
        if args[:2] == ["git", "rev-parse"]:
            return subprocess.CompletedProcess(args, 0, stdout="abc1234\n")
        return run(args, **kwargs)
    return fake


def test_a_report_goes_stale_when_its_modules_change_and_fresh_when_rewritten(tmp_path, monkeypatch):
    mutation = _one_target_tree(tmp_path, monkeypatch)
    assert mutation.stale_reports() == {"rule": "no report"}
    mutation.write_report("rule", {"pkg.x_rule__mutmut_1": "killed"})
    assert mutation.stale_reports() == {}
    (tmp_path / "pkg" / "rule.py").write_text("def rule(x):\n    return x >= 0\n")
    assert list(mutation.stale_reports()) == ["rule"]
    mutation.write_report("rule", {"pkg.x_rule__mutmut_1": "killed"})
    assert mutation.stale_reports() == {}
    (tmp_path / "pkg" / "rule.py").rename(tmp_path / "pkg" / "moved.py")  # a move leaves the report behind too
    assert list(mutation.stale_reports()) == ["rule"]


def test_a_report_without_a_recorded_hash_is_judged_by_its_modules_at_its_commit(tmp_path, monkeypatch):
    from tools import mutation

    monkeypatch.setattr(mutation, "REPORTS", tmp_path)
    target = mutation.TARGETS["pfedpm"]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=mutation.ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    (tmp_path / "pfedpm.md").write_text(f"Made by `make mutation` at commit `{head}`.\n")
    committed = mutation.report_hash("pfedpm")
    show = lambda m: subprocess.run(["git", "show", f"HEAD:{m}"], cwd=mutation.ROOT, check=True,  # noqa: E731
                                    capture_output=True).stdout
    assert committed == mutation.modules_hash(target.modules, show)
    assert committed != mutation.modules_hash(target.modules[1:], show)


def test_the_stale_reports_are_the_ones_tests_mutation_says_are_known_stale():
    """A change to a mutated module makes this fail until the target is re-run or listed in known-stale.toml."""
    from tools.mutation import known_stale, stale_reports

    stale, known = stale_reports(), known_stale()
    assert all(why.strip() for why in known.values()), "every known-stale report needs its reason"
    assert sorted(stale) == sorted(known), (
        f"stale now: {stale}; known-stale in tests/mutation/known-stale.toml: {sorted(known)}")


SOURCE = '''RULE = 1


def rule(x):
    def helper(y):
        return y
    return helper(x) > RULE


class Writer:
    def write(self,
              rows):
        """Docstring."""
        return rows

    def plot(self):
        return None


def plot(a):
    return a
'''


def test_a_target_leaves_out_the_functions_it_skips_or_all_but_the_ones_it_names(tmp_path):
    from tools.mutation import NO_MUTATE, Target, mark_left_out

    def marked(target):
        path = tmp_path / "m.py"
        path.write_text(SOURCE)
        names = mark_left_out(path, target)
        text = path.read_text()
        assert text.replace(NO_MUTATE, "") == SOURCE  # only the marks are added
        return names, [line.strip() for line in text.splitlines() if line.endswith(NO_MUTATE)]

    assert marked(Target(("m.py",), ("t.py",))) == ([], [])
    names, lines = marked(Target(("m.py",), ("t.py",), skip=("plot", "helper")))
    assert sorted(names) == ["plot", "plot"] and lines == [f"def plot(self):{NO_MUTATE}", f"def plot(a):{NO_MUTATE}"]
    names, lines = marked(Target(("m.py",), ("t.py",), only=("rule",)))
    assert sorted(names) == ["plot", "plot", "write"]  # helper, nested in rule, is mutated with it
    assert lines[0] == f"rows):{NO_MUTATE}"  # a header over two lines is marked after its colon


def test_the_summary_page_gives_every_targets_report_as_it_stands():
    from tools.mutation import REPORTS, summary_table

    assert (REPORTS / "README.md").read_text() == summary_table(), "run python -m tools.mutation --summary"
