"""README.md is a page, and the links of README.md and docs/ lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.readme_tables import ROOT, markdown_files

README_MAX_LINES = 300
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def links(text: str) -> list[str]:
    """The targets of the inline links and images of a markdown text, outside code."""
    return LINK.findall(CODE.sub("", FENCE.sub("", text)))


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        found.add(slug if n == 0 else f"{slug}-{n}")
        seen[slug] = n + 1
    return found


def broken_links(page: Path) -> list[str]:
    text = page.read_text()
    broken = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(f"{target} (no such heading)")
    return broken


def test_readme_is_a_page():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move sections into docs/"


@pytest.mark.parametrize("page", markdown_files(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_that_exists(page):
    assert broken_links(page) == []


def test_the_link_check_finds_broken_links_and_headings(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Server time (`x`)\n\n## Bytes\n\n## Bytes\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md) [ok](docs/a.md#server-time-x) [ok](docs/a.md#bytes-1) [dir](docs/)\n"
                    "![img](docs/missing.png) [gone](docs/b.md) [bad](docs/a.md#nothing) [web](https://x.org/y)\n"
                    "`[code](not/a/link.md)`\n```\n[fenced](not/a/link.md)\n```\n[self](#a-heading-here)\n")
    assert broken_links(page) == ["docs/missing.png (no such file)", "docs/b.md (no such file)",
                                  "docs/a.md#nothing (no such heading)", "#a-heading-here (no such heading)"]


PAPER_PAGES = ("pfedpm", "fedmcsa", "fedfcd", "mupfl", "fedsac")
LEGEND = re.compile(r"`?(\w+)(?:\.py)?`?\s+(?:=|is)\s+`(tests/\w+\.py)`")
CITED = re.compile(r"\b(\w+)(?:\.py)?::(test_\w+)")


def invariant_citations(text: str, root: Path) -> tuple[list[tuple[int, str]], list[str]]:
    """The "Spec invariants and their tests" section of a paper page: (row number, cited test) pairs, and each
    citation that names no test function of the file its letter stands for (the legend above the table)."""
    section = text[text.index("## Spec invariants and their tests"):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    files = {letter: root / path for letter, path in LEGEND.findall(section)}
    files |= {m: root / "tests" / f"{m}.py" for m, _ in CITED.findall(section) if m.startswith("test_")}  # a module
    defined = {letter: set(re.findall(r"^\s*def (test_\w+)", f.read_text(), re.M)) if f.exists() else set()
               for letter, f in files.items()}
    rows, missing = [], []
    for line in section.splitlines():
        row = re.match(r"^\| *(\d+) *\|", line)
        for letter, name in CITED.findall(line):
            if row:
                rows.append((int(row.group(1)), name))
            if name not in defined.get(letter, set()):
                missing.append(f"{letter}::{name}" + ("" if letter in files else f" (no legend for {letter})"))
    return rows, missing


@pytest.mark.parametrize("paper", PAPER_PAGES)
def test_every_spec_invariant_row_cites_tests_that_exist_in_the_file_its_legend_names(paper):
    rows, missing = invariant_citations((ROOT / "docs" / "papers" / f"{paper}.md").read_text(), ROOT)
    assert missing == [], f"{paper}.md cites tests that are not where its legend says"
    numbers = sorted({n for n, _ in rows})
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 9, numbers  # no row without a test


def test_the_invariant_audit_finds_a_renamed_test_and_a_letter_without_a_legend(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_kept():\n    pass\n")
    page = ("## Spec invariants and their tests\n\n`A` = `tests/test_a.py`.\n\n"
            "| # | invariant | tests |\n|---|---|---|\n"
            "| 1 | x | `A::test_kept`, `A::test_renamed` |\n"
            "| 2 | y | B.py::test_kept, test_a::test_kept |\n\n## Next\n\n`A::test_gone`\n")
    rows, missing = invariant_citations(page, tmp_path)
    assert rows == [(1, "test_kept"), (1, "test_renamed"), (2, "test_kept"), (2, "test_kept")]
    assert missing == ["A::test_renamed", "B::test_kept (no legend for B)"]


def test_the_guide_to_adding_a_method_lists_every_hook_of_the_strategy_base():
    """docs/adding-a-method.md's hook table names every hook a strategy may override: the methods of the
    "hooks for methods" section of fedstrategies/base.py."""
    import ast

    source = (ROOT / "fedstrategies" / "base.py").read_text()
    section = source[source.index("# " + "=" * 65 + " hooks for methods"):source.index("helpers for methods")]
    hooks = [node.name for node in ast.parse("class Hooks:\n" + section).body[0].body
             if isinstance(node, ast.FunctionDef)]
    assert len(hooks) >= 15 and "reference_norm" in hooks, hooks
    guide = (ROOT / "docs" / "adding-a-method.md").read_text()
    table = [line for line in guide.splitlines() if line.strip().startswith("| `")]
    named = set(re.findall(r"`(\w+)`", " ".join(line.split("|")[1] for line in table)))
    assert not set(hooks) - named, sorted(set(hooks) - named)
