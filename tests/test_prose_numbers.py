"""The numbers the paper pages quote from their tables, recomputed from the tables' committed per-run data
(``runs.json.gz``, ``runner.run_data``): every paired difference with its interval anywhere on a page, every
accuracy in a verdict line (``**reproduced**``, ``**within noise**``, ``**not reproduced**``) and every "best
validation rounds are ..." sentence. A number edited by hand, or left behind when a table is rebuilt, fails here.
"""

import functools
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from runner import run_data, stats, study

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs" / "papers").glob("*.md"))
TABLE = re.compile(r"<!-- table: (docs/results/[^ ]+)/table\.md -->")
STUDY = re.compile(r"python -m runner\.study (conf/study/[\w.-]+\.toml)")  # a study a page is built on
SIGNED = r"[+\-−]?\d+\.\d\d"
TRIPLE = re.compile(rf"({SIGNED}) \[({SIGNED}), ({SIGNED})\]")
ACCURACY = re.compile(r"(?<![\d.+\-−])\d\d\.\d\d(?!\d)")  # 10.00-99.99: an accuracy, not a difference
VERDICT = re.compile(r"\*\*(reproduced|within noise|not reproduced)")
ROUNDS = re.compile(r"best validation rounds (?:on the client mean )?(?:\([^)]*\) )?are (\d+), (\d+) and (\d+)")
HEADLINES = ("test_client_acc_mean_at_best_val", "test_acc_at_best_val", "final_acc")
BEST_OF_TEST = ("best_client_acc_mean", "best_acc")
TOLERANCE = 0.011  # points: the pages round to two decimals
# quotes of an earlier build whose runs were replaced (the sentence says so); what each page may quote without its data
EARLIER = {"fedfcd.md": {"0.38 [0.01, 0.75]",  # FedProto at lambda 0.1, before the rebuild at its default lambda 1
                         "−0.14 [−0.56, +0.27]",  # FMNIST Pat: FedAMP at alpha-k 1, before its re-run at 0.25
                         "+0.43 [−1.04, +1.90]"}}  # FMNIST Pat: GPFL at mu 0.1, before its re-run at 0.01


def _number(text: str) -> float:
    return float(text.replace("−", "-"))


@functools.lru_cache(maxsize=None)
def _rows(folder: Path) -> dict[str, dict[str, dict[int, float]]]:
    """label -> summary key -> seed -> value, with a ``runs-of`` variant's method column under the plain keys."""
    summaries = run_data.summaries(folder)
    preset = json.loads((folder / "preset.json").read_text()) if (folder / "preset.json").exists() else {}
    keys = HEADLINES + BEST_OF_TEST
    rows = {label: {k: {s["seed"]: s[k] for s in runs if s.get(k) is not None} for k in keys}
            for label, runs in summaries.items()}
    for label, variant in preset.get("variants", {}).items():
        if "runs-of" in variant and variant["runs-of"] in summaries:
            acc = variant["accuracy"]
            names = {"test_acc_at_best_val": f"{acc}_at_best_val",
                     "test_client_acc_mean_at_best_val": f"{acc}_client_mean_at_best_val", "final_acc": f"final_{acc}",
                     "best_acc": f"best_{acc}", "best_client_acc_mean": f"best_{acc}_client_mean"}
            rows[label] = {k: {s["seed"]: s[v] for s in summaries[variant["runs-of"]] if s.get(v) is not None}
                           for k, v in names.items()}
    return rows


@functools.lru_cache(maxsize=None)
def paired_triples(folder: Path) -> frozenset:
    """Every row minus every other row, seed by seed (all seeds, and the first three where a page quotes an
    interval "at 3 seeds"), as (mean, lo, hi) in points rounded to two decimals."""
    rows, out = _rows(folder), set()
    for key in HEADLINES:
        for a, b in itertools.permutations(rows, 2):
            ours, theirs = rows[a][key], rows[b][key]
            for seeds in (None, (0, 1, 2)):
                d = stats.paired_difference({s: v for s, v in ours.items() if seeds is None or s in seeds},
                                            {s: v for s, v in theirs.items() if seeds is None or s in seeds})
                if d["n"] >= 2:
                    out.add(tuple(round(100 * d[k], 2) for k in ("mean", "lo", "hi")))
    return frozenset(out)


@functools.lru_cache(maxsize=None)
def study_triples(path: Path) -> frozenset:
    """Every row minus every other row at each point of a study (``runner.study``: a point may join the runs of two
    presets, e.g. a committed table's rows and the rows run for the study), as (mean, lo, hi) in points."""
    spec = study.load_study(path)
    out = set()
    for point_spec in spec["point"]:
        point = study.read_point(point_spec, spec, path.parent, ROOT)
        for a, b in itertools.permutations(point.values, 2):
            d = study.difference(point, a, b)
            if d["n"] >= 2:
                out.add(tuple(round(d[k], 2) for k in ("mean", "lo", "hi")))
    return frozenset(out)


@functools.lru_cache(maxsize=None)
def accuracies(folder: Path) -> frozenset:
    """Each row's mean over seeds (points) in the table's metric (the paper's where it has one: client mean or
    weighted), at the best-validation round and best-of-test, and the paper's numbers."""
    preset = json.loads((folder / "preset.json").read_text()) if (folder / "preset.json").exists() else {}
    paper = preset.get("paper") or {}
    keys = (("test_client_acc_mean_at_best_val", "best_client_acc_mean") if paper.get("metric") == "client mean"
            else ("test_acc_at_best_val", "best_acc", "final_acc"))
    out = {round(100 * float(np.mean(list(row[k].values()))), 2) for row in _rows(folder).values() for k in keys
           if row[k]}
    return frozenset(out | {round(float(v), 2) for v in paper.get("values", {}).values()})


def _sections(text: str) -> list[tuple[int, int, list[Path]]]:
    """(start, end, tables) of each ``## `` section; a section without a table of its own gets the page's."""
    starts = [m.start() for m in re.finditer(r"(?m)^## ", text)]
    bounds = list(zip([0, *starts], [*starts, len(text)]))
    page = [ROOT / m.group(1) for m in TABLE.finditer(text)]
    out = []
    for start, end in bounds:
        own = [ROOT / m.group(1) for m in TABLE.finditer(text, start, end)]
        out.append((start, end, [t for t in (own or page) if (t / run_data.FILE).exists()]))
    return out


def _matches_triple(quoted: tuple, known: frozenset) -> bool:
    """A quoted "d [lo, hi]" as the table has it, or the other way round ("row leads by ..."), or unsigned."""
    m, lo, hi = quoted

    def forms(k):
        return ((m, lo, hi), (-m, -hi, -lo), tuple(abs(q) * np.sign(t) for q, t in zip(quoted, k)))

    return any(all(abs(x - y) <= TOLERANCE for x, y in zip(form, k)) for k in known for form in forms(k))


def prose_mismatches(text: str, earlier: frozenset = frozenset()) -> list[str]:
    """What on ``text`` (a paper page) its tables' per-run data does not give (``earlier``: quotes let through)."""
    bad = []
    line_of = lambda pos: text.count("\n", 0, pos) + 1  # noqa: E731
    studies = [study_triples(ROOT / m.group(1)) for m in STUDY.finditer(text)]  # the page's: every section's
    for start, end, tables in _sections(text):
        if not tables:
            continue
        triples = frozenset().union(*(paired_triples(t) for t in tables), *studies)
        for m in TRIPLE.finditer(text, start, end):
            if m.group(0) not in earlier and not _matches_triple(tuple(_number(g) for g in m.groups()), triples):
                bad.append(f"line {line_of(m.start())}: {m.group(0)} is no paired difference of its tables")
        known = frozenset().union(*(accuracies(t) for t in tables))
        for bullet in re.finditer(r"(?ms)^- .*?(?=^- |^\s*$|\Z)", text[start:end]):
            if not VERDICT.search(bullet.group(0)):
                continue
            for m in ACCURACY.finditer(bullet.group(0)):
                if not any(abs(float(m.group(0)) - k) <= TOLERANCE for k in known):
                    bad.append(f"line {line_of(start + bullet.start() + m.start())}: verdict accuracy {m.group(0)} "
                               f"is no row's mean")
        for m in ROUNDS.finditer(text, start, end):
            quoted = [int(g) for g in m.groups()]
            found = [_best_rounds(t) for t in tables]
            if not any(quoted in rounds for rounds in found):
                bad.append(f"line {line_of(m.start())}: best validation rounds {quoted} are no row's (client mean)")
    return bad


def _best_rounds(folder: Path) -> list[list[int]]:
    """Each row's best-validation rounds on the client mean, in seed order."""
    return [[s["best_val_round_client_mean"] for s in runs] for runs in run_data.summaries(folder).values()]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_a_pages_quoted_numbers_are_its_tables(page):
    assert prose_mismatches(page.read_text(), frozenset(EARLIER.get(page.name, ()))) == []


def test_a_number_edited_by_hand_is_caught():
    text = (ROOT / "docs" / "papers" / "fedfcd.md").read_text()
    assert "+1.79 [+0.71, +2.86]" in text and "are 10, 70 and 45" in text and "FedAMP scores 96.24" in text
    earlier = frozenset(EARLIER["fedfcd.md"])
    assert prose_mismatches(text, earlier) == []
    for wrong in (text.replace("+1.79 [+0.71, +2.86]", "+1.97 [+0.71, +2.86]", 1),  # a triple
                  text.replace("are 10, 70 and 45", "are 10, 70 and 15"),  # the weighted rounds for the client mean
                  text.replace("FedAMP scores 96.24", "FedAMP scores 96.42")):  # an accuracy in a verdict line
        assert len(prose_mismatches(wrong, earlier)) == 1


def test_a_study_pages_cross_preset_quote_is_checked_against_the_study():
    """data-size.md quotes the no-cap point, where FedSaC's runs (the study's preset) meet local's (FedFCD's table):
    no one table holds the pair, the study does, and a quote edited by hand fails."""
    text = (ROOT / "docs" / "papers" / "data-size.md").read_text()
    assert "FedSaC (+0.54 [-0.88, +1.96])" in text and prose_mismatches(text) == []
    assert len(prose_mismatches(text.replace("FedSaC (+0.54 [-0.88, +1.96])", "FedSaC (+0.45 [-0.88, +1.96])"))) == 1
