"""The statistics of a comparison table: the sample std over seeds and the paired difference of two rows.

Two rows' runs with the same seed share the split, the model init and the client sampling, so a method's
difference to another row is taken seed by seed; its 95% interval is Student's t over those paired differences
(``scipy.stats.t``, n - 1 degrees of freedom), and the difference reads "tie" when that interval covers 0.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
INTERVAL_NAME = "paired 95% t-interval over seeds"
NOT_AVAILABLE = "not available until rebuilt"  # a table from before per-seed values were kept


def sample_std(values) -> float:
    """The sample std (ddof = 1) of the finite values; nan with fewer than two."""
    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], dtype=float)
    return float(v.std(ddof=1)) if len(v) > 1 else float("nan")


def sample_from_population(std: float, n: int) -> float:
    """A population std (ddof = 0) over n values as the sample std of the same values: std * sqrt(n / (n - 1))."""
    return float(std) * math.sqrt(n / (n - 1)) if n > 1 else float("nan")


def paired_difference(ours: dict[int, float], theirs: dict[int, float]) -> dict:
    """``ours`` minus ``theirs`` over the seeds both have: mean, its 95% t-interval (lo, hi), n and whether it is
    a tie (the interval covers 0). With fewer than two common seeds the interval is nan and nothing is a tie."""
    seeds = sorted(set(ours) & set(theirs))
    d = np.array([ours[s] - theirs[s] for s in seeds], dtype=float)
    d = d[~np.isnan(d)]
    n = len(d)
    if n == 0:
        return {"n": 0, "mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "tie": False}
    mean = float(d.mean())
    if n < 2:
        return {"n": 1, "mean": mean, "lo": float("nan"), "hi": float("nan"), "tie": False}
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * d.std(ddof=1) / math.sqrt(n))
    lo, hi = mean - half, mean + half
    return {"n": n, "mean": mean, "lo": lo, "hi": hi, "tie": bool(lo <= 0 <= hi)}


def difference_cell(diff: dict | None, scale: float = 100.0) -> str:
    """"+1.23 [+0.40, +2.06]" (points), with "tie" where the interval covers 0; "-" or the reason otherwise."""
    if diff is None or diff.get("n") is None or (isinstance(diff.get("n"), float) and math.isnan(diff["n"])):
        return NOT_AVAILABLE
    if int(diff["n"]) == 0 or math.isnan(diff["mean"]):
        return "-"
    mean = f"{scale * diff['mean']:+.2f}"
    if int(diff["n"]) < 2 or math.isnan(diff["lo"]):
        return f"{mean} (1 seed: no interval)"
    cell = f"{mean} [{scale * diff['lo']:+.2f}, {scale * diff['hi']:+.2f}]"
    return f"{cell} tie" if diff["tie"] else cell
