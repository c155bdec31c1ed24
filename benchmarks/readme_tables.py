"""Copy the benchmark tables into README.md and the pages under docs/ (``make readme``), so that every
table there is the ``table.md`` a command in this repo wrote.

A block in any of those markdown files

    <!-- table: docs/results/fedsac-mnist5k-pathological/table.md -->
    ...
    <!-- /table -->

is replaced by the current contents of that file. The path in a block is from the repository root,
whichever page holds the block, so a block moves between pages unchanged. ``--check`` only reports
blocks that differ (exit 1), for CI or a pre-commit hook.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- table: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def markdown_files(root: Path) -> list[Path]:
    """The pages whose table blocks ``make readme`` keeps: README.md and every docs/**/*.md."""
    readme = root / "README.md"
    return ([readme] if readme.is_file() else []) + sorted((root / "docs").glob("**/*.md"))


def rebuild(text: str, root: Path, page: str = "README") -> tuple[str, list[str]]:
    """``text`` with every table block refreshed from ``root``/its path, and the paths whose block changed."""
    changed = []

    def fill(match: re.Match) -> str:
        path = root / match["path"]
        if not path.is_file():
            raise SystemExit(f"{page} names {match['path']}, which does not exist: run its benchmark first")
        body = path.read_text()
        body = body if body.endswith("\n") else body + "\n"
        if body != match["body"]:
            changed.append(match["path"])
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(fill, text), changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path,
                        help="markdown files to refresh (default: README.md and docs/**/*.md)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root the block paths start from")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is out of date")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    stale = False
    for page in args.pages or markdown_files(root):
        name = page.resolve().relative_to(root) if page.resolve().is_relative_to(root) else page
        text = page.read_text()
        new, changed = rebuild(text, root, str(name))
        for path in changed:
            print(f"{name}: {'out of date' if args.check else 'updated'}: {path}")
        stale = stale or bool(changed)
        if changed and not args.check:
            page.write_text(new)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
