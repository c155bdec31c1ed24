"""Copy the benchmark tables into README.md (``make readme``), so that every table there is the
``table.md`` a command in this repo wrote.

A README block

    <!-- table: docs/results/fedsac-mnist5k-pathological/table.md -->
    ...
    <!-- /table -->

is replaced by the current contents of that file. ``--check`` only reports blocks that differ
(exit 1), for CI or a pre-commit hook.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- table: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def rebuild(text: str, root: Path) -> tuple[str, list[str]]:
    """``text`` with every table block refreshed, and the paths whose block changed."""
    changed = []

    def fill(match: re.Match) -> str:
        path = root / match["path"]
        if not path.is_file():
            raise SystemExit(f"README names {match['path']}, which does not exist: run its benchmark first")
        body = path.read_text()
        body = body if body.endswith("\n") else body + "\n"
        if body != match["body"]:
            changed.append(match["path"])
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(fill, text), changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is out of date")
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    new, changed = rebuild(text, args.readme.resolve().parent)
    for path in changed:
        print(f"{'out of date' if args.check else 'updated'}: {path}")
    if args.check:
        return 1 if changed else 0
    args.readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
