"""One tuning protocol for every row of a comparison (issue #45): each method's own hyperparameters chosen on
validation from the same small grid, once per method and data family, by one command.

    python -m benchmarks.tune conf/<preset>.toml [--methods fedprox,cfl] [--retune] [--jobs 2]

For every method of the preset whose declaration names a ``TUNING_GRID`` and the family file does not hold yet:
run each of its settings (at most 9) once, on the preset's first seed, for ``ROUNDS_FRACTION`` of its rounds,
with the preset's common keys and the row's own options, and keep the setting with the best validation accuracy
(``best_val_acc``; test accuracy is never read) unless it beats the method's default by no more than noise: one
standard error of the difference of two accuracies over the validation split's n images (``choose``); then the
default stays, so that a choice never rests on a handful of images. ``--rechoose`` applies the rule again to the
validation numbers a family file holds, without running anything. The choice goes to
``conf/tuned/<dataset>-<partition>.toml`` (beside the preset; ``[compare] tuned`` names another), which every
preset of that family reads through ``[compare] tuned``: the command adds that line to the preset when it is
missing. A method already in the file is reused, not tuned again (``--retune`` does); a grid cut off part-way
goes on where it stopped (``run_grid``: the settings finished under the same source are kept, a cut-off one
continues from its checkpoint). Like a docs/ table, a tuning is made from committed code: a tree with uncommitted
changes other than the family file it writes itself is refused (``--allow-dirty`` to try things; each record's
commit then says ``+changes``). ``<output>/tuning.md``
lists, for every row, the grid and its validation numbers (or where the reused choice was made) and the common
keys each row runs with, flagging any that differ between rows and are not declared in ``[compare] unequal`` (key -> why).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from fedcore.tuning_grid import COMMON_KEYS, MAX_SETTINGS, ROUNDS_FRACTION, SELECT_ON, family, settings, tuned_keys


def tuned_path(preset_path: Path, preset: dict) -> Path:
    """The family file the preset reads (``[compare] tuned``) or, by default, ``<dataset>-<partition>.toml`` in the
    ``tuned/`` folder of the ``conf/`` the preset lies in (at any depth: conf/mupfl-paper/x.toml shares conf/tuned
    with conf/x.toml), else beside the preset."""
    folder = Path(preset_path).parent
    if "tuned" in preset["compare"]:
        return folder / preset["compare"]["tuned"]
    conf = next((d for d in (folder, *folder.parents) if d.name == "conf"), folder)
    return conf / "tuned" / f"{family(preset.get('run-config', {}))}.toml"


def tuning_budget(preset: dict) -> int:
    """The rounds of a tuning run: ``ROUNDS_FRACTION`` of the preset's, at least one."""
    rounds = int(preset.get("run-config", {}).get("num-server-rounds", 10))
    return max(1, math.ceil(rounds * ROUNDS_FRACTION))


def check_validation(preset: dict, where: str) -> None:
    """The protocol selects on validation only: a preset without a validation split cannot be tuned."""
    if not float(preset.get("run-config", {}).get("val-fraction", 0.0)) > 0.0:
        raise SystemExit(f"{where}: tuning selects on the validation split; set val-fraction > 0 in [run-config]")


NOISE_SE = 1.0  # a setting replaces the default only when it beats it by more than this many standard errors


def default_setting(method: str) -> dict:
    """The method's own defaults (its ``HPARAMS``) for the keys the protocol tunes: what its rows run untuned."""
    from fedcore.config import schema

    keys = schema()
    return {k: keys[k].default for k in tuned_keys(method)}


def noise(p: float, q: float, n: int) -> float:
    """Standard error of the difference of two accuracies p and q, each over the same n validation images, taken
    as independent binomials (so it errs on the side of keeping the default: two models of one method mostly
    err on the same images)."""
    return math.sqrt((p * (1 - p) + q * (1 - q)) / n)


def choose(records: list[dict], default: dict | None = None, val_samples: int | None = None) -> int | None:
    """Index of the chosen setting: the highest validation accuracy (the first of equals), unless the ``default``
    setting finished within ``NOISE_SE`` standard errors of it (``noise`` over ``val_samples`` images; without
    ``val_samples``, only an exact tie) -- then the default. None if no setting finished."""
    scored = [(r["val_acc"], -i) for i, r in enumerate(records) if r.get("val_acc") is not None]
    if not scored:
        return None
    best = -max(scored)[1]
    d = next((i for i, r in enumerate(records) if r.get("setting") == default and r.get("val_acc") is not None), None)
    if default is None or d is None:
        return best
    p, q = records[best]["val_acc"], records[d]["val_acc"]
    margin = NOISE_SE * noise(p, q, val_samples) if val_samples else 0.0
    return best if p - q > margin else d


def resolved(run_config: dict):
    """A run config as the run resolves it (``Config``), less the keys that only say where its folder goes."""
    from fedcore.config import Config

    return Config.from_run_config({k: v for k, v in run_config.items() if k not in ("results-dir", "run-name")})


def validation_samples(config: dict, num_clients: int) -> int:
    """The validation images behind a tuning run's accuracy: every client's validation split (all clients
    evaluate, and the selection metric pools them), from the run's own data key."""
    from partitions import federated_data

    _, splits = federated_data(*resolved(config).data_key(num_clients))
    return int(sum(len(s.val) for s in splits))


def method_rows(preset: dict) -> dict[str, object]:
    """method -> the row its tuning runs take their options from: the row labelled as the method if there is
    one, else its first row (a row reading another's runs is no row of its own)."""
    from runner.compare_presets import entries

    rows: dict[str, object] = {}
    for e in entries(preset):
        if e.runs_of is None and (e.method not in rows or e.label == e.method):
            rows[e.method] = e
    return rows


def grid_configs(preset: dict, entry, out: Path) -> list[dict]:
    """The run configs of ``entry``'s method's grid: the preset's common keys, the row's options other than the
    tuned ones, the setting, the first seed and the tuning budget."""
    keys = set(tuned_keys(entry.method))
    own = {k: v for k, v in entry.config.items() if k not in keys}
    seed = preset["compare"].get("seeds", [0])[0]
    return [{**preset.get("run-config", {}), **own, **setting, "method": entry.method, "seed": seed,
             "num-server-rounds": tuning_budget(preset), "results-dir": str(out / "runs" / "tuning"),
             "run-name": f"{entry.method}-{i}", "plots": False}
            for i, setting in enumerate(settings(entry.method))]


def run_grid(configs: list[dict], supernodes: int, jobs: int, code: dict) -> list[dict | None]:
    """Every config in-process (the same ServerApp and ClientApp as a comparison), ``jobs`` at a time.

    As a comparison's ``--resume`` does, a setting whose run already finished under ``code``'s source and the
    same config is kept, and one cut off under them goes on from its last checkpoint: a grid cut off by the end
    of a session loses only the rounds since the last checkpoints. Each finished run gets its provenance record."""
    from runner import provenance
    from runner.compare_jobs import finished_run, resume_point, run_folder, run_inprocess_job
    from runner.inprocess import pool_context

    summaries = [finished_run(c, code)[0] for c in configs]
    todo, resumed = [], []
    for i, config in enumerate(configs):
        if summaries[i] is not None:
            continue
        at, _ = resume_point(config, code)
        if at is not None:
            resumed.append(f"{config['run-name']} at round {at}")
        todo.append((i, {**config, **({"resume": True} if at is not None else {"overwrite": True})}))
    kept = len(configs) - len(todo)
    if kept or resumed:
        print(f"  kept {kept} finished setting(s) of this source; {len(resumed)} go on from their checkpoints"
              + (f" ({', '.join(resumed)})" if resumed else ""), flush=True)
    if not todo:
        return summaries
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    context = pool_context(*(c.get("device", "auto") for _, c in todo))  # spawn where a run is on CUDA
    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=context) as pool:
        running = {pool.submit(run_inprocess_job, config, supernodes, code): i for i, config in todo}
        for future in as_completed(running):  # recorded as each ends, so a cut-off grid keeps what finished
            i, r = running[future], future.result()
            if r["status"] != "finished:completed":  # a failed setting says why, not only "failed"
                print(f"  {configs[i]['run-name']}: {r['status']} {r.get('details', '')}", flush=True)
                continue
            provenance.record(run_folder(configs[i]), code, configs[i])
            summaries[i] = r["summary"]
    return summaries


def tune_method(preset: dict, entry, out: Path, jobs: int, code: dict) -> dict:
    """Run ``entry``'s method's grid and return its record: settings, validation accuracies, the choice."""
    configs = grid_configs(preset, entry, out)
    assert len(configs) <= MAX_SETTINGS
    t0 = time.monotonic()
    print(f"tuning {entry.method}: {len(configs)} settings x {tuning_budget(preset)} rounds ...", flush=True)
    summaries = run_grid(configs, preset["compare"].get("supernodes", 10), jobs, code)
    grid = settings(entry.method)
    records = [{"setting": s, "val_acc": None if sm is None else sm.get(SELECT_ON),
                "val_round": None if sm is None else sm.get("best_val_round")} for s, sm in zip(grid, summaries)]
    n = validation_samples(configs[0], preset["compare"].get("supernodes", 10))
    best = choose(records, default_setting(entry.method), n)
    for r in records:
        print(f"  {json.dumps(r['setting'])}: validation {_pct(r['val_acc'])}", flush=True)
    print(f"  chosen: {json.dumps(grid[best]) if best is not None else 'none (every run failed)'}  "
          f"(of {n} validation images; {time.monotonic() - t0:.0f} s)", flush=True)
    return {"chosen": grid[best] if best is not None else {}, "grid": records, "seed": configs[0]["seed"],
            "rounds": tuning_budget(preset), "of-rounds": int(preset.get("run-config", {}).get("num-server-rounds", 0)),
            "val-samples": n, "preset": preset.get("name", ""), "commit": preset.get("made", {}).get("commit", ""),
            "source-hash": code.get("source_hash", ""),
            # the cap on each client's training data it was tuned at (a data-size study's family says which)
            **({"max-train-samples": cap} if (cap := int(configs[0].get("max-train-samples", 0))) else {})}


def rechoose(records: dict[str, dict], preset_dir: Path) -> dict[str, tuple[dict, dict]]:
    """Apply ``choose`` again to every record's validation numbers, in place (a record without ``val-samples``
    gets it from its own preset, beside ``preset_dir``, and seed). Returns method -> (old, new) choice for the
    choices that changed."""
    from runner.compare_presets import load_preset

    changed = {}
    for method, rec in records.items():
        if not rec.get("val-samples"):
            preset = load_preset(preset_dir / f"{rec['preset']}.toml")
            config = {**grid_configs(preset, method_rows(preset)[method], Path("."))[0], "seed": rec["seed"]}
            rec["val-samples"] = validation_samples(config, preset["compare"].get("supernodes", 10))
        i = choose(rec["grid"], default_setting(method), rec["val-samples"])
        new = rec["grid"][i]["setting"] if i is not None else {}
        if new != rec["chosen"]:
            changed[method] = (rec["chosen"], new)
        rec["chosen"] = new
    return changed


# ---------------------------------------------------------------------- the family file
def read_family(path: Path) -> dict[str, dict]:
    """method -> record (as ``tune_method`` returns it) from a family file."""
    import tomllib

    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text())
    out = {}
    for method, chosen in data.get("method-config", {}).items():
        rec = data.get("tuning", {}).get(method, {})
        out[method] = {"chosen": dict(chosen), **{k: v for k, v in rec.items() if k != "grid"},
                       "grid": [{"setting": json.loads(g["setting"]), "val_acc": g.get("val_acc"),
                                 "val_round": g.get("val_round")} for g in rec.get("grid", [])]}
    return out


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def write_family(path: Path, records: dict[str, dict], fam: str) -> None:
    """The family file: ``[method-config.<m>]`` (what presets read) and ``[tuning.<m>]`` (the evidence)."""
    lines = [f"# Hyperparameters chosen on validation for the {fam} family by `python -m benchmarks.tune` (issue #45):",
             "# each method's grid (fedcore/tuning_grid.py) on one seed at a shortened budget; every preset of this",
             "# family reads [method-config] through `[compare] tuned`. [tuning] holds each grid's validation numbers.", ""]
    for method in sorted(records):
        lines.append(f'[method-config."{method}"]')
        lines += [f"{json.dumps(k)} = {_toml(v)}" for k, v in records[method]["chosen"].items()]
        lines.append("")
    for method in sorted(records):
        rec = records[method]
        lines.append(f'[tuning."{method}"]')
        lines += [f"{k} = {_toml(rec[k])}" for k in ("preset", "commit", "source-hash", "max-train-samples", "seed",
                                                     "rounds", "of-rounds", "val-samples") if k in rec]
        lines.append("grid = [")
        for g in rec["grid"]:
            fields = [f"setting = {_toml(json.dumps(g['setting'], sort_keys=True))}"]
            fields += [f"{k} = {_toml(g[k])}" for k in ("val_acc", "val_round") if g.get(k) is not None]
            lines.append("  { " + ", ".join(fields) + " },")
        lines += ["]", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def merge_family(path: Path, ours: dict[str, dict], fam: str) -> dict[str, dict]:
    """Write ``ours`` into the family file over what it holds now, under a lock: two presets of one family tuned
    at the same time each keep the other's choices (each writing its own view would drop them). Returns the
    merged records."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:  # the file itself is the lock (advisory): no lock file left in the tree
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = {**read_family(path), **ours}
        write_family(path, merged, fam)
    return merged


def name_family_file(preset_path: Path, relative: str) -> bool:
    """Add ``tuned = "<relative>"`` under the preset's ``[compare]`` when it has no ``tuned`` key (True if added)."""
    text = Path(preset_path).read_text()
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("[compare]"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    if any(line.split("=")[0].strip() == "tuned" for line in lines[start + 1:end]):
        return False
    lines.insert(start + 1, f'tuned = "{relative}"  # each method\'s hyperparameters, chosen by benchmarks.tune\n')
    Path(preset_path).write_text("".join(lines))
    return True


# ---------------------------------------------------------------------- common keys
def common_keys(preset: dict) -> dict[str, dict]:
    """label -> the common keys its runs resolve to (``auto`` replaced by the method's paper setting)."""
    from runner.compare_presets import entries, run_config

    out = {}
    for e in entries(preset):
        if e.runs_of is None:
            cfg = resolved(run_config(preset, e, 0, Path(".")))
            out[e.label] = {k: cfg[k] for k in COMMON_KEYS}
    return out


def unequal_keys(preset: dict) -> dict[str, dict]:
    """common key -> {label: value} for every key that differs between rows and the preset does not declare in
    ``[compare] unequal``."""
    table, declared = common_keys(preset), preset["compare"].get("unequal", {})
    out = {}
    for key in COMMON_KEYS:
        values = {label: row[key] for label, row in table.items()}
        if len(set(map(repr, values.values()))) > 1 and key not in declared:
            out[key] = values
    return out


def overrides(preset: dict) -> list[tuple[str, str, object, object]]:
    """(row, key, the row's value, the family's choice) for every tuned key a row sets itself, away from the choice:
    a variant that studies the method's own options (an ablation, the paper's variant) does so on purpose; a row
    labelled as its method never should, since then the protocol's choice is not what runs."""
    from runner.compare_presets import entries

    chosen = preset.get("tuned-config", {})
    out = []
    for e in entries(preset):
        if e.runs_of is not None:
            continue
        for key in tuned_keys(e.method):
            if key in e.config and key in chosen.get(e.method, {}) and e.config[key] != chosen[e.method][key]:
                out.append((e.label, key, e.config[key], chosen[e.method][key]))
    return out


# ---------------------------------------------------------------------- the report
def _pct(x) -> str:
    return "failed" if x is None else f"{100 * x:.2f}"


def code_note(rec: dict) -> str:
    """What a record says of the code it was tuned with: its source hash, or, for a choice made from a dirty tree
    before records stored one, that no committed code can be shown to be it."""
    if rec.get("source-hash"):
        return f", source hash {rec['source-hash']}"
    if str(rec.get("commit", "")).endswith("+changes"):
        return ("; made from uncommitted changes and no source hash recorded: no committed commit's source can be "
                "shown to be the one tuned, so this choice is to be tuned again from committed code")
    return ""


def render(preset: dict, preset_path: Path, family_file: Path, records: dict[str, dict], tuned_now: set[str]) -> str:
    spec = preset["compare"]
    rows = [e for e in method_rows(preset).values()]
    lines = [f"# Tuning: {preset_path.stem}", "",
             f"Made by `python -m benchmarks.tune {preset_path}` (issue #45's protocol, `fedcore/tuning_grid.py`): "
             f"each method's own hyperparameters (at most two, at most {MAX_SETTINGS} settings) chosen on the "
             f"validation split (weighted validation accuracy at its best evaluated round; test accuracy is never "
             f"read; the method's default stays unless a setting beats it by more than {NOISE_SE:g} standard error "
             f"of the difference over the validation images), on one seed and {ROUNDS_FRACTION:g} of the rounds of the "
             f"preset it was tuned with (each section names them), once per method for the "
             f"`{family(preset.get('run-config', {}))}` family (`{family_file.name}`; every preset of the family "
             "reuses the choice). Rows without a grid have no hyperparameter of their own to tune.", ""]
    untuned = [e.method for e in rows if settings(e.method) and e.method not in records]
    if untuned:
        lines += [f"Not tuned yet (they run at their defaults until `--methods` names them): {', '.join(untuned)}.", ""]
    for e in rows:
        rec = records.get(e.method)
        if rec is None:
            continue
        budget = f"seed {rec.get('seed', '?')}, {rec.get('rounds', '?')} of {rec.get('of-rounds', '?')} rounds" + (
            f", max-train-samples {rec['max-train-samples']}" if rec.get("max-train-samples") else "")
        where = (f"tuned by this command ({budget}{code_note(rec)})" if e.method in tuned_now else
                 f"reused: tuned with preset `{rec.get('preset', '?')}` at commit {rec.get('commit', '?') or '?'} "
                 f"({budget}{code_note(rec)})")
        n = f" of {rec['val-samples']} validation images" if rec.get("val-samples") else ""
        lines += [f"## {e.method}", "", f"{where}; chosen{n}: `{json.dumps(rec['chosen'])}`", "",
                  "| setting | validation accuracy (%) | best round | |", "|---|---|---|---|"]
        default = default_setting(e.method)
        for g in rec["grid"]:
            mark = " ".join(w for w, on in (("chosen", g["setting"] == rec["chosen"]),
                                            ("(default)", g["setting"] == default)) if on)
            lines.append(f"| `{json.dumps(g['setting'])}` | {_pct(g['val_acc'])} | {g.get('val_round') or '-'} | {mark} |")
        lines.append("")
    table = common_keys(preset)
    lines += ["## Common keys", "", "What every row trains with (after `auto`); the protocol wants them equal "
              "unless the preset says why not (`[compare] unequal`).", "",
              "| row | " + " | ".join(COMMON_KEYS) + " |", "|---" * (len(COMMON_KEYS) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(str(v[k]) for k in COMMON_KEYS) + " |" for label, v in table.items()]
    unequal, declared = unequal_keys(preset), spec.get("unequal", {})
    lines.append("")
    lines += [f"- **{k}** differs between rows and is not declared: {v}" for k, v in unequal.items()]
    lines += [f"- {k} differs between rows, as the preset declares: {why}" for k, why in declared.items()]
    if not unequal and not declared:
        lines.append("Every common key is equal for every row.")
    own = overrides(preset)
    if own:
        lines += ["", "## Rows that set a tuned key themselves", "",
                  "These rows run their own value instead of the family's choice (variants that study the method's own "
                  "options).", "", "| row | key | the row's value | the family's choice |", "|---|---|---|---|"]
        lines += [f"| {label} | {key} | {value} | {choice} |" for label, key, value, choice in own]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from runner import provenance
    from runner.compare_presets import load_preset

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", type=Path)
    parser.add_argument("--methods", help="comma-separated methods to tune (default: every method of the preset)")
    parser.add_argument("--retune", action="store_true", help="tune again a method the family file already holds")
    parser.add_argument("--jobs", type=int, help="runs in parallel (default: the preset's jobs)")
    parser.add_argument("--rechoose", action="store_true", help="apply the choice rule again to the validation "
                        "numbers the family file holds (every method of it), run nothing, and say what changed")
    parser.add_argument("--app", type=Path, default=Path("."))
    parser.add_argument("--allow-dirty", action="store_true", help="tune from a tree with uncommitted changes (to try "
                        "things: each record's commit then says +changes)")
    args = parser.parse_args(argv)
    preset = load_preset(args.preset)
    check_validation(preset, str(args.preset))
    preset["name"] = args.preset.stem
    code = provenance.stamp()
    family_file = tuned_path(args.preset, preset)
    records = read_family(family_file)
    if args.rechoose:
        changed = rechoose(records, args.preset.parent)
        merge_family(family_file, records, family(preset.get("run-config", {})))
        for method, (old, new) in sorted(changed.items()):
            print(f"{method}: {json.dumps(old)} -> {json.dumps(new)}", flush=True)
        print(f"{family_file}: {len(changed)} of {len(records)} choices changed", flush=True)
        return 0
    out = (args.app / preset["compare"].get("output", f"results/compare/{args.preset.stem}")).resolve()
    # the family file is this command's own output (a grid resumed after a cut-off finds it uncommitted), like docs/
    own = provenance.OUTPUTS + (os.path.relpath(family_file.resolve(), provenance.ROOT.resolve()),)
    dirty = provenance.guard(out, args.allow_dirty, outputs=own)  # DirtyTree (a SystemExit) unless allowed
    preset["made"] = {"commit": provenance.commit() + ("+changes" if dirty else "")}
    wanted = set(args.methods.split(",")) if args.methods else None
    tuned_now: set[str] = set()
    for method, entry in method_rows(preset).items():
        if not settings(method) or (wanted is not None and method not in wanted):
            continue
        if method in records and not args.retune:
            print(f"{method}: reusing the family's choice {json.dumps(records[method]['chosen'])}", flush=True)
            continue
        records[method] = tune_method(preset, entry, out, args.jobs or preset["compare"].get("jobs", 1), code)
        tuned_now.add(method)
        records = merge_family(family_file, {m: records[m] for m in tuned_now},
                               family(preset.get("run-config", {})))  # after each method: resumable
    if name_family_file(args.preset, os.path.relpath(family_file, args.preset.parent)):
        print(f"{args.preset}: now reads {family_file}", flush=True)
    preset = load_preset(args.preset)  # with the choices, for the common-key table
    out.mkdir(parents=True, exist_ok=True)
    (out / "tuning.md").write_text(render(preset, args.preset, family_file, records, tuned_now))
    print(f"wrote {out / 'tuning.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
