"""One entry point from a checked table to a fit: ``fit_table(table, law=..., approach=...)``."""

from __future__ import annotations

import dataclasses

import numpy as np

from attnlab.scaling import registry
from attnlab.scaling.approach2 import DEFAULT_WINDOW
from attnlab.scaling.approach3 import CHINCHILLA_GRID, InitGrid
from attnlab.scaling.bootstrap import MIN_CLUSTERS
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.laws import Law
from attnlab.scaling.parametric import check_fixable
from attnlab.scaling.result import ScalingFit
from attnlab.scaling.table import ScalingTable


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


def fit_table(table: ScalingTable, *, law: str | Law, approach: int | None = None,
              form: str = "nd", n_bootstrap: int = 0, ci_level: float = 0.95, seed: int = 0,
              grid: InitGrid = CHINCHILLA_GRID, profile: str = "window",
              window: float = DEFAULT_WINDOW, fixed: dict | None = None) -> ScalingFit:
    """Fits ``law`` (a name with its approach or form, or a resolved ``Law``) to a checked
    table (points for Kaplan and approaches 2-3, curves for approach 1); the table's notes are
    carried into the fit's notes, its ``resampling`` (rows or clusters, ``table.clusters``)
    into the fit's. profile, window: how approach 2 finds each budget's minimum; fixed:
    parameter -> value the fit holds (``--fix``; FitInputError naming the parameter for a law
    that holds none)."""
    part = registry.law_named(law, approach, form)
    if not part.fits_table:
        raise FitInputError(f"--law={part.name} is fitted by attnlab fit --law={part.name}, "
                            f"not to a table of (N, D, L) points")
    if not 0.0 < ci_level < 1.0:
        raise FitInputError(f"--ci-level must lie in (0, 1), not {ci_level}")
    if n_bootstrap < 0:
        raise FitInputError(f"--bootstrap must be >= 0, not {n_bootstrap}")
    check_fixable(part, fixed)
    fit = part.fit(table, n_bootstrap=n_bootstrap, ci_level=ci_level, seed=seed, grid=grid,
                   profile=profile, window=window, fixed=fixed,
                   flops_per_param_token=flops_per_param_token(table), clusters=table.clusters)
    resampling = fit.resampling or table.resampling()
    few = (n_bootstrap and resampling["unit"] == "cluster"
           and resampling["clusters"] < MIN_CLUSTERS)
    warned = (f"the bootstrap resamples only {resampling['clusters']} clusters (rows sharing "
              f"{resampling['column']!r}): its intervals' coverage is unchecked below "
              f"{MIN_CLUSTERS} and tends to fall short; more trunks or seeds per size, or "
              f"--cluster=none for the row bootstrap's (too narrow) intervals",) if few else ()
    priced = ((flops_note(table, fit.flops_per_param_token),)
              if part.table_k else ())
    return dataclasses.replace(fit, notes=tuple(table.notes) + fit.notes + priced,
                               warnings=fit.warnings + warned, resampling=resampling)
