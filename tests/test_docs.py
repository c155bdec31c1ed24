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
