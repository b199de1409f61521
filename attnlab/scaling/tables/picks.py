"""Each arm at its own optimum: the runs at each point's best value of a column (``best_over``).

Per arm and point, the runs at the value whose mean over seeds is lowest are kept (``attnlab
compare --best-over``, ``attnlab fit --best-over``). ``best_over`` names one column (e.g.
train.learning_rate) or several joined by commas (e.g. model.d_model,train.learning_rate): then
each combination of their values that ran is one candidate, as a grid over sizes and rates at a
fixed budget asks; name them outer first (params,train.learning_rate when each size tried its own
rates), as the grid's ends are read in that order. A value with a run that did not finish
(diverged, failed) cannot be picked. The pick and what it is scored by read the same runs, so each
arm's mean is a minimum over its grid: optimistic, by a similar amount for arms with the same grid
and spread (:func:`heldout_picks` scores each seed at the other seeds' pick instead). How firmly
the seeds single out each pick is its ``stability``: the share of resamples of the seeds (within
each value; with ``pair``, a seed with its runs at every value) that pick the same value. 1: every
resample agrees; near 1/values: the seeds cannot tell the values apart, and a fit's intervals that
hold the pick fixed are too narrow there.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnlab.scaling.columns import completed
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.law import Law
from attnlab.scaling.tables.prepare import point_columns
from attnlab.scaling.tables.read import read_table

# A pick kept by at least this share of seed resamples is firm enough to hold fixed.
FIRM_PICK = 0.9
# The column naming a run's candidate when best_over names several columns.
CANDIDATE = "_candidate"


def check_columns(df: pd.DataFrame, columns) -> None:
    for column in columns:
        if column not in df.columns:
            shown = [str(c) for c in df.columns if not str(c).startswith("_")]  # not ours
            raise FitInputError(f"column {column!r} is not in the results table (columns: "
                                f"{', '.join(shown)})")


def finished(df: pd.DataFrame, metric: str) -> pd.Series:
    """True for the runs that completed with a finite ``metric`` (all, without a status)."""
    return np.isfinite(pd.to_numeric(df[metric], errors="coerce")) & completed(df)


def _scored(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """``df`` with ``_score``: ``metric``, or inf for a run that did not finish, so a value with
    one never has the lowest mean."""
    return df.assign(_score=pd.to_numeric(df[metric], errors="coerce")
                     .where(finished(df, metric), np.inf))


def over_columns(over: str) -> tuple[str, ...]:
    """The columns ``best_over`` names: one, or several joined by commas."""
    return tuple(column.strip() for column in over.split(",") if column.strip())


def _candidates(df: pd.DataFrame, over: str,
                fixed: tuple[str, ...]) -> tuple[pd.DataFrame, str, tuple[str, ...]]:
    """(``df`` with a column naming each run's candidate, that column, ``over``'s columns): the
    one column itself, or for several an integer per combination of their values (ordered as
    the combinations sort). ``fixed``: the columns the runs are grouped by, which no pick may
    vary."""
    columns = over_columns(over)
    if not columns:
        raise FitInputError(f"--best-over={over!r}: name a column")
    check_columns(df, columns)
    for column in columns:
        if column in fixed:
            raise FitInputError(f"--best-over={over}: {column} is also --by or --match; pick "
                                f"over a column the compared runs differ in")
        missing = int(df[column].isna().sum())
        if missing:  # a groupby would drop them without a word
            raise FitInputError(f"--best-over={over}: {missing} of {len(df)} runs have no "
                                f"value of {column}")
    if len(columns) == 1:
        return df, columns[0], columns
    return (df.assign(**{CANDIDATE: df.groupby(list(columns), sort=True).ngroup()}), CANDIDATE,
            columns)


def _values(cell: pd.DataFrame, key: str, columns: tuple[str, ...], pick) -> dict:
    """{column: its value at candidate ``pick``} (None for no pick)."""
    if pick is None:
        return dict.fromkeys(columns)
    if key == columns[0]:
        return {key: pick}
    runs = cell[cell[key] == pick]
    return {column: runs[column].iloc[0] for column in columns}  # each keeps its own dtype


def _edge(cell: pd.DataFrame, picked: dict) -> str:
    """Where the pick is its grid's end: "lowest" or "highest" when no candidate went further
    that way ("" inside). Several columns are read outer first, each among the candidates that
    share the pick's values of the columns before it (a size over all sizes, then a rate among
    the rates its size tried), and each end is named by its column."""
    ends, line = [], cell
    for column, value in picked.items():
        tried = np.sort(line[column].unique())
        name = f" {column}" if len(picked) > 1 else ""
        if len(tried) > 1 and value in (tried[0], tried[-1]):
            ends.append(("lowest" if value == tried[0] else "highest") + name)
        line = line[line[column] == value]
    return ", ".join(ends)


def at_best(df: pd.DataFrame, *, by: str, match: tuple[str, ...], metric: str,
            over: str, pair: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the runs at each (arm, point)'s best value of ``over``, one row per pick: the arm, the
    point, ``over``'s picked value (each of its columns), its mean metric, the runs behind it,
    the values tried, ``edge`` (:func:`_edge`), and ``stability`` (:func:`pick_stability`; with
    ``pair``, e.g. train.seed, a seed is resampled with its runs at every value, since they
    share its initialisation and data order))."""
    check_columns(df, (by, *match, metric, *([pair] if pair else [])))
    scored, key, columns = _candidates(_scored(df, metric), over, (by, *match))
    rng = np.random.default_rng(0)  # the stability column is the same on every call
    kept, picks = [], []
    for (arm, *point), cell in scored.groupby([by, *match], dropna=False):
        means = cell.groupby(key)["_score"].mean().sort_index()
        if not np.isfinite(means.min()):
            continue  # no value whose every run finished: nothing to pick
        best = means.idxmin()
        chosen = cell[cell[key] == best]
        kept.append(chosen.drop(columns=["_score", CANDIDATE], errors="ignore"))
        picked = _values(cell, key, columns, best)
        picks.append({by: str(arm), **dict(zip(match, point)), **picked,
                      metric: float(means[best]), "runs": len(chosen), "tried": len(means),
                      "edge": _edge(cell, picked),
                      "stability": pick_stability(_scores_by_value(cell, key, pair),
                                                  int(np.argmin(means.to_numpy())), rng)})
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
    check_columns(df, (by, *match, metric, pair))
    scored, key, columns = _candidates(_scored(df, metric), over, (by, *match, pair))
    rows, notes = [], []
    for (arm, *point), cell in scored.groupby([by, *match], dropna=False):
        grid = cell.pivot_table(index=pair, columns=key, values="_score", aggfunc="first")
        grid = grid.fillna(np.inf).sort_index(axis=1)  # a value a seed lacks is never picked
        if len(grid) < 2:
            continue
        held = []
        for seed in grid.index:
            means = grid.drop(index=seed).mean(axis=0)
            pick = means.idxmin() if np.isfinite(means.min()) else None
            score = grid.loc[seed, pick] if pick is not None else np.inf
            held.append({by: arm, **dict(zip(match, point)), pair: seed,
                         **_values(cell, key, columns, pick), metric: score,
                         "values": grid.shape[1]})
        if all(np.isfinite(r[metric]) for r in held):
            rows.extend(held)
        else:
            notes.append(f"{by}={arm} at {dict(zip(match, point))}: a seed's run at the value "
                         f"the other seeds pick did not finish; the point is left out")
    return pd.DataFrame(rows), notes


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
