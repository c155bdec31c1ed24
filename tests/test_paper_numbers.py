"""The papers' numbers live in one checked-in file per paper (docs/papers/numbers), and every preset's [paper]
values, metric and gain come from it."""

import json
import tomllib
from pathlib import Path

import pytest

from benchmarks import paper_numbers

ROOT = Path(__file__).resolve().parents[1]
PAPER_PRESETS = [p for p in sorted((ROOT / "conf").glob("*.toml")) if "paper" in tomllib.loads(p.read_text())]


def test_every_paper_has_its_file_with_citation_and_one_metric():
    assert paper_numbers.papers() == ["fedfcd", "fedmcsa", "fedsac", "mupfl", "pfedpm"]
    for name in paper_numbers.papers():
        spec = paper_numbers.paper(name)
        assert spec["paper"] and spec["venue"] and spec["link"].startswith("https://") and spec["metric_words"]
        assert spec["metric"] == "client mean"  # each paper's own words say the clients' accuracies averaged
        ids = [t["id"] for t in spec["tables"]]
        assert len(ids) == len(set(ids))
        for t in spec["tables"]:
            assert t["table"] and t["column"] and t["dataset"] and t["metric"]
            assert sum(r.get("role") == "method" for r in t["rows"]) <= 1
            assert all(0 < r["value"] <= 100 for r in t["rows"])


@pytest.mark.parametrize("preset", PAPER_PRESETS, ids=lambda p: p.stem)
def test_every_presets_paper_numbers_are_the_papers_whole_table(preset):
    """Each value a preset shows beside ours is the paper's, from the tables it names; and every row of those
    tables that the preset runs is shown (no baseline left out)."""
    spec = tomllib.loads(preset.read_text())
    paper = spec["paper"]
    refs = paper.get("source", []) + [r for refs in paper.get("suffixes", {}).values() for r in refs]
    assert refs, "a [paper] table names the paper's tables it quotes (source = [\"<paper>/<table id>\"])"
    names = {r.partition("/")[0] for r in refs}
    assert len(names) == 1 and paper["metric"] == paper_numbers.paper(names.pop())["metric"]
    assert paper.get("values", {}) == paper_numbers.expected_values(paper, spec["compare"]["methods"])


def test_the_papers_gain_is_against_the_best_baseline_of_the_same_table():
    mlr, dnn = paper_numbers.gain("fedmcsa/table1-synthetic-mlr"), paper_numbers.gain("fedmcsa/table1-synthetic-dnn")
    assert (mlr["baseline"], mlr["base"]) == ("Per-FedAvg", 85.15) and mlr["gain"] == pytest.approx(10.12)
    assert (dnn["baseline"], dnn["base"]) == ("Per-FedAvg", 88.50) and dnn["gain"] == pytest.approx(7.76)
    assert mlr["dataset"] == "Synthetic"
    # the paper's own variants are not baselines: Table 2's FedAvg+MCSA does not count against FedMCSA
    t2 = paper_numbers.gain("fedmcsa/table2-synthetic-dnn")
    assert t2["baseline"] == "pFedMe" and t2["gain"] == pytest.approx(95.26 - 86.04)


@pytest.mark.parametrize("preset", sorted((ROOT / "docs" / "results").glob("*/preset.json")), ids=lambda p: p.parent.name)
def test_every_docs_table_quotes_the_papers_numbers_from_the_file(preset):
    spec = json.loads(preset.read_text())
    if "paper" not in spec:
        return
    assert spec["paper"].get("values", {}) == paper_numbers.expected_values(spec["paper"], spec["compare"]["methods"])


def test_nothing_in_the_repository_points_outside_it():
    """No sibling folder of the checkout (a user's clone has none) and no absolute path above it."""
    outside = str(ROOT.parent) + "/"
    tracked = [ROOT / p for p in __import__("subprocess").run(["git", "ls-files"], cwd=ROOT, capture_output=True,
                                                              text=True, check=True).stdout.split()]
    for path in tracked:
        if path.suffix in (".md", ".py", ".toml", ".txt", ".cfg") and path.name != "test_paper_numbers.py":
            text = path.read_text(errors="replace")
            assert "../shared/" not in text and outside not in text, path
            assert "shared/specs" not in text and "shared/papers" not in text, path
