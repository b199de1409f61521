"""From a results table to a fit: the checked table a law is fitted to (``points_for``), and
its fit (``fit_table(table, law=law_named("chinchilla"))``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from attnlab.scaling.bootstrap import MIN_CLUSTERS
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.law import Law, check_axes, check_fixable
from attnlab.scaling.points import ScalingTable
from attnlab.scaling.result import ScalingFit
from attnlab.scaling.tables.ladder import isoflop_slices
from attnlab.scaling.tables.prepare import prepare_curves, prepare_points


def _flops_per_param_token_of_runs(table: ScalingTable):
    frame = table.frame
    return frame["flops"] / (frame["params"] * frame["tokens"])


def flops_per_param_token(table: ScalingTable) -> float:
    """k in C = k·N·D: the median of flops/(N·D) over the table (6 when C was computed as 6ND).
    A FLOPs column that counts attention and the output head gives k > 6 at small scale."""
    return float(np.median(_flops_per_param_token_of_runs(table)))


def flops_note(table: ScalingTable, k: float) -> str:
    """How a law that prices a budget in FLOPs counts them, and how far the table's own counts
    stray from that one k (approach 2 reads each run's own FLOPs instead)."""
    ratio = _flops_per_param_token_of_runs(table)
    low, high = float(ratio.min()), float(ratio.max())
    spread = (f"; the runs' own range {low:.3g}-{high:.3g} ({low / k:.2f}-{high / k:.2f}x k), "
              f"the error of pricing every size with one k" if high > low * 1.001 else "")
    return (f"compute-optimal budgets count C = {k:.3g}·N·D, k the median FLOPs/(N·D) of the "
            f"table{spread}; approach 2 reads each run's own FLOPs")


def points_for(law: Law, runs: pd.DataFrame | None, *, curves: pd.DataFrame | None = None,
               source: str = "results", columns: dict[str, str] | None = None,
               cluster: str | None = None) -> ScalingTable:
    """The checked table ``law`` is fitted to: approach 1's ``curves`` (N joined from ``runs``
    where the curves lack it), else the final points of ``runs``, a ladder's branches cut into
    budgets for a law fitted per budget."""
    if law.can("curves"):
        if curves is None:
            raise FitInputError("approach 1 needs learning curves (--curves)")
        return prepare_curves(curves, law=law, source=source, columns=columns, runs=runs)
    table = prepare_points(runs, law=law, source=source, columns=columns, cluster=cluster)
    if law.can("isoflop") and table.budget is None and "role" in runs.columns:
        table = isoflop_slices(table)  # a ladder's branches lie on lines of constant N
    return table


def fit_table(table: ScalingTable, *, law: Law, n_bootstrap: int = 0, ci_level: float = 0.95,
              seed: int = 0, fixed: dict | None = None, **options) -> ScalingFit:
    """Fits ``law`` to a checked table (points for most laws, curves for approach 1); the
    table's notes are carried into the fit's notes, its ``resampling`` (rows or clusters,
    ``table.clusters``) into the fit's. fixed: parameter -> value the fit holds (``--fix``;
    FitInputError naming the parameter for a law that holds none); options: the law's own
    settings (approach 2's ``profile`` and ``window``, approach 3's ``grid``), its defaults
    where not given."""
    if not law.can("table"):
        raise FitInputError(f"--law={law.name} is fitted by attnlab fit --law={law.name}, "
                            f"not to a table of (N, D, L) points")
    if not 0.0 < ci_level < 1.0:
        raise FitInputError(f"--ci-level must lie in (0, 1), not {ci_level}")
    if n_bootstrap < 0:
        raise FitInputError(f"--bootstrap must be >= 0, not {n_bootstrap}")
    check_fixable(law, fixed)
    check_axes(law, table, fixed)
    fit = law.fit(table, n_bootstrap=n_bootstrap, ci_level=ci_level, seed=seed, fixed=fixed,
                   flops_per_param_token=flops_per_param_token(table), clusters=table.clusters,
                   **options)
    resampling = fit.resampling or table.resampling()
    few = (n_bootstrap and resampling["unit"] == "cluster"
           and resampling["clusters"] < MIN_CLUSTERS)
    warned = (f"the bootstrap resamples only {resampling['clusters']} clusters (rows sharing "
              f"{resampling['column']!r}): below {MIN_CLUSTERS} its intervals tend to "
              f"cover less than they say (--coverage=100 measures it at this design); more "
              f"trunks or seeds per size, or --cluster=none for the row bootstrap's (too "
              f"narrow) intervals",) if few else ()
    priced = ((flops_note(table, fit.flops_per_param_token),)
              if law.can("table-k") else ())
    return dataclasses.replace(fit, notes=tuple(table.notes) + fit.notes + priced,
                               warnings=fit.warnings + warned, resampling=resampling)
