"""The papers' own numbers (docs/papers/numbers/<paper>.toml: every row of each results table, with its table,
column, dataset and metric) and what is read from them: a preset's paper values, checked against the file, and the
paper's gain, always against the best baseline of the same table and column.

A preset's ``[paper]`` names its tables: ``source = ["fedmcsa/table1-synthetic-mlr", "fedmcsa/table2-synthetic-mlr"]``
(the first is the comparison the gain is taken from; later ones add rows the first lacks, e.g. an ablation's variants).
Rows whose labels carry a suffix (one preset, two models) map it with ``suffixes = { "-mlr" = [refs], "-dnn" = [refs] }``.
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = ROOT / "docs" / "papers" / "numbers"


@functools.cache
def paper(name: str) -> dict:
    return tomllib.loads((NUMBERS / f"{name}.toml").read_text())


def papers() -> list[str]:
    return sorted(p.stem for p in NUMBERS.glob("*.toml"))


def table(ref: str) -> dict:
    """One table column by reference ``<paper>/<table id>``."""
    name, _, tid = ref.partition("/")
    found = [t for t in paper(name)["tables"] if t["id"] == tid]
    if not found:
        raise KeyError(f"{ref}: no table {tid!r} in docs/papers/numbers/{name}.toml")
    return found[0]


def value(refs: list[str], label: str) -> tuple[str, float] | None:
    """The first of ``refs`` whose table has a row labelled ``label``: (ref, value)."""
    for ref in refs:
        for row in table(ref)["rows"]:
            if row.get("label") == label:
                return ref, row["value"]
    return None


def expected_values(paper_spec: dict, labels: list[str]) -> dict[str, float]:
    """The paper's number for each of ``labels`` that its tables have (suffixed labels through ``suffixes``)."""
    refs = paper_spec.get("source", [])
    out = {}
    for label in labels:
        found = value(refs, label)
        for suffix, suffix_refs in paper_spec.get("suffixes", {}).items():
            if found is None and label.endswith(suffix):
                found = value(suffix_refs, label.removesuffix(suffix))
        if found is not None:
            out[label] = found[1]
    return out


def gain(ref: str) -> dict | None:
    """The paper's method minus the best baseline of the same table column (the paper's claim), or None where the
    column has no row of the paper's method."""
    t, name = table(ref), ref.partition("/")[0]
    method = [r for r in t["rows"] if r.get("role") == "method"]
    baselines = [r for r in t["rows"] if r.get("role", "baseline") == "baseline"]
    if not method or not baselines:
        return None
    best = max(baselines, key=lambda r: r["value"])
    return {"gain": method[0]["value"] - best["value"], "method": method[0]["value"], "baseline": best["row"],
            "base": best["value"], "dataset": t["dataset"], "column": t["column"], "table": t["table"],
            "metric": paper(name)["metric"], "paper": name}
