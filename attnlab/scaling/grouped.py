"""One fit per group of runs: ``attnlab fit --by=COLUMN``.

A sweep over positional encodings, sequence mixers or objectives answers "which scales better"
only when each group gets its own law, with intervals, side by side:

    grouped = fit_by(results, "model.pos_encoding", law="chinchilla", approach=3, n_bootstrap=200)
    grouped.fits        # group -> ScalingFit
    grouped.skipped     # group -> why it was not fitted (too few runs, a fit that failed)
    print(format_grouped(grouped))

``results`` is the raw results table (``attnlab.results.load``: one row per run, with every
swept config column), so any of its columns can group the runs.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pandas as pd

from attnlab.scaling.errors import FitError, FitInputError, GridEdgeWarning
from attnlab.scaling.fitting import fit_table
from attnlab.scaling.result import ScalingFit
from attnlab.scaling.table import ScalingTable, prepare_curves, prepare_points


@dataclasses.dataclass(frozen=True)
class GroupedFits:
    """by: the grouping column; fits: group -> fit (in the column's sorted order); tables: group
    -> the checked points of that fit; skipped: group -> reason."""

    by: str
    fits: dict[str, ScalingFit]
    tables: dict[str, ScalingTable]
    skipped: dict[str, str]

    def to_dict(self, budgets=()) -> dict:
        return {"by": self.by, "groups": {g: f.to_dict(budgets) for g, f in self.fits.items()},
                "skipped": dict(self.skipped)}


def group_values(results: pd.DataFrame, by: str, source: str) -> list:
    """The distinct values of ``by`` (sorted), or FitInputError naming the column."""
    if by not in results.columns:
        raise FitInputError(f"--by: {source} has no column {by!r}; its columns are "
                            f"{', '.join(map(str, results.columns))}")
    values = results[by].dropna().unique().tolist()
    if not values:
        raise FitInputError(f"--by: column {by!r} of {source} holds no values")
    return sorted(values, key=str)


def fit_by(results: pd.DataFrame, by: str, *, law: str, approach: int | None = None,
           form: str = "nd", source: str = "results", columns: dict | None = None,
           curves: pd.DataFrame | None = None, **fit_kwargs) -> GroupedFits:
    """Fits ``law`` to the runs of each value of column ``by``. A group whose fit cannot be made
    (too few runs, one budget for approach 2, no start converging) is skipped with its reason;
    when no group can be fitted, FitInputError says why for each. Approach 1 reads ``curves``
    (one row per logged step), grouped through each run's ``run_id``."""
    fits, tables, skipped = {}, {}, {}
    for value in group_values(results, by, source):
        label = str(value)
        runs = results[results[by] == value]
        where = f"{source} [{by}={label}]"
        try:
            if law == "chinchilla" and approach == 1:
                if curves is None:
                    raise FitInputError("approach 1 needs learning curves (--curves)")
                group_curves = curves[curves["run_id"].isin(runs["run_id"])]
                table = prepare_curves(group_curves, law=law, source=where, columns=columns,
                                       runs=runs)
            else:
                table = prepare_points(runs, law=law, source=where, columns=columns)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", GridEdgeWarning)  # kept in fit.warnings
                fits[label] = fit_table(table, law=law, approach=approach, form=form,
                                        **fit_kwargs)
            tables[label] = table
        except (FitInputError, FitError) as error:
            skipped[label] = str(error)
    if not fits:
        reasons = "; ".join(f"{g}: {why}" for g, why in skipped.items())
        raise FitInputError(f"--by={by}: no group could be fitted ({reasons})")
    return GroupedFits(by=by, fits=fits, tables=tables, skipped=skipped)


def _cell(fit: ScalingFit, name: str) -> str:
    value = fit.params.get(name)
    if value is None:
        return "-"
    if name in fit.unpinned:
        return "not pinned"
    low, high = fit.ci.get(name, (np.nan, np.nan))
    if np.isfinite(low) and np.isfinite(high):
        return f"{value:.4g} [{low:.3g}, {high:.3g}]"
    return f"{value:.4g}"


def format_grouped(grouped: GroupedFits, budgets=()) -> str:
    """A side-by-side table: one row per parameter (and predicted optimum), one column per group,
    each cell ``estimate [low, high]``; then the skipped groups and each fit's warnings."""
    groups = list(grouped.fits)
    first = next(iter(grouped.fits.values()))
    level = f"{100 * first.ci_level:g}%"
    names = list(dict.fromkeys(n for f in grouped.fits.values() for n in f.params))
    rows = [(name, [_cell(grouped.fits[g], name) for g in groups]) for name in names]
    rows.append(("runs", [str(grouped.fits[g].n_points) for g in groups]))
    for budget in budgets:
        for quantity in ("N_opt", "loss"):
            cells = []
            for g in groups:
                fit = grouped.fits[g]
                prediction = fit.predict_optimal(budget) if fit.has_allocation else {}
                value = prediction.get(quantity)
                if value is None or not np.isfinite(value):
                    cells.append("-")
                    continue
                low, high = prediction["ci"].get(quantity, (np.nan, np.nan))
                cells.append(f"{value:.4g}" + (f" [{low:.3g}, {high:.3g}]"
                                                if np.isfinite(low) else ""))
            rows.append((f"{quantity}@{budget:.3g}", cells))
    width = max(14, *(len(c) for _, cells in rows for c in cells), *(len(g) for g in groups))
    label_width = max(10, *(len(r) for r, _ in rows))
    lines = [f"{first.name}, one fit per {grouped.by} (estimate [{level} interval])", "",
             f"  {grouped.by:<{label_width}}" + "".join(f"  {g:>{width}}" for g in groups)]
    lines += [f"  {name:<{label_width}}" + "".join(f"  {c:>{width}}" for c in cells)
              for name, cells in rows]
    for group, why in grouped.skipped.items():
        lines.append(f"skipped {grouped.by}={group}: {why}")
    for group, fit in grouped.fits.items():
        lines += [f"warning [{group}]: {w}" for w in fit.warnings]
    return "\n".join(lines) + "\n"
