"""A comparison preset (conf/*.toml, format in ``runner.compare``): loading and checking it, its rows (methods,
variants, ``runs-of`` rows, the tuned family's choices) and each run's config; a ``[sweep]`` table's grid becomes
rows here, one variant per combination of its run-config values."""

from __future__ import annotations

import itertools
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

PAPER_METRICS = {  # the paper's metric -> the row key of ours in that metric, at the round chosen on validation
    "weighted": "test_acc_at_best_val", "pooled": "test_acc_at_best_val", "client mean": "test_client_acc_mean_at_best_val",
}


@dataclass(frozen=True)
class Entry:
    """One row of the comparison: its label, the method it runs and the options it adds.

    ``runs_of`` names another entry whose runs this row reads (no runs of its own), and
    ``accuracy`` the results column it reports instead of the personalised accuracy.
    """

    label: str
    method: str
    config: dict = field(default_factory=dict)
    runs_of: str | None = None
    accuracy: str | None = None

    @property
    def run_label(self) -> str:
        return self.runs_of or self.label


def load_preset(path: Path) -> dict:
    """The preset at ``path``, checked (methods, target-acc, variants, [paper]), with its tuned family's choices
    and its ``[sweep]`` grid's rows."""
    preset = tomllib.loads(Path(path).read_text())
    if "compare" not in preset or "methods" not in preset["compare"]:
        raise SystemExit(f"{path}: needs a [compare] table with a 'methods' list")
    target = preset["compare"].get("target-acc")
    if target is not None and not (isinstance(target, (int, float)) and 0 < target <= 1):
        raise SystemExit(f"{path}: target-acc is an accuracy in (0, 1], got {target!r}")
    if "tuned" in preset["compare"]:  # the tuning protocol's choices, under the preset's own options
        from fedcore.tuning_grid import load_tuned

        preset["tuned-config"] = load_tuned(Path(path).parent / preset["compare"]["tuned"])
    preset = expand_sweep(preset)
    entries(preset)  # fail early on a bad variant
    check_paper_table(preset, str(path))
    return preset


SWEEP_OPTIONS = ("method", "label", "also")  # the [sweep] keys that are not swept run-config keys


def sweep_grid(preset: dict) -> list[dict]:
    """Every combination of the ``[sweep]`` table's run-config values, in the table's key order (the last key
    varies fastest): one dict of run-config keys per row."""
    sweep = preset.get("sweep")
    if sweep is None:
        return []
    keys = [k for k in sweep if k not in SWEEP_OPTIONS]
    bad = [k for k in keys if not isinstance(sweep[k], list) or not sweep[k]]
    if not isinstance(sweep.get("method"), str) or not keys or bad:
        raise SystemExit("[sweep] needs method = \"<method>\" and a non-empty list of values for each swept run-config "
                         f"key{f' (not a non-empty list: {bad})' if bad else ''}")
    return [dict(zip(keys, values)) for values in itertools.product(*(sweep[k] for k in keys))]


def sweep_label(preset: dict, point: dict) -> str:
    """A grid row's label: the ``[sweep] label`` template with each ``{key}`` or ``{key:spec}`` replaced by the
    row's value (``format(value, spec)``), else ``<method>-<value>-<value>...``."""
    sweep = preset["sweep"]
    template = sweep.get("label")
    if template is None:
        return "-".join([sweep["method"], *(f"{v:g}" if isinstance(v, float) else str(v) for v in point.values())])

    def value(m: re.Match) -> str:
        if m.group(1) not in point:
            raise SystemExit(f"[sweep] label {template!r}: {m.group(1)!r} is not a swept key ({', '.join(point)})")
        return format(point[m.group(1)], m.group(2) or "")

    return re.sub(r"\{([^{}:]+)(?::([^{}]*))?\}", value, template)


def expand_sweep(preset: dict) -> dict:
    """The preset with one variant of ``[sweep] method`` per grid point, added after its listed methods (a
    preset without ``[sweep]`` as it is)."""
    grid = sweep_grid(preset)
    if not grid:
        return preset
    variants, methods = dict(preset.get("variants", {})), list(preset["compare"]["methods"])
    for point in grid:
        label = sweep_label(preset, point)
        if label in variants or label in methods:
            raise SystemExit(f"[sweep] row {label!r}: that label is already taken (by a listed row or another grid "
                             "point): give each grid row a label of its own")
        variants[label] = {"method": preset["sweep"]["method"], **point}
        methods.append(label)
    return {**preset, "variants": variants, "compare": {**preset["compare"], "methods": methods}}


def entries(preset: dict, labels: list[str] | None = None) -> list[Entry]:
    """The preset's rows, in order, resolved to methods and options."""
    variants = preset.get("variants", {})
    labels = labels or preset["compare"]["methods"]
    out = []
    for label in labels:
        variant = dict(variants.get(label, {}))
        runs_of = variant.pop("runs-of", None)
        accuracy = variant.pop("accuracy", None)
        if runs_of is not None:
            if runs_of not in labels:
                raise SystemExit(f"variant {label!r} reads the runs of {runs_of!r}, which is not in the list")
            base = variants.get(runs_of, {})
            method = base.get("method", runs_of)
        else:
            method = variant.pop("method", label)
        config = {**preset.get("tuned-config", {}).get(method, {}), **preset.get("method-config", {}).get(label, {}),
                  **variant}
        out.append(Entry(label, method, config, runs_of, accuracy))
    return out


def run_config(preset: dict, entry: Entry, seed: int, out: Path) -> dict:
    return {**preset.get("run-config", {}), **entry.config, "method": entry.method, "seed": seed,
            "results-dir": str(out / "runs"), "run-name": f"{entry.label}-s{seed}", "tracker-group": out.name}


def job_config(preset: dict, entry: Entry, seed: int, out: Path, resume: bool = False) -> dict:
    """What a job runs: its run config, replacing whatever its folder holds (a cut-off or older run of
    the comparison; ``--reuse`` has already kept the finished ones that match), or with ``resume``
    continuing the cut-off run there from its last checkpoint."""
    return {**run_config(preset, entry, seed, out), **({"resume": True} if resume else {"overwrite": True})}


def check_paper_table(preset: dict, where: str = "preset") -> None:
    """A preset's ``[paper]`` table: the paper's metric and its numbers by row label."""
    paper = preset.get("paper")
    if paper is None:
        return
    if paper.get("metric") not in PAPER_METRICS:
        raise SystemExit(f"{where}: [paper] metric must be one of {', '.join(PAPER_METRICS)}, got {paper.get('metric')!r}")
    if not isinstance(paper.get("data", ""), str):
        raise SystemExit(f"{where}: [paper] data must be a string naming the paper's data, got {paper['data']!r}")
    values = paper.get("values", {})
    unknown = sorted(set(values) - set(preset["compare"]["methods"]))
    if unknown:
        raise SystemExit(f"{where}: [paper] values name rows that are not in the methods list: {', '.join(unknown)}")
