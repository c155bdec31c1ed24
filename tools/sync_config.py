"""Write the per-method run-config tables of pyproject.toml from the declarations: ``make sync-config``.

Flower reads a run's defaults from ``[tool.flwr.app.config]`` (and ``--run-config`` may only override keys it holds),
so every method's ``HPARAMS`` (``fedcore/methods/<m>.py``) appears there as a ``[tool.flwr.app.config.<m>]`` table.
The declarations are the record; those tables are written from them by this command, in the registry's order, and
``tests/test_config.py`` fails when they are stale. Only the run of method tables is rewritten: the rest of the file
(the common keys, the partition tables, everything else) stays byte for byte.

    python -m tools.sync_config           # rewrite the method tables
    python -m tools.sync_config --check   # exit 1, naming the command, when they are stale
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "tool.flwr.app.config."
HEADER = "# Method hyperparameters: <method>.<key>, written from fedcore/methods/ by `make sync-config` (not by hand)"
FOOTER = "# end of the method tables (`make sync-config`)"
COMMAND = "make sync-config"  # (python -m tools.sync_config)
_TABLE = re.compile(r"^\[([^\[\]]+)\]\s*(#.*)?$")


def toml_value(value) -> str:
    """A run-config default as a TOML value (bool, int, float or string: what Flower's run config holds)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a run-config default must be finite, not {value}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    raise TypeError(f"a run-config default must be a bool, int, float or str, not {type(value).__name__}")


def method_tables() -> str:
    """The per-method tables, in the registry's order (methods without hyperparameters have none)."""
    from fedcore.registry import REGISTRY

    tables = []
    for name, method in REGISTRY.items():
        if method.hparams:
            rows = [f"{key} = {toml_value(k.default)}" for key, k in method.hparams.items()]
            tables.append("\n".join([f"[{PREFIX}{name}]", *rows]) + "\n")
    return HEADER + "\n" + "\n".join(tables) + FOOTER + "\n"


def _span(lines: list[str], methods: set[str]) -> tuple[int, int]:
    """[start, end) of the method tables in ``lines``: from the ``HEADER`` line to the ``FOOTER`` line where this
    command wrote them before (every table between is its own: a retired method's table goes); else the run of
    tables named after declared methods (with a comment line above it that opens the method tables), refusing any
    other table among them; else an empty span at the end of the file."""
    marks = [i for i, line in enumerate(lines) if line.rstrip("\n") in (HEADER, FOOTER)]
    if marks:
        if len(marks) != 2 or lines[marks[0]].rstrip("\n") != HEADER:
            raise SystemExit(f"pyproject.toml: the method tables must lie between one line {HEADER!r} and one "
                             f"line {FOOTER!r} below it")
        return marks[0], marks[1] + 1
    headers = [(i, m.group(1).strip()) for i, line in enumerate(lines) if (m := _TABLE.match(line))]
    own = [i for i, (_, table) in enumerate(headers) if table.startswith(PREFIX) and table[len(PREFIX):] in methods]
    if not own:
        return len(lines), len(lines)
    first, last = own[0], own[-1]
    if own != list(range(first, last + 1)):
        strays = [headers[i][1] for i in range(first, last + 1) if i not in own]
        raise SystemExit(f"pyproject.toml: the method tables must stand together; {', '.join(strays)} stands among "
                         "them: move it above them, or delete it if it is the table of a method no longer declared")
    start = headers[first][0]
    while start > 0 and lines[start - 1].startswith("# Method hyperparameters"):
        start -= 1
    if last + 1 == len(headers):
        return start, len(lines)  # the run ends the file
    end = headers[last + 1][0]
    while end > start and lines[end - 1].startswith("#"):
        end -= 1  # the comment that opens the next table is not ours
    while end > start and not lines[end - 1].strip():
        end -= 1  # nor the blank lines above it
    return start, end


def synced(text: str) -> str:
    """``text`` (pyproject.toml) with its method tables written from the declarations."""
    from fedcore.registry import REGISTRY

    lines = text.splitlines(keepends=True)
    start, end = _span(lines, set(REGISTRY))
    before, after = "".join(lines[:start]), "".join(lines[end:])
    if before and not before.endswith("\n"):
        before += "\n"
    if start == len(lines) and before:
        before += "\n"  # a first run of tables at the end of the file: one blank line above it
    return before + method_tables() + after


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the tables are stale (exit 1 if so)")
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    args = parser.parse_args(argv)
    text = args.pyproject.read_text()
    new = synced(text)
    if args.check:
        if new != text:
            print(f"{args.pyproject}: the method tables are stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.pyproject.write_text(new)
        print(f"{args.pyproject}: method tables rewritten from fedcore/methods/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
