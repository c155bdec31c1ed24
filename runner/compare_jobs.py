"""A comparison's jobs, one (row, seed) run each: which finished runs it keeps (``--reuse``, from their folders
or the committed per-run data), which cut-off runs continue from a checkpoint (``--resume``), and running the rest
through ``flwr run`` or in-process worker processes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from runner import provenance, run_data
from runner.compare_presets import Entry, job_config, run_config
from runner.launch import simulate


def run_folder(config: dict) -> Path:
    """The folder a run config's results land in."""
    return Path(config["results-dir"]) / config["run-name"]


def run_inprocess_job(config: dict, supernodes: int, code: dict | None = None) -> dict:
    """One in-process run in a worker process with one torch thread (what ``jobs`` parallelises). With the
    comparison's ``code`` stamp, a fresh run first leaves its start record (``provenance.mark_started``)."""
    import torch

    torch.set_num_threads(1)
    from runner.inprocess import run_inprocess

    if code is not None and not config.get("resume"):
        provenance.mark_started(run_folder(config), code, config)

    try:
        summary, _ = run_inprocess(config, supernodes)
        return {"status": "finished:completed", "details": "", "summary": summary}
    except Exception as err:  # reported as a failed run, as flwr ls would
        return {"status": "finished:failed", "details": repr(err), "summary": None}


def finished_run(config: dict, code: dict) -> tuple[dict | None, str]:
    """The summary of a completed earlier run this one may reuse (``--reuse``), or None and why not.

    The run's provenance record must carry ``code``'s source hash and its resolved config every key of
    ``config`` with the same value; a run that was cut off has no ``summary.json`` and is not reused."""
    folder = Path(config["results-dir"]) / config["run-name"]
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None, "not finished"
    if summary.get("status") != "completed":
        return None, "not completed"
    keep, why = provenance.reusable(folder, config, code)
    return (summary, "") if keep else (None, why)


def committed_run(record: dict | None, config: dict, code: dict) -> tuple[dict | None, str]:
    """The summary of a completed run kept in the table's committed per-run data (``runs.json.gz``) whose folder
    is not here (a fresh clone or machine), on the terms of ``finished_run``: this source hash and config. A
    table too long for one sitting so grows across machines: each sitting commits the runs it finished."""
    if record is None:
        return None, "not finished"
    if record.get("status") != "completed":
        return None, "not completed"
    keep, why = provenance.matches(record, config, code)
    return ({**run_data.summary(record), "_record": record}, "") if keep else (None, why)


def reuse_finished(preset: dict, jobs: list, out: Path, code: dict, results: dict, commits: dict) -> list:
    """Keep the finished runs that still match (source and config), from their folders or, where a folder is
    not here, from the committed per-run data; say how many and from which commits."""
    left, dropped = [], {}
    committed = run_data.by_run(out)
    for entry, seed in jobs:
        config = run_config(preset, entry, seed, out)
        summary, why = finished_run(config, code)
        if summary is None and why == "not finished":
            summary, why = committed_run(committed.get((entry.label, seed)), config, code)
        if summary is None:
            left.append((entry, seed))
            if why not in ("not finished", "not completed"):
                dropped[why] = dropped.get(why, 0) + 1
            continue
        results[entry.label].append(summary)
        commit = summary["commit"] if "_record" in summary else provenance.read(Path(summary["results_dir"]))["commit"]
        commits.setdefault(commit, []).append(f"{entry.label}-s{seed}")
    kept = sum(len(v) for v in commits.values())
    origin = ", ".join(f"{c} ({len(v)})" for c, v in sorted(commits.items())) or "-"
    redo = "; ".join(f"{n} not kept: {why}" for why, n in sorted(dropped.items()))
    print(f"reuse: kept {kept} of {len(jobs)} runs, from commits {origin}" + (f"; {redo}" if redo else ""), flush=True)
    return left


def refuse_to_drop_committed(out: Path, left: list, source_hash: str) -> None:
    """--table-only rewrites runs.json.gz with the runs it tables: refuse, before writing, where that would drop
    committed runs of another source hash (the runs a table was made from), and name the flag that tables them."""
    committed = run_data.by_run(out)
    lost = [committed[(e.label, s)] for e, s in left
            if (e.label, s) in committed and committed[(e.label, s)].get("source_hash") != source_hash]
    if lost:
        hashes = sorted({str(r.get("source_hash")) for r in lost})
        raise SystemExit(f"--table-only would drop {len(lost)} committed run(s) of {out} made under source hash "
                         f"{', '.join(hashes)} (this tables {source_hash}'s): table them with --runs-source "
                         f"{hashes[0]}, or run them again with --reuse; nothing written")


def resume_point(config: dict, code: dict) -> tuple[int | None, str]:
    """The checkpoint round ``config``'s cut-off run goes on from (noted in its start record), or None and why it
    starts over (``provenance.resumable``)."""
    at, why = provenance.resumable(run_folder(config), config, code)
    if at is not None:
        provenance.note_resumed(run_folder(config), at)
    return at, why


def resumable_jobs(preset: dict, jobs: list, out: Path, code: dict) -> set:
    """The (label, seed) jobs whose cut-off run may continue from its checkpoint (``provenance.resumable``: begun
    under this source and config), each one's round noted in its start record; says which, from which round, and
    why the others start over."""
    resumed, fresh = {}, {}
    for entry, seed in jobs:
        at, why = resume_point(run_config(preset, entry, seed, out), code)
        if at is None:
            fresh[why] = fresh.get(why, 0) + 1
            continue
        resumed[(entry.label, seed)] = f"{entry.label}-s{seed} at round {at}"
    again = "; ".join(f"{n} start over: {why}" for why, n in sorted(fresh.items()))
    if jobs:
        print(f"resume: {len(resumed)} of {len(jobs)} runs left continue from their checkpoints"
              + (f" ({', '.join(resumed.values())})" if resumed else "") + (f"; {again}" if again else ""), flush=True)
    return set(resumed)


def study_progress(preset: dict, jobs: list, out: Path, app_dir: Path, reused: int):
    """The study's progress line over these jobs (runner/progress.py), watching from now on."""
    from fedcore.config import pyproject_run_config
    from runner.progress import Job, StudyProgress

    default = pyproject_run_config(app_dir).get("num-server-rounds", 20) if (app_dir / "pyproject.toml").exists() else 20
    return StudyProgress([Job(f"{e.label}-s{s}", out / "runs" / f"{e.label}-s{s}",
                              int(run_config(preset, e, s, out).get("num-server-rounds", default))) for e, s in jobs],
                         reused=reused, label=out.name).start()


def run_jobs(preset: dict, jobs: list[tuple[Entry, int]], out: Path, app_dir: Path, code: dict, resumed: set,
             record: Callable[[int, Entry, int, dict, float], None]) -> None:
    """Run each (entry, seed) job on the preset's engine (``flwr run``, or ``jobs`` in-process worker processes),
    continuing the ``resumed`` ones from their checkpoints, and hand each result to ``record`` as it comes."""
    spec = preset["compare"]
    supernodes = spec.get("supernodes", 10)
    if spec.get("engine", "flwr") == "inprocess":
        workers = max(1, int(spec.get("jobs", 1)))
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        from runner.inprocess import pool_context

        configs = [job_config(preset, e, s, out, resume=(e.label, s) in resumed) for e, s in jobs]
        context = pool_context(*(c.get("device", "auto") for c in configs))
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            t0 = time.monotonic()
            futures = [pool.submit(run_inprocess_job, config, supernodes, code) for config in configs]
            print(f"{len(jobs)} in-process runs on {workers} worker(s) ...", flush=True)
            for i, ((entry, seed), future) in enumerate(zip(jobs, futures), 1):
                record(i, entry, seed, future.result(), time.monotonic() - t0)
        return
    for i, (entry, seed) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {entry.label} seed {seed} ...", flush=True)
        t0 = time.monotonic()
        config = job_config(preset, entry, seed, out, resume=(entry.label, seed) in resumed)
        if not config.get("resume"):
            provenance.mark_started(run_folder(config), code, config)
        result = simulate(config, supernodes=supernodes, app_dir=app_dir,
                          cpus_per_client=spec.get("cpus-per-client", 1),
                          gpus_per_client=spec.get("gpus-per-client"), stream=spec.get("stream", False))
        record(i, entry, seed, result, time.monotonic() - t0)
