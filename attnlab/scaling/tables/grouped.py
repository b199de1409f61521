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
from attnlab.scaling.law import Law
from attnlab.scaling.points import ScalingTable
from attnlab.scaling.result import ScalingFit, pin_rule
from attnlab.scaling.tables.baselines import frontier_baseline
from attnlab.scaling.tables.fitting import fit_table, points_for


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


def fit_by(results: pd.DataFrame, by: str, *, law: Law, source: str = "results",
           columns: dict | None = None,
           curves: pd.DataFrame | None = None, cluster: str | None = None,
           **fit_kwargs) -> GroupedFits:
    """Fits ``law`` to the runs of each value of column ``by``. A group whose fit cannot be made
    (too few runs, one budget for approach 2, no start converging) is skipped with its reason;
    when no group can be fitted, FitInputError says why for each. Approach 1 reads ``curves``
    (one row per logged step), grouped through each run's ``run_id``. cluster: the column a
    bootstrap resamples whole (``prepare_points``)."""
    fits, tables, skipped = {}, {}, {}
    for value in group_values(results, by, source):
        label = str(value)
        runs = results[results[by] == value]
        where = f"{source} [{by}={label}]"
        try:
            group_curves = None if curves is None else curves[
                curves["run_id"].isin(runs["run_id"])]
            table = points_for(law, runs, curves=group_curves, source=where, columns=columns,
                               cluster=cluster)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", GridEdgeWarning)  # kept in fit.warnings
                fits[label] = fit_table(table, law=law, **fit_kwargs)
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
    interval = f" [{low:.3g}, {high:.3g}]" if np.isfinite(low) and np.isfinite(high) else ""
    # as the report of one fit shows it: no estimate to read where no interval pins it
    return ("not pinned" if name in fit.too_wide else f"{value:.4g}") + interval


def _naive_cell(grouped: GroupedFits, group: str, budget: float) -> str:
    """The naive baseline beside a group's predicted loss: its best run that spent at most
    ``budget`` (``-`` when none did)."""
    table = grouped.tables.get(group)
    base = frontier_baseline(table.frame, budget) if table is not None else None
    return "-" if base is None else f"{base['loss']:.4g}"


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
        rows.append((f"naive@{budget:.3g}", [_naive_cell(grouped, g, budget) for g in groups]))
    width = max(14, *(len(c) for _, cells in rows for c in cells), *(len(g) for g in groups))
    label_width = max(10, *(len(r) for r, _ in rows))
    lines = [f"{first.name}, one fit per {grouped.by} (estimate [{level} interval])", "",
             f"  {grouped.by:<{label_width}}" + "".join(f"  {g:>{width}}" for g in groups)]
    lines += [f"  {name:<{label_width}}" + "".join(f"  {c:>{width}}" for c in cells)
              for name, cells in rows]
    for group, why in grouped.skipped.items():
        lines.append(f"skipped {grouped.by}={group}: {why}")
    if budgets:
        lines.append("naive@C: the group's best run that spent at most C FLOPs (the naive "
                     "baseline beside loss@C; '-': none did)")
    wide = {g: f.too_wide for g, f in grouped.fits.items() if f.too_wide}
    if wide:
        rule = pin_rule(first.part)
        lines.append(f"not pinned: not determined by the data, no interval, or an interval too "
                     f"wide to act on ({rule}): " + "; ".join(
                         f"{g}: {', '.join(names)}" for g, names in wide.items()))
    for group, fit in grouped.fits.items():
        if fit.intervals_refused:  # said, not left as a table without intervals
            lines.append(f"intervals [{group}]: {fit.refusal}")
        lines += [f"warning [{group}]: {w}" for w in fit.warnings]
    return "\n".join(lines) + "\n"


def rank_at(budget: float, fits3: GroupedFits | None, fits2: GroupedFits | None = None,
            results: pd.DataFrame | None = None) -> pd.DataFrame:
    """The groups ranked by approach 3's compute-optimal loss at ``budget`` FLOPs (best first;
    groups without a finite prediction last), one row per group fitted by either approach.

    Columns: the group (named ``fits3.by``), ``loss`` with ``loss_low`` / ``loss_high`` (its 95%
    bootstrap interval), ``N_opt`` (+ interval), approach 3's allocation exponent ``a3`` and
    approach 2's ``a2`` (+ intervals), ``runs``, and ``best_observed`` / ``best_run``: the lowest
    final validation loss among the group's runs at the largest budget of ``results`` (a check
    that needs no law: with a centred ladder it is close to that budget's optimum)."""
    grouped = [g for g in (fits3, fits2) if g is not None]
    if not grouped:
        raise FitInputError("rank_at: no grouped fit to rank")
    by = grouped[0].by
    groups = list(dict.fromkeys(k for g in grouped for k in (*g.fits, *g.skipped)))
    nan = float("nan")
    rows = []
    for group in groups:
        row = {by: group}
        fit3 = fits3.fits.get(group) if fits3 else None
        prediction = fit3.predict_optimal(budget) if fit3 is not None and fit3.has_allocation \
            else {}
        for name in ("loss", "N_opt"):
            value = prediction.get(name)
            low, high = prediction.get("ci", {}).get(name, (nan, nan))
            row[name] = nan if value is None else float(value)
            row[f"{name}_low"], row[f"{name}_high"] = float(low), float(high)
        for column, fits in (("a3", fits3), ("a2", fits2)):
            fit = fits.fits.get(group) if fits else None
            usable = fit is not None and "a" in fit.params and "a" not in fit.unpinned
            row[column] = float(fit.params["a"]) if usable else nan
            low, high = fit.ci.get("a", (nan, nan)) if usable else (nan, nan)
            row[f"{column}_low"], row[f"{column}_high"] = float(low), float(high)
        row["runs"] = max((g.fits[group].n_points for g in grouped if group in g.fits),
                          default=0)
        row["best_observed"], row["best_run"] = _best_at_largest_budget(results, by, group)
        rows.append(row)
    frame = pd.DataFrame(rows)
    order = frame["loss"].where(np.isfinite(frame["loss"]), np.inf)
    frame = frame.iloc[np.argsort(order.to_numpy(), kind="stable")].reset_index(drop=True)
    frame.insert(1, "rank", np.arange(1, len(frame) + 1))
    frame.attrs.update(budget=float(budget), by=by)
    return frame


def _best_at_largest_budget(results: pd.DataFrame | None, by: str, group: str):
    """(lowest final validation loss, its run id) among ``group``'s runs at the largest budget."""
    needed = {by, "budget", "final_val_loss", "run_id"}
    if results is None or not needed <= set(results.columns):
        return float("nan"), None
    runs = results[(results[by].astype(str) == group) & results["final_val_loss"].notna()]
    runs = runs[runs["budget"] == runs["budget"].max()]
    if runs.empty:
        return float("nan"), None
    best = runs.loc[runs["final_val_loss"].idxmin()]
    return float(best["final_val_loss"]), str(best["run_id"])


def format_ranking(ranking: pd.DataFrame) -> str:
    """The ranking as a fixed-width text table: ``estimate [low, high]`` cells."""
    by = ranking.attrs.get("by", ranking.columns[0])

    def cell(row, name, spec):
        value = row[name]
        if not np.isfinite(value):
            return "-"
        low, high = row.get(f"{name}_low", np.nan), row.get(f"{name}_high", np.nan)
        text = format(value, spec)
        if np.isfinite(low) and np.isfinite(high):
            text += f" [{format(low, spec)}, {format(high, spec)}]"
        return text

    header = ["rank", by, "loss at C_ref [95%]", "N_opt at C_ref [95%]", "a (approach 3)",
              "a (approach 2)", "best observed", "runs"]
    body = []
    for _, row in ranking.iterrows():
        body.append([str(row["rank"]), str(row[by]), cell(row, "loss", ".3f"),
                     cell(row, "N_opt", ".3g"), cell(row, "a3", ".2f"), cell(row, "a2", ".2f"),
                     "-" if not np.isfinite(row["best_observed"]) else
                     f"{row['best_observed']:.3f}", str(row["runs"])])
    extra = [c for c in ranking.columns if c.startswith("r(")]
    for column in extra:
        header.append(column)
        for line, (_, row) in zip(body, ranking.iterrows()):
            value = row[column]
            line.append("-" if value is None or not np.isfinite(value) else f"{value:.3f}")
    widths = [max(len(h), *(len(line[i]) for line in body)) for i, h in enumerate(header)]
    budget = ranking.attrs.get("budget")
    lines = [f"ranking by approach 3's compute-optimal loss at C_ref = {budget:.3g} FLOPs "
             f"(nats/token; lower is better)" if budget else "ranking"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in body]
    return "\n".join(lines) + "\n"
