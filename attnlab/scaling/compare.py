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

Each arm at its own optimum (``best_over``, e.g. the learning rate): per arm and point, the runs
at the value whose mean over seeds is lowest are the ones compared. A value with a run that did
not finish (diverged, failed) cannot be picked. The pick and the comparison read the same runs,
so each arm's mean is a minimum over its grid: optimistic, by a similar amount for arms with the
same grid and spread. A fit picks the same way at each (N, D) point (``best_points``, ``attnlab
fit --best-over``), and its bootstrap treats the picks as given. How firmly the seeds single
out each pick is its ``stability``: the share of resamples of the seeds (within each value;
with ``pair``, a seed with its runs at every value) that pick the same value. 1: every resample
agrees; near 1/values: the seeds cannot tell the values apart, and the fit's intervals, which
hold the pick fixed, are too narrow there.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from attnlab.scaling.errors import FitInputError
from attnlab.scaling.laws import Law
from attnlab.scaling.table import point_columns, read_table

DEFAULT_MATCH = ("params", "tokens")
POOLED = "all"
# A pick kept by at least this share of seed resamples is firm enough to hold fixed.
FIRM_PICK = 0.9


def _check_columns(df: pd.DataFrame, columns) -> None:
    for column in columns:
        if column not in df.columns:
            raise FitInputError(f"column {column!r} is not in the results table (columns: "
                                f"{', '.join(map(str, df.columns))})")


def _finished(df: pd.DataFrame, metric: str) -> pd.Series:
    """True for the runs that completed with a finite ``metric`` (all, without a status)."""
    finished = np.isfinite(pd.to_numeric(df[metric], errors="coerce"))
    return finished & (df["status"] == "completed") if "status" in df.columns else finished


def _scored(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """``df`` with ``_score``: ``metric``, or inf for a run that did not finish, so a value with
    one never has the lowest mean."""
    return df.assign(_score=pd.to_numeric(df[metric], errors="coerce")
                     .where(_finished(df, metric), np.inf))


def _cells(df: pd.DataFrame, by: str, match: tuple[str, ...], metric: str,
           pair: str | None) -> dict:
    """{(point, arm): ``metric`` over the cell's finished runs, a float64 Series indexed by the
    ``pair`` column's values (or by position)}."""
    _check_columns(df, (by, *match, metric, *([pair] if pair else [])))
    done = df[_finished(df, metric)]
    cells = {}
    for (arm, *point), group in done.groupby([by, *match], dropna=False):
        values = group.set_index(pair)[metric] if pair else group[metric].reset_index(drop=True)
        if pair and values.index.duplicated().any():
            raise FitInputError(f"--pair={pair}: two finished runs of {by}={arm} at "
                                f"{dict(zip(match, point))} share a {pair} value; pair by a "
                                f"column that tells them apart")
        cells[tuple(point), str(arm)] = values.astype(np.float64)
    return cells


def at_best(df: pd.DataFrame, *, by: str, match: tuple[str, ...], metric: str,
            over: str, pair: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the runs at each (arm, point)'s best value of ``over``, one row per pick: the arm, the
    point, ``over``'s picked value, its mean metric, the runs behind it, the values tried,
    ``edge``: "lowest"/"highest" when the pick is the grid's end, "" inside, and
    ``stability`` (:func:`pick_stability`; with ``pair``, e.g. train.seed, a seed is resampled
    with its runs at every value, since they share its initialisation and data order))."""
    _check_columns(df, (by, *match, metric, over, *([pair] if pair else [])))
    if over in (by, *match):
        raise FitInputError(f"--best-over={over}: it is also --by or --match; pick over a "
                            f"column the compared runs differ in")
    missing = int(df[over].isna().sum())
    if missing:  # a groupby would drop them without a word
        raise FitInputError(f"--best-over={over}: {missing} of {len(df)} runs have no value "
                            f"of {over}")
    scored = _scored(df, metric)
    rng = np.random.default_rng(0)  # the stability column is the same on every call
    kept, picks = [], []
    for (arm, *point), cell in scored.groupby([by, *match], dropna=False):
        means = cell.groupby(over)["_score"].mean().sort_index()
        if not np.isfinite(means.min()):
            continue  # no value whose every run finished: nothing to pick
        best = means.idxmin()
        edge = ("lowest" if best == means.index[0] else
                "highest" if best == means.index[-1] else "") if len(means) > 1 else ""
        kept.append(cell[cell[over] == best].drop(columns="_score"))
        scores = _scores_by_value(cell, over, pair)
        picks.append({by: str(arm), **dict(zip(match, point)), over: best,
                      metric: float(means[best]), "runs": int((cell[over] == best).sum()),
                      "tried": len(means), "edge": edge,
                      "stability": pick_stability(scores, int(np.argmin(means.to_numpy())),
                                                  rng)})
    if not picks:
        raise FitInputError(f"--best-over={over}: no point has a value of {over} whose runs "
                            f"all finished")
    return pd.concat(kept), pd.DataFrame(picks)


def heldout_picks(df: pd.DataFrame, *, by: str, match: tuple[str, ...], metric: str, over: str,
                  pair: str) -> tuple[pd.DataFrame, list[str]]:
    """(one row per arm, point and ``pair`` value: that seed's ``metric`` at the value of
    ``over`` its arm's other seeds pick at the point, leaving it out; notes). The seed scored
    did not choose the value, so a difference of these rows has no winner's curse, and the
    picks' own noise (they move with the seeds left in) is inside its interval. A point with one
    seed has nothing to leave out and no rows; a seed whose run at its held-out pick did not
    finish leaves its point out, named in a note."""
    _check_columns(df, (by, *match, metric, over, pair))
    scored = _scored(df, metric)
    rows, notes = [], []
    for (arm, *point), cell in scored.groupby([by, *match], dropna=False):
        grid = cell.pivot_table(index=pair, columns=over, values="_score", aggfunc="first")
        grid = grid.fillna(np.inf).sort_index(axis=1)  # a value a seed lacks is never picked
        if len(grid) < 2:
            continue
        held = []
        for seed in grid.index:
            means = grid.drop(index=seed).mean(axis=0)
            pick = means.idxmin() if np.isfinite(means.min()) else None
            score = grid.loc[seed, pick] if pick is not None else np.inf
            held.append({by: arm, **dict(zip(match, point)), pair: seed, over: pick,
                         metric: score, "values": grid.shape[1]})
        if all(np.isfinite(r[metric]) for r in held):
            rows.extend(held)
        else:
            notes.append(f"{by}={arm} at {dict(zip(match, point))}: a seed's run at the value "
                         f"the other seeds pick did not finish; the point is left out")
    return pd.DataFrame(rows), notes


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


def _scores_by_value(cell: pd.DataFrame, over: str, pair: str | None):
    """Each value's scores, sorted by value: a list of arrays, or with ``pair`` a (pairs,
    values) matrix when every value ran every pair value (else the list: nothing to pair)."""
    if pair and pair in cell.columns:
        table = cell.pivot_table(index=pair, columns=over, values="_score", aggfunc="first")
        if table.notna().all().all() and len(table) == len(cell) / table.shape[1]:
            return table.sort_index(axis=1).to_numpy()
    return [g["_score"].to_numpy() for _, g in cell.groupby(over, sort=True)]


def pick_stability(scores, best: int, rng: np.random.Generator,
                   n_resamples: int = 1000) -> float:
    """The share of resamples of the runs whose lowest mean is still value ``best``: how firmly
    the seeds single out the pick. ``scores``: a list of each value's runs, resampled with
    replacement within the value; or a (pairs, values) matrix whose rows (a seed's runs at
    every value) are resampled whole. NaN when there is one run per value (no seed spread)."""
    if isinstance(scores, np.ndarray):
        if len(scores) < 2:
            return float("nan")
        rows = rng.integers(0, len(scores), (n_resamples, len(scores)))
        means = scores[rows].mean(axis=1).T  # (values, resamples); inf stays inf
    else:
        if all(len(s) < 2 for s in scores):
            return float("nan")
        means = np.stack([s[rng.integers(0, len(s), (n_resamples, len(s)))].mean(axis=1)
                          if np.isfinite(s).all() else np.full(n_resamples, np.inf)
                          for s in scores])
    return float(np.mean(np.argmin(means, axis=0) == best))


def best_points(df: pd.DataFrame, *, over: str, law: Law, by: str | None = None,
                columns: dict[str, str] | None = None, source: str = "results",
                pair: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """For a fit: at each (N, D) point (of each ``by`` group), the runs at ``over``'s best
    value, as :func:`at_best` picks them (``pair``: for their stability), and the picks."""
    used = point_columns(df, law, columns or {}, source)
    arm = by or "_fit"
    frame = df if by else df.assign(_fit="all")
    kept, picks = at_best(frame, by=arm, match=(used["params"], used["tokens"]),
                          metric=used["loss"], over=over, pair=pair)
    if not by:
        kept, picks = kept.drop(columns=arm), picks.drop(columns=arm)
    return kept, picks


def read_at_best(source, *, over: str | None, law: Law, by: str | None = None,
                 columns: dict[str, str] | None = None,
                 pair: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(the results table at ``source``, None) without ``over``; with it, (its runs at each
    point's best value of ``over``, the picks), as :func:`best_points` picks them."""
    raw = read_table(source)
    if not over:
        return raw, None
    return best_points(raw, over=over, law=law, by=by, columns=columns, source=str(source),
                       pair=pair)


def format_picks(picks: pd.DataFrame, *, over: str, metric: str, what: str = "each arm",
                 fixed: bool = True) -> str:
    """The picks as text, with a note per pick at its grid's end and, when the intervals hold
    the picks ``fixed``, a note on the picks the seeds do not single out."""
    text = picks.to_string(index=False, float_format=lambda v: f"{v:.4g}")
    lines = [f"{what} at its best {over} (lowest mean {metric} over seeds; a value with an "
             f"unfinished run is not picked; stability: the share of 1000 resamples of the "
             f"seeds that pick the same value, NaN with one seed per value):", text]
    ends = picks[picks["edge"] != ""]
    if len(ends):
        lines.append(f"note: {len(ends)} of {len(picks)} picks are the {over} grid's lowest or "
                     f"highest value: the optimum may lie outside it; widen the grid there")
    soft = int((picks["stability"] < FIRM_PICK).sum())
    unknown = int(picks["stability"].isna().sum())
    if fixed and (soft or unknown):
        lines.append(f"note: the intervals below hold the picks fixed, too narrow where the seeds "
                     f"do not single a pick out: {soft} of {len(picks)} picks have stability "
                     f"under {FIRM_PICK}" + (f", and {unknown} cannot say (one seed per value)"
                                             if unknown else ""))
    return "\n".join(lines) + "\n\n"


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
    return pd.DataFrame(rows)


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
            "lo": float(term["diff"] - half), "hi": float(term["diff"] + half)}


def format_differences(frame: pd.DataFrame, *, by: str, baseline: str, metric: str,
                       match: tuple[str, ...], level: float, pair: str | None = None) -> str:
    """The table as text, with a line saying how to read it."""
    shown = frame.rename(columns={"base": baseline, "arm_mean": "arm mean"})
    text = shown.to_string(index=False, float_format=lambda v: f"{v:.4g}")
    how = f"paired by {pair}, t interval" if pair else "Welch interval"
    return (f"{metric}: each {by} value minus {baseline!r} at the same {', '.join(match)}, mean "
            f"over seeds, {level:.0%} {how} [lo, hi] (< 0: lower than {baseline!r}; "
            f"'{POOLED}': the mean over the points)\n{text}\n")
