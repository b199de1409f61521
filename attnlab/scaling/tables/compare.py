"""Comparisons of the arms of a sweep at matched points, with intervals over seeds.

A fixed-length A/B question (does a WSD cooldown reach a cosine schedule's loss? does an option
help at every size?) needs no law: at each point (by default the same parameter count and
tokens) the arms' mean losses over seeds are compared. With the few seeds a sweep affords (2-5),
a percentile bootstrap of a mean undercovers badly, so the intervals are Student t intervals:

- unpaired: Welch's interval for a difference of means with unequal variances (Welch 1947;
  ``scipy.stats.ttest_ind(equal_var=False)``);
- paired (``pair``, e.g. ``train.seed``): when both arms ran the same seeds, each seed's
  difference shares its initialisation and data order (common random numbers), and the interval
  is the one-sample t interval of the per-seed differences (``scipy.stats.ttest_1samp``).

The pooled row averages the per-point differences: its variance is the sum of the points'
variance terms over P^2, its degrees of freedom the Welch-Satterthwaite sum.

Several arms against one baseline are several claims: the pooled rows (one an arm) are one
family, and each carries its two-sided t test's p-value, the p-value adjusted by Holm's step-down
(Holm 1979: the chance that any arm is called different when none is stays at most 1 - level),
and a Bonferroni interval (``lo_family``, ``hi_family``, at level 1 - (1 - level)/m for m arms)
whose m intervals hold every true difference together with probability at least ``level``.
The per-point rows are not corrected.

Each arm at its own optimum (``best_over``, e.g. the learning rate): the runs compared are
those :mod:`attnlab.scaling.tables.picks` keeps. With ``pair``, :func:`heldout_differences`
scores each seed at the value its arm's other seeds pick, which no winner's curse biases.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from attnlab.scaling.errors import FitInputError
from attnlab.scaling.tables.picks import check_columns, finished, heldout_picks

DEFAULT_MATCH = ("params", "tokens")
POOLED = "all"


def _cells(df: pd.DataFrame, by: str, match: tuple[str, ...], metric: str,
           pair: str | None) -> dict:
    """{(point, arm): ``metric`` over the cell's finished runs, a float64 Series indexed by the
    ``pair`` column's values (or by position)}."""
    check_columns(df, (by, *match, metric, *([pair] if pair else [])))
    done = df[finished(df, metric)]
    cells = {}
    for (arm, *point), group in done.groupby([by, *match], dropna=False):
        values = group.set_index(pair)[metric] if pair else group[metric].reset_index(drop=True)
        if pair and values.index.duplicated().any():
            raise FitInputError(f"--pair={pair}: two finished runs of {by}={arm} at "
                                f"{dict(zip(match, point))} share a {pair} value; pair by a "
                                f"column that tells them apart")
        cells[tuple(point), str(arm)] = values.astype(np.float64)
    return cells


def heldout_differences(df: pd.DataFrame, *, by: str, baseline: str, match: tuple[str, ...],
                        metric: str, over: str, pair: str,
                        level: float) -> tuple[pd.DataFrame, list[str]]:
    """:func:`paired_differences` of :func:`heldout_picks`' rows (an empty frame when no point
    has two seeds of both arms), and the notes. A seed's held-out pick is chosen by the other
    seeds, so the per-seed differences are not independent and their t interval alone would be
    too narrow (by ~1.2x in sd with 3 seeds and 4 rates): each point's variance is scaled by
    :func:`heldout_inflation` for its shape."""
    rows, notes = heldout_picks(df, by=by, match=match, metric=metric, over=over, pair=pair)
    if rows.empty:
        return pd.DataFrame(), notes + [f"no point has two {pair} values: nothing to hold out"]
    rows = rows.assign(status="completed", **{by: rows[by].astype(str)})
    grids = rows.groupby([by, *match], dropna=False)["values"].first()
    base = arm_named(baseline, sorted(rows[by].unique()))
    rng, factors = np.random.default_rng(0), {}

    def factor(point, arm, seeds):
        shape = (seeds, grids.get((arm, *point), 1), grids.get((base, *point), 1))
        if shape not in factors:
            factors[shape] = heldout_inflation(*shape, rng=rng)
        return factors[shape]

    try:
        frame = paired_differences(rows, by=by, baseline=baseline, match=match, metric=metric,
                                   level=level, pair=pair, var_factor=factor)
    except FitInputError:
        return pd.DataFrame(), notes + [f"no point has two {pair} values of {baseline!r} and "
                                        f"another arm: nothing to hold out"]
    return frame, notes


def heldout_inflation(seeds: int, arm_values: int, base_values: int, *,
                      rng: np.random.Generator, draws: int = 4000) -> float:
    """sd of a point's mean held-out difference over the sd its per-seed t interval assumes, by
    simulation where every value has the same expected loss and the seeds' noise is independent
    (the picks are then noise, and the held-out differences most dependent; a pick the seeds
    single out needs less, so the scaled intervals err wide). 1 with fewer than two seeds."""
    if seeds < 2:
        return 1.0

    def scored(values):
        runs = rng.standard_normal((draws, seeds, values))
        others = (runs.sum(axis=1, keepdims=True) - runs) / (seeds - 1)
        return np.take_along_axis(runs, others.argmin(axis=2)[..., None], axis=2)[..., 0]

    d = scored(arm_values) - scored(base_values)  # (draws, seeds)
    return float(d.mean(axis=1).std() / np.sqrt(np.mean(d.var(axis=1, ddof=1) / seeds)))


def format_heldout(held: tuple[pd.DataFrame, list[str]], **how) -> str:
    """:func:`heldout_differences`' table as text, after a line saying what it is."""
    frame, notes = held
    text = ("each seed scored at the value its arm's other seeds pick (leave one seed out): "
            "the seed scored never chose it, so no winner's curse, and the picks' noise is in "
            "the interval\n")
    if len(frame):
        text += format_differences(frame, **how)
    return text + "".join(f"note: {note}\n" for note in notes)


def paired_differences(df: pd.DataFrame, *, by: str, baseline: str,
                       match: tuple[str, ...] = DEFAULT_MATCH, metric: str = "final_val_loss",
                       level: float = 0.95, pair: str | None = None,
                       var_factor=None) -> pd.DataFrame:
    """One row per matched point and arm other than ``baseline`` (then one pooled row per arm):
    the match columns, ``arm``, runs compared per arm (``n_base``, ``n_arm``; with ``pair``, the
    pairs), mean metric of each, ``diff`` = arm - baseline (< 0: the arm is lower), ``rel`` =
    diff / baseline mean, and the interval ``lo``, ``hi`` (NaN with fewer than two runs or
    pairs: no seed noise to estimate). var_factor(point, arm, runs): a factor on each point's
    interval sd, where the runs compared are not independent (:func:`heldout_differences`)."""
    cells = _cells(df, by, match, metric, pair)
    arms = sorted({arm for _, arm in cells})
    baseline = arm_named(baseline, arms)
    if baseline not in arms:
        raise FitInputError(f"--baseline: {baseline!r} is not a value of column {by!r} among "
                            f"the finished runs (values: {', '.join(arms) or 'none'})")
    rows = []
    for arm in (a for a in arms if a != baseline):
        terms = []
        for point in (p for p, a in cells if a == arm and (p, baseline) in cells):
            base, other = cells[point, baseline], cells[point, arm]
            if pair:
                shared = base.index.intersection(other.index)
                base, other = base[shared], other[shared]
            if len(base) == 0:
                continue
            term = _term(base.to_numpy(), other.to_numpy(), paired=bool(pair))
            if var_factor is not None:
                term["var"] *= var_factor(point, arm, len(base)) ** 2
            terms.append(term)
            rows.append({**dict(zip(match, point)), **_row(arm, term, level)})
        if terms:
            rows.append({**{c: POOLED for c in match}, **_row(arm, _pooled(terms), level)})
    if not rows:
        raise FitInputError(f"no point ({', '.join(match)}) has finished runs of both "
                            f"{baseline!r} and another value of {by!r}"
                            + (f" with a shared {pair}" if pair else ""))
    return _family(pd.DataFrame(rows), match, level)


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values: the i-th smallest of m is max over j <= i of
    (m - j + 1) p_(j), capped at 1 (NaNs stay NaN and do not count)."""
    p = np.asarray(p_values, np.float64)
    adjusted = np.full(p.shape, np.nan)
    known = np.flatnonzero(np.isfinite(p))
    order = known[np.argsort(p[known])]
    steps = (len(order) - np.arange(len(order))) * p[order]
    adjusted[order] = np.minimum(np.maximum.accumulate(steps), 1.0)
    return adjusted


def _family(frame: pd.DataFrame, match: tuple[str, ...], level: float) -> pd.DataFrame:
    """The frame with the pooled rows' p-values, Holm-adjusted p-values and Bonferroni
    intervals (module docstring; NaN on the per-point rows)."""
    pooled = (frame[match[0]] == POOLED).to_numpy()
    arms = int(pooled.sum())
    t = frame["diff"] / frame["sd"]
    frame["p"] = np.where(pooled, 2 * stats.t.sf(np.abs(t), frame["dof"]), np.nan)
    frame["p_holm"] = np.nan
    frame.loc[pooled, "p_holm"] = holm(frame.loc[pooled, "p"])
    half = stats.t.ppf(1 - (1 - level) / (2 * max(arms, 1)), frame["dof"]) * frame["sd"]
    frame["lo_family"] = np.where(pooled, frame["diff"] - half, np.nan)
    frame["hi_family"] = np.where(pooled, frame["diff"] + half, np.nan)
    return frame.drop(columns=["sd", "dof"])


def arm_named(name: str, arms: list[str]) -> str:
    """The arm ``name`` means: itself, or on a numeric column the arm of equal value (so that
    --baseline=1 names lr_factor 1.0)."""
    value = _number(name)
    if name in arms or value is None:
        return name
    same = [arm for arm in arms if _number(arm) == value]
    return same[0] if len(same) == 1 else name


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _term(base: np.ndarray, other: np.ndarray, *, paired: bool) -> dict:
    """One point's difference of means with its variance and degrees of freedom (NaN when a
    side has a single run)."""
    diff = other.mean() - base.mean()
    nan = {"var": np.nan, "dof": np.nan}
    if paired:
        d = other - base
        spread = {"var": d.var(ddof=1) / len(d), "dof": len(d) - 1} if len(d) > 1 else nan
    elif len(base) > 1 and len(other) > 1:
        spread = {"var": other.var(ddof=1) / len(other) + base.var(ddof=1) / len(base),
                  "dof": stats.ttest_ind(other, base, equal_var=False).df}
    else:
        spread = nan
    return {"n_base": len(base), "n_arm": len(other), "base": base.mean(),
            "arm_mean": other.mean(), "diff": diff, **spread}


def _pooled(terms: list[dict]) -> dict:
    """The mean of P points' differences: var = sum(var_p) / P^2, and Welch-Satterthwaite
    degrees of freedom sum(v)^2 / sum(v^2 / dof) over the points' variance terms."""
    n_points = len(terms)
    var = np.array([t["var"] for t in terms]) / n_points**2
    dof = np.array([t["dof"] for t in terms], dtype=np.float64)
    return {"n_base": sum(t["n_base"] for t in terms), "n_arm": sum(t["n_arm"] for t in terms),
            "base": np.mean([t["base"] for t in terms]),
            "arm_mean": np.mean([t["arm_mean"] for t in terms]),
            "diff": np.mean([t["diff"] for t in terms]),
            "var": var.sum(), "dof": var.sum() ** 2 / np.sum(var**2 / dof)}


def _row(arm: str, term: dict, level: float) -> dict:
    half = stats.t.ppf(0.5 + level / 2, term["dof"]) * np.sqrt(term["var"])
    return {"arm": arm, "n_base": term["n_base"], "n_arm": term["n_arm"],
            "base": float(term["base"]), "arm_mean": float(term["arm_mean"]),
            "diff": float(term["diff"]), "rel": float(term["diff"] / term["base"]),
            "lo": float(term["diff"] - half), "hi": float(term["diff"] + half),
            "sd": float(np.sqrt(term["var"])), "dof": float(term["dof"])}


def format_differences(frame: pd.DataFrame, *, by: str, baseline: str, metric: str,
                       match: tuple[str, ...], level: float, pair: str | None = None) -> str:
    """The table as text, with a line saying how to read it."""
    shown = frame.rename(columns={"base": baseline, "arm_mean": "arm mean"})
    text = shown.to_string(index=False, float_format=lambda v: f"{v:.4g}")
    how = f"paired by {pair}, t interval" if pair else "Welch interval"
    unknown = int(frame[["lo", "hi"]].isna().any(axis=1).sum()) if len(frame) else 0
    why = (f"note: {unknown} of {len(frame)} intervals are NaN: a point with "
           + (f"one {pair} value per arm has no pairs to spread" if pair
              else "one run on a side has no spread to estimate")
           + "; train more seeds there\n") if unknown else ""
    arms = int((frame[match[0]] == POOLED).sum()) if len(frame) else 0
    family = (f"note: the {arms} '{POOLED}' rows are one family of claims: p_holm is Holm's "
              f"adjusted p-value, [lo_family, hi_family] Bonferroni intervals that hold all "
              f"{arms} differences together at {level:.0%}; per-point rows are uncorrected\n"
              if arms > 1 else "")
    return (f"{metric}: each {by} value minus {baseline!r} at the same {', '.join(match)}, mean "
            f"over seeds, {level:.0%} {how} [lo, hi] (< 0: lower than {baseline!r}; "
            f"'{POOLED}': the mean over the points)\n{text}\n{why}{family}")
