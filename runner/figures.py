"""Figures that separate the methods of a comparison, drawn from its run folders (``runs/<label>-s<seed>``).

- ``curves.png``: each method's accuracy over the rounds, mean over seeds with a band of ± one sample
  std, in a colour and line style of its own (tab20's ten dark hues, then its ten light ones, each
  with the next of four line styles and a marker: 13 or more methods stay apart), the paper's method
  drawn thicker; beside it the last half of the rounds, zoomed to where the curves are, because they
  saturate together and the differences a table reports are tenths of a point.
- ``headline.png`` (+ ``headline.csv``): each method's headline number, the test accuracy at the
  round best on validation (best-of-test where the runs have no validation split, marked
  optimistic), in the paper's metric where the preset lists the paper's numbers: a dot at the mean
  over seeds, each seed as a small dot and a bar for the 95% t-interval of the mean, methods sorted
  best first, the paper's method highlighted; the paper's own numbers as diamonds, on their own axis
  where they are on other data.

``python -m runner.compare`` draws both at the end of a comparison; ``python -m runner.figures
DIR...`` redraws them from a comparison folder's preset.json and runs/.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runner import run_data

STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
# the headline per paper metric, then its best-of-test stand-in where there is no validation split
HEADLINES = {"weighted": "test_acc_at_best_val", "pooled": "test_acc_at_best_val",
             "client mean": "test_client_acc_mean_at_best_val"}
OPTIMISTIC = {"test_acc_at_best_val": "best_acc", "test_client_acc_mean_at_best_val": "best_client_acc_mean"}


PAPER_STYLE = {"color": "black", "linestyle": "-", "marker": "*"}  # the paper's method, above all others
ZOOM_POINTS = 15.0  # the zoom shows the methods within this many points of the best final mean


def style(i: int) -> dict:
    """The i-th method's line: colour, line style and marker, all three distinct between neighbours."""
    import matplotlib

    colours = matplotlib.colormaps["tab20"].colors
    greys = (14, 15)  # tab20's grey pair last: a grey line reads as "not a method"
    order = [*(c for c in range(0, 20, 2) if c not in greys), *(c for c in range(1, 20, 2) if c not in greys), *greys]
    return {"color": colours[order[i % 20]], "linestyle": STYLES[(i + i // 20) % len(STYLES)],
            "marker": MARKERS[i % len(MARKERS)]}


def looks(methods: list[Method], highlight: str | None) -> dict[str, dict]:
    """Each method's line, the paper's method in black and the others in turn."""
    others = [m.label for m in methods if m.label != highlight]
    out = {label: style(i) for i, label in enumerate(others)}
    if highlight is not None:
        out[highlight] = PAPER_STYLE
    return out


@dataclass
class Method:
    """One row of the comparison and what its runs measured."""

    label: str
    run_label: str  # whose runs it reads (a variant scored on another column reads its base's)
    column: str  # the rounds.csv accuracy column of its curve
    curves: list[dict[int, float]]  # per seed: round -> accuracy
    headline: np.ndarray  # per seed, in [0, 1]; empty when no run has it


def summary_key(base: str, column: str) -> str:
    """The summary.json key of ``base`` (a personalised-accuracy key) for a method scored on ``column``."""
    if column == "acc_weighted":
        return base
    return {"test_acc_at_best_val": f"{column}_at_best_val",
            "test_client_acc_mean_at_best_val": f"{column}_client_mean_at_best_val",
            "best_acc": f"best_{column}", "best_client_acc_mean": f"best_{column}_client_mean"}[base]


def _read_curve(path: Path, column: str) -> dict[int, float]:
    with open(path) as f:
        return {int(r["round"]): float(r[column]) for r in csv.DictReader(f) if r.get(column) not in (None, "")}


def _record_curve(record: dict, column: str) -> dict[int, float]:
    """A run's curve from its entry in the committed per-run data (its evaluated rounds)."""
    series = record["rounds"]
    return {int(r): float(v) for r, v in zip(series["round"], series.get(column, [])) if v is not None}


def _completed_summary(folder: Path) -> dict | None:
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if summary.get("status") == "completed" else None


def headline_base(preset: dict) -> str:
    paper = preset.get("paper") or {}
    return HEADLINES.get(paper.get("metric"), "test_acc_at_best_val")


def collect(out: Path, preset: dict, labels: list[str] | None = None, seeds: list[int] | None = None
            ) -> tuple[list[Method], str]:
    """Every method's curves and headline values from ``out/runs`` (a run whose folder is not here: from the
    committed per-run data); the summary key used (best-of-test if some run has no validation split)."""
    labels = labels or preset["compare"]["methods"]
    seeds = seeds if seeds is not None else preset["compare"].get("seeds", [0])
    variants = preset.get("variants", {})
    base = headline_base(preset)
    methods, summaries = [], {}
    records = run_data.by_run(out)
    for label in labels:
        variant = variants.get(label, {})
        run_label, column = variant.get("runs-of", label), variant.get("accuracy") or "acc_weighted"
        curves, found = [], []
        for seed in seeds:
            folder = out / "runs" / f"{run_label}-s{seed}"
            summary, record = _completed_summary(folder), records.get((run_label, seed))
            if summary is None and record is not None and record.get("status") == "completed":
                summary, curve = run_data.summary(record), _record_curve(record, column)  # the folder is not here
            else:
                curve = _read_curve(folder / "rounds.csv", column) if (folder / "rounds.csv").exists() else {}
            if curve:
                curves.append(curve)
            if summary is not None:
                found.append(summary)
        summaries[label] = (found, column)
        methods.append(Method(label, run_label, column, curves, np.array([])))
    validated = all(s.get(summary_key(base, col)) is not None for found, col in summaries.values() for s in found)
    key = base if validated else OPTIMISTIC[base]
    for m in methods:
        found, column = summaries[m.label]
        m.headline = np.array([s[summary_key(key, column)] for s in found
                               if s.get(summary_key(key, column)) is not None], dtype=float)
    return methods, key


def paper_method(preset: dict, labels: list[str]) -> str | None:
    """The method the preset's paper proposes: ``[compare] highlight``, else the label that starts its
    output folder's name (fedsac-mnist5k-iid -> fedsac), else none."""
    if preset["compare"].get("highlight") in labels:
        return preset["compare"]["highlight"]
    name = Path(preset["compare"].get("output", "")).name
    for label in sorted(labels, key=len, reverse=True):
        if name == label or name.startswith(label + "-"):
            return label
    return None


def mean_std(curves: list[dict[int, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rounds every seed has, the mean over seeds and the sample std (0 for one seed)."""
    rounds = np.array(sorted(set.intersection(*(set(c) for c in curves))), dtype=int)
    values = np.array([[c[r] for r in rounds] for c in curves], dtype=float)
    std = values.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(len(rounds))
    return rounds, values.mean(axis=0), std


def t_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Mean and the two-sided t-interval of the mean over seeds; (mean, nan, nan) for one seed."""
    from scipy import stats

    n = len(values)
    mean = float(values.mean())
    if n < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * values.std(ddof=1) / math.sqrt(n))
    return mean, mean - half, mean + half


def plot_curves(methods: list[Method], path: Path, title: str, highlight: str | None = None) -> Path | None:
    """Full run and zoom on its last half, one line style per method, ± one sample std over seeds."""
    drawn = [(i, m, *mean_std(m.curves)) for i, m in enumerate(methods) if m.curves]
    drawn = [d for d in drawn if len(d[2])]
    if not drawn:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (full, zoom) = plt.subplots(1, 2, figsize=(13, 5.2), layout="constrained",
                                     gridspec_kw={"width_ratios": [1, 1]})
    last = max(int(d[2][-1]) for d in drawn)
    start = last / 2
    # the zoom's window: the methods near the top at the end (the others are named under it)
    floor = max(float(d[3][-1]) for d in drawn) - ZOOM_POINTS / 100
    low, high, below = np.inf, -np.inf, []
    palette = looks(methods, highlight)
    for i, m, rounds, mean, std in drawn:
        look = palette[m.label]
        strong = m.label == highlight
        seeds = len(m.curves)
        for ax in (full, zoom):
            ax.plot(rounds, 100 * mean, color=look["color"], linestyle=look["linestyle"], marker=look["marker"],
                    markevery=max(1, len(rounds) // 8), markersize=4, linewidth=2.6 if strong else 1.3,
                    zorder=3 if strong else 2,
                    label=f"{m.label}{' (paper)' if strong else ''}" + ("" if seeds > 1 else " (1 seed)"))
            if seeds > 1:
                ax.fill_between(rounds, 100 * (mean - std), 100 * (mean + std), color=look["color"], alpha=0.15,
                                linewidth=0)
        tail = rounds >= start
        if tail.any() and float(mean[-1]) >= floor:
            low = min(low, float(np.min(mean[tail] - std[tail])))
            high = max(high, float(np.max(mean[tail] + std[tail])))
        elif tail.any():
            below.append(m.label)
    full.set(xlabel="round", ylabel="personalised test accuracy (%)", title=f"{title}: all rounds")
    margin = max(0.1, 100 * (high - low) * 0.05)
    zoom.set(xlabel="round", xlim=(start, last + 0.5), ylim=(100 * low - margin, 100 * high + margin),
             title=f"last half of the rounds, zoomed on the methods within {ZOOM_POINTS:g} points of the best")
    if below:
        zoom.text(0.01, 0.01, "below the zoom: " + ", ".join(below), transform=zoom.transAxes, fontsize=7,
                  va="bottom", color="0.3")
    full.axvspan(start, last, color="0.5", alpha=0.08, zorder=0)
    for ax in (full, zoom):
        ax.grid(alpha=0.3)
    seeds = max(len(d[1].curves) for d in drawn)
    handles, labels = full.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=8,
               title=f"mean over {seeds} seeds\nband: ± 1 sample std" if seeds > 1 else "one seed", title_fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_headline(methods: list[Method], key: str, path: Path, title: str, highlight: str | None = None,
                  paper: dict | None = None) -> Path | None:
    """Dot (mean over seeds), seeds and 95% t-interval of each method's headline, best first; the paper's
    numbers as diamonds (on an axis of their own where they are on other data). Also writes the numbers
    beside it as CSV."""
    rows = []
    for i, m in enumerate(methods):
        if len(m.headline):
            mean, lo, hi = t_interval(m.headline)
            rows.append((i, m, mean, lo, hi))
    if not rows:
        return None
    rows.sort(key=lambda r: -r[2])
    paper = paper or {}
    theirs = paper.get("values", {})
    with open(path.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "seeds", "mean", "std", "ci95_low", "ci95_high", "paper", "metric"])
        for _, m, mean, lo, hi in rows:
            w.writerow([m.label, len(m.headline), f"{mean:.6f}",
                        f"{m.headline.std(ddof=1):.6f}" if len(m.headline) > 1 else "",
                        "" if math.isnan(lo) else f"{lo:.6f}", "" if math.isnan(hi) else f"{hi:.6f}",
                        theirs.get(m.label, ""), key])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    apart = bool(theirs) and bool(paper.get("data"))  # the paper's numbers are on other data: own axis
    fig, axes = plt.subplots(1, 2 if apart else 1, figsize=(10 if apart else 8, 0.42 * len(rows) + 1.8),
                             layout="constrained", squeeze=False, sharey=True,
                             gridspec_kw={"width_ratios": [3, 1]} if apart else None)
    ax = axes[0][0]
    y = np.arange(len(rows))[::-1]
    palette = looks(methods, highlight)
    for yy, (i, m, mean, lo, hi) in zip(y, rows):
        look = palette[m.label]
        strong = m.label == highlight
        if strong:
            for a in axes[0]:
                a.axhspan(yy - 0.45, yy + 0.45, color="gold", alpha=0.25, zorder=0)
        if not math.isnan(lo):
            ax.plot([100 * lo, 100 * hi], [yy, yy], color=look["color"], linewidth=3 if strong else 2, zorder=2)
        ax.scatter(100 * m.headline, np.full(len(m.headline), yy), s=10, color="0.35", zorder=3)
        ax.scatter([100 * mean], [yy], s=80 if strong else 50, color=look["color"], edgecolor="black", zorder=4)
        if m.label in theirs:
            target = axes[0][1] if apart else ax
            target.scatter([theirs[m.label]], [yy], marker="D", s=45, facecolor="none", edgecolor="crimson",
                           linewidth=1.5, zorder=5)
    names = [f"{m.label} ({len(m.headline)})" if len(m.headline) != max(len(r[1].headline) for r in rows)
             else m.label for _, m, *_ in rows]
    ax.set_yticks(y, names)
    for tick, (_, m, *_) in zip(ax.get_yticklabels(), rows):
        if m.label == highlight:
            tick.set_fontweight("bold")
    metric = {"test_acc_at_best_val": "weighted", "test_client_acc_mean_at_best_val": "client mean",
              "best_acc": "weighted, best-of-test (optimistic)",
              "best_client_acc_mean": "client mean, best-of-test (optimistic)"}[key]
    when = "" if key.startswith("best") else " at the round best on validation"
    seeds = max(len(r[1].headline) for r in rows)
    ax.set(xlabel=f"test accuracy (%), {metric}{when}", ylim=(-0.6, len(rows) - 0.4),
           title=f"{title}\ndot: mean over {seeds} seed{'s' * (seeds > 1)}, grey: each seed"
           + (", bar: 95% t-interval of the mean" if seeds > 1 else ""))
    ax.margins(x=0.06)
    ax.grid(axis="x", alpha=0.3)
    if theirs:
        marker = plt.Line2D([], [], marker="D", color="crimson", markerfacecolor="none", linestyle="none")
        where = f"paper ({paper['data']}, {paper.get('metric')})" if paper.get("data") else \
            f"paper ({paper.get('metric')})"
        if not apart:  # on its own axis its title says what the diamonds are
            ax.legend([marker], [where], loc="lower right", fontsize=8)
        if apart:
            axes[0][1].set(xlabel="paper's number (%)", title=f"◇ the paper's numbers\n({paper['data']}, {paper.get('metric')})")
            axes[0][1].margins(x=0.12)
            axes[0][1].grid(axis="x", alpha=0.3)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_figures(out: Path, preset: dict, labels: list[str] | None = None, seeds: list[int] | None = None
                  ) -> list[Path]:
    """Both figures of a comparison folder; returns the files written."""
    out = Path(out)
    methods, key = collect(out, preset, labels, seeds)
    highlight = paper_method(preset, [m.label for m in methods])
    written = [plot_curves(methods, out / "curves.png", out.name, highlight),
               plot_headline(methods, key, out / "headline.png", out.name, highlight, preset.get("paper"))]
    return [p for p in written if p is not None]


# ---------------------------------------------------------------- a study across caps (runner/study.py)
def _cap_axis(ax, points) -> None:
    """Log x axis of training samples per client, ticked at each cap (the no-cap point by its samples)."""
    ax.set_xscale("log")
    ax.set_xticks([p.samples for p in points], [str(p.cap) if p.cap else f"no cap\n({p.samples:,.0f})" for p in points])
    ax.minorticks_off()
    ax.set_xlabel("training samples per client (cap; mean where the cap is above a client's data)")
    ax.grid(alpha=0.3)


def plot_accuracy_vs_samples(points, study: dict, path: Path) -> Path:
    """Each row's headline (mean over seeds) against the training samples per client, one line per row, with the
    paired 95% interval of its difference to local drawn around its mean at each cap; the paper methods bold."""
    import matplotlib.pyplot as plt

    from runner.study import difference, reference_of

    spec = study["study"]
    fig, ax = plt.subplots(figsize=(10, 6.5), layout="constrained")
    for i, label in enumerate(spec["rows"]):
        at = [p for p in points if label in p.values]
        if not at:
            continue
        x = np.array([p.samples for p in at])
        y = np.array([100 * np.mean(list(p.values[label].values())) for p in at])
        half = [((d["hi"] - d["lo"]) / 2 if (d := difference(p, label, reference_of(label, study))) is not None
                 and d["n"] >= 2 else 0.0) for p in at]
        look = style(i)
        bold = label in spec["paper"]
        ax.errorbar(x, y, yerr=half, label=label, color=look["color"], linestyle=look["linestyle"],
                    marker=look["marker"], linewidth=2.6 if bold else 1.0, markersize=7 if bold else 4, capsize=3,
                    zorder=3 if bold else 2)
    _cap_axis(ax, points)
    ax.set_ylabel(f"test accuracy at the best-validation round, {spec.get('metric', 'client mean')} (%)")
    ax.set_title("accuracy against the data a client holds (bars: paired 95% interval against local; "
                 "paper methods bold)", fontsize=10)
    ax.legend(fontsize=8, ncol=2, loc="best")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_gains_vs_cap(points, study: dict, path: Path) -> Path:
    """Each paper method minus local (its own reference) and minus the best baseline at each cap, with the paired
    95% intervals, 0 drawn: where a gain appears."""
    import matplotlib.pyplot as plt

    from runner.study import best_baseline, difference, reference_of

    spec = study["study"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True, layout="constrained")
    for ax, title in zip(axes, ("minus local", "minus the best baseline at that cap")):
        for i, label in enumerate(spec["paper"]):
            diffs = [(p, difference(p, label, reference_of(label, study) if ax is axes[0] else best_baseline(p, study)))
                     for p in points]
            diffs = [(p, d) for p, d in diffs if d is not None]
            if not diffs:
                continue
            x = np.array([p.samples for p, _ in diffs]) * (1 + 0.03 * (i - len(spec["paper"]) / 2))  # apart
            y = np.array([d["mean"] for _, d in diffs])
            err = np.array([[d["mean"] - d["lo"], d["hi"] - d["mean"]] if d["n"] >= 2 else [0.0, 0.0]
                            for _, d in diffs]).T
            look = style(i)
            ax.errorbar(x, y, yerr=err, label=label, color=look["color"], marker=look["marker"], linewidth=2,
                        capsize=3)
        ax.axhline(0.0, color="black", linewidth=1)
        _cap_axis(ax, points)
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("paper method minus row (points; paired 95% interval over seeds)")
    axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", help="comparison folders (preset.json and runs/)")
    args = parser.parse_args(argv)
    for folder in args.folders:
        preset = json.loads((folder / "preset.json").read_text())
        written = write_figures(folder, preset)
        print("\n".join(map(str, written)) if written else f"{folder}: no runs to draw")
    return 0


if __name__ == "__main__":
    sys.exit(main())
