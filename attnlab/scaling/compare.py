"""Paired comparisons of the arms of a sweep at matched points, with intervals over seeds.

A fixed-length A/B question (does a WSD cooldown reach a cosine schedule's loss? does an option
help at every size?) needs no law: at each point (by default the same parameter count and
tokens) the arms' mean losses over seeds are compared. With the few seeds a sweep affords (2-5),
a percentile bootstrap of a mean undercovers badly, so the interval is Welch's t interval for a
difference of means with unequal variances (Welch 1947; ``scipy.stats.ttest_ind``). The pooled
row averages the per-point differences: its variance is the mean of the points' variances over
the number of points, its degrees of freedom the Welch-Satterthwaite sum.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from attnlab.scaling.errors import FitInputError

DEFAULT_MATCH = ("params", "tokens")
POOLED = "all"


def _cells(df: pd.DataFrame, by: str, match: tuple[str, ...], metric: str) -> dict:
    """{(point, arm): float64 values of ``metric`` over the cell's finished runs}."""
    for column in (by, *match, metric):
        if column not in df.columns:
            raise FitInputError(f"column {column!r} is not in the results table (columns: "
                                f"{', '.join(map(str, df.columns))})")
    done = df[df["status"] == "completed"] if "status" in df.columns else df
    done = done[np.isfinite(pd.to_numeric(done[metric], errors="coerce"))]
    return {(tuple(point), str(arm)): group[metric].to_numpy(np.float64)
            for (arm, *point), group in done.groupby([by, *match], dropna=False)}


def paired_differences(df: pd.DataFrame, *, by: str, baseline: str,
                       match: tuple[str, ...] = DEFAULT_MATCH, metric: str = "final_val_loss",
                       level: float = 0.95) -> pd.DataFrame:
    """One row per matched point and arm other than ``baseline`` (then one pooled row per arm):
    the match columns, ``arm``, runs per arm (``n_base``, ``n_arm``), mean metric of each,
    ``diff`` = arm - baseline (< 0: the arm is lower), ``rel`` = diff / baseline mean, and the
    interval ``lo``, ``hi`` (NaN where a cell has a single run: no seed noise to estimate)."""
    cells = _cells(df, by, match, metric)
    arms = sorted({arm for _, arm in cells})
    if baseline not in arms:
        raise FitInputError(f"--baseline: {baseline!r} is not a value of column {by!r} among "
                            f"the finished runs (values: {', '.join(arms) or 'none'})")
    rows = []
    for arm in (a for a in arms if a != baseline):
        points = [p for p, a in cells if a == arm and (p, baseline) in cells]
        for point in points:
            rows.append({**dict(zip(match, point)),
                         **_welch(cells[point, baseline], [cells[point, arm]], arm, level)})
        if points:
            rows.append({**{c: POOLED for c in match},
                         **_welch_pooled([cells[p, baseline] for p in points],
                                         [cells[p, arm] for p in points], arm, level)})
    if not rows:
        raise FitInputError(f"no point ({', '.join(match)}) has finished runs of both "
                            f"{baseline!r} and another value of {by!r}")
    return pd.DataFrame(rows)


def _welch(base: np.ndarray, arm: list[np.ndarray], name: str, level: float) -> dict:
    """One point: mean(arm) - mean(base) and Welch's interval (NaN with a single run)."""
    other = arm[0]
    lo = hi = np.nan
    if len(base) > 1 and len(other) > 1:
        test = stats.ttest_ind(other, base, equal_var=False)
        lo, hi = test.confidence_interval(confidence_level=level)
    return _row(name, len(base), len(other), base.mean(), other.mean(), lo, hi)


def _welch_pooled(base: list[np.ndarray], arm: list[np.ndarray], name: str,
                  level: float) -> dict:
    """The mean over P points of the per-point differences, with var = sum(var_p) / P^2 and
    Welch-Satterthwaite degrees of freedom over every cell's variance term."""
    n_points = len(base)
    base_mean = float(np.mean([b.mean() for b in base]))
    arm_mean = float(np.mean([a.mean() for a in arm]))
    lo = hi = np.nan
    if all(len(c) > 1 for c in (*base, *arm)):
        terms = np.array([c.var(ddof=1) / len(c) for c in (*base, *arm)]) / n_points**2
        dof = terms.sum()**2 / np.sum(terms**2 / np.array([len(c) - 1 for c in (*base, *arm)]))
        half = stats.t.ppf(0.5 + level / 2, dof) * np.sqrt(terms.sum())
        lo, hi = arm_mean - base_mean - half, arm_mean - base_mean + half
    return _row(name, sum(map(len, base)), sum(map(len, arm)), base_mean, arm_mean, lo, hi)


def _row(arm: str, n_base: int, n_arm: int, base_mean: float, arm_mean: float, lo: float,
         hi: float) -> dict:
    return {"arm": arm, "n_base": n_base, "n_arm": n_arm, "base": float(base_mean),
            "arm_mean": float(arm_mean), "diff": float(arm_mean - base_mean),
            "rel": float((arm_mean - base_mean) / base_mean), "lo": float(lo), "hi": float(hi)}


def format_differences(frame: pd.DataFrame, *, by: str, baseline: str, metric: str,
                       match: tuple[str, ...], level: float) -> str:
    """The table as text, with a line saying how to read it."""
    shown = frame.rename(columns={"base": baseline, "arm_mean": "arm mean"})
    text = shown.to_string(index=False, float_format=lambda v: f"{v:.4g}")
    return (f"{metric}: each {by} value minus {baseline!r} at the same {', '.join(match)}, mean "
            f"over seeds, {level:.0%} Welch interval [lo, hi] (< 0: lower than {baseline!r}; "
            f"'{POOLED}': the mean over the points)\n{text}\n")
