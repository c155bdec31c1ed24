"""A study across comparison tables: each row's headline at several caps on the clients' training data
(``max-train-samples``), from the tables' committed per-run data (``runs.json.gz``, ``runner.run_data``); nothing
is run here. Each point of the study is one cap and the comparison presets whose runs it reads (a point may read
two: the no-cap point reuses an earlier table's runs for the rows it has and a preset of its own for the rest).

Output (the study's ``output`` folder): ``study.csv`` (every row at every cap: mean, sample std over seeds and the
paired difference to local with its 95% t-interval), ``table.md`` (the same, the paper methods against local and
against the best baseline at each cap, one computed verdict line per paper method, and the commits and source
hashes the runs came from), ``accuracy.png`` and ``gains.png`` (``runner.figures``).

Study file (TOML, in conf/)::

    [study]
    output = "docs/results/study-data-size"
    metric = "client mean"            # or "weighted": the headline, at the round best on validation
    reference = "local"               # what "minus local" subtracts
    paper = ["pfedpm", "fedfcd"]      # the paper methods (drawn bold); every other row but the references is a baseline
    rows = ["local", "fedavg", "pfedpm", "fedfcd"]
    own-reference = { mupfl = "local-cnn" }   # a paper method on its own model, against local on that model
    supernodes = 20                   # the clients of every preset (for the samples per client)

    [[point]]
    cap = 25                          # max-train-samples; 0 = no cap
    presets = ["study-fmnist-cap25.toml"]

    python -m runner.study conf/study/data-size.toml     (or python -m runner.compare conf/study/data-size.toml)
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runner import provenance, run_data, stats

HEADLINES = {"client mean": "test_client_acc_mean_at_best_val", "weighted": "test_acc_at_best_val"}


@dataclass
class Point:
    """One cap: the mean training samples a client holds there, and each row's headline by seed."""

    cap: int
    samples: float
    values: dict[str, dict[int, float]]
    runs: list[dict]  # the per-run records read (for provenance)


def load_study(path: Path) -> dict:
    study = tomllib.loads(Path(path).read_text())
    spec = study.get("study", {})
    for key in ("output", "rows", "paper", "reference"):
        if key not in spec:
            raise SystemExit(f"{path}: [study] needs '{key}'")
    if not study.get("point"):
        raise SystemExit(f"{path}: needs at least one [[point]] with a cap and its presets")
    if spec.get("metric", "client mean") not in HEADLINES:
        raise SystemExit(f"{path}: metric must be one of {', '.join(HEADLINES)}")
    unknown = sorted(set(spec["paper"]) - set(spec["rows"]))
    if unknown:
        raise SystemExit(f"{path}: paper methods {unknown} are not in rows")
    return study


@functools.lru_cache(maxsize=16)
def samples_per_client(run_config: tuple, supernodes: int) -> float:
    """The mean training samples a client holds under ``run_config`` (its cap applied; a client with fewer keeps all
    of its own): the partition as the clients build it, on the preset's seed (0 unless it sets one)."""
    from fedcore.config import Config
    from partitions import federated_data

    _, splits = federated_data(*Config.from_run_config(dict(run_config)).data_key(supernodes))
    return float(np.mean([len(s.train) for s in splits]))


def _data_config(preset: dict) -> tuple:
    keep = ("dataset", "partition", "seed", "train-fraction", "val-fraction", "max-train-samples", "normalize")
    config = preset.get("run-config", {})
    return tuple(sorted((k, v) for k, v in config.items()
                        if k in keep or k.startswith(f"{config.get('partition', 'pathological')}.")))


def read_point(point: dict, study: dict, conf_dir: Path, app_dir: Path) -> Point:
    """One cap's rows from its presets' committed per-run data; a row in two presets of a point is refused."""
    from runner.compare import load_preset

    spec = study["study"]
    key = HEADLINES[spec.get("metric", "client mean")]
    values: dict[str, dict[int, float]] = {}
    runs, samples = [], []
    for name in point["presets"]:
        preset = load_preset(conf_dir / name)
        cap = int(preset.get("run-config", {}).get("max-train-samples", 0))
        if cap != int(point["cap"]):
            raise SystemExit(f"{name}: max-train-samples is {cap}, but the study's point says {point['cap']}")
        samples.append(samples_per_client(_data_config(preset), int(preset["compare"].get("supernodes", 10))))
        out = app_dir / preset["compare"]["output"]
        for run in (run_data.load(out) if (out / run_data.FILE).exists() else []):
            if run["label"] not in spec["rows"] or run.get("status") != "completed":
                continue
            if run["label"] in values and run["seed"] in values[run["label"]]:
                raise SystemExit(f"cap {point['cap']}: {run['label']} seed {run['seed']} is in two presets' runs")
            value = run_data.summary(run).get(key)
            if value is not None:
                values.setdefault(run["label"], {})[run["seed"]] = float(value)
                runs.append(run)
    if len(set(round(s, 6) for s in samples)) > 1:
        raise SystemExit(f"cap {point['cap']}: its presets give the clients different data ({samples})")
    return Point(int(point["cap"]), samples[0], values, runs)


def difference(point: Point, ours: str, theirs: str) -> dict | None:
    """``ours`` minus ``theirs`` at one cap, seed by seed (points); None where a row is missing."""
    if ours not in point.values or theirs not in point.values:
        return None
    d = stats.paired_difference(point.values[ours], point.values[theirs])
    return {k: 100 * d[k] if isinstance(d[k], float) else d[k] for k in d}


def best_baseline(point: Point, study: dict) -> str | None:
    """The baseline with the highest mean headline at this cap (neither a paper method nor a reference)."""
    spec = study["study"]
    references = {spec["reference"], *spec.get("own-reference", {}).values()}
    baselines = [r for r in spec["rows"] if r not in spec["paper"] and r not in references and r in point.values]
    return max(baselines, key=lambda r: np.mean(list(point.values[r].values())), default=None)


def reference_of(label: str, study: dict) -> str:
    return study["study"].get("own-reference", {}).get(label, study["study"]["reference"])


def _beyond(d: dict | None) -> bool:
    return d is not None and d["n"] >= 2 and not math.isnan(d["lo"]) and d["lo"] > 0


def cap_name(point: Point) -> str:
    """"cap 25", or "no cap (2,363)" with the mean training samples per client."""
    return f"cap {point.cap}" if point.cap else f"no cap ({point.samples:,.0f})"


def _cell(d: dict | None) -> str:
    return "-" if d is None else stats.difference_cell(_fraction(d))


def verdicts(points: list[Point], study: dict) -> list[str]:
    """One line per paper method: the caps at which it beats local (its own reference) and the best baseline beyond
    noise (the paired 95% interval above 0), computed from the runs."""
    lines = []
    for label in study["study"]["paper"]:
        ref = reference_of(label, study)
        over_ref = [cap_name(p) for p in points if _beyond(difference(p, label, ref))]
        over_best = [cap_name(p) for p in points
                     if (b := best_baseline(p, study)) is not None and _beyond(difference(p, label, b))]
        nowhere = "no point of the study"
        missing = [cap_name(p) for p in points if difference(p, label, ref) is None]
        lines.append(f"- **{label}** beats {ref} beyond noise at {', '.join(over_ref) or nowhere}; the best baseline "
                     f"at {', '.join(over_best) or nowhere}"
                     + (f" (no runs of it or of {ref} at {', '.join(missing)})." if missing else "."))
    return lines


def rows_csv(points: list[Point], study: dict) -> list[dict]:
    out = []
    for p in points:
        for label in study["study"]["rows"]:
            if label not in p.values:
                continue
            v = np.array(list(p.values[label].values())) * 100
            d = difference(p, label, reference_of(label, study)) if label != reference_of(label, study) else None
            out.append({"cap": p.cap, "samples_per_client": round(p.samples, 1), "label": label, "seeds": len(v),
                        "mean": round(float(v.mean()), 4), "std": round(stats.sample_std(v), 4),
                        "minus_reference": None if d is None else round(d["mean"], 4),
                        "lo": None if d is None else round(d["lo"], 4), "hi": None if d is None else round(d["hi"], 4)})
    return out


def render(points: list[Point], study: dict, made: str) -> str:
    spec = study["study"]
    caps = [cap_name(p) for p in points]
    lines = [f"# Study: {Path(spec['output']).name}", "", made, "",
             f"Headline: the test accuracy ({spec.get('metric', 'client mean')}) at the round best on validation, % "
             "(mean ± sample std over seeds). Differences: seed by seed (same seed = same split), mean and 95% "
             "t-interval (`runner.stats`); \"tie\" where it covers 0. Caps: each client's training samples "
             "(`max-train-samples`, its test and validation splits the same at every cap); samples per client in "
             "brackets where there is no cap.", "",
             "| row | " + " | ".join(caps) + " |", "|---" * (len(caps) + 1) + "|"]
    for label in spec["rows"]:
        cells = []
        for p in points:
            v = np.array(list(p.values.get(label, {}).values())) * 100
            cells.append(f"{v.mean():.2f} ± {stats.sample_std(v):.2f} ({len(v)})" if len(v) else "-")
        name = f"**{label}**" if label in spec["paper"] else label
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Paper method minus its reference (local, or local on its own model) and minus the best baseline "
              "at that cap (named):", "", "| paper method | " + " | ".join(caps) + " |",
              "|---" * (len(caps) + 1) + "|"]
    for label in spec["paper"]:
        ref = reference_of(label, study)
        cells = []
        for p in points:
            best = best_baseline(p, study)
            cells.append(f"{_cell(difference(p, label, ref))} vs {ref}; "
                         + (f"{_cell(difference(p, label, best))} vs {best}" if best else "no baseline"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Verdicts, computed from the runs:", "", *verdicts(points, study), ""]
    origin: dict[tuple, int] = {}
    for run in (run for p in points for run in p.runs):
        where = (run.get("commit"), run.get("source_hash"))
        origin[where] = origin.get(where, 0) + 1
    lines += ["Runs from: " + "; ".join(f"commit `{c}`, source hash `{h}` ({n} runs)"
                                        for (c, h), n in sorted(origin.items(), key=str)) + ".", "",
              "![accuracy against samples per client](accuracy.png)", "", "![gains against the cap](gains.png)", ""]
    return "\n".join(lines)


def _fraction(d: dict | None) -> dict | None:
    """A difference in points as ``stats.difference_cell`` takes it (fractions)."""
    return None if d is None else {k: v / 100 if isinstance(v, float) else v for k, v in d.items()}


def build(study_path: Path, app_dir: Path, argv: list[str] | None = None, allow_dirty: bool = False) -> Path:
    """Write the study's table, CSV and figures; under docs/ only from committed code unless ``allow_dirty`` (as the
    tables: ``provenance.guard``)."""
    from runner import figures

    study = load_study(study_path)
    dirty = provenance.guard(app_dir / study["study"]["output"], allow_dirty)
    points = sorted((read_point(p, study, study_path.parent, app_dir) for p in study["point"]),
                    key=lambda p: p.samples)
    out = app_dir / study["study"]["output"]
    made = provenance.made_by("runner.study", argv) + (
        "\n\n**Made from a tree with uncommitted changes (`--allow-dirty`): not from committed code.**" if dirty else "")
    out.mkdir(parents=True, exist_ok=True)
    rows = rows_csv(points, study)
    with open(out / "study.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["cap"])
        writer.writeheader()
        writer.writerows(rows)
    (out / "table.md").write_text(render(points, study, made))
    figures.plot_accuracy_vs_samples(points, study, out / "accuracy.png")
    figures.plot_gains_vs_cap(points, study, out / "gains.png")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path)
    parser.add_argument("--app", type=Path, default=Path("."))
    parser.add_argument("--allow-dirty", action="store_true", help="write a docs/ study from uncommitted code (to try "
                        "things: the table says so in bold)")
    args = parser.parse_args(argv)
    out = build(args.study, args.app.resolve(), argv, args.allow_dirty)
    print(f"wrote {out / 'table.md'}, {out / 'study.csv'}, {out / 'accuracy.png'}, {out / 'gains.png'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
