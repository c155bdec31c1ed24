"""Where a table's numbers came from: the commit, a hash of the code that decides them, the full command line.

A table in docs/ is made from committed code only (``guard``); each run folder records what made it
(``provenance.json``: commit, source hash, resolved config), and ``--reuse`` keeps a run only while its
source hash and config still match (``reusable``), so one table cannot mix code versions without saying so.
A job also leaves a start record beside its folder (``<run-name>.started.json``) until it completes, so that a
run cut off by the end of a session continues from its checkpoint only under the code and config that began it
(``resumable``; ``runner.compare --resume``).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the packages whose code decides a run's numbers (not docs, tests, benchmarks or conf: a run records its config)
SOURCE_PACKAGES = ("fedcore", "fedstrategies", "clients", "partitions", "server_app", "runner")
# what the table builders themselves write: changes there do not make a tree "dirty" for them
OUTPUTS = ("docs/", "README.md")
RECORD = "provenance.json"


class DirtyTree(SystemExit):
    """A docs/ table was asked for from a tree with uncommitted changes."""


def _git(*args: str, root: Path | None = None) -> str:
    root = root or ROOT
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=root).stdout


def commit(root: Path | None = None) -> str:
    """The short hash of HEAD ("unknown" outside a git checkout)."""
    root = root or ROOT
    try:
        return _git("rev-parse", "--short=7", "HEAD", root=root).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def uncommitted(root: Path | None = None, outputs: tuple[str, ...] = OUTPUTS) -> list[str]:
    """Paths with uncommitted changes (modified, staged or untracked and not ignored), the builder's own
    ``outputs`` (path prefixes; by default docs/ and README.md) left out."""
    root = root or ROOT
    try:
        lines = _git("status", "--porcelain", "--untracked-files=all", root=root).splitlines()
    except (OSError, subprocess.CalledProcessError):
        return ["(not a git checkout)"]
    paths = [line[3:].split(" -> ")[-1].strip('"') for line in lines if line.strip()]
    return [p for p in paths if not p.startswith(outputs)]


def source_hash(root: Path | None = None) -> str:
    """sha256 (first 16 hex digits) over the path and bytes of every .py file of the source packages as they
    are on disk now (uncommitted edits included)."""
    root = root or ROOT
    digest = hashlib.sha256()
    for package in SOURCE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def command_line(module: str, argv: list[str] | None) -> str:
    """The full command as typed: ``python -m <module>`` and every argument, quoted where needed."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", "-m", module, *(shlex.quote(str(a)) for a in args)])


def benchmark_command(module: str, argv: list[str] | None) -> str:
    """A benchmark's full command with the thread settings of the environment, which decide its timings."""
    import os

    threads = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ)
    return " ".join(part for part in (threads, command_line(module, argv)) if part)


def tree_commit(root: Path | None = None) -> str:
    """HEAD's short hash, "+changes" where the tree has uncommitted changes (outside the builders' outputs)."""
    return commit(root) + ("+changes" if uncommitted(root) else "")


def made_by(module: str, argv: list[str] | None, root: Path | None = None) -> str:
    """A benchmark table's first line: its full command (``benchmark_command``) and ``tree_commit``. Taken when
    the benchmark starts, before it measures anything."""
    return f"Made by `{benchmark_command(module, argv)}` at commit `{tree_commit(root)}`."


def writes_docs(out: Path, root: Path | None = None) -> bool:
    """Whether ``out`` lies under the repository's docs/."""
    root = root or ROOT
    try:
        Path(out).resolve().relative_to((root / "docs").resolve())
        return True
    except ValueError:
        return False


def guard(out: Path, allow_dirty: bool, root: Path | None = None, outputs: tuple[str, ...] = OUTPUTS) -> bool:
    """Refuse (``DirtyTree``) to write a docs/ table from an uncommitted tree (outside the builder's ``outputs``)
    unless ``allow_dirty``; returns whether the table is made from uncommitted code (then it says so in bold)."""
    root = root or ROOT
    if not writes_docs(out, root):
        return bool(uncommitted(root, outputs))
    changed = uncommitted(root, outputs)
    if changed and not allow_dirty:
        shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
        raise DirtyTree(f"refusing to write {Path(out).resolve().relative_to(root.resolve())} from a tree with "
                        f"uncommitted changes ({shown}): commit them first, or pass --allow-dirty to try things "
                        "(the table then says in bold that it is not from committed code)")
    return bool(changed)


def stamp(root: Path | None = None) -> dict:
    """What a run records about the code that made it: commit, source hash and whether the tree was dirty."""
    root = root or ROOT
    return {"commit": commit(root), "source_hash": source_hash(root), "dirty": bool(uncommitted(root))}


def record(folder: Path, code: dict, config: dict) -> None:
    """Write ``folder``/provenance.json: the code stamp and the run's resolved config (its config.json). A run
    resumed from a checkpoint also names the commit that began it and the round it went on from; its start
    record is then no longer needed."""
    try:
        resolved = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        resolved = config
    entry = {**code, "config": resolved}
    start = _read_json(started_path(folder))
    if start is not None and start.get("resumed_from_round") is not None:
        entry["resumed"] = {"began_at_commit": start.get("commit"), "from_round": start.get("resumed_from_round")}
    (Path(folder) / RECORD).write_text(json.dumps(entry, indent=2, sort_keys=True))
    started_path(folder).unlink(missing_ok=True)


def started_path(folder: Path) -> Path:
    """The start record of the run in ``folder``: beside it, since a fresh run empties its folder."""
    folder = Path(folder)
    return folder.parent / f"{folder.name}.started.json"


def mark_started(folder: Path, code: dict, config: dict) -> None:
    """A fresh job begins in ``folder``: drop checkpoints a run before it left there (so none can be resumed
    under this record) and record the code and config it starts with."""
    import shutil

    from server_app import checkpoints

    shutil.rmtree(Path(folder) / checkpoints.FOLDER, ignore_errors=True)
    started_path(folder).parent.mkdir(parents=True, exist_ok=True)
    started_path(folder).write_text(json.dumps({**code, "config": config}, indent=2, sort_keys=True))


def resumable(folder: Path, config: dict, code: dict) -> tuple[int | None, str]:
    """The checkpoint round a cut-off run may continue from, or None and why not: its start record must carry
    ``code``'s source hash and ``config``'s every key (as ``reusable``), and the folder a checkpoint."""
    from server_app import checkpoints

    start = _read_json(started_path(folder))
    if start is None:
        return None, "no start record"
    if start.get("source_hash") != code["source_hash"]:
        return None, "source changed"
    if _config_differs(start.get("config", {}), config):
        return None, "config changed"
    rounds = sorted((Path(folder) / checkpoints.FOLDER).glob("round-*.ckpt"))
    if not rounds:
        return None, "no checkpoint"
    at = int(rounds[-1].stem.split("-")[1])
    if at >= int(config.get("num-server-rounds", at + 1)):  # cut off between its last round and its summary
        return None, "nothing left to resume"
    return at, ""


def note_resumed(folder: Path, from_round: int) -> None:
    """Add to the start record the checkpoint round a resumption goes on from (``record`` reports it)."""
    start = _read_json(started_path(folder)) or {}
    started_path(folder).write_text(json.dumps({**start, "resumed_from_round": from_round}, indent=2, sort_keys=True))


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read(folder: Path) -> dict | None:
    return _read_json(Path(folder) / RECORD)


def _config_differs(saved: dict, config: dict) -> bool:
    """Whether a recorded config differs from ``config`` in any key of ``config`` that decides the numbers (not
    where the run's folder goes, how it starts, or where it is tracked)."""
    return any(saved.get(k) != v for k, v in config.items()
               if k not in ("results-dir", "overwrite", "resume") and not k.startswith("tracker"))


def reusable(folder: Path, config: dict, code: dict) -> tuple[bool, str]:
    """Whether a finished run may be kept: its provenance exists, its source hash is ``code``'s and its
    resolved config holds every key of ``config`` with the same value. Returns (keep, reason if not)."""
    return matches(read(folder), config, code)


def matches(saved: dict | None, config: dict, code: dict) -> tuple[bool, str]:
    """Whether a run's saved record (its folder's provenance, or its entry in a table's committed per-run data)
    was made by ``code``'s source with ``config``. Returns (keep, reason if not)."""
    if saved is None:
        return False, "no provenance record"
    if saved.get("source_hash") != code["source_hash"]:
        return False, "source changed"
    if _config_differs(saved.get("config", {}), config):
        return False, "config changed"
    return True, ""


def commits_line(commits: dict[str, list[str]]) -> str:
    """"Runs from commit `a` (12 runs)" or, for several, each commit with its runs' rows."""
    if not commits:
        return ""
    if len(commits) == 1:
        (c, runs), = commits.items()
        return f"Runs from commit `{c}` ({len(runs)} runs)."
    parts = [f"`{c}` ({len(runs)} runs: {', '.join(sorted(set(r.rsplit('-s', 1)[0] for r in runs)))})"
             for c, runs in sorted(commits.items())]
    return "Runs from commits " + "; ".join(parts) + "."
